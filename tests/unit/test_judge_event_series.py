"""Class events keyed by class, probe and series (issue 37): an event on NCCL's inter-node busbw
(``scope=group``) never holds a node's own intra-node busbw (``scope=node``), nor the reverse; the event says
its series and scope, and keeps both across a restart (an event stored before events had a series loads as
before: on every series of its probe)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from healthd.config import JudgeSettings, ProbeSettings
from healthd.judge.model import FleetEvent, JudgeOutput, MeasurementInput, RecommendationCandidate, RunInput
from healthd.judge.persist import load_judge
from healthd.judge.sources.events import ClassEvents, series_of
from healthd.model import Outcome
from healthd.store import Store
from healthd.store.schema import MIGRATIONS
from tests.unit.test_judge_engine import CLASS, GIB, Fleet, kind_of, wobble

NCCL = {"nccl": ProbeSettings(nodes_per_job=2)}
GROUP_SERIES = f"busbw_bytes_per_second{{collective=all_reduce,scope=group,size_bytes={GIB}}}"
NODE_SERIES = f"busbw_bytes_per_second{{collective=all_reduce,scope=node,size_bytes={GIB}}}"


def nccl(fleet: Fleet, pair: tuple[str, ...], *, group: float = 1.0, own: dict[str, float] | None = None,
         priority: bool = False) -> RunInput:
    """A pair's NCCL run: each node's own (``scope=node``) busbw, scaled by ``own``, and the pair's
    (``scope=group``) busbw, scaled by ``group``."""
    own = own or {}
    ms = [MeasurementInput("busbw_bytes_per_second", 480e9 * own.get(n, 1.0) * wobble(fleet.names.index(n), 1),
                           {"collective": "all_reduce", "size_bytes": GIB, "scope": "node"}, n) for n in pair]
    ms.append(MeasurementInput("busbw_bytes_per_second", 440e9 * group * wobble(fleet.k, 2),
                               {"collective": "all_reduce", "size_bytes": GIB, "scope": "group",
                                "nodes": str(len(pair))}, None))
    return RunInput(fleet.rid(priority), "nccl", pair, Outcome.PASS, "", fleet.t, tuple(ms), kind=kind_of(priority))


def pairs(names: list[str], rnd: int) -> list[tuple[str, str]]:
    """Disjoint pairs covering every node, a different pairing in alternate rounds."""
    order = names[rnd % 2:] + names[:rnd % 2]
    return [(order[i], order[i + 1]) for i in range(0, len(order) - 1, 2)]


def rounds(fleet: Fleet, count: int, *, group: float = 1.0, own: dict[str, float] | None = None,
           bad_pairs_with: str = "", start: int = 0) -> list[RecommendationCandidate]:
    """``count`` rounds of regular pairs, each followed by the re-probes the judge asked for (with the partners
    it chose); ``bad_pairs_with``: a node whose every pair's ``scope=group`` busbw is 40% low (its own NIC)."""
    recs: list[RecommendationCandidate] = []

    def run(pair: tuple[str, ...], priority: bool = False) -> RunInput:
        scale = 0.6 if bad_pairs_with in pair else group
        return nccl(fleet, pair, group=scale, own=own, priority=priority)

    for r in range(start, start + count):
        recs += fleet.feed([run(p) for p in pairs(fleet.names, r)], advance=60).recommendations
        asked = [run((*req.nodes, *req.partners), priority=True) for req in fleet.judge.requests(fleet.t, NCCL)
                 if len(req.nodes) + len(req.partners) == 2]
        recs += fleet.feed(asked, advance=840).recommendations
    return recs


def healthy(store: Store | None = None) -> Fleet:
    fleet = Fleet([f"n{i:02d}" for i in range(16)])
    fleet.store = store
    rounds(fleet, 6)
    return fleet


def live(fleet: Fleet) -> set[tuple[str, str, str]]:
    return {(e.probe, e.key, e.scope) for e in fleet.judge.active_events()}


def test_the_event_series_leaves_out_where_a_value_was_measured() -> None:
    from healthd.judge.model import SeriesKey

    assert series_of(SeriesKey.of("nccl", "busbw_bytes_per_second", {"collective": "all_reduce", "size_bytes": GIB,
                                                                      "scope": "group", "nodes": "3"})) \
        == (GROUP_SERIES, "group")
    assert series_of(SeriesKey.of("gemm", "flop_per_second", {"gpu": "5", "dtype": "bf16"})) \
        == ("flop_per_second{dtype=bf16}", "gpu")
    assert series_of(SeriesKey.of("ddp", "samples_per_second", {})) == ("samples_per_second", "node")


def test_a_group_scope_event_never_holds_a_node_scope_value() -> None:
    """The fabric is 30% slow for the whole class (an event on ``scope=group``) while one node's own NVLink
    is 40% low: the event holds the fabric's values, and the node is still found, its partners not."""
    fleet = healthy()
    recs = rounds(fleet, 3, group=0.7, own={"n05": 0.6}, start=6)
    assert live(fleet) == {("nccl", GROUP_SERIES, "group")}
    assert {r.node for r in recs} == {"n05"}


