"""Broken or hostile result files on the collect path (issue 19), one per fault: the real local backend
runs a small stand-in for ``python -m probes`` that leaves the fault in place of its result; the real
collector must close the run as ``error`` naming the fault, quickly, and go on."""

from __future__ import annotations

import os
import stat
import sys
import time
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from healthd.cluster.local import LocalBackend
from healthd.collector import CLAMP_WARN_S, Collected, Collector, read_own, trusted
from healthd.errors import ParseError
from healthd.model import JobState, JobStatus, Outcome, ProbeJob
from healthd.store import Store
from healthd.store.rows import RunRow
from probes.result import ProbeResult

HEAD = """
import json, os, sys, time
args = sys.argv
out = args[args.index("--output") + 1]
run_id = args[args.index("--run-id") + 1]
def doc(**kw):
    d = {"schema_version": 1, "probe": "gemm", "run_id": run_id, "outcome": "pass", "started_at": time.time() - 1,
         "finished_at": time.time(), "nodes": ["here"],
         "measurements": [{"name": "flop_per_second", "value": 1.5e9, "node": "here"}]}
    d.update(kw)
    return d
"""
GOOD = HEAD + "open(out, 'w').write(json.dumps(doc()))\n"

FAULTS = {
    "nan value": ("open(out, 'w').write(json.dumps(doc(measurements=[{'name': 'x_seconds', 'value': float('nan')}])))",
                  "NaN: numbers must be finite"),
    "nan timestamp": ("open(out, 'w').write(json.dumps(doc(finished_at=float('nan'))))", "numbers must be finite"),
    "huge float": ("open(out, 'w').write(json.dumps(doc()).replace('1500000000.0', '1e400'))", "out of range"),
    "400-digit integer": (
        "open(out, 'w').write(json.dumps(doc(measurements=[{'name': 'x_seconds', 'value': 10**400}])))",
        "integer of 401 digits"),
    "deep json": ("open(out, 'w').write(json.dumps(doc()).replace('\"params\"', '\"p\"')[:-1]"
                  " + ', \"params\": {\"x\": ' + '[' * 5000 + ']' * 5000 + '}}')", "nested deeper than"),
    "lone surrogate": ("open(out, 'w').write(json.dumps(doc(reason='\\ud800')))", "lone surrogate"),
    "fifo": ("os.mkfifo(out)", "is not a regular file: refused"),
    "symlink to /dev/zero": ("os.symlink('/dev/zero', out)", "is a symbolic link: refused"),
    "directory": ("os.mkdir(out)", "is not a regular file: refused"),
    "too big": ("open(out, 'w').write(' ' * (64 * 1024 * 1024 + 1))", "more than the 67108864 allowed"),
}


def make(tmp_path: Path, body: str) -> tuple[Collector, Store]:
    python = tmp_path / "fake-python"
    python.write_text(f"#!{sys.executable}\n" + body)
    python.chmod(python.stat().st_mode | stat.S_IEXEC)
    store = Store(tmp_path / "s.sqlite")
    backend = LocalBackend(node_name="here", python=python)
    return Collector(store, backend, tmp_path / "results"), store


def run_one(collector: Collector, run_id: str = "r1", timeout: float = 30.0) -> Collected:
    collector.launch(ProbeJob(run_id=run_id, probe="gemm", nodes=("here",), timeout_s=20.0))
    deadline = time.time() + timeout
    while time.time() < deadline:
        started = time.monotonic()
        done = collector.collect()
        assert time.monotonic() - started < 5.0, "a collect tick must never block on a result file"
        if done:
            (collected,) = done
            return collected
        time.sleep(0.1)
    raise AssertionError("the run did not finish")


def closed_as_error(tmp_path: Path, action: str, expected: str) -> tuple[Collector, Store]:
    """The stand-in probe does ``action``: its run must be closed as ``error`` with ``expected`` in the reason."""
    collector, store = make(tmp_path, HEAD + action + "\n")
    collected = run_one(collector)
    assert collected.outcome is Outcome.ERROR
    assert expected in collected.reason
    return collector, store


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_a_hostile_result_closes_the_run_as_error_and_collection_goes_on(tmp_path: Path, fault: str) -> None:
    collector, store = closed_as_error(tmp_path, *FAULTS[fault])
    run = store.run("r1")
    assert run is not None and run.state == "finished" and run.outcome is Outcome.ERROR
    assert store.measurements(run_id="r1") == []

    (tmp_path / "fake-python").write_text(f"#!{sys.executable}\n" + GOOD)
    assert run_one(collector, "r2").outcome is Outcome.PASS  # the next run is collected as usual


