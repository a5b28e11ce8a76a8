"""[ha] against a real MariaDB server (Debian's mariadb-server), private to this module: its own datadir,
socket and port under tmp, started with mariadb-install-db and mariadbd, stopped after. Skips, saying why,
where the package is missing; fails instead under ``HEALTHD_REQUIRE_SLURM=1`` or ``HEALTHD_REQUIRE_MARIADB=1``
(CI installs it: scripts/debian-packages.txt, role tests).

Time is real (the lease lives on the database's clock) but short: a TTL of 1.2 s.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import generate_latest

from healthd.config import HaSettings, Settings
from healthd.errors import ConfigError, HaError, PolicyRefused
from healthd.ha.fence import FencedBackend, reason_epoch
from healthd.ha.lease import SCHEMA_VERSION, Lease, check_server, connect, init_schema, target
from healthd.model import Node, Outcome, ProbeJob
from tests.integration.conftest import FAKE_GPU_CLASSES, SlurmTestCluster
from tests.integration.daemons import DaemonProc

pymysql = pytest.importorskip("pymysql", reason="PyMySQL is not installed (pip install 'healthd[ha]')")

SBIN = ("/usr/sbin", "/usr/bin")
TTL = 1.2
RENEW = 0.3
MARGIN = 0.3


def _tool(name: str) -> str | None:
    return shutil.which(name) or next((f"{d}/{name}" for d in SBIN if os.access(f"{d}/{name}", os.X_OK)), None)


def _missing(why: str) -> None:
    if os.environ.get("HEALTHD_REQUIRE_SLURM") == "1" or os.environ.get("HEALTHD_REQUIRE_MARIADB") == "1":
        pytest.fail(f"no MariaDB server for the HA tests: {why} (scripts/install-debian-deps.sh tests)")
    pytest.skip(f"no MariaDB server for the HA tests: {why} (scripts/install-debian-deps.sh tests)")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    """mariadbd on its own datadir, socket and port: started, stopped (a database outage) and started again."""

    def __init__(self, server: str, admin: str, base: Path, user: list[str]) -> None:
        self.server, self.admin, self.base, self.user = server, admin, base, user
        self.socket, self.port = f"{base}/sock", _free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with (self.base / "err.log").open("a") as log:
            self.proc = subprocess.Popen(
                [self.server, "--no-defaults", f"--datadir={self.base}/db", f"--socket={self.socket}",
                 f"--port={self.port}", "--bind-address=127.0.0.1", "--skip-log-bin", f"--pid-file={self.base}/pid",
                 "--innodb-buffer-pool-size=16M", "--skip-name-resolve", *self.user],
                stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while subprocess.run([self.admin, "--no-defaults", f"--socket={self.socket}", "-uroot", "ping"],
                             capture_output=True, timeout=10).returncode != 0:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"mariadbd did not start: {(self.base / 'err.log').read_text()[-2000:]}")
            time.sleep(0.1)

    def stop(self) -> None:
        if self.proc is None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
        self.proc = None


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    install, mariadbd, admin = _tool("mariadb-install-db"), _tool("mariadbd"), _tool("mariadb-admin")
    if not (install and mariadbd and admin):
        _missing("mariadb-install-db, mariadbd or mariadb-admin not found (Debian: mariadb-server, mariadb-client)")
    assert install and mariadbd and admin
    base = tmp_path_factory.mktemp("mariadb")
    user = ["--user=root"] if os.geteuid() == 0 else []
    subprocess.run([install, "--no-defaults", f"--datadir={base}/db", "--auth-root-authentication-method=socket",
                    "--skip-test-db", *user], check=True, capture_output=True, timeout=120)
    srv = Server(mariadbd, admin, base, user)
    try:
        srv.start()
        root = pymysql.connect(unix_socket=srv.socket, user="root", autocommit=True)
        with root.cursor() as cur:
            cur.execute("CREATE USER 'healthd'@'127.0.0.1' IDENTIFIED BY 'sekret'")
        root.close()
        yield srv
    finally:
        srv.stop()


@pytest.fixture
def mariadb(server: Server) -> dict[str, Any]:
    """The private server, running: ``{"port", "socket", "base"}`` (root connects over the socket)."""
    if server.proc is None:
        server.start()
    return {"port": server.port, "socket": server.socket, "base": server.base}


def _root(db: dict[str, Any]) -> Any:
    return pymysql.connect(unix_socket=db["socket"], user="root", autocommit=True)


@pytest.fixture
def database(mariadb: dict[str, Any], request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh database for one test, the healthd user granted on it."""
    name = "ha_" + request.node.name.replace("[", "_").replace("]", "").replace("-", "_")[:50]
    conn = _root(mariadb)
    with conn.cursor() as cur:
        cur.execute(f"DROP DATABASE IF EXISTS {name}")
        cur.execute(f"CREATE DATABASE {name}")
        cur.execute(f"GRANT ALL ON {name}.* TO 'healthd'@'127.0.0.1'")
    conn.close()
    yield name


def _settings(db: dict[str, Any], name: str, tmp_path: Path, instance: str, **kw: Any) -> HaSettings:
    pw = tmp_path / "ha-password"
    if not pw.exists():
        pw.write_text("sekret\n")
        pw.chmod(0o600)
    return HaSettings(mode="mariadb", url=f"mysql://healthd@127.0.0.1:{db['port']}/{name}", password_file=pw,
                      instance_id=instance, lease_ttl_s=kw.get("ttl", TTL), renew_interval_s=RENEW,
                      fence_margin_s=MARGIN, timeout_s=2.0)


def _init(s: HaSettings) -> int:
    conn = connect(target(s), s.timeout_s)
    try:
        return init_schema(conn)
    finally:
        conn.close()


class RecordingBackend:
    """A real-enough backend for the fence: it records every call that reaches it, in order (no cluster)."""

    name = "recording"

    def __init__(self) -> None:
        self.calls: list[tuple[str, ...]] = []

    def drain(self, node: str, reason: str) -> None:
        self.calls.append(("drain", node, reason))

    def undrain(self, node: str) -> None:
        self.calls.append(("undrain", node))

    def submit(self, job: ProbeJob, result_path: Path) -> str:
        self.calls.append(("submit", ",".join(job.nodes), job.probe))
        return str(len(self.calls))

    def cancel(self, job_ids: list[str]) -> None:
        self.calls.append(("cancel", *job_ids))

    def list_nodes(self) -> list[Node]:
        return []

    def take_over_drain(self, node: str, slurm_reason: str, reason: str) -> None:
        self.calls.append(("take_over_drain", node, slurm_reason, reason))

    def start_reboot(self, node: str, reason: str) -> None:
        self.calls.append(("start_reboot", node, reason))

    def release_repair(self, node: str) -> None:
        self.calls.append(("release_repair", node))


def _fenced(lease: Lease, backend: RecordingBackend) -> FencedBackend:
    return FencedBackend(backend, lease, "healthd:")  # type: ignore[arg-type]


def _wait(cond: Any, timeout: float, step: Any = None) -> float:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if step is not None:
            step()
        if cond():
            return time.monotonic() - t0
        time.sleep(0.05)
    raise AssertionError(f"not within {timeout} s")


