"""The read side's current state: the newest value of every series (``latest``) and the newest run of every
(node, probe) (``latest_runs``), both kept in the transaction that finishes a run, so that the metrics and the
API read what is current without scanning the history. Every row carries the ``seq`` of its last change (a
``latest`` row's node too, in ``latest_nodes``): ``changes`` gives the rows changed since a ``ChangeCursor``."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from healthd.model import Outcome, RunKind, Verdict
from healthd.store.db import Database
from healthd.store.rows import JudgedSeries, LastRun, MeasurementRow, RunTiming

_CHUNK = 500
_OUTCOMES = {o.value: o for o in Outcome}


@lru_cache(maxsize=1 << 16)
def labels_of(text: str) -> dict[str, str]:
    """The labels of a stored canonical text, shared between the rows that have them (do not change it):
    a fleet repeats few label sets."""
    labels: dict[str, str] = json.loads(text)
    return labels


@dataclass(frozen=True)
class ChangeCursor:
    """Where ``changes`` stopped reading each table (its highest change mark)."""

    latest: int = 0
    runs: int = 0
    verdicts: int = 0
    series: int = 0


_MARKS = (
    ("latest", "SELECT COALESCE(MAX(seq), 0) FROM latest_nodes"),
    ("runs", "SELECT COALESCE(MAX(seq), 0) FROM latest_runs"),
    ("verdicts", "SELECT COALESCE(MAX(id), 0) FROM verdicts"),
    # INSERT OR REPLACE gives a replaced judge series a new rowid above every other one
    ("series", "SELECT COALESCE(MAX(rowid), 0) FROM judge_series"),
)


def _in(nodes: Sequence[str] | None, column: str = "node") -> Iterator[tuple[str, list[str]]]:
    """(SQL condition on ``column``, its parameters), in chunks SQLite takes; one unconditional pass for None."""
    if nodes is None:
        yield "1", []
        return
    for i in range(0, len(nodes), _CHUNK):
        part = list(nodes[i:i + _CHUNK])
        yield f"{column} IN ({','.join('?' * len(part))})", part


def _verdict(r: Sequence[Any]) -> Verdict:
    return Verdict(node=r[0], probe=r[1], outcome=_OUTCOMES[r[2]], reason=r[3], reason_code=r[4],
                   run_ids=tuple(json.loads(r[5])), evidence=json.loads(r[6]), at=r[7])


def _series_row(r: Sequence[Any]) -> JudgedSeries:
    """A judged series from (probe, name, node, labels, last_value, last_at, floor, baseline)."""
    return JudgedSeries(r[2], r[0], r[1], labels_of(r[3]), r[4], r[5], r[6], r[7])


def _measurement_rows(rows: Sequence[Sequence[Any]]) -> list[MeasurementRow]:
    """Rows of (probe, node, name, labels, run_id, value, at) as ``MeasurementRow``."""
    return [MeasurementRow(r[4], r[0], r[1], r[2], labels_of(r[3]), r[5], r[6]) for r in rows]


def _names(families: Collection[tuple[str, str]] | None) -> str:
    """The SQL condition on ``name`` that narrows a read to ``families`` (its parameters: their sorted names)."""
    if families is None:
        return ""
    return f" AND name IN ({','.join('?' * len({n for _, n in families}))})"


@dataclass(frozen=True)
class Changes:
    """What changed after a ``ChangeCursor`` (``LatestStore.changes``): rows as they are now."""

    latest: tuple[MeasurementRow, ...]
    runs: tuple[tuple[LastRun, RunTiming], ...]
    """The newest run of a (node, probe), and its timing (``gpus`` 0: the node's GPUs are the nodes table's)."""
    verdicts: tuple[Verdict, ...]
    """In the order they were saved: a later one replaces an earlier one of the same (node, probe)."""
    series: tuple[JudgedSeries, ...]

    def nodes(self) -> set[str]:
        """The nodes with a row here."""
        return ({m.node for m in self.latest if m.node is not None} | {lr.node for lr, _ in self.runs}
                | {v.node for v in self.verdicts} | {s.node for s in self.series})


@dataclass(frozen=True)
class FinishedLatest:
    """What ``latest_runs`` takes of a run just finished."""

    run_id: str
    probe: str
    outcome: Outcome
    reason: str
    submitted_at: float
    started_at: float
    finished_at: float
    duration_s: float
    checked: bool = False
    """A probe, re-probe or boundary check that reached a verdict on its nodes (``CHECK_KINDS``,
    ``CHECK_OUTCOMES``): it moves the (node, probe)'s ``last_judged_at`` on, what the coverage metrics count."""


