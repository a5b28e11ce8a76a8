from __future__ import annotations

import itertools

from healthd.config import ProbeSettings
from healthd.model import Node
from healthd.planning import PlanLimits, jitter, plan, why_not_probeable

PROBES = {"gemm": ProbeSettings(interval_s=100.0), "nccl": ProbeSettings(interval_s=100.0)}


def ids() -> itertools.count[int]:
    return itertools.count()


def run(nodes: list[Node], last: dict[tuple[str, str], float] | None = None, *, probes: dict[str, ProbeSettings]
        | None = None, busy: set[str] | None = None, in_flight: int = 0, now: float = 1000.0,
        limits: PlanLimits | None = None, partners: dict[tuple[str, str], frozenset[str]] | None = None,
        rotate: bool = False) -> list[tuple[str, tuple[str, ...]]]:
    counter = ids()
    jobs = plan(nodes, probes=probes or PROBES, last_attempts=last or {}, busy_nodes=busy or set(),
                in_flight=in_flight, now=now, limits=limits or PlanLimits(), make_run_id=lambda: f"r{next(counter)}",
                last_partners=partners or {}, rotate=rotate)
    return [(j.probe, j.nodes) for j in jobs]


def idle(name: str, **kw: object) -> Node:
    return Node(name=name, state="idle", partitions=("batch",), **kw)  # type: ignore[arg-type]


def test_only_idle_nodes_without_blocking_flags() -> None:
    nodes = [
        idle("a"),
        Node("b", "allocated", partitions=("batch",)),
        Node("c", "mixed", partitions=("batch",)),
        idle("d", flags=frozenset({"DRAIN"})),
        idle("e", flags=frozenset({"NOT_RESPONDING"})),
        idle("f", flags=frozenset({"RESERVED"})),
        idle("g", flags=frozenset({"MAINTENANCE"})),
        idle("h", flags=frozenset({"POWERED_DOWN"})),
        Node("i", "down", partitions=("batch",)),
        idle("j", flags=frozenset({"COMPLETING"})),
    ]
    assert run(nodes, probes={"gemm": PROBES["gemm"]}) == [("gemm", ("a",))]


def test_own_reservation_is_probeable_and_reasons_are_given() -> None:
    node = idle("f", flags=frozenset({"RESERVED"}))
    assert why_not_probeable(node, PlanLimits()) == "flags RESERVED"
    assert why_not_probeable(node, PlanLimits(own_reservation="healthd")) is None
    assert why_not_probeable(idle("x"), PlanLimits(exclude=frozenset({"x"}))) == "excluded by config"
    assert why_not_probeable(idle("x"), PlanLimits(partitions=frozenset({"gpu"}))) == "not in a probed partition"
    assert why_not_probeable(Node("x", "allocated"), PlanLimits()) == "state allocated"


def test_never_probed_first_then_oldest_and_one_job_per_node() -> None:
    nodes = [idle("a"), idle("b"), idle("c")]
    last = {("a", "gemm"): 800.0, ("a", "nccl"): 850.0, ("b", "gemm"): 700.0, ("b", "nccl"): 950.0,
            ("c", "gemm"): 990.0, ("c", "nccl"): 990.0}
    # c is not due (990 + 100 > 1000); b's gemm is the oldest, then a's gemm; one job per node.
    assert run(nodes, last) == [("gemm", ("b",)), ("gemm", ("a",))]
    assert run(nodes, {}) == [("gemm", ("a",)), ("gemm", ("b",)), ("gemm", ("c",))]


def test_disabled_probes_and_busy_nodes_are_left_out() -> None:
    probes = {"gemm": ProbeSettings(enabled=False), "nccl": ProbeSettings()}
    assert run([idle("a"), idle("b")], probes=probes, busy={"a"}) == [("nccl", ("b",))]


