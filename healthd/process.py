"""The one place healthd starts subprocesses.

Every child gets an argv list (never a shell string), runs in its own session, and is
killed with its whole process group when its timeout expires.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from healthd.errors import CommandTimeout, HealthdError


@dataclass(frozen=True)
class Completed:
    argv: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str
    seconds: float


def kill_group(proc: subprocess.Popen[bytes] | subprocess.Popen[str], grace_s: float = 2.0) -> None:
    """SIGTERM the process group of ``proc``, then SIGKILL it after ``grace_s``; reap ``proc``."""
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:
            continue
        # The leader is gone; make sure no straggler of the group survives it.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        return


def run(
    argv: Sequence[str],
    *,
    timeout: float,
    input: str | None = None,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
) -> Completed:
    """Run ``argv`` to completion and capture its output.

    :raises CommandTimeout: it ran past ``timeout`` seconds (the group was killed).
    :raises HealthdError: the program could not be started (not found, not executable).
    """
    if isinstance(argv, str):
        raise TypeError("argv must be a list of strings, not a shell string")
    started = time.monotonic()
    try:
        proc = subprocess.Popen(
            list(argv),
            stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=dict(env) if env is not None else None,
            cwd=cwd,
            start_new_session=True,
        )
    except OSError as exc:
        raise HealthdError(f"cannot run {argv[0]!r}: {exc.strerror or exc}") from exc
    try:
        out, err = proc.communicate(input=input, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        kill_group(proc)
        proc.communicate()
        raise CommandTimeout(f"{' '.join(argv[:3])} ... did not finish within {timeout:g} s") from exc
    return Completed(tuple(argv), proc.returncode, out, err, time.monotonic() - started)
