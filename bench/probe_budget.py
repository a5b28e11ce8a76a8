"""What full daily coverage costs: a simulated week of a 1,000-node 8-GPU cluster (issue 16).

Users keep the nodes busy: each node alternates between user jobs (exponential, mean
``--job-hours``) and idle gaps whose mean follows the hour of the day, so that the idle share of the
cluster moves between ``--idle-min`` (15:00) and ``--idle-max`` (03:00). Scheduler time advances in
plan ticks (``--tick``); each tick does what the daemon's plan tick does with the real pure code:
``SimCluster.list_nodes`` (healthd.simulate's in-memory cluster), ``planning.plan`` with the default
Slurm limits, ``planning.within_budget`` with the GPU-seconds of the last 24 h, and at the end
``coverage.full_check_times`` / ``coverage.coverage``. Probes take ``Scenario.probe_seconds`` (gemm
45 s, nccl 75 s on 8 GPUs) and all pass; a user job that wants a node a probe holds starts when the
probe ends (the probe's GPU-seconds are its cost). No store, no result files: one week in about two
minutes per configuration at a 120 s tick (four times that at the daemon's default 30 s).

    .venv/bin/python bench/probe_budget.py [--days 7] [--nodes 1000] [--tick 120] [--only "defaults,every 4 h"]
"""

from __future__ import annotations

import argparse
import math
import random
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from healthd.config import ProbeSettings, Settings
from healthd.coverage import checked_times, coverage, full_check_times
from healthd.model import ProbeJob
from healthd.planning import (
    DAY_S,
    PlanLimits,
    ProbeBudget,
    budget_limit_gpu_s,
    plan,
    run_cost_gpu_s,
    within_budget,
)
from healthd.simulate import SIM_EPOCH, ClassSpec, Scenario, SimCluster

GPUS = 8


@dataclass(frozen=True)
class Config:
    name: str
    interval_s: float
    max_share: float | None = None


@dataclass
class Outcome:
    config: Config
    gpu_s: float
    jobs: int
    coverage_min: float
    coverage_mean: float
    reachable_min: float
    wall_s: float
    boundary_min: float
    """Coverage when every job's epilog also runs the node check (``healthd node-check``)."""
    boundary_mean: float


def idle_share(now: float, low: float, high: float) -> float:
    hour = ((now - SIM_EPOCH) / 3600.0) % 24.0
    return low + (high - low) * (0.5 + 0.5 * math.cos(2 * math.pi * (hour - 3.0) / 24.0))


def simulate(cfg: Config, args: argparse.Namespace) -> Outcome:
    started = time.perf_counter()
    scenario = Scenario(classes=[ClassSpec(name="h100x8", count=args.nodes, prefix="gpu", gpus=GPUS)])
    cluster = SimCluster(scenario)
    rng = random.Random(args.seed)
    job_s = args.job_hours * 3600.0
    names = sorted(cluster.nodes)
    share0 = idle_share(SIM_EPOCH, args.idle_min, args.idle_max)
    next_change: dict[str, float] = {}
    for name in names:
        busy = rng.random() > share0
        cluster.nodes[name].user = busy
        mean = job_s if busy else job_s * share0 / (1 - share0)
        next_change[name] = SIM_EPOCH + rng.expovariate(1 / mean)
    probes = {p: ProbeSettings(interval_s=cfg.interval_s, jitter_s=min(3600.0, cfg.interval_s / 10))
              for p in ("gemm", "nccl")}
    durations = {p: scenario.probe_seconds[p] for p in probes}
    defaults = Settings(backend="local").slurm
    limits = PlanLimits(max_jobs_in_flight=defaults.max_concurrent_jobs, max_idle_share=defaults.max_idle_share)
    gpus = {name: GPUS for name in names}
    limit = budget_limit_gpu_s(None, cfg.max_share, GPUS * len(names))
    last_attempts: dict[tuple[str, str], float] = {}
    last_judged: dict[tuple[str, str], float] = {}
    last_idle: dict[str, float] = {}
    last_boundary: dict[str, float] = {}
    running: dict[str, tuple[float, ProbeJob]] = {}
    window: deque[tuple[float, float]] = deque()
    spent_window = total = 0.0
    jobs_run = 0
    coverages: list[float] = []
    with_boundary: list[float] = []
    reachable: list[float] = []
    end = SIM_EPOCH + args.days * DAY_S
    now = SIM_EPOCH
    while now < end:
        for name, (done_at, job) in list(running.items()):
            if done_at <= now:
                del running[name]
                if name == job.nodes[0]:
                    cost = run_cost_gpu_s(job.probe, job.nodes, gpus, durations, 0.0)
                    window.append((done_at, cost))
                    spent_window += cost
                    total += cost
                    for n in job.nodes:
                        last_judged[(n, job.probe)] = done_at
        while window and window[0][0] < now - DAY_S:
            spent_window -= window.popleft()[1]
        share = idle_share(now, args.idle_min, args.idle_max)
        for name in names:
            node = cluster.nodes[name]
            if next_change[name] > now:
                continue
            if not node.user and name in running:
                continue  # the user's job starts when the probe ends
            if node.user:
                last_boundary[name] = now  # the job's epilog runs the node check
                if rng.random() < args.back_to_back:  # the queue is full: the next job starts at once
                    next_change[name] = now + rng.expovariate(1 / job_s)
                    continue
            node.user = not node.user
            mean = job_s if node.user else job_s * share / (1 - share)
            next_change[name] = now + rng.expovariate(1 / mean)
        cluster.running = {n: job.run_id for n, (_, job) in running.items()}
        nodes = cluster.list_nodes()
        for seen in nodes:
            if not cluster.nodes[seen.name].user:
                last_idle[seen.name] = now
        in_flight = len({job.run_id for _, job in running.values()})
        jobs = plan(nodes, probes=probes, last_attempts=last_attempts, busy_nodes=set(running), in_flight=in_flight,
                    now=now, limits=limits)
        committed = spent_window + sum(run_cost_gpu_s(j.probe, j.nodes, gpus, durations, 0.0)
                                       for j in {job.run_id: job for _, job in running.values()}.values())
        for job in within_budget(jobs, budget=ProbeBudget(limit, committed), gpus=gpus, duration_s=durations):
            jobs_run += 1
            for n in job.nodes:
                last_attempts[(n, job.probe)] = now
                running[n] = (now + durations[job.probe], job)
        now += args.tick
        if now - SIM_EPOCH >= DAY_S and int(now - SIM_EPOCH) % 3600 < args.tick:
            checks = full_check_times(names, probes, last_judged)
            coverages.append(coverage(nodes, checks, now)[None].ratio)
            either = {n: at for n, (at, _) in checked_times(checks, last_boundary).items()}
            with_boundary.append(coverage(nodes, either, now)[None].ratio)
            idle_nodes = [seen for seen in nodes if now - last_idle.get(seen.name, float("-inf")) <= DAY_S]
            reachable.append(coverage(idle_nodes, checks, now)[None].ratio)
    return Outcome(cfg, total, jobs_run, min(coverages), sum(coverages) / len(coverages), min(reachable),
                   time.perf_counter() - started, min(with_boundary), sum(with_boundary) / len(with_boundary))


