"""A stand-in for an nccl-tests binary (``all_reduce_perf`` needs CUDA and GPUs, absent here).

It prints a real captured nccl-tests output from ``tests/fixtures/tools/nccl_tests/`` and
behaves as the binary would at the end, so ``probes.nccl_tests`` runs a real subprocess with
real output. The tests install it in a bin directory as a shell script named like the real
binary (``all_reduce_perf``) that runs::

    python nccl_tests_standin.py MODE FIXTURE LOG [the binary's arguments...]

It appends its arguments to ``LOG`` (one JSON line) and then, by ``MODE``:

- ``replay:CODE``: print ``FIXTURE``, exit ``CODE``;
- ``crash:N``: print the first ``N`` lines of ``FIXTURE``, then die of SIGSEGV;
- ``hang:N``: print ``N`` lines, start a child that sleeps holding the output pipe (pids
  written to ``LOG.pids``), then sleep;
- ``garbage:CODE``: print bytes that are not nccl-tests output (invalid UTF-8 included), exit ``CODE``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time


def main() -> None:
    mode, fixture, log, *args = sys.argv[1:]
    with open(log, "a", encoding="utf-8") as fh:
        fh.write(json.dumps(args) + "\n")
    kind, _, value = mode.partition(":")
    with open(fixture, encoding="utf-8") as fh:
        lines = fh.readlines()
    out = sys.stdout
    if kind == "replay":
        out.write("".join(lines))
        out.flush()
        sys.exit(int(value or 0))
    if kind == "crash":
        out.write("".join(lines[: int(value)]))
        out.flush()
        os.kill(os.getpid(), signal.SIGSEGV)
    if kind == "hang":
        out.write("".join(lines[: int(value)]))
        out.flush()
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        with open(log + ".pids", "w", encoding="utf-8") as fh:
            fh.write(f"{os.getpid()} {child.pid}\n")
        time.sleep(600)
    if kind == "garbage":
        sys.stdout.buffer.write(b"Segmentation fault in libfoo \xff\xfe\nnothing useful\n")
        sys.stdout.flush()
        sys.exit(int(value or 0))
    sys.exit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    main()
