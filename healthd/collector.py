"""Launch planned probe jobs and collect finished ones: backend → result file → parser → store.

The collector owns the life of a run in the store: ``submitted`` → ``running`` → ``finished``
with an outcome. It never decides whether a node is healthy (that is the judge); it only
sorts "the probe ran and said X" from "the probe could not run" (``error``) and "the probe
never started because a user got the node first" (``skipped``).
"""

from __future__ import annotations

import errno
import os
import re
import sqlite3
import stat
import time
from collections import Counter
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Protocol

import structlog

from healthd.cluster.base import ClusterBackend
from healthd.errors import BackendError, HealthdError, ParseError, StoreError, StoreUnavailable
from healthd.judge.hardfault import classify
from healthd.logging import get_logger
from healthd.model import JobState, JobStatus, Outcome, ProbeJob, ProbeResult, RunKind
from healthd.parsers.expand import MAX_REASON_CHARS, expand_result
from healthd.parsers.healthd_json import MAX_BYTES as MAX_RESULT_BYTES
from healthd.parsers.healthd_json import parse_result
from healthd.remediation.adopt import BoundaryFailure
from healthd.store.rows import RunRow
from healthd.store.runs import FinishedRun
from probes.result import NOT_RUN

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
                   result: ProbeResult | None = None, started_at: float | None = None, judge: bool = ...) -> bool: ...

    def finish_runs(self, runs: Sequence[FinishedRun], *,
                    refused: Callable[[FinishedRun, sqlite3.IntegrityError], FinishedRun] | None = ...
                    ) -> list[FinishedRun | None]: ...

    def unfinished_runs(self) -> list[RunRow]: ...


@dataclass(frozen=True)
class _Closing:
    """A run closed in this tick, before it is stored."""

    run: RunRow
    record: FinishedRun


@dataclass(frozen=True)
class Collected:
    run_id: str
    probe: str
    nodes: tuple[str, ...]
    outcome: Outcome
    reason: str
    result: ProbeResult | None
    kind: RunKind = RunKind.PROBE


def read_own(path: Path, *, limit: int, owner: int | None = None, from_end: bool = False) -> bytes:
    """The bytes of ``path``, or its last ``limit`` bytes ``from_end``: a regular file (of ``owner``
    when given) opened without following a link and without blocking on a FIFO, its size checked
    before anything is read.

    :raises ParseError: naming what is wrong (missing, a link, not a regular file, another owner, too big).
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise ParseError(f"no result file {path}") from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise ParseError(f"{path} is a symbolic link: refused") from None
        raise ParseError(f"cannot read {path}: {exc.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ParseError(f"{path} is not a regular file: refused")
        if owner is not None and st.st_uid != owner:
            raise ParseError(f"{path} belongs to uid {st.st_uid}, not to healthd (uid {owner}): refused")
        if from_end:
            return os.pread(fd, limit, max(0, st.st_size - limit))
        if st.st_size > limit:
            raise ParseError(f"{path} is {st.st_size} bytes, more than the {limit} allowed")
        chunks: list[bytes] = []
        size = 0
        while size <= limit and (chunk := os.read(fd, min(1 << 20, limit + 1 - size))):
            chunks.append(chunk)
            size += len(chunk)
        if size > limit:
            raise ParseError(f"{path} grew past the {limit} bytes allowed while it was read")
        return b"".join(chunks)
    except OSError as exc:
        raise ParseError(f"cannot read {path}: {exc.strerror}") from None
    finally:
        os.close(fd)


def results_dir_problem(path: Path, *, owner: int | None = None) -> str | None:
    """Why ``path`` is unfit to hold probe results, or ``None``: a directory others can write lets them
    plant or swap a result (run ids are visible in ``squeue``). One that does not exist yet is fine
    (the daemon creates it 0750)."""
    owner = os.geteuid() if owner is None else owner
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    except OSError as exc:
        return f"cannot inspect the results directory {path}: {exc.strerror}"
    fix = f"use mode 0750 owned by the healthd user (chown healthd:healthd {path}; chmod 0750 {path})"
    if not stat.S_ISDIR(st.st_mode):
        return f"the results directory {path} is not a directory"
    if st.st_mode & 0o022:
        who = "group and others" if st.st_mode & 0o022 == 0o022 else "others" if st.st_mode & 0o002 else "its group"
        return (f"the results directory {path} is writable by {who} (mode {stat.S_IMODE(st.st_mode):04o}): another "
                f"user could plant or swap probe results; {fix}")
    if st.st_uid != owner:
        return (f"the results directory {path} belongs to uid {st.st_uid}, not to healthd (uid {owner}): "
                f"its owner could plant or swap probe results; {fix}")
    return None


def read_result(path: Path, *, owner: int | None = None) -> ProbeResult:
    data = read_own(path, limit=MAX_RESULT_BYTES, owner=owner)
    return expand_result(parse_result(data.decode(errors="replace")))


def log_tail(result_path: Path, *, owner: int | None = None) -> str:
    try:
        data = read_own(result_path.with_suffix(".log"), limit=LOG_TAIL_BYTES, owner=owner, from_end=True)
    except ParseError:
        return ""
    tail = data.decode(errors="replace").strip()
    lines = [line.strip() for line in tail.splitlines() if line.strip()]
    causes = [line for line in dict.fromkeys(lines) if not _WRAPPER_LINE.match(line)]
    return " | ".join((causes or lines)[-LOG_TAIL_LINES:])


CLAMP_WARN_S = 2.0
"""A clamp of a result's times by more than this is a clock off (warning ``result_times_clamped``); a
smaller one is the resolution of the sources (logged at debug): a probe's start is read from /proc in
10 ms ticks and may fall a few ms before the run's submission on the local backend, and Slurm's job
times are whole seconds, so a result written in the job's last second ends after its end time."""


