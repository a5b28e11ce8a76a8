"""On-demand probe requests: written by ``healthd probe NAME --node N``, settled by the daemon."""

from __future__ import annotations

from collections.abc import Sequence

from healthd.store.db import Database
from healthd.store.rows import ProbeRequestRow, ProbeRequestState


class RequestsStore(Database):
    def add_probe_requests(self, probe: str, nodes: Sequence[str], *, at: float, by: str) -> list[int]:
        with self._tx() as db:
            return [int(db.execute("INSERT INTO probe_requests (probe, node, requested_at, requested_by)"
                                   " VALUES (?, ?, ?, ?)", (probe, node, at, by)).lastrowid or 0)
                    for node in nodes]

    def probe_requests(self, ids: Sequence[int] | None = None) -> list[ProbeRequestRow]:
        """The requests ``ids``, else the pending ones, oldest first."""
        if ids is None:
            rows = self._query("SELECT * FROM probe_requests WHERE state = 'pending' ORDER BY id")
        else:
            marks = ",".join("?" * len(ids))
            rows = self._query(f"SELECT * FROM probe_requests WHERE id IN ({marks}) ORDER BY id", list(ids))
        return [ProbeRequestRow(id=r["id"], probe=r["probe"], node=r["node"], requested_at=r["requested_at"],
                                requested_by=r["requested_by"], state=r["state"], seen_at=r["seen_at"],
                                settled_at=r["settled_at"], run_id=r["run_id"], detail=r["detail"]) for r in rows]

    def see_probe_requests(self, ids: Sequence[int], at: float) -> None:
        """The daemon has read these pending requests (and must wait for their nodes)."""
        with self._tx() as db:
            db.executemany("UPDATE probe_requests SET seen_at = ? WHERE id = ? AND state = 'pending'",
                           [(at, i) for i in ids])

    def settle_probe_request(self, request_id: int, state: ProbeRequestState, *, at: float,
                             run_id: str | None = None, detail: str = "") -> bool:
        """Close a pending request; ``False`` when it was no longer pending."""
        with self._tx() as db:
            return db.execute(
                "UPDATE probe_requests SET state = ?, settled_at = ?, seen_at = COALESCE(seen_at, ?), run_id = ?,"
                " detail = ? WHERE id = ? AND state = 'pending'",
                (state, at, at, run_id, detail, request_id),
            ).rowcount == 1

    def prune_probe_requests(self, older_than: float) -> int:
        """Delete settled requests older than ``older_than`` (housekeeping)."""
        with self._tx() as db:
            return int(db.execute("DELETE FROM probe_requests WHERE state != 'pending' AND requested_at < ?",
                                  (older_than,)).rowcount)

    def run_judged(self, run_id: str) -> bool:
        """Whether the run has finished and its judgement is saved."""
        rows = self._query("SELECT 1 FROM runs WHERE run_id = ? AND state = 'finished' AND judged = 1", (run_id,))
        return bool(rows)
