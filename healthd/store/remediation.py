"""Remediation's records: recommendations, the audit trail, healthd's drains and the breaker state.

Remediation reads what it decides from in one call (``remediation_snapshot``) and writes what it
decided in one transaction (``apply_remediation``); the row-level writers are that same write path.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence
from typing import Any

from healthd.store.judgement import JudgementStore
from healthd.store.rows import (
    AuditAction,
    AuditEntry,
    AuditResult,
    AuditRow,
    BreakerState,
    CloseDrain,
    CloseRecommendations,
    DrainRow,
    NoteRecommendation,
    OpenDrain,
    OpenRepair,
    RecommendationRow,
    RemediationChanges,
    RemediationSnapshot,
    RemediationWrite,
    RepairRow,
    ReviseDrain,
    SetBreaker,
    SetRepair,
    UpsertRecommendation,
)

BREAKER_KEY = "breaker"

REMEDIATION_PRUNE = (
    "DELETE FROM remediation_audit WHERE at < ?",
    "DELETE FROM recommendations WHERE state != 'active' AND closed_at < ?",
    "DELETE FROM drains WHERE undrained_at IS NOT NULL AND undrained_at < ?",
    "DELETE FROM repairs WHERE ended_at IS NOT NULL AND ended_at < ?",
)
"""Retention (housekeeping): audit rows, closed recommendations and closed drains past the cut-off."""


class RemediationStore(JudgementStore):
    """Builds on the judgement aggregate: undrains read the judged results since a drain."""

    # -- remediation's one read and one write ------------------------------------------------------
    def remediation_snapshot(self, *, drains_since: float, marks: bool) -> RemediationSnapshot:
        """Active recommendations, open drains, drains since ``drains_since``, the breaker; with ``marks``,
        per open automatic drain the judged results since it and the node's newest audit row."""
        with self._lock:
            open_drains = tuple(self.drains(open_only=True))
            own = [d for d in open_drains if d.automatic and d.probes] if marks else []
            last_audit = {d.node: rows[0] for d in own if (rows := self.audit(limit=1, node=d.node))}
            return RemediationSnapshot(
                recommendations=tuple(self.recommendations()),
                open_drains=open_drains,
                recent_drains=tuple(self.drains(since=drains_since)),
                breaker=self.breaker_state(),
                marks={(d.node, d.drained_at): tuple(sorted(self.marks_since(d.node, d.checks_from)
                                                            + self.group_marks_since(d.node, d.checks_from)))
                       for d in own},
                last_audit=last_audit,
                repairs=tuple(self.repairs(since=drains_since, open_too=True)),
            )

    def apply_remediation(self, changes: RemediationChanges) -> None:
        """Every write of ``changes``, in order, in one transaction."""
        with self._tx() as db:
            for write in changes.writes:
                self._write(db, write, changes.at)

    def _write(self, db: sqlite3.Connection, w: RemediationWrite, at: float) -> bool:
        match w:
            case UpsertRecommendation():
                return self._upsert_recommendation(db, w, at)
            case CloseRecommendations():
                sql = ("UPDATE recommendations SET state = ?, closed_at = ?, close_reason = ?"
                       " WHERE node = ? AND state = 'active'")
                params: list[Any] = [w.state, at, w.reason, w.node]
                if w.probe is not None:
                    sql += " AND probe = ?"
                    params.append(w.probe)
                return bool(db.execute(sql, params).rowcount)
            case NoteRecommendation():
                return bool(db.execute(
                    "UPDATE recommendations SET last_refusal = ?, escalated = ? WHERE node = ? AND probe = ?"
                    " AND state = 'active'", (w.refusal, int(w.escalated), w.node, w.probe)).rowcount)
            case AuditEntry():
                db.execute("INSERT INTO remediation_audit (at, actor, action, node, result, reason, detail)"
                           " VALUES (?, ?, ?, ?, ?, ?, ?)",
                           (at, w.actor, w.action, w.node, w.result, w.reason, json.dumps(w.detail)))
                self._bump(db, "remediation_actions_total", {"action": w.action, "result": w.result}, 1.0)
                return True
            case OpenDrain():
                self._insert_drain(db, w, at, None)
                return True
            case CloseDrain():
                closed = bool(db.execute("UPDATE drains SET undrained_at = ?, undrained_by = ? WHERE node = ?"
                                         " AND undrained_at IS NULL", (at, w.by, w.node)).rowcount)
                if not closed and w.unrecorded is not None:
                    self._insert_drain(db, w.unrecorded, at, (at, w.by))
                return closed
            case ReviseDrain():
                return bool(db.execute("UPDATE drains SET reason = ?, probes = ?, check_since = ? WHERE node = ?"
                                       " AND undrained_at IS NULL", (w.reason, json.dumps(sorted(w.probes)), at,
                                                                     w.node)).rowcount)
            case OpenRepair():
                db.execute("INSERT INTO repairs (node, kind, reason_code, probes, state, started_at, reason)"
                           " VALUES (?, ?, ?, ?, 'rebooting', ?, ?)",
                           (w.node, w.kind, w.reason_code, json.dumps(list(w.probes)), at, w.reason))
                return True
            case SetRepair():
                column = "validating_at" if w.state == "validating" else "ended_at"
                return bool(db.execute(f"UPDATE repairs SET state = ?, reason = ?, {column} = ? WHERE node = ?"
                                       " AND ended_at IS NULL", (w.state, w.reason, at, w.node)).rowcount)
            case SetBreaker():
                s = w.state
                self._set_state(db, BREAKER_KEY, {"open": s.open, "opened_at": s.opened_at, "reason": s.reason,
                                                  "closed_at": s.closed_at})
                return True

    @staticmethod
    def _upsert_recommendation(db: sqlite3.Connection, w: UpsertRecommendation, at: float) -> bool:
        row = db.execute("SELECT id FROM recommendations WHERE node = ? AND probe = ? AND state = 'active'",
                         (w.node, w.probe)).fetchone()
        if row is None:
            db.execute(
                "INSERT INTO recommendations (node, probe, outcome, reason_code, text, evidence, since,"
                " updated_at, state) VALUES (?, ?, ?, ?, ?, ?, ?, ?, 'active')",
                (w.node, w.probe, w.outcome, w.reason_code, w.text, json.dumps(w.evidence), at, at),
            )
            return True
        db.execute(
            "UPDATE recommendations SET outcome = ?, reason_code = ?, text = ?, evidence = ?, updated_at = ?"
            " WHERE id = ?", (w.outcome, w.reason_code, w.text, json.dumps(w.evidence), at, row[0]),
        )
        return False

    @staticmethod
    def _insert_drain(db: sqlite3.Connection, d: OpenDrain, at: float, undone: tuple[float, str] | None) -> None:
        db.execute("INSERT INTO drains (node, node_class, reason, actor, automatic, probes, drained_at, undrained_at,"
                   " undrained_by) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                   (d.node, d.node_class, d.reason, d.actor, int(d.automatic), json.dumps(sorted(d.probes)), at,
                    *(undone or (None, None))))

    @staticmethod
    def _set_state(db: sqlite3.Connection, key: str, value: Any) -> None:
        db.execute("INSERT OR REPLACE INTO remediation_state (key, value) VALUES (?, ?)", (key, json.dumps(value)))

    def _write_one(self, write: RemediationWrite, at: float) -> bool:
        with self._tx() as db:
            return self._write(db, write, at)

    # -- row-level writers (tests and fixtures; remediation itself uses ``apply_remediation``) --------
    def upsert_recommendation(
        self, *, node: str, probe: str, outcome: str, reason_code: str, text: str, evidence: dict[str, Any],
        at: float,
    ) -> bool:
        """``True`` when the recommendation is new."""
        return self._write_one(UpsertRecommendation(node, probe, outcome, reason_code, text, evidence), at)

    def add_audit(self, *, at: float, actor: str, action: AuditAction, node: str | None, result: AuditResult,
                  reason: str, detail: dict[str, Any] | None = None) -> None:
        self._write_one(AuditEntry(action, node, result, reason, actor, detail or {}), at)

    def add_drain(self, *, node: str, node_class: str, reason: str, actor: str, automatic: bool, at: float,
                  probes: Sequence[str] = ()) -> None:
        self._write_one(OpenDrain(node, node_class, reason, actor, automatic, tuple(probes)), at)

    def close_drain(self, node: str, *, at: float, by: str) -> bool:
        return self._write_one(CloseDrain(node, by), at)

    def set_remediation_state(self, key: str, value: Any) -> None:
        with self._tx() as db:
            self._set_state(db, key, value)

    # -- reads -----------------------------------------------------------------------------------
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

    def audit(self, *, limit: int = 100, node: str | None = None) -> list[AuditRow]:
        sql, params = "SELECT * FROM remediation_audit", []
        if node is not None:
            sql, params = sql + " WHERE node = ?", [node]
        rows = self._query(sql + " ORDER BY at DESC, id DESC LIMIT ?", [*params, limit])
        return [AuditRow(at=r["at"], actor=r["actor"], action=r["action"], node=r["node"], result=r["result"],
                         reason=r["reason"], detail=json.loads(r["detail"])) for r in rows]

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
                         undrained_by=r["undrained_by"], probes=tuple(json.loads(r["probes"])),
                         check_since=r["check_since"]) for r in rows]

    def repairs(self, *, node: str | None = None, since: float = 0.0, open_too: bool = False) -> list[RepairRow]:
        """Repairs started since ``since`` (``open_too``: and every open one), oldest first."""
        where = "(started_at >= ?" + (" OR ended_at IS NULL)" if open_too else ")")
        params: list[Any] = [since]
        if node is not None:
            where += " AND node = ?"
            params.append(node)
        rows = self._query(f"SELECT * FROM repairs WHERE {where} ORDER BY started_at, id", params)
        return [RepairRow(id=r["id"], node=r["node"], kind=r["kind"], reason_code=r["reason_code"],
                          probes=tuple(json.loads(r["probes"])), state=r["state"], started_at=r["started_at"],
                          validating_at=r["validating_at"], ended_at=r["ended_at"], reason=r["reason"])
                for r in rows]

    def remediation_state(self, key: str) -> Any:
        rows = self._query("SELECT value FROM remediation_state WHERE key = ?", (key,))
        return json.loads(rows[0][0]) if rows else None

    def breaker_state(self) -> BreakerState:
        raw = self.remediation_state(BREAKER_KEY)
        if not isinstance(raw, dict):
            return BreakerState(False)
        return BreakerState(bool(raw.get("open")), raw.get("opened_at"), str(raw.get("reason", "")),
                            raw.get("closed_at"))
