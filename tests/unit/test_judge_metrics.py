"""The judgement metric families, from a store snapshot: names, labels, values, and promtool's lint."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest

from healthd.judge.metrics import JudgeCollector, judge_metric_families, judge_snapshot
from healthd.judge.model import FleetEvent, JudgeOutput, SeriesKey, SeriesState
from healthd.model import Outcome, Verdict
from healthd.store import Store


def filled_store(tmp_path: Path) -> Store:
    store = Store(tmp_path / "s.sqlite")
    gemm = SeriesKey.of("gemm", "flop_per_second", {"gpu": "0", "dtype": "bf16"})
    group = SeriesKey.of("nccl", "busbw_bytes_per_second",
                         {"scope": "group", "size_bytes": "1073741824", "nodes": "2"})
    node = SeriesKey.of("nccl", "busbw_bytes_per_second", {"scope": "node", "size_bytes": "1073741824"})
    series = [
        SeriesState("n1", gemm, [(1.0, 7e14)], 7e14, 1.0, "r", 5.25e14, 7e14, 1e12),
        SeriesState("n1", group, [], 4e11, 1.0, "r", 1e11, None, None),
        SeriesState("n2", node, [], 4.8e11, 1.0, "r", None, 4.8e11, 2e9),
    ]
    events = [FleetEvent("h100x8", "nccl", 1.0, None, 9, 12, (), "x"),
              FleetEvent("a100x8", "gemm", 1.0, None, 9, 12, (), "y")]
    store.save_judgement(JudgeOutput(at=1.0, verdicts=[Verdict("n1", "gemm", Outcome.FAIL, "slow", "below_floor"),
                                                       Verdict("n2", "nccl", Outcome.PASS, "ok", "ok")],
                                     series=series, fleet_events=events))
    store.save_judgement(JudgeOutput(at=5.0, fleet_events=[
        FleetEvent("a100x8", "gemm", 1.0, 5.0, 0, 0, (), "y; over")]))
    for probe, outcome, code in (("gemm", "degraded", "fleet_outlier"), ("nccl", "fail", "localised")):
        store.upsert_recommendation(node="n1", probe=probe, outcome=outcome, reason_code=code, text="t",
                                    evidence={}, at=2.0)
    store.add_audit(at=3.0, actor="healthd", action="drain", node="n1", result="refused", reason="breaker")
    store.set_remediation_state("breaker", {"open": True, "opened_at": 3.0, "reason": "r", "closed_at": None})
    return store


def test_families_and_values(tmp_path: Path) -> None:
    store = filled_store(tmp_path)
    families = {f.name: f for f in judge_metric_families(judge_snapshot(store))}
    assert "healthd_node_verdict" not in families  # the daemon's StoreCollector exports it unless asked here
    assert sorted(families) == [
        "healthd_baseline_gemm_flop_per_second", "healthd_baseline_nccl_busbw_bytes_per_second",
        "healthd_drain_recommended", "healthd_fleet_event_active", "healthd_floor_gemm_flop_per_second",
        "healthd_floor_nccl_busbw_bytes_per_second", "healthd_remediation_actions",
        "healthd_remediation_breaker_open"]

    def samples(name: str) -> dict[tuple[tuple[str, str], ...], float]:
        return {tuple(sorted(s.labels.items())): s.value for s in families[name].samples}

    assert samples("healthd_floor_nccl_busbw_bytes_per_second") == {
        (("node", "n1"), ("nodes", "2"), ("scope", "group"), ("size_bytes", "1073741824")): 1e11}
    assert samples("healthd_baseline_nccl_busbw_bytes_per_second") == {
        (("node", "n2"), ("scope", "node"), ("size_bytes", "1073741824")): 4.8e11}
    # one series per node: the failing recommendation wins over the degraded one; known nodes show 0
    assert samples("healthd_drain_recommended") == {(("node", "n1"), ("reason_code", "localised")): 1.0,
                                                    (("node", "n2"), ("reason_code", "")): 0.0}
    assert samples("healthd_fleet_event_active") == {(("node_class", "a100x8"), ("probe", "gemm")): 0.0,
                                                     (("node_class", "h100x8"), ("probe", "nccl")): 1.0}
    actions = samples("healthd_remediation_actions")
    assert actions[(("action", "drain"), ("result", "refused"))] == 1.0
    assert actions[(("action", "undrain"), ("result", "done"))] == 0.0
    assert samples("healthd_remediation_breaker_open") == {(): 1.0}
    store.close()


def test_exposition_is_valid(tmp_path: Path) -> None:
    store = filled_store(tmp_path)
    registry = CollectorRegistry()
    registry.register(JudgeCollector(store, verdicts=True))
    text = generate_latest(registry).decode()
    assert 'healthd_node_verdict{node="n1",outcome="fail",probe="gemm",reason_code="below_floor"} 1.0' in text
    assert 'healthd_remediation_actions_total{action="drain",result="refused"} 1.0' in text
    promtool = shutil.which("promtool")
    if promtool is not None:
        lint = subprocess.run([promtool, "check", "metrics"], input=text.encode(), capture_output=True, timeout=30,
                              check=False)
        assert lint.returncode == 0, lint.stdout.decode() + lint.stderr.decode()
    store.close()
