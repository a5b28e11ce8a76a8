"""sd_notify(3) without libsystemd: readiness, reload, stop, status and watchdog messages.

The protocol is one ``AF_UNIX``/``SOCK_DGRAM`` datagram of newline-separated ``KEY=VALUE``
assignments, sent to the socket named by ``$NOTIFY_SOCKET``; a leading ``@`` names a socket in
the abstract namespace. systemd documents it as stable (systemd.io/PORTABILITY_AND_STABILITY);
this module follows systemd's MIT-0 ``man/notify-selfcontained-example.py``.

Contract for the daemon:

- Every method is a no-op returning ``False`` when the process was not started by systemd
  (``$NOTIFY_SOCKET`` unset), so the same code runs under systemd, in a container and in tests.
- No method raises. A failed send is logged and counted in ``failures`` (successes in ``sent``);
  a notification channel that is broken, or a manager that does not read, cannot stop the
  daemon: a send gives up after ``send_timeout_s``.
- The unit uses ``NotifyAccess=main``: systemd accepts messages only from the main PID, so call
  these methods from the daemon process itself, never from a helper subprocess.
- Build it (``Notifier()``) before starting any subprocess: it reads ``NOTIFY_SOCKET`` and
  ``WATCHDOG_*`` once and removes them from the environment, so that sbatch and probe
  processes do not inherit them.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import MutableMapping

from healthd.logging import get_logger

log = get_logger(__name__)

ENV_VARS = ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID")
DEFAULT_SEND_TIMEOUT_S = 1.0


def _socket_address(value: str) -> str | None:
    """``$NOTIFY_SOCKET`` as an ``AF_UNIX`` address, or None if it is not a form we can use."""
    if value.startswith("/"):
        return value
    if value.startswith("@") and len(value) > 1:
        return "\0" + value[1:]
    return None


def _watchdog_usec(usec: str | None, pid: str | None) -> int | None:
    """``$WATCHDOG_USEC`` if it is a positive integer meant for this process (sd_watchdog_enabled(3))."""
    if usec is None:
        return None
    try:
        value = int(usec)
    except ValueError:
        log.warning("sd_watchdog_usec_invalid", watchdog_usec=usec)
        return None
    if value <= 0:
        return None
    if pid is not None:
        try:
            if int(pid) != os.getpid():
                return None
        except ValueError:
            log.warning("sd_watchdog_pid_invalid", watchdog_pid=pid)
            return None
    return value


def _one_line(text: str) -> str:
    return " ".join(text.splitlines())


class Notifier:
    """Sends sd_notify messages to the service manager; see the module docstring for the contract."""

    def __init__(
        self,
        environ: MutableMapping[str, str] | None = None,
        *,
        unset_environment: bool = True,
        send_timeout_s: float = DEFAULT_SEND_TIMEOUT_S,
    ) -> None:
        """Read ``NOTIFY_SOCKET``, ``WATCHDOG_USEC`` and ``WATCHDOG_PID`` from ``environ`` (default: ``os.environ``).

        With ``unset_environment`` (the default, like ``sd_notify(unset_environment=1)``) the three
        variables are then removed from ``environ``, so that child processes do not inherit them:
        sbatch would otherwise export them into every probe job.
        """
        env = os.environ if environ is None else environ
        notify_socket = env.get("NOTIFY_SOCKET")
        self._watchdog_usec = _watchdog_usec(env.get("WATCHDOG_USEC"), env.get("WATCHDOG_PID"))
        if unset_environment:
            for name in ENV_VARS:
                env.pop(name, None)
        self.sent = 0
        self.failures = 0
        self._lock = threading.Lock()
        self._send_timeout_s = send_timeout_s
        self._address: str | None = None
        if notify_socket:
            self._address = _socket_address(notify_socket)
            if self._address is None:
                self.failures += 1
                log.warning("sd_notify_socket_unsupported", notify_socket=notify_socket)

    @property
    def enabled(self) -> bool:
        """True when there is a notification socket to send to."""
        return self._address is not None

    def watchdog_interval(self) -> float | None:
        """Seconds between ``watchdog()`` pings (half of ``WatchdogSec=``), or None without a watchdog."""
        if self._address is None or self._watchdog_usec is None:
            return None
        return self._watchdog_usec / 2 / 1_000_000

    def ready(self, status: str | None = None) -> bool:
        """Start-up (or a reload) is complete: ``READY=1``."""
        return self._send("READY=1", status)

    def reloading(self, status: str | None = None) -> bool:
        """A reload started: ``RELOADING=1`` with ``MONOTONIC_USEC``; send ``ready()`` when it is done."""
        usec = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
        return self._send(f"RELOADING=1\nMONOTONIC_USEC={usec}", status)

    def stopping(self, status: str | None = None) -> bool:
        """Shutdown started: ``STOPPING=1``."""
        return self._send("STOPPING=1", status)

    def status(self, text: str) -> bool:
        """Free-form one-line status shown by ``systemctl status`` (newlines become spaces)."""
        return self._send(None, text)

    def watchdog(self) -> bool:
        """Keep-alive ping: ``WATCHDOG=1``. Send it only while the daemon really makes progress."""
        return self._send("WATCHDOG=1", None)

    def _send(self, assignments: str | None, status: str | None) -> bool:
        if self._address is None:
            return False
        lines = [assignments] if assignments else []
        if status is not None:
            lines.append(f"STATUS={_one_line(status)}")
        message = "\n".join(lines)
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
                sock.settimeout(self._send_timeout_s)
                sock.connect(self._address)
                sock.sendall(message.encode())
        except OSError as exc:  # includes TimeoutError: the manager does not read its socket
            with self._lock:
                self.failures += 1
                failures = self.failures
            log.warning("sd_notify_failed", message=message.partition("\n")[0], error=str(exc),
                        failures=failures)
            return False
        with self._lock:
            self.sent += 1
        return True
