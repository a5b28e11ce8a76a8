"""The Slurm backend over ``FakeSlurmClient`` (no cluster): drain ownership, adoption of running jobs
after a restart, and the daemon's outage rules on the real ``Daemon`` with the backend injected."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from healthd.cluster.base import BackendTraits, ClusterBackend, ObservedBackend
from healthd.cluster.local import LocalBackend
from healthd.cluster.slurm_cli import SlurmClient
from healthd.collector import Collector
from healthd.config import Settings
from healthd.daemon import Daemon, plan_limits
from healthd.errors import PolicyRefused, SlurmError
from healthd.model import JobState, Outcome, ProbeJob
from healthd.planning import PlanLimits
from healthd.store import Store
from probes.result import Measurement, ProbeResult
from tests.fakes.slurm import FakeSlurmClient, fake_backend, gpu_node

PREFIX = "healthd:"


@pytest.fixture
def fake() -> FakeSlurmClient:
    return FakeSlurmClient([gpu_node(f"n{i}") for i in range(1, 5)])


def write_pass(path: Path, run_id: str, node: str) -> None:
    result = ProbeResult(probe="gemm", run_id=run_id, outcome=Outcome.PASS, started_at=1.0, finished_at=2.0,
                         nodes=[node], measurements=[Measurement(name="flop_per_second", value=7e14,
                                                                 labels={"gpu": "0"}, node=node)])
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(result.to_json())


def test_the_fake_and_every_backend_implement_their_protocols(fake: FakeSlurmClient, tmp_path: Path) -> None:
    assert isinstance(fake, SlurmClient)
    assert isinstance(fake_backend(fake, tmp_path), ClusterBackend)
    assert isinstance(LocalBackend(node_name="here", python=Path("python3")), ClusterBackend)
    assert isinstance(ObservedBackend(fake_backend(fake, tmp_path), lambda ok: None), ClusterBackend)


# -- traits: what the daemon used to read from backend.name ------------------------------------

def test_traits_give_the_plan_limits_and_capabilities_of_each_backend(fake: FakeSlurmClient, tmp_path: Path) -> None:
    settings = Settings(state_dir=tmp_path, local={"max_concurrent": 2},
                        slurm={"max_concurrent_jobs": 5, "max_idle_share": 0.5, "partitions": ["gpu"],
                               "exclude_nodes": ["n4"], "reservation": "maint"})
    slurm = fake_backend(fake, tmp_path).traits(settings)
    assert slurm == BackendTraits(5, 0.5, frozenset({"gpu"}), controller=True, probes_in_daemon=False,
                                  runs_jobs_on_drained=True)
    local = LocalBackend(node_name="here", python=Path("python3")).traits(settings)
    assert local == BackendTraits(2, 1.0, frozenset(), controller=False, probes_in_daemon=True,
                                  runs_jobs_on_drained=True)
    assert plan_limits(slurm, settings) == PlanLimits(5, 0.5, frozenset({"gpu"}), frozenset({"n4"}), "maint")
    assert plan_limits(local, settings) == PlanLimits(2, 1.0, frozenset(), frozenset({"n4"}), "maint")


# -- ownership ---------------------------------------------------------------------------------

def test_a_foreign_drain_is_never_touched(fake: FakeSlurmClient, tmp_path: Path) -> None:
    backend = fake_backend(fake, tmp_path)
    fake.admin_drain("n2", "PSU swap")
    with pytest.raises(PolicyRefused, match="already drained by someone else"):
        backend.drain("n2", f"{PREFIX} below_floor gemm")
    with pytest.raises(PolicyRefused, match="drained by someone else"):
        backend.undrain("n2")
    node = fake.node("n2")
    assert (node.drained, node.reason, node.reason_user) == (True, "PSU swap", "admin")
    assert fake.drains() == [] and fake.undrains() == []


def test_healthd_drains_with_its_prefix_and_undrains_only_its_own(fake: FakeSlurmClient, tmp_path: Path) -> None:
    backend = fake_backend(fake, tmp_path)
    with pytest.raises(PolicyRefused, match="must start with 'healthd:'"):
        backend.drain("n1", "below floor")
    with pytest.raises(PolicyRefused, match="is not drained"):
        backend.undrain("n1")
    backend.drain("n1", f"{PREFIX} below_floor gemm")
    node = fake.node("n1")
    assert node.drained and node.owned_by(PREFIX) and node.reason_user == fake.user
    backend.drain("n1", f"{PREFIX} wrong_data nccl")  # its own drain may be renewed
    assert fake.node("n1").reason == f"{PREFIX} wrong_data nccl"
    backend.undrain("n1")
    node = fake.node("n1")
    assert (node.drained, node.reason) == (False, None)
    assert fake.drains() == [("n1", f"{PREFIX} below_floor gemm"), ("n1", f"{PREFIX} wrong_data nccl")]
    assert fake.undrains() == ["n1"]


def test_a_down_node_keeps_its_state_and_reason_after_an_undrain(fake: FakeSlurmClient, tmp_path: Path) -> None:
    backend = fake_backend(fake, tmp_path)
    backend.drain("n3", f"{PREFIX} xid 79")
    fake.node_map["n3"] = replace(fake.node_map["n3"], state="down")
    backend.undrain("n3")
    node = fake.node("n3")
    assert (node.state, node.drained, node.reason) == ("down", False, f"{PREFIX} xid 79")


# -- submission and adoption -------------------------------------------------------------------

def test_submit_writes_a_script_the_fake_reads_like_sbatch(fake: FakeSlurmClient, tmp_path: Path) -> None:
    backend = fake_backend(fake, tmp_path / "results")
    backend.list_nodes()
    job_id = backend.submit(ProbeJob("r1", "nccl", ("n1", "n2")), tmp_path / "results" / "r1.json")
    job = fake.jobs_by_id[job_id]
    assert (job.name, job.nodes, job.state, job.result_path) == (
        "healthd.nccl.r1", ("n1", "n2"), JobState.PENDING, tmp_path / "results" / "r1.json")
    assert backend.poll([job_id])[job_id].state is JobState.PENDING
    fake.start(job_id)
    assert {n.name: n.state for n in backend.list_nodes()} == {"n1": "allocated", "n2": "allocated", "n3": "idle",
                                                               "n4": "idle"}
    backend.cancel([job_id])
    assert backend.poll([job_id])[job_id].state is JobState.CANCELLED
    assert fake.node("n1").state == "idle"


def test_a_restart_adopts_running_jobs_without_a_second_submission(fake: FakeSlurmClient, tmp_path: Path) -> None:
    results = tmp_path / "results"
    store = Store(tmp_path / "s.sqlite")
    first = Collector(store, fake_backend(fake, results), results)
    ids = [first.launch(ProbeJob(f"r{i}", "gemm", (f"n{i}",))) for i in (1, 2)]
    fake.start_all()
    # the daemon died between sbatch and recording the job id of a third run
    store.add_run(run_id="r3", probe="gemm", nodes=("n3",), backend="slurm", job_id=None, submitted_at=time.time(),
                  result_path=str(results / "r3.json"))
    lost = fake_backend(fake, results).submit(ProbeJob("r3", "gemm", ("n3",)), results / "r3.json")

    again = Collector(store, fake_backend(fake, results), results)  # a fresh daemon on the same store
    assert again.recover() == []
    assert fake.submitted() == [*ids, lost]
    assert {r.run_id: r.job_id for r in store.unfinished_runs()} == {"r1": ids[0], "r2": ids[1], "r3": lost}
    for job_id, run_id, node in ((ids[0], "r1", "n1"), (ids[1], "r2", "n2")):
        write_pass(results / f"{run_id}.json", run_id, node)
        fake.finish(str(job_id))
    done = again.collect()
    assert sorted((c.run_id, c.outcome) for c in done) == [("r1", Outcome.PASS), ("r2", Outcome.PASS)]
    assert [r.run_id for r in store.unfinished_runs()] == ["r3"]  # still pending, still its one job
    assert fake.submitted() == [*ids, lost]


def test_a_restart_closes_runs_whose_job_is_gone(fake: FakeSlurmClient, tmp_path: Path) -> None:
    results = tmp_path / "results"
    store = Store(tmp_path / "s.sqlite")
    job_id = Collector(store, fake_backend(fake, results), results).launch(ProbeJob("r1", "gemm", ("n1",)))
    fake.start_all()
    fake.finish(str(job_id), JobState.FAILED, exit_code=1)
    fake.purge()
    (closed,) = Collector(store, fake_backend(fake, results), results).recover()
    assert (closed.run_id, closed.outcome, closed.reason) == ("r1", Outcome.ERROR,
                                                              "daemon restart: the probe was interrupted")


# -- outages on the real daemon ------------------------------------------------------------------

@pytest.fixture
def daemon(fake: FakeSlurmClient, tmp_path: Path) -> Iterator[Daemon]:
    settings = Settings(backend="slurm", state_dir=tmp_path / "state", http={"host": "127.0.0.1", "port": 0},
                        probes={"gemm": {"interval_s": 600.0, "timeout_s": 120.0}})
    d = Daemon(settings, None, backend=fake_backend(fake, settings.results_dir))
    yield d
    d.http._server.server_close()
    d.store.close()


def gauges(daemon: Daemon) -> tuple[float | None, float | None]:
    registry = daemon.registry
    return (registry.get_sample_value("healthd_backend_up", {"backend": daemon.backend.name}),
            registry.get_sample_value("healthd_slurm_up"))


@pytest.mark.parametrize("outage", ["down", "timeout"])
def test_an_outage_sets_the_gauges_to_zero_submits_nothing_and_recovers(
    daemon: Daemon, fake: FakeSlurmClient, outage: str
) -> None:
    daemon.discover()
    assert gauges(daemon) == (1.0, 1.0)
    daemon.plan_and_launch()
    submitted = fake.submitted()
    assert len(submitted) == 1  # the Slurm traits: at most a quarter of the idle nodes
    fake.start_all()
    daemon.collect()

    fake.outage = outage  # type: ignore[assignment]
    with pytest.raises(SlurmError):
        daemon.discover()
    assert gauges(daemon) == (0.0, 0.0)
    with pytest.raises(SlurmError):
        daemon.collect()
    assert gauges(daemon) == (0.0, 0.0)
    assert [r.state for r in daemon.store.unfinished_runs()] == ["running"]  # not closed as an error
    fake.finish(submitted[0])
    daemon.plan_and_launch()
    assert fake.submitted() == submitted and len(daemon.store.recent_runs()) == 1

    fake.outage = None
    daemon.discover()
    assert gauges(daemon) == (1.0, 1.0)
    daemon.collect()
    assert daemon.store.unfinished_runs() == []
    daemon.plan_and_launch()
    assert len(fake.submitted()) == 2


def test_the_local_backend_never_reports_a_slurm_controller(tmp_path: Path) -> None:
    settings = Settings(backend="local", state_dir=tmp_path / "state", http={"host": "127.0.0.1", "port": 0})
    d = Daemon(settings, None, backend=LocalBackend(node_name="here", python=Path("python3")))
    try:
        d.discover()
        assert gauges(d) == (1.0, 0.0)
    finally:
        d.http._server.server_close()
        d.store.close()


def test_observed_backend_reports_each_call() -> None:
    seen: list[bool] = []
    fake = FakeSlurmClient([gpu_node("n1")])
    observed = ObservedBackend(fake_backend(fake, Path("/nonexistent")), seen.append)
    observed.list_nodes()
    fake.outage = "down"
    with pytest.raises(SlurmError):
        observed.poll(["1"])
    fake.outage = None
    with pytest.raises(PolicyRefused):
        observed.undrain("n1")  # a refusal says nothing about the cluster
    observed.forget(["1"])
    assert seen == [True, False]
    assert observed.poll(["1"]) == {}
    assert seen == [True, False, True]