def trusted(result: ProbeResult, run: RunRow, job: JobStatus | None, now: float) -> ProbeResult:
    """``result`` as far as it may speak for ``run`` (pure): it names the run, only the run's nodes (in
    ``nodes``, measurements and checks), and its times are clamped into the job's life, from its
    submission to its end (or ``now``), so a clock far off never makes a run the node's last for ever.
    Only a clamp by more than ``CLAMP_WARN_S`` is a warning.

    :raises ParseError: a result without the run's ``run_id``, or naming a node outside the run.
    """
    if result.run_id != run.run_id:
        raise ParseError(f"the result belongs to run {result.run_id!r}, not to {run.run_id!r}" if result.run_id
                         else "the result carries no run_id: refused")
    named = {*result.nodes, *(m.node for m in result.measurements if m.node),
             *(c.node for c in result.checks if c.node)}
    outside = sorted(named - set(run.nodes))
    if outside:
        raise ParseError(f"the result names nodes outside the run ({', '.join(outside[:5])}): refused")
    low = run.submitted_at
    high = max(low, job.finished_at if job is not None and job.finished_at else now)
    started = min(max(result.started_at, low), high)
    finished = min(max(result.finished_at, started), high)
    return clamped(result, started, finished)


def clamped(result: ProbeResult, started: float, finished: float) -> ProbeResult:
    """``result`` with its times moved to ``started``/``finished``; a move of more than ``CLAMP_WARN_S``
    is a warning (``result_times_clamped``), a smaller one (the times' resolution) is logged at debug."""
    if (started, finished) == (result.started_at, result.finished_at):
        return result
    by = max(abs(started - result.started_at), abs(finished - result.finished_at))
    (log.warning if by > CLAMP_WARN_S else log.debug)(
        "result_times_clamped", started_at=result.started_at, finished_at=result.finished_at, to=(started, finished),
        by_s=round(by, 3))
    return result.model_copy(update={"started_at": started, "finished_at": finished})


