"""``healthd simulate`` with a fabric (issue 27): switch, uplink and rack faults named as one switch
finding each, no node drained for them, an independent node fault still drained; without the topology
the same faults drain the switches' nodes one by one (the contrast the switch rule exists for)."""

from __future__ import annotations

from pathlib import Path

import pytest

from healthd.errors import ConfigError
from healthd.simulate import Scenario, SimReport, format_report, load_scenario, simulate

REPO = Path(__file__).resolve().parents[2]

SCENARIO = """
name = "fabric-160"
seed = 7
rounds = 5
round_s = 900.0
tick_s = 90.0

[fabric]
leaf_size = 16
leaves_per_spine = 5

[healthd.probes.gemm]
interval_s = 840.0
jitter_s = 60.0
[healthd.probes.nccl]
interval_s = 840.0
jitter_s = 60.0
nodes_per_job = 2
[healthd.slurm]
max_concurrent_jobs = 160
max_idle_share = 1.0
[healthd.remediation]
mode = "enforce"
max_actions_per_hour = 60
breaker_class_share = 0.5

[[classes]]
name = "h100x8"
count = 160
prefix = "n"
noise = 0.02

[[classes.series]]
probe = "gemm"
name = "flop_per_second"
per = "gpu"
labels = { dtype = "bf16" }
value = 700e12

[[classes.series]]
probe = "nccl"
name = "busbw_bytes_per_second"
per = "node"
labels = { collective = "all_reduce", size_bytes = "1073741824", scope = "node" }
value = 480e9

[[classes.series]]
probe = "nccl"
name = "busbw_bytes_per_second"
per = "group"
labels = { collective = "all_reduce", size_bytes = "1073741824", scope = "group" }
value = 440e9

[[switch_faults]]          # leaf1 = n016..n031, repaired after round 3
kind = "switch"
switch = "leaf1"
from_round = 2
until_round = 3

[[switch_faults]]          # leaf7 = n112..n127: only pairs leaving the leaf
kind = "uplink"
switch = "leaf7"
from_round = 4

[[faults]]
kind = "node"
node = "n005"
probe = "nccl"
name = "busbw_bytes_per_second"
factor = 0.75
from_round = 2
"""


def scenario(tmp_path: Path, *, topology: bool = True) -> Scenario:
    path = tmp_path / "fabric.toml"
    path.write_text(SCENARIO)
    return load_scenario(path).model_copy(update={"use_topology": topology})


@pytest.fixture(scope="module")
def reports(tmp_path_factory: pytest.TempPathFactory) -> dict[bool, SimReport]:
    tmp = tmp_path_factory.mktemp("fabric")
    return {t: simulate(scenario(tmp, topology=t), echo=False) for t in (True, False)}


def test_each_faulty_switch_is_one_finding_and_none_of_its_nodes_is_drained(reports: dict[bool, SimReport]) -> None:
    report = reports[True]
    assert [(s.fault.switch, s.named_as, s.rounds_to_name, s.node_drains) for s in report.switch_faults] == [
        ("leaf1", "leaf1", 1, 0), ("leaf7", "leaf7", 1, 0)]
    assert [(r, sw, p) for r, sw, _, p, _ in report.switch_findings] == [(2, "leaf1", "nccl"), (4, "leaf7", "nccl")]
    assert any("switch finding ended: leaf1 nccl" in e for line in report.rounds for e in line.events)
    assert report.false_switch_findings == [] and report.false_drains == [] and report.fleet_events == []
    (node,) = report.faults
    assert (node.fault.node, node.rounds_to_find, node.drained_round) == ("n005", 1, 2)
    text = format_report(report)
    assert "named as leaf1; 0 node drain(s) under it" in text and "named as leaf7; 0 node drain(s) under it" in text
    assert "switch faults 2, named 2; switch findings 2, false 0; node drains under faulty switches 0" in text


def test_without_the_topology_the_switches_nodes_are_drained(reports: dict[bool, SimReport]) -> None:
    report = reports[False]
    assert report.switch_findings == [] and all(s.named_round is None for s in report.switch_faults)
    assert sum(s.node_drains for s in report.switch_faults) >= 5
    assert "(judged without the topology)" in format_report(report)


@pytest.mark.parametrize(("extra", "message"), [
    ('[[switch_faults]]\nkind = "switch"\nswitch = "leaf99"\n', "no switch 'leaf99'"),
    ('[[switches]]\nname = "x"\nnodes = ["zz9"]\n', "no node 'zz9'"),
    ('[[switches]]\nname = "x"\nnodes = ["n001"]\n', "under both"),
])
def test_fabric_errors_are_precise(tmp_path: Path, extra: str, message: str) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(SCENARIO + "\n" + extra)
    with pytest.raises(ConfigError, match=message):
        load_scenario(path)


def test_the_bench_fabrics_load() -> None:
    for name in ("fabric-512.toml", "fabric-two-class-480.toml"):
        s = load_scenario(REPO / "bench" / "scenarios" / name)
        topo = s.topology()
        assert topo is not None and s.switch_faults
        assert set(topo.leaf_of) == set(s.node_names())
