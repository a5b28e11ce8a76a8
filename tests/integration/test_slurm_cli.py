"""Contract tests of ``SlurmCli`` against the real Slurm test cluster (scripts/slurm-test-cluster.sh).

The same tests run against every release (``scripts/slurm-matrix.sh``: 22.05, 24.11, 26.05); where
Slurm itself differs (which command gives per-node JSON, how a failing controller is reported), the
expectation follows the release's ``JsonDialect``. Each test uses its own job-name prefix, so jobs
left in the controller's memory by earlier tests or runs (``MinJobAge``) do not matter.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from healthd.cluster.slurm_argv import JSON_DIALECTS, JsonDialect
from healthd.cluster.slurm_cli import SlurmCli, SlurmClient, SlurmCommands
from healthd.cluster.slurm_parse import Reservation
from healthd.errors import SlurmError, SlurmTimeout
from healthd.model import JobState, JobStatus
from healthd.planning import PlanLimits, why_not_probeable
from tests.integration.conftest import wait_for as wait_until

if TYPE_CHECKING:
    from tests.integration.conftest import SlurmTestCluster



class Calls:
    """Observer that counts the commands a client runs."""

    def __init__(self) -> None:
        self.names: list[str] = []
        self.ok: list[bool] = []

    def __call__(self, name: str, seconds: float, ok: bool) -> None:
        assert 0 <= seconds < 60
        self.names.append(name)
        self.ok.append(ok)


def dialect_of(cluster: SlurmTestCluster) -> JsonDialect:
    return JSON_DIALECTS[cluster.release]


def prefix() -> str:
    return f"healthd.it-{uuid.uuid4().hex[:8]}."


def script(tmp_path: Path, body: str) -> Path:
    path = tmp_path / f"job-{uuid.uuid4().hex[:6]}.sh"
    path.write_text(f"#!/bin/sh\n{body}\n")
    return path


def submit(cli: SlurmCli, tmp_path: Path, name: str, body: str, *opts: str) -> str:
    return cli.submit(script(tmp_path, body), extra_args=["--job-name", name, "--output=/dev/null", *opts])


def wait_for(
    cli: SlurmCli, name_prefix: str, job_id: str, done: Callable[[JobStatus], bool], timeout: float = 60.0
) -> tuple[JobStatus, list[JobState]]:
    """Poll ``jobs()`` until ``done(job)``; returns the job and the states seen on the way."""
    seen: list[JobState] = []
    deadline = time.monotonic() + timeout
    while True:
        jobs = {j.job_id: j for j in cli.jobs(name_prefix)}
        assert job_id in jobs, f"job {job_id} missing from jobs({name_prefix!r}): {sorted(jobs)}"
        job = jobs[job_id]
        if not seen or seen[-1] is not job.state:
            seen.append(job.state)
        if done(job):
            return job, seen
        assert time.monotonic() < deadline, f"job {job_id} still {job.state} after {timeout} s"
        time.sleep(0.3)


# --- no cluster needed ---------------------------------------------------------------------------


def test_a_command_past_its_timeout_raises_slurm_timeout_quickly() -> None:
    squeue = ("sh", "-c", "sleep 30", "squeue")
    cli = SlurmCli(SlurmCommands(squeue=squeue), timeout_s=0.5, output="json", release=(22, 5))
    started = time.monotonic()
    with pytest.raises(SlurmTimeout, match=r"squeue did not answer within 0\.5 s"):
        cli.jobs("healthd.")
    assert time.monotonic() - started < 5


def test_a_missing_command_raises_slurm_error() -> None:
    cli = SlurmCli(SlurmCommands(sinfo=("/nonexistent/bin/sinfo",)))
    with pytest.raises(SlurmError, match="cannot run '/nonexistent/bin/sinfo'"):
        cli.nodes()


def test_the_client_satisfies_its_protocol() -> None:
    assert isinstance(SlurmCli(), SlurmClient)


# --- the real cluster ----------------------------------------------------------------------------


@pytest.mark.slurm
@pytest.mark.slurm_release
def test_version(slurm_cluster: SlurmTestCluster) -> None:
    major, minor, micro = slurm_cluster.cli().version()
    assert f" {major}.{minor:02d}.{micro}" in slurm_cluster.command("scontrol", "--version").stdout
    expected = os.environ.get("HEALTHD_SLURM_EXPECT_RELEASE")  # set by scripts/slurm-matrix.sh
    if expected:
        assert f"{major}.{minor:02d}" == expected
    assert slurm_cluster.cli().dialect().release == (major, minor)  # a release healthd knows


@pytest.mark.slurm
@pytest.mark.slurm_release
def test_nodes_with_gres_partitions_and_features(slurm_cluster: SlurmTestCluster) -> None:
    calls = Calls()
    nodes = slurm_cluster.cli(observer=calls).nodes()
    assert [n.name for n in nodes] == list(slurm_cluster.nodes)
    for n in nodes:
        assert (n.gpus, n.gpu_type, n.partitions, n.features, n.cpus) == (
            2,
            "tgpu",
            ("batch", "gpu"),
            ("fake", "tgpu"),
            2,
        )
        assert n.state in {"idle", "mixed", "allocated"}
        assert not n.flags & {"NOT_RESPONDING", "DRAIN"}
    assert calls.names == ["sinfo", dialect_of(slurm_cluster).nodes_command]  # --version once, then one query
    text = slurm_cluster.cli(output="text").nodes()
    assert [(n.name, n.gpus, n.gpu_type, n.partitions, n.features, n.cpus) for n in text] == [
        (n.name, n.gpus, n.gpu_type, n.partitions, n.features, n.cpus) for n in nodes
    ]


@pytest.mark.slurm
@pytest.mark.slurm_release
@pytest.mark.parametrize("output", ["json", "text"])
def test_job_seen_pending_or_running_then_completed(
    slurm_cluster: SlurmTestCluster, tmp_path: Path, output: str
) -> None:
    calls = Calls()
    cli = slurm_cluster.cli(output="json" if output == "json" else "text", observer=calls)
    p = prefix()
    job_id = submit(cli, tmp_path, p + "ok", "sleep 2")
    job, seen = wait_for(cli, p, job_id, lambda j: j.state.finished)
    assert seen[0] in {JobState.PENDING, JobState.RUNNING}
    assert seen[-1] is JobState.COMPLETED
    assert (job.exit_code, job.reason, job.name) == (0, "", p + "ok")
    assert len(job.nodes) == 1 and job.nodes[0] in slurm_cluster.nodes
    assert job.started_at is not None and job.finished_at is not None
    assert 1 <= job.finished_at - job.started_at <= 30
    assert abs(time.time() - job.finished_at) < 60
    assert set(calls.names) - {"sinfo"} == {"sbatch", "squeue"} and calls.names.count("sbatch") == 1
    assert calls.names.count("sinfo") == (1 if output == "json" else 0)  # --version, for the JSON dialect


@pytest.mark.slurm
@pytest.mark.slurm_release
def test_failing_job_exit_code(slurm_cluster: SlurmTestCluster, tmp_path: Path) -> None:
    cli = slurm_cluster.cli()
    p = prefix()
    job_id = submit(cli, tmp_path, p + "fail", "echo failing >&2; exit 3")
    job, _ = wait_for(cli, p, job_id, lambda j: j.state.finished)
    assert (job.state, job.exit_code, job.reason) == (JobState.FAILED, 3, "NonZeroExitCode")


@pytest.mark.slurm
@pytest.mark.slurm_release
def test_one_jobs_call_sees_pending_running_and_finished(slurm_cluster: SlurmTestCluster, tmp_path: Path) -> None:
    cli = slurm_cluster.cli()
    p = prefix()
    done_id = submit(cli, tmp_path, p + "done", "true")
    wait_for(cli, p, done_id, lambda j: j.state.finished)
    running = submit(cli, tmp_path, p + "running", "sleep 300")
    pending = submit(cli, tmp_path, p + "later", "true", "--begin=now+3600")
    try:
        wait_for(cli, p, running, lambda j: j.state is JobState.RUNNING)
        calls = Calls()
        one = slurm_cluster.cli(observer=calls, output="json")
        one.dialect()
        calls.names.clear()
        jobs = {j.job_id: j for j in one.jobs(p)}
        assert calls.names == ["squeue"]
        assert set(jobs) == {done_id, running, pending}
        assert (jobs[done_id].state, jobs[done_id].exit_code) == (JobState.COMPLETED, 0)
        assert (jobs[running].state, jobs[running].exit_code, jobs[running].finished_at) == (
            JobState.RUNNING,
            None,
            None,
        )
        assert (jobs[pending].state, jobs[pending].reason, jobs[pending].nodes) == (JobState.PENDING, "BeginTime", ())
        assert jobs[pending].started_at is None
    finally:
        cli.cancel([running, pending])


@pytest.mark.slurm
@pytest.mark.slurm_release
def test_cancel(slurm_cluster: SlurmTestCluster, tmp_path: Path) -> None:
    cli = slurm_cluster.cli()
    p = prefix()
    job_id = submit(cli, tmp_path, p + "sleep", "sleep 300")
    wait_for(cli, p, job_id, lambda j: j.state is JobState.RUNNING)
    cli.cancel([job_id])
    job, _ = wait_for(cli, p, job_id, lambda j: j.state.finished, timeout=30)
    assert (job.state, job.exit_code) == (JobState.CANCELLED, 128 + signal.SIGTERM)
    cli.cancel([job_id])  # already finished: ignored
    cli.cancel(["999999"])  # unknown: ignored
    cli.cancel([])


@pytest.mark.slurm
@pytest.mark.slurm_release
def test_drain_and_undrain(slurm_cluster: SlurmTestCluster) -> None:
    cli = slurm_cluster.cli()
    before = cli.node("node4")
    if before.drained or before.reason:
        pytest.skip(f"node4 is not in a clean state: {before}")
    reason = f"healthd: it=drain_test run={uuid.uuid4().hex[:8]}"
    cli.drain("node4", reason)
    try:
        now = time.time()
        drained = cli.node("node4")
        assert "DRAIN" in drained.flags and drained.drained
        assert (drained.reason, drained.reason_user) == (reason, "root")
        assert drained.reason_time is not None and abs(drained.reason_time - now) < 60
        listed = {n.name: n for n in cli.nodes()}["node4"]
        assert (listed.flags, listed.reason, listed.reason_user, listed.reason_time) == (
            drained.flags, reason, "root", drained.reason_time,
        )  # fmt: skip
        text = {n.name: n for n in slurm_cluster.cli(output="text").nodes()}["node4"]
        assert (text.reason, text.reason_user, text.reason_time) == (reason, "root", drained.reason_time)
    finally:
        cli.undrain("node4")
    after = cli.node("node4")
    assert "DRAIN" not in after.flags and after.reason is None and not after.drained
    cli.undrain("node4")  # not drained: Slurm accepts it


@pytest.mark.slurm
@pytest.mark.slurm_release
def test_busy_drained_and_reserved_nodes_are_not_probeable(cluster: SlurmTestCluster) -> None:
    """The cluster of the daemon's defaults test (``test_daemon_slurm``, host release only) as each release
    reports it: a node running a user's job, one drained by someone else, one in a maintenance reservation
    and two idle. In JSON and in text, only the two idle nodes are probeable, and the drain's reason is read."""
    user = cluster.command("sbatch", "--parsable", "-J", "user-training", "-w", "node1", "--exclusive",
                           "-o", "/dev/null", "--wrap", "sleep 300")
    assert user.returncode == 0, user.stderr
    assert cluster.command("scontrol", "update", "nodename=node2", "state=drain",
                           "reason=hw: bad PSU ticket 42").returncode == 0
    reserve = cluster.command("scontrol", "create", "reservation", "reservationname=hd_test", "nodes=node3",
                              "users=root", "starttime=now", "duration=60", "flags=maint,ignore_jobs")
    assert reserve.returncode == 0, reserve.stderr
    wait_until(lambda: "alloc" in cluster.command("sinfo", "-h", "-n", "node1", "-o", "%t").stdout, 30,
               "the user job running")
    wait_until(lambda: "maint" in cluster.command("sinfo", "-h", "-n", "node3", "-o", "%t").stdout, 30,
               "node3 reserved")
    for output in ("json", "text"):
        nodes = {n.name: n for n in cluster.cli(output=output).nodes()}
        why = {name: why_not_probeable(node, PlanLimits()) for name, node in nodes.items()}
        assert [name for name, reason in why.items() if reason is None] == ["node4", "node5"], (output, why)
        assert nodes["node1"].state in {"allocated", "mixed"}, (output, nodes["node1"])
        assert nodes["node2"].drained, (output, nodes["node2"])
        assert (nodes["node2"].reason, nodes["node2"].reason_user) == ("hw: bad PSU ticket 42", "root")
        assert "MAINTENANCE" in nodes["node3"].flags, (output, nodes["node3"])


