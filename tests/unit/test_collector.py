"""The collector with the real local backend, driving small stand-in probe programs.

The stand-ins replace ``python`` in ``python -m probes ...`` so each test controls what the
"probe" does: write a good result, print garbage, crash, hang, leave its result behind.
"""

from __future__ import annotations

import os
import stat
import sys
import time
from pathlib import Path

import pytest

from healthd.cluster.local import LocalBackend
from healthd.collector import Collector, outcome_of
from healthd.model import JobState, JobStatus, Outcome, ProbeJob
from healthd.store import Store
from probes.result import Check, Measurement, ProbeResult

GOOD_BODY = """
import json, sys, time
args = sys.argv
out = args[args.index("--output") + 1]
run_id = args[args.index("--run-id") + 1]
doc = {"schema_version": 1, "probe": args[3], "run_id": run_id, "outcome": "pass", "started_at": time.time() - 1,
       "finished_at": time.time(), "nodes": ["here"],
       "measurements": [{"name": "flop_per_second", "value": 1.5e9, "labels": {"gpu": "0", "dtype": "fp32"},
                         "node": "here"}]}
open(out, "w").write(json.dumps(doc))
"""


def fake_python(tmp_path: Path, body: str) -> Path:
    """An executable that stands in for ``python``: argv is ``-m probes NAME --run-id ID ...``."""
    path = tmp_path / "fake-python"
    path.write_text(f"#!{sys.executable}\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return path


def make(tmp_path: Path, body: str, *, pending_timeout_s: float = 600.0) -> tuple[Collector, Store, LocalBackend]:
    store = Store(tmp_path / "s.sqlite")
    backend = LocalBackend(node_name="here", python=fake_python(tmp_path, body))
    return Collector(store, backend, tmp_path / "results", pending_timeout_s=pending_timeout_s), store, backend


def job(run_id: str = "r1", timeout_s: float = 20.0) -> ProbeJob:
    return ProbeJob(run_id=run_id, probe="gemm", nodes=("here",), timeout_s=timeout_s)


def wait_done(collector: Collector, timeout: float = 30.0) -> list[object]:
    deadline = time.time() + timeout
    while time.time() < deadline:
        done = collector.collect()
        if done:
            return list(done)
        time.sleep(0.1)
    raise AssertionError("the run did not finish")


def test_good_result_is_stored_with_its_measurements(tmp_path: Path) -> None:
    collector, store, _ = make(tmp_path, GOOD_BODY)
    collector.launch(job())
    (done,) = wait_done(collector)
    assert done.outcome is Outcome.PASS  # type: ignore[attr-defined]
    run = store.run("r1")
    assert run is not None and run.state == "finished" and run.outcome is Outcome.PASS
    assert run.result_path == str(tmp_path / "results" / "r1.json")
    (m,) = store.measurements(run_id="r1")
    assert (m.name, m.value, m.node, m.labels) == ("flop_per_second", 1.5e9, "here", {"gpu": "0", "dtype": "fp32"})


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        ("import sys\nprint('garbage', flush=True)\nsys.exit(0)\n", "no result file"),
        ("import sys\nargs = sys.argv\nopen(args[args.index('--output') + 1], 'w').write('{not json')\n",
         "not a JSON document"),
        ("import os\nos.kill(os.getpid(), 9)\n", "killed by signal SIGKILL"),
        ("import sys\nprint('Traceback: CUDA error: an illegal memory access', file=sys.stderr)\nsys.exit(3)\n",
         "exit code 3"),
    ],
)
def test_broken_probes_are_errors_never_failures(tmp_path: Path, body: str, reason: str) -> None:
    collector, store, _ = make(tmp_path, body)
    collector.launch(job())
    (done,) = wait_done(collector)
    assert done.outcome is Outcome.ERROR  # type: ignore[attr-defined]
    assert reason in done.reason  # type: ignore[attr-defined]
    assert ("probe_runs_total", {"outcome": "error", "probe": "gemm"}, 1.0) in store.counters()


def test_stderr_tail_lands_in_the_reason(tmp_path: Path) -> None:
    collector, _, _ = make(tmp_path, "import sys\nprint('CUDA error: device-side assert', file=sys.stderr)\n"
                                     "sys.exit(1)\n")
    collector.launch(job())
    (done,) = wait_done(collector)
    assert "CUDA error: device-side assert" in done.reason  # type: ignore[attr-defined]