def test_init_is_idempotent_and_an_unknown_schema_is_refused(mariadb: dict[str, Any], database: str,
                                                             tmp_path: Path) -> None:
    s = _settings(mariadb, database, tmp_path, "a")
    lease = Lease(s)
    assert lease.renew() is None and "healthd ha init" in str(lease.last_error)  # no schema yet: never leads
    assert _init(s) == 0
    assert _init(s) == SCHEMA_VERSION
    root = _root(mariadb)
    with root.cursor() as cur:
        cur.execute(f"UPDATE {database}.healthd_meta SET value = %s", (str(SCHEMA_VERSION + 1),))
    root.close()
    with pytest.raises(HaError, match="newer than this healthd knows"):
        _init(s)
    assert lease.renew() is None and "newer than this healthd knows" in str(lease.last_error)
    assert not lease.leading()


def test_read_only_server_is_refused(mariadb: dict[str, Any], database: str, tmp_path: Path) -> None:
    s = _settings(mariadb, database, tmp_path, "a")
    _init(s)
    root = _root(mariadb)
    with root.cursor() as cur:
        cur.execute("SET GLOBAL read_only = 1")
    try:
        conn = connect(target(s), s.timeout_s)
        with pytest.raises(HaError, match="read_only"):
            check_server(conn)
        conn.close()
        lease = Lease(s)
        assert lease.renew() is None and "read_only" in str(lease.last_error)
    finally:
        with root.cursor() as cur:
            cur.execute("SET GLOBAL read_only = 0")
        root.close()


def test_password_file_others_can_read_is_refused(mariadb: dict[str, Any], database: str, tmp_path: Path) -> None:
    s = _settings(mariadb, database, tmp_path, "a")
    assert s.password_file is not None
    s.password_file.chmod(0o640)
    with pytest.raises(ConfigError, match="readable by the service's user only"):
        Lease(s)


def test_one_leader_then_failover_within_ttl_plus_renew(mariadb: dict[str, Any], database: str,
                                                        tmp_path: Path) -> None:
    a = Lease(_settings(mariadb, database, tmp_path, "a"))
    b = Lease(_settings(mariadb, database, tmp_path, "b"))
    _init(a.settings)
    a.renew()
    b.renew()
    assert a.leading() and not b.leading()
    first = a.epoch
    assert first is not None and b.status().holder == "a"
    for _ in range(3):  # renewals keep the lease and the epoch
        time.sleep(RENEW)
        a.renew()
        b.renew()
        assert a.leading() and not b.leading() and a.epoch == first
    # a stops renewing (killed): b leads within TTL + one renew interval
    took = _wait(lambda: b.leading(), TTL + 2 * RENEW + 0.5, step=lambda: (time.sleep(RENEW), b.renew()))
    assert took <= TTL + 2 * RENEW + 0.5
    assert b.epoch == first + 1
    status = b.status()
    assert (status.holder, status.epoch, status.live) == ("b", first + 1, True)


def test_paused_leader_cannot_act_after_its_lease_expired(mariadb: dict[str, Any], database: str,
                                                          tmp_path: Path) -> None:
    """The pause falls between a's own check (its monotonic clock, frozen here) and its journal insert:
    the database refuses the row, nothing reaches the backend, and a steps down."""
    frozen = [0.0]
    a = Lease(_settings(mariadb, database, tmp_path, "a"), clock=lambda: frozen[0])
    b = Lease(_settings(mariadb, database, tmp_path, "b"))
    _init(a.settings)
    a.renew()
    backend_a, backend_b = RecordingBackend(), RecordingBackend()
    fa, fb = _fenced(a, backend_a), _fenced(b, backend_b)
    fa.drain("node1", "healthd: xid 79 gpu 3")
    assert backend_a.calls == [("drain", "node1", f"healthd: [e{a.epoch}] xid 79 gpu 3")]
    old = a.epoch
    # a is paused (no renewal); its lease runs out on the database's clock and b takes over
    _wait(lambda: b.leading(), TTL + 3 * RENEW + 0.5, step=lambda: (time.sleep(RENEW), b.renew()))
    assert a.leading()  # a's own clock did not move: only the database can stop it now
    with pytest.raises(PolicyRefused, match="not the leader"):
        fa.drain("node2", "healthd: xid 79 gpu 1")
    assert not a.leading() and a.epoch is None  # stepped down
    fb.drain("node2", "healthd: xid 79 gpu 1")
    assert backend_a.calls == [("drain", "node1", f"healthd: [e{old}] xid 79 gpu 3")]
    assert backend_b.calls == [("drain", "node2", f"healthd: [e{b.epoch}] xid 79 gpu 1")]
    # the journal: each action once, epochs never going down
    root = _root(mariadb)
    with root.cursor() as cur:
        cur.execute(f"SELECT holder, epoch, verb, nodes FROM {database}.healthd_actions ORDER BY id")
        rows = cur.fetchall()
    root.close()
    assert rows == (("a", old, "drain", "node1"), ("b", b.epoch, "drain", "node2"))
    assert b.epoch is not None and old is not None and b.epoch > old
    assert reason_epoch(backend_b.calls[0][2], "healthd:") == b.epoch


def test_new_leader_reads_the_old_leaders_launches(mariadb: dict[str, Any], database: str, tmp_path: Path) -> None:
    """No probe wave after a failover: b's last attempts include what a submitted."""
    a = Lease(_settings(mariadb, database, tmp_path, "a"))
    b = Lease(_settings(mariadb, database, tmp_path, "b"))
    _init(a.settings)
    a.renew()
    fa = _fenced(a, RecordingBackend())
    t0 = time.time()
    fa.submit(ProbeJob(run_id="r1", probe="gemm", nodes=("n1", "n2")), tmp_path / "r1.json")
    fa.submit(ProbeJob(run_id="r2", probe="nccl", nodes=("n1",)), tmp_path / "r2.json")
    with pytest.raises(PolicyRefused):
        _fenced(b, RecordingBackend()).submit(ProbeJob(run_id="r3", probe="gemm", nodes=("n3",)),
                                              tmp_path / "r3.json")
    seen = b.launches(3600)
    assert set(seen) == {("n1", "gemm"), ("n2", "gemm"), ("n1", "nccl")}
    assert all(abs(at - t0) < 30 for at in seen.values())
    assert b.launches(0.000001) == {}


def test_daemon_standby_takes_over_the_schedule(mariadb: dict[str, Any], database: str, tmp_path: Path) -> None:
    """The daemon with [ha] on: its backend is fenced, it leads only with the lease, and its planner's last
    attempts carry the old leader's submissions (no probe wave after a failover)."""
    from healthd.daemon import Daemon

    ha = _settings(mariadb, database, tmp_path, "b")
    _init(ha)
    old = Lease(_settings(mariadb, database, tmp_path, "a"))
    old.renew()
    _fenced(old, RecordingBackend()).submit(ProbeJob(run_id="r1", probe="gemm", nodes=("n1",)), tmp_path / "r1.json")
    settings = Settings(state_dir=tmp_path / "state", backend="local", ha=ha,
                        slurm={"command_timeout_s": MARGIN})  # type: ignore[arg-type]
    daemon = Daemon(settings, None)
    try:
        assert isinstance(daemon.backend, FencedBackend)
        daemon.renew_lease()
        assert not daemon.leading()  # a holds the lease
        assert daemon.healthy()[1].endswith("; ha: b is standby; a leads, epoch 1, since " + str(old.since))
        daemon.plan_and_launch()
        assert daemon.store.unfinished_runs() == []  # a standby launches nothing
        _wait(lambda: daemon.leading(), TTL + 3 * RENEW + 0.5, step=lambda: (time.sleep(RENEW), daemon.renew_lease()))
        attempts = daemon._last_attempts(time.time())
        assert ("n1", "gemm") in attempts and abs(attempts[("n1", "gemm")] - time.time()) < 30
        assert "; ha: b leads, epoch 2, since " in daemon.healthy()[1]
        daemon._reconcile_ha()  # this machine's node is not drained: nothing inherited, done for this term
        assert daemon._reconciled_epoch == 2 and daemon.store.drains(open_only=True) == []
        text = generate_latest(daemon.registry).decode()
        assert "healthd_leader 1.0" in text and f"healthd_ha_epoch {float(daemon.lease.epoch or 0)}" in text
    finally:
        daemon.store.close()
        if daemon.lease is not None:
            daemon.lease.close()


