"""Every scenario x several seeds, one Markdown row each (issue 37: one judgement over every source).

For each scenario (default: every ``bench/scenarios/*.toml``) and seed (default: the scenario's seed and
the next ``--seeds-per`` - 1), runs ``healthd simulate`` in-process and prints: the faults found (node,
GPU, link, hard and switch faults), rounds to find (median / max, switch faults by the round a finding
named them), faults found within 2 rounds, false drains, healthy nodes of an event's class drained
while the event is on, switch findings started (of them, started without their own test beyond chance,
and naming no faulty switch), and class events raised where no scenario event is on.

    .venv/bin/python bench/judge_shapes.py [SCENARIO.toml ...] [--seeds 1,2,3 | --seeds-per 3] [--jobs 2]
        [--json DIR]

The figures the issue asks for on its shapes: every fault found within 2 rounds, 0 false drains, 0
drains during events, 0 switch findings not beyond chance.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from healthd.logging import setup_logging
from healthd.simulate import SimReport, load_scenario, simulate

REPO = Path(__file__).resolve().parents[1]
HEADER = ("| scenario | seed | faults found | rounds to find (median / max) | within 2 rounds | false drains "
          "| healthy drains during events | switch findings (not beyond chance / false) | false class events "
          "| s |")


def figures(report: SimReport) -> dict[str, Any]:
    """The row's figures from one report (pure)."""
    faults = [f for f in report.faults if f.fault.kind != "error" and not (f.fault.path and f.measured_round is None)]
    rounds = [f.rounds_to_find for f in faults if f.rounds_to_find is not None]
    rounds += [s.rounds_to_name for s in report.switch_faults if s.rounds_to_name is not None]
    total = len(faults) + len(report.switch_faults)
    return {
        "scenario": report.scenario.name, "seed": report.scenario.seed, "faults": total, "found": len(rounds),
        "rounds": rounds, "fast": sum(1 for r in rounds if r <= 2), "false_drains": len(report.false_drains),
        "false_drain_nodes": [f"{n} r{r}" for r, n, _ in report.false_drains],
        "event_drains": report.event_false_drains, "switch_findings": len(report.switch_findings),
        "chance": len(report.chance_switch_findings), "false_switch": len(report.false_switch_findings),
        "chance_text": [f"{sw} r{r} p={p:.2g}" for r, sw, _, p in report.chance_switch_findings],
        "false_events": len(report.false_fleet_events),
        "false_event_text": sorted({f"{c}/{p} r{r}" for r, c, p in report.false_fleet_events}),
        "elapsed_s": round(report.elapsed_s, 1),
    }


def row(fig: dict[str, Any]) -> str:
    rounds = fig["rounds"]
    med = f"{statistics.median(rounds):g} / {max(rounds)}" if rounds else "-"
    return (f"| {fig['scenario']} | {fig['seed']} | {fig['found']} of {fig['faults']} | {med} | {fig['fast']} "
            f"| {fig['false_drains']} | {fig['event_drains']} | {fig['switch_findings']} ({fig['chance']} / "
            f"{fig['false_switch']}) | {fig['false_events']} | {fig['elapsed_s']:g} |")


def _one(job: tuple[Path, int, Path | None]) -> dict[str, Any]:
    path, seed, out = job
    setup_logging("warning")
    scenario = load_scenario(path)
    report = simulate(scenario.model_copy(update={"seed": seed}), echo=False)
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / f"{scenario.name}-seed{seed}.json").write_text(json.dumps(report.to_dict(), indent=1, sort_keys=True))
    return figures(report)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("scenarios", nargs="*", type=Path, help="default: every bench/scenarios/*.toml")
    parser.add_argument("--seeds", default="", help="comma-separated seeds for every scenario")
    parser.add_argument("--seeds-per", type=int, default=3, help="else the scenario's seed and the next N-1")
    parser.add_argument("--jobs", type=int, default=1, help="scenarios simulated at once (processes)")
    parser.add_argument("--json", type=Path, help="also write each report as DIR/<scenario>-seed<N>.json")
    args = parser.parse_args(argv)
    paths = args.scenarios or sorted((REPO / "bench" / "scenarios").glob("*.toml"))
    jobs: list[tuple[Path, int, Path | None]] = []
    for path in paths:
        base = load_scenario(path).seed
        seeds = [int(s) for s in args.seeds.split(",") if s] or [base + i for i in range(args.seeds_per)]
        jobs += [(path, seed, args.json) for seed in seeds]
    print(HEADER)
    print("|" + "---|" * (HEADER.count(" | ") + 1), flush=True)
    with ProcessPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        for fig in pool.map(_one, jobs):
            print(row(fig), flush=True)
            notes = [f"false drains: {', '.join(fig['false_drain_nodes'][:8])}" if fig["false_drain_nodes"] else "",
                     f"not beyond chance: {', '.join(fig['chance_text'][:6])}" if fig["chance_text"] else "",
                     f"false class events: {', '.join(fig['false_event_text'][:6])}" if fig["false_event_text"] else ""]
            if any(notes):
                print(f"<!-- {fig['scenario']} seed {fig['seed']}: {'; '.join(n for n in notes if n)} -->", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
