"""Several processes opening a new store at once (the daemon starting while ``healthd status`` or a test reads
it): every migration is applied once, none fails on what another opener created (``index … already exists``,
seen in the alert end-to-end test)."""

from __future__ import annotations

import multiprocessing
import sqlite3
from pathlib import Path

from healthd.store.schema import SCHEMA_VERSION


def _open(path: str, start: multiprocessing.synchronize.Event, errors: multiprocessing.Queue[str]) -> None:
    from healthd.store import Store

    start.wait(10)
    try:
        Store(Path(path)).close()
    except Exception as exc:  # reported to the parent
        errors.put(f"{type(exc).__name__}: {exc}")


def test_openers_racing_on_a_new_store_apply_each_migration_once(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("fork")
    for attempt in range(4):
        path = tmp_path / f"race{attempt}" / "healthd.sqlite"
        start, errors = ctx.Event(), ctx.Queue()
        procs = [ctx.Process(target=_open, args=(str(path), start, errors)) for _ in range(6)]
        for p in procs:
            p.start()
        start.set()
        for p in procs:
            p.join(60)
        found = []
        while not errors.empty():
            found.append(errors.get())
        assert found == [], found
        assert [p.exitcode for p in procs] == [0] * len(procs)
        with sqlite3.connect(path) as db:
            assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
