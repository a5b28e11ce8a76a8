"""Emitting the one result document: JSON or a human table, to stdout or atomically to a file."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable

from probes.result import ProbeResult

_stdout_fd: int | None = None


def reserve_stdout() -> None:
    """Keep the real stdout for the result document only.

    The original fd 1 is duplicated for :func:`emit`, and fd 1 is pointed at stderr, so that
    anything else writing to stdout (NCCL_DEBUG, a stray print, a library) lands in the logs.
    """
    global _stdout_fd
    if _stdout_fd is None:
        _stdout_fd = os.dup(1)
        os.dup2(2, 1)


def atomic_write(path: str, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file in the same directory and a rename."""
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".probe-", suffix=".tmp", dir=directory)
    try:
        os.fchmod(fd, 0o644)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def header_table(result: ProbeResult) -> str:
    lines = [
        f"# probe {result.probe}  outcome {result.outcome.value}" + (f"  run {result.run_id}" if result.run_id else ""),
        f"# nodes {' '.join(result.nodes) or '-'}",
        "# start-up {}  measure {}".format(
            f"{result.startup_seconds:.2f}s" if result.startup_seconds is not None else "-",
            f"{result.measure_seconds:.2f}s" if result.measure_seconds is not None else "-",
        ),
    ]
    if result.reason:
        lines.append(f"# reason: {result.reason}")
    return "\n".join(lines)


def checks_table(result: ProbeResult) -> str:
    if not result.checks:
        return ""
    lines = ["# checks"]
    for c in result.checks:
        where = c.where()
        lines.append(f"  {'OK  ' if c.ok else 'FAIL'}  {c.name:<44} {where:<24} {c.detail}")
    return "\n".join(lines)


def render(result: ProbeResult, fmt: str, body: Callable[[ProbeResult], str]) -> str:
    if fmt == "json":
        return result.to_json() + "\n"
    parts = [header_table(result), body(result), checks_table(result)]
    return "\n".join(p for p in parts if p) + "\n"


def emit(text: str, output: str | None) -> None:
    """Write the document to ``output`` (atomically) or to the reserved stdout."""
    if output:
        atomic_write(output, text)
        return
    fd = _stdout_fd if _stdout_fd is not None else 1
    data = text.encode("utf-8")
    while data:
        n = os.write(fd, data)
        data = data[n:]
