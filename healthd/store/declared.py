"""Events an operator declared on a node class (``healthd event start/end``), read by the daemon each tick
and handed to the judge (``healthd.judge.sources.declared``)."""

from __future__ import annotations

from healthd.judge.model import Declaration
from healthd.store.db import Database


class DeclaredStore(Database):
    def declare_event(self, node_class: str, reason: str, *, at: float, by: str) -> bool:
        """Start a declared event on ``node_class``; ``False`` when one is already in force there."""
        with self._tx() as db:
            if db.execute("SELECT 1 FROM declared_events WHERE node_class = ? AND ended_at IS NULL",
                          (node_class,)).fetchone():
                return False
            db.execute("INSERT INTO declared_events (node_class, reason, started_at, started_by) VALUES (?, ?, ?, ?)",
                       (node_class, reason, at, by))
            return True

    def end_declared_event(self, node_class: str, *, at: float, by: str) -> bool:
        """End the declared event in force on ``node_class``; ``False`` when there was none."""
        with self._tx() as db:
            return db.execute("UPDATE declared_events SET ended_at = ?, ended_by = ? WHERE node_class = ?"
                              " AND ended_at IS NULL", (at, by, node_class)).rowcount == 1

    def declared_events(self) -> list[Declaration]:
        """The declared events in force, by class."""
        return [Declaration(r["node_class"], r["reason"], r["started_at"], r["started_by"]) for r in self._query(
            "SELECT node_class, reason, started_at, started_by FROM declared_events WHERE ended_at IS NULL"
            " ORDER BY node_class")]