def test_caps_on_jobs_in_flight_and_idle_share() -> None:
    nodes = [idle(f"n{i}") for i in range(8)]
    assert len(run(nodes, limits=PlanLimits(max_jobs_in_flight=3))) == 3
    assert run(nodes, in_flight=3, limits=PlanLimits(max_jobs_in_flight=3)) == []
    assert len(run(nodes, limits=PlanLimits(max_idle_share=0.25))) == 2
    # a quarter of 8 nodes is 2; one held by a healthd job leaves room for one more
    assert len(run(nodes[1:], busy={"n0"}, limits=PlanLimits(max_idle_share=0.25))) == 1
    # a tiny cluster still gets probed
    assert len(run(nodes[:2], limits=PlanLimits(max_idle_share=0.25))) == 1


def test_a_probe_pending_on_a_node_a_user_took_does_not_count_in_the_idle_share() -> None:
    """Issue 26: 4 nodes, 3 idle (a, b, c) and d running a user's job; the first plan probes a. A user
    takes a before the probe starts: a is no longer idle, so it is not part of the idle share and b
    is probed at the next plan, not once a's pending probe is cancelled (60 s later)."""
    limits = PlanLimits(max_idle_share=0.25)
    probes = {"gemm": PROBES["gemm"]}
    user = Node("d", "allocated", partitions=("batch",))
    assert run([idle("a"), idle("b"), idle("c"), user], probes=probes, limits=limits) == [("gemm", ("a",))]
    taken = Node("a", "allocated", partitions=("batch",))
    counter = ids()

    def plan_with(a: Node, *, pending: set[str]) -> list[tuple[str, tuple[str, ...]]]:
        jobs = plan([a, idle("b"), idle("c"), user], probes=probes, last_attempts={}, busy_nodes={"a"},
                    in_flight=0, now=1000.0, limits=limits, make_run_id=lambda: f"r{next(counter)}",
                    pending_nodes=pending)
        return [(j.probe, j.nodes) for j in jobs]

    assert plan_with(taken, pending={"a"}) == [("gemm", ("b",))]
    # our probe running on a (not pending), or pending on a node still idle, holds its share
    assert plan_with(taken, pending=set()) == []
    assert plan_with(idle("a"), pending={"a"}) == []


def test_jitter_is_deterministic_and_within_span() -> None:
    values = {jitter(f"n{i}", "gemm", 60.0) for i in range(50)}
    assert all(0 <= v < 60 for v in values) and len(values) == 50
    assert jitter("n1", "gemm", 60.0) == jitter("n1", "gemm", 60.0)
    assert jitter("n1", "gemm", 0.0) == 0.0
    node, probe = "n7", "gemm"
    j = jitter(node, probe, 60.0)
    probes = {"gemm": ProbeSettings(interval_s=100.0, jitter_s=60.0)}
    assert run([idle(node)], {(node, probe): 0.0}, probes=probes, now=100.0 + j - 0.01) == []
    assert run([idle(node)], {(node, probe): 0.0}, probes=probes, now=100.0 + j) == [("gemm", (node,))]


def test_multi_node_jobs_group_nodes_of_one_class() -> None:
    probes = {"nccl": ProbeSettings(nodes_per_job=2)}
    nodes = [idle("a", node_class="h100"), idle("b", node_class="a100"), idle("c", node_class="h100"),
             idle("d", node_class="a100"), idle("e", node_class="h100")]
    assert run(nodes, probes=probes) == [("nccl", ("a", "c")), ("nccl", ("b", "d"))]
    assert run(nodes[:1], probes=probes) == []


def _rounds(names: list[str], probes: dict[str, ProbeSettings], count: int,
            rotate: bool = True) -> list[list[tuple[str, ...]]]:
    """``count`` rounds of regular planning, each job's nodes attempted at the round's time."""
    nodes = [idle(n) for n in names]
    last: dict[tuple[str, str], float] = {}
    partners: dict[tuple[str, str], frozenset[str]] = {}
    out = []
    for i in range(count):
        now = 1000.0 + 200.0 * i
        jobs = run(nodes, last, probes=probes, now=now, partners=partners, rotate=rotate)
        for probe, group in jobs:
            for n in group:
                last[(n, probe)] = now
                partners[(n, probe)] = frozenset(group) - {n}
        out.append([group for _, group in jobs])
    return out


