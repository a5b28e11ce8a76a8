"""Runs and what they measured: the life of a run (submitted → running → finished), its
measurements and checks, the counters its end bumps, and the per-(node, probe) views of them."""

from __future__ import annotations

import json
import sqlite3
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from healthd.errors import StoreError
from healthd.model import Outcome, ProbeResult, RunKind, devices_by_node
from healthd.store.db import collector_paused
from healthd.store.latest import CHECK_KINDS, CHECK_OUTCOMES, FinishedLatest, LatestStore, LatestValues
from healthd.store.rows import GpuSeen, MeasurementRow, RollupRow, RunRow, canonical_labels
from healthd.store.series import label_text

ROLLUP_BATCH = 2000
"""Runs rolled up per transaction (housekeeping holds the write lock this long at most)."""
ROLLUP_AT = "rollup_finished_at"
ROLLUP_POSITION = "rollup_position"


@dataclass(frozen=True)
class FinishedRun:
    """One run to close (``RunsStore.finish_runs``)."""

    run_id: str
    outcome: Outcome
    reason: str
    finished_at: float
    result: ProbeResult | None = None
    started_at: float | None = None
    judge: bool = False


@dataclass
class _Pending:
    """What the runs finished in one transaction write: rows queued for ``RunsStore._flush`` (runs, values as
    columns like ``LatestValues``, checks), then for ``latest`` and the counters."""

    runs: list[tuple[Any, ...]] = field(default_factory=list)
    sample_run: list[int] = field(default_factory=list)
    sample_series: list[int] = field(default_factory=list)
    sample_value: list[float] = field(default_factory=list)
    sample_per_rank: list[str | None] = field(default_factory=list)
    checks: list[tuple[Any, ...]] = field(default_factory=list)
    gpus: list[tuple[str, float, tuple[tuple[int, str | None, str], ...]]] = field(default_factory=list)
    """(node, finished at, its GPUs as (index, uuid, name)) of each finished run that listed the node's devices."""
    latest: list[FinishedLatest] = field(default_factory=list)
    values: LatestValues = field(default_factory=LatestValues)
    bumps: dict[tuple[str, str, str], float] = field(default_factory=dict)

    def samples(self) -> Iterator[tuple[int, int, float, str | None]]:
        return zip(self.sample_run, self.sample_series, self.sample_value, self.sample_per_rank, strict=True)

    def written(self) -> None:
        for column in (self.runs, self.sample_run, self.sample_series, self.sample_value, self.sample_per_rank,
                       self.checks, self.gpus):
            column.clear()

    def marks(self) -> tuple[int, int]:
        return len(self.latest), len(self.values.series)

    def back_to(self, marks: tuple[int, int], bumps: dict[tuple[str, str, str], float]) -> None:
        """Forget what was queued after ``marks`` (a run the store refused)."""
        del self.latest[marks[0]:]
        self.values.truncate(marks[1])
        self.written()
        self.bumps = bumps


