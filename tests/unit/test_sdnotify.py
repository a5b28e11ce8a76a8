"""healthd.sdnotify against real AF_UNIX datagram sockets (a path in a temp dir, and an abstract name).

The wire format is also compared byte for byte with what systemd's own ``systemd-notify`` sends.
"""

from __future__ import annotations

import array
import os
import shutil
import socket
import struct
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from healthd.sdnotify import Notifier


class Receiver:
    """The manager's end: a bound datagram socket that returns one message per recv."""

    def __init__(self, address: str) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(address)
        self.sock.settimeout(5.0)

    def recv(self) -> bytes:
        return self.sock.recv(65536)

    def pending(self) -> bool:
        self.sock.setblocking(False)
        try:
            self.sock.recv(65536, socket.MSG_PEEK)
        except BlockingIOError:
            return False
        finally:
            self.sock.settimeout(5.0)
        return True


@pytest.fixture
def path_receiver(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Receiver]]:
    path = str(tmp_path_factory.mktemp("sd") / "notify")
    assert len(path) < 100, f"{path} is too long for sockaddr_un"
    receiver = Receiver(path)
    yield path, receiver
    receiver.sock.close()


@pytest.fixture
def abstract_receiver() -> Iterator[tuple[str, Receiver]]:
    name = f"healthd-test-{uuid.uuid4().hex}"
    receiver = Receiver("\0" + name)
    yield "@" + name, receiver
    receiver.sock.close()


def test_ready_with_status_over_a_path_socket(path_receiver: tuple[str, Receiver]) -> None:
    address, receiver = path_receiver
    notifier = Notifier({"NOTIFY_SOCKET": address})
    assert notifier.enabled
    assert notifier.ready(status="3 nodes, 0 unhealthy") is True
    assert receiver.recv() == b"READY=1\nSTATUS=3 nodes, 0 unhealthy"
    assert (notifier.sent, notifier.failures) == (1, 0)


def test_abstract_namespace_socket(abstract_receiver: tuple[str, Receiver]) -> None:
    address, receiver = abstract_receiver
    notifier = Notifier({"NOTIFY_SOCKET": address})
    assert notifier.ready() is True
    assert notifier.watchdog() is True
    assert receiver.recv() == b"READY=1"
    assert receiver.recv() == b"WATCHDOG=1"
    assert (notifier.sent, notifier.failures) == (2, 0)


def test_each_call_is_one_datagram(path_receiver: tuple[str, Receiver]) -> None:
    address, receiver = path_receiver
    notifier = Notifier({"NOTIFY_SOCKET": address})
    assert notifier.stopping()
    assert notifier.status("draining\nnode gpu01")
    assert notifier.stopping(status="bye")
    assert receiver.recv() == b"STOPPING=1"
    assert receiver.recv() == b"STATUS=draining node gpu01"
    assert receiver.recv() == b"STOPPING=1\nSTATUS=bye"
    assert not receiver.pending()
    assert notifier.sent == 3


def test_reloading_carries_the_monotonic_time(path_receiver: tuple[str, Receiver]) -> None:
    address, receiver = path_receiver
    notifier = Notifier({"NOTIFY_SOCKET": address})
    before = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
    assert notifier.reloading(status="reloading /etc/healthd/healthd.toml")
    after = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
    lines = receiver.recv().decode().split("\n")
    assert lines[0] == "RELOADING=1"
    key, _, value = lines[1].partition("=")
    assert key == "MONOTONIC_USEC"
    assert before <= int(value) <= after
    assert lines[2] == "STATUS=reloading /etc/healthd/healthd.toml"
    assert len(lines) == 3


def test_sender_is_this_process(path_receiver: tuple[str, Receiver]) -> None:
    """NotifyAccess=main: systemd checks the sender's PID from SCM_CREDENTIALS; it must be ours."""
    address, receiver = path_receiver
    receiver.sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
    assert Notifier({"NOTIFY_SOCKET": address}).watchdog()
    ucred = struct.calcsize("3i")
    data, ancdata, _flags, _addr = receiver.sock.recvmsg(4096, socket.CMSG_SPACE(ucred))
    assert data == b"WATCHDOG=1"
    creds = [d for level, kind, d in ancdata if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS]
    assert len(creds) == 1
    pid, uid, gid = array.array("i", creds[0][:ucred])
    assert (pid, uid, gid) == (os.getpid(), os.getuid(), os.getgid())


def test_no_notify_socket_means_no_op() -> None:
    notifier = Notifier({})
    assert not notifier.enabled
    with capture_logs() as logs:
        results = [notifier.ready(status="x"), notifier.reloading(), notifier.stopping(),
                   notifier.status("x"), notifier.watchdog()]
    assert results == [False] * 5
    assert (notifier.sent, notifier.failures) == (0, 0)
    assert notifier.watchdog_interval() is None
    assert logs == []


def test_a_missing_socket_is_logged_and_counted_not_raised(tmp_path: Path) -> None:
    notifier = Notifier({"NOTIFY_SOCKET": str(tmp_path / "gone")})
    with capture_logs() as logs:
        assert notifier.ready() is False
        assert notifier.watchdog() is False
    assert (notifier.sent, notifier.failures) == (0, 2)
    assert [entry["event"] for entry in logs] == ["sd_notify_failed", "sd_notify_failed"]
    assert logs[0]["message"] == "READY=1"
    assert logs[1]["message"] == "WATCHDOG=1"
    assert logs[1]["failures"] == 2
    assert "No such file or directory" in logs[0]["error"]