def test_pair_partners_rotate_from_round_to_round() -> None:
    """Nodes of one job fall due together; by name (or by a fixed jitter) they would be paired again every
    round: node1 with node10 under lexical order, forever (``rotate_partners`` off, the default). With
    rotation, without jitter and with it, no pair repeats from one round to the next."""
    names = [f"node{i}" for i in range(1, 17)]
    for jitter_s in (0.0, 60.0):
        rounds = _rounds(names, {"nccl": ProbeSettings(interval_s=100.0, jitter_s=jitter_s, nodes_per_job=2)}, 8)
        seen: dict[str, set[str]] = {n: set() for n in names}
        for before, after in itertools.pairwise(rounds):
            assert all(len(g) == 2 for g in after) and len(after) == 8, after
            assert not {frozenset(g) for g in before} & {frozenset(g) for g in after}, (before, after)
        for groups in rounds:
            for a, b in groups:
                seen[a].add(b)
                seen[b].add(a)
        assert min(len(p) for p in seen.values()) >= 4, (jitter_s, seen)
    fixed = _rounds(names, {"nccl": ProbeSettings(interval_s=100.0, nodes_per_job=2)}, 3, rotate=False)
    assert fixed[0] == fixed[1] == fixed[2] and ("node1", "node10") in fixed[0]  # the default: partners kept


def test_a_last_partner_is_taken_again_when_no_other_is_free() -> None:
    probes = {"nccl": ProbeSettings(nodes_per_job=2)}
    partners = {("a", "nccl"): frozenset({"b"}), ("b", "nccl"): frozenset({"a"})}
    assert run([idle("a"), idle("b")], probes=probes, partners=partners, rotate=True) == [("nccl", ("a", "b"))]
    partners |= {("c", "nccl"): frozenset({"d"}), ("d", "nccl"): frozenset({"c"})}
    assert run([idle(n) for n in "abcd"], probes=probes, partners=partners, rotate=True) == [
        ("nccl", ("a", "c")), ("nccl", ("b", "d"))]
    assert run([idle(n) for n in "abcd"], probes=probes, partners=partners) == [  # not rotating: by name
        ("nccl", ("a", "b")), ("nccl", ("c", "d"))]
    # the budget still holds: one pair, not one per conflict-free grouping
    assert run([idle(n) for n in "abcd"], probes=probes, partners=partners, rotate=True,
               limits=PlanLimits(max_jobs_in_flight=1)) == [("nccl", ("a", "c"))]


def test_a_node_is_in_one_job_of_a_plan_with_two_multi_node_probes() -> None:
    """A node waiting in one probe's group is not placed in another probe's job as well: ``a`` waits for a
    nccl partner, goes into the pipeline job with ``b``, and ``c`` then has no nccl partner (the planner
    before partner rotation gave it ``a``: two jobs on ``a`` in one plan)."""
    probes = {"nccl": ProbeSettings(interval_s=100.0, nodes_per_job=2),
              "pipeline": ProbeSettings(interval_s=100.0, nodes_per_job=2)}
    last = {("a", "nccl"): 0.0, ("b", "pipeline"): 1.0, ("a", "pipeline"): 2.0, ("c", "nccl"): 3.0,
            ("b", "nccl"): 500.0, ("c", "pipeline"): 500.0, ("d", "nccl"): 990.0, ("d", "pipeline"): 990.0}
    jobs = run([idle(n) for n in "abcd"], last, probes=probes)  # d, not due, leaves room for a second job
    members = [n for _, group in jobs for n in group]
    assert len(members) == len(set(members)) and jobs == [("pipeline", ("b", "a"))], jobs
