"""Remediation's records: recommendations, the audit trail, healthd's drains and the breaker state."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from healthd.store.db import Database
from healthd.store.rows import AuditRow, DrainRow, RecommendationRow

REMEDIATION_PRUNE = (
    "DELETE FROM remediation_audit WHERE at < ?",
    "DELETE FROM recommendations WHERE state != 'active' AND closed_at < ?",
    "DELETE FROM drains WHERE undrained_at IS NOT NULL AND undrained_at < ?",
)
"""Retention (housekeeping): audit rows, closed recommendations and closed drains past the cut-off."""


class RemediationStore(Database):
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

    def remediation_state(self, key: str) -> Any:
        rows = self._query("SELECT value FROM remediation_state WHERE key = ?", (key,))
        return json.loads(rows[0][0]) if rows else None

    def set_remediation_state(self, key: str, value: Any) -> None:
        with self._tx() as db:
            db.execute("INSERT OR REPLACE INTO remediation_state (key, value) VALUES (?, ?)", (key, json.dumps(value)))

