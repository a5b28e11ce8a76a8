"""The ``compute`` probe's result document (a real CPU run) as healthd reads and judges it."""

from __future__ import annotations

from pathlib import Path

from healthd.config import JudgeSettings
from healthd.judge.engine import Judge
from healthd.judge.model import MeasurementInput, RunInput
from healthd.model import Node, Outcome
from healthd.parsers.healthd_json import parse_result

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "promtool" / "probe_results" / "compute.json"


def test_the_real_cpu_result_parses_per_gpu() -> None:
    result = parse_result(FIXTURE.read_text())
    assert result.probe == "compute" and result.outcome.value == "pass"
    got = {(m.name, m.labels.get("gpu"), m.labels.get("dtype")) for m in result.measurements}
    assert got == {("mlp_flop_per_second", g, "fp32") for g in ("0", "1")} | {
        ("embedding_bag_bytes_per_second", g, None) for g in ("0", "1")}
    p = result.params
    assert p["mlp_flop_per_step"] == 6 * p["mlp_batch"] * sum(
        a * b for a, b in zip(p["mlp_layers"], p["mlp_layers"][1:], strict=False))
    assert p["emb_bytes_per_lookup"] == p["emb_bags"] * p["emb_nnz"] * p["emb_dim"] * 4
    assert {c.name for c in result.checks} >= {"compute.mlp.finite", "compute.embedding_bag.result"}


def _run(run_id: str, names: set[str]) -> RunInput:
    result = parse_result(FIXTURE.read_text())
    ms = tuple(MeasurementInput(m.name, m.value, dict(m.labels), "vm") for m in result.measurements if m.name in names)
    return RunInput(run_id, "compute", ("vm",), Outcome.PASS, "", 1000.0, ms)


def test_judged_like_gemm_and_fails_closed_without_its_flops() -> None:
    nodes = [Node("vm", "idle", gpus=2, node_class="gpux2")]
    judge = Judge(JudgeSettings())
    out = judge.evaluate([_run("a" * 16, {"mlp_flop_per_second", "embedding_bag_bytes_per_second"})], nodes, now=1e3)
    assert [(v.outcome, v.reason_code) for v in out.verdicts] == [(Outcome.PASS, "ok")]
    out = judge.evaluate([_run("b" * 16, {"embedding_bag_bytes_per_second"})], nodes, now=2e3)
    assert [(v.outcome, v.reason_code) for v in out.verdicts] == [(Outcome.ERROR, "measurement_missing")]
