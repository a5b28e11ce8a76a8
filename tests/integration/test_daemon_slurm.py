"""The daemon against the real 4-node Slurm test cluster (``scripts/slurm-test-cluster.sh``).

Probes run as real batch jobs (srun, gloo on CPU). Each test restores the cluster to all-idle.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.integration.conftest import SlurmTestCluster
from tests.integration.daemons import DaemonProc, free_port, get

pytestmark = [pytest.mark.slurm, pytest.mark.slow]
NODES = ("node1", "node2", "node3", "node4")


def write_config(tmp_path: Path, port: int, *, probes: str, slurm_extra: str = "") -> Path:
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
[slurm]
python = "{sys.executable}"
max_idle_share = 1.0
command_timeout_s = 20
{slurm_extra}
{probes}
[logging]
format = "json"
""")
    return config


def samples(text: str) -> list[tuple[str, dict[str, str], float]]:
    return [(s.name, s.labels, s.value) for f in text_string_to_metric_families(text) for s in f.samples]


def runs(port: int) -> list[dict[str, object]]:
    return list(json.loads(get(port, "/api/v1/runs")[1])["runs"])


def wait(predicate: Callable[[], object], timeout: float, what: str, daemon: DaemonProc | None = None) -> object:
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = predicate()
        if value:
            return value
        if daemon is not None:
            assert daemon.proc.poll() is None, daemon.log_path.read_text()[-4000:]
        time.sleep(0.5)
    log = daemon.log_path.read_text()[-4000:] if daemon else ""
    raise AssertionError(f"timed out waiting for {what}\n{log}")


@pytest.fixture
def cluster(slurm_cluster: SlurmTestCluster) -> Iterator[SlurmTestCluster]:
    """The cluster, all idle before and after the test (jobs cancelled, drains and reservations removed)."""
    def reset() -> None:
        ours = [line.split()[0] for line in slurm_cluster.command("squeue", "-h", "-o", "%i %j").stdout.splitlines()
                if line.split()[1].startswith(("healthd.", "user-job", "user-training"))]
        if ours:
            slurm_cluster.command("scancel", *ours)
        slurm_cluster.command("scontrol", "delete", "reservation=hd_test")
        for node in NODES:
            slurm_cluster.command("scontrol", "update", f"nodename={node}", "state=resume")
        wait(lambda: set(slurm_cluster.command("sinfo", "-h", "-N", "-p", "batch", "-o", "%t").stdout.split())
             == {"idle"}, 60, "all nodes idle")

    reset()
    yield slurm_cluster
    reset()


def start(tmp_path: Path, config: Path, port: int, env: dict[str, str]) -> DaemonProc:
    os.environ.update({k: v for k, v in env.items() if k.startswith("SLURM")})
    daemon = DaemonProc(config, port, tmp_path / "daemon.log")
    daemon.wait_http()
    return daemon


def test_probes_only_idle_nodes_and_leaves_foreign_drains_alone(tmp_path: Path, cluster: SlurmTestCluster) -> None:
    user = cluster.command("sbatch", "--parsable", "-J", "user-training", "-w", "node1", "--exclusive",
                           "-o", "/dev/null", "--wrap", "sleep 300")
    assert user.returncode == 0, user.stderr
    assert cluster.command("scontrol", "update", "nodename=node2", "state=drain",
                           "reason=hw: bad PSU ticket 42").returncode == 0
    reserve = cluster.command("scontrol", "create", "reservation", "reservationname=hd_test", "nodes=node3",
                              "users=root", "starttime=now", "duration=60", "flags=maint,ignore_jobs")
    assert reserve.returncode == 0, reserve.stderr
    wait(lambda: "alloc" in cluster.command("sinfo", "-h", "-n", "node1", "-o", "%t").stdout, 30, "user job running")
    # slurmctld marks nodes of a reservation that starts now within a few seconds; before that a probe
    # submitted there would pend and be recorded as skipped (tested below), not run.
    wait(lambda: "maint" in cluster.command("sinfo", "-h", "-n", "node3", "-o", "%t").stdout, 30, "node3 reserved")

    port = free_port()
    daemon = start(tmp_path, write_config(tmp_path, port, probes="[probes.gemm]\ninterval_s = 3600\n"), port,
                   cluster.env)
    try:
        done = wait(lambda: [r for r in runs(port) if r["state"] == "finished"], 120, "a finished run", daemon)
        time.sleep(3)  # several more plan ticks: nothing else may be submitted
        all_runs = runs(port)
        assert [r["nodes"] for r in all_runs] == [["node4"]], all_runs
        assert done[0]["outcome"] == "pass", done  # type: ignore[index]
        reason = cluster.command("scontrol", "-o", "show", "node", "node2").stdout
        assert "Reason=hw: bad PSU ticket 42" in reason
        text = get(port, "/metrics")[1]
        values = samples(text)
        assert ("healthd_slurm_up", {}, 1.0) in values
        assert any(n == "healthd_gemm_flop_per_second" and lab["node"] == "node4" and v > 0 for n, lab, v in values)
        assert not any(n == "healthd_gemm_flop_per_second" and lab["node"] != "node4" for n, lab, _ in values)
        assert ("healthd_node_info", {"node": "node4", "node_class": "tgpux2", "gpu_type": "tgpu"}, 1.0) in values
    finally:
        daemon.kill()