def test_a_hung_probe_is_killed_with_its_children(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("healthd.cluster.local.KILL_GRACE_S", 0.5)
    body = ("import subprocess, sys, time\n"
            "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)'])\n"
            "open(sys.argv[0] + '.child', 'w').write(str(child.pid))\n"
            "time.sleep(300)\n")
    collector, _, _ = make(tmp_path, body)
    started = time.time()
    collector.launch(job(timeout_s=1.0))
    (done,) = wait_done(collector)
    assert done.outcome is Outcome.ERROR and done.reason.startswith("timeout")  # type: ignore[attr-defined]
    assert time.time() - started < 15
    child_pid = int((tmp_path / "fake-python.child").read_text())
    time.sleep(0.2)
    assert not Path(f"/proc/{child_pid}").exists() or "Z" in Path(f"/proc/{child_pid}/stat").read_text().split()[2]


def test_submit_failure_is_recorded_as_error(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.sqlite")
    backend = LocalBackend(node_name="here", python=tmp_path / "does-not-exist")
    errors: list[str] = []
    collector = Collector(store, backend, tmp_path / "results", on_error=errors.append)
    assert collector.launch(job()) is None
    run = store.run("r1")
    assert run is not None and run.outcome is Outcome.ERROR and "submit failed" in run.reason
    assert errors == ["submit"]


def test_restart_keeps_a_result_written_while_down_and_closes_the_rest(tmp_path: Path) -> None:
    collector, store, backend = make(tmp_path, GOOD_BODY)
    collector.launch(job("finished-while-down"))
    deadline = time.time() + 20
    while not (tmp_path / "results" / "finished-while-down.json").exists() and time.time() < deadline:
        time.sleep(0.05)
    store.add_run(run_id="interrupted", probe="gemm", nodes=("here",), backend="local", job_id="local:1:interrupted",
                  submitted_at=time.time(), result_path=str(tmp_path / "results" / "interrupted.json"))
    # A new daemon: new backend object (knows no child), same store.
    fresh = Collector(store, LocalBackend(node_name="here", python=backend.python), tmp_path / "results")
    closed = {c.run_id: c for c in fresh.recover()}
    assert closed["finished-while-down"].outcome is Outcome.PASS
    assert closed["interrupted"].outcome is Outcome.ERROR
    assert closed["interrupted"].reason == "daemon restart: the probe was interrupted"
    assert store.unfinished_runs() == []
    assert len(store.measurements(run_id="finished-while-down")) == 1
    assert fresh.recover() == []


def test_restart_kills_a_leftover_probe_process(tmp_path: Path) -> None:
    collector, store, backend = make(tmp_path, "import time\ntime.sleep(300)\n")
    job_id = collector.launch(job("orphan"))
    assert job_id is not None
    pid = int(job_id.split(":")[1])
    deadline = time.time() + 10  # a leftover is an old process: wait until this one is fully started
    while b"orphan" not in Path(f"/proc/{pid}/cmdline").read_bytes() and time.time() < deadline:
        time.sleep(0.05)
    fresh = Collector(store, LocalBackend(node_name="here", python=backend.python), tmp_path / "results")
    (closed,) = fresh.recover()
    assert closed.outcome is Outcome.ERROR
    deadline = time.time() + 5
    while time.time() < deadline:
        try:
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            break
        if not Path(f"/proc/{pid}").exists():
            break
        time.sleep(0.05)
    assert not Path(f"/proc/{pid}").exists()


def test_outcome_rules() -> None:
    ok = ProbeResult(probe="gemm", outcome=Outcome.PASS, started_at=0, finished_at=1,
                     measurements=[Measurement(name="flop_per_second", value=1.0)])
    empty = ProbeResult(probe="gemm", outcome=Outcome.PASS, started_at=0, finished_at=1)
    failed = ProbeResult(probe="nccl", outcome=Outcome.FAIL, reason="3 wrong elements", started_at=0, finished_at=1,
                         checks=[Check(name="wrong", ok=False)])
    timeout = JobStatus("1", JobState.TIMEOUT, reason="TIMEOUT")
    assert outcome_of(None, ok, None) == (Outcome.PASS, "")
    assert outcome_of(None, empty, None) == (Outcome.ERROR, "probe reported pass without any measurement")
    assert outcome_of(None, failed, None) == (Outcome.FAIL, "3 wrong elements")
    assert outcome_of(timeout, None, "no result file x")[0] is Outcome.ERROR
    assert outcome_of(timeout, ok, None)[0] is Outcome.ERROR
    cancelled = JobStatus("1", JobState.CANCELLED)
    assert outcome_of(cancelled, None, None) == (Outcome.ERROR, "cancelled: by Slurm or an operator")


def test_a_preempted_probe_is_skipped_not_an_error() -> None:
    preempted = JobStatus("1", JobState.PREEMPTED)
    assert outcome_of(preempted, None, "no result file x")[0] is Outcome.SKIPPED
    assert outcome_of(JobStatus("1", JobState.PREEMPTED, reason="PREEMPTED"), None, None) == (
        Outcome.SKIPPED, "pre-empted: PREEMPTED")
