"""GPU UUIDs (issue 26 item 5): each node's GPU inventory in the store from its runs' environments, a
``gpu_uuid`` label on every per-GPU series of ``/metrics`` (one per GPU index), the API's node documents and the
findings, verdicts and drain reasons of a slow GPU. With the real H100 documents (tests/fixtures/h100)."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import pytest

from healthd.config import JudgeSettings
from healthd.http import node_detail, nodes_page
from healthd.judge.engine import Judge
from healthd.judge.persist import run_from_collected
from healthd.metrics import render_text
from healthd.model import Node, Outcome, ProbeResult
from healthd.parsers.expand import expand_result
from healthd.parsers.healthd_json import parse_result
from healthd.remediation.decide import drain_reason
from healthd.store import GpuSeen, Store
from healthd.store.rows import RecommendationRow
from healthd.store.schema import SCHEMA_VERSION
from tests.old_stores import store_at
from tests.unit.test_h100_documents import CLASS, FIXTURES, LOAD, collected, daemon_doc, listed_runs

H100_UUID = "GPU-0061a31b-0dc7-4f7c-6398-aa4b02af5cfc"
SPARE = "GPU-7a2e51c0-1111-2222-3333-444455556666"
NAME = "NVIDIA H100 80GB HBM3"


def h100(name: str) -> ProbeResult:
    return expand_result(parse_result((FIXTURES / "standalone" / f"{name}.json").read_text()))


def with_gpus(doc: ProbeResult, uuids: list[str], *, at: float) -> ProbeResult:
    """``doc`` as a node with ``uuids`` (index order) would have sent it at ``at``: each rank lists every GPU,
    and each per-GPU measurement of GPU 0 is repeated for every GPU."""
    assert doc.environment is not None
    device = doc.environment.ranks[0].devices[0]
    devices = [device.model_copy(update={"index": i, "uuid": u}) for i, u in enumerate(uuids)]
    ranks = [r.model_copy(update={"devices": devices}) for r in doc.environment.ranks]
    measurements = [m.model_copy(update={"labels": {**m.labels, "gpu": str(i)}}) for m in doc.measurements
                    if m.labels.get("gpu") == "0" for i in range(len(uuids))]
    return doc.model_copy(update={"environment": doc.environment.model_copy(update={"ranks": ranks}),
                                  "measurements": measurements, "started_at": at - 10, "finished_at": at})


def store_doc(store: Store, run_id: str, doc: ProbeResult, node: str = "vm") -> None:
    store.add_run(run_id=run_id, probe=doc.probe, nodes=[node], backend="local", job_id=None,
                  submitted_at=doc.started_at, result_path=None)
    assert store.finish_run(run_id, outcome=doc.outcome, reason=doc.reason, finished_at=doc.finished_at,
                            started_at=doc.started_at, result=doc)


def test_a_finished_run_stores_the_gpus_its_environment_lists(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.sqlite")
    doc = h100("full-gemm")
    store_doc(store, "g1", doc)
    assert store.gpu_inventory() == {"vm": (GpuSeen(0, H100_UUID, NAME, doc.finished_at, True),)}
    assert store.gpu_inventory(["other"]) == {}
    snap = store.snapshot(nodes=["vm"])
    assert snap.gpus["vm"][0].uuid == H100_UUID


def test_a_gpu_that_disappears_keeps_its_uuid_and_is_no_longer_present(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.sqlite")
    gemm = h100("full-gemm")
    store_doc(store, "two", with_gpus(gemm, [H100_UUID, SPARE], at=1000.0))
    store_doc(store, "one", with_gpus(gemm, [H100_UUID], at=2000.0))
    assert store.gpu_inventory(["vm"])["vm"] == (GpuSeen(0, H100_UUID, NAME, 2000.0, True),
                                                 GpuSeen(1, SPARE, NAME, 1000.0, False))
    # an older result stored later (an ingest) does not bring the GPU back
    store_doc(store, "old", with_gpus(gemm, [H100_UUID, SPARE], at=1500.0))
    assert [g.present for g in store.gpu_inventory()["vm"]] == [True, False]
    # the real document of the H100 with no GPU visible (a CPU run): every GPU gone, the UUIDs kept
    nogpu = h100("nogpu-env")
    assert nogpu.environment is not None and nogpu.environment.device_type == "cpu"
    store_doc(store, "cpu", nogpu.model_copy(update={"started_at": 2990.0, "finished_at": 3000.0}))
    assert store.gpu_inventory()["vm"] == (GpuSeen(0, H100_UUID, NAME, 2000.0, False),
                                           GpuSeen(1, SPARE, NAME, 1000.0, False))


def test_one_batch_with_a_node_twice_and_one_older_result_keeps_the_order_of_a_run_by_run_store(
        tmp_path: Path) -> None:
    from healthd.store.runs import FinishedRun

    gemm = h100("full-gemm")
    docs = [("a", "vm", with_gpus(gemm, [H100_UUID, SPARE], at=1000.0)),
            ("b", "vm", with_gpus(gemm, [H100_UUID], at=2000.0)),
            ("c", "vm2", with_gpus(gemm, [SPARE], at=1500.0)),
            ("d", "vm3", with_gpus(gemm, [H100_UUID], at=500.0))]
    inventories = []
    for batched in (True, False):
        store = Store(tmp_path / f"{batched}.sqlite")
        store_doc(store, "newer", with_gpus(gemm, [SPARE, H100_UUID], at=900.0), node="vm3")
        for run_id, node, doc in docs:
            store.add_run(run_id=run_id, probe=doc.probe, nodes=[node], backend="local", job_id=None,
                          submitted_at=doc.started_at, result_path=None)
        finished = [FinishedRun(run_id, doc.outcome, doc.reason, doc.finished_at, doc, doc.started_at)
                    for run_id, _, doc in docs]
        for batch in ([finished] if batched else [[f] for f in finished]):
            store.finish_runs(batch)
        inventories.append(store.gpu_inventory())
        store.close()
    assert inventories[0] == inventories[1]
    assert inventories[0]["vm"] == (GpuSeen(0, H100_UUID, NAME, 2000.0, True), GpuSeen(1, SPARE, NAME, 1000.0, False))
    assert [g.uuid for g in inventories[0]["vm3"]] == [SPARE, H100_UUID], "an older result changes nothing"


def test_a_version_9_store_gains_an_empty_inventory(tmp_path: Path) -> None:
    path = tmp_path / "v9.sqlite"
    db = store_at(path, 9)
    db.commit()
    db.close()
    store = Store(path)
    assert store.schema_version == SCHEMA_VERSION
    assert store.gpu_inventory() == {}
    store_doc(store, "g1", h100("full-gemm"))
    assert [g.uuid for g in store.gpu_inventory()["vm"]] == [H100_UUID]


def uuids_by_gpu(text: str, family: str) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for line in text.splitlines():
        if line.startswith(family + "{"):
            gpu = re.search(r'[{,]gpu="([^"]*)"', line)
            uuid = re.search(r'gpu_uuid="([^"]*)"', line)
            assert gpu is not None and uuid is not None, line
            out.setdefault(gpu[1], set()).add(uuid[1])
    return out


def test_every_per_gpu_series_carries_one_uuid_per_gpu_after_a_swap(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.sqlite")
    store.upsert_nodes([Node("vm", "idle", gpus=2, gpu_type="h100", node_class=CLASS)], seen_at=1.0)
    gemm = h100("full-gemm")
    store_doc(store, "before", with_gpus(gemm, [H100_UUID, SPARE], at=1000.0))
    swapped = "GPU-0b5e8d11-aaaa-bbbb-cccc-ddddeeeeffff"
    store_doc(store, "after", with_gpus(gemm, [H100_UUID, swapped], at=2000.0))
    assert store.gpu_uuids(["vm", "n2"]) == {"vm": {"0": H100_UUID, "1": swapped}}
    for detail in ("summary", "full"):
        text = render_text(store, "local", detail)  # type: ignore[arg-type]
        assert uuids_by_gpu(text, "healthd_gemm_flop_per_second") == {"0": {H100_UUID}, "1": {swapped}}, detail
        assert SPARE not in text
        assert 'healthd_gemm_flop_per_second{dtype="bf16",gpu="1",gpu_uuid="' + swapped + '",node="vm"}' in text
    # a series without a gpu label has none; a node the probes never listed GPUs of has it empty
    full = render_text(store, "local", "full")
    assert not any("gpu_uuid" in line for line in full.splitlines()
                   if line.startswith("healthd_node_probe_last_run_timestamp_seconds"))
    on_n2 = with_gpus(gemm, [H100_UUID], at=3000.0)
    on_n2 = on_n2.model_copy(update={"environment": None, "nodes": ["n2"], "measurements": [
        m.model_copy(update={"node": "n2"}) for m in on_n2.measurements]})
    store_doc(store, "n2", on_n2, node="n2")
    assert uuids_by_gpu(render_text(store, "local"), "healthd_gemm_flop_per_second")["0"] == {H100_UUID, ""}


def test_the_node_documents_carry_the_gpus(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.sqlite")
    store_doc(store, "two", with_gpus(h100("full-gemm"), [H100_UUID, SPARE], at=1000.0))
    store_doc(store, "one", with_gpus(h100("full-gemm"), [H100_UUID], at=2000.0))
    doc = node_detail(store, "vm")
    assert doc["gpu_inventory"] == [
        {"index": 0, "uuid": H100_UUID, "name": NAME, "present": True, "seen_at": 2000.0},
        {"index": 1, "uuid": SPARE, "name": NAME, "present": False, "seen_at": 1000.0}]
    gemm = doc["probes"]["gemm"]["measurements"]
    # gpu 1's last figures are from the run that still found it: named by the UUID it had
    assert {(m["labels"]["gpu"], m["gpu_uuid"]) for m in gemm} == {("0", H100_UUID), ("1", SPARE)}
    (page_node,) = nodes_page(store, "")["nodes"]
    assert [g["uuid"] for g in page_node["gpu_inventory"]] == [H100_UUID, SPARE]


def test_a_slow_gpu_is_named_by_its_uuid_in_the_finding_verdict_and_drain_reason() -> None:
    """The real documents of the H100 under a competing load: GEMM at ~37% is under the H100 floor."""
    judge = Judge(JudgeSettings())
    node = Node("vm", "idle", gpus=1, gpu_type="nvidia_h100_80gb_hbm3", node_class=CLASS)
    verdicts = {}
    for row in (r for r in listed_runs() if r.probe == "gemm" and r.start < LOAD[1]):
        d = daemon_doc(row.run_id)
        run = run_from_collected(collected(d, row.run_id), d.finished_at)
        assert run.gpu_uuids == {("vm", "0"): H100_UUID}
        out = judge.evaluate([run], [node], now=d.finished_at + 1)
        verdicts.update({v.probe: v for v in out.verdicts})
        recommended = [r for r in out.recommendations if r.probe == "gemm"]
    verdict = verdicts["gemm"]
    assert (verdict.outcome, verdict.reason_code) == (Outcome.FAIL, "below_floor")
    assert verdict.reason.startswith(f"gpu 0 ({H100_UUID}) flop_per_second{{dtype="), verdict.reason
    assert verdict.evidence["gpu"] == "0" and verdict.evidence["gpu_uuid"] == H100_UUID
    (rec,) = recommended
    assert rec.text == verdict.reason
    row = RecommendationRow(1, "vm", "gemm", rec.outcome.value, str(rec.reason_code), rec.text, dict(rec.evidence),
                            rec.at, rec.at, "active", None, "", False, "")
    text = drain_reason("healthd:", row)
    assert f"gpu 0 ({H100_UUID}) flop_per_second" in text and text.startswith("healthd: below_floor gemm"), text


def test_a_finding_keeps_its_uuid_through_the_store(tmp_path: Path) -> None:
    """A judge restarted from the store names the GPU as the one that judged it did."""
    from healthd.judge.persist import judge_runs, load_judge

    store = Store(tmp_path / "s.sqlite")
    node = Node("vm", "idle", gpus=1, gpu_type="nvidia_h100_80gb_hbm3", node_class=CLASS)
    store.upsert_nodes([node], seen_at=1.0)
    judge = Judge(JudgeSettings())
    rows = [r for r in listed_runs() if r.probe == "gemm" and LOAD[0] <= r.start < LOAD[1]][:1]
    d = daemon_doc(rows[0].run_id)
    out = judge_runs(judge, store, [run_from_collected(collected(d, rows[0].run_id), d.finished_at)],
                     now=d.finished_at + 1, nodes=[node])
    (mark,) = out.marks
    assert mark.findings and all(f.gpu_uuid == H100_UUID for f in mark.findings)
    again = load_judge(store, JudgeSettings(), now=d.finished_at + 2)
    (restored,) = again.marks[("vm", "gemm")]
    assert [f.gpu_uuid for f in restored.findings] == [f.gpu_uuid for f in mark.findings]
    assert restored.text == mark.text and H100_UUID in mark.text


def test_healthd_status_names_the_gpus_by_uuid(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from healthd.cli import main

    store = Store(tmp_path / "state" / "healthd.sqlite")
    store_doc(store, "two", with_gpus(h100("full-gemm"), [H100_UUID, SPARE], at=1000.0))
    store_doc(store, "one", with_gpus(h100("full-gemm"), [H100_UUID], at=2000.0))
    store.close()
    config = tmp_path / "healthd.toml"
    config.write_text(f'state_dir = "{tmp_path / "state"}"\n')
    main(["status", "--config", str(config)])
    out = capsys.readouterr().out
    assert f"  gpu 0 ({H100_UUID}) {NAME}\n" in out
    assert f"  gpu 1 ({SPARE}) {NAME}  (not found by the newest run)\n" in out
    assert re.search(rf"flop_per_second .* dtype=bf16,gpu=1 \({SPARE}\)", out), out


def test_baselines_floors_and_findings_of_a_gpu_carry_its_uuid() -> None:
    from healthd.metrics import NodeView, _fragment, node_samples
    from healthd.model import Verdict
    from healthd.store.rows import JudgedSeries

    labels = {"dtype": "bf16", "gpu": "1"}
    series = JudgedSeries("vm", "gemm", "flop_per_second", labels, 2.6e14, 10.0, 5.25e14, 7e14)
    finding = Verdict("vm", "gemm", Outcome.FAIL, "gpu 1 ...", "below_floor", ("r1",),
                      {"layer": "below_floor", "gpu": "1", "dtype": "bf16", "value": 2.6e14, "reference": 5.25e14,
                       "stage": "confirmed"}, 10.0)
    view = NodeView("vm", series=(series,), verdicts=(finding,),
                    gpus=(GpuSeen(0, H100_UUID, NAME, 1.0), GpuSeen(1, SPARE, NAME, 1.0)))
    text = b"".join(_fragment(node_samples(view, "full", {})).values()).decode()
    assert f'healthd_baseline_gemm_flop_per_second{{dtype="bf16",gpu="1",gpu_uuid="{SPARE}",node="vm"}} 7000' in text
    assert f'healthd_floor_gemm_flop_per_second{{dtype="bf16",gpu="1",gpu_uuid="{SPARE}",node="vm"}}' in text
    finding_lines = [line for line in text.splitlines() if line.startswith("healthd_node_finding")]
    assert len(finding_lines) == 4 and all(f'gpu="1",gpu_uuid="{SPARE}"' in line for line in finding_lines)
    # the UUID a check or the judged run named stays (the GPU the finding is about)
    named_verdict = replace(finding, evidence={**finding.evidence, "gpu_uuid": H100_UUID})
    text = b"".join(_fragment(node_samples(replace(view, verdicts=(named_verdict,)), "full", {})).values()).decode()
    assert all(f'gpu_uuid="{H100_UUID}"' in line for line in text.splitlines()
               if line.startswith("healthd_node_finding"))
