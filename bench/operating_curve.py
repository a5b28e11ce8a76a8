"""The judge's operating curve: one scenario at several noise levels (issue 13).

Runs ``healthd simulate`` in-process for each ``--noise`` factor (every class's ``noise`` is
multiplied by it; ``bench/scenarios/curve-1000.toml`` has 1% noise, so the factors are the noise
in percent) and prints one Markdown row per level: faults found, how fast, false
recommendations and drains, and the detection limit, read from the scenario's ``drift`` fault
(the drop at which the drifting node was found, also in units of the run-to-run noise).

    .venv/bin/python bench/operating_curve.py [--scenario bench/scenarios/curve-1000.toml] [--noise 1,2,3,4,6]
    .venv/bin/python bench/operating_curve.py --reports DIR   # summarise saved `simulate --json` reports

A scenario with switch faults (``switch_faults``, issue 27) gets the switch table instead: per noise
level, seed and with/without the topology (``--topology both``), the switch faults named and in how
many rounds, the nodes drained under faulty switches, false switch findings, and the node faults
found and falsely drained:

    .venv/bin/python bench/operating_curve.py --scenario bench/scenarios/fabric-512.toml --noise 1 --seeds 5,6

A scenario with passive signals (``[[passive]]``, issue 29) adds the passive columns: recommendations from
passive signals, those on nodes without a fault of their own, and fleet events:

    .venv/bin/python bench/operating_curve.py --scenario bench/scenarios/passive-320.toml --noise 1,2,3,4,6
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from healthd.simulate import load_scenario, scale_noise, simulate

REPO = Path(__file__).resolve().parents[1]
SWITCH_HEADER = ("| noise | seed | topology | switch faults named | rounds to name (median / max) | node drains under "
                 "faulty switches | false switch findings | fleet events | node faults found (in 1 round) "
                 "| false drains |")
HEADER = ("| noise | faults found | -20% or worse within 2 rounds | rounds to find (median / max) | named right "
          "| false recommendations | false drains | drift found at (drop, noise units) |")


PASSIVE_COLUMN = " passive recommendations (on nodes without a fault) | fleet events |"


def passive_cell(report: Mapping[str, Any], faulty: set[str]) -> str:
    """The passive columns (issue 29): recommendations from passive signals, those on nodes the scenario
    gave no fault (spurious signals: should be none), and the fleet events raised."""
    recs = report.get("passive_recommendations", [])
    spurious = [r for r in recs if r["node"] not in faulty]
    codes = ", ".join(sorted({r["reason_code"] for r in recs}))
    return f" {len(recs)}{f' ({codes})' if codes else ''} ({len(spurious)}) | {len(report['fleet_events'])} |"


def row(noise_pct: float, report: Mapping[str, Any], faults: Sequence[Mapping[str, Any]]) -> str:
    """One table row from a ``SimReport.to_dict()`` and the scenario's fault specs (same order)."""
    pairs = [(spec, got) for spec, got in zip(faults, report["faults"], strict=True) if spec["kind"] != "error"]
    found = [(spec, got) for spec, got in pairs if got["found_round"] is not None]
    big = [(spec, got) for spec, got in pairs if spec["kind"] not in ("drift",)
           and (spec["kind"] not in ("node", "gpu", "link") or spec.get("factor", 1.0) <= 0.8)]
    fast = [got for _, got in big if got["rounds_to_find"] is not None and got["rounds_to_find"] <= 2]
    rounds = [got["rounds_to_find"] for spec, got in found if spec["kind"] != "drift"]
    named = [got for _, got in found if got["named_right"]]
    drift = "-"
    for spec, got in pairs:
        if spec["kind"] == "drift":
            if got["found_round"] is None:
                drift = "not found"
            else:
                drop = 1 - spec.get("per_round", 0.98) ** (got["found_round"] - spec.get("from_round", 1) + 1)
                drift = f"-{drop * 100:.0f}% ({drop * 100 / noise_pct:.1f})"
    med = f"{statistics.median(rounds):g} / {max(rounds)}" if rounds else "-"
    return (f"| {noise_pct:g}% | {len(found)} of {len(pairs)} | {len(fast)} of {len(big)} | {med} "
            f"| {len(named)} of {len(found)} | {len(report['false_recommendations'])} "
            f"| {len(report['false_drains'])} | {drift} |")


def switch_row(noise_pct: float, seed: int, topology: bool, report: Mapping[str, Any]) -> str:
    """One row of the switch table from a ``SimReport.to_dict()``."""
    switches = report["switch_faults"]
    named = [s for s in switches if s["named_round"] is not None]
    rounds = [s["rounds_to_name"] for s in named]
    med = f"{statistics.median(rounds):g} / {max(rounds)}" if rounds else "-"
    faults = [f for f in report["faults"] if not f["fault"].startswith("error")]
    found = [f for f in faults if f["found_round"] is not None]
    fast = [f for f in found if f["rounds_to_find"] == 1]
    as_named = ", ".join(sorted({s["named_as"] for s in named}))
    return (f"| {noise_pct:g}% | {seed} | {'yes' if topology else 'no'} | {len(named)} of {len(switches)}"
            f"{f' ({as_named})' if as_named else ''} | {med} | {sum(s['node_drains'] for s in switches)} "
            f"| {len(report['false_switch_findings'])} | {len(report['fleet_events'])} "
            f"| {len(found)} of {len(faults)} ({len(fast)}) | {len(report['false_drains'])} |")


def switch_table(scenario: Any, noises: Sequence[str], seeds: Sequence[int], topologies: Sequence[bool]) -> None:
    base = scenario.classes[0].noise * 100
    print(SWITCH_HEADER)
    print("|" + "---|" * (SWITCH_HEADER.count(" | ") + 1))
    for text in noises:
        for seed in seeds:
            for topology in topologies:
                run = scale_noise(scenario, float(text)).model_copy(update={"seed": seed, "use_topology": topology})
                print(switch_row(base * float(text), seed, topology, simulate(run, echo=False).to_dict()), flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scenario", type=Path, default=REPO / "bench" / "scenarios" / "curve-1000.toml")
    parser.add_argument("--noise", default="1,2,3,4,6", help="comma-separated factors (default 1,2,3,4,6)")
    parser.add_argument("--reports", type=Path, help="a folder of n<factor>.json from `healthd simulate --json`")
    parser.add_argument("--seeds", help="comma-separated seeds (default: the scenario's)")
    parser.add_argument("--topology", choices=("on", "off", "both"), default="both",
                        help="switch scenarios: judge with the fabric, without it, or both (default)")
    args = parser.parse_args(argv)
    scenario = load_scenario(args.scenario)
    if scenario.switch_faults:
        seeds = [int(x) for x in args.seeds.split(",")] if args.seeds else [scenario.seed]
        topologies = {"on": [True], "off": [False], "both": [True, False]}[args.topology]
        switch_table(scenario, args.noise.split(","), seeds, topologies)
        return 0
    base = scenario.classes[0].noise * 100
    faults = [f.model_dump() for f in scenario.faults]
    passive = bool(scenario.passive)
    header = HEADER + (PASSIVE_COLUMN if passive else "")
    print(header)
    print("|" + "---|" * header.count(" | ") + "---|")
    for text in args.noise.split(","):
        factor = float(text)
        if args.reports is not None:
            report = json.loads((args.reports / f"n{text}.json").read_text())
        else:
            report = simulate(scale_noise(scenario, factor), echo=False).to_dict()
        line = row(base * factor, report, faults)
        if passive:
            line += passive_cell(report, {f["node"] for f in faults if f["kind"] != "error"})
        print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
