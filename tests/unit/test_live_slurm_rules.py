"""Sharing Slurm with users, on the real ``Daemon`` over ``FakeSlurmClient``: plans from node states
read at plan time, a pending probe never holds up probes of other idle nodes, pre-emption is
``skipped``, and /healthz tells a Slurm outage apart from a sick daemon. The same rules on a real
cluster: tests/integration/test_slurm_live.py and test_daemon_slurm.py."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from healthd.config import Settings
from healthd.daemon import Daemon
from healthd.errors import SlurmError
from healthd.model import JobState, Outcome
from tests.fakes.slurm import FakeSlurmClient, fake_backend, gpu_node


@pytest.fixture
def fake() -> FakeSlurmClient:
    return FakeSlurmClient([gpu_node(f"n{i}") for i in range(1, 5)])


def make_daemon(fake: FakeSlurmClient, tmp_path: Path, **slurm: object) -> Daemon:
    settings = Settings(backend="slurm", state_dir=tmp_path / "state", http={"host": "127.0.0.1", "port": 0},
                        probes={"gemm": {"interval_s": 600.0, "timeout_s": 120.0}, "nccl": {"enabled": False}},
                        slurm={"max_idle_share": 1.0, **slurm}, scheduler={"plan_interval_s": 0.05})
    return Daemon(settings, None, backend=fake_backend(fake, settings.results_dir))


@pytest.fixture
def daemon(fake: FakeSlurmClient, tmp_path: Path) -> Iterator[Daemon]:
    d = make_daemon(fake, tmp_path, max_concurrent_jobs=8)
    yield d
    d.http._server.server_close()
    d.store.close()


def probed(fake: FakeSlurmClient) -> list[str]:
    return sorted(n for job in fake.jobs_by_id.values() for n in job.nodes)


def test_a_user_job_that_started_after_discovery_is_seen_at_plan_time(daemon: Daemon, fake: FakeSlurmClient) -> None:
    daemon.discover()  # every node idle
    fake.occupy("n1")  # a user's job starts between discovery and the plan tick
    fake.admin_drain("n2", "hw: fan")
    daemon.plan_and_launch()
    assert probed(fake) == ["n3", "n4"]
    assert {n.name: n.state for n in daemon.store.nodes()}["n1"] == "allocated"  # the plan's read is stored


def test_a_pending_probe_never_holds_up_probes_of_other_idle_nodes(fake: FakeSlurmClient, tmp_path: Path) -> None:
    d = make_daemon(fake, tmp_path, max_concurrent_jobs=1)
    try:
        d.plan_and_launch()
        (first,) = fake.jobs_by_id.values()
        assert first.state is JobState.PENDING  # a user got the node between our read and sbatch
        d.plan_and_launch()
        assert len(fake.jobs_by_id) == 1  # just submitted: it counts against the cap of 1
        time.sleep(0.1)  # one plan interval later it has lost its node
        d.plan_and_launch()
        assert len(fake.jobs_by_id) == 2 and first.nodes[0] not in probed(fake)[1:]
        second = max(fake.jobs_by_id, key=int)
        fake.start(second)
        d.collect()
        time.sleep(0.1)
        d.plan_and_launch()
        assert len(fake.jobs_by_id) == 2  # a running probe counts: the cap holds
    finally:
        d.http._server.server_close()
        d.store.close()


def test_a_probe_pending_on_a_node_a_user_took_leaves_the_idle_share_to_the_other_idle_nodes(
        fake: FakeSlurmClient, tmp_path: Path) -> None:
    """Issue 26: 4 nodes, 3 idle; the probe of the first pends because a user took its node. That node is
    no longer idle: the next plan probes another idle node (it waited 90 s, until the cancel, before)."""
    d = make_daemon(fake, tmp_path, max_concurrent_jobs=8, max_idle_share=0.25)
    try:
        fake.occupy("n4")
        d.plan_and_launch()
        (first,) = fake.jobs_by_id.values()
        fake.occupy(first.nodes[0])  # a user's job took it right after our read
        d.plan_and_launch()
        assert len(fake.jobs_by_id) == 2 and first.state is JobState.PENDING
        second = max(fake.jobs_by_id, key=int)
        fake.start(second)
        d.collect()
        d.plan_and_launch()
        assert len(fake.jobs_by_id) == 2  # our probe running on its node holds the share of 3 idle nodes
    finally:
        d.http._server.server_close()
        d.store.close()


def test_the_collector_cancels_a_probe_pending_past_its_timeout_as_skipped(fake: FakeSlurmClient,
                                                                            tmp_path: Path) -> None:
    d = make_daemon(fake, tmp_path, max_concurrent_jobs=1, pending_timeout_s=0.05)
    try:
        d.plan_and_launch()
        (job,) = fake.jobs_by_id.values()
        time.sleep(0.1)
        d.collect()
        (run,) = d.store.recent_runs()
        assert (run.outcome, job.state) == (Outcome.SKIPPED, JobState.CANCELLED)
        assert "still pending" in run.reason
    finally:
        d.http._server.server_close()
        d.store.close()


def test_a_preempted_probe_is_skipped(daemon: Daemon, fake: FakeSlurmClient) -> None:
    daemon.plan_and_launch()
    job_id = min(fake.jobs_by_id, key=int)
    fake.start(job_id)
    daemon.collect()
    fake.finish(job_id, JobState.PREEMPTED, exit_code=0, reason="PREEMPTED")
    daemon.collect()
    run = next(r for r in daemon.store.recent_runs() if r.job_id == job_id)
    assert run.outcome is Outcome.SKIPPED and run.reason.startswith("pre-empted"), run


def test_healthz_says_the_daemon_is_fine_and_slurm_is_not(daemon: Daemon, fake: FakeSlurmClient) -> None:
    daemon.scheduler.start(paused=True)
    try:
        daemon._heartbeat = time.monotonic()
        daemon.discover()
        ok, text = daemon.healthy()
        assert ok and "not answering" not in text
        fake.outage = "down"
        with pytest.raises(SlurmError):
            daemon.discover()
        ok, text = daemon.healthy()
        assert ok and "slurm controller not answering" in text and "nothing is planned" in text, text
        daemon.plan_and_launch()
        assert fake.jobs_by_id == {}
        fake.outage = None
        daemon.discover()
        ok, text = daemon.healthy()
        assert ok and "not answering" not in text
    finally:
        daemon.scheduler.shutdown(wait=False)


def test_a_probe_job_names_the_gpus_the_node_had(daemon: Daemon, fake: FakeSlurmClient) -> None:
    """The planner's job expects the node's 8 GRES GPUs; the daemon adds the UUIDs its inventory holds for
    the node (from an earlier run's environment), so a probe that finds fewer names the missing ones."""
    from probes.result import DeviceInfo, Environment, ProbeResult, RankInfo

    devices = [DeviceInfo(index=g, name="NVIDIA H100 80GB HBM3", uuid=f"GPU-0000000{g}-aaaa") for g in range(8)]
    rank = RankInfo(rank=0, local_rank=0, world_size=1, local_world_size=1, hostname="n1", node="n1", device="cuda:0",
                    devices=devices)
    env = Environment(launcher="srun", backend="nccl", device_type="cuda", python="3.11", ranks=[rank])
    earlier = ProbeResult(probe="env", run_id="0000000000000001", outcome=Outcome.PASS, started_at=time.time() - 60,
                          finished_at=time.time() - 50, nodes=["n1"], environment=env)
    daemon.store.record_result(earlier, nodes=["n1"], backend="ingest", source="ingest", result_path=None)
    daemon.discover()
    daemon.plan_and_launch()
    scripts = {job.nodes[0]: Path(job.script).read_text() for job in fake.jobs_by_id.values()}
    srun = scripts["n1"].splitlines()[-1]
    assert "--expect-gpus 8 --expect-gpu-uuids " + ",".join(d.uuid or "" for d in devices) in srun, srun
    assert "--expect-gpus 8" in scripts["n2"] and "--expect-gpu-uuids" not in scripts["n2"]
