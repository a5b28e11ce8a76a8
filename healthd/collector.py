"""Launch planned probe jobs and collect finished ones: backend → result file → parser → store.

The collector owns the life of a run in the store: ``submitted`` → ``running`` → ``finished``
with an outcome. It never decides whether a node is healthy (that is the judge); it only
sorts "the probe ran and said X" from "the probe could not run" (``error``) and "the probe
never started because a user got the node first" (``skipped``).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import structlog

from healthd.cluster.base import ClusterBackend
from healthd.errors import BackendError, HealthdError, ParseError
from healthd.judge.hardfault import classify
from healthd.logging import get_logger
from healthd.model import JobState, JobStatus, Outcome, ProbeJob, ProbeResult, RunKind
from healthd.parsers.expand import expand_result
from healthd.parsers.healthd_json import parse_result
from healthd.store.rows import RunRow

log = get_logger(__name__)

LOG_TAIL_BYTES = 2000
LOG_TAIL_LINES = 5
LOST_GRACE_S = 120.0
_WRAPPER_LINE = re.compile(
    r"^(srun: error: \S+: tasks? [\d,-]+: (Exited with exit code|Killed by signal) \d+"
    r"|srun: launch/slurm: _step_signal: Terminating StepId=\S+"
    r"|slurmstepd\S*: error: (spank: required plugin \S+: \w+\(\) failed with rc=-?\d+"
    r"|Failed to invoke spank plugin stack))$"
)
"""Slurm's own lines around a failed step: never the cause (a launcher's message is above them)."""


class RunLedger(Protocol):
    """The part of the store the collector uses: the life of a run (``healthd.store.runs``)."""

    def add_run(self, *, run_id: str, probe: str, nodes: Sequence[str], backend: str, job_id: str | None,
                submitted_at: float, result_path: str | None, source: str = ..., kind: RunKind = ...) -> None: ...

    def set_job_id(self, run_id: str, job_id: str) -> None: ...

    def mark_running(self, run_id: str, started_at: float) -> None: ...

    def finish_run(self, run_id: str, *, outcome: Outcome, reason: str, finished_at: float,
                   result: ProbeResult | None = None, started_at: float | None = None) -> bool: ...

    def unfinished_runs(self) -> list[RunRow]: ...


@dataclass(frozen=True)
class Collected:
    run_id: str
    probe: str
    nodes: tuple[str, ...]
    outcome: Outcome
    reason: str
    result: ProbeResult | None
    kind: RunKind = RunKind.PROBE


def read_result(path: Path) -> ProbeResult:
    try:
        text = path.read_text(errors="replace")
    except FileNotFoundError:
        raise ParseError(f"no result file {path}") from None
    except OSError as exc:
        raise ParseError(f"cannot read the result file {path}: {exc}") from None
    return expand_result(parse_result(text))


def log_tail(result_path: Path) -> str:
    log_path = result_path.with_suffix(".log")
    try:
        with log_path.open("rb") as fh:
            fh.seek(0, 2)
            fh.seek(max(0, fh.tell() - LOG_TAIL_BYTES))
            tail = fh.read().decode(errors="replace").strip()
    except OSError:
        return ""
    lines = [line.strip() for line in tail.splitlines() if line.strip()]
    causes = [line for line in dict.fromkeys(lines) if not _WRAPPER_LINE.match(line)]
    return " | ".join((causes or lines)[-LOG_TAIL_LINES:])


def outcome_of(job: JobStatus | None, result: ProbeResult | None, parse_error: str | None,
               nodes: Sequence[str] = ()) -> tuple[Outcome, str]:
    """Sort one finished run of ``nodes`` (pure). A probe that could not run is ``error``, never
    ``fail``; one whose own error document holds evidence against nodes of the run
    (``healthd.judge.hardfault``: GPUs missing, a hang or a crash in the measurement phase, a CUDA or
    NCCL error) is ``fail`` with the fault in its reason (without a document nothing is attributed);
    one that Slurm pre-empted for a user's job is ``skipped`` (the node was taken, nothing is known
    of it)."""
    if job is not None and job.state is JobState.PREEMPTED:
        return Outcome.SKIPPED, f"pre-empted: {job.reason or 'Slurm gave the node to a job that outranks the probe'}"
    if result is not None:
        if result.outcome is Outcome.PASS and not result.measurements and not result.checks:
            return Outcome.ERROR, "probe reported pass without any measurement"
        if job is not None and job.state is JobState.TIMEOUT and result.outcome is Outcome.PASS:
            return Outcome.ERROR, "job timed out after writing its result"
        if result.outcome is Outcome.ERROR:
            fault = classify(result.reason, tuple(nodes) or tuple(result.nodes))
            if fault is not None:
                return Outcome.FAIL, fault.reason()
        return result.outcome, result.reason
    if job is not None and job.state is JobState.TIMEOUT:
        return Outcome.ERROR, f"timeout: {job.reason or 'the job ran past its time limit'}"
    if job is not None and job.state is JobState.CANCELLED:
        return Outcome.ERROR, f"cancelled: {job.reason or 'by Slurm or an operator'}"
    detail = parse_error or "no result"
    if job is not None and job.state is JobState.FAILED:
        return Outcome.ERROR, f"probe failed ({job.reason or f'exit code {job.exit_code}'}): {detail}"
    return Outcome.ERROR, detail


class Collector:
    def __init__(
        self,
        store: RunLedger,
        backend: ClusterBackend,
        results_dir: Path,
        *,
        pending_timeout_s: float = 60.0,
        clock: Callable[[], float] = time.time,
        on_error: Callable[[str], None] = lambda kind: None,
    ) -> None:
        self.store = store
        self.backend = backend
        self.results_dir = results_dir
        self.pending_timeout_s = pending_timeout_s
        self.clock = clock
        self.on_error = on_error

    def result_path(self, run_id: str) -> Path:
        return self.results_dir / f"{run_id}.json"

    def launch(self, job: ProbeJob) -> str | None:
        """Record and submit ``job``. The run is in the store before the backend sees it, so a
        crash in between leaves a run to recover, never an unknown job."""
        path = self.result_path(job.run_id)
        self.store.add_run(
            run_id=job.run_id, probe=job.probe, nodes=job.nodes, backend=self.backend.name,
            job_id=None, submitted_at=self.clock(), result_path=str(path), kind=job.kind,
        )
        with structlog.contextvars.bound_contextvars(run_id=job.run_id, probe=job.probe, node=",".join(job.nodes)):
            try:
                job_id = self.backend.submit(job, path)
            except HealthdError as exc:
                self.on_error("submit")
                log.error("probe_submit_failed", error=str(exc))
                self.store.finish_run(job.run_id, outcome=Outcome.ERROR, reason=f"submit failed: {exc}",
                                      finished_at=self.clock())
                return None
            self.store.set_job_id(job.run_id, job_id)
            log.info("probe_submitted", job_id=job_id)
            return job_id

    def collect(self) -> list[Collected]:
        """Poll every unfinished run with one backend query and close those that ended."""
        runs = self.store.unfinished_runs()
        if not runs:
            return []
        job_ids = [r.job_id for r in runs if r.job_id]
        statuses = self.backend.poll(job_ids) if job_ids else {}
        done: list[Collected] = []
        now = self.clock()
        for run in runs:
            status = statuses.get(run.job_id) if run.job_id else None
            with structlog.contextvars.bound_contextvars(run_id=run.run_id, probe=run.probe, node=",".join(run.nodes)):
                collected = self._advance(run, status, now)
            if collected is not None:
                done.append(collected)
        closed = {c.run_id for c in done}
        self.backend.forget([r.job_id for r in runs if r.job_id and r.run_id in closed])
        return done

    def _advance(self, run: RunRow, status: JobStatus | None, now: float) -> Collected | None:
        if status is None:
            if now - run.submitted_at < LOST_GRACE_S:
                return None
            return self._finish(run, None, fallback_reason="the job vanished from the cluster")
        if status.state is JobState.PENDING:
            if now - run.submitted_at > self.pending_timeout_s:
                try:
                    self.backend.cancel([status.job_id])
                except BackendError as exc:
                    log.warning("probe_cancel_failed", error=str(exc))
                    return None
                return self._close(run, Outcome.SKIPPED,
                                   f"still pending after {self.pending_timeout_s:g} s (node taken first)", None)
            return None
        if status.state in (JobState.RUNNING, JobState.UNKNOWN):
            if run.state == "submitted":
                self.store.mark_running(run.run_id, status.started_at or now)
            return None
        return self._finish(run, status)

    def _finish(self, run: RunRow, status: JobStatus | None, fallback_reason: str = "") -> Collected:
        path = Path(run.result_path) if run.result_path else self.result_path(run.run_id)
        result: ProbeResult | None = None
        parse_error: str | None = None
        try:
            result = read_result(path)
            if result.run_id not in (None, run.run_id):
                raise ParseError(f"result file {path} belongs to run {result.run_id!r}")
        except ParseError as exc:
            result, parse_error = None, str(exc)
            tail = log_tail(path)
            if tail:
                parse_error += f"; output: {tail}"
            self.on_error("parse")
        if status is None and result is None:
            parse_error = f"{fallback_reason}: {parse_error}"
        outcome, reason = outcome_of(status, result, parse_error, run.nodes)
        return self._close(run, outcome, reason, result, started_at=status.started_at if status else None)

    def _close(
        self, run: RunRow, outcome: Outcome, reason: str, result: ProbeResult | None, started_at: float | None = None
    ) -> Collected:
        finished_at = result.finished_at if result is not None else self.clock()
        stored = self.store.finish_run(
            run.run_id, outcome=outcome, reason=reason, finished_at=finished_at, result=result,
            started_at=result.started_at if result is not None else started_at,
        )
        if stored:
            logger = log.warning if outcome is Outcome.ERROR else log.info
            logger("probe_finished", outcome=outcome.value, reason=reason,
                   measurements=len(result.measurements) if result else 0)
        return Collected(run.run_id, run.probe, run.nodes, outcome, reason, result, run.kind)

    def recover(self) -> list[Collected]:
        """At start-up: re-adopt runs the cluster still knows, close the others.

        A run whose probe finished while the daemon was down keeps its result; one whose
        probe is gone without a result is closed as ``error`` (reason: daemon restart); a
        leftover local probe process is killed first.
        """
        runs = self.store.unfinished_runs()
        if not runs:
            return []
        known = {s.job_id: s for s in self.backend.adopt()}
        job_ids = [r.job_id for r in runs if r.job_id]
        known.update(self.backend.poll(job_ids) if job_ids else {})
        by_name = {s.name: s for s in known.values() if s.name}
        closed: list[Collected] = []
        for run in runs:
            status = known.get(run.job_id) if run.job_id else None
            if status is None:
                status = next((s for name, s in by_name.items() if name.endswith(run.run_id)), None)
                if status is not None:
                    self.store.set_job_id(run.run_id, status.job_id)
            with structlog.contextvars.bound_contextvars(run_id=run.run_id, probe=run.probe, node=",".join(run.nodes)):
                if status is not None:
                    log.info("probe_adopted", job_id=status.job_id, state=status.state.value)
                    continue
                if run.job_id:
                    self.backend.cancel([run.job_id])
                path = Path(run.result_path) if run.result_path else self.result_path(run.run_id)
                try:
                    result = read_result(path)
                except ParseError:
                    closed.append(self._close(run, Outcome.ERROR, "daemon restart: the probe was interrupted", None))
                    continue
                outcome, reason = outcome_of(None, result, None, run.nodes)
                closed.append(self._close(run, outcome, reason, result))
        return closed
