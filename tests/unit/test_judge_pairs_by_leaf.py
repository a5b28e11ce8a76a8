"""With a topology, a suspect node's pair re-probe runs with a partner under its own leaf and one under
another leaf (issue 27, item 3): a node fault fails both, a fault of the leaf's uplink only the cross-leaf one."""

from __future__ import annotations

from healthd.config import JudgeSettings, ProbeSettings
from healthd.judge.model import RunInput
from healthd.judge.sources.switch import Switches
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


BIG = [f"n{i}" for i in range(32)]


def leaves_of_four() -> Fleet:
    """32 nodes under 8 leaves of 4 (a leaf is an eighth of the class: below a fleet event's share)."""
    f = Fleet(BIG, JudgeSettings())
    records = [SwitchRecord(f"leaf{j}", tuple(BIG[4 * j:4 * j + 4])) for j in range(8)]
    records.append(SwitchRecord("spine", switches=tuple(f"leaf{j}" for j in range(8))))
    f.judge.set_topology(build_topology(records, "tree"), now=f.t)
    for _ in range(3):
        f.feed(regular_round(f, set()))
    return f


def regular_round(f: Fleet, slow: set[str]) -> list[RunInput]:
    """Pairs under one leaf each, (n0, n1), (n2, n3)...: a pair with a slow node is slow."""
    return [f.nccl((BIG[i], BIG[i + 1]), group=150e9 if {BIG[i], BIG[i + 1]} & slow else 440e9)
            for i in range(0, len(BIG), 2)]


def localise_n1(f: Fleet, slow: set[str], recommended: set[str]) -> None:
    """n1's bad result with n5 (a node under another leaf), then its re-probes under its leaf and across."""
    out = f.feed([f.nccl(("n1", "n5"), group=150e9)], advance=60)
    recommended |= {r.node for r in out.recommendations}
    for _ in range(4):
        asked = [r for r in f.judge.requests(f.t, PROBES) if r.probe == "nccl"]
        if not asked:
            break
        runs = []
        for r in asked:
            members = (*r.nodes, *r.partners[:1])
            runs.append(f.nccl(members, group=150e9 if set(members) & slow else 440e9, priority=True))
        out = f.feed(runs, advance=60)
        recommended |= {r.node for r in out.recommendations}


def test_a_localised_node_waits_for_its_leafmates_and_a_failing_leaf_takes_it_over() -> None:
    """The leaf barrier (``rounds.leaf_hold``): n1 is localised by its re-probes before its leafmates' regular
    results are in; it is held, not recommended, and once they come in bad the leaf is named and n1 is its."""
    f = leaves_of_four()
    slow = {"n0", "n1", "n2", "n3"}
    recommended: set[str] = set()
    localise_n1(f, slow, recommended)
    v = f.judge.verdicts[("n1", "nccl")]
    assert v.reason_code == "localised" and v.evidence.get("stage") == "held", v
    assert "until the switch rule has seen leaf0" in v.reason, v.reason
    assert recommended == set()
    for _ in range(2):
        out = f.feed(regular_round(f, slow))
        recommended |= {r.node for r in out.recommendations}
    assert list(f.judge.part(Switches).findings.active) == [("leaf0", "nccl")]
    assert recommended == set(), recommended
    assert f.judge.verdicts[("n1", "nccl")].evidence.get("stage") != "held"


def test_a_node_fault_under_a_healthy_leaf_is_released_once_its_leafmates_are_seen() -> None:
    f = leaves_of_four()
    slow = {"n1"}
    recommended: set[str] = set()
    localise_n1(f, slow, recommended)
    assert f.judge.verdicts[("n1", "nccl")].evidence.get("stage") == "held"
    assert recommended == set()
    for _ in range(2):
        out = f.feed(regular_round(f, slow), advance=60)
        recommended |= {r.node for r in out.recommendations}
    assert recommended == {"n1"}, recommended
    assert f.judge.verdicts[("n1", "nccl")].reason_code == "localised"
