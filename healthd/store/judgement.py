"""The judge's saved state: verdicts, judged series, marks, group records, fleet events and
pending re-probes, written once per evaluation and read back at start-up. The mapping between the
judge's types (``healthd.judge.model``) and the tables lives here and nowhere else."""

from __future__ import annotations

import json
import sqlite3
import sys
from array import array
from collections.abc import Iterable, Mapping
from sys import intern
from typing import Any, cast, get_args

from healthd.errors import StoreError
from healthd.judge.model import (
    CheckInput,
    Finding,
    FleetEvent,
    GroupRecord,
    JudgeOutput,
    JudgeState,
    LinkFinding,
    Mark,
    MeasurementInput,
    ReasonCode,
    Request,
    RequestKind,
    RunInput,
    SeriesKey,
    SeriesState,
    Severity,
)
from healthd.model import Outcome, RunKind, Verdict
from healthd.store.db import Database
from healthd.store.rows import canonical_labels

JUDGEMENT_PRUNE = (
    "DELETE FROM fleet_events WHERE ended_at IS NOT NULL AND ended_at < ?",
    "DELETE FROM link_findings WHERE ended_at IS NOT NULL AND ended_at < ?",
    "DELETE FROM judge_series WHERE last_at < ?",
    "DELETE FROM judge_marks WHERE at < ?",
    "DELETE FROM judge_groups WHERE at < ?",
)
"""Retention (housekeeping): ended fleet events and link findings, state not refreshed since the cut-off."""

_INSERT_VERDICT = ("INSERT INTO verdicts (node, probe, outcome, reason, reason_code, run_ids, evidence, at)"
                   " VALUES (?, ?, ?, ?, ?, ?, ?, ?)")
_LABELS_JSON: dict[SeriesKey, str] = {}


def _labels_json(key: SeriesKey) -> str:
    """The canonical JSON of a series' labels, computed once per series (every evaluation writes them)."""
    text = _LABELS_JSON.get(key)
    if text is None:
        if len(_LABELS_JSON) > 200_000:
            _LABELS_JSON.clear()
        text = _LABELS_JSON[key] = canonical_labels(dict(key.labels))
    return text


def _verdict_row(v: Verdict) -> tuple[object, ...]:
    return (v.node, v.probe, v.outcome.value, v.reason, v.reason_code, json.dumps(list(v.run_ids)),
            json.dumps(v.evidence), v.at)


def _findings_json(findings: Iterable[Finding]) -> str:
    return json.dumps([
        {"code": f.code.value, "severity": int(f.severity), "probe": f.key.probe, "name": f.key.name,
         "labels": dict(f.key.labels), "value": f.value, "reference": f.reference, "threshold": f.threshold,
         "detail": f.detail, "score": f.score, "event_proof": f.event_proof}
        | ({"gpu_uuid": f.gpu_uuid} if f.gpu_uuid else {}) | ({"switch_proof": True} if f.switch_proof else {})
        for f in findings])


def _findings(text: str) -> tuple[Finding, ...]:
    if text == "[]":
        return ()
    return tuple(
        Finding(ReasonCode(d["code"]), Severity(d["severity"]), SeriesKey.of(d["probe"], d["name"], d["labels"]),
                float(d["value"]), float(d["reference"]), float(d["threshold"]), d["detail"],
                float(d["score"]) if d.get("score") is not None else None, bool(d.get("event_proof", False)),
                d.get("gpu_uuid"), bool(d.get("switch_proof", False)))
        for d in json.loads(text))


_SERIES_COLUMNS = "node, probe, name, labels, accepted, last_value, last_at, last_run_id, floor, baseline, spread"
_BIG_ENDIAN = sys.byteorder == "big"


def _window_blob(st: SeriesState) -> bytes:
    """``judge_series.accepted``: the window's (at, value) pairs as little-endian doubles (16 bytes a pair). Rows
    written before (a JSON list of pairs in the same column) are still read."""
    numbers = st.pack()[5:]
    if _BIG_ENDIAN:
        numbers.byteswap()
    return numbers.tobytes()


def _window(saved: bytes | str) -> array[float]:
    if isinstance(saved, str):
        return array("d", (float(x) for pair in json.loads(saved) for x in pair))
    numbers = array("d")
    numbers.frombytes(saved)
    if _BIG_ENDIAN:
        numbers.byteswap()
    return numbers


