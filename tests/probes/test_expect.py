"""``--expect-gpus``: a node that must have GPUs never passes as a CPU run (issue 26: a lost H100 did).

Real ``python -m probes`` processes on this machine, which has no GPU: told to expect one, every probe
fails at once with ``env.gpu_count`` naming what is missing; under srun every rank reports it and the
daemon's reading names the node (``gpus_missing``). The pure parts with a fake node listing."""

from __future__ import annotations

import pytest

from healthd.collector import outcome_of
from healthd.model import Outcome
from probes.expect import Seen, missing, missing_gpus_result, parse_uuid_list, shortfall_text, visible_of
from probes.gpus import NodeGpu
from tests.probes.helpers import run_probe, run_simulated_srun

LISTING = [NodeGpu(0, "GPU-aaaa-0", "NVIDIA H100 80GB HBM3"), NodeGpu(1, "GPU-bbbb-1", "NVIDIA H100 80GB HBM3"),
           NodeGpu(2, "GPU-cccc-2", "NVIDIA H100 80GB HBM3")]


@pytest.mark.parametrize(("cvd", "want"), [
    (None, [0, 1, 2]), ("", []), ("-1", []), ("NoDevFiles", []), ("2,0", [2, 0]), ("GPU-bbbb", [1]),
    ("1,7,2", [1]),  # CUDA stops at the first entry it cannot use
])
def test_visible_of_narrows_the_listing_by_cuda_visible_devices(cvd: str | None, want: list[int]) -> None:
    env = {} if cvd is None else {"CUDA_VISIBLE_DEVICES": cvd}
    visible = visible_of(LISTING, env)
    assert visible is not None and [g.index for g in visible] == want


def test_no_listing_is_unknown_not_zero() -> None:
    assert visible_of([], {}) is None
    assert visible_of([], {"CUDA_VISIBLE_DEVICES": "0,1"}) is None
    assert visible_of([], {"CUDA_VISIBLE_DEVICES": ""}) == []


def test_a_missing_gpu_is_named_by_the_uuid_it_had() -> None:
    assert missing(["GPU-aaaa-0", "GPU-bbbb-1"], ["GPU-bbbb-1"]) == ["GPU-aaaa-0"]
    assert shortfall_text(1, 2, ["GPU-aaaa-0"]) == "1 GPU(s) visible, 2 expected; missing GPU-aaaa-0"
    doc = missing_gpus_result("gemm", run_id="r1", node="n7", want=3, expected_uuids=[g.uuid for g in LISTING],
                              environ={"CUDA_VISIBLE_DEVICES": "0,2"}, started_at=1.0, params={},
                              see=lambda env: Seen(2, ("GPU-aaaa-0", "GPU-cccc-2"), "nvidia-smi/NVML"))
    assert doc is not None and doc.outcome is Outcome.FAIL and doc.measurements == []
    (check,) = doc.checks
    assert (check.name, check.ok, check.node, check.gpu_uuid) == ("env.gpu_count", False, "n7", "GPU-bbbb-1")
    assert check.detail == "2 GPU(s) visible, 3 expected; missing GPU-bbbb-1"
    assert missing_gpus_result("gemm", run_id="r1", node="n7", want=2, expected_uuids=(), environ={},
                               started_at=1.0, params={}, see=lambda env: Seen(2, (), "torch")) is None


def test_uuid_list_option() -> None:
    assert parse_uuid_list("GPU-a, GPU-b,,") == ("GPU-a", "GPU-b")
    with pytest.raises(ValueError, match="not a GPU UUID"):
        parse_uuid_list("GPU-a,3")


@pytest.mark.parametrize("probe", ["env", "gemm", "ddp", "nccl"])
def test_a_probe_told_to_expect_a_gpu_fails_here_without_running_on_the_cpu(probe: str) -> None:
    run = run_probe([probe, "--expect-gpus", "1", "--expect-gpu-uuids", "GPU-3f1c0a52-1d2e", "--timeout", "60"])
    assert run.returncode == 0, run.stderr
    result = run.result
    assert result.outcome is Outcome.FAIL, result
    assert [m.name for m in result.measurements if m.name != "visible_gpus"] == []  # no CPU figure at all
    (check,) = result.checks
    assert check.name == "env.gpu_count" and not check.ok and check.gpu_uuid == "GPU-3f1c0a52-1d2e"
    assert check.detail == "0 GPU(s) visible, 1 expected; missing GPU-3f1c0a52-1d2e"
    assert result.environment is None and run.wall < 30  # no rank was started


def test_under_srun_every_rank_of_a_gpu_node_without_gpus_reports_it_and_the_node_is_named() -> None:
    run = run_simulated_srun(2, 1, ["gemm", "--expect-gpus", "8", "--timeout", "60"])
    result = run.result
    assert result.outcome is Outcome.ERROR and "0 GPU(s) visible, 8 expected" in result.reason, result.reason
    outcome, reason = outcome_of(None, result, None, ("sim0", "sim1"))
    assert outcome is Outcome.FAIL and reason.startswith("gpus_missing"), reason


def test_without_an_expectation_a_cpu_node_still_runs_on_the_cpu() -> None:
    run = run_probe(["env", "--timeout", "60"])
    assert run.returncode == 0 and run.result.outcome is Outcome.PASS, run.stderr
    assert run.result.environment is not None and run.result.environment.device_type == "cpu"


def test_one_rank_has_nothing_to_measure_within_a_node_it_is_skipped() -> None:
    run = run_probe(["nccl", "--nproc", "1", "--sizes", "8K", "--timeout", "60"])
    assert run.returncode == 0, run.stderr
    assert (run.result.outcome, run.result.reason) == (Outcome.SKIPPED, "one rank per node: nothing to measure")
