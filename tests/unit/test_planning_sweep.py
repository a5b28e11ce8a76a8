from __future__ import annotations

from healthd.config import SweepSettings
from healthd.model import Node
from healthd.planning import PlanLimits, plan_sweep, sweep_sizes

ON = SweepSettings(enabled=True, interval_s=100.0, max_nodes=8, max_share=1.0)


def idle(name: str, cls: str = "h100x8", **kw: object) -> Node:
    return Node(name=name, state="idle", node_class=cls, **kw)  # type: ignore[arg-type]


def sweep(nodes: list[Node], last: dict[tuple[str, int], float] | None = None, *, settings: SweepSettings = ON,
          busy: set[str] | None = None, sweeping: set[str] | None = None, now: float = 1000.0) -> list[tuple[str, ...]]:
    jobs = plan_sweep(nodes, settings=settings, last_sweeps=last or {}, busy_nodes=busy or set(),
                      sweeping_classes=sweeping or set(), now=now, limits=PlanLimits())
    for job in jobs:
        assert job.run_id.startswith(f"sw{len(job.nodes)}-") and job.probe == "nccl"
        assert job.args == ("--collectives", "all_reduce", "--scope", "group")
    return [j.nodes for j in jobs]


def test_sizes() -> None:
    assert sweep_sizes(2) == [2]
    assert sweep_sizes(16) == [2, 4, 8, 16]
    assert sweep_sizes(12) == [2, 4, 8]


def test_disabled_by_default() -> None:
    assert plan_sweep([idle("a"), idle("b")], settings=SweepSettings(), last_sweeps={}, busy_nodes=(),
                      sweeping_classes=(), now=0.0, limits=PlanLimits()) == []


def test_one_size_at_a_time_smallest_due_first() -> None:
    nodes = [idle(f"n{i}") for i in range(4)]
    assert sweep(nodes) == [("n0", "n1")]
    assert sweep(nodes, {("h100x8", 2): 950.0}) == [("n0", "n1", "n2", "n3")]
    assert sweep(nodes, {("h100x8", 2): 950.0, ("h100x8", 4): 950.0}) == []  # 8 does not fit: nothing held
    assert sweep(nodes, {("h100x8", 2): 850.0, ("h100x8", 4): 950.0}) == [("n0", "n1")]  # 2 is due again


def test_only_one_idle_node_submits_nothing() -> None:
    nodes = [idle("a"), Node("b", "allocated", node_class="h100x8"), idle("c", flags=frozenset({"DRAIN"}))]
    assert sweep(nodes) == []


def test_busy_nodes_share_cap_and_sweep_in_flight() -> None:
    nodes = [idle(f"n{i}") for i in range(8)]
    assert sweep(nodes, busy={"n0", "n1", "n2", "n3", "n4", "n5", "n6"}) == []
    half = SweepSettings(enabled=True, interval_s=100.0, max_nodes=8, max_share=0.5)
    assert sweep(nodes, {("h100x8", 2): 950.0}, settings=half) == [("n0", "n1", "n2", "n3")]
    assert sweep(nodes, {("h100x8", 2): 950.0, ("h100x8", 4): 950.0}, settings=half) == []  # 8 > half of 8
    assert sweep(nodes, sweeping={"h100x8"}) == []


def test_classes_sweep_separately() -> None:
    nodes = [idle("a1", "a100x8"), idle("a2", "a100x8"), idle("h1"), idle("h2"), idle("h3")]
    assert sweep(nodes) == [("a1", "a2"), ("h1", "h2")]
