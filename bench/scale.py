"""How healthd scales with the fleet (issue 18): an N-node history built through the real code paths.

The simulator's in-memory cluster (``healthd.simulate``) runs ``--rounds`` rounds of gemm and nccl on
``--nodes`` 8-GPU nodes (1% of them faulty) through the real collector, store, judge, remediation and
planner; ``--days`` of older history are then written through the store's batched write path (the
simulated rounds' results, shifted back one day at a time, ``--day-rounds`` rounds per day) and the
housekeeping rollup is applied, as the daemon would. Then it measures:

- ``scrape_ms``, ``scrape_bytes``, ``series``, ``series_per_node``: a ``/metrics`` scrape served as the daemon
  serves it (``bench/scrape.py``: the exposition refreshed after the tick, the scrape joins its bytes);
- ``api_nodes_page_ms``, ``api_node_ms``: a page of ``GET /api/v1/nodes?limit=100``, one node's detail;
- ``plan_tick_ms``, ``collect_tick_ms``: median of the last round's ticks; the collect tick is the collector's
  (poll, read and parse the finished runs' result files, store them in one batch), not the judging of the
  batch (``judge_ms_per_result``); the simulated probes write their result files before it is timed, as the
  nodes write them on a real cluster (until 2026-11-28 the writing was inside the timed window, about a third
  of the figure);
- ``judge_ms_per_result``: the last round's judging time over its results;
- ``store_10k_results_s``: 10,000 results stored the way the collector stores a tick's results;
- ``store_mb_per_day``: the store's growth a day at the default schedule: ``bytes_per_run``, the growth of the
  history tables (``HISTORY``) over the last simulated round per run, times the runs a day the default
  schedule allows (``runs_per_day_default_schedule``, ``DEFAULT_RUNS_PER_DAY``: the issue's goal is stated for
  it); ``store_mb_per_day_bench_schedule``: the same growth at this scenario's own schedule (gemm and nccl every
  14-15 min on every node, ``runs_per_day``); ``store_mb``: the whole store at the end;
- ``rss_mb``, ``startup_s``, ``exposition_first_read_s``: peak RSS, judge-state load and the exposition's
  first full read of a fresh process that opens the store (the daemon's start-up), the peak with the judge
  and the exposition both held and a scrape served (plain and gzip), as in the daemon.

    .venv/bin/python bench/scale.py --nodes 1000 --json [--days 30]
"""

from __future__ import annotations

import argparse
import json
import re
import resource
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

# this checkout's healthd, not one an editable install of another checkout puts on the path
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.scrape import measure as scrape_measure
from healthd.config import Settings
from healthd.judge.persist import load_judge
from healthd.logging import setup_logging
from healthd.metrics import Exposition
from healthd.model import Outcome, RunKind
from healthd.simulate import Scenario, Simulation, scenario_settings
from healthd.store import Store
from healthd.store.runs import FinishedRun
from probes.result import Measurement, ProbeResult

KEYS = ("nodes", "series", "scrape_ms", "scrape_bytes", "api_nodes_page_ms", "plan_tick_ms", "collect_tick_ms",
        "judge_ms_per_result", "store_10k_results_s", "rss_mb", "store_mb_per_day")
DAY_S = 86400.0
DEFAULT_RUNS_PER_DAY = Settings().slurm.max_concurrent_jobs * DAY_S / 75.0
"""Runs a day the default schedule allows at most: ``slurm.max_concurrent_jobs`` jobs of ~75 s (60-90 s with
the queue wait) at once, whatever the fleet (docs/admin-guide.md, "Store size and the schedule")."""


