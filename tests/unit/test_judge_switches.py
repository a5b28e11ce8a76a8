"""Switch correlation (healthd.judge.switches): the test against chance, its floor and nesting."""

from __future__ import annotations

import math
import random

import pytest

from healthd.config import SwitchSettings
from healthd.judge.switches import binomial_tail, switch_checks
from healthd.topology import SwitchRecord, Topology, build_topology

S = SwitchSettings()


def fabric(spines: int = 4, leaves: int = 4, per_leaf: int = 16) -> Topology:
    """``spines`` spines of ``leaves`` leaves of ``per_leaf`` nodes each, under one core."""
    records, i = [], 0
    for s in range(spines):
        names = []
        for j in range(leaves):
            leaf = f"leaf{s}{j}"
            names.append(leaf)
            records.append(SwitchRecord(leaf, tuple(f"n{i + k:04d}" for k in range(per_leaf)), level=0))
            i += per_leaf
        records.append(SwitchRecord(f"spine{s}", switches=tuple(names), level=1))
    records.append(SwitchRecord("core", switches=tuple(f"spine{s}" for s in range(spines)), level=2))
    return build_topology(records, "tree")


def samples(topo: Topology, bad: set[str], rate: float = 0.0, seed: int = 1) -> dict[str, tuple[float, bool]]:
    rng = random.Random(seed)
    return {n: (100.0 + k, n in bad or rng.random() < rate) for k, n in enumerate(sorted(topo.leaf_of))}


def classes(topo: Topology) -> dict[str, str]:
    return dict.fromkeys(topo.leaf_of, "h100")


def test_binomial_tail_matches_the_sum() -> None:
    n, p = 16, 0.05
    exact = sum(math.comb(n, i) * p**i * (1 - p) ** (n - i) for i in range(4, n + 1))
    assert binomial_tail(4, n, p) == pytest.approx(exact, rel=1e-9)
    assert binomial_tail(0, n, p) == 1.0
    assert binomial_tail(17, n, p) == 0.0
    assert binomial_tail(3, 2000, 0.02) == pytest.approx(1.0)


def test_a_failing_leaf_is_one_finding_naming_it() -> None:
    topo = fabric()
    bad = set(topo.nodes_under("leaf12"))
    got = switch_checks(topo, "nccl", samples(topo, bad), classes(topo), S, deficits=dict.fromkeys(bad, 0.4))
    assert [(c.switch, c.level, len(c.flagged), c.sampled) for c in got] == [("leaf12", 0, 16, 16)]
    assert got[0].held == ("leaf12",)
    assert "16 of the 16 nodes" in got[0].text() and "median 40% below" in got[0].text()


def test_chance_flags_in_a_noisy_class_make_no_finding() -> None:
    topo = fabric()
    for seed in range(20):
        assert switch_checks(topo, "nccl", samples(topo, set(), rate=0.05, seed=seed), classes(topo), S) == []


def test_the_floor_keeps_a_clean_class_from_naming_a_switch_for_two_bad_nodes() -> None:
    topo = fabric()
    two = set(sorted(topo.nodes_under("leaf00"))[:2])
    assert switch_checks(topo, "gemm", samples(topo, two), classes(topo), S) == []
    small = fabric(per_leaf=4)
    leaf = sorted(small.nodes_under("leaf00"))
    assert switch_checks(small, "gemm", samples(small, set(leaf[:3])), classes(small), S) == []
    got = switch_checks(small, "gemm", samples(small, set(leaf)), classes(small), S)
    assert [c.switch for c in got] == ["leaf00"]


def test_several_leaves_under_one_spine_are_one_spine_finding() -> None:
    topo = fabric()
    bad = set(topo.nodes_under("leaf20")) | set(topo.nodes_under("leaf23"))
    got = switch_checks(topo, "nccl", samples(topo, bad, rate=0.02), classes(topo), S)
    assert [(c.switch, c.level, c.children) for c in got] == [("spine2", 1, ("leaf20", "leaf23"))]
    assert got[0].held == ("leaf20", "leaf23")


def test_a_fault_spread_over_a_spine_names_the_spine_and_holds_all_its_nodes() -> None:
    topo = fabric()
    under = sorted(topo.nodes_under("spine1"))
    bad = set(under[::3])
    got = switch_checks(topo, "nccl", samples(topo, bad), classes(topo), S)
    assert [c.switch for c in got] == ["spine1"]
    assert got[0].spread and got[0].held == ("spine1",)


def test_a_whole_class_under_one_switch_is_left_to_the_fleet_event() -> None:
    topo = fabric(spines=1, leaves=2)
    bad = set(topo.leaf_of)
    got = switch_checks(topo, "nccl", samples(topo, bad), classes(topo), S)
    assert got == [] or all(c.level == 1 for c in got)
    assert [c.switch for c in switch_checks(topo, "nccl", samples(topo, set(topo.nodes_under("leaf00"))),
                                            classes(topo), S)] == ["leaf00"]


def test_the_rate_is_the_class_outside_the_switch() -> None:
    topo = fabric()
    cls = classes(topo)
    noisy = {n: "noisy" for n in topo.nodes_under("spine3")}
    cls.update(noisy)
    bad = set(sorted(topo.nodes_under("leaf30"))[:7])
    rng = random.Random(4)
    smp = samples(topo, bad)
    for n in noisy:
        if n not in bad and rng.random() < 0.3:
            smp[n] = (smp[n][0], True)
    assert "leaf30" not in {c.switch for c in switch_checks(topo, "nccl", smp, cls, S)}
    assert [c.switch for c in switch_checks(topo, "nccl", samples(topo, bad), classes(topo), S)] == ["leaf30"]


def test_an_active_finding_holds_until_its_nodes_pass_again() -> None:
    topo = fabric()
    four = set(sorted(topo.nodes_under("leaf01"))[:4])
    assert switch_checks(topo, "nccl", samples(topo, four), classes(topo), S) == []
    assert [c.switch for c in switch_checks(topo, "nccl", samples(topo, four), classes(topo), S,
                                            active=frozenset({"leaf01"}))] == ["leaf01"]
    assert switch_checks(topo, "nccl", samples(topo, set()), classes(topo), S, active=frozenset({"leaf01"})) == []


def test_a_class_wide_event_does_not_end_a_named_switch() -> None:
    topo = fabric()
    leaf = set(topo.nodes_under("leaf01"))
    smp = samples(topo, set(sorted(leaf)[:12]), rate=0.6, seed=3)
    assert switch_checks(topo, "nccl", smp, classes(topo), S) == []  # not beyond a 60% class rate
    named = switch_checks(topo, "nccl", smp, classes(topo), S, active=frozenset({"leaf01"}))
    assert [c.switch for c in named if c.level == 0] == ["leaf01"]


def test_unprobed_nodes_do_not_count() -> None:
    topo = fabric()
    bad = set(sorted(topo.nodes_under("leaf11"))[:4])
    smp = {n: s for n, s in samples(topo, bad).items() if n in bad or n not in topo.nodes_under("leaf11")}
    got = switch_checks(topo, "nccl", smp, classes(topo), S)
    assert [(c.switch, c.sampled, c.started_at) for c in got] == [("leaf11", 4, min(smp[n][0] for n in bad))]