def test_a_node_under_its_floor_during_a_fabric_event_is_its_own_finding() -> None:
    """A class whose own NVLink sits just over its floor (340 GB/s against 330): one node 5% lower is under
    the floor and nothing else (no outlier, no drift: nothing a class-wide change could not explain). While the
    fabric has an event (``scope=group``), that node is still found: the fabric's event cannot explain its
    NVLink figure. (Held as the fabric's, as when an event was keyed by class and probe, it was never found.)"""
    near = 340 / 480
    own = {f"n{i:02d}": near for i in range(16)}
    fleet = Fleet(list(own))
    rounds(fleet, 6, own=own)
    recs = rounds(fleet, 3, group=0.7, own={**own, "n05": near * 0.95}, start=6)
    assert live(fleet) == {("nccl", GROUP_SERIES, "group")}
    assert {(r.node, str(r.reason_code)) for r in recs} == {("n05", "below_floor")}


def test_a_node_scope_event_never_holds_a_group_scope_value() -> None:
    """The reverse: every node's own NVLink is 30% low (an event on ``scope=node``) while one node's every
    pair is 40% slow on the fabric: the event holds the NVLink values, not the fabric's, and the node is found."""
    fleet = healthy()
    low = {n: 0.7 for n in fleet.names}
    recs = rounds(fleet, 4, own=low, bad_pairs_with="n05", start=6)
    assert live(fleet) == {("nccl", NODE_SERIES, "node")}
    assert {r.node for r in recs} == {"n05"}


def test_an_event_on_both_scopes_is_two_events_and_holds_both() -> None:
    fleet = healthy()
    recs = rounds(fleet, 3, group=0.7, own={n: 0.7 for n in fleet.names}, start=6)
    assert live(fleet) == {("nccl", GROUP_SERIES, "group"), ("nccl", NODE_SERIES, "node")}
    assert recs == []
    rounds(fleet, 1, own={n: 0.7 for n in fleet.names}, start=9)
    assert live(fleet) == {("nccl", NODE_SERIES, "node")}, "the fabric's event ended alone"


def test_events_keep_their_series_across_a_restart(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.sqlite")
    fleet = healthy(store)
    rounds(fleet, 2, group=0.7, start=6)
    assert live(fleet) == {("nccl", GROUP_SERIES, "group")}
    restarted = Fleet(fleet.names)
    restarted.judge = load_judge(store, JudgeSettings(), now=fleet.t)
    restarted.t, restarted.k, restarted.store = fleet.t, fleet.k, store
    assert live(restarted) == {("nccl", GROUP_SERIES, "group")}
    (row,) = store.fleet_events(active_only=True)
    assert (row["series_key"], row["scope"]) == (GROUP_SERIES, "group")
    # after the restart, the event still holds the fabric's values and not a node's own NVLink
    recs = rounds(restarted, 3, group=0.7, own={"n09": 0.6}, start=8)
    assert {r.node for r in recs} == {"n09"}
    assert live(restarted) == {("nccl", GROUP_SERIES, "group")}
    store.close()


def test_an_event_stored_without_a_series_loads_as_before(tmp_path: Path) -> None:
    """A row of schema 17 (no series): after the migration, the event is on every series of its probe."""
    path = tmp_path / "v17.sqlite"
    db = sqlite3.connect(path)
    for migration in MIGRATIONS[:17]:
        db.executescript(migration)
    db.execute("PRAGMA user_version = 17")
    db.execute("INSERT INTO fleet_events (node_class, probe, started_at, flagged, sampled, series, text)"
               " VALUES (?, 'nccl', 1.0, 9, 16, '[]', 'fleet event: nccl on h100x8: 9 of 16')", (CLASS,))
    db.commit()
    db.close()
    store = Store(path)
    (row,) = store.fleet_events(active_only=True)
    assert (row["series_key"], row["scope"]) == ("", "")
    judge = load_judge(store, JudgeSettings(), now=2.0)
    (event,) = judge.active_events()
    assert (event.key, event.probe) == ("", "nccl")
    events = judge.part(ClassEvents)
    assert events.since(CLASS, "nccl") == 1.0
    from healthd.judge.model import SeriesKey

    node_scope = SeriesKey.of("nccl", "busbw_bytes_per_second", {"scope": "node"})
    assert events.since(CLASS, "nccl", node_scope) == 1.0, "on every series of its probe"
    # it ends like any event, and the store closes the row
    store.save_judgement(JudgeOutput(at=3.0, fleet_events=[FleetEvent(CLASS, "nccl", 1.0, 3.0, 0, 0, (), "over")]))
    assert store.fleet_events(active_only=True) == []
    store.close()