class _SeriesReader:
    """Saved series rows → ``SeriesState``, sharing what a fleet repeats: keys (a few hundred at most), node names
    and run ids (a run's series share one; interned, as are the marks' and verdicts')."""

    def __init__(self) -> None:
        self.keys: dict[tuple[str, str, str], SeriesKey] = {}

    def __call__(self, r: tuple[Any, ...]) -> SeriesState:
        node, probe, name, labels, accepted, last_value, last_at, last_run_id, floor, baseline, spread = r
        key = self.keys.get((probe, name, labels))
        if key is None:
            key = self.keys[(probe, name, labels)] = SeriesKey.of(probe, name, json.loads(labels))
        nan = float("nan")
        window = _window(accepted)
        if len(window) % 2:
            raise StoreError(f"judge_series: a broken window of {len(window)} numbers for {node} {key.describe()}")
        numbers = array("d", (nan if last_value is None else last_value, last_at, nan if floor is None else floor,
                              nan if baseline is None else baseline, nan if spread is None else spread)) + window
        return SeriesState.packed(intern(node), key, intern(last_run_id), numbers)


_SEVERITY = {int(s): s for s in Severity}
_CODE = {c.value: c for c in ReasonCode}


def _mark(r: sqlite3.Row) -> Mark:
    return Mark(intern(r["run_id"]), intern(r["node"]), intern(r["probe"]), r["at"], _SEVERITY[r["severity"]],
                _CODE[r["code"]], intern(r["text"]), bool(r["regular"]), bool(r["event_proof"]),
                _findings(r["findings"]), bool(r["raw_flagged"]))


def _group(r: sqlite3.Row) -> GroupRecord:
    return GroupRecord(intern(r["run_id"]), intern(r["probe"]), r["at"], tuple(map(intern, json.loads(r["members"]))),
                       _SEVERITY[r["severity"]], _CODE[r["code"]], intern(r["text"]),
                       tuple(map(intern, json.loads(r["suspects"]))), bool(r["event_proof"]), _findings(r["findings"]))


def _event(r: sqlite3.Row) -> FleetEvent:
    return FleetEvent(r["node_class"], r["probe"], r["started_at"], r["ended_at"], r["flagged"], r["sampled"],
                      tuple(json.loads(r["series"])), r["text"], r["switch"], r["level"], tuple(json.loads(r["nodes"])),
                      tuple(json.loads(r["held"])), r["cause"], r["series_key"], r["scope"])


def _pending(r: sqlite3.Row) -> tuple[str, Request]:
    kind = r["kind"]
    if kind not in get_args(RequestKind):
        raise StoreError(f"unknown re-probe kind {kind!r} in judge_requests")
    return r["node"], Request(cast(RequestKind, kind), r["probe"], tuple(json.loads(r["nodes"])),
                              r["requested_at"], r["reason"])


INGEST_WATERMARK = "judge.ingest_watermark"
"""Kept in ``remediation_state`` (a key-value table) so that no schema change is needed."""


def _run_input(r: sqlite3.Row, measurements: Mapping[str, list[MeasurementInput]],
               failed: Mapping[str, list[CheckInput]]) -> RunInput:
    return RunInput(r["run_id"], r["probe"], tuple(sorted(json.loads(r["nodes"]))), Outcome(r["outcome"]),
                    r["reason"], r["at"], tuple(measurements.get(r["run_id"], ())),
                    tuple(failed.get(r["run_id"], ())), RunKind(r["kind"]), image=r["container_image"])


