"""The simulator's shapes of issue 37: round-wide common-mode shifts, events on a chosen series, a class
cabled under its own spines, and the report's false class events and switch findings not beyond chance."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from healthd.model import ProbeJob
from healthd.simulate import Scenario, ShiftSpec, SimCluster, finding_p, load_scenario, simulate

REPO = Path(__file__).resolve().parents[2]
SHAPES = sorted((REPO / "bench" / "scenarios").glob("shape-*.toml"))


def scenario(**extra: Any) -> Scenario:
    series = [
        {"probe": "gemm", "name": "flop_per_second", "per": "gpu", "value": 100.0},
        {"probe": "nccl", "name": "busbw_bytes_per_second", "per": "node", "labels": {"scope": "node"},
         "value": 50.0},
        {"probe": "nccl", "name": "busbw_bytes_per_second", "per": "group", "labels": {"scope": "group"},
         "value": 40.0},
    ]
    classes = [{"name": "big", "count": 6, "prefix": "b", "gpus": 2, "noise": 0.0, "series": series},
               {"name": "small", "count": 3, "prefix": "s", "gpus": 2, "noise": 0.0, "series": series}]
    return Scenario(**{"classes": classes, **extra})


def measure(sc: Scenario, probe: str, nodes: tuple[str, ...], rnd: int, tmp: Path) -> dict[tuple[Any, ...], float]:
    """One simulated probe run in round ``rnd``: (name, scope, node, gpu) → value."""
    cluster = SimCluster(sc)
    cluster.round = rnd
    path = tmp / f"{probe}-{rnd}-{'-'.join(nodes)}.json"
    job_id = cluster.submit(ProbeJob(probe=probe, nodes=nodes, run_id=f"r{rnd}", timeout_s=300.0), path)
    cluster.now += 1000.0
    cluster.poll([job_id])
    doc = json.loads(path.read_text())
    return {(m["name"], m["labels"].get("scope"), m.get("node"), m["labels"].get("gpu")): m["value"]
            for m in doc["measurements"]}


def test_every_shape_scenario_loads_and_names_nodes_it_has() -> None:
    assert len(SHAPES) >= 7
    for path in SHAPES:
        sc = load_scenario(path)
        assert sc.name == path.stem
        assert any(c.outlier_rate >= 0.01 for c in sc.classes), path


def test_a_shift_moves_every_value_of_a_round_together(tmp_path: Path) -> None:
    shift = {"factor_min": 0.6, "factor_max": 0.8, "from_round": 2}
    sc = scenario(shifts=[shift])
    plain = measure(scenario(), "nccl", ("b0", "b1"), 3, tmp_path)
    shifted = measure(sc, "nccl", ("b0", "b1"), 3, tmp_path)
    ratios = {round(shifted[k] / v, 9) for k, v in plain.items()}
    assert len(ratios) == 1 and 0.6 <= ratios.pop() <= 0.8  # node and group values: one factor
    gemm = measure(sc, "gemm", ("s0",), 3, tmp_path)
    assert {round(v / 100.0, 9) for v in gemm.values()} == {round(ShiftSpec(**shift).factor(1, 0, 3), 9)}
    assert measure(sc, "nccl", ("b0", "b1"), 1, tmp_path) == plain  # before from_round: untouched


def test_a_shift_is_drawn_per_round_and_hits_a_share_of_rounds() -> None:
    s = ShiftSpec(factor_min=0.6, factor_max=0.8, rate=0.5)
    factors = [s.factor(7, 0, rnd) for rnd in range(1, 201)]
    hit = [f for f in factors if f != 1.0]
    assert 60 < len(hit) < 140 and all(0.6 <= f <= 0.8 for f in hit)
    assert factors == [s.factor(7, 0, rnd) for rnd in range(1, 201)]  # deterministic
    assert ShiftSpec(factor_min=0.7, factor_max=0.7, rate=0.0).factor(7, 0, 3) == 1.0
    with pytest.raises(ValueError, match="factor_max is below factor_min"):
        ShiftSpec(factor_min=0.8, factor_max=0.6)


def test_a_shift_matches_classes_and_probes(tmp_path: Path) -> None:
    sc = scenario(shifts=[{"node_class": "small", "probe": "gemm", "factor_min": 0.5, "factor_max": 0.5}])
    assert set(measure(sc, "gemm", ("s1",), 2, tmp_path).values()) == {50.0}
    assert set(measure(sc, "gemm", ("b1",), 2, tmp_path).values()) == {100.0}
    assert set(measure(sc, "nccl", ("s1", "s2"), 2, tmp_path).values()) == {50.0, 40.0}


def test_an_event_on_the_gpu_series_alone(tmp_path: Path) -> None:
    sc = scenario(events=[{"node_class": "big", "probe": "gemm", "per": "gpu", "factor": 0.8, "from_round": 1},
                          {"node_class": "big", "probe": "nccl", "per": "node", "factor": 0.5, "from_round": 1}])
    assert set(measure(sc, "gemm", ("b2",), 1, tmp_path).values()) == {80.0}
    nccl = measure(sc, "nccl", ("b2", "b3"), 1, tmp_path)
    assert {k[1]: v for k, v in nccl.items()} == {"node": 25.0, "group": 40.0}  # per = node: not the group's


def test_a_generated_fabric_without_by_class_is_unchanged() -> None:
    topo = scenario(fabric={"leaf_size": 4, "leaves_per_spine": 2}).topology()
    assert topo is not None
    assert {s: sorted(topo.nodes_under(s)) for s in topo.switches} == {
        "leaf0": ["b0", "b1", "b2", "b3"], "leaf1": ["b4", "b5", "s0", "s1"], "leaf2": ["s2"],
        "spine0": ["b0", "b1", "b2", "b3", "b4", "b5", "s0", "s1"], "spine1": ["s2"]}


def test_a_class_cabled_under_its_own_leaves_and_spines() -> None:
    topo = scenario(fabric={"leaf_size": 4, "leaves_per_spine": 2, "by_class": True}).topology()
    assert topo is not None
    assert {s: sorted(topo.nodes_under(s)) for s in topo.switches} == {
        "leaf0": ["b0", "b1", "b2", "b3"], "leaf1": ["b4", "b5"], "leaf2": ["s0", "s1", "s2"],
        "spine0": ["b0", "b1", "b2", "b3", "b4", "b5"], "spine1": ["s0", "s1", "s2"]}


def test_finding_p_reads_the_corrected_p() -> None:
    assert finding_p("35 of 65 flagged, 47.4 expected by chance (p = 1)") == 1.0
    assert finding_p("... (p = 3e-14); leaves leaf2, leaf3 all beyond chance") == 3e-14
    assert finding_p("fleet event: no p here") is None


def test_the_report_counts_class_events_where_none_is_on() -> None:
    """A whole class 40% down for good with no event declared in the scenario: the class event it raises
    is counted as a false one (a common-mode shift must not flag the class)."""
    series = [{"probe": "gemm", "name": "flop_per_second", "per": "gpu", "value": 100.0}]
    sc = Scenario(rounds=4, round_s=900.0, tick_s=90.0,
                  healthd={"probes": {"gemm": {"interval_s": 840.0, "jitter_s": 60.0, "timeout_s": 180.0},
                                      "nccl": {"enabled": False}}},
                  classes=[{"name": "c", "count": 12, "prefix": "c", "gpus": 2, "noise": 0.01, "series": series}],
                  shifts=[{"factor_min": 0.6, "factor_max": 0.6, "from_round": 4}])
    report = simulate(sc, echo=False)
    assert [(r, c, p) for r, c, p, _ in report.fleet_events] == report.false_fleet_events == [(4, "c", "gemm")]
    assert report.to_dict()["false_fleet_events"] == [{"round": 4, "node_class": "c", "probe": "gemm"}]
    assert report.false_drains == [] and report.event_false_drains == 0
