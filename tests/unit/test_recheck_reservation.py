"""Rechecks of healthd's own drains on Slurm: the reservation's argv and parser, and the backend's lift and
restore over ``FakeSlurmClient`` (a drained node runs no job, reservation or not, so the drain is lifted
while the node sits in healthd's reservation)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from healthd.cluster import slurm_argv as argv
from healthd.cluster.slurm import SlurmBackend
from healthd.cluster.slurm_parse import Reservation, parse_reservation
from healthd.errors import InvalidNodeName, ParseError, PolicyRefused, SlurmError
from healthd.jobs import LaunchSettings
from healthd.model import JobState, ProbeJob, RunKind
from tests.fakes.slurm import FakeSlurmClient, gpu_node
from tests.golden_files import assert_golden

SCONTROL = ["scontrol"]
RES = "healthd_recheck"
REASON = "healthd: check_failed gemm gpu 0 check:gemm.correct run rp1"


def test_reservation_argv_golden() -> None:
    lines = [
        argv.reservation_show_argv(SCONTROL, RES),
        argv.reservation_create_argv(SCONTROL, RES, "healthd", ["n3", "n1", "n3"]),
        argv.reservation_update_argv(SCONTROL, RES, ["n2", "n1"]),
        argv.reservation_delete_argv(["sudo", "-n", "scontrol"], RES),
    ]
    assert_golden("scontrol_reservation_argv.txt", "\n".join(" ".join(a) for a in lines) + "\n")


@pytest.mark.parametrize("name", ["maint", "root_1", "healthd recheck", "healthd;x", "", "Healthd_x", "healthd" * 20])
def test_only_healthds_own_reservation_names_reach_an_argv(name: str) -> None:
    with pytest.raises(ValueError, match="not a reservation name of healthd's"):
        argv.reservation_delete_argv(SCONTROL, name)


def test_reservation_argv_refuses_bad_users_and_node_lists() -> None:
    for user in ("", "root,alice", "-x", "a b"):
        with pytest.raises(ValueError, match="not a user name"):
            argv.reservation_create_argv(SCONTROL, RES, user, ["n1"])
    with pytest.raises(ValueError, match="at least one node"):
        argv.reservation_update_argv(SCONTROL, RES, [])
    with pytest.raises(ValueError, match="at least one node"):
        argv.reservation_update_argv(SCONTROL, RES, "n1")
    with pytest.raises(InvalidNodeName):
        argv.reservation_update_argv(SCONTROL, RES, ["n1", "n2 Users=alice"])


LINE_22_05 = (
    "ReservationName=healthd_recheck StartTime=2026-11-24T03:09:09 EndTime=2027-11-24T03:09:09 "
    "Duration=365-00:00:00 Nodes=node[4-5] NodeCnt=2 CoreCnt=4 Features=(null) PartitionName=(null) "
    "Flags=IGNORE_JOBS,SPEC_NODES TRES=cpu=4 Users=root Groups=(null) Accounts=(null) Licenses=(null) "
    "State=ACTIVE BurstBuffer=(null) Watts=n/a MaxStartDelay=(null)\n"
)


def test_parse_reservation_of_scontrol_oneliner() -> None:
    assert parse_reservation(LINE_22_05) == Reservation(RES, ("node4", "node5"), ("root",))
    accounts_only = LINE_22_05.replace("Users=root", "Users=(null)")
    assert parse_reservation(accounts_only).users == ()
    for bad in ("", LINE_22_05 * 2, "Nodes=node1\n"):
        with pytest.raises(ParseError):
            parse_reservation(bad)


# -- the backend ---------------------------------------------------------------------------------------
@pytest.fixture
def fake() -> FakeSlurmClient:
    fake = FakeSlurmClient([gpu_node(f"n{i}") for i in range(1, 5)], user="healthd")
    fake.drain("n1", REASON)
    fake.commands.clear()
    return fake


def backend(fake: FakeSlurmClient, tmp_path: Path) -> SlurmBackend:
    return SlurmBackend(fake, LaunchSettings(python="python3", results_dir=tmp_path), user="healthd")


def recheck(*nodes: str, run_id: str = "rp1") -> ProbeJob:
    return ProbeJob(run_id, "gemm", nodes, kind=RunKind.REPROBE)


def test_a_recheck_of_an_own_drain_runs_in_the_reservation_and_the_drain_comes_back(
    fake: FakeSlurmClient, tmp_path: Path
) -> None:
    b = backend(fake, tmp_path)
    job_id = b.submit(recheck("n1"), tmp_path / "rp1.json")
    assert fake.commands == [("reserve", RES, "n1"), ("undrain", "n1"), ("sbatch", job_id)]
    assert fake.jobs_by_id[job_id].reservation == RES
    assert "#SBATCH --reservation=healthd_recheck" in (tmp_path / "rp1.sbatch").read_text()
    assert (tmp_path / "rp1.lift.json").exists()
    assert [j.job_id for j in fake.start_all()] == [job_id]
    fake.finish(job_id)

    fake.commands.clear()
    b.forget([job_id])
    assert fake.commands == [("drain", "n1", REASON), ("delete_reservation", RES)]
    assert fake.node("n1").drained and fake.node("n1").reason == REASON
    assert fake.reservations == {} and not (tmp_path / "rp1.lift.json").exists()
    b.forget([job_id])
    assert len(fake.commands) == 2


def test_without_the_reservation_a_user_job_could_take_the_lifted_node(fake: FakeSlurmClient, tmp_path: Path) -> None:
    b = backend(fake, tmp_path)
    b.submit(recheck("n1"), tmp_path / "rp1.json")
    user = b.submit(ProbeJob("u1", "gemm", ("n1",)), tmp_path / "u1.json")
    assert fake.jobs_by_id[user].reservation is None
    started = {j.job_id for j in fake.start_all()}
    assert user not in started and len(started) == 1


def test_a_second_recheck_extends_the_reservation_and_its_end_shrinks_it(
    fake: FakeSlurmClient, tmp_path: Path
) -> None:
    fake.drain("n2", REASON.replace("rp1", "rp2"))
    b = backend(fake, tmp_path)
    first = b.submit(recheck("n1"), tmp_path / "rp1.json")
    second = b.submit(recheck("n2", "n3", run_id="rp2"), tmp_path / "rp2.json")
    assert fake.reservations[RES].nodes == ("n1", "n2", "n3")
    fake.start_all()
    fake.finish(first)
    b.forget([first])
    assert fake.reservations[RES].nodes == ("n2", "n3")
    assert fake.node("n1").drained and not fake.node("n2").drained and not fake.node("n3").drained
    fake.finish(second)
    b.forget([second])
    assert fake.reservations == {}
    assert fake.node("n2").drained and not fake.node("n3").drained  # the partner was never drained


def test_nodes_drained_by_others_and_plain_probes_are_not_lifted(fake: FakeSlurmClient, tmp_path: Path) -> None:
    fake.admin_drain("n2", "hw: bad PSU ticket 42")
    b = backend(fake, tmp_path)
    b.submit(recheck("n2"), tmp_path / "rp1.json")
    b.submit(ProbeJob("p1", "gemm", ("n1",)), tmp_path / "p1.json")
    assert [c[0] for c in fake.commands] == ["sbatch", "sbatch"]
    assert fake.reservations == {} and fake.start_all() == []
    assert fake.node("n2").reason == "hw: bad PSU ticket 42"


def test_a_reservation_of_that_name_that_is_not_healthds_is_left_alone(
    fake: FakeSlurmClient, tmp_path: Path
) -> None:
    fake.reservations[RES] = Reservation(RES, ("n4",), ("alice",))
    b = backend(fake, tmp_path)
    with pytest.raises(PolicyRefused, match="not healthd's"):
        b.submit(recheck("n1"), tmp_path / "rp1.json")
    assert fake.reservations[RES] == Reservation(RES, ("n4",), ("alice",))
    assert fake.node("n1").reason == REASON and fake.submitted() == []
    assert not (tmp_path / "rp1.lift.json").exists()


def test_a_refused_sbatch_restores_the_drain(fake: FakeSlurmClient, tmp_path: Path) -> None:
    b = backend(fake, tmp_path)
    with pytest.raises(SlurmError):
        b.submit(recheck("n1", "n9"), tmp_path / "rp1.json")  # sbatch: invalid node name
    assert fake.node("n1").reason == REASON and fake.reservations == {}
    assert not (tmp_path / "rp1.lift.json").exists()


def test_a_draining_node_is_not_rechecked(fake: FakeSlurmClient, tmp_path: Path) -> None:
    fake.occupy("n1")
    with pytest.raises(SlurmError, match="still running jobs"):
        backend(fake, tmp_path).submit(recheck("n1"), tmp_path / "rp1.json")
    assert fake.commands == [] and fake.reservations == {}


def test_a_drain_set_by_someone_during_the_recheck_is_kept(fake: FakeSlurmClient, tmp_path: Path) -> None:
    b = backend(fake, tmp_path)
    job_id = b.submit(recheck("n1"), tmp_path / "rp1.json")
    fake.start_all()
    fake.admin_drain("n1", "hw: replace GPU 3")
    fake.finish(job_id)
    b.forget([job_id])
    assert fake.node("n1").reason == "hw: replace GPU 3" and fake.reservations == {}


def test_a_restarted_daemon_restores_the_drains_of_rechecks_whose_jobs_are_gone(
    fake: FakeSlurmClient, tmp_path: Path
) -> None:
    fake.drain("n2", REASON.replace("rp1", "rp2"))
    before = backend(fake, tmp_path)
    gone = before.submit(recheck("n1"), tmp_path / "rp1.json")
    alive = before.submit(recheck("n2", run_id="rp2"), tmp_path / "rp2.json")
    fake.start_all()
    fake.finish(gone, JobState.COMPLETED)
    fake.purge()

    after = backend(fake, tmp_path)
    assert [j.job_id for j in after.adopt()] == [alive]
    assert fake.node("n1").reason == REASON and fake.reservations[RES].nodes == ("n2",)
    fake.finish(alive)
    after.forget([alive])
    assert fake.node("n2").reason == REASON.replace("rp1", "rp2") and fake.reservations == {}
    assert list(tmp_path.glob("*.lift.json")) == []


def test_a_restore_that_fails_is_tried_again_at_the_next_forget(fake: FakeSlurmClient, tmp_path: Path) -> None:
    b = backend(fake, tmp_path)
    job_id = b.submit(recheck("n1"), tmp_path / "rp1.json")
    fake.start_all()
    fake.finish(job_id)
    fake.outage = "down"
    b.forget([job_id])
    fake.outage = None
    assert not fake.node("n1").drained
    b.forget([])
    assert fake.node("n1").reason == REASON and fake.reservations == {}


def test_the_lift_record_names_the_nodes_and_their_reasons(fake: FakeSlurmClient, tmp_path: Path) -> None:
    backend(fake, tmp_path).submit(recheck("n1", "n2"), tmp_path / "rp1.json")
    assert json.loads((tmp_path / "rp1.lift.json").read_text()) == {"nodes": ["n1", "n2"], "reasons": {"n1": REASON}}
