"""Remediation's decisions as a pure function: a snapshot, the judge's output and the cluster's nodes in,
a plan of backend calls and store writes out; no store, no cluster. And the one read and one write
that ``Remediator.apply`` makes of the store."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from healthd.config import RemediationSettings
from healthd.judge.model import JudgeOutput, ReasonCode, RecommendationCandidate
from healthd.model import Node, Outcome, Verdict
from healthd.remediation import Remediator
from healthd.remediation.decide import BackendCall, CallResult, Plan, decide, needs_nodes
from healthd.store import Store
from healthd.store.rows import (
    AuditRow,
    BreakerState,
    CloseDrain,
    CloseRecommendations,
    DrainRow,
    JudgedMark,
    NoteRecommendation,
    OpenDrain,
    RecommendationRow,
    RemediationSnapshot,
    SetBreaker,
    UpsertRecommendation,
)

NOW = 1_000_000.0
CLASS = "h100x8"
CLOSED = BreakerState(False)


def settings(**kw: Any) -> RemediationSettings:
    return RemediationSettings(**{"mode": "enforce", **kw})


def nodes(count: int = 20, **reasons: str) -> dict[str, Node]:
    out = {}
    for i in range(1, count + 1):
        name = f"n{i:02d}"
        reason = reasons.get(name)
        out[name] = Node(name, "idle", frozenset({"DRAIN"}) if reason else frozenset(), reason=reason,
                         node_class=CLASS)
    return out


def rec(node: str, probe: str = "gemm", outcome: str = "fail", *, rec_id: int = 1, since: float = NOW - 60,
        last_refusal: str = "", escalated: bool = False) -> RecommendationRow:
    return RecommendationRow(rec_id, node, probe, outcome, "below_floor", "slow", {"run_ids": ["r1"]}, since,
                             NOW - 60, "active", None, "", escalated, last_refusal)


def drain(node: str, at: float, *, automatic: bool = True, undrained_at: float | None = None,
          probes: tuple[str, ...] = ("gemm",)) -> DrainRow:
    return DrainRow(node, CLASS, f"healthd: below_floor gemm {node}", "healthd", automatic, at, undrained_at,
                    "healthd" if undrained_at else None, probes)


def snapshot(recs: tuple[RecommendationRow, ...] = (), *, open_drains: tuple[DrainRow, ...] = (),
             recent: tuple[DrainRow, ...] = (), breaker: BreakerState = CLOSED,
             marks: dict[tuple[str, float], tuple[JudgedMark, ...]] | None = None,
             last_audit: dict[str, AuditRow] | None = None) -> RemediationSnapshot:
    return RemediationSnapshot(recs, open_drains, recent + open_drains, breaker, marks or {}, last_audit or {})


def candidate(node: str, probe: str = "gemm", outcome: Outcome = Outcome.FAIL) -> RecommendationCandidate:
    return RecommendationCandidate(node, probe, outcome, ReasonCode.BELOW_FLOOR, f"{node} is slow", {}, NOW)


def run(snap: RemediationSnapshot, s: RemediationSettings, *, output: JudgeOutput | None = None,
        cluster: dict[str, Node] | None = None, results: dict[BackendCall, CallResult] | None = None) -> Plan:
    return decide(snap, output or JudgeOutput(at=NOW), s, now=NOW, nodes=nodes() if cluster is None else cluster,
                  results=results)


def summary(plan: Plan) -> list[tuple[str, str, str]]:
    return [(a.action, a.node or "", a.result) for a in plan.actions]


def reasons(plan: Plan) -> dict[str, str]:
    return {a.node or "": a.reason for a in plan.actions}


@pytest.mark.parametrize(("reason", "expected", "note"), [
    ("PSU swap (admin)", [("drain", "n02", "refused")],
     "drained or marked by someone else (reason: 'PSU swap (admin)'); not touching it"),
    ("healthd: below_floor gemm x", [], None),  # healthd's own drain: nothing to do
])
def test_ownership(reason: str, expected: list[tuple[str, str, str]], note: str | None) -> None:
    plan = run(snapshot((rec("n02"),)), settings(), cluster=nodes(n02=reason))
    assert plan.calls == ()
    assert summary(plan) == expected
    notes = [w for w in plan.writes if isinstance(w, NoteRecommendation)]
    assert [n.refusal for n in notes] == ([note] if note else [])


def test_a_refusal_already_noted_is_not_said_again() -> None:
    why = "drained or marked by someone else (reason: 'RMA'); not touching it"
    plan = run(snapshot((rec("n02", last_refusal=why),)), settings(), cluster=nodes(n02="RMA"))
    assert plan == Plan()


def test_a_drain_makes_the_backend_call_and_records_it() -> None:
    plan = run(snapshot((rec("n01"),)), settings())
    (call,) = plan.calls
    assert (call.verb, call.node, call.reason) == ("drain", "n01", "healthd: below_floor gemm run r1")
    assert plan.writes[:2] == (OpenDrain("n01", CLASS, call.reason, "healthd", True, ("gemm",)),
                               NoteRecommendation("n01", "gemm", "", escalated=False))
    assert summary(plan) == [("drain", "n01", "done")]


def test_one_drain_per_node_preferring_fail() -> None:
    recs = (rec("n01", "gemm", "degraded", rec_id=1, since=NOW - 90), rec("n01", "nccl", "fail", rec_id=2))
    plan = run(snapshot(recs), settings())
    (call,) = plan.calls
    assert call.reason.startswith("healthd: below_floor nccl")
    (opened,) = [w for w in plan.writes if isinstance(w, OpenDrain)]
    assert opened.probes == ("gemm", "nccl")


@pytest.mark.parametrize(("class_size", "in_class", "opens"), [
    (20, 2, False),  # 10% of 20 is 2, but at least breaker_class_min_nodes = 3
    (20, 3, True),
    (50, 4, False),  # 10% of 50: 5
    (50, 5, True),
])
def test_breaker_opens_at_the_class_share(class_size: int, in_class: int, opens: bool) -> None:
    recent = tuple(drain(f"n{i + 30:02d}", NOW - 600 - i, undrained_at=NOW - 300) for i in range(in_class))
    plan = run(snapshot((rec("n01"),), recent=recent), settings(), cluster=nodes(class_size))
    if not opens:
        assert summary(plan) == [("drain", "n01", "done")]
        return
    why = (f"draining n01 would make {in_class + 1} automatic drains in class {CLASS} (allowed {in_class} of "
           f"{class_size}) or {in_class + 1} overall (allowed 50) within 21600 s")
    assert plan.calls == ()
    assert summary(plan) == [("breaker_open", "n01", "done"), ("drain", "n01", "refused")]
    assert SetBreaker(BreakerState(True, NOW, why)) in plan.writes
    assert plan.actions[0].reason == why
    assert plan.actions[1].reason == "circuit breaker open: no automatic drains"


def test_the_breaker_counts_this_ticks_drains_and_stays_open_for_the_rest() -> None:
    recs = tuple(rec(f"n0{i}", rec_id=i, since=NOW - 100 + i) for i in range(1, 6))
    plan = run(snapshot(recs), settings())
    assert summary(plan) == [("drain", "n01", "done"), ("drain", "n02", "done"), ("drain", "n03", "done"),
                             ("breaker_open", "n04", "done"), ("drain", "n04", "refused"),
                             ("drain", "n05", "refused")]


def test_an_open_breaker_closes_after_its_cool_down() -> None:
    breaker = BreakerState(True, NOW - 3600, "too many")
    plan = run(snapshot((rec("n01"),), breaker=breaker), settings(breaker_cooldown_s=3600.0))
    assert summary(plan) == [("breaker_close", "", "done"), ("drain", "n01", "done")]
    assert plan.writes[0] == SetBreaker(BreakerState(False, NOW - 3600, "too many", NOW))
    still = run(snapshot((rec("n01"),), breaker=breaker), settings(breaker_cooldown_s=3601.0))
    assert summary(still) == [("drain", "n01", "refused")]


@pytest.mark.parametrize(("ages", "done"), [
    ((100.0, 200.0), False),  # two drains in the last hour: the cap of 2 is reached
    ((100.0, 3700.0), True),  # one of them is older than an hour
])
def test_hourly_cap(ages: tuple[float, ...], done: bool) -> None:
    recent = tuple(drain(f"n1{i}", NOW - age, undrained_at=NOW - 50) for i, age in enumerate(ages))
    plan = run(snapshot((rec("n01"),), recent=recent), settings(max_actions_per_hour=2))
    if done:
        assert summary(plan) == [("drain", "n01", "done")]
    else:
        assert summary(plan) == [("drain", "n01", "refused")]
        assert reasons(plan)["n01"] == "hourly cap of 2 automatic drains reached; waiting"
        assert not any(isinstance(w, SetBreaker) for w in plan.writes)


def test_a_failed_drain_counts_towards_no_cap() -> None:
    recs = (rec("n01", rec_id=1), rec("n02", rec_id=2))
    s = settings(max_actions_per_hour=1)
    assert summary(run(snapshot(recs), s)) == [("drain", "n01", "done"), ("drain", "n02", "refused")]
    failed = {BackendCall("drain", "n01", "healthd: below_floor gemm run r1"): CallResult("failed", "slurm down")}
    plan = run(snapshot(recs), s, results=failed)
    assert summary(plan) == [("drain", "n01", "failed"), ("drain", "n02", "done")]
    assert [c.node for c in plan.calls] == ["n01", "n02"]
    assert not any(isinstance(w, OpenDrain) and w.node == "n01" for w in plan.writes)


def test_a_backend_refusal_is_a_noted_refusal() -> None:
    call = BackendCall("drain", "n01", "healthd: below_floor gemm run r1")
    plan = run(snapshot((rec("n01"),)), settings(), results={call: CallResult("refused", "n01 is drained")})
    assert summary(plan) == [("drain", "n01", "refused")]
    assert NoteRecommendation("n01", "gemm", "backend refused: n01 is drained", False) in plan.writes


def test_a_repeat_offender_is_escalated() -> None:
    recent = (drain("n01", NOW - 86400, undrained_at=NOW - 80000), drain("n01", NOW - 3600, undrained_at=NOW - 600))
    plan = run(snapshot((rec("n01"),), recent=recent), settings())
    assert plan.calls == ()
    why = "drained 2 times within 604800 s: left to humans"
    assert NoteRecommendation("n01", "gemm", why, escalated=True) in plan.writes
    assert summary(plan) == [("drain", "n01", "refused")]


def marks(probe: str, *severities: int) -> tuple[JudgedMark, ...]:
    return tuple((NOW - 500 + i, probe, sev, "ok" if sev == 0 else "below_floor") for i, sev in enumerate(severities))


@pytest.mark.parametrize(("judged", "undrained"), [
    (marks("gemm", 0), False),  # one pass of two
    (marks("gemm", 0, 1, 0), False),  # a failure breaks the streak
    (marks("nccl", 0, 0, 0), False),  # another probe's passes prove nothing
    (marks("gemm", 1, 0, 0), True),
])
def test_undrain_after_k_passes(judged: tuple[JudgedMark, ...], undrained: bool) -> None:
    own = drain("n01", NOW - 1000)
    cluster = nodes(n01=own.reason)
    plan = run(snapshot(open_drains=(own,), marks={("n01", own.drained_at): judged}), settings(undrain_after_passes=2),
               cluster=cluster)
    if not undrained:
        assert plan == Plan()
        return
    assert plan.calls == (BackendCall("undrain", "n01"),)
    assert plan.writes[:2] == (CloseDrain("n01", by="healthd"),
                               CloseRecommendations("n01", None, "cleared", "2 consecutive passes"))
    assert summary(plan) == [("undrain", "n01", "done")]


def test_no_undrain_of_a_node_whose_reason_changed_hands_said_once() -> None:
    own = drain("n01", NOW - 1000)
    snap = snapshot(open_drains=(own,), marks={("n01", own.drained_at): marks("gemm", 0)})
    plan = run(snap, settings(undrain_after_passes=1), cluster=nodes(n01="RMA (admin)"))
    why = "passes again, but is no longer drained by healthd; not touching it"
    assert plan.calls == () and summary(plan) == [("undrain", "n01", "refused")] and reasons(plan)["n01"] == why
    said = AuditRow(NOW - 60, "healthd", "undrain", "n01", "refused", why, {})
    again = snapshot(open_drains=(own,), marks={("n01", own.drained_at): marks("gemm", 0)}, last_audit={"n01": said})
    assert run(again, settings(undrain_after_passes=1), cluster=nodes(n01="RMA (admin)")) == Plan()


def test_observe_mode_withdraws_every_recommendation() -> None:
    plan = run(snapshot((rec("n01"), rec("n02", rec_id=2))), settings(mode="observe"),
               output=JudgeOutput(at=NOW, recommendations=[candidate("n03")]))
    assert plan.calls == () and plan.actions == []
    assert plan.writes == tuple(CloseRecommendations(n, "gemm", "withdrawn", "remediation mode is observe")
                                for n in ("n01", "n02"))


@pytest.mark.parametrize(("verdict", "expected"), [
    (Verdict("n01", "gemm", Outcome.DEGRADED, "fleet event: gemm on h100x8", "fleet_event"),
     CloseRecommendations("n01", "gemm", "withdrawn", "fleet event: gemm on h100x8")),
    (Verdict("n01", "gemm", Outcome.PASS, "ok", "ok"),
     CloseRecommendations("n01", "gemm", "cleared", "gemm: no longer confirmed (pass)")),
    (None, CloseRecommendations("n01", "gemm", "cleared", "gemm: no longer confirmed")),
    (Verdict("n01", "gemm", Outcome.ERROR, "probe crashed", "probe_error"), None),
])
def test_what_a_verdict_does_to_a_recommendation(verdict: Verdict | None,
                                                 expected: CloseRecommendations | None) -> None:
    output = JudgeOutput(at=NOW, evaluated={("n01", "gemm")}, verdicts=[verdict] if verdict else [])
    plan = run(snapshot((rec("n01"),)), settings(mode="recommend"), output=output)
    assert plan.writes[:1] == ((expected,) if expected else ())
    if expected is not None and expected.state == "withdrawn":
        assert plan.actions[0].reason == "gemm: explained by a fleet event"


def test_a_new_recommendation_is_audited_a_refresh_is_not() -> None:
    output = JudgeOutput(at=NOW, recommendations=[candidate("n01"), candidate("n02")])
    plan = run(snapshot((rec("n01"),)), settings(mode="recommend"), output=output)
    assert [w.node for w in plan.writes if isinstance(w, UpsertRecommendation)] == ["n01", "n02"]
    assert summary(plan) == [("recommend", "n02", "info")]


def test_stale_evidence_needs_no_nodes_and_drains_nothing() -> None:
    stale = RecommendationRow(1, "n01", "gemm", "fail", "below_floor", "slow", {}, NOW - 7200, NOW - 3601, "active",
                              None, "", False, "")
    snap = snapshot((stale,))
    assert not needs_nodes(snap, JudgeOutput(at=NOW), settings(), NOW)
    assert needs_nodes(snapshot((rec("n01"),)), JudgeOutput(at=NOW), settings(), NOW)
    assert run(snap, settings()) == Plan()


# -- the store is entered once to read and once to write -----------------------------------------------
class CountingStore:
    def __init__(self, store: Store) -> None:
        self.store = store
        self.calls: list[str] = []

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.store, name)
        if callable(attr):
            self.calls.append(name)
        return attr


class Cluster:
    name = "fake"

    def __init__(self) -> None:
        self.reasons: dict[str, str | None] = {f"n{i:02d}": None for i in range(1, 11)}

    def list_nodes(self) -> list[Node]:
        return [Node(n, "idle", frozenset({"DRAIN"}) if r else frozenset(), reason=r, node_class=CLASS)
                for n, r in self.reasons.items()]

    def drain(self, node: str, reason: str) -> None:
        self.reasons[node] = reason

    def undrain(self, node: str) -> None:
        self.reasons[node] = None


def test_one_apply_reads_the_store_once_and_writes_it_once(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.sqlite")
    counting = CountingStore(store)
    cluster = Cluster()
    remediator = Remediator(counting, cluster, settings(undrain_after_passes=1), clock=lambda: NOW)
    output = JudgeOutput(at=NOW, evaluated={("n01", "gemm"), ("n02", "gemm")},
                         recommendations=[candidate("n01"), candidate("n02")])
    actions = remediator.apply(output)
    assert [(a.action, a.node, a.result) for a in actions] == [
        ("recommend", "n01", "info"), ("recommend", "n02", "info"), ("drain", "n01", "done"),
        ("drain", "n02", "done")]
    assert counting.calls == ["remediation_snapshot", "apply_remediation"]
    assert cluster.reasons["n01"] == "healthd: below_floor gemm"
    assert [d.node for d in store.drains(open_only=True)] == ["n01", "n02"]
    assert len(store.audit()) == 4