def outcome_of(job: JobStatus | None, result: ProbeResult | None, parse_error: str | None,
               nodes: Sequence[str] = (), *, shared: bool = False) -> tuple[Outcome, str]:
    """Sort one finished run of ``nodes`` (pure). A probe that could not run is ``error``, never
    ``fail``; one whose own error document holds evidence against nodes of the run
    (``healthd.judge.hardfault``: GPUs missing, a hang or a crash in the measurement phase, a CUDA or
    NCCL error) is ``fail`` with the fault in its reason (without a document nothing is attributed);
    one that Slurm pre-empted for a user's job is ``skipped`` (the node was taken, nothing is known
    of it). ``shared``: the job ran several runs (a combined job, ``python -m probes check``): its
    exit code and time-out speak for all of them (another probe's error, a later probe's hang), so a
    run's own complete ``pass`` document stands, and a run the check never started (``not run: ...``) is
    ``error`` whatever evidence its reason quotes (that is the run it happened in)."""
    if job is not None and job.state is JobState.PREEMPTED:
        return Outcome.SKIPPED, f"pre-empted: {job.reason or 'Slurm gave the node to a job that outranks the probe'}"
    if result is not None:
        if result.outcome is Outcome.PASS and not result.measurements and not result.checks:
            return Outcome.ERROR, "probe reported pass without any measurement"
        if not shared and job is not None and job.state is JobState.TIMEOUT and result.outcome is Outcome.PASS:
            return Outcome.ERROR, "job timed out after writing its result"
        if (not shared and job is not None and result.outcome is Outcome.PASS
                and (job.state is JobState.FAILED or job.exit_code)):
            return Outcome.ERROR, f"the job failed ({job.reason or f'exit code {job.exit_code}'}) after writing a pass"
        if result.outcome is Outcome.ERROR and result.reason.startswith(NOT_RUN):
            return Outcome.ERROR, result.reason  # another probe of the check holds the evidence, counted there
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
        owner: int | None = os.geteuid(),
    ) -> None:
        """``owner``: the uid result and log files must belong to (the probes run as healthd's user;
        ``None`` skips the check)."""
        self.store = store
        self.backend = backend
        self.results_dir = results_dir
        self.pending_timeout_s = pending_timeout_s
        self.clock = clock
        self.on_error = on_error
        self.owner = owner
        self._cancelled: set[str] = set()
        """Job ids cancelled in this collection (the runs of a combined job share one)."""
        self._shared: set[str] = set()
        """Job ids of several unfinished runs (combined jobs) in this collection."""
        self._logs: dict[str, list[Path]] = {}
        """The result paths of each shared job's runs: the job's log is next to one of them (the first's)."""

    def result_path(self, run_id: str) -> Path:
        return self.results_dir / f"{run_id}.json"

    def launch(self, job: ProbeJob) -> str | None:
        """Record and submit ``job``. The run is in the store before the backend sees it, so a
        crash in between leaves a run to recover, never an unknown job.

        A combined job (``job.bundle``) records one run per probe, each with its own result file,
        and is submitted once: its runs share the backend's job id and are collected each on its own.
        A job the planner skips (``job.skip``: a MIG-enabled node) is recorded as ``skipped`` with its reason
        and never submitted (nothing is judged of it).
        """
        submitted_at = self.clock()
        for run in job.runs:
            self.store.add_run(
                run_id=run.run_id, probe=run.probe, nodes=job.nodes, backend=self.backend.name,
                job_id=None, submitted_at=submitted_at, result_path=str(self.result_path(run.run_id)), kind=job.kind,
            )
        if job.skip:
            for run in job.runs:
                self.store.finish_run(run.run_id, outcome=Outcome.SKIPPED, reason=job.skip, finished_at=submitted_at)
            log.info("probe_skipped", run_id=job.run_id, probe=job.probe, node=",".join(job.nodes), reason=job.skip)
            return None
        with structlog.contextvars.bound_contextvars(run_id=job.run_id, probe=job.probe, node=",".join(job.nodes)):
            try:
                job_id = self.backend.submit(job, self.result_path(job.run_id))
            except HealthdError as exc:
                self.on_error("submit")
                log.error("probe_submit_failed", error=str(exc))
                for run in job.runs:
                    self.store.finish_run(run.run_id, outcome=Outcome.ERROR, reason=f"submit failed: {exc}",
                                          finished_at=self.clock())
                return None
            for run in job.runs:
                self.store.set_job_id(run.run_id, job_id)
            if job.bundle:
                log.info("probe_submitted", job_id=job_id, runs={r.probe: r.run_id for r in job.bundle})
            else:
                log.info("probe_submitted", job_id=job_id)
            return job_id

    def collect(self) -> list[Collected]:
        """Poll every unfinished run with one backend query and close those that ended.

        Each run is collected on its own (``_isolated``): one that cannot be collected is closed as
        ``error`` and the others go on. When the store cannot be written, the runs it refused stay
        open for the next tick and the first such error is raised once the others are done.
        """
        runs = self.store.unfinished_runs()
        if not runs:
            return []
        job_ids = list(dict.fromkeys(r.job_id for r in runs if r.job_id))
        statuses = self.backend.poll(job_ids) if job_ids else {}
        self._cancelled = set()
        counts = Counter(r.job_id for r in runs if r.job_id)
        self._shared = {job_id for job_id, n in counts.items() if n > 1}
        self._logs = {}
        for r in runs:
            if r.job_id in self._shared:
                self._logs.setdefault(r.job_id, []).append(self._path_of(r))
        closing: list[_Closing] = []
        store_down: StoreError | None = None
        now = self.clock()
        for run in runs:
            status = statuses.get(run.job_id) if run.job_id else None
            try:
                step = self._isolated(run, partial(self._advance, run, status, now))
            except StoreError as exc:
                store_down = store_down or exc
                continue
            if step is not None:
                closing.append(step)
        done = self._store(closing)
        closed = {c.run_id for c in done}
        self.backend.forget(list(dict.fromkeys(r.job_id for r in runs if r.job_id and r.run_id in closed)))
        if store_down is not None:
            raise store_down
        return done

    def _store(self, closing: Sequence[_Closing]) -> list[Collected]:
        """Store the runs closed in one tick in one transaction; a result the store refuses closes its
        run as ``error`` with the reason, in the same transaction."""
        if not closing:
            return []
        runs = {c.run.run_id: c.run for c in closing}

        def refused(record: FinishedRun, exc: sqlite3.IntegrityError) -> FinishedRun:
            self.on_error("collect")
            log.error("run_result_refused", run_id=record.run_id, error=str(exc))
            reason = f"healthd could not collect this run: {type(exc).__name__}: {exc}"[:MAX_REASON_CHARS]
            return FinishedRun(record.run_id, Outcome.ERROR, reason, self.clock(), None, record.started_at,
                               judge=runs[record.run_id].kind is not RunKind.SWEEP)

        try:
            stored = self.store.finish_runs([c.record for c in closing], refused=refused)
        except StoreUnavailable as exc:
            self.on_error("store")
            log.error("run_not_stored", error=str(exc), runs=len(closing))
            raise
        done = []
        for c, record in zip(closing, stored, strict=True):
            final = record or c.record
            if record is not None:
                logger = log.warning if final.outcome is Outcome.ERROR else log.info
                logger("probe_finished", run_id=final.run_id, probe=c.run.probe, node=",".join(c.run.nodes),
                       outcome=final.outcome.value,
                       reason=final.reason, measurements=len(final.result.measurements) if final.result else 0)
            done.append(Collected(c.run.run_id, c.run.probe, c.run.nodes, final.outcome, final.reason, final.result,
                                  c.run.kind))
        return done

    def _isolated(self, run: RunRow, step: Callable[[], _Closing | None]) -> _Closing | None:
        """``step`` for one run; any exception but the store's closes the run as ``error`` with its reason."""
        with structlog.contextvars.bound_contextvars(run_id=run.run_id, probe=run.probe, node=",".join(run.nodes)):
            try:
                return step()
            except StoreUnavailable as exc:
                self.on_error("store")
                log.error("run_not_stored", error=str(exc))
                raise
            except Exception as exc:
                self.on_error("collect")
                log.exception("run_collect_failed")
                reason = f"healthd could not collect this run: {type(exc).__name__}: {exc}"
                return self._close(run, Outcome.ERROR, reason[:MAX_REASON_CHARS], None)

    def _advance(self, run: RunRow, status: JobStatus | None, now: float) -> _Closing | None:
        if status is None:
            if now - run.submitted_at < LOST_GRACE_S:
                return None
            return self._finish(run, None, fallback_reason="the job vanished from the cluster")
        if status.state is JobState.PENDING:
            if now - run.submitted_at > self.pending_timeout_s:
                if status.job_id not in self._cancelled:  # the runs of a combined job share it
                    try:
                        self.backend.cancel([status.job_id])
                    except BackendError as exc:
                        log.warning("probe_cancel_failed", error=str(exc))
                        return None
                    self._cancelled.add(status.job_id)
                return self._close(run, Outcome.SKIPPED,
                                   f"still pending after {self.pending_timeout_s:g} s (node taken first)", None)
            return None
        if status.state in (JobState.RUNNING, JobState.UNKNOWN):
            if run.state == "submitted":
                self.store.mark_running(run.run_id, status.started_at or now)
            return None
        return self._finish(run, status)

    def _path_of(self, run: RunRow) -> Path:
        return Path(run.result_path) if run.result_path else self.result_path(run.run_id)

    def _finish(self, run: RunRow, status: JobStatus | None, fallback_reason: str = "") -> _Closing:
        path = self._path_of(run)
        result: ProbeResult | None = None
        parse_error: str | None = None
        try:
            result = trusted(read_result(path, owner=self.owner), run, status, self.clock())
        except ParseError as exc:
            result, parse_error = None, str(exc)
            tail = log_tail(path, owner=self.owner)
            for peer in self._logs.get(status.job_id, []) if status is not None and not tail else []:
                tail = tail or log_tail(peer, owner=self.owner)
            if tail:
                parse_error += f"; output: {tail}"
            self.on_error("parse")
        if status is None and result is None:
            parse_error = f"{fallback_reason}: {parse_error}"
        outcome, reason = outcome_of(status, result, parse_error, run.nodes,
                                     shared=status is not None and status.job_id in self._shared)
        return self._close(run, outcome, reason, result, started_at=status.started_at if status else None)

    def _close(
        self, run: RunRow, outcome: Outcome, reason: str, result: ProbeResult | None, started_at: float | None = None
    ) -> _Closing:
        finished_at = result.finished_at if result is not None else self.clock()
        return _Closing(run, FinishedRun(
            run.run_id, outcome, reason, finished_at, result,
            result.started_at if result is not None else started_at, judge=run.kind is not RunKind.SWEEP,
        ))

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
        closing: list[_Closing] = []
        for run in runs:
            status = known.get(run.job_id) if run.job_id else None
            try:
                step = self._isolated(run, partial(self._recover, run, status, by_name))
            except StoreError:
                continue
            if step is not None:
                closing.append(step)
        try:
            return self._store(closing)
        except StoreError:
            return []

    def _recover(self, run: RunRow, status: JobStatus | None, by_name: dict[str, JobStatus]) -> _Closing | None:
        if status is None:
            status = next((s for name, s in by_name.items() if name.endswith(run.run_id)), None)
            if status is not None:
                self.store.set_job_id(run.run_id, status.job_id)
        if status is not None:
            log.info("probe_adopted", job_id=status.job_id, state=status.state.value)
            return None
        if run.job_id:
            self.backend.cancel([run.job_id])
        path = Path(run.result_path) if run.result_path else self.result_path(run.run_id)
        try:
            result = trusted(read_result(path, owner=self.owner), run, None, self.clock())
        except ParseError:
            return self._close(run, Outcome.ERROR, "daemon restart: the probe was interrupted", None)
        outcome, reason = outcome_of(None, result, None, run.nodes)
        return self._close(run, outcome, reason, result)