def scenario(nodes: int, rounds: int) -> Scenario:
    """``nodes`` 8xH100 nodes, the judgement benchmark's series, 1% of the nodes 15% slow from round 2."""
    width = len(str(nodes - 1))
    faulty = [f"gpu{i:0{width}d}" for i in range(0, nodes, 100)]
    return Scenario.model_validate({
        "name": f"scale-{nodes}", "seed": 7, "rounds": rounds, "round_s": 900.0, "tick_s": 90.0,
        "probe_seconds": {"gemm": 45.0, "nccl": 75.0},
        "healthd": {
            "backend": "local",
            "probes": {"gemm": {"interval_s": 840.0, "jitter_s": 60.0, "timeout_s": 180.0},
                       "nccl": {"interval_s": 840.0, "jitter_s": 60.0, "timeout_s": 180.0, "nodes_per_job": 2}},
            "slurm": {"max_concurrent_jobs": max(8, nodes), "max_idle_share": 1.0},
            "remediation": {"mode": "recommend"},
        },
        "classes": [{"name": "h100x8", "count": nodes, "prefix": "gpu", "gpus": 8, "gpu_type": "h100", "series": [
            {"probe": "gemm", "name": "flop_per_second", "per": "gpu", "labels": {"dtype": "bf16"}, "value": 700e12},
            {"probe": "gemm", "name": "memory_bandwidth_bytes_per_second", "per": "gpu", "value": 2.9e12},
            {"probe": "nccl", "name": "busbw_bytes_per_second", "per": "node",
             "labels": {"collective": "all_reduce", "size_bytes": "1073741824", "scope": "node"}, "value": 480e9},
            {"probe": "nccl", "name": "busbw_bytes_per_second", "per": "group",
             "labels": {"collective": "all_reduce", "size_bytes": "1073741824", "scope": "group"}, "value": 440e9},
        ]}],
        "faults": [{"kind": "node", "node": n, "probe": "nccl", "name": "busbw_bytes_per_second", "factor": 0.85,
                    "from_round": 2} for n in faulty],
    })


HISTORY = ("runs", "run_nodes", "samples", "series", "checks", "rollups", "attempts", "counters")
"""The tables that grow with days of history (with their indexes); the judge's tables hold per-series
state (a bounded window of passing values) and the confirmation window's marks: bounded by the fleet."""


def _size_mb(path: Path, tables: tuple[str, ...] = ()) -> float:
    """The pages the store uses (its WAL included, free pages not); of ``tables`` and their indexes if given."""
    db = sqlite3.connect(path)
    try:
        if tables:
            marks = ",".join("?" * len(tables))
            used = db.execute(f"SELECT COALESCE(SUM(pgsize), 0) FROM dbstat WHERE name IN"
                              f" (SELECT name FROM sqlite_master WHERE tbl_name IN ({marks}))", tables).fetchone()[0]
            return float(used / 1e6)
        pages, free, size = (db.execute(f"PRAGMA {p}").fetchone()[0] for p in ("page_count", "freelist_count",
                                                                              "page_size"))
    finally:
        db.close()
    return float((pages - free) * size / 1e6)


def synthetic_results(count: int, nodes: list[str], at: float, prefix: str) -> list[tuple[str, str, ProbeResult]]:
    """``count`` gemm results (16 measurements each, like one 8-GPU node's), for the write benchmark."""
    out = []
    for i in range(count):
        node = nodes[i % len(nodes)]
        ms = [Measurement.model_construct(name=name, value=1e12 + i, labels={**labels, "gpu": str(g)}, node=node,
                                          per_rank=None)
              for g in range(8) for name, labels in (("flop_per_second", {"dtype": "bf16"}),
                                                     ("memory_bandwidth_bytes_per_second", {}))]
        run_id = f"{prefix}{i:06d}"
        out.append((run_id, node, ProbeResult(probe="gemm", run_id=run_id, outcome=Outcome.PASS, reason="",
                                              started_at=at - 45, finished_at=at, nodes=[node], measurements=ms)))
    return out


