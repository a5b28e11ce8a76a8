"""The daemon against the real 5-node Slurm test cluster (``scripts/slurm-test-cluster.sh``).

Probes run as real batch jobs (srun, gloo on CPU). Each test restores the cluster to all-idle.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.integration.conftest import FAKE_GPU_CLASSES_TOML, SlurmTestCluster
from tests.integration.daemons import DaemonProc, free_port, get

pytestmark = [pytest.mark.slurm, pytest.mark.slow]
REPO = Path(__file__).resolve().parents[2]


def write_config(tmp_path: Path, port: int, *, probes: str, slurm_extra: str = "", scheduler: str = "") -> Path:
    config = tmp_path / "healthd.toml"
    config.write_text(f"""
backend = "slurm"
state_dir = "{tmp_path / 'state'}"
[http]
host = "127.0.0.1"
port = {port}
[scheduler]
{scheduler or FAST_TICKS}
[slurm]
python = "{sys.executable}"
max_idle_share = 1.0
command_timeout_s = 20
{slurm_extra}
{FAKE_GPU_CLASSES_TOML}
{probes}
[logging]
format = "json"
""")
    return config


FAST_TICKS = "discover_interval_s = 1\nplan_interval_s = 1\ncollect_interval_s = 1"
SMALL_GEMM = '["--dtypes", "fp32", "--size", "256", "--copy-bytes", "4M"]'
"""gemm's ``args`` (TOML) where a test is about the runs, not their figures: about 2 s less a run than the CPU
default (1024, fp32 and bf16, a 64 MiB copy)."""


def write_default_config(tmp_path: Path, port: int) -> Path:
    """Defaults for everything but where the daemon keeps its state and listens."""
    config = tmp_path / "healthd.toml"
    config.write_text(f"""
backend = "slurm"
state_dir = "{tmp_path / 'state'}"
[http]
host = "127.0.0.1"
port = {port}
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


def start(tmp_path: Path, config: Path, port: int, env: dict[str, str]) -> DaemonProc:
    os.environ.update({k: v for k, v in env.items() if k.startswith("SLURM")})
    daemon = DaemonProc(config, port, tmp_path / "daemon.log")
    daemon.wait_http()
    return daemon


def test_with_defaults_probes_both_idle_nodes_and_nothing_else(tmp_path: Path, cluster: SlurmTestCluster) -> None:
    """One busy, one drained by someone else, one maintenance-reserved and two idle nodes, healthd with its
    defaults: both idle nodes are probed within 2 minutes, nothing is submitted to the other three.

    With the defaults the nodes' GRES (``gpu:tgpu:2``) are taken at their word: every probe must find 2
    GPUs, and these nodes have none a probe can use (no CUDA here), exactly like a node whose GPUs fell
    off the bus. Every run is ``fail``/``gpus_missing`` (never a CPU run: no figure is exported), and
    the default ``recommend`` mode recommends draining both idle nodes for it, naming the fault."""
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
    started = time.time()
    daemon = start(tmp_path, write_default_config(tmp_path, port), port, cluster.env)
    try:
        def probed() -> set[str]:
            return {str(n) for r in runs(port) for n in r["nodes"]}  # type: ignore[attr-defined]

        wait(lambda: probed() >= {"node4", "node5"}, 120 - (time.time() - started), "both idle nodes probed", daemon)
        print(f"both idle nodes probed {time.time() - started:.0f} s after start")
        assert probed() == {"node4", "node5"}, runs(port)
        done = wait(lambda: [r for r in runs(port) if r["state"] == "finished"], 180, "a finished run", daemon)
        # the probes due together run as one check per node: the probe it failed in is fail/gpus_missing,
        # the ones it never started are error ("not run: ..."); none passes on the CPU
        assert all((r["outcome"] == "fail" and "gpus_missing" in r["reason"] and "2 expected" in r["reason"])
                   or (r["outcome"] == "error" and r["reason"].startswith("not run: "))
                   for r in done), done  # type: ignore[attr-defined]
        assert any(r["outcome"] == "fail" for r in done), done  # type: ignore[attr-defined]
        assert probed() == {"node4", "node5"}, runs(port)

        def recommended() -> dict[str, str]:
            doc = json.loads(get(port, "/api/v1/recommendations")[1])
            return {r["node"]: r["reason_code"] for r in doc["recommendations"]}

        assert wait(lambda: recommended().keys() == {"node4", "node5"}, 240, "both drains recommended",
                    daemon)
        assert set(recommended().values()) == {"gpus_missing"}, recommended()
        assert "Reason=healthd" not in cluster.command("scontrol", "-o", "show", "node", "node4").stdout
        assert "healthd." not in cluster.command("squeue", "-h", "-w", "node1,node2,node3", "-o", "%j").stdout
        reason = cluster.command("scontrol", "-o", "show", "node", "node2").stdout
        assert "Reason=hw: bad PSU ticket 42" in reason
        values = samples(get(port, "/metrics")[1])
        assert ("healthd_slurm_up", {}, 1.0) in values
        assert ("healthd_node_info", {"node": "node4", "node_class": "tgpux2", "gpu_type": "tgpu"}, 1.0) in values
        assert not any(n.startswith(("healthd_gemm_", "healthd_ddp_", "healthd_nccl_")) and
                       not n.startswith("healthd_nccl_tests") for n, lab, _ in values), "a figure without GPUs"
    finally:
        daemon.kill()