# -- boundary checks (``probes.boundary``): documents Slurm's Prolog/Epilog/HealthCheckProgram left -------

BOUNDARY_PER_TICK = 200
"""Boundary documents taken in one collect tick (the oldest first); the rest wait for the next."""
BOUNDARY_MAX_SPAN_S = 600.0
"""The longest a boundary check may take (``probes.boundary.MAX_BUDGET_S``): a longer span is clamped."""
BOUNDARY_DONE, BOUNDARY_REFUSED = "done", "refused"
_BOUNDARY_NAME = re.compile(r"^(?P<stem>boundary-(?P<node>[A-Za-z0-9][A-Za-z0-9._-]{0,62})-"
                            r"(?P<context>prolog|epilog|health)-(?P<job>\d{1,12})-(?P<ms>\d{1,16}))\.json$")


@dataclass(frozen=True)
class BoundaryName:
    stem: str
    node: str
    context: str
    job_id: str | None
    ms: int


def boundary_name(name: str) -> BoundaryName | None:
    """``boundary-<node>-<context>-<job id or 0>-<unix ms>.json`` (``probes.boundary.document_name``)."""
    m = _BOUNDARY_NAME.match(name)
    if m is None:
        return None
    return BoundaryName(m["stem"], m["node"], m["context"], None if int(m["job"]) == 0 else m["job"], int(m["ms"]))