@pytest.mark.slurm
@pytest.mark.slurm_release
def test_reservation_created_grown_shrunk_and_deleted(cluster: SlurmTestCluster) -> None:
    """Every reservation command of healthd's rechecks (``SlurmBackend._reserve``/``_release``), including the
    update that two overlapping rechecks make, which no other test reaches."""
    cli = cluster.cli()
    name = f"healthd_it_{uuid.uuid4().hex[:6]}"
    assert cli.reservation(name) is None
    cli.reserve(name, "root", ["node4"])
    try:
        assert cli.reservation(name) == Reservation(name, ("node4",), ("root",))
        cli.set_reservation_nodes(name, ["node4", "node5"])
        assert cli.reservation(name) == Reservation(name, ("node4", "node5"), ("root",))
        cli.set_reservation_nodes(name, ["node5"])
        assert cli.reservation(name) == Reservation(name, ("node5",), ("root",))
    finally:
        cli.delete_reservation(name)
    assert cli.reservation(name) is None


@pytest.mark.slurm
@pytest.mark.slurm_release
def test_command_errors_are_slurm_errors(slurm_cluster: SlurmTestCluster, tmp_path: Path) -> None:
    cli = slurm_cluster.cli()
    with pytest.raises(SlurmError, match=r"sbatch exited 1: .*Invalid partition name specified"):
        submit(cli, tmp_path, prefix() + "x", "true", "--partition=nosuch")
    with pytest.raises(SlurmError, match="scontrol exited 1: slurm_update error: Invalid node name specified"):
        cli.drain("node99", "healthd: test")
    # 22.05 (text): exit 1, "Node node99 not found"; 24.11+ (JSON): exit 0, no nodes, a warning.
    unknown = "expected that one node, got 0" if dialect_of(slurm_cluster).nodes_command == "scontrol" else "exited 1"
    with pytest.raises(SlurmError, match=f"scontrol.*{unknown}"):
        cli.node("node99")


