"""The judge's seams (``healthd.judge.sources``): a source and a cause defined here, in the test, registered
through the public registry, with no edit to ``healthd/judge/engine.py``, produce confirmed findings,
verdicts, ``healthd_node_finding`` series, recommendations and held drains, and survive a restart.

``EccGrowth`` (a test-only source): a node's corrected-ECC counter, reported by the GEMM probe as a plain
measurement no ``[[judge.series]]`` judges, growing by ``GROWTH`` or more since the source first saw it is a
``fail`` finding. ``Pdu`` (a test-only cause): every node fed by one power distribution unit flagged at once
is the PDU's event, and holds their findings (no node drained)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path

import pytest

from healthd.judge.metrics import finding_samples
from healthd.judge.model import (
    Finding,
    FleetEvent,
    JudgeOutput,
    JudgeState,
    MeasurementInput,
    ReasonCode,
    RunInput,
    SeriesKey,
    Severity,
)
from healthd.judge.persist import load_judge
from healthd.judge.sources import register_cause, register_source, unregister
from healthd.judge.sources.seam import (
    RANK_LEAF,
    BaseCause,
    BaseSource,
    Context,
    FleetCache,
    RunFindings,
    Selected,
    Update,
)
from healthd.model import Outcome
from healthd.store import Store
from tests.unit.test_judge_engine import Fleet

COUNTER = "ecc_sbe_total"
GROWTH = 10.0
CHECK = "check:ecc_sbe_growth"
PDUS = {"pduA": ("n00", "n01", "n02")}


class EccGrowth(BaseSource):
    """Test-only source: the first counter value seen per node, and a finding when it grew by ``GROWTH``."""

    name = "test_ecc"

    def __init__(self) -> None:
        self.first: dict[str, float] = {}

    def judge_run(self, ctx: Context, run: RunInput, selected: Sequence[Selected], cache: FleetCache,
                  now: float, ev: RunFindings) -> None:
        for m in run.measurements:
            if m.name != COUNTER or m.node is None:
                continue
            first = self.first.setdefault(m.node, m.value)
            if m.value - first >= GROWTH:
                key = SeriesKey.of(run.probe, CHECK, {})
                ev.node_findings.setdefault(m.node, []).append(Finding(
                    ReasonCode.CHECK_FAILED, Severity.FAIL, key, m.value, first, first + GROWTH,
                    f"{COUNTER} grew from {first:g} to {m.value:g}", event_proof=True, switch_proof=True))

    def restore(self, ctx: Context, state: JudgeState) -> None:
        for mark in state.marks:
            for f in mark.findings:
                if f.key.name == CHECK:
                    self.first.setdefault(mark.node, f.reference)


class Pdu(BaseCause):
    """Test-only cause: all nodes of a PDU flagged at once on a probe."""

    name = "test_pdu"
    rank = RANK_LEAF
    label = "PDU events"

    def __init__(self) -> None:
        self.active: dict[tuple[str, str], FleetEvent] = {}

    def update(self, ctx: Context, touched: set[tuple[str, str]], now: float, out: JudgeOutput) -> Update:
        changes = Update()
        cutoff = now - ctx.settings.fleet.event_window_s
        for probe in sorted({p for _, p in touched} - ctx.by_node_probes):
            for pdu, nodes in PDUS.items():
                samples = [ctx.samples.get((ctx.node_class(n), probe), {}).get(n) for n in nodes]
                seen = [s for s in samples if s is not None and s[0] >= cutoff]
                bad = len(seen) == len(nodes) and all(flagged for _, flagged in seen)
                live = self.active.get((pdu, probe))
                cls = ctx.node_class(nodes[0])
                if bad and live is None:
                    event = FleetEvent(cls, probe, min(at for at, _ in seen), None, len(nodes), len(nodes), (),
                                       f"pdu {pdu}: {probe} flagged on all its {len(nodes)} nodes", nodes=nodes,
                                       cause=self.name)
                    self.active[(pdu, probe)] = event
                elif not bad and live is not None:
                    event = FleetEvent(cls, probe, live.started_at, now, 0, len(nodes), (), f"{live.text}; over",
                                       nodes=nodes, cause=self.name)
                    del self.active[(pdu, probe)]
                else:
                    continue
                out.fleet_events.append(event)
                changes.touched |= {(n, probe) for n in nodes}
                changes.rejudge.add((cls, probe))
        return changes

    def holding(self, node: str, probe: str, cls: str) -> FleetEvent | None:
        return next((e for (_, p), e in self.active.items() if p == probe and node in e.nodes), None)

    def explains(self, node: str, probe: str) -> bool:
        return self.holding(node, probe, "") is not None

    def resists(self, f: Finding, event: FleetEvent | None = None) -> bool:
        return f.event_proof

    def leaves_out(self, probe: str) -> Callable[[str], bool] | None:
        held = {n for (_, p), e in self.active.items() if p == probe for n in e.nodes}
        return (lambda node: node in held) if held else None

    def fleet_events(self) -> Iterable[FleetEvent]:
        return self.active.values()

    def restore(self, ctx: Context, state: JudgeState) -> None:
        for e in state.events:
            pdu = next((name for name, nodes in PDUS.items() if nodes == e.nodes), None)
            if e.cause == self.name and e.active and pdu is not None:
                self.active[(pdu, e.probe)] = e


@pytest.fixture
def registered() -> Iterator[None]:
    register_source(EccGrowth)
    register_cause(Pdu)
    yield
    unregister(EccGrowth)
    unregister(Pdu)


def stored_fleet(tmp_path: Path) -> Fleet:
    fleet = Fleet([f"n{i:02d}" for i in range(20)])
    fleet.store = Store(tmp_path / "h.db")
    fleet.store.upsert_nodes(fleet.nodes, seen_at=fleet.t)
    return fleet


def with_counter(fleet: Fleet, node: str, value: float, *, scale: float = 1.0) -> RunInput:
    run = fleet.gemm(node, scale=scale)
    return RunInput(run.run_id, run.probe, run.nodes, run.outcome, run.reason, run.at,
                    (*run.measurements, MeasurementInput(COUNTER, value, {}, node)), kind=run.kind)


def restart(fleet: Fleet) -> None:
    assert fleet.store is not None
    fleet.judge = load_judge(fleet.store, fleet.judge.settings, now=fleet.t)


def test_a_registered_source_confirms_its_finding_across_a_restart_with_no_engine_edit(
        registered: None, tmp_path: Path) -> None:
    fleet = stored_fleet(tmp_path)
    assert any(isinstance(s, EccGrowth) for s in fleet.judge.sources)
    for _ in range(3):
        fleet.feed([with_counter(fleet, n, 5.0) for n in fleet.names])
    out = fleet.feed([with_counter(fleet, n, 50.0 if n == "n07" else 5.0) for n in fleet.names])
    assert out.recommendations == []
    assert fleet.judge.verdicts[("n07", "gemm")].outcome is Outcome.DEGRADED  # seen once: re-probe first
    assert [r.nodes for r in out.requests] == [("n07",)]
    restart(fleet)
    assert fleet.judge.part(EccGrowth).first == {"n07": 5.0}, "the source restored what it follows"
    out = fleet.feed([with_counter(fleet, "n07", 60.0)])
    (rec,) = out.recommendations
    assert (rec.node, rec.outcome, rec.reason_code) == ("n07", Outcome.FAIL, ReasonCode.CHECK_FAILED.value)
    assert "ecc_sbe_total grew from 5 to 60" in rec.text
    verdict = fleet.judge.verdicts[("n07", "gemm")]
    assert verdict.evidence["stage"] == "confirmed"
    samples = [(family, dict(labels)) for family, labels, _ in finding_samples(fleet.judge.verdicts.values())]
    assert [(f, labels["node"], labels["reason_code"]) for f, labels in samples
            if f == "healthd_node_finding"] == [("healthd_node_finding", "n07", "check_failed")]


def test_without_the_source_the_counter_is_nothing() -> None:
    fleet = Fleet([f"n{i:02d}" for i in range(20)])
    for value in (5.0, 5.0, 50.0, 60.0):
        out = fleet.feed([with_counter(fleet, n, value if n == "n07" else 5.0) for n in fleet.names])
        assert out.recommendations == []


def pdu_rounds(fleet: Fleet, rounds: int, *, down: bool) -> list[JudgeOutput]:
    return [fleet.feed([fleet.gemm(n, scale=0.6 if down and n in PDUS["pduA"] else 1.0) for n in fleet.names])
            for _ in range(rounds)]


def test_without_the_cause_the_nodes_of_a_failing_pdu_are_recommended() -> None:
    fleet = Fleet([f"n{i:02d}" for i in range(20)])
    pdu_rounds(fleet, 3, down=False)
    outs = pdu_rounds(fleet, 5, down=True)
    assert {r.node for out in outs for r in out.recommendations} == set(PDUS["pduA"])


def test_a_registered_cause_holds_its_nodes_from_the_first_round_and_across_a_restart(
        registered: None, tmp_path: Path) -> None:
    fleet = stored_fleet(tmp_path)
    assert any(isinstance(c, Pdu) for c in fleet.judge.causes)
    pdu_rounds(fleet, 3, down=False)
    (first,) = pdu_rounds(fleet, 1, down=True)
    assert [(e.cause, e.nodes, e.active) for e in first.fleet_events] == [("test_pdu", PDUS["pduA"], True)]
    assert first.recommendations == [] and first.requests == []
    assert {fleet.judge.verdicts[(n, "gemm")].reason_code for n in PDUS["pduA"]} == {"fleet_event"}
    restart(fleet)
    assert [e.cause for e in fleet.judge.active_events()] == ["test_pdu"]
    assert fleet.store is not None
    assert [e["cause"] for e in fleet.store.fleet_events(active_only=True)] == ["test_pdu"]
    outs = pdu_rounds(fleet, 4, down=True)
    assert [r for out in outs for r in out.recommendations] == []
    assert all(out.fleet_events == [] for out in outs), "the restored event goes on, no new one"
    (back,) = pdu_rounds(fleet, 1, down=False)
    assert [(e.cause, e.active) for e in back.fleet_events] == [("test_pdu", False)]
    assert fleet.store.fleet_events(active_only=True) == []
    outs = pdu_rounds(fleet, 2, down=False)
    assert [r for out in outs for r in out.recommendations] == []
    assert {fleet.judge.verdicts[(n, "gemm")].outcome for n in fleet.names} == {Outcome.PASS}