def trusted_boundary(result: ProbeResult, name: BoundaryName, now: float,
                     known: frozenset[str] | None = None) -> ProbeResult:
    """``result`` as far as it may speak for the node its file names (pure): probe ``boundary``, the
    file's stem as ``run_id``, that node only (a node the cluster knows, when ``known`` is given), the
    file's context; its times clamped to ``now`` and to a check's longest span.

    :raises ParseError: naming what does not hold.
    """
    if result.probe != "boundary":
        raise ParseError(f"a {result.probe!r} result under a boundary document's name: refused")
    if result.run_id != name.stem:
        raise ParseError(f"the document names run {result.run_id!r}, its file {name.stem!r}: refused")
    if known is not None and name.node not in known:
        raise ParseError(f"{name.node} is not a node of the cluster: refused")
    named = {*result.nodes, *(m.node for m in result.measurements if m.node),
             *(c.node for c in result.checks if c.node)}
    if named - {name.node} or result.nodes != [name.node]:
        raise ParseError(f"the document names nodes other than {name.node} ({', '.join(sorted(named)[:5])}): refused")
    if result.params.get("context") != name.context:
        raise ParseError(f"the document's context {result.params.get('context')!r} is not its file's: refused")
    finished = min(result.finished_at, now)
    started = min(max(result.started_at, finished - BOUNDARY_MAX_SPAN_S), finished)
    return clamped(result, started, finished)