def test_recovers_when_the_socket_comes_back(tmp_path_factory: pytest.TempPathFactory) -> None:
    path = str(tmp_path_factory.mktemp("sd") / "notify")
    notifier = Notifier({"NOTIFY_SOCKET": path})
    with capture_logs():
        assert notifier.watchdog() is False
    receiver = Receiver(path)
    try:
        assert notifier.watchdog() is True
        assert receiver.recv() == b"WATCHDOG=1"
    finally:
        receiver.sock.close()
    assert (notifier.sent, notifier.failures) == (1, 1)


def test_a_manager_that_does_not_read_cannot_block_the_daemon(path_receiver: tuple[str, Receiver]) -> None:
    address, _receiver = path_receiver  # never read: its queue fills up
    notifier = Notifier({"NOTIFY_SOCKET": address}, send_timeout_s=0.2)
    started = time.monotonic()
    with capture_logs() as logs:
        for _ in range(10_000):
            if not notifier.watchdog():
                break
    elapsed = time.monotonic() - started
    assert notifier.failures == 1
    assert notifier.sent >= 1
    assert logs[-1]["event"] == "sd_notify_failed"
    assert 0.2 <= elapsed < 5.0


@pytest.mark.parametrize("value", ["relative/notify", "vsock:2:1234", "@"])
def test_unsupported_socket_forms_disable_and_log(value: str) -> None:
    with capture_logs() as logs:
        notifier = Notifier({"NOTIFY_SOCKET": value, "WATCHDOG_USEC": "30000000"})
        assert notifier.ready() is False
    assert not notifier.enabled
    assert notifier.failures == 1
    assert notifier.watchdog_interval() is None
    assert [entry["event"] for entry in logs] == ["sd_notify_socket_unsupported"]
    assert logs[0]["notify_socket"] == value


@pytest.mark.parametrize(
    ("usec", "pid", "expected"),
    [
        ("60000000", None, 30.0),
        ("60000000", "self", 30.0),
        ("60000000", "other", None),
        ("1500", None, 0.00075),
        ("0", None, None),
        ("-5", None, None),
        ("soon", None, None),
        ("60000000", "not-a-pid", None),
        (None, None, None),
    ],
)
def test_watchdog_interval(usec: str | None, pid: str | None, expected: float | None, tmp_path: Path) -> None:
    env = {"NOTIFY_SOCKET": str(tmp_path / "notify")}
    if usec is not None:
        env["WATCHDOG_USEC"] = usec
    if pid is not None:
        env["WATCHDOG_PID"] = {"self": str(os.getpid()), "other": str(os.getpid() + 1)}.get(pid, pid)
    with capture_logs():
        assert Notifier(env).watchdog_interval() == expected


def test_unset_keeps_the_variables_from_children(
    path_receiver: tuple[str, Receiver], monkeypatch: pytest.MonkeyPatch
) -> None:
    address, receiver = path_receiver
    monkeypatch.setenv("NOTIFY_SOCKET", address)
    monkeypatch.setenv("WATCHDOG_USEC", "20000000")
    monkeypatch.setenv("WATCHDOG_PID", str(os.getpid()))
    notifier = Notifier()
    assert all(name not in os.environ for name in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID"))
    assert notifier.watchdog_interval() == 10.0
    child = subprocess.run(
        [sys.executable, "-c", "import os; print(sorted(k for k in os.environ if 'NOTIFY' in k or 'WATCHDOG' in k))"],
        capture_output=True, text=True, check=True, timeout=30,
    )
    assert child.stdout.strip() == "[]"
    assert notifier.ready()
    assert receiver.recv() == b"READY=1"


def test_the_variables_are_removed_from_a_given_mapping_by_default() -> None:
    env = {"NOTIFY_SOCKET": "/run/systemd/notify", "WATCHDOG_USEC": "1000000", "WATCHDOG_PID": "1",
           "PATH": "/usr/bin"}
    Notifier(env)
    assert env == {"PATH": "/usr/bin"}


def test_without_unset_the_environment_is_left_alone() -> None:
    env = {"NOTIFY_SOCKET": "/run/systemd/notify", "WATCHDOG_USEC": "1000000", "PATH": "/usr/bin"}
    Notifier(env, unset_environment=False)
    assert env == {"NOTIFY_SOCKET": "/run/systemd/notify", "WATCHDOG_USEC": "1000000", "PATH": "/usr/bin"}


@pytest.mark.skipif(shutil.which("systemd-notify") is None, reason="systemd-notify (package systemd) is not installed")
@pytest.mark.parametrize(
    ("argv", "call"),
    [
        (["--ready"], lambda n: n.ready()),
        (["--ready", "--status=probing 4 nodes"], lambda n: n.ready(status="probing 4 nodes")),
        (["--status=2 probes in flight"], lambda n: n.status("2 probes in flight")),
        (["STOPPING=1"], lambda n: n.stopping()),
        (["WATCHDOG=1"], lambda n: n.watchdog()),
    ],
)
def test_same_bytes_as_systemd_notify(path_receiver: tuple[str, Receiver], argv: list[str], call: object) -> None:
    address, receiver = path_receiver
    subprocess.run(["systemd-notify", "--no-block", *argv], env={**os.environ, "NOTIFY_SOCKET": address},
                   check=True, timeout=30)
    reference = receiver.recv()
    assert callable(call)
    assert call(Notifier({"NOTIFY_SOCKET": address})) is True
    assert receiver.recv() == reference
