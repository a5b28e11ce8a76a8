"""The judge's saved state: verdicts, judged series, marks, group records, fleet events and
pending re-probes, written once per evaluation and read back at start-up."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any

from healthd.model import Outcome, Verdict
from healthd.store.db import Database
from healthd.store.rows import canonical_labels

JUDGEMENT_PRUNE = (
    "DELETE FROM fleet_events WHERE ended_at IS NOT NULL AND ended_at < ?",
    "DELETE FROM judge_series WHERE last_at < ?",
    "DELETE FROM judge_marks WHERE at < ?",
    "DELETE FROM judge_groups WHERE at < ?",
)
"""Retention (housekeeping): ended fleet events and state not refreshed since the cut-off."""


class JudgementStore(Database):
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
                "SELECT r.run_id, r.probe, r.kind, r.outcome, r.reason, r.finished_at AS at,"
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

