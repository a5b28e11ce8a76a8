"""The series dictionary's ids in memory: a run's end looks up hundreds of thousands of values' series, and a
known one costs no read."""

from __future__ import annotations

import json
import sqlite3
from collections import defaultdict
from collections.abc import Iterable
from functools import lru_cache

from healthd.store.rows import canonical_items

SERIES_CACHE = 500_000
"""Series ids kept in memory, about 85 bytes each (the cache starts over when full): a 10,000-node fleet has
some 180,000."""


@lru_cache(maxsize=1 << 16)
def label_text(items: tuple[tuple[str, str], ...]) -> str:
    """``canonical_labels`` of label items in any order (a parser gives each family's labels in one order)."""
    return canonical_items(tuple(sorted(items)))


class SeriesIds:
    """Ids by (probe, node) group, then (name, canonical label text). A group is read whole from the store the first
    time it is wanted, so a name and labels missing from a group held here are a new series. Cleared when the
    transaction that added series rolls back."""

    def __init__(self, limit: int = SERIES_CACHE) -> None:
        self._limit = limit
        self._groups: dict[tuple[str, str], dict[tuple[str, str], int]] = {}
        self._families: dict[tuple[str, str], tuple[str, str]] = {}
        self._size = 0

    def __len__(self) -> int:
        return self._size

    def clear(self) -> None:
        self._groups.clear()
        self._families.clear()
        self._size = 0

    def _family(self, name: str, labels: str) -> tuple[str, str]:
        """One shared key per (name, labels): a fleet repeats them on every node."""
        key = (name, labels)
        return self._families.setdefault(key, key)

    def load(self, db: sqlite3.Connection, groups: Iterable[tuple[str, str]]) -> None:
        """Read the (probe, node) ``groups`` not held yet: one statement per probe."""
        if self._size >= self._limit:
            self.clear()
        missing: dict[str, list[str]] = defaultdict(list)
        for group in groups:
            if group not in self._groups:
                self._groups[group] = {}
                missing[group[0]].append(group[1])
        families = self._families
        for probe, nodes in missing.items():
            node: str | None = None
            ids: dict[tuple[str, str], int] = {}
            for row in db.execute("SELECT node, name, labels, id FROM series WHERE probe = ?"
                                  " AND node IN (SELECT value FROM json_each(?))", (probe, json.dumps(nodes))):
                if row[0] != node:
                    node = row[0]
                    ids = self._groups[(probe, row[0])]
                family = (row[1], row[2])
                ids[families.setdefault(family, family)] = row[3]
                self._size += 1

    def group(self, db: sqlite3.Connection, probe: str, node: str) -> dict[tuple[str, str], int]:
        """The ids of the (probe, node) series by (name, labels), read when not held (do not change it: ``add``)."""
        group = self._groups.get((probe, node))
        if group is None:
            self.load(db, ((probe, node),))
            group = self._groups[(probe, node)]
        return group

    def id(self, db: sqlite3.Connection, probe: str, node: str, name: str, labels: str) -> int:
        """The id of the series (``node`` '' for a value of a multi-node group), added to the store when new."""
        sid = self.group(db, probe, node).get((name, labels))
        return self.add(db, probe, node, name, labels) if sid is None else sid

    def add(self, db: sqlite3.Connection, probe: str, node: str, name: str, labels: str) -> int:
        """The id of a series its group here does not have: added to the store (or read, where another process
        added it since the group was read)."""
        params = (probe, node, name, labels)
        row = db.execute("INSERT INTO series (probe, node, name, labels) VALUES (?, ?, ?, ?)"
                         " ON CONFLICT DO NOTHING RETURNING id", params).fetchone()
        if row is None:
            row = db.execute("SELECT id FROM series WHERE probe = ? AND node = ? AND name = ? AND labels = ?",
                             params).fetchone()
        sid = int(row[0])
        self.group(db, probe, node)[self._family(name, labels)] = sid
        self._size += 1
        return sid