class JudgementStore(Database):
    def put_verdicts(self, verdicts: Iterable[Verdict]) -> None:
        with self._tx() as db:
            db.executemany(_INSERT_VERDICT, [_verdict_row(v) for v in verdicts])

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
                node=intern(r["node"]),
                probe=intern(r["probe"]),
                outcome=Outcome(r["outcome"]),
                reason=intern(r["reason"]),
                reason_code=intern(r["reason_code"]),
                run_ids=tuple(map(intern, json.loads(r["run_ids"]))),
                evidence=json.loads(r["evidence"]),
                at=r["at"],
            )
            for r in rows
        ]

    def save_judgement(self, output: JudgeOutput, *, keep_s: float | None = None, judged: Iterable[str] = (),
                       ingest_watermark: int | None = None) -> None:
        """One evaluation of the judge in one transaction: changed verdicts and series, marks, group
        records, fleet events that started or ended, re-probes asked for and answered; marks and group
        records older than ``keep_s`` before the evaluation are dropped; the runs ``judged`` leave
        ``unjudged_runs``; ``ingest_watermark``: the last ingested run judged (``ingested_runs``), saved
        with the judgement it led to."""
        with self._tx() as db:
            db.executemany("UPDATE runs SET judged = 1 WHERE run_id = ?", [(r,) for r in judged])
            if ingest_watermark is not None:
                db.execute("INSERT OR REPLACE INTO remediation_state (key, value) VALUES (?, ?)",
                           (INGEST_WATERMARK, json.dumps(ingest_watermark)))
            db.executemany(_INSERT_VERDICT, [_verdict_row(v) for v in output.verdicts])
            db.executemany(
                "INSERT OR REPLACE INTO judge_series (node, probe, name, labels, accepted, last_value, last_at,"
                " last_run_id, floor, baseline, spread) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [(s.node, s.key.probe, s.key.name, _labels_json(s.key), _window_blob(s), s.last_value,
                  s.last_at, s.last_run_id, s.floor, s.baseline, s.spread) for s in output.series],
            )
            db.executemany(
                "INSERT OR REPLACE INTO judge_marks (run_id, node, probe, at, severity, code, text, regular,"
                " event_proof, raw_flagged, findings) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [(m.run_id, m.node, m.probe, m.at, int(m.severity), m.code.value, m.text, int(m.regular),
                  int(m.event_proof), int(m.raw_flagged), _findings_json(m.findings)) for m in output.marks],
            )
            db.executemany(
                "INSERT OR REPLACE INTO judge_groups (run_id, probe, at, members, suspects, severity, code, text,"
                " event_proof, findings) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [(g.run_id, g.probe, g.at, json.dumps(list(g.members)), json.dumps(list(g.suspects)),
                  int(g.severity), g.code.value, g.text, int(g.event_proof), _findings_json(g.findings))
                 for g in output.groups],
            )
            for e in (*output.fleet_events, *output.switch_findings):
                if e.ended_at is None:
                    db.execute(
                        "INSERT INTO fleet_events (node_class, probe, started_at, flagged, sampled, series, text,"
                        " switch, level, nodes, held, cause, series_key, scope)"
                        " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
                        " ON CONFLICT (node_class, probe, switch, cause, series_key) WHERE ended_at IS NULL"
                        " DO UPDATE SET flagged = excluded.flagged, sampled = excluded.sampled, text = excluded.text,"
                        " level = excluded.level, nodes = excluded.nodes, held = excluded.held,"
                        " scope = excluded.scope",
                        (e.node_class, e.probe, e.started_at, e.flagged, e.sampled, json.dumps(list(e.series)),
                         e.text, e.switch, e.level, json.dumps(list(e.nodes)), json.dumps(list(e.held)), e.cause,
                         e.key, e.scope),
                    )
                else:
                    db.execute(
                        "UPDATE fleet_events SET ended_at = ?, text = ? WHERE probe = ? AND switch = ? AND cause = ?"
                        " AND series_key = ? AND ended_at IS NULL AND (switch != '' OR node_class = ?)",
                        (e.ended_at, e.text, e.probe, e.switch, e.cause, e.key, e.node_class),
                    )
            for f in output.link_findings:
                if f.active:
                    db.execute(
                        "INSERT INTO link_findings (probe, a, b, started_at, run_ids, series, layer, value, reference,"
                        " link, text) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
                        " ON CONFLICT (probe, a, b) WHERE ended_at IS NULL DO UPDATE SET run_ids = excluded.run_ids,"
                        " series = excluded.series, layer = excluded.layer, value = excluded.value,"
                        " reference = excluded.reference, link = excluded.link, text = excluded.text",
                        (f.probe, f.a, f.b, f.started_at, json.dumps(list(f.run_ids)), f.series, f.layer, f.value,
                         f.reference, f.link, f.text))
                else:
                    db.execute("UPDATE link_findings SET ended_at = ?, text = ? WHERE probe = ? AND a = ? AND b = ?"
                               " AND ended_at IS NULL", (f.ended_at, f.text, f.probe, f.a, f.b))
            db.executemany("DELETE FROM judge_requests WHERE node = ? AND probe = ?", list(output.satisfied))
            db.executemany(
                "INSERT OR REPLACE INTO judge_requests (node, probe, kind, nodes, requested_at, reason)"
                " VALUES (?, ?, ?, ?, ?, ?)",
                [(n, r.probe, r.kind, json.dumps(list(r.nodes)), r.requested_at, r.reason)
                 for r in output.requests for n in r.nodes],
            )
            db.executemany(
                "INSERT OR REPLACE INTO judge_flag_rates (node_class, probe, grouped, flagged, judged)"
                " VALUES (?, ?, ?, ?, ?)",
                [(c, p, int(g), f, j) for (c, p, g), (f, j) in output.flag_rates.items()])
            db.executemany("DELETE FROM judge_error_streaks WHERE node = ? AND probe = ?",
                           [k for k, n in output.error_streaks.items() if n <= 0])
            db.executemany("INSERT OR REPLACE INTO judge_error_streaks (node, probe, streak) VALUES (?, ?, ?)",
                           [(*k, n) for k, n in output.error_streaks.items() if n > 0])
            if keep_s is not None:
                db.execute("DELETE FROM judge_marks WHERE at < ?", (output.at - keep_s,))
                db.execute("DELETE FROM judge_groups WHERE at < ?", (output.at - keep_s,))

    def load_judgement(self, *, since: float) -> JudgeState:
        """What ``Judge.restore`` needs: every series, marks and group records since ``since``,
        active fleet events, pending re-probes, current verdicts, undrain times, chance-flag counters and
        error streaks."""
        with self._lock:
            return JudgeState(
                series=tuple(map(_SeriesReader(), self._db.execute(f"SELECT {_SERIES_COLUMNS} FROM judge_series"))),
                marks=tuple(_mark(r) for r in self._query(
                    "SELECT * FROM judge_marks WHERE at >= ? ORDER BY at", (since,))),
                groups=tuple(_group(r) for r in self._query(
                    "SELECT * FROM judge_groups WHERE at >= ? ORDER BY at", (since,))),
                events=tuple(_event(r) for r in self._query("SELECT * FROM fleet_events WHERE ended_at IS NULL")),
                pending=tuple(_pending(r) for r in self._query("SELECT * FROM judge_requests")),
                verdicts=tuple(self.current_verdicts()),
                resets=tuple(self.judge_resets().items()),
                flag_rates=tuple((r[0], r[1], bool(r[2]), r[3], r[4]) for r in self._query(
                    "SELECT node_class, probe, grouped, flagged, judged FROM judge_flag_rates")),
                error_streaks=tuple((r[0], r[1], r[2]) for r in self._query(
                    "SELECT node, probe, streak FROM judge_error_streaks")),
                links=tuple(self.link_findings(active_only=True, limit=100_000)),
            )

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

    def judge_history(self, *, since: float = 0.0, until: float = float("inf")) -> list[RunInput]:
        """Finished runs in [since, until] by finish time, with nodes, measurements and failed checks, as
        the judge takes them (replay's input)."""
        return [run for _, run in self._run_inputs(
            "r.state = 'finished' AND r.finished_at >= ? AND r.finished_at <= ?", "r.finished_at, r.run_id",
            (since, until if until != float("inf") else 1e300))]

    def unjudged_runs(self) -> list[RunInput]:
        """Finished runs closed for judgement whose judgement was never saved (the daemon stopped or the
        store failed in between), oldest first, as the judge takes them."""
        return [run for _, run in self._run_inputs("r.state = 'finished' AND r.judged = 0",
                                                   "r.finished_at, r.run_id", ())]

    def ingest_watermark(self) -> int | None:
        """The store position (``runs`` rowid) of the last ingested run the daemon has judged; ``None``
        before the daemon first looked."""
        rows = self._query("SELECT value FROM remediation_state WHERE key = ?", (INGEST_WATERMARK,))
        return int(json.loads(rows[0]["value"])) if rows else None

    def ingested_runs(self, *, after: int, limit: int = 500) -> list[tuple[int, RunInput]]:
        """Finished ingested runs stored after position ``after``, in the order they were stored, with
        their position (``healthd ingest`` may store a file of last week now: the position, not the
        finish time, says what is new)."""
        return self._run_inputs("r.kind = 'ingest' AND r.state = 'finished' AND r.rowid > ?", "r.rowid LIMIT ?",
                                (after, limit))

    def judged_images(self) -> dict[tuple[str, str], str]:
        """Per (node, probe): the container image of its newest judged run that recorded one (what
        ``Judge.images`` held when the previous daemon stopped)."""
        rows = self._query(
            "SELECT n.node, r.probe, r.container_image, MAX(r.finished_at) FROM runs r"
            " JOIN run_nodes n ON n.run_id = r.run_id"
            " WHERE r.state = 'finished' AND r.judged = 1 AND r.container_image IS NOT NULL"
            " GROUP BY n.node, r.probe")
        return {(str(r[0]), str(r[1])): str(r[2]) for r in rows}

    def _run_inputs(self, where: str, order: str, params: tuple[object, ...]) -> list[tuple[int, RunInput]]:
        """(store position, run as the judge takes it) of the runs ``r`` matching ``where``, in ``order``."""
        chosen = f"SELECT r.run_id FROM runs r WHERE {where} ORDER BY {order}"
        measurements: dict[str, list[MeasurementInput]] = {}
        failed: dict[str, list[CheckInput]] = {}
        with self._lock:
            runs = self._query(
                "SELECT r.rowid AS pos, r.run_id, r.probe, r.kind, r.outcome, r.reason, r.finished_at AS at,"
                " r.container_image,"
                " (SELECT json_group_array(node) FROM run_nodes n WHERE n.run_id = r.run_id) AS nodes"
                f" FROM runs r WHERE {where} ORDER BY {order}", params)
            for m in self._query(f"SELECT m.run_id, m.node, m.name, m.labels, m.value FROM measurements m"
                                 f" WHERE m.run_id IN ({chosen}) ORDER BY m.id", params):
                measurements.setdefault(m["run_id"], []).append(
                    MeasurementInput(m["name"], m["value"], json.loads(m["labels"]), m["node"]))
            for c in self._query(f"SELECT c.* FROM checks c WHERE c.ok = 0 AND c.run_id IN ({chosen})", params):
                failed.setdefault(c["run_id"], []).append(CheckInput(c["name"], c["detail"], c["node"], c["gpu"]))
        return [(int(r["pos"]), _run_input(r, measurements, failed)) for r in runs]

    def last_ingest_position(self) -> int:
        rows = self._query("SELECT COALESCE(MAX(rowid), 0) AS pos FROM runs WHERE kind = 'ingest'")
        return int(rows[0]["pos"])

    def marks_since(self, node: str, since: float) -> list[tuple[float, str, int, str]]:
        """(at, probe, severity, code) of the node's judged results after ``since``, oldest first."""
        return [(r[0], r[1], r[2], r[3]) for r in self._query(
            "SELECT at, probe, severity, code FROM judge_marks WHERE node = ? AND at > ? ORDER BY at", (node, since))]

    def group_marks_since(self, node: str, since: float) -> list[tuple[float, str, int, str]]:
        """(at, probe, severity, code) of the multi-node results the node was in after ``since``."""
        return [(r[0], r[1], r[2], r[3]) for r in self._query(
            "SELECT at, probe, severity, code FROM judge_groups WHERE at > ?"
            " AND EXISTS (SELECT 1 FROM json_each(members) WHERE value = ?) ORDER BY at", (since, node))]

    def fleet_events(self, *, active_only: bool = False, limit: int = 100,
                     switches: bool = False) -> list[dict[str, Any]]:
        """Class-wide fleet events, newest first (``switches``: the switch findings instead)."""
        where = "WHERE switch != ''" if switches else "WHERE switch = ''"
        if active_only:
            where += " AND ended_at IS NULL"
        out = [dict(r) for r in self._query(
            f"SELECT * FROM fleet_events {where} ORDER BY started_at DESC LIMIT ?", (limit,))]
        for e in out:
            for key in ("series", "nodes", "held"):
                e[key] = json.loads(e[key])
            if not switches:
                for key in ("switch", "level", "nodes", "held"):
                    del e[key]
        return out

    def link_findings(self, *, active_only: bool = False, limit: int = 100) -> list[LinkFinding]:
        """Link findings (``healthd.judge.links``), newest first (``active_only``: the live ones)."""
        where = "WHERE ended_at IS NULL" if active_only else ""
        return [LinkFinding(r["probe"], r["a"], r["b"], r["started_at"], tuple(json.loads(r["run_ids"])), r["series"],
                            r["layer"], r["value"], r["reference"], r["link"], r["text"], r["ended_at"])
                for r in self._query(f"SELECT * FROM link_findings {where} ORDER BY started_at DESC, id DESC LIMIT ?",
                                     (limit,))]

    def switch_findings(self, *, active_only: bool = False, limit: int = 100) -> list[dict[str, Any]]:
        """Switch findings (``healthd.judge.switches``), newest first."""
        return self.fleet_events(active_only=active_only, limit=limit, switches=True)