def test_a_leader_without_renewal_stops_by_its_own_clock(mariadb: dict[str, Any], database: str,
                                                          tmp_path: Path) -> None:
    """Half a TTL after its last renewal began (its monotonic clock), a leader acts no more, even while the
    database would still take its rows: a database cut off from it cannot stop it, its own clock does."""
    now = [100.0]
    a = Lease(_settings(mariadb, database, tmp_path, "a"), clock=lambda: now[0])
    _init(a.settings)
    a.renew()
    backend = RecordingBackend()
    _fenced(a, backend).undrain("n1")
    now[0] += TTL / 2 + 0.01
    with pytest.raises(PolicyRefused):
        _fenced(a, backend).undrain("n2")
    assert backend.calls == [("undrain", "n1")] and a.epoch is None
    a.renew()  # still its lease on the database: a new term, a new epoch
    assert a.leading() and a.epoch == 2


def test_racing_instances_never_act_under_two_epochs_at_once(mariadb: dict[str, Any], database: str,
                                                              tmp_path: Path) -> None:
    """Three instances renew and act as fast as they can, each stalling once past the TTL, in turn (a pause its
    own clock does not see, so only the database can stop it): in the journal, epochs never go down, each
    epoch has one holder, and no action is recorded twice."""
    import random
    import threading

    settings = {name: _settings(mariadb, database, tmp_path, name) for name in "abc"}
    _init(settings["a"])
    stop = time.monotonic() + 5.0
    errors: list[BaseException] = []

    def run(name: str, seed: int) -> None:
        rnd = random.Random(seed)
        paused = [0.0]  # its clock leaves its pauses out: a pause between its own check and its insert
        lease = Lease(settings[name], clock=lambda: time.monotonic() - paused[0])
        fenced = _fenced(lease, RecordingBackend())
        n = 0
        pause_at = stop - 5.0 + 0.5 + 1.1 * seed  # each pauses once past its lease, at its turn
        try:
            while time.monotonic() < stop:
                lease.renew()
                if time.monotonic() > pause_at:
                    pause_at = float("inf")
                    pause = TTL * rnd.uniform(1.2, 1.6)
                    time.sleep(pause)  # paused: then it acts before renewing
                    paused[0] += pause
                for _ in range(3):
                    n += 1
                    with contextlib.suppress(PolicyRefused):
                        fenced.drain(f"{name}-{n}", "healthd: x")
                time.sleep(rnd.uniform(0, RENEW))
        except BaseException as exc:
            errors.append(exc)
        finally:
            lease.close()

    threads = [threading.Thread(target=run, args=(name, i)) for i, name in enumerate("abc")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert errors == []
    root = _root(mariadb)
    with root.cursor() as cur:
        cur.execute(f"SELECT holder, epoch, nodes FROM {database}.healthd_actions ORDER BY id")
        rows = cur.fetchall()
    root.close()
    epochs = [r[1] for r in rows]
    assert len(rows) > 20 and len({r[0] for r in rows}) >= 2  # several leaders took turns
    assert epochs == sorted(epochs)
    holders: dict[int, set[str]] = {}
    for holder, epoch, _ in rows:
        holders.setdefault(epoch, set()).add(holder)
    assert all(len(h) == 1 for h in holders.values())
    assert len({r[2] for r in rows}) == len(rows)
    assert all(nodes.startswith(f"{holder}-") for holder, _, nodes in rows)  # the row says who acted


def test_cli_init_and_status(mariadb: dict[str, Any], database: str, tmp_path: Path,
                             capsys: pytest.CaptureFixture[str]) -> None:
    from healthd.cli import main

    s = _settings(mariadb, database, tmp_path, "admin1")
    config = tmp_path / "healthd.toml"
    config.write_text(f'state_dir = "{tmp_path}/state"\n[ha]\nmode = "mariadb"\nurl = "{s.url}"\n'
                      f'password_file = "{s.password_file}"\ninstance_id = "admin1"\n')
    assert main(["ha", "status", "--config", str(config)]) == 1
    assert "healthd ha init" in capsys.readouterr().err
    assert main(["ha", "init", "--config", str(config)]) == 0
    assert f"schema version {SCHEMA_VERSION} created" in capsys.readouterr().out
    assert main(["ha", "init", "--config", str(config)]) == 0
    assert "already in place" in capsys.readouterr().out
    assert main(["ha", "status", "--config", str(config)]) == 1
    assert "no leader" in capsys.readouterr().out
    Lease(s).renew()
    assert main(["ha", "status", "--config", str(config), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert (doc["leader"], doc["epoch"]) == ("admin1", 1)
    off = tmp_path / "off.toml"
    off.write_text(f'state_dir = "{tmp_path}/state"\n')
    assert main(["ha", "init", "--config", str(off)]) == 2
    assert "mode is 'off'" in capsys.readouterr().err
    assert main(["ha", "status", "--config", str(off)]) == 0
    assert "leads alone" in capsys.readouterr().out


def test_new_leader_inherits_the_drains_the_journal_confirms(mariadb: dict[str, Any], database: str,
                                                             tmp_path: Path) -> None:
    """After a failover the new leader owns the old leader's drains (it will recheck and undrain them), and
    only those the journal shows: a forged or foreign tag is left alone; twice changes nothing."""
    from healthd.ha.reconcile import reconcile
    from healthd.store import Store

    a = Lease(_settings(mariadb, database, tmp_path, "a"))
    b = Lease(_settings(mariadb, database, tmp_path, "b"))
    _init(a.settings)
    a.renew()
    backend = RecordingBackend()
    _fenced(a, backend).drain("n1", "healthd: xid 79 gpu 3")
    a.release()
    b.renew()
    assert b.epoch == 2
    slurm_reason = backend.calls[0][2]

    class Cluster:
        def list_nodes(self) -> list[Node]:
            return [Node(name="n1", state="drained", reason=slurm_reason),
                    Node(name="n2", state="drained", reason="healthd: [e1] forged"),
                    Node(name="n3", state="drained", reason="NHC: [e1] theirs"),
                    Node(name="n4", state="idle")]

    store = Store(tmp_path / "b.sqlite")
    try:
        assert reconcile(b, Cluster(), store, "healthd:", 2, time.time()) == ["n1"]
        drains = store.drains(open_only=True)
        assert [(d.node, d.reason, d.actor) for d in drains] == [("n1", slurm_reason, "healthd-ha")]
        assert reconcile(b, Cluster(), store, "healthd:", 2, time.time()) == []
        assert len(store.drains(open_only=True)) == 1
    finally:
        store.close()


def test_database_outage_no_one_acts_then_exactly_one_leads(server: Server, mariadb: dict[str, Any], database: str,
                                                            tmp_path: Path) -> None:
    a = Lease(_settings(mariadb, database, tmp_path, "a"))
    b = Lease(_settings(mariadb, database, tmp_path, "b"))
    _init(a.settings)
    a.renew()
    b.renew()
    first = a.epoch
    assert first is not None and a.leading() and not b.leading()
    server.stop()
    try:
        assert a.renew() is None and b.renew() is None
        assert not a.leading() and not b.leading()
        backend = RecordingBackend()
        with pytest.raises(PolicyRefused):
            _fenced(a, backend).drain("n1", "healthd: x")
        with pytest.raises(PolicyRefused):
            _fenced(b, backend).drain("n1", "healthd: x")
        assert backend.calls == []
        assert "database" in a.describe()
    finally:
        server.start()
    _wait(lambda: a.leading() or b.leading(), TTL + 3 * RENEW + 2,
          step=lambda: (time.sleep(RENEW), a.renew(), b.renew()))
    a.renew()
    b.renew()
    assert [a.leading(), b.leading()].count(True) == 1
    assert (a.epoch or b.epoch) == first + 1


class Proxy:
    """A TCP proxy in front of the server for one instance; ``cut`` makes it a black hole (connections stay
    open, nothing goes through either way), as a partition between that admin node and the database."""

    def __init__(self, port: int) -> None:
        import threading

        self.target = port
        self.cut = threading.Event()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self.listener.getsockname()[1])
        self._threads: list[threading.Thread] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        import threading

        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.target))
            for src, dst in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                while self.cut.is_set():
                    time.sleep(0.05)
                dst.sendall(data)
        except OSError:
            pass

    def close(self) -> None:
        self.listener.close()


