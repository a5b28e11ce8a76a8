"""How a probe ends when it cannot run: usage errors, launch errors, ranks that hang or crash."""

from __future__ import annotations

import pytest

from probes.result import Outcome
from tests.probes.helpers import run_probe, run_simulated_srun, run_torchrun


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["bogus"], "invalid choice: 'bogus'"),
        ([], "the following arguments are required"),
        (["nccl", "--bogus"], "unrecognized arguments: --bogus"),
        (["nccl", "--collectives", "all_reduce,gossip"], "unknown collective(s) ['gossip']"),
        (["nccl", "--sizes", "8X"], "bad size '8X'"),
        (["gemm", "--dtypes", "fp4"], "unknown dtype(s) ['fp4']"),
        (["env", "--timeout", "0"], "must be > 0: '0'"),
        (["ddp", "--nproc", "0"], "must be >= 1: '0'"),
        (["env", "--format", "xml"], "invalid choice: 'xml'"),
    ],
)
def test_usage_errors_exit_2(argv: list[str], message: str) -> None:
    run = run_probe(argv, timeout=30)
    assert run.returncode == 2
    assert run.stdout == ""
    assert "usage: python -m probes" in run.stderr
    assert message in run.stderr


def test_unreadable_launch_environment_is_an_error_document() -> None:
    run = run_probe(
        ["env", "--run-id", "r-7"],
        env={"SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_STEP_ID": "0", "SLURM_NTASKS": "two"},
        timeout=30,
    )
    assert run.returncode == 1
    result = run.result
    assert result.outcome is Outcome.ERROR
    assert result.run_id == "r-7"
    assert result.reason == "cannot determine the launch: SLURM_NTASKS='two' is not an integer"


@pytest.mark.slow
def test_hung_rank_ends_within_timeout_naming_it() -> None:
    run = run_probe(["nccl", "--sizes", "8K", "--timeout", "20"], env={"HEALTHD_PROBE_FAULT": "hang:1"})
    assert run.wall < 20.5
    assert run.returncode == 1, run.stderr[-3000:]
    result = run.result
    assert result.outcome is Outcome.ERROR
    node = result.nodes[0]
    assert result.reason.startswith(
        f"rank 1 (node {node}) was stuck in phase 'probe.start' while rank 0 reached 'nccl.all_reduce.8192.in_place."
    ), result.reason
    # then rank 0's own error: its collective timed out waiting (or, on a slow machine, its watchdog)
    assert f"; rank 0 (node {node}) failed in phase 'nccl.all_reduce.8192.in_place." in result.reason
    assert result.environment is not None and len(result.environment.ranks) == 2
    assert result.startup_seconds is not None


@pytest.mark.slow
def test_hung_rank_zero_is_named_by_its_own_watchdog() -> None:
    run = run_probe(["nccl", "--sizes", "8K", "--timeout", "20"], env={"HEALTHD_PROBE_FAULT": "hang:0"})
    assert run.wall < 20.5
    assert run.returncode == 1, run.stderr[-3000:]
    reason = run.result.reason
    assert reason.startswith("rank 0 (node "), reason
    assert "was stuck in phase 'probe.start' while rank 1 reached 'nccl.all_reduce.8192" in reason
    assert "probe did not finish within its 20 s timeout" in reason


@pytest.mark.slow
def test_crashed_rank_is_named_quickly() -> None:
    run = run_probe(["nccl", "--sizes", "8K", "--timeout", "60"], env={"HEALTHD_PROBE_FAULT": "crash:1"})
    assert run.returncode == 1, run.stderr[-3000:]
    assert run.wall < 30
    reason = run.result.reason
    assert reason.startswith("rank 1 (node "), reason
    assert "died without reporting an error, in phase 'probe.start'" in reason
    assert "launcher: rank 1 exited with code 86: [probes] rank 1: injected crash (86)" in reason


@pytest.mark.slow
def test_crash_under_torchrun_still_gives_a_document() -> None:
    """torchrun stops the surviving ranks with SIGTERM; rank 0 reports on its way out."""
    run = run_torchrun(2, ["nccl", "--sizes", "8K", "--timeout", "60"], env={"HEALTHD_PROBE_FAULT": "crash:1"})
    assert run.returncode != 0
    assert run.wall < 40
    result = run.result
    assert result.outcome is Outcome.ERROR
    assert result.reason.startswith("rank 1 (node "), result.reason
    assert "died without reporting an error" in result.reason


@pytest.mark.slow
def test_crash_under_simulated_srun() -> None:
    run = run_simulated_srun(1, 2, ["env", "--timeout", "60"], env={"HEALTHD_PROBE_FAULT": "crash:1"})
    assert run.returncodes == [1, 86]
    assert run.wall < 30
    result = run.result
    assert result.outcome is Outcome.ERROR
    assert result.reason.startswith("rank 1 (node sim0) died without reporting an error"), result.reason
