"""The store's connection: one SQLite connection in WAL mode, guarded by a lock, and its transactions.

Every write is one transaction (``_tx``), so a SIGKILL leaves either the whole change or none of it.
The aggregates (``runs``, ``nodes``, ``judgement``, ``remediation``, ``sweeps``) build on this base.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from healthd.errors import StoreError
from healthd.store.rows import canonical_labels
from healthd.store.schema import migrate


class Database:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.RLock()
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None, timeout=30)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA foreign_keys=ON")
            self._db.execute("PRAGMA synchronous=NORMAL")
            migrate(self._db, path)
            self._db.execute("BEGIN IMMEDIATE")
            self._db.execute("ROLLBACK")
        except (sqlite3.Error, OSError) as exc:
            raise StoreError(f"cannot open the state store {path}: {exc}") from None

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

    # -- counters (bumped inside the transaction of what they count) -----------------------------
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

    def counters(self) -> list[tuple[str, dict[str, str], float]]:
        return [
            (r["name"], json.loads(r["labels"]), r["value"])
            for r in self._query("SELECT * FROM counters ORDER BY name, labels")
        ]

