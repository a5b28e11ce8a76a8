"""Runs and what they measured: the life of a run (submitted → running → finished), its
measurements and checks, the counters its end bumps, and the per-(node, probe) views of them."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence
from typing import Any

from healthd.errors import StoreError
from healthd.model import Outcome, ProbeResult, RunKind
from healthd.store.latest import LatestStore
from healthd.store.rows import MeasurementRow, RunRow, canonical_labels


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
        with self._tx() as db:
            row = db.execute("SELECT state, probe, submitted_at, started_at FROM runs WHERE run_id = ?",
                             (run_id,)).fetchone()
            if row is None:
                raise StoreError(f"no run {run_id!r} in the store")
            state, probe, submitted_at, known_start = row
            if state == "finished":
                return False
            start = started_at or known_start or submitted_at
            db.execute(
                "UPDATE runs SET state = 'finished', outcome = ?, reason = ?, finished_at = ?,"
                " started_at = ?, duration_s = ?, judged = ? WHERE run_id = ?",
                (outcome.value, reason, finished_at, start, max(0.0, finished_at - start), int(not judge), run_id),
            )
            if result is not None:
                self._insert_result(db, run_id, probe, result, finished_at)
            self._update_latest(db, run_id, probe, outcome, result)
            self._bump(db, "probe_runs_total", {"probe": probe, "outcome": outcome.value}, 1.0)
            seconds = max(0.0, finished_at - start)
            self._bump(db, "probe_seconds_total", {"probe": probe}, seconds)
            gpus = db.execute(
                "SELECT COALESCE(SUM(n.gpus), 0) FROM run_nodes r JOIN nodes n ON n.name = r.node WHERE r.run_id = ?",
                (run_id,),
            ).fetchone()[0]
            if outcome is not Outcome.SKIPPED:
                self._bump(db, "probe_gpu_seconds_total", {"probe": probe}, seconds * gpus)
            return True

    def _insert_result(
        self, db: sqlite3.Connection, run_id: str, probe: str, result: ProbeResult, at: float
    ) -> None:
        db.executemany(
            "INSERT INTO measurements (run_id, probe, node, name, labels, value, per_rank, at)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            [
                (
                    run_id,
                    probe,
                    m.node,
                    m.name,
                    canonical_labels(m.labels),
                    m.value,
                    json.dumps(m.per_rank) if m.per_rank is not None else None,
                    at,
                )
                for m in result.measurements
            ],
        )
        db.executemany(
            "INSERT INTO checks (run_id, name, ok, detail, node, gpu, rank) VALUES (?, ?, ?, ?, ?, ?, ?)",
            [(run_id, c.name, int(c.ok), c.detail, c.node, c.gpu, c.rank) for c in result.checks],
        )

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
            )
            for r in rows
        ]

    def unfinished_runs(self) -> list[RunRow]:
        return self._runs("r.state != 'finished'", ())

    def run(self, run_id: str) -> RunRow | None:
        rows = self._runs("r.run_id = ?", (run_id,))
        return rows[0] if rows else None

    def recent_runs(self, *, node: str | None = None, limit: int = 50) -> list[RunRow]:
        tail = "ORDER BY r.submitted_at DESC LIMIT ?"
        if node is None:
            return self._runs("1", (limit,), tail)
        return self._runs("r.run_id IN (SELECT run_id FROM run_nodes WHERE node = ?)", (node, limit), tail)

    def last_attempts(self) -> dict[tuple[str, str], float]:
        """Per (node, probe): when a run was last submitted, whatever became of it (for planning)."""
        rows = self._query(
            "SELECT n.node, r.probe, MAX(r.submitted_at) FROM runs r JOIN run_nodes n ON n.run_id = r.run_id"
            " WHERE r.kind != 'ingest' GROUP BY n.node, r.probe"
        )
        return {(r[0], r[1]): r[2] for r in rows}
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
            deleted = db.execute(
                "DELETE FROM runs WHERE state = 'finished' AND finished_at < ?", (older_than,)
            ).rowcount
            db.execute(
                "DELETE FROM verdicts WHERE at < ? AND id NOT IN"
                " (SELECT MAX(id) FROM verdicts GROUP BY node, probe)",
                (older_than,),
            )
        return int(deleted)
