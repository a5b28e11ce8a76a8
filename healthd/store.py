"""SQLite state: probe runs, measurements, checks, verdicts, nodes, counters.

The store is the single source of truth for the metrics endpoint, the HTTP API and the CLI.
One connection, guarded by a lock, in WAL mode; every write is one transaction, so a
SIGKILL leaves either the whole change or none of it. Schema changes are forward
migrations keyed on ``PRAGMA user_version``.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from healthd.errors import StoreError
from healthd.model import Node, Outcome, ProbeResult, Verdict

MIGRATIONS: tuple[str, ...] = (
    # 1: initial schema
    """
    CREATE TABLE runs (
        run_id       TEXT PRIMARY KEY,
        probe        TEXT NOT NULL,
        backend      TEXT NOT NULL,
        job_id       TEXT,
        state        TEXT NOT NULL CHECK (state IN ('submitted', 'running', 'finished')),
        outcome      TEXT CHECK (outcome IN ('pass', 'degraded', 'fail', 'error', 'skipped')),
        reason       TEXT NOT NULL DEFAULT '',
        submitted_at REAL NOT NULL,
        started_at   REAL,
        finished_at  REAL,
        duration_s   REAL,
        result_path  TEXT,
        source       TEXT NOT NULL DEFAULT 'probe'
    );
    CREATE INDEX runs_state ON runs (state);
    CREATE TABLE run_nodes (
        run_id TEXT NOT NULL REFERENCES runs (run_id) ON DELETE CASCADE,
        node   TEXT NOT NULL,
        PRIMARY KEY (run_id, node)
    );
    CREATE INDEX run_nodes_node ON run_nodes (node);
    CREATE TABLE measurements (
        id       INTEGER PRIMARY KEY,
        run_id   TEXT NOT NULL REFERENCES runs (run_id) ON DELETE CASCADE,
        probe    TEXT NOT NULL,
        node     TEXT,
        name     TEXT NOT NULL,
        labels   TEXT NOT NULL,
        value    REAL NOT NULL,
        per_rank TEXT,
        at       REAL NOT NULL
    );
    CREATE INDEX measurements_series ON measurements (probe, name, node, labels, at);
    CREATE INDEX measurements_run ON measurements (run_id);
    CREATE TABLE checks (
        run_id TEXT NOT NULL REFERENCES runs (run_id) ON DELETE CASCADE,
        name   TEXT NOT NULL,
        ok     INTEGER NOT NULL,
        detail TEXT NOT NULL,
        node   TEXT,
        gpu    INTEGER,
        rank   INTEGER
    );
    CREATE INDEX checks_run ON checks (run_id);
    CREATE TABLE verdicts (
        id          INTEGER PRIMARY KEY,
        node        TEXT NOT NULL,
        probe       TEXT NOT NULL,
        outcome     TEXT NOT NULL,
        reason      TEXT NOT NULL,
        reason_code TEXT NOT NULL,
        run_ids     TEXT NOT NULL,
        evidence    TEXT NOT NULL,
        at          REAL NOT NULL
    );
    CREATE INDEX verdicts_node_probe ON verdicts (node, probe, at);
    CREATE TABLE nodes (
        name        TEXT PRIMARY KEY,
        state       TEXT NOT NULL,
        flags       TEXT NOT NULL,
        partitions  TEXT NOT NULL,
        gpus        INTEGER NOT NULL,
        gpu_type    TEXT,
        features    TEXT NOT NULL,
        reason      TEXT,
        node_class  TEXT,
        last_seen   REAL NOT NULL
    );
    CREATE TABLE counters (
        name   TEXT NOT NULL,
        labels TEXT NOT NULL,
        value  REAL NOT NULL,
        PRIMARY KEY (name, labels)
    );
    """,
    # 2: judgement state, recommendations, remediation audit and drain history
    """
    CREATE TABLE judge_series (
        node        TEXT NOT NULL,
        probe       TEXT NOT NULL,
        name        TEXT NOT NULL,
        labels      TEXT NOT NULL,
        accepted    TEXT NOT NULL,
        last_value  REAL,
        last_at     REAL NOT NULL,
        last_run_id TEXT NOT NULL,
        floor       REAL,
        baseline    REAL,
        spread      REAL,
        PRIMARY KEY (node, probe, name, labels)
    );
    CREATE TABLE judge_marks (
        run_id      TEXT NOT NULL,
        node        TEXT NOT NULL,
        probe       TEXT NOT NULL,
        at          REAL NOT NULL,
        severity    INTEGER NOT NULL,
        code        TEXT NOT NULL,
        text        TEXT NOT NULL,
        regular     INTEGER NOT NULL,
        event_proof INTEGER NOT NULL,
        raw_flagged INTEGER NOT NULL,
        findings    TEXT NOT NULL,
        PRIMARY KEY (run_id, node)
    );
    CREATE INDEX judge_marks_node ON judge_marks (node, at);
    CREATE INDEX judge_marks_at ON judge_marks (at);
    CREATE TABLE judge_groups (
        run_id      TEXT PRIMARY KEY,
        probe       TEXT NOT NULL,
        at          REAL NOT NULL,
        members     TEXT NOT NULL,
        suspects    TEXT NOT NULL,
        severity    INTEGER NOT NULL,
        code        TEXT NOT NULL,
        text        TEXT NOT NULL,
        event_proof INTEGER NOT NULL,
        findings    TEXT NOT NULL
    );
    CREATE INDEX judge_groups_at ON judge_groups (at);
    CREATE TABLE judge_requests (
        node         TEXT NOT NULL,
        probe        TEXT NOT NULL,
        kind         TEXT NOT NULL,
        nodes        TEXT NOT NULL,
        requested_at REAL NOT NULL,
        reason       TEXT NOT NULL,
        PRIMARY KEY (node, probe)
    );
    CREATE TABLE fleet_events (
        id          INTEGER PRIMARY KEY,
        node_class  TEXT NOT NULL,
        probe       TEXT NOT NULL,
        started_at  REAL NOT NULL,
        ended_at    REAL,
        flagged     INTEGER NOT NULL,
        sampled     INTEGER NOT NULL,
        series      TEXT NOT NULL,
        text        TEXT NOT NULL
    );
    CREATE UNIQUE INDEX fleet_events_active ON fleet_events (node_class, probe) WHERE ended_at IS NULL;
    CREATE TABLE recommendations (
        id           INTEGER PRIMARY KEY,
        node         TEXT NOT NULL,
        probe        TEXT NOT NULL,
        outcome      TEXT NOT NULL,
        reason_code  TEXT NOT NULL,
        text         TEXT NOT NULL,
        evidence     TEXT NOT NULL,
        since        REAL NOT NULL,
        updated_at   REAL NOT NULL,
        state        TEXT NOT NULL CHECK (state IN ('active', 'cleared', 'withdrawn', 'dismissed')),
        closed_at    REAL,
        close_reason TEXT NOT NULL DEFAULT '',
        escalated    INTEGER NOT NULL DEFAULT 0,
        last_refusal TEXT NOT NULL DEFAULT ''
    );
    CREATE UNIQUE INDEX recommendations_active ON recommendations (node, probe) WHERE state = 'active';
    CREATE INDEX recommendations_node ON recommendations (node, since);
    CREATE TABLE remediation_audit (
        id      INTEGER PRIMARY KEY,
        at      REAL NOT NULL,
        actor   TEXT NOT NULL,
        action  TEXT NOT NULL,
        node    TEXT,
        result  TEXT NOT NULL CHECK (result IN ('done', 'refused', 'failed', 'info')),
        reason  TEXT NOT NULL,
        detail  TEXT NOT NULL
    );
    CREATE INDEX remediation_audit_at ON remediation_audit (at);
    CREATE TABLE drains (
        id           INTEGER PRIMARY KEY,
        node         TEXT NOT NULL,
        node_class   TEXT NOT NULL,
        reason       TEXT NOT NULL,
        actor        TEXT NOT NULL,
        automatic    INTEGER NOT NULL,
        probes       TEXT NOT NULL DEFAULT '[]',
        drained_at   REAL NOT NULL,
        undrained_at REAL,
        undrained_by TEXT
    );
    CREATE INDEX drains_node ON drains (node, drained_at);
    CREATE TABLE remediation_state (
        key   TEXT PRIMARY KEY,
        value TEXT NOT NULL
    );
    """,
)

SCHEMA_VERSION = len(MIGRATIONS)


def canonical_labels(labels: dict[str, str]) -> str:
    return json.dumps(labels, sort_keys=True, separators=(",", ":"))


@dataclass(frozen=True)
class RunRow:
    run_id: str
    probe: str
    backend: str
    job_id: str | None
    state: str
    outcome: Outcome | None
    reason: str
    submitted_at: float
    started_at: float | None
    finished_at: float | None
    duration_s: float | None
    result_path: str | None
    source: str
    nodes: tuple[str, ...]


@dataclass(frozen=True)
class MeasurementRow:
    run_id: str
    probe: str
    node: str | None
    name: str
    labels: dict[str, str]
    value: float
    at: float


@dataclass(frozen=True)
class LastRun:
    """Per (node, probe): the newest finished run and the newest passing one."""

    node: str
    probe: str
    last_run_at: float
    last_outcome: Outcome
    last_reason: str
    last_run_id: str
    last_success_at: float | None


@dataclass(frozen=True)
class RunTiming:
    """Per (node, probe): queue wait, duration and GPUs held of the newest finished run (as ``LastRun``)."""

    node: str
    probe: str
    queue_wait_s: float
    duration_s: float
    gpus: int


@dataclass(frozen=True)
class Snapshot:
    """An immutable copy of what the metrics endpoint and the API show."""

    taken_at: float
    nodes: tuple[Node, ...]
    last_runs: tuple[LastRun, ...]
    latest: tuple[MeasurementRow, ...]
    verdicts: tuple[Verdict, ...]
    counters: tuple[tuple[str, dict[str, str], float], ...]
    in_flight: int
    run_timings: tuple[RunTiming, ...] = ()
    scaling: tuple[tuple[str, int, float, MeasurementRow], ...] = ()


class Store:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.RLock()
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None, timeout=30)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA foreign_keys=ON")
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._migrate()
            self._db.execute("BEGIN IMMEDIATE")
            self._db.execute("ROLLBACK")
        except (sqlite3.Error, OSError) as exc:
            raise StoreError(f"cannot open the state store {path}: {exc}") from None

    # -- plumbing ---------------------------------------------------------------------------
    def _migrate(self) -> None:
        version = self._db.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA_VERSION:
            raise StoreError(
                f"{self.path} has schema version {version}, newer than this healthd ({SCHEMA_VERSION})"
            )
        for number in range(version, SCHEMA_VERSION):
            self._db.execute("BEGIN IMMEDIATE")
            try:
                for statement in MIGRATIONS[number].split(";"):
                    if statement.strip():
                        self._db.execute(statement)
                self._db.execute(f"PRAGMA user_version = {number + 1}")
                self._db.execute("COMMIT")
            except sqlite3.Error:
                self._db.execute("ROLLBACK")
                raise

    @property
    def schema_version(self) -> int:
        with self._lock:
            return int(self._db.execute("PRAGMA user_version").fetchone()[0])

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            try:
                self._db.execute("BEGIN IMMEDIATE")
            except sqlite3.Error as exc:
                raise StoreError(f"cannot write the state store {self.path}: {exc}") from None
            try:
                yield self._db
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            try:
                self._db.execute("COMMIT")
            except sqlite3.Error as exc:
                self._db.execute("ROLLBACK")
                raise StoreError(f"cannot write the state store {self.path}: {exc}") from None

    def _query(self, sql: str, params: Sequence[Any] = ()) -> list[sqlite3.Row]:
        with self._lock:
            cur = self._db.execute(sql, params)
            cur.row_factory = sqlite3.Row
            return cur.fetchall()

    def close(self) -> None:
        with self._lock:
            self._db.close()

    # -- runs -------------------------------------------------------------------------------
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
    ) -> None:
        with self._tx() as db:
            db.execute(
                "INSERT INTO runs (run_id, probe, backend, job_id, state, submitted_at, result_path, source)"
                " VALUES (?, ?, ?, ?, 'submitted', ?, ?, ?)",
                (run_id, probe, backend, job_id, submitted_at, result_path, source),
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
    ) -> bool:
        """Close a run with its outcome and, when there is one, its parsed result.

        Idempotent: a run already finished is left alone and ``False`` is returned, so a
        result collected twice (a restart between collect and commit) is stored once.
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
                " started_at = ?, duration_s = ? WHERE run_id = ?",
                (outcome.value, reason, finished_at, start, max(0.0, finished_at - start), run_id),
            )
            if result is not None:
                self._insert_result(db, run_id, probe, result, finished_at)
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

    @staticmethod
    def _bump(db: sqlite3.Connection, name: str, labels: dict[str, str], by: float) -> None:
        db.execute(
            "INSERT INTO counters (name, labels, value) VALUES (?, ?, ?)"
            " ON CONFLICT (name, labels) DO UPDATE SET value = value + excluded.value",
            (name, canonical_labels(labels), by),
        )

    def bump_counter(self, name: str, labels: dict[str, str], by: float = 1.0) -> None:
        with self._tx() as db:
            self._bump(db, name, labels, by)

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

    def last_runs(self) -> list[LastRun]:
        rows = self._query(
            """
            WITH fin AS (
                SELECT n.node, r.probe, r.run_id, r.outcome, r.reason, r.finished_at,
                       ROW_NUMBER() OVER (PARTITION BY n.node, r.probe ORDER BY r.finished_at DESC) AS k
                FROM runs r JOIN run_nodes n ON n.run_id = r.run_id
                WHERE r.state = 'finished' AND r.outcome != 'skipped'
            )
            SELECT f.node, f.probe, f.run_id, f.outcome, f.reason, f.finished_at,
                   (SELECT MAX(r2.finished_at) FROM runs r2 JOIN run_nodes n2 ON n2.run_id = r2.run_id
                     WHERE n2.node = f.node AND r2.probe = f.probe AND r2.outcome = 'pass') AS last_success
            FROM fin f WHERE f.k = 1 ORDER BY f.node, f.probe
            """
        )
        return [
            LastRun(
                node=r["node"],
                probe=r["probe"],
                last_run_at=r["finished_at"],
                last_outcome=Outcome(r["outcome"]),
                last_reason=r["reason"],
                last_run_id=r["run_id"],
                last_success_at=r["last_success"],
            )
            for r in rows
        ]

    def last_attempts(self) -> dict[tuple[str, str], float]:
        """Per (node, probe): when a run was last submitted, whatever became of it (for planning)."""
        rows = self._query(
            "SELECT n.node, r.probe, MAX(r.submitted_at) FROM runs r JOIN run_nodes n ON n.run_id = r.run_id"
            " WHERE r.source = 'probe' GROUP BY n.node, r.probe"
        )
        return {(r[0], r[1]): r[2] for r in rows}

    # -- measurements -----------------------------------------------------------------------
    def latest_measurements(self) -> list[MeasurementRow]:
        """The newest value of every (probe, node, name, labels) series.

        A measurement of a multi-node group (``node`` NULL) counts once for each node of its run.
        """
        rows = self._query(
            """
            SELECT run_id, probe, node, name, labels, value, at FROM (
                SELECT m.run_id, m.probe, COALESCE(m.node, rn.node) AS node, m.name, m.labels, m.value, m.at,
                       ROW_NUMBER() OVER (PARTITION BY m.probe, COALESCE(m.node, rn.node), m.name, m.labels
                                          ORDER BY m.at DESC, m.id DESC) AS k
                FROM measurements m LEFT JOIN run_nodes rn ON m.node IS NULL AND rn.run_id = m.run_id
            ) WHERE k = 1 ORDER BY probe, node, name, labels
            """
        )
        return [self._measurement(r) for r in rows]

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

    # -- verdicts ---------------------------------------------------------------------------
    def put_verdicts(self, verdicts: Iterable[Verdict]) -> None:
        with self._tx() as db:
            db.executemany(
                "INSERT INTO verdicts (node, probe, outcome, reason, reason_code, run_ids, evidence, at)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                [
                    (v.node, v.probe, v.outcome.value, v.reason, v.reason_code, json.dumps(list(v.run_ids)),
                     json.dumps(v.evidence), v.at)
                    for v in verdicts
                ],
            )

    def current_verdicts(self) -> list[Verdict]:
        rows = self._query(
            """
            SELECT * FROM (
                SELECT *, ROW_NUMBER() OVER (PARTITION BY node, probe ORDER BY at DESC, id DESC) AS k FROM verdicts
            ) WHERE k = 1 ORDER BY node, probe
            """
        )
        return [
            Verdict(
                node=r["node"],
                probe=r["probe"],
                outcome=Outcome(r["outcome"]),
                reason=r["reason"],
                reason_code=r["reason_code"],
                run_ids=tuple(json.loads(r["run_ids"])),
                evidence=json.loads(r["evidence"]),
                at=r["at"],
            )
            for r in rows
        ]

    # -- nodes ------------------------------------------------------------------------------
    def upsert_nodes(self, nodes: Iterable[Node], seen_at: float) -> None:
        with self._tx() as db:
            db.executemany(
                "INSERT INTO nodes (name, state, flags, partitions, gpus, gpu_type, features, reason, node_class,"
                " last_seen) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
                " ON CONFLICT (name) DO UPDATE SET state = excluded.state, flags = excluded.flags,"
                " partitions = excluded.partitions, gpus = excluded.gpus, gpu_type = excluded.gpu_type,"
                " features = excluded.features, reason = excluded.reason, node_class = excluded.node_class,"
                " last_seen = excluded.last_seen",
                [
                    (n.name, n.state, json.dumps(sorted(n.flags)), json.dumps(list(n.partitions)), n.gpus,
                     n.gpu_type, json.dumps(list(n.features)), n.reason, n.node_class, seen_at)
                    for n in nodes
                ],
            )

    def nodes(self, *, seen_since: float = 0.0) -> list[Node]:
        rows = self._query("SELECT * FROM nodes WHERE last_seen >= ? ORDER BY name", (seen_since,))
        return [
            Node(
                name=r["name"],
                state=r["state"],
                flags=frozenset(json.loads(r["flags"])),
                partitions=tuple(json.loads(r["partitions"])),
                gpus=r["gpus"],
                gpu_type=r["gpu_type"],
                features=tuple(json.loads(r["features"])),
                reason=r["reason"],
                node_class=r["node_class"],
            )
            for r in rows
        ]

    # -- counters, snapshot, retention ----------------------------------------------------
    def counters(self) -> list[tuple[str, dict[str, str], float]]:
        return [
            (r["name"], json.loads(r["labels"]), r["value"])
            for r in self._query("SELECT * FROM counters ORDER BY name, labels")
        ]

    def snapshot(self, *, node_seen_since: float = 0.0) -> Snapshot:
        with self._lock:
            return Snapshot(
                taken_at=time.time(),
                nodes=tuple(self.nodes(seen_since=node_seen_since)),
                last_runs=tuple(self.last_runs()),
                latest=tuple(self.latest_measurements()),
                verdicts=tuple(self.current_verdicts()),
                counters=tuple(self.counters()),
                in_flight=len(self.unfinished_runs()),
                run_timings=tuple(self.last_run_timings()),
                scaling=tuple(self.scaling_table()),
            )

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

    def last_run_timings(self) -> list[RunTiming]:
        """Per (node, probe), the newest finished run (the one ``last_runs`` reports): how long it
        waited between submission and start, how long it ran, and the GPUs of the node it held."""
        rows = self._query(
            """
            WITH fin AS (
                SELECT n.node, r.probe, r.submitted_at, r.started_at, r.duration_s,
                       ROW_NUMBER() OVER (PARTITION BY n.node, r.probe ORDER BY r.finished_at DESC) AS k
                FROM runs r JOIN run_nodes n ON n.run_id = r.run_id
                WHERE r.state = 'finished' AND r.outcome != 'skipped'
            )
            SELECT f.node, f.probe, f.submitted_at, f.started_at, f.duration_s, COALESCE(nd.gpus, 0) AS gpus
            FROM fin f LEFT JOIN nodes nd ON nd.name = f.node WHERE f.k = 1 ORDER BY f.node, f.probe
            """
        )
        return [
            RunTiming(
                node=r["node"],
                probe=r["probe"],
                queue_wait_s=max(0.0, (r["started_at"] or r["submitted_at"]) - r["submitted_at"]),
                duration_s=r["duration_s"] or 0.0,
                gpus=r["gpus"],
            )
            for r in rows
        ]

    # -- judgement and remediation (migration 2) -------------------------------------------
    # Plain rows in and out: the judge (healthd.judge.engine) and remediation (healthd.remediation)
    # own their semantics; the store only keeps them.
    def save_judgement(
        self,
        *,
        verdicts: Iterable[Verdict],
        series: Iterable[dict[str, Any]],
        marks: Iterable[dict[str, Any]],
        groups: Iterable[dict[str, Any]],
        events: Iterable[dict[str, Any]],
        pending: Iterable[dict[str, Any]],
        satisfied: Iterable[tuple[str, str]],
        prune_before: float | None = None,
    ) -> None:
        """One evaluation of the judge, in one transaction (see ``healthd.judge.engine.save_output``)."""
        with self._tx() as db:
            db.executemany(
                "INSERT INTO verdicts (node, probe, outcome, reason, reason_code, run_ids, evidence, at)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                [(v.node, v.probe, v.outcome.value, v.reason, v.reason_code, json.dumps(list(v.run_ids)),
                  json.dumps(v.evidence), v.at) for v in verdicts],
            )
            db.executemany(
                "INSERT OR REPLACE INTO judge_series (node, probe, name, labels, accepted, last_value, last_at,"
                " last_run_id, floor, baseline, spread) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [(s["node"], s["probe"], s["name"],
                  s["labels"] if isinstance(s["labels"], str) else canonical_labels(s["labels"]),
                  json.dumps(s["accepted"]), s["last_value"], s["last_at"], s["last_run_id"], s["floor"],
                  s["baseline"], s["spread"])
                 for s in series],
            )
            db.executemany(
                "INSERT OR REPLACE INTO judge_marks (run_id, node, probe, at, severity, code, text, regular,"
                " event_proof, raw_flagged, findings) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [(m["run_id"], m["node"], m["probe"], m["at"], m["severity"], m["code"], m["text"], int(m["regular"]),
                  int(m["event_proof"]), int(m["raw_flagged"]), json.dumps(m["findings"])) for m in marks],
            )
            db.executemany(
                "INSERT OR REPLACE INTO judge_groups (run_id, probe, at, members, suspects, severity, code, text,"
                " event_proof, findings) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [(g["run_id"], g["probe"], g["at"], json.dumps(g["members"]), json.dumps(g["suspects"]),
                  g["severity"], g["code"], g["text"], int(g["event_proof"]), json.dumps(g["findings"]))
                 for g in groups],
            )
            for e in events:
                if e["ended_at"] is None:
                    db.execute(
                        "INSERT INTO fleet_events (node_class, probe, started_at, flagged, sampled, series, text)"
                        " VALUES (?, ?, ?, ?, ?, ?, ?)",
                        (e["node_class"], e["probe"], e["started_at"], e["flagged"], e["sampled"],
                         json.dumps(e["series"]), e["text"]),
                    )
                else:
                    db.execute(
                        "UPDATE fleet_events SET ended_at = ?, text = ? WHERE node_class = ? AND probe = ?"
                        " AND ended_at IS NULL", (e["ended_at"], e["text"], e["node_class"], e["probe"]),
                    )
            db.executemany("DELETE FROM judge_requests WHERE node = ? AND probe = ?", list(satisfied))
            db.executemany(
                "INSERT OR REPLACE INTO judge_requests (node, probe, kind, nodes, requested_at, reason)"
                " VALUES (?, ?, ?, ?, ?, ?)",
                [(p["node"], p["probe"], p["kind"], json.dumps(p["nodes"]), p["requested_at"], p["reason"])
                 for p in pending],
            )
            if prune_before is not None:
                db.execute("DELETE FROM judge_marks WHERE at < ?", (prune_before,))
                db.execute("DELETE FROM judge_groups WHERE at < ?", (prune_before,))

    def load_judgement(self, *, since: float) -> dict[str, list[dict[str, Any]]]:
        """What ``Judge.restore`` needs: every series, marks and group records since ``since``,
        active fleet events, pending re-probes, current verdicts and undrain times."""
        def rows(sql: str, params: Sequence[Any] = ()) -> list[dict[str, Any]]:
            return [dict(r) for r in self._query(sql, params)]

        with self._lock:
            series = rows("SELECT * FROM judge_series")
            for s in series:
                s["labels"] = json.loads(s["labels"])
                s["accepted"] = json.loads(s["accepted"])
            marks = rows("SELECT * FROM judge_marks WHERE at >= ? ORDER BY at", (since,))
            for m in marks:
                m["findings"] = json.loads(m["findings"])
            groups = rows("SELECT * FROM judge_groups WHERE at >= ? ORDER BY at", (since,))
            for g in groups:
                for key in ("members", "suspects", "findings"):
                    g[key] = json.loads(g[key])
            events = rows("SELECT * FROM fleet_events WHERE ended_at IS NULL")
            for e in events:
                e["series"] = json.loads(e["series"])
            pending = rows("SELECT * FROM judge_requests")
            for p in pending:
                p["nodes"] = json.loads(p["nodes"])
            return {
                "series": series, "marks": marks, "groups": groups, "events": events, "pending": pending,
                "verdicts": [{"verdict": v} for v in self.current_verdicts()],
                "resets": [{"node": n, "at": at} for n, at in self.judge_resets().items()],
            }

    def judge_resets(self) -> dict[str, float]:
        """Per node, when healthd last undrained it: its earlier evidence no longer counts."""
        return {r[0]: r[1] for r in self._query(
            "SELECT node, MAX(undrained_at) FROM drains WHERE undrained_at IS NOT NULL GROUP BY node")}

    def judge_series(self) -> list[dict[str, Any]]:
        """Every judged series with its latest value, floor and baseline (for the metrics)."""
        out = [dict(r) for r in self._query(
            "SELECT node, probe, name, labels, last_value, last_at, floor, baseline, spread FROM judge_series"
            " ORDER BY probe, name, node, labels")]
        for s in out:
            s["labels"] = json.loads(s["labels"])
        return out

    def judge_history(self, *, since: float = 0.0, until: float = float("inf")) -> list[dict[str, Any]]:
        """Finished runs in [since, until] by finish time, with nodes, measurements and failed checks."""
        params = (since, until if until != float("inf") else 1e300)
        with self._lock:
            runs = [dict(r) for r in self._query(
                "SELECT r.run_id, r.probe, r.outcome, r.reason, r.finished_at AS at,"
                " (SELECT json_group_array(node) FROM run_nodes n WHERE n.run_id = r.run_id) AS nodes"
                " FROM runs r WHERE r.state = 'finished' AND r.finished_at >= ? AND r.finished_at <= ?"
                " ORDER BY r.finished_at, r.run_id", params)]
            by_run: dict[str, dict[str, Any]] = {}
            for r in runs:
                r["nodes"] = sorted(json.loads(r["nodes"]))
                r["measurements"], r["failed_checks"] = [], []
                by_run[r["run_id"]] = r
            for m in self._query(
                "SELECT m.run_id, m.node, m.name, m.labels, m.value FROM measurements m JOIN runs r"
                " ON r.run_id = m.run_id WHERE r.state = 'finished' AND r.finished_at >= ? AND r.finished_at <= ?"
                " ORDER BY m.id", params):
                if m["run_id"] in by_run:
                    by_run[m["run_id"]]["measurements"].append(
                        {"name": m["name"], "value": m["value"], "labels": json.loads(m["labels"]), "node": m["node"]})
            for c in self._query(
                "SELECT c.* FROM checks c JOIN runs r ON r.run_id = c.run_id WHERE c.ok = 0"
                " AND r.state = 'finished' AND r.finished_at >= ? AND r.finished_at <= ?", params):
                if c["run_id"] in by_run:
                    by_run[c["run_id"]]["failed_checks"].append(
                        {"name": c["name"], "detail": c["detail"], "node": c["node"], "gpu": c["gpu"]})
        return runs

    def marks_since(self, node: str, since: float) -> list[tuple[float, str, int, str]]:
        """(at, probe, severity, code) of the node's judged results after ``since``, oldest first."""
        return [(r[0], r[1], r[2], r[3]) for r in self._query(
            "SELECT at, probe, severity, code FROM judge_marks WHERE node = ? AND at > ? ORDER BY at", (node, since))]

    def group_marks_since(self, node: str, since: float) -> list[tuple[float, str, int, str]]:
        """(at, probe, severity, code) of the multi-node results the node was in after ``since``."""
        return [(r[0], r[1], r[2], r[3]) for r in self._query(
            "SELECT at, probe, severity, code FROM judge_groups WHERE at > ?"
            " AND EXISTS (SELECT 1 FROM json_each(members) WHERE value = ?) ORDER BY at", (since, node))]

    def fleet_events(self, *, active_only: bool = False, limit: int = 100) -> list[dict[str, Any]]:
        where = "WHERE ended_at IS NULL" if active_only else ""
        out = [dict(r) for r in self._query(
            f"SELECT * FROM fleet_events {where} ORDER BY started_at DESC LIMIT ?", (limit,))]
        for e in out:
            e["series"] = json.loads(e["series"])
        return out

    def upsert_recommendation(
        self, *, node: str, probe: str, outcome: str, reason_code: str, text: str, evidence: dict[str, Any],
        at: float,
    ) -> bool:
        """Open or refresh the active recommendation for (node, probe); ``True`` when it is new.
        A refresh keeps ``since`` (when it was first recommended)."""
        with self._tx() as db:
            row = db.execute("SELECT id FROM recommendations WHERE node = ? AND probe = ? AND state = 'active'",
                             (node, probe)).fetchone()
            if row is None:
                db.execute(
                    "INSERT INTO recommendations (node, probe, outcome, reason_code, text, evidence, since,"
                    " updated_at, state) VALUES (?, ?, ?, ?, ?, ?, ?, ?, 'active')",
                    (node, probe, outcome, reason_code, text, json.dumps(evidence), at, at),
                )
                return True
            db.execute(
                "UPDATE recommendations SET outcome = ?, reason_code = ?, text = ?, evidence = ?, updated_at = ?"
                " WHERE id = ?", (outcome, reason_code, text, json.dumps(evidence), at, row[0]),
            )
            return False

    def close_recommendations(self, *, node: str, probe: str | None, state: str, reason: str, at: float) -> int:
        """Close the node's active recommendations (one probe, or all) as ``cleared``, ``withdrawn``
        (a fleet event explains them) or ``dismissed`` (an operator undrained the node)."""
        sql = ("UPDATE recommendations SET state = ?, closed_at = ?, close_reason = ?"
               " WHERE node = ? AND state = 'active'")
        params: list[Any] = [state, at, reason, node]
        if probe is not None:
            sql += " AND probe = ?"
            params.append(probe)
        with self._tx() as db:
            return int(db.execute(sql, params).rowcount)

    def note_recommendation(self, rec_id: int, *, refusal: str, escalated: bool) -> None:
        with self._tx() as db:
            db.execute("UPDATE recommendations SET last_refusal = ?, escalated = ? WHERE id = ?",
                       (refusal, int(escalated), rec_id))

    def recommendations(self, *, states: Sequence[str] = ("active",), node: str | None = None,
                        limit: int = 1000) -> list[RecommendationRow]:
        marks = ",".join("?" for _ in states)
        sql = f"SELECT * FROM recommendations WHERE state IN ({marks})"
        params: list[Any] = list(states)
        if node is not None:
            sql += " AND node = ?"
            params.append(node)
        rows = self._query(sql + " ORDER BY since DESC, id DESC LIMIT ?", [*params, limit])
        return [RecommendationRow(
            id=r["id"], node=r["node"], probe=r["probe"], outcome=r["outcome"], reason_code=r["reason_code"],
            text=r["text"], evidence=json.loads(r["evidence"]), since=r["since"], updated_at=r["updated_at"],
            state=r["state"], closed_at=r["closed_at"], close_reason=r["close_reason"],
            escalated=bool(r["escalated"]), last_refusal=r["last_refusal"]) for r in rows]

    def add_audit(self, *, at: float, actor: str, action: str, node: str | None, result: str, reason: str,
                  detail: dict[str, Any] | None = None) -> None:
        """One remediation action or refusal; also counts it in ``remediation_actions_total``."""
        with self._tx() as db:
            db.execute(
                "INSERT INTO remediation_audit (at, actor, action, node, result, reason, detail)"
                " VALUES (?, ?, ?, ?, ?, ?, ?)", (at, actor, action, node, result, reason, json.dumps(detail or {})),
            )
            self._bump(db, "remediation_actions_total", {"action": action, "result": result}, 1.0)

    def audit(self, *, limit: int = 100, node: str | None = None) -> list[AuditRow]:
        sql, params = "SELECT * FROM remediation_audit", []
        if node is not None:
            sql, params = sql + " WHERE node = ?", [node]
        rows = self._query(sql + " ORDER BY at DESC, id DESC LIMIT ?", [*params, limit])
        return [AuditRow(at=r["at"], actor=r["actor"], action=r["action"], node=r["node"], result=r["result"],
                         reason=r["reason"], detail=json.loads(r["detail"])) for r in rows]

    def add_drain(self, *, node: str, node_class: str, reason: str, actor: str, automatic: bool, at: float,
                  probes: Sequence[str] = ()) -> None:
        """A drain healthd made; ``probes``: those whose findings caused it (what must pass again)."""
        with self._tx() as db:
            db.execute("INSERT INTO drains (node, node_class, reason, actor, automatic, probes, drained_at)"
                       " VALUES (?, ?, ?, ?, ?, ?, ?)",
                       (node, node_class, reason, actor, int(automatic), json.dumps(sorted(probes)), at))

    def close_drain(self, node: str, *, at: float, by: str) -> bool:
        with self._tx() as db:
            return bool(db.execute("UPDATE drains SET undrained_at = ?, undrained_by = ? WHERE node = ?"
                                   " AND undrained_at IS NULL", (at, by, node)).rowcount)

    def drains(self, *, node: str | None = None, since: float = 0.0, open_only: bool = False) -> list[DrainRow]:
        clauses, params = ["drained_at >= ?"], [since]
        if node is not None:
            clauses.append("node = ?")
            params.append(node)  # type: ignore[arg-type]
        if open_only:
            clauses.append("undrained_at IS NULL")
        rows = self._query(f"SELECT * FROM drains WHERE {' AND '.join(clauses)} ORDER BY drained_at, id", params)
        return [DrainRow(node=r["node"], node_class=r["node_class"], reason=r["reason"], actor=r["actor"],
                         automatic=bool(r["automatic"]), drained_at=r["drained_at"], undrained_at=r["undrained_at"],
                         undrained_by=r["undrained_by"], probes=tuple(json.loads(r["probes"]))) for r in rows]

    def prune_judgement(self, older_than: float) -> int:
        """Retention for the judgement tables (the daemon's housekeeping): audit rows, closed
        recommendations, ended fleet events, closed drains and series not measured since
        ``older_than`` are deleted; open drains, active recommendations and events stay."""
        with self._tx() as db:
            deleted = 0
            for sql in (
                "DELETE FROM remediation_audit WHERE at < ?",
                "DELETE FROM recommendations WHERE state != 'active' AND closed_at < ?",
                "DELETE FROM fleet_events WHERE ended_at IS NOT NULL AND ended_at < ?",
                "DELETE FROM drains WHERE undrained_at IS NOT NULL AND undrained_at < ?",
                "DELETE FROM judge_series WHERE last_at < ?",
                "DELETE FROM judge_marks WHERE at < ?",
                "DELETE FROM judge_groups WHERE at < ?",
            ):
                deleted += db.execute(sql, (older_than,)).rowcount
        return deleted

    def remediation_state(self, key: str) -> Any:
        rows = self._query("SELECT value FROM remediation_state WHERE key = ?", (key,))
        return json.loads(rows[0][0]) if rows else None

    def set_remediation_state(self, key: str, value: Any) -> None:
        with self._tx() as db:
            db.execute("INSERT OR REPLACE INTO remediation_state (key, value) VALUES (?, ?)", (key, json.dumps(value)))

    # -- scaling sweep ----------------------------------------------------------------------
    _SWEEP_RUNS = """
        SELECT r.run_id, r.state, r.outcome, r.submitted_at, r.finished_at,
               COUNT(rn.node) AS size,
               (SELECT n.node_class FROM run_nodes x JOIN nodes n ON n.name = x.node
                 WHERE x.run_id = r.run_id ORDER BY x.node LIMIT 1) AS node_class
        FROM runs r JOIN run_nodes rn ON rn.run_id = r.run_id
        WHERE r.run_id LIKE 'sw%' GROUP BY r.run_id
    """

    def last_sweeps(self) -> dict[tuple[str, int], float]:
        """Per (node class, node count): when a sweep run was last submitted."""
        out: dict[tuple[str, int], float] = {}
        for r in self._query(self._SWEEP_RUNS):
            key = (r["node_class"] or "", int(r["size"]))
            out[key] = max(out.get(key, float("-inf")), r["submitted_at"])
        return out

    def sweeping_classes(self) -> set[str]:
        """Node classes with a sweep run in flight."""
        return {r["node_class"] or "" for r in self._query(self._SWEEP_RUNS) if r["state"] != "finished"}

    def scaling_table(self) -> list[tuple[str, int, float, MeasurementRow]]:
        """The newest passing sweep run per (node class, node count): (class, count, finished_at, measurement)
        for each of its group measurements."""
        newest: dict[tuple[str, int], tuple[float, str]] = {}
        for r in self._query(self._SWEEP_RUNS):
            if r["state"] == "finished" and r["outcome"] == "pass":
                key = (r["node_class"] or "", int(r["size"]))
                if key not in newest or newest[key][0] < r["finished_at"]:
                    newest[key] = (r["finished_at"], r["run_id"])
        table = []
        for (cls, size), (at, run_id) in sorted(newest.items()):
            for m in self.measurements(run_id=run_id):
                if m.node is None:
                    table.append((cls, size, at, m))
        return table


@dataclass(frozen=True)
class RecommendationRow:
    id: int
    node: str
    probe: str
    outcome: str
    reason_code: str
    text: str
    evidence: dict[str, Any]
    since: float
    updated_at: float
    state: str
    closed_at: float | None
    close_reason: str
    escalated: bool
    last_refusal: str


@dataclass(frozen=True)
class AuditRow:
    at: float
    actor: str
    action: str
    node: str | None
    result: str
    reason: str
    detail: dict[str, Any]


@dataclass(frozen=True)
class DrainRow:
    node: str
    node_class: str
    reason: str
    actor: str
    automatic: bool
    drained_at: float
    undrained_at: float | None
    undrained_by: str | None
    probes: tuple[str, ...] = ()

