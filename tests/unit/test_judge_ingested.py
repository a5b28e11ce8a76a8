"""Ingested results feed the daemon's judgement like probe results: once each, in the order they were
stored, with a watermark that survives a restart."""

from __future__ import annotations

from pathlib import Path

from healthd.config import JudgeSettings
from healthd.judge.persist import judge_ingested, load_judge
from healthd.model import Node, Outcome
from healthd.store import Store
from probes.result import Check, Measurement, ProbeResult

NODES = [Node(f"n{i}", "idle", gpus=8, gpu_type="h100", node_class="h100x8") for i in range(6)]


def ingest(store: Store, node: str, at: float, *, flop: float = 700e12, ok: bool = True, k: int = 0) -> str:
    result = ProbeResult(
        probe="gemm", run_id=f"ingest-param-compute-{node}-{k:016x}", outcome=Outcome.PASS if ok else Outcome.FAIL,
        reason="" if ok else "wrong data", started_at=at - 30, finished_at=at, nodes=[node],
        measurements=[Measurement(name="flop_per_second", value=flop, labels={"gpu": str(g), "dtype": "bf16"},
                                  node=node) for g in range(8)],
        checks=[Check(name="gemm.verify", ok=ok, detail="ok" if ok else "wrong data", node=node)])
    return store.record_result(result, nodes=[node], backend="ingest", source="ingest", result_path=None)


def test_ingested_runs_are_judged_once_and_the_watermark_survives_a_restart(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.sqlite")
    store.upsert_nodes(NODES, 1000.0)
    ingest(store, "n0", 500.0, k=99)  # before the daemon first looked: history, not judged
    judge = load_judge(store, JudgeSettings(), now=1000.0)
    assert judge_ingested(judge, store, now=1000.0) is None
    assert judge.verdicts == {}

    ingest(store, "n1", 1100.0, ok=False, k=1)
    out = judge_ingested(judge, store, now=1200.0)
    assert out is not None and [(v.node, v.outcome, v.reason_code) for v in out.verdicts] == [
        ("n1", Outcome.DEGRADED, "check_failed")]
    assert judge_ingested(judge, store, now=1300.0) is None  # nothing new: nothing judged again

    restarted = load_judge(store, JudgeSettings(), now=1400.0)
    assert judge_ingested(restarted, store, now=1400.0) is None
    ingest(store, "n1", 1500.0, ok=False, k=2)  # a second bad run confirms the first
    out = judge_ingested(restarted, store, now=1600.0)
    assert out is not None
    (rec,) = out.recommendations
    assert (rec.node, rec.outcome, str(rec.reason_code)) == ("n1", Outcome.FAIL, "check_failed")


def test_a_batch_judged_again_after_a_crash_counts_once(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.sqlite")
    store.upsert_nodes(NODES, 1000.0)
    judge = load_judge(store, JudgeSettings(), now=1000.0)
    judge_ingested(judge, store, now=1000.0)
    ingest(store, "n2", 1100.0, ok=False, k=1)
    (run,) = [r for _, r in store.ingested_runs(after=0)]
    judge.evaluate([run], NODES, now=1150.0)  # judged, then the daemon died before saving
    out = judge_ingested(judge, store, now=1200.0)
    assert out is not None and out.marks == [] and out.recommendations == []
    assert store.ingest_watermark() == store.last_ingest_position()