class RunsStore(LatestStore):
    def add_run(
        self,
        *,
        run_id: str,
        probe: str,
        nodes: Sequence[str],
        backend: str,
        job_id: str | None,
        submitted_at: float,
        result_path: str | None,
        source: str = "probe",
        kind: RunKind = RunKind.PROBE,
    ) -> None:
        with self._tx() as db:
            db.execute(
                "INSERT INTO runs (run_id, probe, backend, job_id, state, submitted_at, result_path, source, kind)"
                " VALUES (?, ?, ?, ?, 'submitted', ?, ?, ?, ?)",
                (run_id, probe, backend, job_id, submitted_at, result_path, source, kind.value),
            )
            db.executemany(
                "INSERT INTO run_nodes (run_id, node) VALUES (?, ?)", [(run_id, n) for n in nodes]
            )
            if kind is not RunKind.INGEST:
                db.executemany(
                    "INSERT INTO attempts (node, probe, submitted_at, run_id) VALUES (?, ?, ?, ?)"
                    " ON CONFLICT (node, probe) DO UPDATE SET"
                    " run_id = CASE WHEN excluded.submitted_at >= submitted_at THEN excluded.run_id ELSE run_id END,"
                    " submitted_at = MAX(submitted_at, excluded.submitted_at)",
                    [(n, probe, submitted_at, run_id) for n in nodes],
                )
        if kind is not RunKind.INGEST and self._attempts is not None:
            for n in nodes:
                last = self._attempts.get((n, probe))
                if last is None or submitted_at >= last:
                    self._attempts[(n, probe)] = submitted_at
                    if self._partners is not None:
                        partners = frozenset(nodes) - {n}
                        if partners:
                            self._partners[(n, probe)] = partners
                        else:
                            self._partners.pop((n, probe), None)

    def set_job_id(self, run_id: str, job_id: str) -> None:
        with self._tx() as db:
            db.execute("UPDATE runs SET job_id = ? WHERE run_id = ?", (job_id, run_id))

    def mark_running(self, run_id: str, started_at: float) -> None:
        with self._tx() as db:
            db.execute(
                "UPDATE runs SET state = 'running', started_at = COALESCE(started_at, ?)"
                " WHERE run_id = ? AND state = 'submitted'",
                (started_at, run_id),
            )

    def finish_run(
        self,
        run_id: str,
        *,
        outcome: Outcome,
        reason: str,
        finished_at: float,
        result: ProbeResult | None = None,
        started_at: float | None = None,
        judge: bool = False,
    ) -> bool:
        """Close a run with its outcome and, when there is one, its parsed result.

        Idempotent: a run already finished is left alone and ``False`` is returned, so a
        result collected twice (a restart between collect and commit) is stored once. A run
        closed with ``judge`` waits for its judgement (``unjudged_runs``) until ``save_judgement``
        names it.
        """
        return self.finish_runs([FinishedRun(run_id, outcome, reason, finished_at, result, started_at, judge)])[0] \
            is not None

    def finish_runs(
        self, runs: Sequence[FinishedRun], *, refused: Callable[[FinishedRun, sqlite3.IntegrityError], FinishedRun]
        | None = None,
    ) -> list[FinishedRun | None]:
        """Close ``runs`` (each as ``finish_run``) in one transaction: per run, what was stored (``None``:
        it was already finished). A run whose result the store refuses (``sqlite3.IntegrityError``) is
        stored as ``refused`` makes it when given (the batch is then redone run by run), else the whole
        batch is refused."""
        try:
            return self._finish_batch(runs, None)
        except sqlite3.IntegrityError:
            if refused is None:
                raise
        return self._finish_batch(runs, refused)

    def _finish_batch(
        self, runs: Sequence[FinishedRun], refused: Callable[[FinishedRun, sqlite3.IntegrityError], FinishedRun] | None,
    ) -> list[FinishedRun | None]:
        out: list[FinishedRun | None] = []
        pending = _Pending()
        with collector_paused(), self._tx() as db:
            ids = json.dumps([run.run_id for run in runs])
            known: dict[str, tuple[int, str, str, float, float | None, int, str]] = {
                r[0]: r[1:] for r in db.execute(
                    "SELECT r.run_id, r.rowid, r.state, r.probe, r.submitted_at, r.started_at,"
                    " (SELECT COALESCE(SUM(n.gpus), 0) FROM run_nodes x JOIN nodes n ON n.name = x.node"
                    "  WHERE x.run_id = r.run_id), r.kind FROM runs r"
                    " WHERE r.run_id IN (SELECT value FROM json_each(?))",
                    (ids,))
            }
            nodes_of: dict[str, list[str]] = defaultdict(list)
            for run_id, node in db.execute("SELECT run_id, node FROM run_nodes WHERE run_id IN"
                                           " (SELECT value FROM json_each(?))", (ids,)):
                nodes_of[run_id].append(node)
            wanted: set[tuple[str, str]] = set()
            for run in runs:
                if run.result is not None and (row := known.get(run.run_id)) is not None:
                    for node in {m.node for m in run.result.measurements}:
                        wanted.update([(row[2], "")] + [(row[2], n) for n in nodes_of[run.run_id]] if node is None
                                      else [(row[2], node)])
            self._series_ids.load(db, wanted)
            for run in runs:
                if refused is None:
                    out.append(self._finish(db, run, known, nodes_of, pending))
                    continue
                db.execute("SAVEPOINT one_run")
                kept, row, bumps = pending.marks(), known.get(run.run_id), dict(pending.bumps)
                try:
                    done = self._finish(db, run, known, nodes_of, pending)
                    self._flush(db, pending)
                    out.append(done)
                except sqlite3.IntegrityError as exc:
                    db.execute("ROLLBACK TO one_run")
                    self._series_ids.clear()
                    pending.back_to(kept, bumps)
                    if row is not None:
                        known[run.run_id] = row
                    out.append(self._finish(db, refused(run, exc), known, nodes_of, pending))
                    self._flush(db, pending)
                db.execute("RELEASE one_run")
            self._flush(db, pending)
            self._update_latest(db, pending.latest, nodes_of, pending.values)
            for (name, probe, outcome), by in sorted(pending.bumps.items()):
                self._bump(db, name, {"probe": probe, "outcome": outcome} if outcome else {"probe": probe}, by)
        return out

    @staticmethod
    def _flush(db: sqlite3.Connection, pending: _Pending) -> None:
        """Write the runs, values and checks of ``pending``: one statement per table."""
        db.executemany("UPDATE runs SET state = 'finished', outcome = ?, reason = ?, finished_at = ?,"
                       " started_at = ?, duration_s = ?, judged = ?, container_image = ? WHERE rowid = ?",
                       pending.runs)
        db.executemany("INSERT INTO samples (run, series, value, per_rank) VALUES (?, ?, ?, ?)", pending.samples())
        db.executemany("INSERT INTO checks (run_id, name, ok, detail, node, gpu, rank) VALUES (?, ?, ?, ?, ?, ?, ?)",
                       pending.checks)
        if pending.gpus:
            _record_gpus(db, pending.gpus)
        pending.written()

    def _finish(self, db: sqlite3.Connection, run: FinishedRun,
                known: dict[str, tuple[int, str, str, float, float | None, int, str]],
                nodes_of: Mapping[str, Sequence[str]], pending: _Pending) -> FinishedRun | None:
        row = known.get(run.run_id)
        if row is None:
            raise StoreError(f"no run {run.run_id!r} in the store")
        position, state, probe, submitted_at, known_start, gpus, kind = row
        if state == "finished":
            return None
        outcome, finished_at = run.outcome, run.finished_at
        start = run.started_at or known_start or submitted_at
        seconds = max(0.0, finished_at - start)
        image = run.result.environment.container_image if run.result and run.result.environment else None
        pending.runs.append((outcome.value, run.reason, finished_at, start, seconds, int(not run.judge), image,
                             position))
        if run.result is not None:
            self._insert_result(db, position, run.run_id, probe, run.result, finished_at,
                                nodes_of.get(run.run_id, ()), pending)
        pending.latest.append(FinishedLatest(run.run_id, probe, outcome, run.reason, submitted_at, start, finished_at,
                                             seconds, kind in CHECK_KINDS and outcome in CHECK_OUTCOMES))
        bumps = pending.bumps
        for key, by in (("probe_runs_total", probe, outcome.value), 1.0), (("probe_seconds_total", probe, ""), seconds):
            bumps[key] = bumps.get(key, 0.0) + by
        if outcome is not Outcome.SKIPPED:
            key = ("probe_gpu_seconds_total", probe, "")
            bumps[key] = bumps.get(key, 0.0) + seconds * gpus
        known[run.run_id] = (position, "finished", probe, submitted_at, known_start, gpus, kind)
        return run

    def _insert_result(self, db: sqlite3.Connection, position: int, run_id: str, probe: str, result: ProbeResult,
                       finished_at: float, nodes: Sequence[str], pending: _Pending) -> None:
        """Queue the values and checks of ``result`` (of the run at store ``position``, on ``nodes``) for
        ``_flush``, and its values for ``latest``: a value of a multi-node group as the latest of each node's."""
        ids, values = self._series_ids, pending.values
        groups: dict[str | None, dict[tuple[str, str], int]] = {}
        series, per_rank = pending.sample_series.append, pending.sample_per_rank.append
        latest, latest_value = values.series.append, values.value.append
        for m in result.measurements:
            labels, node = label_text(tuple(m.labels.items())), m.node
            group = groups.get(node)
            if group is None:
                group = groups[node] = ids.group(db, probe, node or "")
            sid = group.get((m.name, labels))
            if sid is None:
                sid = ids.add(db, probe, node or "", m.name, labels)
            series(sid)
            per_rank(None if m.per_rank is None else json.dumps(m.per_rank))
            if node is None:
                for n in nodes:
                    latest(ids.id(db, probe, n, m.name, labels))
                    latest_value(m.value)
            else:
                latest(sid)
                latest_value(m.value)
        values.nodes.update(nodes if None in groups else ())
        values.nodes.update(node for node in groups if node is not None)
        count = len(result.measurements)
        pending.sample_run.extend([position] * count)
        pending.sample_value.extend(m.value for m in result.measurements)
        added = len(values.series) - len(values.at)
        values.at.extend([finished_at] * added)
        values.run_id.extend([run_id] * added)
        pending.checks.extend((run_id, c.name, int(c.ok), c.detail, c.node, c.gpu, c.rank) for c in result.checks)
        pending.gpus.extend((node, finished_at, gpus) for node, gpus in devices_by_node(result, nodes).items())

    def gpu_inventory(self, nodes: Iterable[str] | None = None) -> dict[str, tuple[GpuSeen, ...]]:
        """Per node (of ``nodes``; default every node), its GPUs as the probes last reported them, by index: a GPU
        a later run did not find is kept with ``present`` False and the UUID it had. A node whose runs never
        listed a device has no entry."""
        out: dict[str, list[GpuSeen]] = defaultdict(list)
        names = None if nodes is None else json.dumps(sorted(set(nodes)))
        rows = self._query(
            "SELECT node, gpu, uuid, name, seen_at, present FROM gpu_inventory"
            + ("" if names is None else " WHERE node IN (SELECT value FROM json_each(?))") + " ORDER BY node, gpu",
            () if names is None else (names,))
        for r in rows:
            out[r[0]].append(GpuSeen(r[1], r[2], r[3], r[4], bool(r[5])))
        return {node: tuple(gpus) for node, gpus in out.items()}

    def gpu_uuids(self, nodes: Sequence[str]) -> dict[str, dict[str, str]]:
        """Per node of ``nodes``, the UUID of each GPU of its inventory by index as text (a ``gpu`` label's
        value; empty: unknown): what ``/metrics`` labels the node's per-GPU series with (``gpu_inventory``'s
        UUIDs, read without building its rows)."""
        out: dict[str, dict[str, str]] = {}
        with self._lock:
            for node, gpu, uuid in self._db.execute(
                    "SELECT node, CAST(gpu AS TEXT), COALESCE(uuid, '') FROM gpu_inventory"
                    " WHERE node IN (SELECT value FROM json_each(?))", (json.dumps(list(nodes)),)):
                found = out.get(node)
                if found is None:
                    found = out[node] = {}
                found[gpu] = uuid
        return out

    def record_result(
        self, result: ProbeResult, *, nodes: Sequence[str], backend: str, source: str, result_path: str | None
    ) -> str:
        """Store a result that was not run by healthd (``healthd ingest``) as one finished run."""
        run_id = result.run_id or f"{source}-{int(result.started_at * 1000)}-{abs(hash(result.to_json())):x}"
        self.add_run(
            run_id=run_id,
            probe=result.probe,
            nodes=nodes,
            backend=backend,
            job_id=None,
            submitted_at=result.started_at,
            result_path=result_path,
            source=source,
            kind=RunKind.INGEST,
        )
        self.finish_run(
            run_id,
            outcome=result.outcome,
            reason=result.reason,
            finished_at=result.finished_at,
            started_at=result.started_at,
            result=result,
        )
        return run_id

    def _runs(self, where: str, params: Sequence[Any], tail: str = "ORDER BY r.submitted_at") -> list[RunRow]:
        rows = self._query(
            "SELECT r.*, (SELECT json_group_array(node) FROM run_nodes n WHERE n.run_id = r.run_id) AS nodes"
            f" FROM runs r WHERE {where} {tail}",
            params,
        )
        return [
            RunRow(
                run_id=r["run_id"],
                probe=r["probe"],
                backend=r["backend"],
                job_id=r["job_id"],
                state=r["state"],
                outcome=Outcome(r["outcome"]) if r["outcome"] else None,
                reason=r["reason"],
                submitted_at=r["submitted_at"],
                started_at=r["started_at"],
                finished_at=r["finished_at"],
                duration_s=r["duration_s"],
                result_path=r["result_path"],
                source=r["source"],
                nodes=tuple(sorted(json.loads(r["nodes"]))),
                kind=RunKind(r["kind"]),
                container_image=r["container_image"],
            )
            for r in rows
        ]

    def unfinished_runs(self) -> list[RunRow]:
        return self._runs("r.state IN ('submitted', 'running')", ())

    def run(self, run_id: str) -> RunRow | None:
        rows = self._runs("r.run_id = ?", (run_id,))
        return rows[0] if rows else None

    def recent_runs(self, *, node: str | None = None, limit: int = 50) -> list[RunRow]:
        tail = "ORDER BY r.submitted_at DESC LIMIT ?"
        if node is None:
            return self._runs("1", (limit,), tail)
        return self._runs("r.run_id IN (SELECT run_id FROM run_nodes WHERE node = ?)", (node, limit), tail)

    def last_attempts(self) -> dict[tuple[str, str], float]:
        """Per (node, probe): when a run was last submitted, whatever became of it (for planning). Read from
        the store once, then kept in memory as this object adds runs."""
        with self._lock:
            return dict(self._load_attempts())

    def last_partners(self) -> dict[tuple[str, str], frozenset[str]]:
        """Per (node, probe): the other nodes of the node's last attempt of the probe (none for single-node
        runs), for the planner to rotate partners. Read from the store on the first call (only a daemon
        that rotates partners asks), then kept in memory as this object adds runs."""
        with self._lock:
            self._load_attempts()
            if self._partners is None:
                partners: dict[tuple[str, str], set[str]] = {}
                for node, probe, other in self._db.execute(
                        "SELECT a.node, a.probe, n.node FROM attempts a JOIN run_nodes n ON n.run_id = a.run_id"
                        " WHERE n.node != a.node"):
                    partners.setdefault((node, probe), set()).add(other)
                self._partners = {key: frozenset(value) for key, value in partners.items()}
            return dict(self._partners)

    def _load_attempts(self) -> dict[tuple[str, str], float]:
        if self._attempts is None:
            self._attempts = {(r[0], r[1]): r[2]
                              for r in self._db.execute("SELECT node, probe, submitted_at FROM attempts")}
        return self._attempts
    # -- measurements -----------------------------------------------------------------------
    def measurements(
        self, *, probe: str | None = None, node: str | None = None, since: float = 0.0,
        run_id: str | None = None,
    ) -> list[MeasurementRow]:
        clauses: list[str] = ["m.at >= ?"]
        params: list[object] = [since]
        for column, value in (("probe", probe), ("node", node), ("run_id", run_id)):
            if value is not None:
                clauses.append(f"m.{column} = ?")
                params.append(value)
        rows = self._query(
            f"SELECT m.* FROM measurements m WHERE {' AND '.join(clauses)} ORDER BY m.at, m.id", params
        )
        return [self._measurement(r) for r in rows]

    @staticmethod
    def _measurement(r: sqlite3.Row) -> MeasurementRow:
        return MeasurementRow(
            run_id=r["run_id"],
            probe=r["probe"],
            node=r["node"],
            name=r["name"],
            labels=json.loads(r["labels"]),
            value=r["value"],
            at=r["at"],
        )

    def checks(self, run_id: str) -> list[dict[str, Any]]:
        return [dict(r) for r in self._query("SELECT * FROM checks WHERE run_id = ?", (run_id,))]

    def prune(self, older_than: float) -> int:
        """Delete finished runs (with their measurements and checks) and verdicts older than ``older_than``.

        The newest verdict per (node, probe) is kept whatever its age. Counters are not touched.
        """
        with self._tx() as db:
            db.execute("DELETE FROM samples WHERE run IN (SELECT rowid FROM runs WHERE state = 'finished'"
                       " AND finished_at < ?)", (older_than,))
            # a latest value is as old as its run (no foreign key: one index less on every value written)
            db.execute("DELETE FROM latest WHERE at < ?", (older_than,))
            deleted = db.execute(
                "DELETE FROM runs WHERE state = 'finished' AND finished_at < ?", (older_than,)
            ).rowcount
            db.execute(
                "DELETE FROM verdicts WHERE at < ? AND id NOT IN"
                " (SELECT MAX(id) FROM verdicts GROUP BY node, probe)",
                (older_than,),
            )
        return int(deleted)

    def rollup(self, *, older_than: float, batch: int = ROLLUP_BATCH) -> int:
        """Fold the per-value detail of runs finished before ``older_than`` into per-node daily summaries
        (``rollups``: count, min, mean and max of each node's series, its GPUs pooled) and delete that
        detail and the runs' passed checks. Incremental: runs are taken in order of finish from where the
        last call stopped, ``batch`` per transaction (a run stored later with an older finish, such as an
        ingested one, keeps its detail until ``prune``). Returns how many runs were folded."""
        folded = 0
        while True:
            with self._tx() as db:
                mark = dict(db.execute("SELECT key, value FROM store_state WHERE key IN (?, ?)",
                                       (ROLLUP_AT, ROLLUP_POSITION)).fetchall())
                at, position = mark.get(ROLLUP_AT, float("-inf")), int(mark.get(ROLLUP_POSITION, 0))
                chosen = db.execute(
                    "SELECT rowid, finished_at FROM runs WHERE state = 'finished' AND finished_at < ?"
                    " AND (finished_at > ? OR (finished_at = ? AND rowid > ?)) ORDER BY finished_at, rowid LIMIT ?",
                    (older_than, at, at, position, batch)).fetchall()
                if not chosen:
                    return folded
                self._fold(db, json.dumps([r[0] for r in chosen]))
                db.executemany("INSERT INTO store_state (key, value) VALUES (?, ?)"
                               " ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                               [(ROLLUP_AT, chosen[-1][1]), (ROLLUP_POSITION, chosen[-1][0])])
                folded += len(chosen)

    @staticmethod
    def _fold(db: sqlite3.Connection, positions: str) -> None:
        """Fold the runs at ``positions`` (a JSON list of ``runs`` rowids)."""
        sums: dict[tuple[str, str, str, str, int], list[float]] = {}
        pooled: dict[str, str] = {}
        for node, probe, name, labels, day, value in db.execute(
            "SELECT COALESCE(NULLIF(s.node, ''), rn.node), s.probe, s.name, s.labels,"
            " CAST(r.finished_at / 86400 AS INTEGER), x.value"
            " FROM samples x JOIN runs r ON r.rowid = x.run JOIN series s ON s.id = x.series"
            " LEFT JOIN run_nodes rn ON s.node = '' AND rn.run_id = r.run_id"
            " WHERE x.run IN (SELECT value FROM json_each(?))",
            (positions,),
        ):
            if labels not in pooled:
                pooled[labels] = canonical_labels({k: v for k, v in json.loads(labels).items() if k != "gpu"})
            acc = sums.setdefault((node or "", probe, name, pooled[labels], day), [0.0, value, 0.0, value])
            acc[0] += 1
            acc[1] = min(acc[1], value)
            acc[2] += value
            acc[3] = max(acc[3], value)
        db.executemany(
            "INSERT INTO rollups (node, probe, name, labels, day, n, lo, mean, hi) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
            " ON CONFLICT (node, probe, name, labels, day) DO UPDATE SET n = n + excluded.n,"
            " lo = MIN(lo, excluded.lo), hi = MAX(hi, excluded.hi),"
            " mean = (mean * n + excluded.mean * excluded.n) / (n + excluded.n)",
            [(*key, int(n), lo, total / n, hi) for key, (n, lo, total, hi) in sums.items()],
        )
        db.execute("DELETE FROM samples WHERE run IN (SELECT value FROM json_each(?))", (positions,))
        db.execute("DELETE FROM checks WHERE ok = 1 AND run_id IN"
                   " (SELECT run_id FROM runs WHERE rowid IN (SELECT value FROM json_each(?)))", (positions,))

    def rollups(self, *, node: str | None = None, probe: str | None = None) -> list[RollupRow]:
        """The per-node daily summaries of history beyond the detail window, oldest day first."""
        rows = self._query(
            "SELECT * FROM rollups WHERE (? IS NULL OR node = ?) AND (? IS NULL OR probe = ?)"
            " ORDER BY day, node, probe, name, labels", (node, node, probe, probe))
        return [RollupRow(r["node"], r["probe"], r["name"], json.loads(r["labels"]), r["day"] * 86400.0, r["n"],
                          r["lo"], r["mean"], r["hi"]) for r in rows]


_GPU_UPSERT = ("INSERT INTO gpu_inventory (node, gpu, uuid, name, seen_at, present) VALUES (?, ?, ?, ?, ?, 1)"
               " ON CONFLICT (node, gpu) DO UPDATE SET uuid = excluded.uuid, name = excluded.name,"
               " seen_at = excluded.seen_at, present = 1")


def _record_gpus(db: sqlite3.Connection,
                 seen: Sequence[tuple[str, float, tuple[tuple[int, str | None, str], ...]]]) -> None:
    """Each node's GPUs as a result reported them (in order; one older than the node's newest is skipped),
    the others of the node no longer present: one statement per table for the nodes seen once in the batch."""
    nodes = sorted({node for node, _, _ in seen})
    newest: dict[str, float] = dict(db.execute(
        "SELECT node, MAX(seen_at) FROM gpu_inventory WHERE node IN (SELECT value FROM json_each(?)) GROUP BY node",
        (json.dumps(nodes),)).fetchall())
    times = Counter(node for node, _, _ in seen)
    once = [(node, at, gpus) for node, at, gpus in seen
            if times[node] == 1 and (node not in newest or at >= newest[node])]
    db.executemany("UPDATE gpu_inventory SET present = 0 WHERE node = ?", [(node,) for node, _, _ in once])
    db.executemany(_GPU_UPSERT, [(node, *gpu, at) for node, at, gpus in once for gpu in gpus])
    for node, at, gpus in seen:
        if times[node] == 1:
            continue
        latest = db.execute("SELECT MAX(seen_at) FROM gpu_inventory WHERE node = ?", (node,)).fetchone()[0]
        if latest is not None and at < latest:
            continue
        db.execute("UPDATE gpu_inventory SET present = 0 WHERE node = ?", (node,))
        db.executemany(_GPU_UPSERT, [(node, *gpu, at) for gpu in gpus])