def test_partitioned_leader_stops_within_half_the_ttl(mariadb: dict[str, Any], database: str,
                                                      tmp_path: Path) -> None:
    """The database stops answering one instance (a black hole, not a refused connection): its renewal
    hangs until its timeout, and it stops acting by its own clock within half the TTL of its last renewal;
    the other instance takes over after the lease runs out."""
    import threading

    proxy = Proxy(mariadb["port"])
    try:
        via = _settings(mariadb, database, tmp_path, "a").model_copy(
            update={"url": f"mysql://healthd@127.0.0.1:{proxy.port}/{database}"})
        a = Lease(via)
        b = Lease(_settings(mariadb, database, tmp_path, "b"))
        _init(b.settings)
        a.renew()
        assert a.leading()
        renewed = time.monotonic()
        proxy.cut.set()
        hung = threading.Thread(target=a.renew, daemon=True)
        hung.start()  # blocks on the black hole until its read timeout
        stopped = _wait(lambda: not a.leading(), TTL)
        assert time.monotonic() - renewed <= TTL / 2 + 0.2 and stopped < TTL
        assert a.describe().startswith("ha: a is standby")  # answers while its renewal hangs
        backend = RecordingBackend()
        with pytest.raises(PolicyRefused):
            _fenced(a, backend).drain("n1", "healthd: x")
        _wait(lambda: b.leading(), TTL + 3 * RENEW + 0.5, step=lambda: (time.sleep(RENEW), b.renew()))
        _fenced(b, backend).drain("n1", "healthd: x")
        assert backend.calls == [("drain", "n1", f"healthd: [e{b.epoch}] x")]
        hung.join(10)
        assert a.epoch is None and a.last_error is not None
    finally:
        proxy.cut.clear()
        proxy.close()


@pytest.mark.slurm
def test_epoch_tagged_drains_on_real_slurm(cluster: SlurmTestCluster, mariadb: dict[str, Any], database: str,
                                           tmp_path: Path) -> None:
    """The epoch tag through the real scontrol: the drain is healthd's with it, a new leader inherits it from
    the journal and undrains it; the old leader, its lease gone, is refused."""
    import sys

    from healthd.cluster.slurm import SlurmBackend
    from healthd.ha.reconcile import reconcile
    from healthd.jobs import LaunchSettings
    from healthd.store import Store

    slurm = SlurmBackend(cluster.cli(), LaunchSettings(python=sys.executable, results_dir=tmp_path / "results"),
                         node_classes=FAKE_GPU_CLASSES)
    a = Lease(_settings(mariadb, database, tmp_path, "a"))
    b = Lease(_settings(mariadb, database, tmp_path, "b"))
    _init(a.settings)
    a.renew()
    FencedBackend(slurm, a, "healthd:").drain("node4", "healthd: xid 79 gpu 1")
    node = {n.name: n for n in slurm.list_nodes()}["node4"]
    assert node.drained and node.owned_by("healthd:")
    assert node.reason == f"healthd: [e{a.epoch}] xid 79 gpu 1"
    a.release()
    b.renew()
    assert b.leading() and b.epoch == 2
    store = Store(tmp_path / "b.sqlite")
    try:
        assert reconcile(b, slurm, store, "healthd:", 2, time.time()) == ["node4"]
    finally:
        store.close()
    with pytest.raises(PolicyRefused):
        FencedBackend(slurm, a, "healthd:").undrain("node4")
    FencedBackend(slurm, b, "healthd:").undrain("node4")
    assert not {n.name: n for n in slurm.list_nodes()}["node4"].drained


def test_repairs_and_takeovers_are_fenced_and_tagged(mariadb: dict[str, Any], database: str, tmp_path: Path) -> None:
    """The calls beyond ClusterBackend (repairs, boundary-drain takeover) go through the journal too; the reason
    healthd writes gets the tag, Slurm's reason it matches does not; a backend without them stays without."""
    from healthd.remediation.adopt import DrainTakeover
    from healthd.remediation.apply import RepairCapability

    a = Lease(_settings(mariadb, database, tmp_path, "a"))
    _init(a.settings)
    a.renew()
    backend = RecordingBackend()
    fenced = _fenced(a, backend)
    assert isinstance(fenced, DrainTakeover)
    fenced.take_over_drain("n1", "Epilog error", "healthd: boundary epilog env.gpu_count")
    fenced.start_reboot("n2", "healthd: repair reboot gpus_missing")
    fenced.release_repair("n2")
    assert backend.calls == [("take_over_drain", "n1", "Epilog error", "healthd: [e1] boundary epilog env.gpu_count"),
                             ("start_reboot", "n2", "healthd: [e1] repair reboot gpus_missing"),
                             ("release_repair", "n2")]
    root = _root(mariadb)
    with root.cursor() as cur:
        cur.execute(f"SELECT verb, nodes FROM {database}.healthd_actions ORDER BY id")
        assert cur.fetchall() == (("take_over_drain", "n1"), ("start_reboot", "n2"), ("release_repair", "n2"))
    root.close()
    assert not isinstance(_fenced(a, RecordingBackend()), RepairCapability)  # it has no back_from_repair
    backend.back_from_repair = backend.start_reboot  # type: ignore[attr-defined]
    backend.run_repair_command = backend.start_reboot  # type: ignore[attr-defined]
    assert isinstance(fenced, RepairCapability)
    a.release()
    with pytest.raises(PolicyRefused):
        fenced.start_reboot("n3", "healthd: repair reboot gpus_missing")
    assert len(backend.calls) == 3


