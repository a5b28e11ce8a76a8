from __future__ import annotations

from pathlib import Path

import pytest

from healthd.errors import ConfigError, InvalidNodeName
from healthd.jobs import LaunchSettings, job_name, render_batch_script, run_id_from_job_name, time_limit_minutes
from healthd.model import ProbeJob
from tests.golden_files import assert_golden

SETTINGS = LaunchSettings(python="/opt/healthd/bin/python", results_dir=Path("/shared/healthd/results"))


def test_single_node_gemm_script() -> None:
    job = ProbeJob(run_id="0123456789abcdef", probe="gemm", nodes=("gpu01",), timeout_s=180.0)
    assert_golden("sbatch_gemm_single.sh", render_batch_script(job, SETTINGS, ranks_per_node=8, gpus_per_node=8))


def test_pair_nccl_script_with_site_options() -> None:
    settings = LaunchSettings(
        python="/opt/healthd/bin/python", results_dir=Path("/shared/healthd"), job_name_prefix="hc.",
        partition="gpu", qos="healthd", account="ops", reservation="healthd", extra_sbatch_args=("--comment=probe",),
        pending_timeout_s=600.0, env=(("NCCL_DEBUG", "INFO"),),
    )
    job = ProbeJob(run_id="feedfacecafe0001", probe="nccl", nodes=("gpu01", "gpu02"), timeout_s=120.0,
                   args=("--sizes", "8K,64M,1G", "--scope", "group"))
    script = render_batch_script(job, settings, ranks_per_node=8, gpus_per_node=8)
    assert_golden("sbatch_nccl_pair.sh", script)
    spaced = LaunchSettings(python="python3", results_dir=Path("/shared/health d"))
    with pytest.raises(ConfigError, match="whitespace or quotes"):
        render_batch_script(job, spaced, ranks_per_node=8, gpus_per_node=8)


def test_cpu_nodes_get_no_gpu_request() -> None:
    job = ProbeJob(run_id="r1", probe="gemm", nodes=("node1",), timeout_s=60.0)
    assert "--gpus-per-node" not in render_batch_script(job, SETTINGS, ranks_per_node=1, gpus_per_node=0)


def test_node_names_are_validated_before_they_reach_a_script() -> None:
    job = ProbeJob(run_id="r1", probe="gemm", nodes=("gpu01;reboot",), timeout_s=60.0)
    with pytest.raises(InvalidNodeName, match="is not a node name"):
        render_batch_script(job, SETTINGS, ranks_per_node=1, gpus_per_node=0)


def test_job_names_round_trip() -> None:
    job = ProbeJob(run_id="abc123", probe="nccl", nodes=("n",))
    assert job_name("healthd.", job) == "healthd.nccl.abc123"
    assert run_id_from_job_name("healthd.", "healthd.nccl.abc123") == "abc123"
    assert run_id_from_job_name("healthd.", "user-job") is None
    assert run_id_from_job_name("healthd.", "healthd.nccl") is None


@pytest.mark.parametrize(("timeout", "minutes"), [(1, 2), (60, 2), (120, 3), (179, 4), (3600, 61)])
def test_time_limit(timeout: float, minutes: int) -> None:
    assert time_limit_minutes(timeout) == minutes


def test_single_node_check_script_runs_each_run_with_its_own_result() -> None:
    from healthd.model import BundledRun

    job = ProbeJob(
        run_id="c0ffee0000000001", probe="check", nodes=("gpu01",), timeout_s=420.0, expect_gpus=8,
        expect_gpu_uuids=("GPU-a", "GPU-b"),
        bundle=(
            BundledRun("c0ffee0000000001", "env", (), 60.0),
            BundledRun("c0ffee0000000002", "nccl", ("--expect-transport", "NVLS"), 120.0),
            BundledRun("c0ffee0000000003", "gemm", ("--size", "4096"), 120.0),
            BundledRun("c0ffee0000000004", "ddp", (), 120.0),
        ),
    )
    script = render_batch_script(job, SETTINGS, ranks_per_node=8, gpus_per_node=8)
    assert_golden("sbatch_check_single.sh", script)
    assert "#SBATCH --job-name=healthd.check.c0ffee0000000001\n" in script