def boundary_failures(collected: Sequence[Collected]) -> list[BoundaryFailure]:
    """The failed prolog/epilog checks among ``collected`` (those that exited non-zero: Slurm drained
    their node)."""
    out: list[BoundaryFailure] = []
    for c in collected:
        if c.kind is not RunKind.BOUNDARY or c.outcome is not Outcome.FAIL or c.result is None or not c.nodes:
            continue
        context = c.result.params.get("context")
        if isinstance(context, str):
            out.append(BoundaryFailure(c.nodes[0], c.run_id, context, c.reason, c.result.finished_at))
    return out


def collect_boundary(collector: Collector, *, known: Callable[[Sequence[str]], Collection[str]] | None = None,
                     limit: int = BOUNDARY_PER_TICK) -> list[Collected]:
    """Store the boundary documents waiting in the results directory as finished runs of kind
    ``boundary`` (at most ``limit``, the oldest first) and move each file out of the way, so each is
    taken once: into ``done/`` once stored, into ``refused/`` when it fails the trust checks of a probe
    result (a regular file of healthd's user, not writable by group or others, at most
    ``MAX_RESULT_BYTES``, a valid document naming its file's run, node and context). A refused file is
    never a run: it is logged (``boundary_refused``) and counted as a ``parse`` error. A document whose
    run is already stored (the daemon stopped before moving it) is only moved. ``known``: of the node
    names given, those the cluster knows (a document of another node is refused)."""
    directory = collector.results_dir
    try:
        names = sorted((n for e in os.scandir(directory) if (n := boundary_name(e.name)) is not None),
                       key=lambda n: (n.ms, n.stem))[:limit]
    except OSError as exc:
        if exc.errno != errno.ENOENT:
            collector.on_error("collect")
            log.error("boundary_scan_failed", error=str(exc))
        return []
    now = collector.clock()
    nodes = frozenset(known(sorted({n.node for n in names}))) if known is not None and names else None
    done: list[Collected] = []
    for name in names:
        path = directory / f"{name.stem}.json"
        with structlog.contextvars.bound_contextvars(run_id=name.stem, probe="boundary", node=name.node):
            try:
                mode = os.lstat(path).st_mode
                if mode & 0o022:
                    raise ParseError(f"{path} is writable by group or others (mode {stat.S_IMODE(mode):04o}): refused")
                result = trusted_boundary(read_result(path, owner=collector.owner), name, now, nodes)
            except FileNotFoundError:
                continue
            except (ParseError, OSError) as exc:
                collector.on_error("parse")
                log.warning("boundary_refused", file=path.name, error=str(exc))
                _move(path, directory / BOUNDARY_REFUSED)
                continue
            collected = _store_boundary(collector, result, name, directory / BOUNDARY_DONE / path.name)
            _move(path, directory / BOUNDARY_DONE)
            if collected is not None:
                done.append(collected)
    return done


