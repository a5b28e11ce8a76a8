"""A switch explains only what it can touch (issue 37): a node whose own intra-node busbw (``scope=node``)
is low, under a leaf whose uplink fails, is found within 2 rounds while the uplink's finding lasts, the
uplink still named and none of its other nodes drained; a rack's GEMM drop (node-level figures) stays the
rack's (``test_simulate_switches``, ``bench/scenarios/fabric-512.toml``)."""

from __future__ import annotations

from pathlib import Path

from healthd.simulate import load_scenario, simulate
from tests.unit.test_simulate_switches import SCENARIO

UPLINK_AND_NODE = SCENARIO.split("[[switch_faults]]")[0] + """
[[switch_faults]]          # leaf7 = n112..n127: only pairs leaving the leaf
kind = "uplink"
switch = "leaf7"
from_round = 2

[[faults]]                 # under leaf7: its own NVLink figure, which no switch touches
kind = "node"
node = "n120"
probe = "nccl"
name = "busbw_bytes_per_second"
factor = 0.7
from_round = 3
"""


def test_a_node_fault_under_a_failing_uplink_is_found_while_the_uplink_finding_lasts(tmp_path: Path) -> None:
    path = tmp_path / "uplink-node.toml"
    path.write_text(UPLINK_AND_NODE)
    report = simulate(load_scenario(path), echo=False)
    assert [(s.fault.switch, s.named_as, s.node_drains) for s in report.switch_faults] == [("leaf7", "leaf7", 0)]
    (node,) = report.faults
    assert node.fault.node == "n120" and node.rounds_to_find is not None and node.rounds_to_find <= 2, node
    assert report.false_drains == [] and report.false_switch_findings == []
