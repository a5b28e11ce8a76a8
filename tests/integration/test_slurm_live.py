"""Sharing a real Slurm cluster with its users (22.05 here, 24.11 and 26.05 in the matrix).

- FIFO priority (the test cluster's ``priority/basic``): a probe that went pending on a busy node never
  starts ahead of a user job submitted after it; without healthd's ``--nice`` it would (the control).
- A user's job that starts after healthd's discovery is seen by the plan tick itself: nothing is
  submitted to that node.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import pytest

from healthd.cluster.slurm import SlurmBackend
from healthd.jobs import DEFAULT_NICE, LaunchSettings
from healthd.model import ProbeJob
from tests.integration.conftest import SlurmTestCluster
from tests.integration.daemons import free_port
from tests.integration.test_daemon_slurm import runs, start, wait, write_config

pytestmark = [pytest.mark.slurm, pytest.mark.slow]


def start_time(cluster: SlurmTestCluster, job_id: str) -> float | None:
    """When the job started (epoch seconds), from the controller; None while it pends."""
    out = cluster.command("squeue", "-h", "-j", job_id, "-t", "all", "-o", "%T|%S").stdout.strip()
    state, _, start_at = out.partition("|")
    if state in ("PENDING", "") or start_at in ("N/A", ""):
        return None
    return time.mktime(time.strptime(start_at, "%Y-%m-%dT%H:%M:%S"))


def priority(cluster: SlurmTestCluster, job_id: str) -> int:
    return int(cluster.command("squeue", "-h", "-j", job_id, "-o", "%Q").stdout.strip() or 0)


def user_job(cluster: SlurmTestCluster, node: str, seconds: int, name: str) -> str:
    done = cluster.command("sbatch", "--parsable", "-J", name, "-w", node, "--exclusive", "-o", "/dev/null",
                           "--wrap", f"sleep {seconds}")
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().split(";")[0]


@pytest.mark.slurm_release  # the scheduler's own order: priority/basic and nice differ between releases
@pytest.mark.parametrize("nice", [DEFAULT_NICE, 0], ids=["healthd-nice", "control-without-nice"])
def test_a_pending_probe_never_starts_before_a_later_user_job(tmp_path: Path, cluster: SlurmTestCluster,
                                                             nice: int) -> None:
    holder = user_job(cluster, "node1", 300, "user-job-a")
    wait(lambda: start_time(cluster, holder), 30, "the user job running")
    backend = SlurmBackend(cluster.cli(), LaunchSettings(python=sys.executable, results_dir=tmp_path, nice=nice))
    pid = cluster.ctld_pid()
    if pid is not None:  # a controller restart with a probe queued: Slurm's largest nice wraps around after it
        queued = backend.submit(ProbeJob("feedfacecafe0000", "env", ("node1",), timeout_s=60.0),
                                tmp_path / "feedfacecafe0000.json")
        os.kill(pid, signal.SIGTERM)
        wait(lambda: cluster.ctld_pid() is None, 30, "slurmctld stopped")
        cluster.start()
        backend.cancel([queued])
    probe = backend.submit(ProbeJob("feedfacecafe0001", "env", ("node1",), timeout_s=60.0),
                           tmp_path / "feedfacecafe0001.json")
    time.sleep(1)
    later = user_job(cluster, "node1", 5, "user-job-b")
    time.sleep(1)
    assert start_time(cluster, probe) is None and start_time(cluster, later) is None  # both wait for node1
    if nice and priority(cluster, probe) == priority(cluster, later) == 1:
        cluster.command("scancel", holder, probe, later)
        pytest.skip(f"Slurm {cluster.version[0]}.{cluster.version[1]:02d} priority/basic gives every job priority 1 "
                    "(FIFO by submission, nice ignored): there healthd's bound is pending_timeout_s, not the nice")
    assert cluster.command("scancel", holder).returncode == 0  # the first user's job ends
    first = wait(lambda: start_time(cluster, probe) or start_time(cluster, later), 90, "node1 free again")
    probe_start, later_start = start_time(cluster, probe), start_time(cluster, later)
    print(f"nice={nice}: probe started at {probe_start}, the later user job at {later_start} (first {first})")
    if nice:
        assert later_start is not None and probe_start is None, (probe_start, later_start)
    else:
        assert probe_start is not None and later_start is None, (probe_start, later_start)


def test_a_user_job_started_after_discovery_gets_no_probe(tmp_path: Path, cluster: SlurmTestCluster) -> None:
    """Discovery only at start (interval 1 h): the plan tick reads the states itself."""
    port = free_port()
    probes = "[probes.env]\ninterval_s = 3600\n[probes.gemm]\nenabled = false\n[probes.nccl]\nenabled = false\n"
    config = write_config(tmp_path, port, probes=probes,
                          scheduler="discover_interval_s = 3600\nplan_interval_s = 2\ncollect_interval_s = 1",
                          slurm_extra="max_concurrent_jobs = 1")
    daemon = start(tmp_path, config, port, cluster.env)
    try:
        (first,) = wait(lambda: runs(port), 30, "the first probe", daemon)  # type: ignore[misc]
        probed = first["nodes"][0]  # type: ignore[index]
        others = [node for node in cluster.nodes if node != probed]
        for node in others:  # users take every other node after healthd's discovery
            user_job(cluster, node, 120, "user-job")
        wait(lambda: cluster.command("sinfo", "-h", "-N", "-p", "batch", "-n", ",".join(others), "-o", "%t")
             .stdout.split() == ["alloc"] * len(others), 30, "the users' jobs running")
        # a probe submitted while a user's job was still starting is the race healthd cannot see (it pends
        # at the lowest priority and is cancelled); once the jobs run, nothing more may be submitted
        before = {r["run_id"] for r in runs(port)}
        wait(lambda: [r for r in runs(port) if r["state"] == "finished"], 150, "the first probe done", daemon)
        time.sleep(8)  # several plan ticks with a free cap and stale discovery data
        assert [r for r in runs(port) if r["run_id"] not in before] == [], runs(port)
    finally:
        daemon.kill()
