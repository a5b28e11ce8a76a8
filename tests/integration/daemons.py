"""A real ``healthd run`` subprocess, scraped over HTTP: shared by the end-to-end tests."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def get(port: int, path: str, timeout: float = 5.0) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=timeout) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


class DaemonProc:
    def __init__(self, config: Path, port: int, log_path: Path) -> None:
        self.port = port
        self.log_path = log_path
        self.log = log_path.open("ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "healthd.cli", "run", "--config", str(config)],
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def wait_http(self, timeout: float = 30.0) -> None:
        deadline = time.time() + timeout
        while time.time() < deadline:
            assert self.proc.poll() is None, self.log_path.read_text()
            try:
                if get(self.port, "/healthz")[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.2)
        raise AssertionError("daemon did not come up:\n" + self.log_path.read_text())

    def wait_for(self, predicate: object, timeout: float) -> str:
        deadline = time.time() + timeout
        text = ""
        while time.time() < deadline:
            assert self.proc.poll() is None, self.log_path.read_text()[-5000:]
            text = get(self.port, "/metrics")[1]
            if predicate(text):  # type: ignore[operator]
                return text
            time.sleep(0.5)
        raise AssertionError(f"timed out; last scrape:\n{text[-3000:]}\nlog:\n{self.log_path.read_text()[-5000:]}")

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self.log.close()


@pytest.fixture
def daemon_factory(tmp_path: Path) -> Iterator[object]:
    started: list[DaemonProc] = []

    def start(config: Path, port: int) -> DaemonProc:
        d = DaemonProc(config, port, tmp_path / "daemon.log")
        started.append(d)
        return d

    yield start
    for d in started:
        d.kill()


def probe_processes(marker: str) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if marker.encode() in cmdline and b"probes" in cmdline:
                pids.append(int(entry.name))
    return pids