def test_two_processes_with_one_instance_id_never_act_together(mariadb: dict[str, Any], database: str,
                                                               tmp_path: Path) -> None:
    """A copied config (both admin nodes named alike), or a restart: the lease cannot tell the processes apart, so
    each leads only on a term it started itself, and a term under its id that it did not start is waited out
    like anyone's (the other's last Slurm call may be under way): the second never acts while the first renews;
    once the first stops, the second takes a new term after the lease ran out, never at once."""
    one = Lease(_settings(mariadb, database, tmp_path, "admin"))
    two = Lease(_settings(mariadb, database, tmp_path, "admin"))
    _init(one.settings)
    acted: dict[str, list[int]] = {"one": [], "two": []}
    for _ in range(4):
        for order in ((one, two, one), (two, one, two)):
            for lease in order:
                lease.renew()
            for name, each in (("one", one), ("two", two)):
                epoch = each.record("undrain", ("n1",))
                if epoch is not None:
                    acted[name].append(epoch)
    assert acted == {"one": [1] * 8, "two": []}
    assert two.last_error is None and not two.leading()
    one.close()  # killed: it stops renewing
    two.renew()
    assert not two.leading()  # its lease is still live: no new term at once
    took = _wait(lambda: two.leading(), TTL + 3 * RENEW + 0.5, step=lambda: (time.sleep(RENEW), two.renew()))
    assert took >= TTL / 2 and two.epoch == 2


def _scrape(daemon: Any, gzip_: bool = False) -> str:
    import gzip

    app = daemon.http._server.get_app()
    env = {"REQUEST_METHOD": "GET", "PATH_INFO": "/metrics", "QUERY_STRING": "",
           "HTTP_ACCEPT_ENCODING": "gzip" if gzip_ else ""}
    body = b"".join(app(env, lambda status, headers: None))
    return (gzip.decompress(body) if gzip_ else body).decode()