def store_results(store: Store, results: list[tuple[str, str, ProbeResult]]) -> float:
    """Seconds to record and close ``results`` as the collector does: runs added at launch, closed in one batch."""
    for run_id, node, r in results:
        store.add_run(run_id=run_id, probe=r.probe, nodes=[node], backend="sim", job_id=None,
                      submitted_at=r.started_at, result_path=None, kind=RunKind.PROBE)
    started = time.perf_counter()
    store.finish_runs([FinishedRun(run_id, Outcome.PASS, "", r.finished_at, r, r.started_at, judge=False)
                       for run_id, _, r in results])
    return time.perf_counter() - started


def backfill(store: Store, days: int, day_rounds: int, round_s: float) -> None:
    """``days`` of older history: the last ``day_rounds`` simulated rounds' results again, one day further
    back each time, stored the way the collector stores them."""
    newest = store_now(store)
    runs = [r for r in store.recent_runs(limit=10**9)
            if r.state == "finished" and r.outcome is not None and r.submitted_at >= newest - day_rounds * round_s]
    values = {r.run_id: [Measurement.model_construct(name=m.name, value=m.value, labels=m.labels, node=m.node,
                                                     per_rank=None) for m in store.measurements(run_id=r.run_id)]
              for r in runs}
    for day in range(days, 0, -1):
        shift = day * DAY_S
        batch = []
        for r in runs:
            run_id = f"d{day}-{r.run_id}"
            at = (r.finished_at or r.submitted_at) - shift
            result = ProbeResult(probe=r.probe, run_id=run_id, outcome=r.outcome or Outcome.PASS, reason=r.reason,
                                 started_at=at - (r.duration_s or 0.0), finished_at=at, nodes=list(r.nodes),
                                 measurements=values[r.run_id])
            store.add_run(run_id=run_id, probe=r.probe, nodes=r.nodes, backend="sim", job_id=None,
                          submitted_at=r.submitted_at - shift, result_path=None, kind=RunKind.PROBE)
            batch.append(FinishedRun(run_id, result.outcome, r.reason, at, result, result.started_at, judge=False))
        store.finish_runs(batch)


def fresh_process(db: Path, settings_dir: Path, nodes: int) -> dict[str, float]:
    """Peak RSS and judge start-up of a new process over the store (what a restarted daemon pays)."""
    out = subprocess.run([sys.executable, __file__, "--fresh", str(db), "--workdir", str(settings_dir),
                          "--nodes", str(nodes)], capture_output=True, text=True, timeout=3600, check=True)
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def peak_rss_mb() -> float:
    """This process's peak RSS: ``VmHWM``, not ``ru_maxrss``, which a child keeps from its parent across fork and
    exec (the simulation's peak, not the fresh process's)."""
    found = re.search(r"^VmHWM:\s+(\d+) kB", Path("/proc/self/status").read_text(), re.MULTILINE)
    if found is None:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return int(found.group(1)) / 1024


def _fresh(db: Path, workdir: Path, nodes: int) -> None:
    settings = scenario_settings(scenario(nodes, 1), workdir / "state")
    store = Store(db)
    started = time.perf_counter()
    judge = load_judge(store, settings.judge, now=store_now(store))
    startup = time.perf_counter() - started
    started = time.perf_counter()
    exposition = Exposition(store, lambda: "sim")
    exposition.refresh()
    first_read = time.perf_counter() - started
    exposition.body()
    exposition.body_gzip()
    rss = peak_rss_mb()
    assert judge.series, "the judge holds its state while the exposition is read and scraped, as in the daemon"
    print(json.dumps({"rss_mb": round(rss, 1), "startup_s": round(startup, 3),
                      "exposition_first_read_s": round(first_read, 3)}))


def store_now(store: Store) -> float:
    newest = store.recent_runs(limit=1)
    return (newest[0].finished_at or newest[0].submitted_at) if newest else time.time()


