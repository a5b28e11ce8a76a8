"""The right GPU named: a rank's CUDA ordinal mapped to the node's GPU index and UUID."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from healthd.config import JudgeSettings
from healthd.judge.engine import Judge
from healthd.judge.model import CheckInput, RunInput
from healthd.model import Node, Outcome
from healthd.remediation.decide import drain_reason
from healthd.store.rows import RecommendationRow
from probes.dist import LaunchError
from probes.gpus import NodeGpu, gpu_slot, name_check_gpus, node_gpus, parse_nvidia_smi_list
from probes.result import Check, DeviceInfo, RankInfo

UUIDS = [f"GPU-{i}a1b2c3d-0000-1111-2222-33334444555{i}" for i in range(4)]
SMI_LIST = "\n".join(f"GPU {i}: NVIDIA H100 80GB HBM3 (UUID: {u})" for i, u in enumerate(UUIDS))


@pytest.fixture
def fake_nvidia_smi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fake ``nvidia-smi`` (a shell script) first on ``PATH`` that lists four H100s for ``-L``."""
    bin_dir = tmp_path / "fake-bin"
    bin_dir.mkdir()
    fake = bin_dir / "nvidia-smi"
    fake.write_text(f'#!/bin/sh\n# a fake nvidia-smi for tests\n[ "$1" = "-L" ] || exit 9\ncat <<EOF\n{SMI_LIST}\n'
                    "  MIG 1g.10gb     Device  0: (UUID: MIG-0f00)\nEOF\n")
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    return fake


def test_parse_nvidia_smi_list_skips_mig_and_noise() -> None:
    text = SMI_LIST + "\n  MIG 3g.40gb Device 0: (UUID: MIG-abc)\nNo devices were found\n"
    assert parse_nvidia_smi_list(text) == [NodeGpu(i, u, "NVIDIA H100 80GB HBM3") for i, u in enumerate(UUIDS)]
    assert parse_nvidia_smi_list("") == []


def test_node_gpus_reads_the_nvidia_smi_on_path(fake_nvidia_smi: Path) -> None:
    assert [(g.index, g.uuid) for g in node_gpus()] == list(enumerate(UUIDS))


def test_node_gpus_without_nvidia_smi_or_nvml(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr("probes.gpus._nvml_gpus", lambda: [])
    assert node_gpus() == []


def test_mapped_visible_devices_name_the_physical_gpu(fake_nvidia_smi: Path) -> None:
    env = {"CUDA_VISIBLE_DEVICES": "3,1"}
    listing = node_gpus()
    first, second = (gpu_slot(r, 2, 2, env, listing) for r in (0, 1))
    assert (first.ordinal, first.physical, first.uuid) == (0, 3, UUIDS[3])
    assert (second.ordinal, second.physical, second.uuid) == (1, 1, UUIDS[1])


@pytest.mark.parametrize("entry", ["2", UUIDS[2], UUIDS[2][:12]])
def test_one_gpu_per_task_is_the_one_visible_devices_names_not_the_local_rank(fake_nvidia_smi: Path,
                                                                              entry: str) -> None:
    """``srun --gpus-per-task=1 --gpu-bind=map_gpu:2,...``: local rank 0 runs on GPU 2 (by index or UUID)."""
    slot = gpu_slot(0, 4, 1, {"CUDA_VISIBLE_DEVICES": entry}, node_gpus())
    assert (slot.ordinal, slot.physical, slot.uuid) == (0, 2, UUIDS[2])


def test_gpu_slot_without_a_listing_or_visible_devices() -> None:
    assert gpu_slot(3, 8, 8, {}) == gpu_slot(3, 8, 8, {}, ()) and gpu_slot(3, 8, 8, {}).physical == 3
    assert gpu_slot(5, 8, 1, {}).physical == 5  # nothing names it: the local rank, as before
    unknown = gpu_slot(0, 1, 1, {"CUDA_VISIBLE_DEVICES": "GPU-feed"})
    assert (unknown.physical, unknown.uuid) == (0, "GPU-feed")
    with pytest.raises(LaunchError, match="one GPU per rank"):
        gpu_slot(0, 4, 2, {})
    with pytest.raises(LaunchError, match="no CUDA device"):
        gpu_slot(0, 1, 0, {})


def test_a_fault_on_local_device_0_is_reported_and_drained_as_gpu_3(fake_nvidia_smi: Path) -> None:
    """``CUDA_VISIBLE_DEVICES=3,1``: the rank on ordinal 0 finds wrong data; the check, the verdict and
    the drain reason name GPU 3 and its UUID, never GPU 0."""
    slot = gpu_slot(0, 2, 2, {"CUDA_VISIBLE_DEVICES": "3,1"}, node_gpus())
    rank = RankInfo(rank=0, local_rank=0, world_size=2, local_world_size=2, hostname="n1", node="n1",
                    device="cuda:0", devices=[DeviceInfo(index=slot.physical, name="H100", uuid=slot.uuid)])
    (check,) = name_check_gpus([Check(name="gemm.bf16.result", ok=False, detail="max |C - ref| = 9", node="n1",
                                      gpu=slot.physical)], [rank])
    assert (check.gpu, check.gpu_uuid) == (3, UUIDS[3])
    judge = Judge(JudgeSettings())
    run = RunInput("r1", "gemm", ("n1",), Outcome.FAIL, "wrong result", 1000.0, (),
                   (CheckInput(check.name, check.detail, check.node, check.gpu, check.gpu_uuid),))
    out = judge.evaluate([run], [Node("n1", "idle", gpus=8, gpu_type="h100", node_class="h100x8")], now=1000.0)
    (verdict,) = out.verdicts
    assert f"gpu 3 ({UUIDS[3]}) check gemm.bf16.result failed" in verdict.reason
    assert "gpu 0" not in verdict.reason
    top = dict(verdict.evidence)
    assert top["series"] == f"gpu 3 ({UUIDS[3]}) check:gemm.bf16.result" and top["gpu"] == "3"
    assert top["gpu_uuid"] == UUIDS[3]  # a label of healthd_node_finding once confirmed
    row = RecommendationRow(1, "n1", "gemm", "fail", "check_failed", verdict.reason,
                            {"findings": [top], "run_ids": ["r1"]}, 0.0, 0.0, "active", None, "", False, "")
    reason = drain_reason("healthd:", row)
    assert reason.startswith(f"healthd: check_failed gemm gpu 3 ({UUIDS[3]}) check:gemm.bf16.result")


def test_the_local_backend_runs_one_rank_per_gpu_by_default() -> None:
    from healthd.cluster.local import probe_argv
    from healthd.config import Settings
    from healthd.model import ProbeJob
    from probes.launch import default_nproc

    assert Settings().local.ranks is None
    for probe in ("nccl", "ddp"):
        argv = probe_argv("python", ProbeJob("r1", probe, ("n1",), timeout_s=60.0), None, ranks=None)
        assert "--nproc" not in argv  # the launcher starts one rank per visible GPU
    assert default_nproc("auto", {"CUDA_VISIBLE_DEVICES": ",".join(str(i) for i in range(8))}) == 8
    assert default_nproc("cpu", {}) == 2
