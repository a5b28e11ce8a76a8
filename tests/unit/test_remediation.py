"""Remediation with a real store and the Slurm backend over a fake Slurm: recommendations, ownership,
the circuit breaker, the hourly cap, stale evidence, repeat offenders, undrains, operators, audit."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from healthd.config import RemediationSettings
from healthd.judge.model import FleetEvent, JudgeOutput, Mark, ReasonCode, RecommendationCandidate, Severity
from healthd.model import Outcome, Verdict
from healthd.remediation import Remediator, recommendations_document
from healthd.store import Store
from tests.fakes.slurm import FakeSlurmClient, fake_backend, gpu_node

T0 = 1_000_000.0


class Rig:
    def __init__(self, tmp_path: Path, **settings: object) -> None:
        self.slurm = FakeSlurmClient([gpu_node(f"n{i:02d}") for i in range(20)])
        self.cluster = fake_backend(self.slurm, tmp_path / "results")
        self.store = Store(tmp_path / "s.sqlite")
        self.now = T0
        self.settings = RemediationSettings(**{"mode": "enforce", **settings})
        self.remediator = Remediator(self.store, self.cluster, self.settings, clock=lambda: self.now)

    def recommend(self, *nodes: str, probe: str = "gemm", outcome: Outcome = Outcome.FAIL,
                  code: ReasonCode = ReasonCode.BELOW_FLOOR) -> list[tuple[str, str, str]]:
        out = JudgeOutput(at=self.now, evaluated={(n, probe) for n in nodes}, recommendations=[
            RecommendationCandidate(n, probe, outcome, code, f"gpu 3 of {n} is slow", evidence(), self.now)
            for n in nodes])
        return [(a.action, a.node or "", a.result) for a in self.remediator.apply(out)]

    def judged(self, node: str, verdict: Verdict | None = None, probe: str = "gemm") -> list[tuple[str, str, str]]:
        out = JudgeOutput(at=self.now, evaluated={(node, probe)}, verdicts=[verdict] if verdict else [])
        return [(a.action, a.node or "", a.result) for a in self.remediator.apply(out)]

    def reason(self, node: str) -> str | None:
        return self.slurm.node(node).reason


def evidence() -> dict[str, object]:
    return {"run_ids": ["00000000000000a1", "rp0000000000000b"], "confirmed": "2/3",
            "findings": [{"layer": "below_floor", "series": "gpu 3 flop_per_second{dtype=bf16}", "value": 300e12,
                          "reference": 525e12, "threshold": 525e12, "gpu": "3"}]}


DRAIN_REASON = ("healthd: below_floor gemm gpu 3 flop_per_second{dtype=bf16} 300 TFLOP/s<525 TFLOP/s"
                " run rp0000000000000b")


def test_recommend_mode_keeps_recommendations_and_never_drains(tmp_path: Path) -> None:
    rig = Rig(tmp_path, mode="recommend")
    assert rig.recommend("n01") == [("recommend", "n01", "info")]
    rig.now += 60
    assert rig.recommend("n01") == []  # a refresh is no new recommendation...
    (rec,) = rig.store.recommendations()
    assert (rec.node, rec.probe, rec.outcome, rec.reason_code) == ("n01", "gemm", "fail", "below_floor")
    assert (rec.since, rec.updated_at) == (T0, T0 + 60)  # ...and keeps the time it was first made
    assert rig.slurm.drains() == []
    assert rig.judged("n01") == [("clear", "n01", "info")]  # judged again without a finding: cleared
    assert rig.store.recommendations() == []
    (closed,) = rig.store.recommendations(states=("cleared",))
    assert closed.close_reason == "gemm: no longer confirmed"


def test_enforce_drains_once_with_an_owned_reason_and_audits(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    assert rig.recommend("n01") == [("recommend", "n01", "info"), ("drain", "n01", "done")]
    assert rig.reason("n01") == DRAIN_REASON
    assert rig.recommend("n01") == []  # already drained by healthd: nothing to do
    (drain,) = rig.store.drains()
    assert (drain.node, drain.automatic, drain.probes, drain.node_class) == ("n01", True, ("gemm",), "h100x8")
    audit = rig.store.audit()
    assert [(a.action, a.result, a.actor) for a in audit] == [("drain", "done", "healthd"),
                                                               ("recommend", "info", "healthd")]
    assert audit[0].detail["evidence"]["confirmed"] == "2/3"
    assert ("remediation_actions_total", {"action": "drain", "result": "done"}, 1.0) in rig.store.counters()


def test_a_node_drained_by_someone_else_is_never_touched(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    rig.slurm.admin_drain("n02", "PSU swap (admin)")
    expected = [("recommend", "n02", "info"), ("drain", "n02", "refused")]
    assert rig.recommend("n02") == expected
    assert rig.recommend("n02") == []  # the same refusal is audited once, not at every tick
    assert rig.reason("n02") == "PSU swap (admin)"
    (refusal,) = [a for a in rig.store.audit() if a.result == "refused"]
    assert refusal.reason == "drained or marked by someone else (reason: 'PSU swap (admin)'); not touching it"
    # nor by an operator through healthd, in either direction
    assert rig.remediator.drain("n02", "x", actor="operator:alice").result == "refused"
    action = rig.remediator.undrain("n02", actor="operator:alice")
    assert (action.result, action.reason) == ("refused", "drained by someone else (reason: 'PSU swap (admin)'); "
                                                         "not undraining")
    assert rig.reason("n02") == "PSU swap (admin)"


def test_breaker_opens_at_the_class_share_and_closes_after_cooldown(tmp_path: Path) -> None:
    # 20 nodes, 10%: 2, but at least breaker_class_min_nodes = 3 automatic drains per window
    rig = Rig(tmp_path, breaker_cooldown_s=3600.0)
    actions = rig.recommend("n01", "n02", "n03", "n04", "n05")
    assert [a for a in actions if a[0] == "drain"] == [("drain", f"n{i:02d}", "done") for i in (1, 2, 3)] + \
        [("drain", "n04", "refused"), ("drain", "n05", "refused")]
    assert ("breaker_open", "n04", "done") in actions
    state = rig.remediator.breaker()
    assert state.open and state.reason == ("draining n04 would make 4 automatic drains in class h100x8 (allowed 3 of "
                                           "20) or 4 overall (allowed 50) within 21600 s")
    assert {rig.reason(f"n{i:02d}") for i in (4, 5)} == {None}
    refusals = {a.node: a.reason for a in rig.store.audit() if a.result == "refused"}
    assert refusals["n05"] == "circuit breaker open: no automatic drains"
    rig.now += 3600
    actions = rig.recommend("n04")  # fresh evidence after the cool-down: the breaker closes, then trips again
    assert ("breaker_close", "", "done") in actions and ("breaker_open", "n04", "done") in actions


def test_breaker_absolute_cap_and_manual_reset(tmp_path: Path) -> None:
    rig = Rig(tmp_path, breaker_max_nodes=2, breaker_cooldown_s=0.0)
    rig.recommend("n01", "n02", "n03")
    assert [d.node for d in rig.store.drains()] == ["n01", "n02"] and rig.remediator.breaker().open
    rig.now += 10 * 86400
    rig.recommend("n03")
    assert rig.remediator.breaker().open  # cool-down 0: only a person closes it
    assert rig.remediator.reset_breaker(actor="operator:bob").result == "done"
    assert rig.remediator.reset_breaker(actor="operator:bob").result == "refused"
    assert rig.recommend("n03")[-1] == ("drain", "n03", "done")  # the old drains left the 6 h window


def test_hourly_cap_defers_without_opening_the_breaker(tmp_path: Path) -> None:
    rig = Rig(tmp_path, max_actions_per_hour=1)
    assert rig.recommend("n01", "n02")[-2:] == [("drain", "n01", "done"), ("drain", "n02", "refused")]
    assert not rig.remediator.breaker().open
    rig.now += 3601
    assert rig.recommend("n02") == [("drain", "n02", "done")]


def test_stale_evidence_is_never_acted_on(tmp_path: Path) -> None:
    rig = Rig(tmp_path, mode="recommend")
    rig.recommend("n01")
    enforcing = Remediator(rig.store, rig.cluster, rig.settings.model_copy(update={"mode": "enforce"}),
                           clock=lambda: rig.now)
    rig.now += 3601  # older than max_evidence_age_s: a closing breaker or a mode change replays nothing stale
    assert enforcing.apply(JudgeOutput(at=rig.now)) == []
    assert rig.slurm.drains() == []


def test_a_repeat_offender_is_left_to_humans(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    for _ in range(2):
        rig.recommend("n01")
        assert rig.reason("n01") == DRAIN_REASON
        assert rig.remediator.undrain("n01", actor="operator:alice").result == "done"
        rig.now += 60
    assert rig.recommend("n01") == [("recommend", "n01", "info"), ("drain", "n01", "refused")]
    (rec,) = rig.store.recommendations()
    assert rec.escalated and rec.last_refusal == "drained 2 times within 604800 s: left to humans"
    assert rig.reason("n01") is None


def passing_marks(store: Store, node: str, at: float, probe: str = "gemm", n: int = 1, severity: int = 0) -> None:
    store.save_judgement(JudgeOutput(at=at, marks=[
        Mark(f"{probe}{at}{i}", node, probe, at + i, Severity(severity),
             ReasonCode.OK if severity == 0 else ReasonCode.BELOW_FLOOR, "", True, raw_flagged=severity > 0)
        for i in range(n)]))


def test_undrain_after_consecutive_passes_of_the_drained_probe(tmp_path: Path) -> None:
    rig = Rig(tmp_path, undrain_after_passes=2)
    rig.recommend("n01")
    rig.now += 60
    passing_marks(rig.store, "n01", rig.now, probe="nccl", n=3)  # another probe's passes prove nothing
    passing_marks(rig.store, "n01", rig.now + 10, n=1)
    assert rig.judged("n01") == [("clear", "n01", "info")]
    assert rig.reason("n01") == DRAIN_REASON
    passing_marks(rig.store, "n01", rig.now + 20, n=1)
    rig.now += 30
    assert rig.judged("n01")[-1] == ("undrain", "n01", "done")
    assert rig.reason("n01") is None
    (drain,) = rig.store.drains()
    assert (drain.undrained_by, drain.undrained_at) == ("healthd", rig.now)
    assert rig.store.judge_resets() == {"n01": rig.now}  # the judge forgets the evidence from before


def test_the_undrain_after_a_recheck_reads_the_nodes_fresh(tmp_path: Path) -> None:
    """The Slurm backend lifts an own drain while its recheck runs and restores it when the run is collected;
    a node list cached during the recheck must not make remediation think the drain changed hands."""
    rig = Rig(tmp_path, undrain_after_passes=1)
    rig.recommend("n01")
    rig.slurm.undrain("n01")  # the recheck runs: the drain is lifted
    rig.now += 5
    rig.slurm.admin_drain("n02", "hw: fan")
    assert rig.recommend("n02")[-1] == ("drain", "n02", "refused")  # the node list is cached meanwhile
    rig.slurm.drain("n01", DRAIN_REASON)  # the recheck was collected: its drain is back
    rig.now += 5
    mark = Mark("rp0000000000000c", "n01", "gemm", rig.now, Severity.NONE, ReasonCode.OK, "", False)
    rig.store.save_judgement(JudgeOutput(at=rig.now, marks=[mark]))
    actions = rig.remediator.apply(JudgeOutput(at=rig.now, evaluated={("n01", "gemm")}, marks=[mark]))
    assert ("undrain", "n01", "done") in [(a.action, a.node, a.result) for a in actions]
    assert rig.reason("n01") is None


def test_no_undrain_when_the_drain_reason_changed_hands(tmp_path: Path) -> None:
    rig = Rig(tmp_path, undrain_after_passes=1)
    rig.recommend("n01")
    rig.slurm.admin_drain("n01", "RMA (admin took over)")
    passing_marks(rig.store, "n01", rig.now + 10)
    rig.now += 60
    assert rig.judged("n01")[-1] == ("undrain", "n01", "refused")
    assert rig.judged("n01") == []  # said once
    assert rig.reason("n01") == "RMA (admin took over)"


def test_operator_drain_and_undrain(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    action = rig.remediator.drain("n07", "fan noise", actor="operator:alice")
    assert (action.result, action.reason) == ("done", "healthd: manual fan noise")
    assert rig.remediator.drain("n07", "again", actor="operator:alice").reason == "already drained by healthd"
    assert rig.remediator.drain("bad name;rm", "x", actor="operator:alice").result == "refused"
    assert rig.remediator.drain("n99", "x", actor="operator:alice").reason == "the cluster does not know this node"
    assert rig.remediator.undrain("n08", actor="operator:alice").reason == "the node is not drained"
    rig.recommend("n09")
    action = rig.remediator.undrain("n09", actor="operator:alice")
    assert action.result == "done" and rig.reason("n09") is None
    (dismissed,) = rig.store.recommendations(states=("dismissed",))
    assert (dismissed.node, dismissed.close_reason) == ("n09", "undrained by operator:alice")
    actors = {(a.action, a.node): a.actor for a in rig.store.audit() if a.result == "done"}
    assert actors[("drain", "n07")] == "operator:alice" and actors[("drain", "n09")] == "healthd"
    manual = [d for d in rig.store.drains() if d.node == "n07"]
    assert manual[0].automatic is False  # operators' drains never count towards the breaker or auto-undrain


def test_observe_mode_keeps_no_recommendation(tmp_path: Path) -> None:
    rig = Rig(tmp_path, mode="recommend")
    rig.recommend("n01")
    observing = Remediator(rig.store, rig.cluster, RemediationSettings(mode="observe"), clock=lambda: rig.now)
    assert observing.apply(JudgeOutput(at=rig.now)) == []
    assert rig.store.recommendations() == []
    assert [r.close_reason for r in rig.store.recommendations(states=("withdrawn",))] == ["remediation mode is observe"]


@pytest.mark.parametrize(("outcome", "code", "state"), [
    (Outcome.DEGRADED, "fleet_event", "withdrawn"),
    (Outcome.ERROR, "probe_error", "active"),  # an error can check nothing, so it clears nothing
    (Outcome.PASS, "ok", "cleared"),
])
def test_what_a_new_verdict_does_to_a_recommendation(tmp_path: Path, outcome: Outcome, code: str, state: str) -> None:
    rig = Rig(tmp_path, mode="recommend")
    rig.recommend("n01")
    rig.judged("n01", Verdict("n01", "gemm", outcome, "why", code))
    states = {r.state for r in rig.store.recommendations(states=("active", "cleared", "withdrawn"))}
    assert states == {state}


def test_act_on_and_the_api_document(tmp_path: Path) -> None:
    rig = Rig(tmp_path, act_on=["fail"])
    assert rig.recommend("n01", outcome=Outcome.DEGRADED, code=ReasonCode.FLEET_OUTLIER) == []
    rig.recommend("n02")
    rig.store.save_judgement(JudgeOutput(at=rig.now, fleet_events=[
        FleetEvent("h100x8", "nccl", rig.now, None, 9, 12, (), "fleet event: nccl on h100x8",
                   key="busbw_bytes_per_second{scope=group}", scope="group")]))
    doc = recommendations_document(rig.store, rig.settings)
    assert doc["mode"] == "enforce" and doc["breaker"] == {"open": False}
    assert [(r["node"], r["reason_code"], r["refused"]) for r in doc["recommendations"]] == \
        [("n02", "below_floor", None)]
    assert doc["fleet_events"] == [{"node_class": "h100x8", "probe": "nccl", "started_at": rig.now,
                                    "series": "busbw_bytes_per_second{scope=group}", "scope": "group",
                                    "text": "fleet event: nccl on h100x8"}]
    assert [(d["node"], d["automatic"]) for d in doc["drained_by_healthd"]] == [("n02", True)]
    assert doc["switch_findings"] == []
    leaf = FleetEvent("h100x8", "nccl", rig.now, None, 4, 16, (), "switch leaf2 (level 0): nccl flagged on 4",
                      "leaf2", 0, ("n05", "n06", "n07", "n08"), ("leaf2",))
    rig.store.save_judgement(JudgeOutput(at=rig.now, switch_findings=[leaf]))
    rig.store.save_judgement(JudgeOutput(at=rig.now, switch_findings=[replace(leaf, flagged=5, nodes=(
        "n04", "n05", "n06", "n07", "n08"))]))
    doc = recommendations_document(rig.store, rig.settings)
    assert len(doc["fleet_events"]) == 1
    (found,) = doc["switch_findings"]
    assert (found["switch"], found["level"], found["probe"], found["nodes"], found["held"]) == (
        "leaf2", 0, "nccl", ["n04", "n05", "n06", "n07", "n08"], ["leaf2"])
    assert found["action"].startswith("inspect switch leaf2")
    rig.store.save_judgement(JudgeOutput(at=rig.now, switch_findings=[replace(leaf, ended_at=rig.now)]))
    assert recommendations_document(rig.store, rig.settings)["switch_findings"] == []
    assert len(recommendations_document(rig.store, rig.settings)["fleet_events"]) == 1


def test_recheck_nodes_only_when_enabled(tmp_path: Path) -> None:
    rig = Rig(tmp_path, recheck_drained=True)
    rig.recommend("n03", probe="nccl")
    assert rig.remediator.recheck_nodes() == {"n03": ("nccl",)}
    off = Remediator(rig.store, rig.cluster, RemediationSettings(mode="enforce"), clock=lambda: rig.now)
    assert off.recheck_nodes() == {}


def test_retention_keeps_what_is_still_open(tmp_path: Path) -> None:
    rig = Rig(tmp_path, mode="recommend")
    rig.recommend("n01", "n02")
    rig.judged("n02")  # cleared
    rig.store.add_drain(node="n03", node_class="h100x8", reason="healthd: x", actor="healthd", automatic=True,
                        at=T0, probes=["gemm"])
    rig.store.add_drain(node="n04", node_class="h100x8", reason="healthd: y", actor="healthd", automatic=True,
                        at=T0, probes=["gemm"])
    rig.store.close_drain("n04", at=T0 + 1, by="healthd")
    passing_marks(rig.store, "n05", T0)
    deleted = rig.store.prune_judgement(T0 + 10)
    assert deleted == 3 + 1 + 1 + 1  # 3 audit rows (2 recommends, 1 clear), the cleared recommendation, the closed
    # drain, the mark
    assert [r.node for r in rig.store.recommendations()] == ["n01"]
    assert [d.node for d in rig.store.drains()] == ["n03"]
    assert rig.store.marks_since("n05", 0.0) == []


def test_a_drain_seen_late_through_the_node_cache_is_still_refused_by_the_backend(tmp_path: Path) -> None:
    rig = Rig(tmp_path, mode="enforce")
    rig.slurm.admin_drain("n01", "RMA (admin)")
    assert rig.recommend("n01")[-1] == ("drain", "n01", "refused")  # reads the node list (cached for 30 s)
    rig.slurm.admin_drain("n02", "BIOS update (admin)")
    rig.now += 5
    assert rig.recommend("n02")[-1] == ("drain", "n02", "refused")
    (refusal,) = [a for a in rig.store.audit() if a.node == "n02" and a.result == "refused"]
    assert refusal.reason == "backend refused: n02 is already drained by someone else (reason: 'BIOS update (admin)')"
    assert rig.reason("n02") == "BIOS update (admin)"
