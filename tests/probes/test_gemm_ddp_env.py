"""gemm, ddp and env probes with real ranks on CPU."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from probes.result import Outcome, ProbeResult
from tests.probes.helpers import dump, run_probe

pytestmark = pytest.mark.slow


def test_gemm_per_rank_on_cpu() -> None:
    run = run_probe(["gemm", "--size", "256", "--iters", "4", "--warmup", "1", "--copy-bytes", "8M",
                     "--warmup-seconds", "0.05", "--run-id", "r-1"])
    assert run.returncode == 0, run.stderr[-3000:]
    result = run.result
    assert result.outcome is Outcome.PASS, dump(result)
    node = result.nodes[0]
    flops = {(m.labels["gpu"], m.labels["dtype"]): m for m in result.measurements if m.name == "flop_per_second"}
    assert set(flops) == {("0", "fp32"), ("0", "bf16"), ("1", "fp32"), ("1", "bf16")}
    for m in flops.values():
        assert m.node == node
        assert 1e8 < m.value < 1e14  # a CPU core: between 0.1 GFLOP/s and 100 TFLOP/s
    bw = {m.labels["gpu"]: m for m in result.measurements if m.name == "memory_bandwidth_bytes_per_second"}
    assert set(bw) == {"0", "1"}
    assert all(1e8 < m.value < 1e12 and m.node == node for m in bw.values())
    checks = {(c.gpu, c.name): c for c in result.checks}
    assert set(checks) == {(g, f"gemm.{d}.result") for g in (0, 1) for d in ("fp32", "bf16")}
    assert all(c.ok and c.node == node for c in checks.values())
    assert checks[(0, "gemm.fp32.result")].detail.endswith("(tolerance 0.001)")
    assert result.params["size"] == 256
    assert result.params["dtypes"] == ["fp32", "bf16"]
    assert result.params["skipped_dtypes"] == {}  # fp16/fp8 run on CPU only when asked (emulated, slow)
    assert sorted(result.params["order"]) == ["bf16", "fp32"] and result.params["warmup_seconds"] == 0.05
    assert result.params["telemetry"] == "not a GPU run"  # no NVML reading on CPU
    assert {m.name for m in result.measurements} == {"flop_per_second", "memory_bandwidth_bytes_per_second"}
    state = {(s["gpu"], s["dtype"]): s for s in result.params["gpu_state"]}
    assert set(state) == {(g, d) for g in (0, 1) for d in ("fp32", "bf16")}
    assert all(s["warmup_s"] >= 0.05 and s["iters"] == 4 for s in state.values())


def test_gemm_fp16_fp8_and_tf32_paths_on_cpu() -> None:
    """fp16 matmul runs on CPU in recent torch, fp8 where ``torch._scaled_mm`` has a CPU kernel; tf32 is a
    CUDA matmul mode and is skipped with the reason (its flag path: ``test_tf32_is_a_cuda_flag``)."""
    run = run_probe(["gemm", "--dtypes", "fp16,fp8,tf32", "--size", "64", "--iters", "2", "--warmup", "0",
                     "--copy-bytes", "1M", "--nproc", "1"])
    assert run.returncode == 0, run.stderr[-3000:]
    result = run.result
    assert result.outcome is Outcome.PASS, dump(result)
    skipped = result.params["skipped_dtypes"]
    assert skipped["tf32"] == "not supported on this device (tf32 is a CUDA matmul mode)"
    measured = {m.labels["dtype"]: m.value for m in result.measurements if m.name == "flop_per_second"}
    assert "fp16" in measured and measured["fp16"] > 0
    checks = {c.name: c for c in result.checks if c.name.startswith("gemm.")}
    assert checks["gemm.fp16.result"].ok and checks["gemm.fp16.result"].detail.endswith("(tolerance 0.02)")
    if "fp8" in skipped:
        pytest.skip(f"fp8 cannot run here: {skipped['fp8']}")
    assert measured["fp8"] > 0 and checks["gemm.fp8.result"].ok


def test_tf32_is_a_cuda_flag() -> None:
    import torch

    from probes.gemm import set_tf32

    before = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    try:
        assert set_tf32("tf32", "cuda") is True
        assert torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32
        assert set_tf32("fp32", "cuda") is False
        assert not torch.backends.cuda.matmul.allow_tf32 and not torch.backends.cudnn.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = True
        assert set_tf32("tf32", "cpu") is False and torch.backends.cuda.matmul.allow_tf32  # CPU: left alone
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before


def test_gemm_wrong_result_names_the_gpu() -> None:
    run = run_probe(
        ["gemm", "--size", "128", "--iters", "2", "--warmup", "0", "--dtypes", "fp32", "--copy-bytes", "1M"],
        env={"HEALTHD_PROBE_FAULT": "corrupt:1"},
    )
    assert run.returncode == 0, run.stderr[-3000:]
    result = run.result
    assert result.outcome is Outcome.FAIL
    failed = [c for c in result.checks if not c.ok]
    assert [(c.name, c.gpu, c.rank) for c in failed] == [("gemm.fp32.result", 1, 1)]
    error = float(failed[0].detail.removeprefix("max |C - ref| / sqrt(K) = ").split()[0])
    assert 990 < error < 1010  # the injected element is 1000 * sqrt(K), the reference a few sqrt(K)
    assert failed[0].detail.endswith("(tolerance 0.001)")
    assert result.reason == f"gemm.fp32.result: {failed[0].detail}"


def _ddp(extra: list[str], env: dict[str, str] | None = None) -> ProbeResult:
    run = run_probe(["ddp", "--steps", "4", "--warmup", "1", *extra], env=env)
    assert run.returncode == 0, run.stderr[-3000:]
    return run.result


def test_ddp_two_ranks() -> None:
    result = _ddp([])
    assert result.outcome is Outcome.PASS, dump(result)
    m = {(x.name, x.labels.get("quantile")): x for x in result.measurements}
    assert set(m) == {
        ("throughput_samples_per_second", None),
        ("step_seconds", "0.5"),
        ("step_seconds", "0.9"),
        ("single_rank_throughput_samples_per_second", None),
        ("scaling_efficiency_ratio", None),
        ("model_flop_per_second", None),
    }
    batch = result.params["batch_size"]
    assert batch == 4 and result.params["steps"] == 4
    p50 = m[("step_seconds", "0.5")].value
    assert m[("throughput_samples_per_second", None)].value == pytest.approx(2 * batch / p50)
    assert m[("step_seconds", "0.9")].value >= p50
    single = m[("single_rank_throughput_samples_per_second", None)]
    assert single.per_rank is not None and len(single.per_rank) == 2
    assert single.value == pytest.approx(sum(single.per_rank) / 2)
    eff = m[("scaling_efficiency_ratio", None)].value
    assert eff == pytest.approx(m[("throughput_samples_per_second", None)].value / 2 / single.value)
    assert 0 < eff < 5
    assert [(c.name, c.ok, c.detail) for c in result.checks] == [
        ("ddp.parameters_identical", True, "0 parameter elements differ across ranks")
    ]
    assert result.params["parameters"] == 136_960  # by hand in tests/probes/test_model_flops.py
    flops = m[("model_flop_per_second", None)]
    assert flops.labels == {"dtype": "fp32"}
    tokens = batch * result.params["seq_len"]
    assert flops.value == pytest.approx(6 * 136_960 * tokens / p50)
    step_p50 = {r: v for r, v in enumerate(m[("step_seconds", "0.5")].per_rank or [])}
    assert flops.per_rank == pytest.approx([6 * 136_960 * tokens / step_p50[r] for r in range(2)])
    assert result.params["flop_per_token"] == 6 * 136_960


def test_ddp_differing_parameters_fail() -> None:
    result = _ddp(["--n-layer", "1", "--steps", "1"], env={"HEALTHD_PROBE_FAULT": "corrupt:1"})
    assert result.outcome is Outcome.FAIL
    (check,) = result.checks
    assert check.name == "ddp.parameters_identical" and not check.ok
    assert check.detail == "1 parameter elements differ across ranks; no majority to name the differing rank"


def test_env_probe_table_to_file(tmp_path: Path) -> None:
    out = tmp_path / "env.txt"
    run = run_probe(["env", "--format", "table", "--output", str(out), "--run-id", "abc"])
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout == ""
    text = out.read_text()
    assert text.startswith("# probe env  outcome pass  run abc\n")
    assert "backend gloo  device cpu" in text
    assert "visible_gpus" in text


def test_env_probe_expecting_gpus_on_cpu_fails(tmp_path: Path) -> None:
    out = tmp_path / "env.json"
    run = run_probe(["env", "--expect-gpus", "1", "--output", str(out)])
    assert run.returncode == 0, run.stderr[-3000:]
    result = ProbeResult.model_validate(json.loads(out.read_text()))
    node = result.nodes[0]
    assert result.outcome is Outcome.FAIL
    assert [(c.name, c.ok, c.detail, c.node) for c in result.checks] == [
        ("env.gpu_count", False, "0 GPU(s) visible, 1 expected", node)
    ]
    assert [(m.name, m.value, m.node) for m in result.measurements] == [("visible_gpus", 0.0, node)]
    assert result.params["expected_gpus_per_node"] == {node: 1}
    assert result.environment is None  # no rank was started: nothing ran on the CPU (probes/expect.py)