def json_refusing(command: str) -> tuple[str, ...]:
    """``command``, except that its ``--json`` options are refused like an unknown option."""
    script = f'case "$1" in --json*) echo "{command}: unknown option"; exit 1;; esac; exec {command} "$@"'
    return ("sh", "-c", script, command)


def commands_with(name: str, argv: tuple[str, ...]) -> SlurmCommands:
    return SlurmCommands(**{name: argv})


@pytest.mark.slurm
@pytest.mark.slurm_release
def test_unreadable_json_falls_back_to_text_for_good(
    slurm_cluster: SlurmTestCluster, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    command = dialect_of(slurm_cluster).nodes_command  # sinfo (22.05) or scontrol (24.11+)
    commands = commands_with(command, json_refusing(command))
    calls = Calls()
    cli = slurm_cluster.cli(commands, observer=calls)
    first = cli.nodes()
    assert [n.name for n in first] == list(slurm_cluster.nodes)
    assert calls.names == ["sinfo", command, "sinfo"]  # --version, --json (unreadable), text
    assert calls.ok == [True, False, True]
    calls.names.clear()
    assert [n.name for n in cli.nodes()] == list(slurm_cluster.nodes)
    assert calls.names == ["sinfo"]
    assert cli.node("node1").name == "node1"  # scontrol -o show node: text as well
    out = capsys.readouterr()
    assert (caplog.text + out.out + out.err).count("slurm_json_unreadable") == 1
    strict = slurm_cluster.cli(commands, output="json")
    with pytest.raises(SlurmError, match=rf"{command} --json: expected JSON.*\(exit 1: {command}: unknown option\)"):
        strict.nodes()


@pytest.mark.slurm
@pytest.mark.slurm_release
def test_json_failing_once_is_retried_next_time(
    slurm_cluster: SlurmTestCluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A JSON command that exits 1 with no JSON (24.11+ while slurmctld is unreachable) gets text
    this time and JSON again next time: a controller restart must not demote the client for good."""
    mark = tmp_path / "failed-once"
    failing = (
        "sh",
        "-c",
        f'if [ ! -e {mark} ]; then : >{mark}; echo "slurm_load_jobs error: Unable to contact slurm controller '
        '(connect failure)" >&2; exit 1; fi; exec squeue "$@"',
        "squeue",
    )
    calls = Calls()
    cli = slurm_cluster.cli(SlurmCommands(squeue=failing), observer=calls)
    cli.version()
    calls.names.clear()
    calls.ok.clear()
    assert cli.jobs(prefix()) == []
    assert (calls.names, calls.ok) == (["squeue", "squeue"], [False, True])  # JSON failed, text answered
    calls.names.clear()
    calls.ok.clear()
    assert cli.jobs(prefix()) == []
    assert (calls.names, calls.ok) == (["squeue"], [True])  # JSON again
    out = capsys.readouterr()
    assert "slurm_json_failed" in out.out + out.err
    assert "slurm_json_unreadable" not in out.out + out.err


@pytest.mark.slurm
@pytest.mark.slurm_release
@pytest.mark.slow
def test_a_job_runs_the_probes_of_this_virtualenv(slurm_cluster: SlurmTestCluster, tmp_path: Path) -> None:
    """Batch scripts, result paths and this Python are visible to the job (in a chroot: bind mounts)."""
    cli = slurm_cluster.cli()
    p = prefix()
    result = tmp_path / "env.json"
    body = f"exec {sys.executable} -m probes env --run-id it-env --output {result}"
    job_id = submit(cli, tmp_path, p + "env", body, "--ntasks=1")
    job, _ = wait_for(cli, p, job_id, lambda j: j.state.finished, timeout=120)
    assert (job.state, job.exit_code) == (JobState.COMPLETED, 0)
    doc = json.loads(result.read_text())
    assert (doc["probe"], doc["run_id"], doc["outcome"], doc["nodes"]) == ("env", "it-env", "pass", list(job.nodes))
    assert doc["environment"]["python"] == ".".join(map(str, sys.version_info[:3]))


@pytest.mark.slurm
@pytest.mark.slurm_release
@pytest.mark.slow
def test_controller_down_is_a_slurm_error(slurm_cluster: SlurmTestCluster) -> None:
    """Both JSON commands exit 0 with an ``errors`` array after about 9 s: that must be an error."""
    pid = slurm_cluster.ctld_pid()
    if pid is None:
        pytest.skip("slurmctld is not one this test can stop and restart (not the script's cluster)")
    p = prefix()
    os.kill(pid, signal.SIGTERM)
    try:
        deadline = time.monotonic() + 30
        while Path(f"/proc/{pid}").exists():
            assert time.monotonic() < deadline, "slurmctld did not stop"
            time.sleep(0.1)
        assert slurm_cluster.cli().version()[0] >= 20  # needs no controller
        scontrol = dialect_of(slurm_cluster).nodes_command == "scontrol"
        observed = Calls()
        calls: list[tuple[str, Callable[[], object]]] = [
            ("json nodes", slurm_cluster.cli(output="json", observer=observed).nodes),
            ("json jobs", lambda: slurm_cluster.cli(output="json").jobs(p)),
            ("text nodes", slurm_cluster.cli(output="text").nodes),
            ("text jobs", lambda: slurm_cluster.cli(output="text").jobs(p)),
            ("short timeout", slurm_cluster.cli(output="json", timeout_s=2).nodes),
        ]
        started = time.monotonic()
        with ThreadPoolExecutor(len(calls)) as pool:
            futures = {name: pool.submit(fn) for name, fn in calls}
            errors = {name: f.exception(timeout=60) for name, f in futures.items()}
        elapsed = time.monotonic() - started
        assert type(errors["json nodes"]) is SlurmError
        assert type(errors["json jobs"]) is SlurmError
        if scontrol:  # 24.11+: exit 1, no output, the reason on stderr
            assert str(errors["json nodes"]) == (
                "scontrol --json: expected JSON, got no output (exit 1: "
                "slurm_load_node error: Unable to contact slurm controller (connect failure))"
            )
            assert str(errors["json jobs"]) == (
                "squeue --json: expected JSON, got no output (exit 1: "
                "slurm_load_jobs error: Unable to contact slurm controller (connect failure))"
            )
        else:  # 22.05: exit 0 with an errors array
            assert "sinfo --json reported: Unspecified error" in str(errors["json nodes"])
            assert "squeue --json reported: Failed while looking for jobs" in str(errors["json jobs"])
        assert type(errors["text nodes"]) is SlurmError
        assert "Unable to contact slurm controller" in str(errors["text nodes"])
        assert type(errors["text jobs"]) is SlurmError
        assert "Unable to contact slurm controller" in str(errors["text jobs"])
        assert type(errors["short timeout"]) is SlurmTimeout
        # --version (answers without a controller), then the failed query (22.05: exit 0, but no answer)
        assert (observed.names, observed.ok) == (["sinfo", "scontrol" if scontrol else "sinfo"], [True, False])
        assert elapsed < 30
    finally:
        slurm_cluster.start()
    assert [n.name for n in slurm_cluster.cli().nodes()] == list(slurm_cluster.nodes)