CHECK_KINDS = frozenset({RunKind.PROBE.value, RunKind.REPROBE.value, RunKind.BOUNDARY.value})
CHECK_OUTCOMES = frozenset({Outcome.PASS, Outcome.DEGRADED, Outcome.FAIL})


@dataclass
class LatestValues:
    """The values of runs just finished, for ``latest``, in the order the runs finished: a column per field, not
    an object per value (a batch holds hundreds of thousands, and as tuples they keep the garbage collector busy)."""

    series: list[int] = field(default_factory=list)
    """The series id of the value's node."""
    value: list[float] = field(default_factory=list)
    at: list[float] = field(default_factory=list)
    run_id: list[str] = field(default_factory=list)
    nodes: set[str] = field(default_factory=set)
    """The nodes of the values (kept when the values are truncated: a node marked changed for nothing costs a
    reader of changes only a look)."""

    def truncate(self, size: int) -> None:
        for column in (self.series, self.value, self.at, self.run_id):
            del column[size:]


_LATEST = ("SELECT s.probe, s.node, s.name, s.labels, l.run_id, l.value, l.at FROM latest l"
           " JOIN series s ON s.id = l.series")


class LatestStore(Database):
    @staticmethod
    def _update_latest(db: sqlite3.Connection, finished: Sequence[FinishedLatest],
                       nodes_of: Mapping[str, Sequence[str]], values: LatestValues) -> None:
        """Bring ``latest_runs`` and ``latest`` up to date with the runs just finished (in their transaction;
        ``nodes_of``: their nodes by run id) and the ``values`` they measured, in the order they were finished:
        one sequence number per call, a few statements whatever the number of runs."""
        if not finished:
            return
        seq = db.execute("SELECT COALESCE(MAX(seq), 0) + 1 FROM latest_runs").fetchone()[0]
        judged = [f for f in finished if f.outcome is not Outcome.SKIPPED]
        # the newest run replaces the row's run; a pass, whatever its age, moves the last success on
        newer = "excluded.finished_at >= latest_runs.finished_at"
        passed = "excluded.last_success_at > COALESCE(latest_runs.last_success_at, 0)"
        checked = "excluded.last_judged_at > COALESCE(latest_runs.last_judged_at, 0)"
        db.executemany(
            "INSERT INTO latest_runs (node, probe, run_id, outcome, reason, submitted_at, started_at, finished_at,"
            " duration_s, last_success_at, last_judged_at, seq) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
            " ON CONFLICT (node, probe) DO UPDATE SET "
            + ", ".join(f"{c} = IIF({newer}, excluded.{c}, latest_runs.{c})" for c in (
                "run_id", "outcome", "reason", "submitted_at", "started_at", "finished_at", "duration_s"))
            + f", last_success_at = IIF({passed}, excluded.last_success_at, latest_runs.last_success_at),"
            f" last_judged_at = IIF({checked}, excluded.last_judged_at, latest_runs.last_judged_at),"
            f" seq = IIF({newer} OR {passed}, excluded.seq, latest_runs.seq)"
            f" WHERE {newer} OR {passed} OR {checked}",
            [(node, f.probe, f.run_id, f.outcome.value, f.reason, f.submitted_at, f.started_at, f.finished_at,
              f.duration_s, f.finished_at if f.outcome is Outcome.PASS else None,
              f.finished_at if f.checked else None, seq)
             for f in judged for node in nodes_of.get(f.run_id, ())],
        )
        newest: dict[int, int] = {}
        at = values.at
        for i, sid in enumerate(values.series):
            held = newest.get(sid)
            if held is None or at[held] <= at[i]:
                newest[sid] = i
        if not newest:
            return
        seq = db.execute("SELECT COALESCE(MAX(seq), 0) + 1 FROM latest_nodes").fetchone()[0]
        value, run_id = values.value, values.run_id
        # in key order: the upserts walk the table's B-tree once
        db.executemany(
            "INSERT INTO latest (series, value, at, run_id, seq) VALUES (?, ?, ?, ?, ?)"
            " ON CONFLICT (series) DO UPDATE SET value = excluded.value, at = excluded.at,"
            " run_id = excluded.run_id, seq = excluded.seq WHERE excluded.at >= latest.at",
            ((sid, value[i], at[i], run_id[i], seq) for sid, i in sorted(newest.items())),
        )
        db.executemany("INSERT INTO latest_nodes (node, seq) VALUES (?, ?) ON CONFLICT (node) DO UPDATE SET seq = ?",
                       [(node, seq, seq) for node in sorted(values.nodes)])

    def latest_measurements(self, nodes: Sequence[str] | None = None,
                            families: Collection[tuple[str, str]] | None = None) -> list[MeasurementRow]:
        """The newest value of every (probe, node, name, labels) series (of ``nodes``; of all with None; of the
        (probe, name) ``families`` only, when given).

        A measurement of a multi-node group (``node`` NULL) counts once for each node of its run.
        """
        rows: list[tuple[Any, ...]] = []
        for where, params in _in(nodes, "s.node"):
            rows += self._rows(f"{_LATEST} WHERE {where}{_names(families)}",
                               [*params, *sorted({n for _, n in families or ()})])
        if families is not None:
            rows = [r for r in rows if (r[0], r[2]) in families]
        rows.sort()
        return _measurement_rows(rows)

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

    def current_verdicts_of(self, nodes: Sequence[str] | None) -> list[Verdict]:
        """The current verdict of every probe of ``nodes`` (of every node with None; as ``current_verdicts``)."""
        out: list[Verdict] = []
        for where, params in _in(nodes):
            out += [_verdict(r)
                    for r in self._rows(
                        "SELECT node, probe, outcome, reason, reason_code, run_ids, evidence, at FROM verdicts"
                        " WHERE id IN (SELECT (SELECT v.id FROM verdicts v WHERE v.node = p.node AND v.probe = p.probe"
                        "  ORDER BY v.at DESC, v.id DESC LIMIT 1)"
                        f"  FROM (SELECT DISTINCT node, probe FROM verdicts WHERE {where}) p)", params)]
        out.sort(key=lambda v: (v.node, v.probe))
        return out

    def judge_series_of(self, nodes: Sequence[str],
                        families: Collection[tuple[str, str]] | None = None) -> list[JudgedSeries]:
        """The judged series of ``nodes`` (of the (probe, name) ``families`` only, when given) with their latest
        value, floor and baseline."""
        rows: list[tuple[Any, ...]] = []
        for where, params in _in(nodes):
            rows += self._rows("SELECT probe, name, node, labels, last_value, last_at, floor, baseline, spread"
                               f" FROM judge_series WHERE {where}{_names(families)}",
                               [*params, *sorted({n for _, n in families or ()})])
        if families is not None:
            rows = [r for r in rows if (r[0], r[1]) in families]
        rows.sort(key=lambda r: r[:4])
        return [_series_row(r) for r in rows]

    def node_summaries(self) -> list[tuple[str, str, str | None, str | None, int]]:
        """(name, state, node class, GPU type, GPUs) of every node, by name: what the metrics show of them."""
        return [(r[0], r[1], r[2], r[3], r[4]) for r in self._rows(
            "SELECT name, state, node_class, gpu_type, gpus FROM nodes ORDER BY name", [])]

    def in_flight(self) -> int:
        """Runs submitted and not finished."""
        return int(self._rows("SELECT COUNT(*) FROM runs WHERE state != 'finished'", [])[0][0])

    def node_names(self, *, after: str = "", limit: int = 100, state: str | None = None,
                   node_class: str | None = None, verdict: str | None = None) -> list[str]:
        """Up to ``limit`` names after ``after``, in order, of the nodes known (discovered, or with a run) in
        ``state`` and ``node_class`` whose current verdict for some probe is ``verdict`` (None: any)."""
        def has_verdict(column: str) -> str:
            return (f"EXISTS (SELECT 1 FROM (SELECT DISTINCT probe FROM verdicts v WHERE v.node = {column}) p"
                    f" WHERE (SELECT v.outcome FROM verdicts v WHERE v.node = {column} AND v.probe = p.probe"
                    " ORDER BY v.at DESC, v.id DESC LIMIT 1) = ?)")

        known = ["name > ?"]
        params: list[Any] = [after]
        for column, value in (("state", state), ("node_class", node_class)):
            if value is not None:
                known.append(f"{column} = ?")
                params.append(value)
        if verdict is not None:
            known.append(has_verdict("nodes.name"))
            params.append(verdict)
        # each branch walks its index in order and stops at ``limit``: a page costs what it returns
        sql = f"SELECT name FROM nodes WHERE {' AND '.join(known)} ORDER BY name LIMIT ?"
        params.append(limit)
        if state is None and node_class is None:
            ran = "r.node > ?" + (f" AND {has_verdict('r.node')}" if verdict is not None else "")
            sql = (f"SELECT name FROM ({sql}) UNION SELECT node FROM (SELECT DISTINCT r.node FROM latest_runs r"
                   f" WHERE {ran} ORDER BY r.node LIMIT ?)")
            params += [after, *([verdict] if verdict is not None else []), limit]
        return [r[0] for r in self._rows(f"SELECT name FROM ({sql}) ORDER BY name LIMIT ?", [*params, limit])]

    def changes(self, since: ChangeCursor,
                families: Collection[tuple[str, str]] | None = None) -> tuple[Changes, ChangeCursor]:
        """The rows of the current state written after ``since`` (every row for ``ChangeCursor()``), of the
        (probe, name) ``families`` only for measurements and judged series, and the cursor to pass next time.
        Raises ``LookupError`` when a table went back behind the cursor (rows renumbered): read everything
        again from ``ChangeCursor()``."""
        names = sorted({n for _, n in families or ()})
        with self._lock:
            marks = vars(self.change_marks())
            for key, high in marks.items():
                if high < getattr(since, key):
                    raise LookupError(f"{key} went back from {getattr(since, key)} to {high}")
            # from the nodes changed (CROSS JOIN keeps that order): latest has no index on its marks
            latest = self._rows("SELECT s.probe, s.node, s.name, s.labels, l.run_id, l.value, l.at FROM latest_nodes k"
                                " CROSS JOIN series s ON s.node = k.node CROSS JOIN latest l ON l.series = s.id"
                                f" WHERE k.seq > ? AND l.seq > ? AND l.seq <= ?{_names(families)}",
                                [since.latest, since.latest, marks["latest"], *names])
            runs = self._rows("SELECT node, probe, finished_at, outcome, reason, run_id, last_success_at,"
                              " submitted_at, started_at, duration_s FROM latest_runs WHERE seq > ? AND seq <= ?",
                              [since.runs, marks["runs"]])
            if since.verdicts == 0:
                verdicts = self.current_verdicts_of(None)
            else:
                verdicts = [_verdict(r) for r in self._rows(
                    "SELECT node, probe, outcome, reason, reason_code, run_ids, evidence, at FROM verdicts"
                    " WHERE id > ? AND id <= ? ORDER BY id", [since.verdicts, marks["verdicts"]])]
            series = self._rows("SELECT probe, name, node, labels, last_value, last_at, floor, baseline, spread"
                                f" FROM judge_series WHERE rowid > ? AND rowid <= ?{_names(families)}",
                                [since.series, marks["series"], *names])
        if families is not None:
            latest = [r for r in latest if (r[0], r[2]) in families]
            series = [r for r in series if (r[0], r[1]) in families]
        return Changes(
            latest=tuple(_measurement_rows(latest)),
            runs=tuple((LastRun(node=r[0], probe=r[1], last_run_at=r[2], last_outcome=_OUTCOMES[r[3]],
                                last_reason=r[4], last_run_id=r[5], last_success_at=r[6]),
                        RunTiming(node=r[0], probe=r[1], queue_wait_s=max(0.0, (r[8] or r[7]) - r[7]),
                                  duration_s=r[9] or 0.0, gpus=0)) for r in runs),
            verdicts=tuple(verdicts),
            series=tuple(_series_row(r) for r in series),
        ), ChangeCursor(**marks)

    def change_marks(self) -> ChangeCursor:
        """Where the current state's tables stand: a reader that reads every row after taking it (``shown_nodes``
        then the rows by node, to bound its memory) passes it to ``changes`` next time; what changed in between is
        read twice, never missed."""
        with self._lock:
            return ChangeCursor(**{key: int(self._db.execute(top).fetchone()[0]) for key, top in _MARKS})

    def shown_nodes(self) -> list[str]:
        """Every node with a row in the current state (what ``changes`` from ``ChangeCursor()`` covers) or in
        the nodes table, sorted."""
        return [r[0] for r in self._rows(
            "SELECT name FROM nodes UNION SELECT node FROM latest_nodes UNION SELECT node FROM latest_runs"
            " UNION SELECT node FROM judge_series UNION SELECT node FROM verdicts ORDER BY 1", [])]

    def _rows(self, sql: str, params: Sequence[Any]) -> list[tuple[Any, ...]]:
        with self._lock:
            return self._db.execute(sql, params).fetchall()
