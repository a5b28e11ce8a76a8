"""The judgement metric families, from the store's exposition: names, labels, values, and promtool's lint."""

from __future__ import annotations

import shutil
import subprocess
from collections import defaultdict
from dataclasses import replace
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from healthd.config import JudgeSettings
from healthd.judge.metrics import FINDING_LABELS, confirmed_finding
from healthd.judge.model import FleetEvent, JudgeOutput, SeriesKey, SeriesState
from healthd.metrics import Detail, render_text
from healthd.model import Outcome, Verdict
from healthd.store import Store
from tests.unit.test_judge_engine import Fleet

FINDING_FAMILIES = ("healthd_node_finding", "healthd_node_finding_value", "healthd_node_finding_reference",
                    "healthd_node_finding_drop_ratio")


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
    on_node = FleetEvent("h100x8", "nccl", 1.0, None, 9, 12, (), "x", key="busbw{scope=node}", scope="node")
    also_node = replace(on_node, key="time_seconds{scope=node}", text="x2")
    on_group = replace(on_node, key="busbw{scope=group}", scope="group", text="x3")
    events = [on_node, also_node, on_group, FleetEvent("a100x8", "gemm", 1.0, None, 9, 12, (), "y")]
    store.save_judgement(JudgeOutput(at=1.0, verdicts=[Verdict("n1", "gemm", Outcome.FAIL, "slow", "below_floor"),
                                                       Verdict("n2", "nccl", Outcome.PASS, "ok", "ok")],
                                     series=series, fleet_events=events))
    store.save_judgement(JudgeOutput(at=5.0, fleet_events=[
        FleetEvent("a100x8", "gemm", 1.0, 5.0, 0, 0, (), "y; over"), replace(also_node, ended_at=5.0),
        replace(on_group, ended_at=5.0)]))
    leaf = FleetEvent("h100x8", "nccl", 2.0, None, 3, 16, (), "switch leaf3", "leaf3", 0, ("n1", "n2", "n3"),
                      ("leaf3",))
    spine = FleetEvent("h100x8", "gemm", 2.0, None, 40, 64, (), "switch spine1", "spine1", 1, ("n4",), ("spine1",))
    store.save_judgement(JudgeOutput(at=2.0, switch_findings=[leaf, spine]))
    store.save_judgement(JudgeOutput(at=3.0, switch_findings=[replace(spine, ended_at=3.0)]))
    for probe, outcome, code in (("gemm", "degraded", "fleet_outlier"), ("nccl", "fail", "localised")):
        store.upsert_recommendation(node="n1", probe=probe, outcome=outcome, reason_code=code, text="t",
                                    evidence={}, at=2.0)
    store.add_audit(at=3.0, actor="healthd", action="drain", node="n1", result="refused", reason="breaker")
    store.set_remediation_state("breaker", {"open": True, "opened_at": 3.0, "reason": "r", "closed_at": None})
    return store


def by_sample(store: Store, detail: Detail = "full") -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    """Every sample of the store's exposition, by sample name, then by sorted labels."""
    out: dict[str, dict[tuple[tuple[str, str], ...], float]] = defaultdict(dict)
    for family in text_string_to_metric_families(render_text(store, "slurm", detail)):
        for s in family.samples:
            out[s.name][tuple(sorted(s.labels.items()))] = s.value
    return out


JUDGE_SAMPLES = [
    "healthd_baseline_gemm_flop_per_second", "healthd_baseline_nccl_busbw_bytes_per_second",
    "healthd_drain_recommended", "healthd_fleet_event_active", "healthd_floor_gemm_flop_per_second",
    "healthd_floor_nccl_busbw_bytes_per_second", "healthd_node_probe_baseline_ratio",
    "healthd_node_probe_floor_ratio", "healthd_remediation_actions_total", "healthd_remediation_breaker_open",
    "healthd_switch_finding"]


def test_families_and_values(tmp_path: Path) -> None:
    store = filled_store(tmp_path)
    samples = by_sample(store)
    assert not set(FINDING_FAMILIES) & set(samples), "no confirmed finding: no series"
    assert sorted(set(samples) & {*JUDGE_SAMPLES, "healthd_node_verdict"}) == sorted(
        [*JUDGE_SAMPLES, "healthd_node_verdict"])
    assert samples["healthd_switch_finding"] == {
        (("level", "0"), ("probe", "nccl"), ("switch", "leaf3")): 1.0,
        (("level", "1"), ("probe", "gemm"), ("switch", "spine1")): 0.0}
    # one sample per (class, probe, scope): the node-scope one stays 1 while one of its two series' events is on;
    # an event stored without a series (the a100x8 one) is on every series of its probe
    assert samples["healthd_fleet_event_active"] == {
        (("node_class", "a100x8"), ("probe", "gemm"), ("scope", "*")): 0.0,
        (("node_class", "h100x8"), ("probe", "nccl"), ("scope", "group")): 0.0,
        (("node_class", "h100x8"), ("probe", "nccl"), ("scope", "node")): 1.0}
    assert samples["healthd_floor_nccl_busbw_bytes_per_second"] == {
        (("node", "n1"), ("nodes", "2"), ("scope", "group"), ("size_bytes", "1073741824")): 1e11}
    assert samples["healthd_baseline_nccl_busbw_bytes_per_second"] == {
        (("node", "n2"), ("scope", "node"), ("size_bytes", "1073741824")): 4.8e11}
    # the worst judged figure of the probe over its reference (n1's GEMM: at its baseline, 4/3 of its floor)
    assert samples["healthd_node_probe_baseline_ratio"] == {(("node", "n1"), ("probe", "gemm")): 1.0,
                                                           (("node", "n2"), ("probe", "nccl")): 1.0}
    assert samples["healthd_node_probe_floor_ratio"][(("node", "n1"), ("probe", "gemm"))] == 7e14 / 5.25e14
    # one series per node: the failing recommendation wins over the degraded one; known nodes show 0
    assert samples["healthd_drain_recommended"] == {(("node", "n1"), ("reason_code", "localised")): 1.0,
                                                    (("node", "n2"), ("reason_code", "")): 0.0}
    assert samples["healthd_fleet_event_active"][
        (("node_class", "h100x8"), ("probe", "nccl"), ("scope", "node"))] == 1.0
    actions = samples["healthd_remediation_actions_total"]
    assert actions[(("action", "drain"), ("result", "refused"))] == 1.0
    assert actions[(("action", "undrain"), ("result", "done"))] == 0.0
    assert samples["healthd_remediation_breaker_open"] == {(): 1.0}
    store.close()