def test_a_standby_exports_its_own_health_and_no_judgement(mariadb: dict[str, Any], database: str, tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    """healthd_leader 0 and the daemon's own health on the standby, none of the judgement families (node series,
    coverage): one copy of each for rules and dashboards; the leader exports them. `healthd status` says who
    leads."""
    from healthd.cli import main
    from healthd.daemon import Daemon

    ha = _settings(mariadb, database, tmp_path, "b")
    _init(ha)
    a = Lease(_settings(mariadb, database, tmp_path, "a"))
    a.renew()
    settings = Settings(state_dir=tmp_path / "state", backend="local", ha=ha,
                        slurm={"command_timeout_s": MARGIN})  # type: ignore[arg-type]
    daemon = Daemon(settings, None)
    try:
        daemon.renew_lease()
        daemon.discover()
        daemon._refresh_metrics()
        for text in (_scrape(daemon), _scrape(daemon, gzip_=True)):
            assert "healthd_leader 0.0" in text and "healthd_build_info{" in text
            assert "healthd_scheduler_ticks_total" in text and "healthd_cluster_nodes{" in text
            assert "healthd_node_info{" not in text and "healthd_probe_coverage_ratio" not in text
            assert "\nhealthd_ha_epoch " not in text
        config = tmp_path / "b.toml"
        config.write_text(f'state_dir = "{tmp_path}/state"\n[ha]\nmode = "mariadb"\nurl = "{ha.url}"\n'
                          f'password_file = "{ha.password_file}"\ninstance_id = "b"\n')
        main(["status", "--config", str(config)])
        assert f"ha: a leads, epoch 1, since {a.since} (database clock)" in capsys.readouterr().out
        a.release()
        daemon.renew_lease()
        assert daemon.leading()
        text = _scrape(daemon)
        assert "healthd_leader 1.0" in text and "healthd_ha_epoch 2.0" in text
        assert "healthd_node_info{" in text and "healthd_probe_coverage_ratio" in text
        main(["status", "--config", str(config), "--json"])
        out = capsys.readouterr().out
        assert json.loads(out[out.index("\n{") + 1:])["ha"].startswith("ha: b leads, epoch 2, since ")
    finally:
        daemon.http.stop()
        daemon.store.close()
        if daemon.lease is not None:
            daemon.lease.close()


def test_a_new_leader_collects_the_runs_the_old_one_submitted(mariadb: dict[str, Any], database: str,
                                                              tmp_path: Path) -> None:
    """The run registry: a's submissions (one combined job of two runs) are in the database with their job id as
    soon as the backend names it; b, leading, takes them into its own store as submitted runs of that job, and
    closes them in the registry once its store has them finished; twice changes nothing."""
    from healthd.ha.runs import sync_runs
    from healthd.model import BundledRun, RunKind
    from healthd.store import Store

    a = Lease(_settings(mariadb, database, tmp_path, "a"))
    b = Lease(_settings(mariadb, database, tmp_path, "b"))
    _init(a.settings)
    a.renew()
    results = tmp_path / "results"
    job = ProbeJob(run_id="r1", probe="gemm", nodes=("n1",), bundle=(BundledRun("r1", "gemm"), BundledRun("r2", "env")))
    job_id = _fenced(a, RecordingBackend()).submit(job, results / "r1.json")
    a.release()
    b.renew()
    store = Store(tmp_path / "b.sqlite")
    try:
        assert sync_runs(b, store, "slurm") == (["r1", "r2"], [])
        runs = {r.run_id: r for r in store.unfinished_runs()}
        assert {k: (r.job_id, r.probe, r.nodes, r.kind, r.result_path) for k, r in runs.items()} == {
            "r1": (job_id, "gemm", ("n1",), RunKind.PROBE, str(results / "r1.json")),
            "r2": (job_id, "env", ("n1",), RunKind.PROBE, str(results / "r2.json"))}
        assert ("n1", "gemm") in store.last_attempts()  # the planner sees them: no second probe of the node
        assert sync_runs(b, store, "slurm") == ([], [])
        store.finish_run("r1", outcome=Outcome.PASS, reason="", finished_at=time.time())
        assert sync_runs(b, store, "slurm") == ([], ["r1"])
        assert [r.run_id for r in b.open_runs()] == ["r2"]
    finally:
        store.close()


def test_the_hourly_cap_holds_across_a_failover(mariadb: dict[str, Any], database: str, tmp_path: Path) -> None:
    """a drains two nodes and an operator undrains one of them, then b leads: b inherits the drain still there (no
    second drain for its finding) and counts both of a's drains in its hourly cap at the time a made them (the
    inherited copy not twice), so with a cap of 3 it drains one node more and refuses the next (counting its own
    store only, it would drain two)."""
    from healthd.config import RemediationSettings
    from healthd.ha.caps import with_journal_drains
    from healthd.ha.reconcile import reconcile
    from healthd.judge.model import JudgeOutput, ReasonCode, RecommendationCandidate
    from healthd.remediation import Remediator
    from healthd.store import Store
    from tests.fakes.slurm import FakeSlurmClient, fake_backend, gpu_node

    slurm = FakeSlurmClient([gpu_node(f"n{i:02d}") for i in range(20)])  # one cluster both instances act on
    backend = fake_backend(slurm, tmp_path / "results")
    settings = RemediationSettings(mode="enforce", max_actions_per_hour=3)
    leases = {name: Lease(_settings(mariadb, database, tmp_path, name)) for name in "ab"}
    _init(leases["a"].settings)
    stores = {name: Store(tmp_path / f"{name}.sqlite") for name in "ab"}

    def remediator(name: str) -> Remediator:
        lease = leases[name]

        def hook(snap: Any, since: float) -> Any:
            return with_journal_drains(snap, lease.journal_drains(time.time() - since), {})

        return Remediator(stores[name], FencedBackend(backend, lease, "healthd:"), settings,  # type: ignore[arg-type]
                          snapshot_hook=hook)

    def recommend(r: Remediator, *nodes: str) -> list[tuple[str, str]]:
        out = JudgeOutput(at=time.time(), evaluated={(n, "gemm") for n in nodes}, recommendations=[
            RecommendationCandidate(n, "gemm", Outcome.FAIL, ReasonCode.BELOW_FLOOR, f"{n} is slow", {}, time.time())
            for n in nodes])
        return [(x.node or "", x.result) for x in r.apply(out) if x.action == "drain"]

    try:
        leases["a"].renew()
        ra = remediator("a")
        assert recommend(ra, "n01", "n02") == [("n01", "done"), ("n02", "done")]
        assert ra.undrain("n02", actor="operator:alice").result == "done"
        leases["a"].release()
        leases["b"].renew()
        assert reconcile(leases["b"], backend, stores["b"], "healthd:", 2, time.time()) == ["n01"]
        rb = remediator("b")
        assert recommend(rb, "n01") == []  # inherited: already drained by healthd
        assert recommend(rb, "n03", "n04") == [("n03", "done"), ("n04", "refused")]
        refusal = [x for x in stores["b"].audit() if x.result == "refused"]
        assert refusal[0].reason == "hourly cap of 3 automatic drains reached; waiting"
        assert sorted(n for n, _ in slurm.drains()) == ["n01", "n02", "n03"] and slurm.undrains() == ["n02"]
    finally:
        for s in stores.values():
            s.close()


# -- two real daemons on the lab Slurm cluster ---------------------------------------------------------------
DAEMON_TTL, DAEMON_RENEW, DAEMON_MARGIN = 4.0, 0.5, 3.0


def _daemon_config(tmp_path: Path, db: dict[str, Any], name: str, database: str, port: int) -> Path:
    from tests.integration.conftest import FAKE_GPU_CLASSES_TOML

    ha = _settings(db, database, tmp_path, name)
    config = tmp_path / f"{name}.toml"
    config.write_text(f"""
backend = "slurm"
state_dir = "{tmp_path / name}"
[http]
host = "127.0.0.1"
port = {port}
[scheduler]
discover_interval_s = 1
plan_interval_s = 1
collect_interval_s = 1
[slurm]
python = "{__import__('sys').executable}"
max_idle_share = 1.0
command_timeout_s = {DAEMON_MARGIN}
results_dir = "{tmp_path / 'shared-results'}"
{FAKE_GPU_CLASSES_TOML}
[probes.gemm]
interval_s = 3600
args = ["--dtypes", "fp32", "--size", "256", "--copy-bytes", "4M"]
[ha]
mode = "mariadb"
url = "{ha.url}"
password_file = "{ha.password_file}"
instance_id = "{name}"
lease_ttl_s = {DAEMON_TTL}
renew_interval_s = {DAEMON_RENEW}
fence_margin_s = {DAEMON_MARGIN}
[logging]
format = "json"
""")
    return config


def _leader_metric(port: int) -> float | None:
    import re

    from tests.integration.daemons import get

    try:
        m = re.search(r"^healthd_leader (\S+)$", get(port, "/metrics", timeout=2.0)[1], re.MULTILINE)
    except OSError:
        return None
    return float(m.group(1)) if m else None


def _journal(db: dict[str, Any], database: str) -> list[tuple[Any, ...]]:
    root = _root(db)
    try:
        with root.cursor() as cur:
            cur.execute("SELECT id, holder, epoch, verb, nodes, probe, UNIX_TIMESTAMP(at), detail "
                        f"FROM {database}.healthd_actions ORDER BY id")
            return list(cur.fetchall())
    finally:
        root.close()


def _registry(db: dict[str, Any], database: str) -> list[tuple[Any, ...]]:
    root = _root(db)
    try:
        with root.cursor() as cur:
            cur.execute(f"SELECT run_id, holder, done FROM {database}.healthd_runs ORDER BY submitted_at")
            return list(cur.fetchall())
    finally:
        root.close()


def _until(cond: Any, timeout: float, what: str, *procs: Any) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = cond()
        if value:
            return value
        for p in procs:
            assert p.proc.poll() is None, f"{p.log_path} died:\n{p.log_path.read_text()[-4000:]}"
        time.sleep(0.1)
    logs = "\n".join(f"== {p.log_path}\n{p.log_path.read_text()[-3000:]}" for p in procs)
    raise AssertionError(f"timed out ({timeout} s) waiting for {what}\n{logs}")


class SkewedDaemon(DaemonProc):
    """``healthd run --config CONFIG`` as ``DaemonProc`` runs it, behind ``prefix`` (``faketime -f +300s``: that
    process's wall clock only, not its monotonic clock)."""

    def __init__(self, config: Path, port: int, log_path: Path, prefix: list[str]) -> None:
        import sys

        self.port, self.log_path = port, log_path
        self.log = log_path.open("ab")
        self.proc = subprocess.Popen([*prefix, sys.executable, "-m", "healthd.cli", "run", "--config", str(config)],
                                     stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True,
                                     env={**os.environ, "DONT_FAKE_MONOTONIC": "1"})


@pytest.mark.slurm
def test_two_daemons_kill_pause_and_database_outage(cluster: SlurmTestCluster, server: Server, mariadb: dict[str, Any],
                                                   database: str, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Two `healthd run` processes (instance a and b, one shared results directory) on the lab Slurm cluster,
    a lease TTL of 4 s:

    - kill -9 of the leader while its probe runs are in flight: the standby leads within TTL + one renew (+ the
      scrape and this machine's load) and collects the old leader's runs; no (node, probe) is submitted twice
      (no probe wave: it goes on with the schedule);
    - SIGSTOP of the leader past its lease, then SIGCONT: the other leads meanwhile, and the paused one steps
      down on waking and takes no action;
    - the database stopped: no one leads; started again: exactly one leads, under a new epoch;
    - b runs under faketime 300 s ahead (that process only): the lease is on the database's clock, so it changes
      nothing above.

    After each: epochs never go down in the journal, and each drain reason on the cluster is untouched."""
    import signal

    from healthd.planning import PRIORITY_RUN_PREFIX
    from tests.integration.daemons import free_port, get

    for k, v in cluster.env.items():
        if k.startswith("SLURM"):
            monkeypatch.setenv(k, v)
    _init(_settings(mariadb, database, tmp_path, "a"))
    ports = {"a": free_port(), "b": free_port()}
    configs = {n: _daemon_config(tmp_path, mariadb, n, database, ports[n]) for n in "ab"}
    procs: dict[str, DaemonProc] = {}
    faketime = shutil.which("faketime")
    if faketime is None and (os.environ.get("HEALTHD_REQUIRE_SLURM") == "1"
                             or os.environ.get("HEALTHD_REQUIRE_MARIADB") == "1"):
        pytest.fail("faketime not found (Debian: faketime; scripts/install-debian-deps.sh tests)")
    skewed = [faketime, "-f", "+300s"] if faketime else []
    print(f"b's clock: {'300 s ahead (faketime)' if skewed else 'not skewed: faketime not installed'}")

    def start(name: str) -> DaemonProc:
        procs[name] = SkewedDaemon(configs[name], ports[name], tmp_path / f"{name}.log", skewed if name == "b" else [])
        procs[name].wait_http()
        return procs[name]

    def leads(name: str) -> bool:
        return _leader_metric(ports[name]) == 1.0

    def check_journal() -> list[tuple[Any, ...]]:
        rows = _journal(mariadb, database)
        epochs = [r[2] for r in rows]
        assert epochs == sorted(epochs), rows
        assert all(len({r[1] for r in rows if r[2] == e}) == 1 for e in set(epochs)), rows  # one holder an epoch
        submitted = [(node, probe) for r in rows if r[3] == "submit" and not r[7].startswith(PRIORITY_RUN_PREFIX)
                     for node in r[4].split(",") for probe in r[5].split(",")]  # re-probes the judge asks for aside
        assert len(submitted) == len(set(submitted)), f"a (node, probe) submitted twice on schedule: {rows}"
        return rows

    try:
        a = start("a")
        _until(lambda: leads("a"), 15, "a leads", a)
        b = start("b")
        # 1. kill -9 of the leader with runs in flight; b, its clock 300 s ahead, does not take a's lease meanwhile
        _until(lambda: _leader_metric(ports["b"]) == 0.0 and any(
            h == "a" and not done for _, h, done in _registry(mariadb, database)), 30, "a run of a's in flight", a, b)
        assert leads("a") and _leader_metric(ports["b"]) == 0.0
        killed = time.monotonic()
        a.kill()
        failover = _until(lambda: leads("b") and time.monotonic() - killed, DAEMON_TTL + DAEMON_RENEW + 10,
                          "b leads", b)
        print(f"failover: b leads {failover:.1f} s after a was killed (TTL {DAEMON_TTL} + renew {DAEMON_RENEW})")
        assert failover <= DAEMON_TTL + DAEMON_RENEW + 3.0
        a_runs = {r for r, h, _ in _registry(mariadb, database) if h == "a"}
        a = start("a")  # again, as the standby now (meanwhile b collects)
        assert _leader_metric(ports["a"]) == 0.0
        _until(lambda: all(done for _, _, done in _registry(mariadb, database)), 60, "every run collected", b)
        b_runs = {str(r["run_id"]): r for r in json.loads(get(ports["b"], "/api/v1/runs")[1])["runs"]}
        assert a_runs <= b_runs.keys() and all(b_runs[r]["state"] == "finished" for r in a_runs), b_runs
        _until(lambda: {n for _, _, _, verb, nodes, *_ in check_journal() if verb == "submit"
                        for n in nodes.split(",")} == set(cluster.nodes), 60, "every node probed once", b)
        rows = check_journal()
        assert {r[1] for r in rows if r[3] == "submit"} <= {"a", "b"}
        # 2. SIGSTOP of the leader past its lease, then SIGCONT
        os.killpg(b.proc.pid, signal.SIGSTOP)
        try:
            _until(lambda: leads("a"), DAEMON_TTL + DAEMON_RENEW + 10, "a leads while b is paused", a)
            seen = len(_journal(mariadb, database))
        finally:
            os.killpg(b.proc.pid, signal.SIGCONT)
        _until(lambda: _leader_metric(ports["b"]) == 0.0, 5, "b steps down", b)
        assert '"ha_step_down"' in b.log_path.read_text()
        time.sleep(2 * DAEMON_RENEW)
        assert all(r[1] == "a" for r in check_journal()[seen:])
        assert leads("a") and not leads("b")
        # 3. the database stopped, then started again
        epoch = max(r[2] for r in check_journal()) if check_journal() else 0
        server.stop()
        try:
            _until(lambda: _leader_metric(ports["a"]) == 0.0 and _leader_metric(ports["b"]) == 0.0,
                   DAEMON_TTL, "no one leads", a, b)
            time.sleep(2 * DAEMON_RENEW)
            assert _leader_metric(ports["a"]) == 0.0 and _leader_metric(ports["b"]) == 0.0
        finally:
            server.start()
        _until(lambda: leads("a") or leads("b"), DAEMON_TTL + DAEMON_RENEW + 10, "one leads again", a, b)
        for _ in range(4):
            assert [leads("a"), leads("b")].count(True) == 1
            time.sleep(DAEMON_RENEW / 2)
        lease = Lease(_settings(mariadb, database, tmp_path, "observer")).status()
        assert lease.live and lease.epoch > epoch
        check_journal()
    finally:
        for p in procs.values():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.proc.pid, signal.SIGCONT)
            p.kill()


def test_untagged_drains_from_before_ha_are_inherited(mariadb: dict[str, Any], database: str, tmp_path: Path) -> None:
    """healthd's drains without an epoch tag were made before [ha] was on (the prefix was the whole rule): the new
    leader inherits them without the journal, a manual one as manual (lifted only by `healthd undrain`), an
    automatic one with the probe its reason names (so it is rechecked and undrained after passes); tagged drains
    get their probe too; another's drain and a forged tag stay alone; twice changes nothing."""
    from healthd.ha.reconcile import reconcile
    from healthd.store import Store

    a = Lease(_settings(mariadb, database, tmp_path, "a"))
    b = Lease(_settings(mariadb, database, tmp_path, "b"))
    _init(a.settings)
    a.renew()
    backend = RecordingBackend()
    _fenced(a, backend).drain("n1", "healthd: below_floor gemm gpu 3 flop_per_second 300 TFLOP/s<525 TFLOP/s")
    a.release()
    b.renew()
    tagged = backend.calls[0][2]
    old = "healthd: probe_failed nccl nccl error: unhandled system error run 0042"

    class Cluster:
        def list_nodes(self) -> list[Node]:
            return [Node(name="n1", state="drained", reason=tagged),
                    Node(name="n2", state="drained", reason=old),
                    Node(name="n3", state="drained", reason="healthd: manual PSU swap, ticket 42"),
                    Node(name="n4", state="drained", reason="healthd: [e1] forged"),
                    Node(name="n5", state="drained", reason="NHC: nccl theirs")]

    store = Store(tmp_path / "b.sqlite")
    try:
        assert reconcile(b, Cluster(), store, "healthd:", 2, time.time(), probes=["gemm", "nccl"]) == ["n1", "n2", "n3"]
        drains = {d.node: (d.reason, d.automatic, d.probes) for d in store.drains(open_only=True)}
        assert drains == {"n1": (tagged, True, ("gemm",)), "n2": (old, True, ("nccl",)),
                          "n3": ("healthd: manual PSU swap, ticket 42", False, ())}
        assert reconcile(b, Cluster(), store, "healthd:", 2, time.time(), probes=["gemm", "nccl"]) == []
    finally:
        store.close()



class SimConn:
    """A real connection to the private server whose session clock is the test's: each cursor first sets the
    session's ``timestamp`` (MariaDB's ``NOW(6)`` then reads it), so the database's clock is simulated while
    every statement runs on the real server; ``cut()`` true: the instance is cut off (a partition)."""

    def __init__(self, real: Any, now: Any, cut: Any) -> None:
        self.real, self.now, self.cut = real, now, cut

    def _check(self) -> None:
        if self.cut():
            raise pymysql.OperationalError(2013, "Lost connection to MySQL server during query (simulated)")

    def cursor(self) -> Any:
        self._check()
        cur = self.real.cursor()
        cur.execute(f"SET timestamp = {self.now():.6f}")
        return cur

    def begin(self) -> None:
        self._check()
        self.real.begin()

    def commit(self) -> None:
        self._check()
        self.real.commit()

    def rollback(self) -> None:
        self.real.rollback()

    def close(self) -> None:
        self.real.close()


def test_lease_state_machine_under_kills_pauses_and_partitions(mariadb: dict[str, Any], database: str,
                                                               tmp_path: Path) -> None:
    """Hypothesis drives three instances through random renewals, actions, clock advances, pauses their own clock
    does not see (a frozen VM), partitions from the database and restarts (a kill), with the database's clock and
    each instance's monotonic clock simulated (real statements on the real server). After every step, in the
    journal: epochs never go down, one holder per epoch, and an action under a newer epoch comes at least
    fence_margin_s after the last one under an older epoch (so a Slurm call that ends within the margin never
    overlaps another leader's). Healthy instances left alone for TTL + renew end with one of them leading. Three
    fixed schedules (the pauses that matter) run first, so the test fails on a fence without its epoch or its
    margin whatever the search draws; ``HEALTHD_HA_EXAMPLES`` (default 6, CI's time) widens the search."""
    from hypothesis import HealthCheck, settings
    from hypothesis import strategies as st
    from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

    ttl, every, margin = 10.0, 2.0, 4.0
    STEPS = [every, ttl / 2, ttl - margin + 1.0, ttl - 1.0, ttl + 1.0]
    names = ("a", "b", "c")
    base = {n: _settings(mariadb, database, tmp_path, n).model_copy(
        update={"lease_ttl_s": ttl, "renew_interval_s": every, "fence_margin_s": margin}) for n in names}
    _init(base["a"])
    root = _root(mariadb)

    class Machine(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            with root.cursor() as cur:
                cur.execute(f"DELETE FROM {database}.healthd_actions")
                cur.execute(f"UPDATE {database}.healthd_lease SET holder = '', epoch = 0, since = '2030-01-01', "
                            "expires_at = '2030-01-01'")
            self.now = 2_000_000_000.0
            self.mono = dict.fromkeys(names, 0.0)
            self.frozen = dict.fromkeys(names, False)
            self.cut = dict.fromkeys(names, False)
            self.leases = {n: self._lease(n) for n in names}
            self.acts = 0

        def _lease(self, name: str) -> Lease:
            s = base[name]

            def connector() -> Any:
                if self.cut[name]:
                    raise pymysql.OperationalError(2003, "Can't connect (simulated partition)")
                return SimConn(connect(target(s), s.timeout_s), lambda: self.now, lambda: self.cut[name])

            return Lease(s, connector=connector, clock=lambda: self.mono[name])

        def advance(self, dt: float) -> None:
            self.now += dt
            for n in names:
                if not self.frozen[n]:
                    self.mono[n] += dt

        @rule(dt=st.one_of(st.sampled_from(STEPS), st.floats(0.05, ttl + every)),
              skip=st.sampled_from([None, *names]), order=st.permutations(names))
        def step(self, dt: float, skip: str | None, order: list[str]) -> None:
            """Time passes; every instance but ``skip`` renews (a frozen one cannot); then every instance tries to
            act, in ``order`` (a frozen one too: it was paused between its own check and its journal insert)."""
            self.advance(dt)
            for n in order:
                if n != skip and not self.frozen[n]:
                    self.leases[n].renew()
            for n in order:
                self.acts += 1
                self.leases[n].record("drain", (f"{n}-{self.acts}",))

        @rule()
        def pause_the_leader(self) -> None:
            """Freeze the clock of the instance that believes it leads (the pause that matters)."""
            for n in names:
                if self.leases[n].epoch is not None:
                    self.frozen[n] = True

        @rule(name=st.sampled_from(names))
        def wake(self, name: str) -> None:
            self.frozen[name] = False

        @rule(name=st.sampled_from(names))
        def partition(self, name: str) -> None:
            self.cut[name] = not self.cut[name]

        @rule(name=st.sampled_from(names))
        def restart(self, name: str) -> None:
            self.leases[name].close()
            self.frozen[name] = False
            self.leases[name] = self._lease(name)

        @rule()
        def settle(self) -> None:
            healthy = [n for n in names if not self.frozen[n] and not self.cut[n]]
            for _ in range(int((ttl + every) / every) + 2):
                self.advance(every)
                for n in names:
                    if not self.frozen[n]:
                        self.leases[n].renew()
            if healthy:
                errors = {n: self.leases[n].last_error for n in names}
                assert [n for n in healthy if self.leases[n].leading()] != [], errors

        @invariant()
        def journal_is_fenced(self) -> None:
            with root.cursor() as cur:
                cur.execute(f"SELECT holder, epoch, UNIX_TIMESTAMP(at) FROM {database}.healthd_actions ORDER BY id")
                rows = [(h, int(e), float(at)) for h, e, at in cur.fetchall()]
            epochs = [e for _, e, _ in rows]
            assert epochs == sorted(epochs), rows
            holders: dict[int, set[str]] = {}
            for h, e, _ in rows:
                holders.setdefault(e, set()).add(h)
            assert all(len(h) == 1 for h in holders.values()), rows
            for (_, e1, t1), (_, e2, t2) in itertools.pairwise(rows):
                if e2 != e1:
                    assert t2 >= t1 + margin - 1e-6, rows

        def teardown(self) -> None:
            for lease in self.leases.values():
                lease.close()

    def schedule(*steps: Any) -> None:
        """One fixed schedule through the same machine (the pauses that matter, found before by the search):
        each a function of the machine; the invariant after each."""
        m = Machine()
        try:
            for do in steps:
                do(m)
                m.journal_is_fenced()
        finally:
            m.teardown()

    abc, bac = ["a", "b", "c"], ["b", "a", "c"]
    try:
        # the leader frozen past its lease acts after the next leader did
        schedule(lambda m: m.step(1.0, None, abc), lambda m: m.pause_the_leader(),
                 lambda m: m.step(ttl + 1.0, None, bac), lambda m: m.step(every, None, bac))
        # the leader frozen just short of its lease acts, the next leader acts right after it expired
        schedule(lambda m: m.step(1.0, None, abc), lambda m: m.pause_the_leader(),
                 lambda m: m.step(ttl - 1.0, "b", abc), lambda m: m.step(every, None, bac))
        # the leader cut off: it stops by its own clock, the other leads after the lease ran out
        schedule(lambda m: m.step(1.0, None, abc), lambda m: m.partition("a"), lambda m: m.step(ttl / 2, None, bac),
                 lambda m: m.step(ttl / 2 + every, None, bac), lambda m: m.settle())
        run_state_machine_as_test(Machine, settings=settings(
            max_examples=int(os.environ.get("HEALTHD_HA_EXAMPLES", "6")), stateful_step_count=20, deadline=None,
            suppress_health_check=list(HealthCheck), database=None))
    finally:
        root.close()