def table(outcomes: Sequence[Outcome], args: argparse.Namespace) -> str:
    cluster_gpu_s = args.nodes * GPUS * args.days * DAY_S
    lines = ["| config | interval | budget | probe jobs | GPU-hours/day | share of GPU-hours | coverage 24 h"
             " (min / mean) | coverage of the nodes idle at a tick in the 24 h (min) |"
             " with epilog checks: coverage 24 h (min / mean) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for o in outcomes:
        budget = "none" if o.config.max_share is None else f"{o.config.max_share:.2%}"
        lines.append(f"| {o.config.name} | {o.config.interval_s / 3600:g} h | {budget} | {o.jobs:,} | "
                     f"{o.gpu_s / 3600 / args.days:,.1f} | {o.gpu_s / cluster_gpu_s:.3%} | "
                     f"{o.coverage_min:.1%} / {o.coverage_mean:.1%} | {o.reachable_min:.1%} | "
                     f"{o.boundary_min:.1%} / {o.boundary_mean:.1%} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--days", type=float, default=7.0)
    parser.add_argument("--tick", type=float, default=120.0,
                        help="plan interval, simulated seconds (the daemon's default is 30)")
    parser.add_argument("--job-hours", type=float, default=6.0, help="mean length of a user job")
    parser.add_argument("--idle-min", type=float, default=0.04, help="idle share of the cluster at 15:00")
    parser.add_argument("--idle-max", type=float, default=0.14, help="idle share of the cluster at 03:00")
    parser.add_argument("--back-to-back", type=float, default=0.0,
                        help="chance that a job's end is followed at once by the next job (a full queue: the node"
                             " is not idle in between); a busy cluster: --idle-min 0.02 --idle-max 0.10"
                             " --back-to-back 0.8")
    parser.add_argument("--seed", type=int, default=16)
    parser.add_argument("--only", default="", help="comma-separated config names (default: all)")
    args = parser.parse_args()
    configs = [
        Config("defaults", 900.0),
        Config("defaults + budget", 900.0, 0.005),
        Config("daily", 20 * 3600.0),
        Config("every 8 h", 8 * 3600.0),
        Config("every 4 h", 4 * 3600.0),
        Config("every 4 h + budget", 4 * 3600.0, 0.005),
        Config("every 4 h + tight budget", 4 * 3600.0, 0.001),
    ]
    wanted = {w.strip() for w in args.only.split(",") if w.strip()}
    outcomes = []
    for cfg in (c for c in configs if not wanted or c.name in wanted):
        outcomes.append(simulate(cfg, args))
        print(f"{cfg.name}: {outcomes[-1].wall_s:.0f} s", flush=True)
    print(table(outcomes, args))


if __name__ == "__main__":
    main()
