"""Launch environments on the real Slurm test cluster (``scripts/slurm-test-cluster.sh``).

Neither Apptainer nor the Pyxis SPANK plugin is installed there, which is exactly the failure to
test: the step fails before any probe code runs, and the daemon records the run as ``error`` with
the launcher's own message as its reason (never as a node failure). The gloo run checks that the
transport expectation reaches the probe and raises no false alarm without NCCL.

The cluster is shared: each test uses its own job name prefix and cancels only those jobs.
"""

from __future__ import annotations

import json
import re
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from healthd.collector import read_result
from healthd.parsers.expand import expand_result
from probes.result import Outcome
from tests.integration.conftest import SlurmTestCluster
from tests.integration.daemons import DaemonProc, free_port, get

pytestmark = [pytest.mark.slurm, pytest.mark.slurm_release, pytest.mark.slow]


@pytest.fixture
def prefix(slurm_cluster: SlurmTestCluster) -> Iterator[str]:
    name = f"hdl{uuid.uuid4().hex[:8]}."
    yield name
    listed = slurm_cluster.command("squeue", "-h", "-o", "%i %j").stdout.split("\n")
    ours = [line.split()[0] for line in listed if len(line.split()) == 2 and line.split()[1].startswith(name)]
    if ours:
        slurm_cluster.command("scancel", *ours)


def start(tmp_path: Path, prefix: str, body: str, class_launcher: str = "") -> tuple[DaemonProc, int]:
    port = free_port()
    config = tmp_path / "healthd.toml"
    config.write_text(f"""
backend = "slurm"
state_dir = "{tmp_path / 'state'}"
[http]
host = "127.0.0.1"
port = {port}
[scheduler]
discover_interval_s = 1
plan_interval_s = 1
collect_interval_s = 1
[logging]
format = "json"
{body}
[slurm]
python = "{sys.executable}"
job_name_prefix = "{prefix}"
max_idle_share = 1.0
max_concurrent_jobs = 1
command_timeout_s = 20
[[slurm.node_classes]]
name = "testgpu"
gpu_type = "tgpu"
expected_transport = ["IB"]
expect_gpus = 0
{class_launcher}
""")
    daemon = DaemonProc(config, port, tmp_path / "daemon.log")
    daemon.wait_http()
    return daemon, port


def first_finished(daemon: DaemonProc, port: int, timeout: float = 180.0) -> dict[str, Any]:
    deadline = time.time() + timeout
    while time.time() < deadline:
        assert daemon.proc.poll() is None, daemon.log_path.read_text()[-4000:]
        runs = json.loads(get(port, "/api/v1/runs")[1])["runs"]
        done = [r for r in runs if r["state"] == "finished"]
        if done:
            return dict(done[0])
        time.sleep(0.5)
    raise AssertionError(f"no run finished\n{daemon.log_path.read_text()[-4000:]}")


def batch_script(run: dict[str, Any]) -> str:
    return Path(str(run["result_path"])).with_suffix(".sbatch").read_text()


def test_missing_apptainer_runtime_is_an_error_with_its_message(
    tmp_path: Path, slurm_cluster: SlurmTestCluster, prefix: str
) -> None:
    # The probe says pyxis, the node class says apptainer: the class wins.
    class_launcher = """[slurm.node_classes.launcher]
kind = "apptainer"
image = "/nonexistent/healthd-test.sif"
"""
    probes = """[probes.gemm]
interval_s = 3600
[probes.gemm.launcher]
kind = "pyxis"
image = "/nonexistent/healthd-test.sqsh"
"""
    daemon, port = start(tmp_path, prefix, probes, class_launcher)
    try:
        run = first_finished(daemon, port)
        print("reason:", run["reason"])
        assert run["outcome"] == "error", run
        assert "execve(): apptainer: No such file or directory" in str(run["reason"]), run
        assert str(run["reason"]).startswith("probe failed ("), run
        script = batch_script(run)
        assert "apptainer exec --nv --bind=" in script
        assert "/nonexistent/healthd-test.sif python3 -m probes gemm" in script
        assert "--container-image" not in script
        metrics = get(port, "/metrics")[1]
        errors = re.search(r'^healthd_probe_runs_total\{outcome="error",probe="gemm"\} ([0-9.]+)$', metrics, re.M)
        assert errors is not None and float(errors.group(1)) >= 1, metrics  # a re-probe may have run since
        assert 'outcome="fail"' not in metrics.split("healthd_probe_runs_total", 1)[1].split("\n# ", 1)[0]
    finally:
        daemon.kill()


def test_pyxis_without_the_plugin_is_an_error_with_srun_message(
    tmp_path: Path, slurm_cluster: SlurmTestCluster, prefix: str
) -> None:
    probes = """[probes.gemm]
interval_s = 3600
[probes.gemm.launcher]
kind = "pyxis"
image = "/nonexistent/healthd-test.sqsh"
mounts = ["/tmp:/tmp"]
"""
    daemon, port = start(tmp_path, prefix, probes)
    try:
        run = first_finished(daemon, port)
        print("reason:", run["reason"])
        assert run["outcome"] == "error", run
        assert "srun: unrecognized option '--container-image=/nonexistent/healthd-test.sqsh'" in str(run["reason"])
        assert "--container-mounts=/tmp:/tmp," in batch_script(run)
    finally:
        daemon.kill()


def test_gloo_pair_records_gloo_and_no_false_alarm(
    tmp_path: Path, slurm_cluster: SlurmTestCluster, prefix: str
) -> None:
    probes = """[probes.nccl]
interval_s = 3600
nodes_per_job = 2
expected_transport = ["OFI"]
"""
    daemon, port = start(tmp_path, prefix, probes)
    try:
        run = first_finished(daemon, port, timeout=240.0)
        assert run["outcome"] == "pass", run
        assert "--expect-transport IB" in batch_script(run)  # the class's expectation, not the probe's
        raw = json.loads(Path(str(run["result_path"])).read_text())
        assert raw["params"]["expect_transport"] == ["IB"]
        assert raw["params"]["nccl_debug"] == {"status": "gloo", "backend": "gloo"}
        result = expand_result(read_result(Path(str(run["result_path"]))))
        assert result.outcome is Outcome.PASS
        assert result.params["nccl_transport"]["status"] == "gloo"
        assert result.params["nccl_transport"]["used"] == ["gloo"]
    finally:
        daemon.kill()
