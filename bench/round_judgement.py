"""Correlated findings judged together (issue 27 item 0): one scenario over several seeds.

For each seed, runs ``healthd simulate`` in-process and prints one Markdown row: the faults found
(and how fast), false drains, the drains of healthy nodes of an event's class while the event is on
(the event must hold them), the false drains of the cold start (rounds 1-2: no node has history
yet), and the round each class-wide event was recognised in.

    .venv/bin/python bench/round_judgement.py [--scenario bench/scenarios/event-cold-1400.toml] [--seeds 27,28]
        [--noise 1] [--rounds N] [--json DIR]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from healthd.logging import setup_logging
from healthd.simulate import Scenario, SimReport, load_scenario, scale_noise, simulate

REPO = Path(__file__).resolve().parents[1]
COLD_ROUNDS = 2
"""Rounds counted as the cold start: before them no node has a baseline (``baseline.min_samples`` = 3)."""
HEADER = ("| seed | faults found | rounds to find (median / max) | drained within 2 rounds | false drains "
          "| false drains at cold start (rounds 1-2) | healthy nodes drained during the event "
          "| event recognised in round |")


def class_of(scenario: Scenario, node: str) -> str:
    for c in scenario.classes:
        if node.startswith(c.prefix) and node[len(c.prefix):].isdigit():
            return c.name
    return "?"


def figures(report: SimReport) -> dict[str, Any]:
    """The row's figures from one report (pure)."""
    s = report.scenario
    faults = [f for f in report.faults if f.fault.kind != "error"]
    found = [f for f in faults if f.found_round is not None]
    rounds = [f.rounds_to_find for f in found if f.rounds_to_find is not None]
    drained_fast = [f for f in faults if f.drained_round is not None and f.drained_round - f.fault.from_round < 2]
    during = [(r, n) for r, n, _ in report.false_drains
              if any(e.active(r) and class_of(s, n) == e.node_class for e in s.events)]
    cold = [(r, n) for r, n, _ in report.false_drains if r <= COLD_ROUNDS]
    recognised = []
    for e in s.events:
        raised = sorted(r for r, cls, probe, _ in report.fleet_events if cls == e.node_class and probe == e.probe
                        and r >= e.from_round)
        recognised.append(f"{raised[0]} (began {e.from_round})" if raised else f"- (began {e.from_round})")
    return {"seed": s.seed, "faults": len(faults), "found": len(found), "rounds": rounds,
            "drained_fast": len(drained_fast), "false_drains": len(report.false_drains),
            "false_drain_nodes": [f"{n} (round {r})" for r, n, _ in report.false_drains],
            "cold": len(cold), "during_event": len(during), "recognised": recognised}


def row(fig: dict[str, Any]) -> str:
    rounds = fig["rounds"]
    med = f"{statistics.median(rounds):g} / {max(rounds)}" if rounds else "-"
    return (f"| {fig['seed']} | {fig['found']} of {fig['faults']} | {med} | {fig['drained_fast']} of {fig['faults']} "
            f"| {fig['false_drains']} | {fig['cold']} | {fig['during_event']} | {', '.join(fig['recognised'])} |")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scenario", type=Path, default=REPO / "bench" / "scenarios" / "event-cold-1400.toml")
    parser.add_argument("--seeds", default="", help="comma-separated seeds (default: the scenario's)")
    parser.add_argument("--noise", type=float, default=1.0, help="factor on every class's noise (default 1)")
    parser.add_argument("--rounds", type=int, default=0, help="play this many rounds (default: the scenario's)")
    parser.add_argument("--json", type=Path, help="also write each report as DIR/seed<N>.json")
    args = parser.parse_args(argv)
    setup_logging("warning")
    scenario = scale_noise(load_scenario(args.scenario), args.noise)
    if args.rounds:
        scenario = scenario.model_copy(update={"rounds": args.rounds})
    seeds = [int(s) for s in args.seeds.split(",") if s] or [scenario.seed]
    print(HEADER)
    print("|" + "---|" * (HEADER.count(" | ") + 1))
    for seed in seeds:
        report = simulate(scenario.model_copy(update={"seed": seed}), echo=False)
        fig = figures(report)
        print(row(fig), flush=True)
        if fig["false_drain_nodes"]:
            print(f"<!-- seed {seed} false drains: {', '.join(fig['false_drain_nodes'])} -->", flush=True)
        if args.json is not None:
            args.json.mkdir(parents=True, exist_ok=True)
            (args.json / f"seed{seed}.json").write_text(json.dumps(report.to_dict(), indent=1, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