def test_pair_all_reduce_across_two_nodes(tmp_path: Path, cluster: SlurmTestCluster) -> None:
    port = free_port()
    probes = "[probes.nccl]\ninterval_s = 3600\nnodes_per_job = 2\n"
    config = write_config(tmp_path, port, probes=probes, slurm_extra="exclude_nodes = ['node3', 'node4', 'node5']")
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


@pytest.mark.slurm_release  # a held job (extra_sbatch_args) seen pending, then scancel'ed
def test_pending_too_long_is_cancelled_as_skipped(tmp_path: Path, cluster: SlurmTestCluster) -> None:
    port = free_port()
    extra = ('pending_timeout_s = 3\nextra_sbatch_args = ["--hold"]\n'
             'exclude_nodes = ["node2", "node3", "node4", "node5"]')
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
                          slurm_extra='exclude_nodes = ["node3", "node4", "node5"]')
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
    """slurmctld stops while a probe runs: slurm_up goes 0 within one discover interval, nothing is planned
    or submitted, /healthz says the daemon is fine and Slurm is not; back within one interval of its return,
    the running probe's job is adopted and finishes (no second job, no duplicate run)."""
    pid = cluster.ctld_pid()
    if pid is None:
        pytest.skip("the cluster was not started by scripts/slurm-test-cluster.sh; cannot stop its slurmctld")
    port = free_port()
    interval = 3
    ticks = f"discover_interval_s = {interval}\nplan_interval_s = 1\ncollect_interval_s = 1"
    # The probe outlasts the outage: a job that ends while slurmctld is down is COMPLETING until its step's
    # completion RPC is retried, a minute later (slurmstepd), and the test would mostly wait for that. Its
    # time-based warm-up (10 s, up to 30 s while the per-call time still moves) keeps it running past the
    # controller's return (about 17 s after the stop); a run that still ends first passes, a minute slower.
    probes = ('[probes.gemm]\ninterval_s = 3600\ntimeout_s = 120\nargs = ["--dtypes", "fp32", "--size", "512", '
              '"--copy-bytes", "4M", "--warmup-seconds", "10"]\n[probes.nccl]\nenabled = false\n')
    config = write_config(tmp_path, port, probes=probes, scheduler=ticks,
                          slurm_extra='exclude_nodes = ["node2", "node3", "node4", "node5"]')
    daemon = start(tmp_path, config, port, cluster.env)
    try:
        def up() -> float | None:
            return next((v for n, lab, v in samples(get(port, "/metrics")[1]) if n == "healthd_slurm_up"), None)

        wait(lambda: up() == 1.0 and any(r["state"] == "running" for r in runs(port)), 60, "probe running", daemon)
        (run,) = runs(port)
        os.kill(pid, signal.SIGTERM)
        stopped = time.time()
        wait(lambda: up() == 0.0, interval + 35, "slurm down", daemon)  # + one command timeout for a hung call
        print(f"slurm_up 0 after {time.time() - stopped:.1f} s")
        status, body = get(port, "/healthz")
        assert status == 200 and "not answering" in body, body
        status, body = get(port, "/api/v1/nodes")
        assert status == 200 and len(json.loads(body)["nodes"]) == len(cluster.nodes)  # last known state
        submitted = daemon.log_path.read_text().count('"event": "probe_submitted"')
        time.sleep(2 * interval)
        assert up() == 0.0 and daemon.log_path.read_text().count('"event": "probe_submitted"') == submitted
        assert len(runs(port)) == 1
        cluster.start()
        back = time.time()
        wait(lambda: up() == 1.0, interval + 10, "slurm back", daemon)
        print(f"slurm_up 1 after {time.time() - back:.1f} s")
        status, body = get(port, "/healthz")
        assert status == 200 and "not answering" not in body, body
        (after,) = wait(lambda: [r for r in runs(port) if r["state"] == "finished"], 150, "the probe", daemon)  # type: ignore[misc]
        assert (after["run_id"], after["job_id"], after["outcome"]) == (run["run_id"], run["job_id"], "pass"), after
        assert len(runs(port)) == 1 and daemon.proc.poll() is None
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
    for node in cluster.nodes[:-1]:
        done = cluster.command("sbatch", "-J", "user-job", "-w", node, "--exclusive", "-o", "/dev/null",
                               "--wrap", "sleep 300")
        assert done.returncode == 0, done.stderr
    wait(lambda: cluster.command("sinfo", "-h", "-N", "-p", "batch", "-o", "%t").stdout.split().count("alloc")
         == len(cluster.nodes) - 1, 30, "all nodes but one allocated")
    port = free_port()
    daemon = start(tmp_path, write_config(tmp_path, port, probes=SWEEP), port, cluster.env)
    try:
        time.sleep(6)  # several discover and plan ticks
        assert runs(port) == []
        assert "healthd." not in cluster.command("squeue", "-h", "-o", "%j").stdout
    finally:
        daemon.kill()


