"""The collector with a combined job (``ProbeJob.bundle``): one backend job, one run per probe.

A stand-in for ``python`` (as in ``test_collector``) writes the documents ``python -m probes check``
writes: one per run, ``<output-dir>/<run_id>.json``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from healthd.model import BundledRun, Outcome, ProbeJob
from tests.unit.test_collector import make, wait_done

CHECK_BODY = """
import json, os, sys, time
args = sys.argv
assert args[3] == "check", args
out = args[args.index("--output-dir") + 1]
pairs = dict(p.split("=") for p in args[args.index("--run-ids") + 1].split(","))
skip = os.environ.get("STANDIN_SKIP", "")
for probe, run_id in pairs.items():
    if probe == skip:
        continue
    outcome = "fail" if probe == "gemm" else "pass"
    doc = {"schema_version": 1, "probe": probe, "run_id": run_id, "outcome": outcome, "started_at": time.time() - 1,
           "finished_at": time.time(), "nodes": ["here"],
           "measurements": [{"name": "visible_gpus", "value": 0.0, "node": "here"}],
           "checks": [{"name": probe + ".ok", "ok": outcome == "pass", "node": "here"}]}
    open(os.path.join(out, run_id + ".json"), "w").write(json.dumps(doc))
if skip:
    print("ddp stopped early: rank 1 hung", file=sys.stderr)
sys.exit(1 if skip else 0)
"""

BUNDLE = ProbeJob(run_id="c1", probe="check", nodes=("here",), timeout_s=20.0,
                  bundle=(BundledRun("c1", "env", (), 5.0), BundledRun("c2", "gemm", (), 5.0),
                          BundledRun("c3", "ddp", (), 10.0)))


def test_each_run_of_a_check_job_is_stored_on_its_own(tmp_path: Path) -> None:
    collector, store, _ = make(tmp_path, CHECK_BODY)
    job_id = collector.launch(BUNDLE)
    assert job_id is not None
    done = wait_done(collector)
    assert sorted((d.run_id, d.probe, d.outcome) for d in done) == [  # type: ignore[attr-defined]
        ("c1", "env", Outcome.PASS), ("c2", "gemm", Outcome.FAIL), ("c3", "ddp", Outcome.PASS)]
    for run_id, probe in (("c1", "env"), ("c2", "gemm"), ("c3", "ddp")):
        run = store.run(run_id)
        assert run is not None and (run.probe, run.job_id, run.state) == (probe, job_id, "finished")
        assert run.result_path == str(tmp_path / "results" / f"{run_id}.json")
        (m,) = store.measurements(run_id=run_id)
        assert m.name == "visible_gpus"
    assert store.unfinished_runs() == []


def test_a_run_left_without_its_document_is_an_error_and_the_others_keep_theirs(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STANDIN_SKIP", "ddp")
    collector, _, _ = make(tmp_path, CHECK_BODY)
    collector.launch(BUNDLE)
    done = {d.run_id: d for d in wait_done(collector)}  # type: ignore[attr-defined]
    assert (done["c1"].outcome, done["c2"].outcome) == (Outcome.PASS, Outcome.FAIL)
    assert done["c3"].outcome is Outcome.ERROR
    assert "no result file" in done["c3"].reason and "c3.json" in done["c3"].reason
    # the job's log, next to the first run's result
    assert done["c3"].reason.endswith("output: ddp stopped early: rank 1 hung")


def test_a_check_job_that_cannot_be_submitted_closes_every_run(tmp_path: Path) -> None:
    collector, store, _ = make(tmp_path, CHECK_BODY)
    elsewhere = ProbeJob(run_id="c1", probe="check", nodes=("elsewhere",), bundle=BUNDLE.bundle)
    assert collector.launch(elsewhere) is None
    for run_id in ("c1", "c2", "c3"):
        run = store.run(run_id)
        assert run is not None and run.outcome is Outcome.ERROR and run.reason.startswith("submit failed")


def test_a_combined_jobs_exit_code_does_not_undo_a_runs_own_pass() -> None:
    from healthd.collector import outcome_of
    from healthd.model import JobState, JobStatus, ProbeResult

    result = ProbeResult.model_validate({"probe": "env", "run_id": "c1", "outcome": "pass", "started_at": 1.0,
                                         "finished_at": 2.0, "checks": [{"name": "env.ok", "ok": True}]})
    failed = JobStatus("j1", JobState.FAILED, exit_code=1)
    timed_out = JobStatus("j1", JobState.TIMEOUT)
    assert outcome_of(failed, result, None)[0] is Outcome.ERROR  # one probe's job: its exit code counts
    assert outcome_of(failed, result, None, shared=True) == (Outcome.PASS, "")
    assert outcome_of(timed_out, result, None)[0] is Outcome.ERROR
    assert outcome_of(timed_out, result, None, shared=True) == (Outcome.PASS, "")


def test_the_evidence_of_a_check_counts_once_on_the_probe_it_happened_in() -> None:
    """A hang in the check's nccl part is a fault on nccl's run; the gemm part the check never started
    quotes it, but stays ``error`` (could not check): one hang is not two findings."""
    from healthd.collector import outcome_of
    from healthd.model import ProbeResult

    stuck = "rank 1 (node n1) was stuck in phase 'nccl.all_reduce' while rank 0 reached 'probe.end'"
    doc = {"outcome": "error", "started_at": 1.0, "finished_at": 2.0, "nodes": ["n1"]}
    nccl = ProbeResult.model_validate({**doc, "probe": "nccl", "run_id": "c2", "reason": stuck})
    gemm = ProbeResult.model_validate({**doc, "probe": "gemm", "run_id": "c3",
                                       "reason": f"not run: the check stopped in probe nccl: {stuck}"})
    assert outcome_of(None, nccl, None, ("n1",), shared=True)[0] is Outcome.FAIL
    assert outcome_of(None, gemm, None, ("n1",), shared=True) == (Outcome.ERROR, gemm.reason)


def test_a_leftover_check_process_is_known_by_any_of_its_run_ids() -> None:
    import subprocess
    import sys
    import time

    from healthd.cluster.local import _kill_orphan

    argv = [sys.executable, "-c", "import time; time.sleep(60)", "check", "--run-ids", "env=abc1,gemm=def2"]
    proc = subprocess.Popen(argv, start_new_session=True)
    cmdline = Path(f"/proc/{proc.pid}/cmdline")
    deadline = time.monotonic() + 10
    while not cmdline.read_bytes() and time.monotonic() < deadline:  # empty for a moment after the start
        time.sleep(0.01)
    try:
        assert not _kill_orphan(f"local:{proc.pid}:ef2")  # not a run id of it
        assert not _kill_orphan(f"local:{proc.pid}:gemm")
        assert _kill_orphan(f"local:{proc.pid}:def2")
        assert proc.wait(timeout=10) == -9
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