def test_a_log_symlink_never_shows_another_file(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_text("the healthd user's secret\n")
    secret.chmod(0o600)
    body = HEAD + f"log = out[:-5] + '.log'\nos.unlink(log)\nos.symlink({str(secret)!r}, log)\nsys.exit(3)\n"
    collector, _ = make(tmp_path, body)
    collected = run_one(collector)
    assert collected.outcome is Outcome.ERROR and "secret" not in collected.reason


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a file to another user")
def test_a_result_file_of_another_user_is_refused(tmp_path: Path) -> None:
    body = GOOD + "os.chown(out, 65534, 65534)\n"
    collector, _ = make(tmp_path, body)
    collected = run_one(collector)
    assert collected.outcome is Outcome.ERROR
    assert "belongs to uid 65534, not to healthd (uid 0): refused" in collected.reason


def test_read_own_reads_a_tail_from_the_end_only(tmp_path: Path) -> None:
    path = tmp_path / "big.log"
    with path.open("wb") as fh:
        fh.truncate(1 << 30)  # a 1 GiB sparse file: only the tail is read
        fh.seek(0, 2)
        fh.write(b"the end\n")
    started = time.monotonic()
    assert read_own(path, limit=100, from_end=True).endswith(b"the end\n")
    assert time.monotonic() - started < 0.5
    with pytest.raises(ParseError, match="more than the 100 allowed"):
        read_own(path, limit=100)


# -- the trust boundary ---------------------------------------------------------------------------

TRUST = {
    "no run_id": ("open(out, 'w').write(json.dumps(doc(run_id=None)))", "the result carries no run_id: refused"),
    "another run's id": ("open(out, 'w').write(json.dumps(doc(run_id='r0')))",
                         "the result belongs to run 'r0', not to 'r1'"),
    "another node in nodes": ("open(out, 'w').write(json.dumps(doc(nodes=['here', 'victim'])))",
                              "the result names nodes outside the run (victim): refused"),
    "another node in a measurement": (
        "open(out, 'w').write(json.dumps(doc(measurements=[{'name': 'x_seconds', 'value': 1.0, 'node': 'victim'}])))",
        "outside the run (victim)"),
    "another node in a check": (
        "open(out, 'w').write(json.dumps(doc(checks=[{'name': 'correct', 'ok': False, 'node': 'victim'}])))",
        "outside the run (victim)"),
    "a pass and a non-zero exit": ("open(out, 'w').write(json.dumps(doc()))\nsys.exit(3)",
                                   "the job failed (exit code 3) after writing a pass"),
}


@pytest.mark.parametrize("attack", sorted(TRUST))
def test_a_result_that_speaks_for_another_run_or_node_is_refused(tmp_path: Path, attack: str) -> None:
    _, store = closed_as_error(tmp_path, *TRUST[attack])
    if attack != "a pass and a non-zero exit":  # read, but not taken as a pass (as after a timeout)
        assert store.measurements(run_id="r1") == [] and store.checks("r1") == []


def test_times_far_off_are_clamped_into_the_jobs_life(tmp_path: Path) -> None:
    far = 32_500_000_000.0  # the year 2984
    body = HEAD + f"open(out, 'w').write(json.dumps(doc(started_at=1.0, finished_at={far})))\n"
    collector, store = make(tmp_path, body)
    before = time.time()
    collected = run_one(collector)
    after = time.time()
    assert collected.outcome is Outcome.PASS and collected.result is not None
    run = store.run("r1")
    assert run is not None and run.finished_at is not None and run.started_at is not None
    assert before - 60 <= run.started_at <= run.finished_at <= after
    (last,) = store.last_runs()
    assert last.last_run_at <= after
    (m,) = store.measurements(run_id="r1")
    assert m.at <= after


@pytest.mark.parametrize(("started", "finished", "job_end", "level"), [
    # local backend: the probe's start read from /proc in 10 ms ticks lands 6 ms before the submission
    (999.994, 1030.5, 1031.2, "debug"),
    # Slurm: the job's end time is whole seconds; the result was written 0.7 s into that second
    (1004.0, 1030.7, 1030.0, "debug"),
    (1004.0, 1030.0 + CLAMP_WARN_S + 0.5, 1030.0, "warning"),  # a clock off by more than the resolution
    (1.0, 1030.0, 1031.0, "warning"),
])
def test_a_clamp_within_the_sources_time_resolution_is_no_warning(
        started: float, finished: float, job_end: float, level: str) -> None:
    """Issue 26: ``result_times_clamped`` warned on 53 of 56 normal runs of a real H100 (ms skew)."""
    run = RunRow(run_id="r1", probe="gemm", backend="local", job_id="j1", state="running", outcome=None, reason="",
                 submitted_at=1000.0, started_at=1000.0, finished_at=None, duration_s=None, result_path=None,
                 source="healthd", nodes=("here",))
    result = ProbeResult(probe="gemm", outcome=Outcome.PASS, run_id="r1", started_at=started, finished_at=finished,
                         nodes=["here"])
    job = JobStatus("j1", JobState.COMPLETED, exit_code=0, started_at=1000.0, finished_at=job_end)
    with capture_logs() as logs:
        clamped = trusted(result, run, job, now=2000.0)
    assert 1000.0 <= clamped.started_at <= clamped.finished_at <= job_end
    (entry,) = [e for e in logs if e["event"] == "result_times_clamped"]
    assert entry["log_level"] == level


@pytest.mark.parametrize(("mode", "who"), [(0o1777, "group and others"), (0o777, "group and others"),
                                           (0o757, "others"), (0o770, "its group")])
def test_start_and_check_config_refuse_a_results_directory_others_can_write(
    tmp_path: Path, mode: int, who: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from healthd.cli import main
    from healthd.config import Settings
    from healthd.daemon import Daemon
    from healthd.errors import ConfigError

    results = tmp_path / "results"
    results.mkdir()
    results.chmod(mode)
    config = tmp_path / "healthd.toml"
    config.write_text(f'state_dir = "{tmp_path / "state"}"\n[slurm]\nresults_dir = "{results}"\n')
    assert main(["check-config", "--config", str(config)]) == 2
    err = capsys.readouterr().err
    assert f"the results directory {results} is writable by {who}" in err
    assert "use mode 0750 owned by the healthd user" in err
    settings = Settings(backend="local", state_dir=tmp_path / "state", slurm={"results_dir": results})
    with pytest.raises(ConfigError, match="writable by"):
        Daemon(settings, None, backend=LocalBackend(node_name="here", python=Path(sys.executable)))

    results.chmod(0o750)
    assert main(["check-config", "--config", str(config)]) == 0
