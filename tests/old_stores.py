"""Stores as an older healthd left them, for the migration tests."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from healthd.store.schema import MIGRATIONS


def store_at(path: Path, version: int) -> sqlite3.Connection:
    """A new store at ``path`` with the first ``version`` migrations applied (the caller fills and commits it)."""
    db = sqlite3.connect(path)
    for number in range(version):
        db.executescript(MIGRATIONS[number])
    db.execute(f"PRAGMA user_version = {version}")
    return db
