"""With a topology, a suspect node's pair re-probe runs with a partner under its own leaf and one under
another leaf (issue 27, item 3): a node fault fails both, a fault of the leaf's uplink only the cross-leaf one."""

from __future__ import annotations

from healthd.config import JudgeSettings, ProbeSettings
from healthd.topology import SwitchRecord, build_topology
from tests.unit.test_judge_engine import Fleet

PROBES = {"nccl": ProbeSettings(nodes_per_job=2)}
NAMES = [f"n{i}" for i in range(8)]


def fleet() -> Fleet:
    f = Fleet(NAMES, JudgeSettings())
    records = [SwitchRecord("leaf0", tuple(NAMES[:4])), SwitchRecord("leaf1", tuple(NAMES[4:])),
               SwitchRecord("spine", switches=("leaf0", "leaf1"))]
    f.judge.set_topology(build_topology(records, "tree"), now=f.t)
    for _ in range(3):
        f.feed([f.nccl(("n0", "n4")), f.nccl(("n1", "n5")), f.nccl(("n2", "n6")), f.nccl(("n3", "n7"))])
    return f


def sides(f: Fleet, node: str) -> list[tuple[str, tuple[str, ...]]]:
    return [(r.reason.split(":")[0], r.partners) for r in f.judge.requests(f.t, PROBES) if r.nodes == (node,)]


def test_the_suspect_is_re_probed_under_its_own_leaf_and_across_and_each_side_runs_once() -> None:
    f = fleet()
    f.feed([f.nccl(("n1", "n5"), group=150e9)])
    asked = sides(f, "n1")
    assert [why for why, _ in asked] == ["localise (same leaf)", "localise (other leaf)"]
    same, other = asked[0][1], asked[1][1]
    assert same and set(same) <= {"n0", "n2", "n3"} and other and set(other) <= {"n4", "n6", "n7"}

    f.feed([f.nccl(("n1", same[0]), priority=True)])
    assert [why for why, _ in sides(f, "n1")] == ["localise (other leaf)"], "the same-leaf side ran: the other is left"
    f.feed([f.nccl(("n1", other[0]), priority=True)])
    assert sides(f, "n1") == [], "both sides ran: answered"


def test_a_node_fault_fails_both_sides_and_is_blamed_an_uplink_fault_only_across_and_is_not() -> None:
    for node_fault in (True, False):
        f = fleet()
        f.feed([f.nccl(("n1", "n5"), group=150e9)])
        for _ in range(3):
            asked = dict(sides(f, "n1"))
            runs = []
            if "localise (same leaf)" in asked:
                runs.append(f.nccl(("n1", asked["localise (same leaf)"][0]), group=150e9 if node_fault else 440e9,
                                   priority=True))
            if "localise (other leaf)" in asked:
                runs.append(f.nccl(("n1", asked["localise (other leaf)"][0]), group=150e9, priority=True))
            for run in runs:
                f.feed([run], advance=60)
        verdict = f.judge.verdicts[("n1", "nccl")]
        if node_fault:
            assert verdict.reason_code == "localised", verdict
        else:
            assert verdict.reason_code != "localised", verdict