def _store_boundary(collector: Collector, result: ProbeResult, name: BoundaryName, kept: Path) -> Collected | None:
    outcome, reason = outcome_of(None, result, None, (name.node,))
    try:
        collector.store.add_run(run_id=name.stem, probe="boundary", nodes=(name.node,), backend="boundary",
                                job_id=name.job_id, submitted_at=result.started_at, result_path=str(kept),
                                source="boundary", kind=RunKind.BOUNDARY)
    except sqlite3.IntegrityError:
        log.info("boundary_already_stored", file=kept.name)
        return None
    record = FinishedRun(name.stem, outcome, reason[:MAX_REASON_CHARS], result.finished_at, result, result.started_at,
                         judge=True)
    stored = collector.store.finish_runs([record])
    if stored and stored[0] is not None:
        log.info("probe_finished", run_id=name.stem, probe="boundary", node=name.node, outcome=outcome.value,
                 reason=reason, context=name.context, measurements=len(result.measurements))
    return Collected(name.stem, "boundary", (name.node,), outcome, reason, result, RunKind.BOUNDARY)


def _move(path: Path, folder: Path) -> None:
    try:
        folder.mkdir(mode=0o750, exist_ok=True)
        os.replace(path, folder / path.name)
    except OSError as exc:
        log.error("boundary_move_failed", file=path.name, to=str(folder), error=str(exc))


def prune_boundary_files(results_dir: Path, cutoff: float) -> int:
    """Delete the boundary documents kept in ``done/`` and ``refused/`` that were last changed before
    ``cutoff`` (the store's retention: their runs are pruned then too); the count deleted."""
    deleted = 0
    for folder in (results_dir / BOUNDARY_DONE, results_dir / BOUNDARY_REFUSED):
        try:
            entries = list(os.scandir(folder))
        except OSError:
            continue
        for entry in entries:
            try:
                if entry.name.startswith("boundary-") and entry.stat(follow_symlinks=False).st_mtime < cutoff:
                    os.unlink(entry.path)
                    deleted += 1
            except OSError as exc:
                log.warning("boundary_prune_failed", file=entry.name, error=str(exc))
    return deleted
