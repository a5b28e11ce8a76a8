"""A full single-node check in one process vs the probes one after the other (issue 26 item 8).

Runs, ``--repeat`` times and alternating, ``python -m probes check --probes P1,P2,...`` (one
start-up) and ``python -m probes P1``, ``python -m probes P2``, ... one after the other (one start-up
each), standalone with default options (gloo and 2 ranks on CPU, NCCL and one rank per GPU on CUDA),
and prints the median wall time of each, seen from outside, and the check's shared start-up.

    .venv/bin/python bench/probe_check.py [--probes env,nccl,gemm,ddp] [--repeat 3] [-- extra common args]
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from probes.result import ProbeResult

REPO = Path(__file__).resolve().parents[1]


def _run(argv: Sequence[str], timeout_s: float) -> tuple[float, list[ProbeResult]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "TORCHELASTIC_", "HEALTHD_"))}
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(var, None)
    start = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "probes", *argv], cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise SystemExit(f"{argv[0]}: no result within {timeout_s:g} s") from None
    wall = time.monotonic() - start
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv)}: exit {proc.returncode}\n{err[-2000:]}")
    return wall, [ProbeResult.model_validate_json(line) for line in out.splitlines() if line.strip()]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--probes", default="env,nccl,gemm,ddp")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("extra", nargs="*", help="common probe options (after --), e.g. --device cpu")
    args = parser.parse_args(argv)
    names = [n for n in args.probes.split(",") if n]
    check_walls: list[float] = []
    separate_walls: list[float] = []
    startups: list[float] = []
    for i in range(args.repeat):
        wall, docs = _run(["check", "--probes", ",".join(names), *args.extra], args.timeout)
        bad = [f"{d.probe}: {d.outcome.value}" for d in docs if d.outcome.value not in ("pass", "skipped")]
        if bad:
            raise SystemExit(f"check: {bad}")
        check_walls.append(wall)
        startups.append(docs[0].startup_seconds or 0.0)
        total = 0.0
        for name in names:
            wall1, _ = _run([name, *args.extra], args.timeout)
            total += wall1
        separate_walls.append(total)
        print(f"run {i + 1}: check {wall:.1f} s (shared start-up {startups[-1]:.1f} s), "
              f"separate {total:.1f} s", flush=True)
    print(f"probes {','.join(names)} on {os.cpu_count()} CPUs, median of {args.repeat}: "
          f"check {statistics.median(check_walls):.1f} s, separate {statistics.median(separate_walls):.1f} s, "
          f"shared start-up {statistics.median(startups):.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
