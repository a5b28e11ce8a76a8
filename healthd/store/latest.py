"""The read side's current state: the newest value of every series (``latest``) and the newest run of every
(node, probe) (``latest_runs``), both kept in the transaction that finishes a run, so that the metrics and the
API read what is current without scanning the history. Every row carries the ``seq`` of its last change:
``changed_nodes`` names the nodes whose state changed since a ``ChangeCursor``."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from healthd.model import Outcome, ProbeResult, Verdict
from healthd.store.db import Database
from healthd.store.rows import LastRun, MeasurementRow, RunTiming, canonical_labels

_CHUNK = 500


@dataclass(frozen=True)
class ChangeCursor:
    """Where ``changed_nodes`` stopped reading each table (its highest change mark)."""

    latest: int = 0
    runs: int = 0
    verdicts: int = 0
    series: int = 0


_CHANGES = (
    ("latest", "SELECT node, seq FROM latest WHERE seq > ?", "SELECT COALESCE(MAX(seq), 0) FROM latest"),
    ("runs", "SELECT node, seq FROM latest_runs WHERE seq > ?", "SELECT COALESCE(MAX(seq), 0) FROM latest_runs"),
    ("verdicts", "SELECT node, id FROM verdicts WHERE id > ?", "SELECT COALESCE(MAX(id), 0) FROM verdicts"),
    # INSERT OR REPLACE gives a replaced judge series a new rowid above every other one
    ("series", "SELECT node, rowid FROM judge_series WHERE rowid > ?",
     "SELECT COALESCE(MAX(rowid), 0) FROM judge_series"),
)


def _in(nodes: Sequence[str] | None, column: str = "node") -> Iterator[tuple[str, list[str]]]:
    """(SQL condition on ``column``, its parameters), in chunks SQLite takes; one unconditional pass for None."""
    if nodes is None:
        yield "1", []
        return
    for i in range(0, len(nodes), _CHUNK):
        part = list(nodes[i:i + _CHUNK])
        yield f"{column} IN ({','.join('?' * len(part))})", part


class LatestStore(Database):
    @staticmethod
    def _update_latest(db: sqlite3.Connection, run_id: str, probe: str, outcome: Outcome,
                       result: ProbeResult | None) -> None:
        """Bring ``latest`` and ``latest_runs`` up to date with the run just finished (in its transaction)."""
        seq = db.execute("SELECT COALESCE(MAX(seq), 0) + 1 FROM latest_runs").fetchone()[0]
        if outcome is not Outcome.SKIPPED:
            db.execute(
                "INSERT INTO latest_runs (node, probe, run_id, outcome, reason, submitted_at, started_at, finished_at,"
                " duration_s, last_success_at, seq)"
                " SELECT n.node, r.probe, r.run_id, r.outcome, r.reason, r.submitted_at, r.started_at, r.finished_at,"
                " r.duration_s, CASE WHEN r.outcome = 'pass' THEN r.finished_at END, ?"
                " FROM runs r JOIN run_nodes n ON n.run_id = r.run_id WHERE r.run_id = ?"
                " ON CONFLICT (node, probe) DO UPDATE SET run_id = excluded.run_id, outcome = excluded.outcome,"
                " reason = excluded.reason, submitted_at = excluded.submitted_at, started_at = excluded.started_at,"
                " finished_at = excluded.finished_at, duration_s = excluded.duration_s, seq = excluded.seq"
                " WHERE excluded.finished_at >= latest_runs.finished_at",
                (seq, run_id),
            )
            if outcome is Outcome.PASS:
                db.execute(
                    "UPDATE latest_runs SET last_success_at = (SELECT finished_at FROM runs WHERE run_id = ?), seq = ?"
                    " WHERE probe = ? AND node IN (SELECT node FROM run_nodes WHERE run_id = ?)"
                    " AND COALESCE(last_success_at, 0) < (SELECT finished_at FROM runs WHERE run_id = ?)",
                    (run_id, seq, probe, run_id, run_id),
                )
        if result is None or not result.measurements:
            return
        run_nodes = [r[0] for r in db.execute("SELECT node FROM run_nodes WHERE run_id = ?", (run_id,))]
        at = db.execute("SELECT finished_at FROM runs WHERE run_id = ?", (run_id,)).fetchone()[0]
        rows: dict[tuple[str, str, str], float] = {}
        for m in result.measurements:
            labels = canonical_labels(m.labels)
            for node in ([m.node] if m.node is not None else run_nodes):
                rows[(node, m.name, labels)] = m.value
        seq = db.execute("SELECT COALESCE(MAX(seq), 0) + 1 FROM latest").fetchone()[0]
        db.executemany(
            "INSERT INTO latest (node, probe, name, labels, value, at, run_id, seq) VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
            " ON CONFLICT (node, probe, name, labels) DO UPDATE SET value = excluded.value, at = excluded.at,"
            " run_id = excluded.run_id, seq = excluded.seq WHERE excluded.at >= latest.at",
            [(node, probe, name, labels, value, at, run_id, seq) for (node, name, labels), value in rows.items()],
        )

    def latest_measurements(self, nodes: Sequence[str] | None = None) -> list[MeasurementRow]:
        """The newest value of every (probe, node, name, labels) series (of ``nodes``; of all with None).

        A measurement of a multi-node group (``node`` NULL) counts once for each node of its run.
        """
        out: list[MeasurementRow] = []
        for where, params in _in(nodes):
            out += [MeasurementRow(run_id=r[0], probe=r[1], node=r[2], name=r[3], labels=json.loads(r[4]),
                                   value=r[5], at=r[6])
                    for r in self._rows("SELECT run_id, probe, node, name, labels, value, at FROM latest"
                                        f" WHERE {where}", params)]
        out.sort(key=lambda m: (m.probe, m.node or "", m.name, canonical_labels(m.labels)))
        return out

    def last_runs(self, nodes: Sequence[str] | None = None) -> list[LastRun]:
        """Per (node, probe): the newest finished run that was not skipped, and when one last passed."""
        out: list[LastRun] = []
        for where, params in _in(nodes):
            out += [LastRun(node=r[0], probe=r[1], last_run_at=r[2], last_outcome=Outcome(r[3]), last_reason=r[4],
                            last_run_id=r[5], last_success_at=r[6])
                    for r in self._rows("SELECT node, probe, finished_at, outcome, reason, run_id, last_success_at"
                                        f" FROM latest_runs WHERE {where}", params)]
        out.sort(key=lambda r: (r.node, r.probe))
        return out

    def last_run_timings(self, nodes: Sequence[str] | None = None) -> list[RunTiming]:
        """Per (node, probe), the newest finished run (the one ``last_runs`` reports): how long it
        waited between submission and start, how long it ran, and the GPUs of the node it held."""
        out: list[RunTiming] = []
        for where, params in _in(nodes, "l.node"):
            out += [RunTiming(node=r[0], probe=r[1], queue_wait_s=max(0.0, (r[3] or r[2]) - r[2]),
                              duration_s=r[4] or 0.0, gpus=r[5])
                    for r in self._rows(
                        "SELECT l.node, l.probe, l.submitted_at, l.started_at, l.duration_s, COALESCE(n.gpus, 0)"
                        f" FROM latest_runs l LEFT JOIN nodes n ON n.name = l.node WHERE {where}", params)]
        out.sort(key=lambda t: (t.node, t.probe))
        return out

    def current_verdicts_of(self, nodes: Sequence[str]) -> list[Verdict]:
        """The current verdict of every probe of ``nodes`` (as ``current_verdicts``, without a scan of all)."""
        out: list[Verdict] = []
        for where, params in _in(nodes):
            out += [Verdict(node=r[0], probe=r[1], outcome=Outcome(r[2]), reason=r[3], reason_code=r[4],
                            run_ids=tuple(json.loads(r[5])), evidence=json.loads(r[6]), at=r[7])
                    for r in self._rows(
                        "SELECT node, probe, outcome, reason, reason_code, run_ids, evidence, at FROM verdicts"
                        " WHERE id IN (SELECT (SELECT v.id FROM verdicts v WHERE v.node = p.node AND v.probe = p.probe"
                        "  ORDER BY v.at DESC, v.id DESC LIMIT 1)"
                        f"  FROM (SELECT DISTINCT node, probe FROM verdicts WHERE {where}) p)", params)]
        out.sort(key=lambda v: (v.node, v.probe))
        return out

    def judge_series_of(self, nodes: Sequence[str]) -> list[dict[str, Any]]:
        """The judged series of ``nodes`` with their latest value, floor and baseline."""
        out: list[dict[str, Any]] = []
        for where, params in _in(nodes):
            out += [{"node": r[0], "probe": r[1], "name": r[2], "labels": json.loads(r[3]), "last_value": r[4],
                     "last_at": r[5], "floor": r[6], "baseline": r[7], "spread": r[8]}
                    for r in self._rows("SELECT node, probe, name, labels, last_value, last_at, floor, baseline,"
                                        f" spread FROM judge_series WHERE {where}", params)]
        out.sort(key=lambda s: (s["probe"], s["name"], s["node"], canonical_labels(s["labels"])))
        return out

    def changed_nodes(self, since: ChangeCursor) -> tuple[set[str], ChangeCursor]:
        """The nodes whose measurements, runs, verdicts or judged series changed after ``since``, and the
        cursor to pass next time. Raises ``LookupError`` when a table went back behind the cursor (rows
        renumbered): read everything again."""
        changed: set[str] = set()
        marks: dict[str, int] = {}
        with self._lock:
            for key, query, top in _CHANGES:
                mark = getattr(since, key)
                high = int(self._db.execute(top).fetchone()[0])
                if high < mark:
                    raise LookupError(f"{key} went back from {mark} to {high}")
                if high > mark:
                    changed.update(r[0] for r in self._db.execute(query, (mark,)))
                marks[key] = high
        return changed, ChangeCursor(**marks)

    def _rows(self, sql: str, params: Sequence[Any]) -> list[tuple[Any, ...]]:
        with self._lock:
            return self._db.execute(sql, params).fetchall()