def test_pair_all_reduce_across_two_nodes(tmp_path: Path, cluster: SlurmTestCluster) -> None:
    port = free_port()
    probes = "[probes.nccl]\ninterval_s = 3600\nnodes_per_job = 2\n"
    config = write_config(tmp_path, port, probes=probes, slurm_extra="exclude_nodes = ['node3', 'node4']")
    daemon = start(tmp_path, config, port, cluster.env)
    try:
        done = wait(lambda: [r for r in runs(port) if r["state"] == "finished"], 150, "the pair run", daemon)
        (run,) = done  # type: ignore[misc]
        assert run["nodes"] == ["node1", "node2"] and run["outcome"] == "pass", run
        result = json.loads(Path(str(run["result_path"])).read_text())
        assert result["environment"]["launcher"] == "srun"
        assert sorted({r["node"] for r in result["environment"]["ranks"]}) == ["node1", "node2"]
        assert len(result["environment"]["ranks"]) == 4  # 2 fake GPUs per node: 2 tasks per node
        values = samples(get(port, "/metrics")[1])
        for node in ("node1", "node2"):
            assert any(n == "healthd_nccl_busbw_bytes_per_second" and lab["node"] == node and lab["scope"] == "group"
                       and v > 0 for n, lab, v in values), node
    finally:
        daemon.kill()


def test_pending_too_long_is_cancelled_as_skipped(tmp_path: Path, cluster: SlurmTestCluster) -> None:
    port = free_port()
    extra = 'pending_timeout_s = 3\nextra_sbatch_args = ["--hold"]\nexclude_nodes = ["node2", "node3", "node4"]'
    daemon = start(tmp_path, write_config(tmp_path, port, probes="[probes.gemm]\ninterval_s = 3600\n",
                                          slurm_extra=extra), port, cluster.env)
    try:
        done = wait(lambda: [r for r in runs(port) if r["state"] == "finished"], 60, "the skipped run", daemon)
        (run,) = done  # type: ignore[misc]
        assert run["outcome"] == "skipped" and "still pending" in str(run["reason"]), run
        assert "healthd." not in cluster.command("squeue", "-h", "-o", "%j").stdout
        text = get(port, "/metrics")[1]
        assert ("healthd_probe_runs_total", {"probe": "gemm", "outcome": "skipped"}, 1.0) in samples(text)
    finally:
        daemon.kill()


def test_sigkill_and_restart_adopts_running_jobs_without_duplicates(tmp_path: Path, cluster: SlurmTestCluster) -> None:
    port = free_port()
    config = write_config(tmp_path, port, probes="[probes.gemm]\ninterval_s = 3600\n",
                          slurm_extra='exclude_nodes = ["node3", "node4"]')
    daemon = start(tmp_path, config, port, cluster.env)
    job_ids = wait(lambda: [line for line in cluster.command("squeue", "-h", "-o", "%i %j %T").stdout.splitlines()
                            if "healthd." in line and "RUNNING" in line and len(runs(port)) == 2], 60,
                   "two running probe jobs", daemon)
    daemon.kill()  # SIGKILL
    again = start(tmp_path, config, port, cluster.env)
    try:
        finished = wait(lambda: [r for r in runs(port) if r["state"] == "finished"] if len(
            [r for r in runs(port) if r["state"] == "finished"]) == 2 else None, 120, "both adopted runs finish", again)
        assert {r["outcome"] for r in finished} == {"pass"}, finished  # type: ignore[union-attr]
        assert len(runs(port)) == 2
        assert sorted(str(r["job_id"]) for r in runs(port)) == sorted(line.split()[0] for line in job_ids)  # type: ignore[union-attr]
        log = again.log_path.read_text()
        assert log.count('"event": "probe_adopted"') == 2
        assert log.count('"event": "probe_submitted"') == 2  # both from the first daemon only
    finally:
        again.kill()