def test_probe_on_demand(tmp_path: Path, cluster: SlurmTestCluster) -> None:
    """``healthd probe gemm --nodes ...`` asks the running daemon: the idle nodes are probed through Slurm
    (the probe is disabled for the regular plan) and their verdicts printed and stored; healthd's own
    drain is probed too (a recheck: its drain lifted inside healthd's reservation, restored after); a
    busy node and one drained by someone else are refused, each with its reason."""
    user = cluster.command("sbatch", "--parsable", "-J", "user-training", "-w", "node1", "--exclusive",
                           "-o", "/dev/null", "--wrap", "sleep 300")
    assert user.returncode == 0, user.stderr
    assert cluster.command("scontrol", "update", "nodename=node2", "state=drain",
                           "reason=hw: bad PSU ticket 42").returncode == 0
    assert cluster.command("scontrol", "update", "nodename=node3", "state=drain",
                           "reason=healthd: manual replaced GPU").returncode == 0
    wait(lambda: "alloc" in cluster.command("sinfo", "-h", "-n", "node1", "-o", "%t").stdout, 30, "user job running")
    port = free_port()
    config = write_config(tmp_path, port, probes="[probes.gemm]\nenabled = false\ntimeout_s = 120\n"
                                                 f"args = {SMALL_GEMM}\n[probes.nccl]\nenabled = false\n")
    daemon = start(tmp_path, config, port, cluster.env)
    try:
        asked = subprocess.run([sys.executable, "-m", "healthd.cli", "probe", "gemm", "--nodes", "node[1-4]",
                                "--node", "node5", "--config", str(config), "--json"],
                               env={**cluster.env, "PYTHONPATH": str(REPO)}, capture_output=True, text=True,
                               timeout=300, check=False)
        assert asked.returncode == 1, asked.stderr  # refusals: not every verdict passes
        report = {r["node"]: r for r in json.loads(asked.stdout)}
        assert (report["node1"]["state"], report["node1"]["detail"]) == ("refused", "busy: allocated, a job runs on it")
        assert report["node2"]["detail"] == "drained by someone else (reason: hw: bad PSU ticket 42)"
        for node in ("node3", "node4", "node5"):
            assert report[node]["state"] == "launched" and report[node]["verdict"] == "pass", report[node]
        stored = {str(r["run_id"]): r for r in runs(port)}
        assert {str(report[n]["run_id"]) for n in ("node3", "node4", "node5")} == set(stored)
        assert stored[str(report["node3"]["run_id"])]["kind"] == "reprobe"
        wait(lambda: "Reason=healthd: manual replaced GPU" in cluster.command("scontrol", "-o", "show", "node",
                                                                              "node3").stdout,
             30, "node3 drained again with its reason after the recheck")
        assert "healthd_recheck" not in cluster.command("scontrol", "show", "reservation").stdout
        assert all(r["outcome"] == "pass" for r in stored.values())
        assert "Reason=hw: bad PSU ticket 42" in cluster.command("scontrol", "-o", "show", "node", "node2").stdout
        text = subprocess.run([sys.executable, "-m", "healthd.cli", "probe", "gemm", "--node", "node4", "--config",
                               str(config)], env={**cluster.env, "PYTHONPATH": str(REPO)}, capture_output=True,
                              text=True, timeout=300, check=False)
        assert text.returncode == 0, text.stderr
        assert text.stdout.startswith("node4 gemm: pass (run "), text.stdout
    finally:
        daemon.kill()
