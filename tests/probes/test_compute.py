"""The ``compute`` probe (PARAM-style MLP and EmbeddingBag per GPU): its arithmetic and real runs on CPU."""

from __future__ import annotations

import argparse

import pytest

from probes.compute import CPU_EMB, CPU_MLP, GPU_EMB, GPU_MLP, EmbShape, MlpShape, add_arguments, shapes, support
from probes.result import Outcome
from tests.probes.helpers import dump, run_probe

SMALL = ["--hidden-size", "32", "--layer-num", "1", "--batch-size", "16", "--features", "1000", "--embdim", "16",
         "--nnz", "4", "--bags", "64", "--warmup", "1", "--steps", "2"]


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(list(argv))


def test_param_formulas_by_hand() -> None:
    # PARAM pytorch_linear.py: 6 * batch * sum(in * out); 3 layers 256 wide at batch 128: 6 * 128 * 2 * 65536
    assert CPU_MLP.flop_per_step == 6 * 128 * 2 * 256 * 256 == 100_663_296
    assert MlpShape(layers=(1024, 512, 10), batch=2).flop_per_step == 6 * 2 * (1024 * 512 + 512 * 10)
    # GPU default: 8 Linear layers of 4096 x 4096 at batch 4096 = 3.3 TFLOP a step
    assert GPU_MLP.flop_per_step == 6 * 4096 * 8 * 4096**2
    # PARAM pytorch_emb.py: batch * nnz * dim * element size; 1000 bags of 10 rows of 64 fp32
    assert CPU_EMB.bytes_per_lookup(4) == 1000 * 10 * 64 * 4 == 2_560_000
    assert GPU_EMB.bytes_per_lookup(4) == 16384 * 64 * 128 * 4


def test_shapes_from_options() -> None:
    assert shapes(_args(), cuda=False) == (CPU_MLP, CPU_EMB)
    assert shapes(_args(), cuda=True) == (GPU_MLP, GPU_EMB)
    mlp, emb = shapes(_args(*SMALL), cuda=True)
    assert mlp == MlpShape(layers=(32, 32, 32), batch=16) and emb == EmbShape(1000, 16, 4, 64)
    assert shapes(_args("--layer-num", "0"), cuda=False)[0].layers == (256, 256)
    with pytest.raises(ValueError, match="--layer-num must be >= 0"):
        shapes(_args("--layer-num", "-2"), cuda=False)
    with pytest.raises(ValueError, match="sizes must be >= 1"):
        shapes(_args("--nnz", "-1"), cuda=False)


def test_dtype_support() -> None:
    assert support("fp16", "cpu", None) is None and support("bf16", "cpu", None) is None
    assert support("tf32", "cpu", None) == "tf32 is a CUDA matmul mode"
    assert support("bf16", "cuda", (7, 0)) is not None and support("tf32", "cuda", (9, 0)) is None


@pytest.mark.slow
def test_compute_on_two_cpu_ranks() -> None:
    run = run_probe(["compute", *SMALL])
    assert run.returncode == 0, run.stderr[-3000:]
    result = run.result
    assert result.outcome is Outcome.PASS, dump(result)
    node = result.nodes[0]
    got = {(m.name, m.labels.get("gpu"), m.labels.get("dtype")): m for m in result.measurements}
    assert set(got) == {(name, g, dtype) for g in ("0", "1") for name, dtype in
                        (("mlp_flop_per_second", "fp32"), ("embedding_bag_bytes_per_second", None))}
    assert all(m.node == node and 1e5 < m.value < 1e14 for m in got.values())
    assert result.params["mlp_flop_per_step"] == 6 * 16 * 2 * 32 * 32
    assert result.params["emb_bytes_per_lookup"] == 64 * 4 * 16 * 4
    assert result.params["tf32"] is False
    assert {(c.name, c.gpu, c.ok) for c in result.checks} >= {
        (f"compute.{k}", g, True) for k in ("mlp.finite", "embedding_bag.result") for g in (0, 1)}


@pytest.mark.slow
def test_compute_wrong_embedding_sums_name_the_gpu() -> None:
    run = run_probe(["compute", *SMALL], env={"HEALTHD_PROBE_FAULT": "corrupt:1"})
    assert run.returncode == 0, run.stderr[-3000:]
    result = run.result
    assert result.outcome is Outcome.FAIL
    assert [(c.name, c.gpu, c.rank) for c in result.checks if not c.ok] == [("compute.embedding_bag.result", 1, 1)]


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["fp16", "tf32"])
def test_compute_fp16_runs_on_cpu_and_tf32_is_skipped_with_the_reason(dtype: str) -> None:
    run = run_probe(["compute", *SMALL, "--dtype", dtype, "--nproc", "1"])
    assert run.returncode == 0, run.stderr[-3000:]
    result = run.result
    assert result.outcome is Outcome.PASS, dump(result)
    names = {(m.name, m.labels.get("dtype")) for m in result.measurements}
    if dtype == "fp16":
        assert names == {("mlp_flop_per_second", "fp16"), ("embedding_bag_bytes_per_second", None)}
    else:
        assert names == {("embedding_bag_bytes_per_second", None)}
        assert result.params["skipped"] == {"mlp": "tf32 is a CUDA matmul mode"}
