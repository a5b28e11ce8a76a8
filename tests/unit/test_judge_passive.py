"""Passive signals in the judge (``healthd.judge.sources.passive``): confirmed by a re-probe failing or by a
repeat, suspect after a clean probe, hints never drain, a class-wide signal is a fleet event, nothing from a
poll that did not answer, and the state survives a restart through the store."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from healthd.config import JudgeSettings, ProbeSettings, RemediationSettings
from healthd.judge.model import CheckInput, RunInput
from healthd.judge.persist import keep_seconds, load_judge
from healthd.judge.sources.passive import Passive
from healthd.model import Outcome, RunKind
from healthd.passive.model import PassivePoll, PassiveSignal, Strength
from healthd.remediation.decide import drain_reason
from healthd.store import Store
from healthd.store.rows import RecommendationRow
from tests.unit.test_judge_engine import Fleet

PROBES = {"gemm": ProbeSettings(), "nccl": ProbeSettings(nodes_per_job=2)}
UUID = "GPU-5d1a1c3e-0b6f-4c1e-9a8d-3f2b7c9e1a04"


def xid(node: str, at: float, code: int = 79, strength: Strength = Strength.FAULT, gpu: str = "3") -> PassiveSignal:
    uuid = UUID if gpu == "3" else None
    return PassiveSignal(node, "xid", f"xid_{code}", strength, at, float(code), "event", gpu, uuid,
                         f"xid {code} on gpu {gpu}")


def throttle(node: str, at: float) -> PassiveSignal:
    return PassiveSignal(node, "throttle", "throttle_thermal", Strength.HINT, at, 32.0, "level", "1", None,
                         "thermal slowdown on gpu 1")


def poll(fleet: Fleet, *signals: PassiveSignal, up: bool = True) -> PassivePoll:
    return PassivePoll(fleet.t, up, tuple(signals), frozenset(fleet.names) if up else frozenset())


def observe(fleet: Fleet, *signals: PassiveSignal, advance: float = 60.0, up: bool = True):  # type: ignore[no-untyped-def]
    out = fleet.judge.observe(poll(fleet, *signals, up=up), fleet.nodes, now=fleet.t)
    if fleet.store is not None:
        fleet.store.save_judgement(out, keep_s=keep_seconds(fleet.judge.settings))
    fleet.t += advance
    return out


def gpus_missing(fleet: Fleet, node: str) -> RunInput:
    return RunInput(fleet.rid(True), "gemm", (node,), Outcome.FAIL, "env.gpu_count: 7 GPU(s) visible, 8 expected",
                    fleet.t, (), (CheckInput("env.gpu_count", "7 GPU(s) visible, 8 expected", node),),
                    kind=RunKind.REPROBE)


def passive_verdict(fleet: Fleet, node: str) -> tuple[str, str, str]:
    v = fleet.judge.verdicts[(node, "passive")]
    return v.outcome.value, v.reason_code, str(v.evidence.get("stage", ""))


def test_an_xid_79_asks_for_a_re_probe_and_a_failing_one_confirms_it_with_a_drain_reason_naming_the_gpu() -> None:
    fleet = Fleet([f"n{i}" for i in range(8)])
    fleet.healthy_gemm_rounds()
    out = observe(fleet, xid("n2", fleet.t))
    assert passive_verdict(fleet, "n2") == ("degraded", "xid_79", "awaiting confirmation")
    assert out.recommendations == []
    assert [(r.kind, r.probe, r.nodes) for r in out.requests] == [("reprobe", "passive", ("n2",))]
    wanted = fleet.judge.requests(fleet.t, PROBES)
    assert [(r.probe, r.nodes) for r in wanted] == [("gemm", ("n2",))]  # single-node probes only
    assert {(n, passive_verdict(fleet, n)[0]) for n in fleet.names if (n, "passive") in fleet.judge.verdicts} == \
        {("n2", "degraded")}

    out = fleet.feed([gpus_missing(fleet, "n2")])
    assert passive_verdict(fleet, "n2") == ("fail", "xid_79", "confirmed")
    (rec,) = [r for r in out.recommendations if r.probe == "passive"]
    assert rec.outcome is Outcome.FAIL and "a probe of the node failed after it" in rec.text
    assert ("n2", "passive") in out.satisfied
    assert [r.reason.startswith("reprobe: check env.gpu_count") for r in fleet.judge.requests(fleet.t, PROBES)] == \
        [True]  # the gemm probe's own confirmation goes on; the passive one is answered
    row = RecommendationRow(1, "n2", "passive", rec.outcome.value, rec.reason_code, rec.text, dict(rec.evidence),
                            since=0.0, updated_at=0.0, state="active", closed_at=None, close_reason="",
                            escalated=False, last_refusal="")
    assert drain_reason(RemediationSettings().reason_prefix, row) == f"healthd: xid 79 gpu 3 ({UUID}) (passive: xid)"


def test_a_repeat_confirms_without_a_probe() -> None:
    fleet = Fleet([f"n{i}" for i in range(8)])
    observe(fleet, xid("n1", fleet.t, 48))
    out = observe(fleet, xid("n1", fleet.t, 48))
    assert passive_verdict(fleet, "n1") == ("fail", "xid_48", "confirmed")
    assert "the signal repeated (2 times" in out.recommendations[0].text


def test_a_clean_re_probe_leaves_a_suspect_that_ends_with_the_window_and_a_later_repeat_still_confirms() -> None:
    settings = JudgeSettings.model_validate({"passive": {"window_s": 600.0}})
    fleet = Fleet([f"n{i}" for i in range(8)], settings)
    fleet.healthy_gemm_rounds()
    observe(fleet, xid("n4", fleet.t))
    out = fleet.feed([fleet.gemm("n4", priority=True)], advance=60)
    assert passive_verdict(fleet, "n4") == ("degraded", "xid_79", "suspect")
    assert not [r for r in out.recommendations if r.probe == "passive"]
    out = observe(fleet, xid("n4", fleet.t))
    assert passive_verdict(fleet, "n4") == ("fail", "xid_79", "confirmed")

    observe(fleet, xid("n5", fleet.t))
    fleet.feed([fleet.gemm("n5", priority=True)], advance=700)
    assert passive_verdict(fleet, "n5")[2] == "suspect"
    observe(fleet)
    assert passive_verdict(fleet, "n5") == ("pass", "ok", "")
    assert passive_verdict(fleet, "n4") == ("fail", "xid_79", "confirmed")  # confirmed: needs a passing probe too
    fleet.feed([fleet.gemm("n4", priority=True)])
    observe(fleet)
    assert passive_verdict(fleet, "n4") == ("pass", "ok", "")


def test_application_xids_change_nothing_and_hints_never_drain() -> None:
    fleet = Fleet([f"n{i}" for i in range(8)])
    out = observe(fleet, xid("n0", fleet.t, 13, Strength.IGNORED), xid("n0", fleet.t, 43, Strength.IGNORED, "2"))
    assert out.verdicts == [] and out.requests == [] and ("n0", "passive") not in fleet.judge.verdicts

    out = observe(fleet, throttle("n3", fleet.t))
    assert passive_verdict(fleet, "n3") == ("pass", "throttle_thermal", "hint")
    assert [(r.probe, r.nodes) for r in out.requests] == [("passive", ("n3",))]
    for _ in range(5):
        out = observe(fleet, throttle("n3", fleet.t))
        assert out.recommendations == []
    assert passive_verdict(fleet, "n3")[0] == "pass"
    observe(fleet)  # a poll covering the node without the level: the hint ends
    assert passive_verdict(fleet, "n3") == ("pass", "ok", "")


def test_a_signal_on_a_large_share_of_a_class_is_one_fleet_event_and_no_drain() -> None:
    fleet = Fleet([f"n{i:02d}" for i in range(20)])
    fleet.healthy_gemm_rounds()
    out = observe(fleet, *(xid(n, fleet.t, 119) for n in fleet.names[:12]))
    events = [e for e in out.fleet_events if e.probe == "passive"]
    assert len(events) == 1 and events[0].active
    assert {passive_verdict(fleet, n)[1] for n in fleet.names[:12]} == {"fleet_event"}
    out = observe(fleet, *(xid(n, fleet.t, 119) for n in fleet.names[:12]))
    assert out.recommendations == []
    assert [key for key in fleet.judge.pending if key[1] == "passive"] == [], "an event asks for no re-probes"
    assert {passive_verdict(fleet, n)[0] for n in fleet.names[:12]} == {"degraded"}  # one finding, never fail


def test_a_poll_that_did_not_answer_changes_nothing() -> None:
    fleet = Fleet([f"n{i}" for i in range(8)])
    observe(fleet, throttle("n1", fleet.t))
    out = observe(fleet, up=False)
    assert out.verdicts == [] and out.requests == []
    assert passive_verdict(fleet, "n1") == ("pass", "throttle_thermal", "hint")


def test_a_drained_node_gets_no_re_probe_and_unknown_nodes_are_ignored() -> None:
    fleet = Fleet([f"n{i}" for i in range(8)])
    fleet.nodes[6] = replace(fleet.nodes[6], flags=frozenset({"DRAIN"}), reason="by hand")
    assert fleet.nodes[6].drained
    out = observe(fleet, xid("n6", fleet.t), xid("ghost", fleet.t))
    assert passive_verdict(fleet, "n6") == ("degraded", "xid_79", "awaiting confirmation")
    assert out.requests == [] and ("ghost", "passive") not in fleet.judge.verdicts


def test_the_passive_state_survives_a_restart(tmp_path: Path) -> None:
    fleet = Fleet([f"n{i}" for i in range(8)])
    fleet.store = Store(tmp_path / "h.db")
    fleet.store.upsert_nodes(fleet.nodes, seen_at=fleet.t)
    observe(fleet, xid("n2", fleet.t))
    fleet.judge = load_judge(fleet.store, fleet.judge.settings, now=fleet.t)
    assert passive_verdict(fleet, "n2") == ("degraded", "xid_79", "awaiting confirmation")
    out = observe(fleet, xid("n2", fleet.t))  # the repeat after the restart still confirms
    assert passive_verdict(fleet, "n2") == ("fail", "xid_79", "confirmed")
    assert [r.probe for r in out.recommendations] == ["passive"]


def test_the_signals_and_the_confirmed_finding_are_exported_with_their_source() -> None:
    from prometheus_client import CollectorRegistry, generate_latest

    from healthd.judge.metrics import finding_samples
    from healthd.metrics import PassiveSignalCollector

    fleet = Fleet([f"n{i}" for i in range(8)])
    observe(fleet, xid("n1", fleet.t, 48), throttle("n2", fleet.t))
    observe(fleet, xid("n1", fleet.t, 48), throttle("n2", fleet.t))
    registry = CollectorRegistry()
    registry.register(PassiveSignalCollector(lambda: fleet.judge.view(Passive, Passive.signals)))
    text = generate_latest(registry).decode()
    assert (f'healthd_node_passive_signal{{code="xid_48",device="",gpu="3",gpu_uuid="{UUID}",node="n1",port="",'
            'signal="xid",stage="confirmed",strength="fault"} 1.0') in text
    assert ('healthd_node_passive_signal{code="throttle_thermal",device="",gpu="1",gpu_uuid="",node="n2",port="",'
            'signal="throttle",stage="hint",strength="hint"} 1.0') in text
    assert text.count("healthd_node_passive_signal{") == 2
    samples = list(finding_samples(fleet.judge.verdicts.values()))
    assert [(dict(labels)["node"], dict(labels)["source"], dict(labels)["reason_code"], dict(labels)["gpu_uuid"])
            for _, labels, _ in samples] == [("n1", "passive", "xid_48", UUID)]


def test_the_node_document_lists_the_signals_followed_on_the_node() -> None:
    from healthd.http import node_document
    from healthd.metrics import NodeView

    fleet = Fleet([f"n{i}" for i in range(8)])
    observe(fleet, xid("n1", fleet.t), throttle("n2", fleet.t))
    doc = node_document(NodeView("n1"), detail=True, passive=fleet.judge.view(Passive, Passive.signals))
    (signal,) = doc["passive_signals"]
    assert (signal["code"], signal["stage"], signal["gpu"], signal["gpu_uuid"], signal["confirmed_by"]) == \
        ("xid_79", "awaiting confirmation", "3", UUID, None)
    assert node_document(NodeView("n3"), passive=fleet.judge.view(Passive, Passive.signals))["passive_signals"] == []


def test_a_hint_on_a_large_share_of_the_class_asks_for_no_probes() -> None:
    fleet = Fleet([f"n{i:02d}" for i in range(20)])
    out = observe(fleet, *(throttle(n, fleet.t) for n in fleet.names[:8]))
    assert out.requests == [], "40% of the class throttled: a condition of the class, not 8 probes"
    assert {passive_verdict(fleet, n)[1] for n in fleet.names[:8]} == {"throttle_thermal"}
    out = observe(fleet, throttle("n15", fleet.t))
    assert [r.nodes for r in out.requests] == [("n15",)]