def test_controller_outage_reports_slurm_down_and_recovers(tmp_path: Path, cluster: SlurmTestCluster) -> None:
    pid = cluster.ctld_pid()
    if pid is None:
        pytest.skip("the cluster was not started by scripts/slurm-test-cluster.sh; cannot stop its slurmctld")
    port = free_port()
    daemon = start(tmp_path, write_config(tmp_path, port, probes="[probes.gemm]\nenabled = false\n"), port,
                   cluster.env)
    try:
        wait(lambda: ("healthd_slurm_up", {}, 1.0) in samples(get(port, "/metrics")[1]), 30, "slurm up", daemon)
        os.kill(pid, signal.SIGTERM)
        wait(lambda: ("healthd_slurm_up", {}, 0.0) in samples(get(port, "/metrics")[1]), 60, "slurm down", daemon)
        status, body = get(port, "/api/v1/nodes")
        assert status == 200 and len(json.loads(body)["nodes"]) == 4  # last known state still served
        values = samples(get(port, "/metrics")[1])
        assert any(n == "healthd_scheduler_tick_errors_total" and lab.get("task") == "discover" and v >= 1
                   for n, lab, v in values)
        cluster.start()
        wait(lambda: ("healthd_slurm_up", {}, 1.0) in samples(get(port, "/metrics")[1]), 60, "slurm back", daemon)
        assert daemon.proc.poll() is None
    finally:
        daemon.kill()
        cluster.start()


SWEEP = """
[probes.gemm]
enabled = false
[sweep]
enabled = true
interval_s = 3600
max_nodes = 4
max_share = 1.0
timeout_s = 180
"""


def test_scaling_sweep_over_two_then_four_nodes(tmp_path: Path, cluster: SlurmTestCluster) -> None:
    port = free_port()
    daemon = start(tmp_path, write_config(tmp_path, port, probes=SWEEP), port, cluster.env)
    try:
        def table() -> dict[str, float]:
            return {lab["nodes"]: v for n, lab, v in samples(get(port, "/metrics")[1])
                    if n == "healthd_scaling_busbw_bytes_per_second" and lab["size_bytes"] == "4194304"}

        got = wait(lambda: table() if set(table()) == {"2", "4"} else None, 240, "busbw for 2 and 4 nodes", daemon)
        assert all(v > 0 for v in got.values()), got  # type: ignore[union-attr]
        all_runs = runs(port)
        assert sorted(len(r["nodes"]) for r in all_runs) == [2, 4], all_runs  # type: ignore[arg-type]
        assert all(str(r["run_id"]).startswith(f"sw{len(r['nodes'])}-") for r in all_runs)  # type: ignore[arg-type]
        values = samples(get(port, "/metrics")[1])
        assert {lab["nodes"] for n, lab, _ in values if n == "healthd_scaling_last_run_timestamp_seconds"} == {"2", "4"}
        assert not any(n == "healthd_node_verdict" for n, _, _ in values)  # sweeps are not judged per node
    finally:
        daemon.kill()


def test_scaling_sweep_needs_two_idle_nodes(tmp_path: Path, cluster: SlurmTestCluster) -> None:
    for node in ("node1", "node2", "node3"):
        done = cluster.command("sbatch", "-J", "user-job", "-w", node, "--exclusive", "-o", "/dev/null",
                               "--wrap", "sleep 300")
        assert done.returncode == 0, done.stderr
    wait(lambda: cluster.command("sinfo", "-h", "-N", "-p", "batch", "-o", "%t").stdout.split().count("alloc") == 3,
         30, "three nodes allocated")
    port = free_port()
    daemon = start(tmp_path, write_config(tmp_path, port, probes=SWEEP), port, cluster.env)
    try:
        time.sleep(6)  # several discover and plan ticks
        assert runs(port) == []
        assert "healthd." not in cluster.command("squeue", "-h", "-o", "%j").stdout
    finally:
        daemon.kill()