def test_summary_keeps_the_ratio_and_drops_references_and_zero_rows(tmp_path: Path) -> None:
    store = filled_store(tmp_path)
    samples = by_sample(store, "summary")
    assert not [name for name in samples if name.startswith(("healthd_baseline_", "healthd_floor_"))]
    assert "healthd_node_probe_floor_ratio" not in samples
    assert samples["healthd_node_probe_baseline_ratio"][(("node", "n1"), ("probe", "gemm"))] == 1.0
    assert samples["healthd_drain_recommended"] == {(("node", "n1"), ("reason_code", "localised")): 1.0}
    assert samples["healthd_node_verdict"] == {
        (("node", "n1"), ("outcome", "fail"), ("probe", "gemm"), ("reason_code", "below_floor")): 1.0,
        (("node", "n2"), ("outcome", "pass"), ("probe", "nccl"), ("reason_code", "ok")): 1.0}
    store.close()


@pytest.mark.parametrize("detail", ["summary", "full"])
def test_exposition_is_valid(tmp_path: Path, detail: Detail) -> None:
    store = filled_store(tmp_path)
    text = render_text(store, "slurm", detail)
    assert 'healthd_node_verdict{node="n1",outcome="fail",probe="gemm",reason_code="below_floor"} 1.0' in text
    assert 'healthd_remediation_actions_total{action="drain",result="refused"} 1.0' in text
    promtool = shutil.which("promtool")
    if promtool is not None:
        lint = subprocess.run([promtool, "check", "metrics"], input=text.encode(), capture_output=True, timeout=30,
                              check=False)
        assert lint.returncode == 0, lint.stdout.decode() + lint.stderr.decode()
    store.close()


def finding_samples(store: Store) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    samples = by_sample(store, "summary")
    return {name: samples.get(name, {}) for name in FINDING_FAMILIES}


def test_a_confirmed_finding_is_exported_from_confirmation_until_it_clears(tmp_path: Path) -> None:
    """The judge's own judgement, per node and probe: nothing while one run is suspect, the finding with its
    figure, reference and drop once a re-probe confirms it, nothing again when passes clear it."""
    fleet = Fleet([f"n{i}" for i in range(4)], JudgeSettings(floors=[], default_floors=False))  # no class, no floor
    fleet.store = Store(tmp_path / "s.sqlite")
    fleet.healthy_gemm_rounds()
    assert finding_samples(fleet.store) == {n: {} for n in FINDING_FAMILIES}

    fleet.feed([fleet.gemm(n, {5: 350e12} if n == "n3" else None) for n in fleet.names], advance=60)
    assert fleet.judge.verdicts[("n3", "gemm")].outcome is Outcome.DEGRADED
    assert finding_samples(fleet.store) == {n: {} for n in FINDING_FAMILIES}, "suspected, not confirmed yet"

    fleet.feed([fleet.gemm("n3", {5: 350e12}, priority=True)])
    found = finding_samples(fleet.store)
    labels = (("collective", ""), ("dtype", "bf16"), ("gpu", "5"), ("gpu_uuid", ""), ("node", "n3"), ("probe", "gemm"),
              ("reason_code", "fleet_outlier"), ("reference", "peers"), ("source", "probe"))  # the node's other GPUs
    assert found["healthd_node_finding"] == {labels: 1.0}
    value, reference = found["healthd_node_finding_value"][labels], found["healthd_node_finding_reference"][labels]
    assert value < 351e12 and abs(reference - 700e12) < 10e12
    assert abs(found["healthd_node_finding_drop_ratio"][labels] - (1 - value / reference)) < 1e-9
    assert 0.49 < found["healthd_node_finding_drop_ratio"][labels] < 0.51

    fleet.feed([fleet.gemm("n3")])
    assert finding_samples(fleet.store)["healthd_node_finding"] == {labels: 1.0}, "2 of the last 3 still bad"
    fleet.feed([fleet.gemm("n3")])
    assert finding_samples(fleet.store) == {n: {} for n in FINDING_FAMILIES}


def test_a_failed_check_is_a_finding_without_a_figure() -> None:
    v = Verdict("n1", "env", Outcome.FAIL, "7 of 8 GPUs", "check_failed", ("a", "b"),
                {"confirmed": "2/3", "stage": "confirmed"})
    f = confirmed_finding(v)
    assert f is not None and (f.value, f.reference, f.drop) == (None, None, None)
    assert dict(zip(FINDING_LABELS, f.labels, strict=True)) == {
        "node": "n1", "probe": "env", "source": "probe", "reason_code": "check_failed", "reference": "", "gpu": "",
        "dtype": "", "collective": "", "gpu_uuid": ""}
    assert confirmed_finding(Verdict("n1", "env", Outcome.FAIL, "x", "check_failed", ("a",), {})) is None
    assert confirmed_finding(Verdict("n1", "env", Outcome.PASS, "ok", "ok", ("a",), {"stage": "confirmed"})) is None
