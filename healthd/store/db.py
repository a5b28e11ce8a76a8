"""The store's connection: one SQLite connection in WAL mode, guarded by a lock, and its transactions.

Every write is one transaction (``_tx``), so a SIGKILL leaves either the whole change or none of it.
The aggregates (``runs``, ``nodes``, ``judgement``, ``remediation``, ``sweeps``) build on this base.
"""

from __future__ import annotations

import gc
import json
import os
import sqlite3
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any
from urllib.parse import quote

from healthd.errors import StoreError, StoreUnavailable
from healthd.model import Node
from healthd.store.rows import canonical_labels
from healthd.store.schema import SCHEMA_VERSION, migrate
from healthd.store.series import SeriesIds

BUSY_TIMEOUT_S = 30.0
"""How long a write waits for another process's write lock before it fails."""
BUSY_POLL_S = 0.05
"""SQLite's own busy wait per statement, spent holding the store lock: short."""


def _busy(exc: sqlite3.Error) -> bool:
    return getattr(exc, "sqlite_errorcode", None) in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)


def _store_error(path: Path, exc: sqlite3.Error) -> StoreError:
    cls = StoreUnavailable if isinstance(exc, sqlite3.OperationalError) else StoreError
    return cls(f"cannot write the state store {path}: {exc}")


@contextmanager
def collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector held off while a big batch is written or read (a store write, a full read
    of the metrics exposition): the batch's allocations would set off collections, and a full one walks every
    object of the process (0.4 s of a 2 s batch of 10,000 results, measured); nothing the batch makes forms a
    cycle. Overlapping pauses from two threads leave the collector as it was before the first."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


class Database:
    def __init__(self, path: Path, *, read_only: bool = False) -> None:
        """Open (and create, and migrate) the store at ``path``; ``read_only``: open an existing store
        with SQLite's ``mode=ro``, never migrating it (one at another schema version is refused) and
        never writing it (a write fails with ``StoreError``)."""
        self.path = path
        self._lock = threading.RLock()
        self._commits = 0
        self._series_ids = SeriesIds()
        self._attempts: dict[tuple[str, str], float] | None = None
        self._partners: dict[tuple[str, str], frozenset[str]] | None = None
        self._nodes_written: dict[str, tuple[Node, float]] = {}
        try:
            if read_only:
                self._open_read_only(path)
            else:
                path.parent.mkdir(parents=True, exist_ok=True)
                self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None,
                                           timeout=BUSY_TIMEOUT_S)
                self._set_up(path)
            self._db.execute(f"PRAGMA busy_timeout = {int(BUSY_POLL_S * 1000)}")
        except (sqlite3.Error, OSError) as exc:
            raise StoreError(f"cannot open the state store {path}: {exc}") from None

    def _open_read_only(self, path: Path) -> None:
        """``mode=ro``. A reader that may not write the store's directory cannot create the ``-shm`` file
        SQLite needs for a WAL store, so where no ``-wal`` file exists (no writer has the store open, the
        last one checkpointed it) the file is read as ``immutable``: complete as it is, no locks."""
        if not path.is_file():
            raise StoreError(f"no state store at {path}")
        uri = f"file:{quote(str(path.absolute()))}?mode=ro"
        try:
            self._db = sqlite3.connect(uri, uri=True, check_same_thread=False, isolation_level=None,
                                       timeout=BUSY_TIMEOUT_S)
            self._check_version(path)
        except sqlite3.OperationalError:
            if Path(f"{path}-wal").exists() or os.access(path.parent, os.W_OK):
                raise
            with suppress(sqlite3.Error):
                self._db.close()
            self._db = sqlite3.connect(uri + "&immutable=1", uri=True, check_same_thread=False,
                                       isolation_level=None, timeout=BUSY_TIMEOUT_S)
            self._check_version(path)

    def _check_version(self, path: Path) -> None:
        version = int(self._db.execute("PRAGMA user_version").fetchone()[0])
        if version != SCHEMA_VERSION:
            newer = "newer than" if version > SCHEMA_VERSION else "older than"
            self._db.close()
            raise sqlite3.OperationalError(
                f"schema version {version}, {newer} this healthd's ({SCHEMA_VERSION}); read-only commands never "
                "migrate a store: the service brings it forward when it starts with this healthd")

    def _set_up(self, path: Path) -> None:
        """WAL mode and the migrations, retried while another opener holds the new file: switching a
        new database to WAL can be refused as busy without SQLite's busy handler waiting (seen with six
        processes opening one new store at once on a loaded machine)."""
        deadline = time.monotonic() + BUSY_TIMEOUT_S
        delay = 0.01
        while True:
            try:
                self._db.execute("PRAGMA journal_mode=WAL")
                self._db.execute("PRAGMA foreign_keys=ON")
                self._db.execute("PRAGMA synchronous=NORMAL")
                migrate(self._db, path)
                self._db.execute("BEGIN IMMEDIATE")
                self._db.execute("ROLLBACK")
                return
            except sqlite3.Error as exc:
                if not _busy(exc) or time.monotonic() >= deadline:
                    raise
                if self._db.in_transaction:
                    self._db.execute("ROLLBACK")
                time.sleep(delay)
                delay = min(delay * 2, 0.5)

    def data_version(self) -> tuple[int, int]:
        """Differs after any commit, by this object or by another process (SQLite's ``data_version``)."""
        with self._lock:
            return self._commits, int(self._db.execute("PRAGMA data_version").fetchone()[0])

    @property
    def schema_version(self) -> int:
        with self._lock:
            return int(self._db.execute("PRAGMA user_version").fetchone()[0])

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        """One write transaction. SQLite's errors leave as ``StoreError`` naming their real cause
        (``StoreUnavailable`` for a full disk, a lock, an I/O error), never as the failed ROLLBACK of a
        transaction SQLite already ended; ``sqlite3.IntegrityError`` (a constraint the caller may
        expect) passes unchanged."""
        self._begin()
        try:
            try:
                yield self._db
                self._db.execute("COMMIT")
                self._commits += 1
            except BaseException as exc:
                self._rollback()
                self._series_ids.clear()
                if isinstance(exc, sqlite3.Error) and not isinstance(exc, sqlite3.IntegrityError):
                    raise _store_error(self.path, exc) from exc
                raise
        finally:
            self._lock.release()

    def _begin(self) -> None:
        """``BEGIN IMMEDIATE`` with the lock held on success. While another process holds the write
        lock the wait happens outside ``self._lock``, so readers of this process are not held up."""
        deadline = time.monotonic() + BUSY_TIMEOUT_S
        delay = 0.005
        while True:
            self._lock.acquire()
            try:
                self._db.execute("BEGIN IMMEDIATE")
                return
            except sqlite3.Error as exc:
                self._lock.release()
                if not _busy(exc) or time.monotonic() >= deadline:
                    raise _store_error(self.path, exc) from exc
            time.sleep(delay)
            delay = min(delay * 2, 0.2)

    def _rollback(self) -> None:
        if self._db.in_transaction:
            with suppress(sqlite3.Error):
                self._db.execute("ROLLBACK")

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

