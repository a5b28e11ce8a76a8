"""The judgement metric families, from a store snapshot: names, labels, values, and promtool's lint."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest

from healthd.judge.metrics import JudgeCollector, judge_metric_families, judge_snapshot
from healthd.model import Outcome, Verdict
from healthd.store import Store


def filled_store(tmp_path: Path) -> Store:
    store = Store(tmp_path / "s.sqlite")
    series = [
        {"node": "n1", "probe": "gemm", "name": "flop_per_second", "labels": {"gpu": "0", "dtype": "bf16"},
         "accepted": [[1.0, 7e14]], "last_value": 7e14, "last_at": 1.0, "last_run_id": "r", "floor": 5.25e14,
         "baseline": 7e14, "spread": 1e12},
        {"node": "n1", "probe": "nccl", "name": "busbw_bytes_per_second",
         "labels": {"scope": "group", "size_bytes": "1073741824", "nodes": "2"}, "accepted": [], "last_value": 4e11,
         "last_at": 1.0, "last_run_id": "r", "floor": 1e11, "baseline": None, "spread": None},
        {"node": "n2", "probe": "nccl", "name": "busbw_bytes_per_second",
         "labels": {"scope": "node", "size_bytes": "1073741824"}, "accepted": [], "last_value": 4.8e11,
         "last_at": 1.0, "last_run_id": "r", "floor": None, "baseline": 4.8e11, "spread": 2e9},
    ]
    events = [
        {"node_class": "h100x8", "probe": "nccl", "started_at": 1.0, "ended_at": None, "flagged": 9, "sampled": 12,
         "series": [], "text": "x"},
        {"node_class": "a100x8", "probe": "gemm", "started_at": 1.0, "ended_at": None, "flagged": 9, "sampled": 12,
         "series": [], "text": "y"},
    ]
    store.save_judgement(verdicts=[Verdict("n1", "gemm", Outcome.FAIL, "slow", "below_floor"),
                                   Verdict("n2", "nccl", Outcome.PASS, "ok", "ok")],
                         series=series, marks=[], groups=[], events=events, pending=[], satisfied=[])
    store.save_judgement(verdicts=[], series=[], marks=[], groups=[], pending=[], satisfied=[], events=[
        {"node_class": "a100x8", "probe": "gemm", "started_at": 1.0, "ended_at": 5.0, "flagged": 0, "sampled": 0,
         "series": [], "text": "y; over"}])
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
