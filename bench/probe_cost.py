"""What each probe costs on this machine: wall time split into start-up and measurement.

Runs ``python -m probes <name>`` standalone (default options: gloo and 2 ranks on CPU, NCCL
and one rank per GPU on CUDA) ``--repeat`` times each and prints, per probe, the median wall
time seen from outside, the probe's own ``startup_seconds`` (process start to process group
ready: interpreter, torch import, rendezvous) and ``measure_seconds`` (process group ready to
the end of the measurement), the rest (writing the result, exiting; median of each run's
rest), and the main figures of the last run.

    .venv/bin/python bench/probe_cost.py [--probes env,nccl,gemm,ddp] [--repeat 3] [-- extra probe args]
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


def run_once(name: str, extra: Sequence[str], timeout_s: float) -> tuple[float, ProbeResult]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "TORCHELASTIC_"))}
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "HEALTHD_PROBE_FAULT"):
        env.pop(var, None)
    start = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", "probes", name, *extra],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise SystemExit(f"{name}: no result within {timeout_s:g} s") from None
    wall = time.monotonic() - start
    if proc.returncode not in (0, 1):
        raise SystemExit(f"{name}: exit {proc.returncode}\n{err[-2000:]}")
    return wall, ProbeResult.model_validate_json(out)


def figures(result: ProbeResult) -> str:
    """The headline numbers of one result."""
    if result.outcome.value == "error":
        return f"error: {result.reason[:100]}"
    ms = result.measurements
    if result.probe == "nccl":
        best: dict[str, tuple[int, float, float]] = {}
        for m in ms:
            if m.name != "busbw_bytes_per_second":
                continue
            size = int(m.labels["size_bytes"])
            key = f"{m.labels['collective']}/{m.labels['placement']}"
            if key not in best or size > best[key][0]:
                t = next(x.value for x in ms if x.name == "time_seconds" and x.labels == m.labels and x.node == m.node)
                best[key] = (size, m.value, t)
        return "; ".join(
            f"{k} {s / 2**20:g} MiB busbw {bw / 1e9:.2f} GB/s ({t * 1e6:.0f} us)" for k, (s, bw, t) in best.items()
        )
    if result.probe == "gemm":
        by_dtype: dict[str, list[float]] = {}
        for m in ms:
            if m.name == "flop_per_second":
                by_dtype.setdefault(m.labels["dtype"], []).append(m.value)
        bw = [m.value for m in ms if m.name == "memory_bandwidth_bytes_per_second"]
        parts = [f"{d} {statistics.mean(v) / 1e9:.1f} GFLOP/s/rank" for d, v in by_dtype.items()]
        parts.append(f"copy {statistics.mean(bw) / 1e9:.2f} GB/s/rank")
        return "; ".join(parts) + f" (size {result.params.get('size')})"
    if result.probe == "ddp":
        get = {(m.name, m.labels.get("quantile")): m.value for m in ms}
        return (
            f"{get[('throughput_samples_per_second', None)]:.0f} samples/s, "
            f"step p50 {get[('step_seconds', '0.5')] * 1e3:.1f} ms p90 {get[('step_seconds', '0.9')] * 1e3:.1f} ms, "
            f"single rank {get[('single_rank_throughput_samples_per_second', None)]:.0f} samples/s, "
            f"efficiency {get[('scaling_efficiency_ratio', None)]:.2f} ({result.params.get('parameters')} params)"
        )
    return "; ".join(f"{m.name}{'@' + m.node if m.node else ''} = {m.value:g}" for m in ms)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--probes", default="env,nccl,gemm,ddp")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=180.0)
    parser.add_argument("extra", nargs="*", help="arguments passed to every probe (after --)")
    args = parser.parse_args(argv)
    rows = []
    for name in [p.strip() for p in args.probes.split(",") if p.strip()]:
        walls, startups, measures, others = [], [], [], []
        result: ProbeResult | None = None
        for _ in range(args.repeat):
            wall, result = run_once(name, args.extra, args.timeout)
            startup = result.startup_seconds or float("nan")
            measure = result.measure_seconds or float("nan")
            walls.append(wall)
            startups.append(startup)
            measures.append(measure)
            others.append(wall - startup - measure)
        assert result is not None
        env = result.environment
        where = f"{env.launcher} {env.backend} {env.device_type} x{len(env.ranks)}" if env else "-"
        wall, startup, measure, other = (statistics.median(x) for x in (walls, startups, measures, others))
        rows.append((name, where, result.outcome.value, wall, startup, measure, other, figures(result)))
    print(f"# {os.cpu_count()} CPU(s), python {sys.version.split()[0]}, median of {args.repeat} run(s) per probe")
    print(
        f"{'probe':<5} {'ranks':<24} {'outcome':<7} {'wall s':>7} {'start-up s':>10} {'measure s':>9}"
        f" {'other s':>7}  main figures"
    )
    for name, where, outcome, wall, startup, measure, other, figs in rows:
        print(f"{name:<5} {where:<24} {outcome:<7} {wall:7.2f} {startup:10.2f} {measure:9.2f} {other:7.2f}  {figs}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