def run(nodes: int, rounds: int, days: int, day_rounds: int, workdir: Path, store_count: int = 10_000,
        ) -> dict[str, Any]:
    sim = Simulation(scenario(nodes, rounds), workdir, echo=False)
    db = workdir / "sim.sqlite"
    sizes: dict[int, float] = {}
    jobs: dict[int, int] = {}

    def measure(rnd: int) -> None:
        sizes[rnd], jobs[rnd] = _size_mb(db, HISTORY), sim.jobs

    sim.on_round = measure
    sim.run()
    # steady state: the last round's growth (the first rounds also fill the series dictionary and judge state)
    grown_mb = sizes[rounds] - sizes.get(rounds - 1, 0.0)
    round_jobs = jobs[rounds] - jobs.get(rounds - 1, 0)
    simulated_s = sim.scenario.round_s
    ticks = round(sim.scenario.round_s / sim.scenario.tick_s)
    judged = sim.timings.judge[-ticks:]
    if days:
        backfill(sim.store, days, day_rounds, sim.scenario.round_s)
        sim.store.rollup(older_than=store_now(sim.store) - sim.settings.store.detail_days * DAY_S)
    served = scrape_measure(sim.store)
    names = sorted(sim.cluster.nodes)
    store_s = store_results(sim.store, synthetic_results(store_count, names, store_now(sim.store) + 60, "w"))
    store_s *= 10_000 / store_count
    sim.store.close()
    fresh = fresh_process(db, workdir, nodes)
    return {
        "nodes": nodes, "series": served["series"], "scrape_ms": served["scrape_ms"],
        "scrape_bytes": served["scrape_bytes"], "api_nodes_page_ms": served["api_nodes_page_ms"],
        "plan_tick_ms": round(statistics.median(sim.timings.plan[-ticks:]) * 1000, 1),
        "collect_tick_ms": round(statistics.median(sim.timings.collect[-ticks:]) * 1000, 1),
        "judge_ms_per_result": round(sum(s for s, _ in judged) * 1000 / max(1, sum(n for _, n in judged)), 3),
        "store_10k_results_s": round(store_s, 2), "rss_mb": fresh["rss_mb"],
        "store_mb_per_day": round(grown_mb / max(1, round_jobs) * min(round_jobs * DAY_S / simulated_s,
                                                                      DEFAULT_RUNS_PER_DAY), 1),
        "store_mb_per_day_bench_schedule": round(grown_mb * DAY_S / simulated_s, 1),
        "runs_per_day_default_schedule": round(min(round_jobs * DAY_S / simulated_s, DEFAULT_RUNS_PER_DAY)),
        "startup_s": fresh["startup_s"],
        "exposition_first_read_s": fresh["exposition_first_read_s"], "series_per_node": served["series_per_node"],
        "api_node_ms": served["api_node_ms"], "bytes_per_run": round(grown_mb * 1e6 / max(1, round_jobs)),
        "runs_per_day": round(round_jobs * DAY_S / simulated_s), "days": days, "rounds": rounds,
        "store_mb": round(_size_mb(db), 1),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=3, help="simulated rounds of 15 min (default 3)")
    ap.add_argument("--days", type=int, default=0, help="days of older history written before measuring")
    ap.add_argument("--day-rounds", type=int, default=2, help="rounds of results per backfilled day (default 2)")
    ap.add_argument("--store-results", type=int, default=10_000,
                    help="results in the write benchmark (default 10,000; the figure is scaled to 10,000)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--workdir", type=Path)
    ap.add_argument("--fresh", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    setup_logging("error")
    if args.fresh is not None:
        _fresh(args.fresh, args.workdir, args.nodes)
        return 0
    shape = (args.nodes, args.rounds, args.days, args.day_rounds)
    if args.workdir is not None:
        args.workdir.mkdir(parents=True, exist_ok=True)
        result = run(*shape, args.workdir, args.store_results)
    else:
        with tempfile.TemporaryDirectory(prefix="healthd-scale-") as tmp:
            result = run(*shape, Path(tmp), args.store_results)
    if args.json:
        print(json.dumps(result, sort_keys=True))
    else:
        for key, value in result.items():
            print(f"{key:>22}  {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
