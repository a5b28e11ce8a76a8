from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from healthd.errors import StoreError
from healthd.model import Node, Outcome, RunKind, Verdict
from healthd.store import Store
from healthd.store.schema import MIGRATIONS, SCHEMA_VERSION
from probes.result import Check, Measurement, ProbeResult


def result(run_id: str, value: float, *, at: float = 1000.0, node: str | None = "n1") -> ProbeResult:
    return ProbeResult(
        probe="nccl", run_id=run_id, outcome=Outcome.PASS, started_at=at - 10, finished_at=at, nodes=["n1", "n2"],
        measurements=[Measurement(name="busbw_bytes_per_second", value=value, node=node,
                                  labels={"collective": "all_reduce", "size_bytes": "1024"}, per_rank=[1.0, 2.0])],
        checks=[Check(name="nccl.wrong", ok=True, detail="0 wrong elements")],
    )


def add(store: Store, run_id: str, nodes: tuple[str, ...] = ("n1",), at: float = 990.0, probe: str = "nccl") -> None:
    store.add_run(run_id=run_id, probe=probe, nodes=nodes, backend="local", job_id=None, submitted_at=at,
                  result_path=None)


def test_fresh_store_is_at_the_latest_schema(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.sqlite")
    assert store.schema_version == SCHEMA_VERSION == len(MIGRATIONS)
    mode = sqlite3.connect(tmp_path / "s.sqlite").execute("PRAGMA journal_mode").fetchone()[0]
    assert mode == "wal"


def test_migrates_an_older_file_forward(tmp_path: Path) -> None:
    path = tmp_path / "old.sqlite"
    sqlite3.connect(path).close()  # version 0: an empty file
    store = Store(path)
    assert store.schema_version == SCHEMA_VERSION
    tables = {r[0] for r in sqlite3.connect(path).execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert {"runs", "run_nodes", "series", "samples", "rollups", "attempts", "checks", "verdicts", "nodes",
            "counters"} <= tables


def test_refuses_a_newer_schema(tmp_path: Path) -> None:
    path = tmp_path / "new.sqlite"
    db = sqlite3.connect(path)
    db.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    db.close()
    with pytest.raises(StoreError, match="newer than this healthd"):
        Store(path)


def test_unwritable_file_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "dir-not-file"
    path.mkdir()
    with pytest.raises(StoreError, match=f"cannot open the state store {path}"):
        Store(path)


def test_finish_is_idempotent_and_counts_once(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.sqlite")
    add(store, "r1")
    assert store.finish_run("r1", outcome=Outcome.PASS, reason="", finished_at=1000.0, result=result("r1", 5e9))
    assert not store.finish_run("r1", outcome=Outcome.PASS, reason="", finished_at=1000.0, result=result("r1", 5e9))
    assert len(store.measurements(run_id="r1")) == 1
    assert len(store.checks("r1")) == 1
    assert store.counters() == [
        ("probe_gpu_seconds_total", {"probe": "nccl"}, 0.0),  # n1 is not in the nodes table: no GPUs known
        ("probe_runs_total", {"outcome": "pass", "probe": "nccl"}, 1.0),
        ("probe_seconds_total", {"probe": "nccl"}, 10.0),
    ]
    run = store.run("r1")
    assert run is not None and run.state == "finished" and run.outcome is Outcome.PASS and run.duration_s == 10.0


def test_finish_unknown_run_raises(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="no run 'zz'"):
        Store(tmp_path / "s.sqlite").finish_run("zz", outcome=Outcome.ERROR, reason="", finished_at=1.0)


def test_last_runs_and_success_skip_skipped(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.sqlite")
    add(store, "a", at=100)
    store.finish_run("a", outcome=Outcome.PASS, reason="", finished_at=110)
    add(store, "b", at=200)
    store.finish_run("b", outcome=Outcome.ERROR, reason="boom", finished_at=210)
    add(store, "c", at=300)
    store.finish_run("c", outcome=Outcome.SKIPPED, reason="pending", finished_at=310)
    (last,) = store.last_runs()
    assert (last.node, last.probe, last.last_outcome, last.last_reason) == ("n1", "nccl", Outcome.ERROR, "boom")
    assert last.last_run_at == 210 and last.last_success_at == 110 and last.last_run_id == "b"
    assert store.last_attempts() == {("n1", "nccl"): 300}


def test_latest_measurement_per_series_and_group_results_count_for_each_node(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.sqlite")
    add(store, "old")
    store.finish_run("old", outcome=Outcome.PASS, reason="", finished_at=1000, result=result("old", 1e9, at=1000))
    add(store, "new")
    store.finish_run("new", outcome=Outcome.PASS, reason="", finished_at=2000, result=result("new", 2e9, at=2000))
    add(store, "pair", nodes=("n1", "n2"))
    store.finish_run("pair", outcome=Outcome.PASS, reason="", finished_at=3000,
                     result=result("pair", 3e9, at=3000, node=None))
    latest = store.latest_measurements()
    assert [(m.node, m.value, m.run_id) for m in latest] == [("n1", 3e9, "pair"), ("n2", 3e9, "pair")]
    assert len(store.measurements()) == 3


def test_verdicts_latest_per_node_probe(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.sqlite")
    store.put_verdicts([Verdict("n1", "gemm", Outcome.PASS, at=1.0), Verdict("n1", "gemm", Outcome.FAIL, "slow",
                                                                             "probe_failed", ("r",), {"v": 1.0}, 2.0)])
    (v,) = store.current_verdicts()
    assert v.outcome is Outcome.FAIL and v.reason_code == "probe_failed" and v.evidence == {"v": 1.0}
    assert v.run_ids == ("r",)


def test_nodes_upsert_roundtrip(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.sqlite")
    node = Node("gpu01", "idle", frozenset({"DRAIN"}), ("batch",), 8, "h100", ("ib",), "healthd: x",
                node_class="h100x8")
    store.upsert_nodes([node], 5.0)
    store.upsert_nodes([Node("gpu01", "mixed", gpus=8)], 6.0)
    (back,) = store.nodes()
    assert back.state == "mixed" and back.flags == frozenset() and back.gpus == 8
    assert store.nodes(seen_since=7.0) == []


def test_prune_keeps_unfinished_runs_counters_and_newest_verdict(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.sqlite")
    add(store, "old", at=10)
    store.finish_run("old", outcome=Outcome.PASS, reason="", finished_at=20, result=result("old", 1.0, at=20))
    add(store, "inflight", at=15)
    store.put_verdicts([Verdict("n1", "nccl", Outcome.PASS, at=20.0)])
    assert store.prune(older_than=100) == 1
    assert store.run("old") is None and store.measurements() == []
    assert store.run("inflight") is not None
    assert len(store.current_verdicts()) == 1
    assert ("probe_runs_total", {"outcome": "pass", "probe": "nccl"}, 1.0) in store.counters()


def test_snapshot_counts_in_flight(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.sqlite")
    add(store, "x")
    snap = store.snapshot()
    assert snap.in_flight == 1 and snap.last_runs == ()


def test_migration_3_reads_the_run_kind_from_the_old_id_prefixes_once(tmp_path: Path) -> None:
    path = tmp_path / "v2.sqlite"
    db = sqlite3.connect(path, isolation_level=None)
    for migration in MIGRATIONS[:2]:
        for statement in migration.split(";"):
            if statement.strip():
                db.execute(statement)
    db.execute("PRAGMA user_version = 2")
    rows = [("0123456789abcdef", "probe"), ("rp0123456789abcd", "probe"), ("sw4-0123456789abcdef", "probe"),
            ("ingest-nccl-tests-x", "ingest")]
    for run_id, source in rows:
        db.execute("INSERT INTO runs (run_id, probe, backend, state, submitted_at, source)"
                   " VALUES (?, 'nccl', 'slurm', 'submitted', 1.0, ?)", (run_id, source))
        db.execute("INSERT INTO run_nodes (run_id, node) VALUES (?, 'n1')", (run_id,))
    db.close()
    store = Store(path)
    assert [(r.run_id, r.kind) for r in store.unfinished_runs()] == [
        ("0123456789abcdef", RunKind.PROBE), ("rp0123456789abcd", RunKind.REPROBE),
        ("sw4-0123456789abcdef", RunKind.SWEEP), ("ingest-nccl-tests-x", RunKind.INGEST)]
    # from now on the column is the truth: an id that looks like a sweep's is not one
    store.add_run(run_id="sw2-looks-like-a-sweep", probe="nccl", nodes=("n1", "n2"), backend="slurm", job_id=None,
                  submitted_at=2.0, result_path=None)
    assert store.run("sw2-looks-like-a-sweep").kind is RunKind.PROBE  # type: ignore[union-attr]
    assert store.sweeping_classes() == {""}  # the migrated sweep run only


def test_migration_5_backfills_the_latest_tables(tmp_path: Path) -> None:
    """A store of schema 4 with history opens with ``latest`` and ``latest_runs`` as a scan of it gives."""
    path = tmp_path / "old.sqlite"
    db = sqlite3.connect(path)
    for migration in MIGRATIONS[:4]:
        db.executescript(migration)
    db.execute("PRAGMA user_version = 4")
    for run_id, node, outcome, at, value in (("a", "n1", "pass", 10.0, 1.0), ("b", "n1", "fail", 20.0, 2.0),
                                             ("c", "n1", "skipped", 30.0, None), ("g", None, "pass", 15.0, 5.0)):
        db.execute("INSERT INTO runs (run_id, probe, backend, state, outcome, submitted_at, started_at, finished_at,"
                   " duration_s) VALUES (?, 'nccl', 'slurm', 'finished', ?, ?, ?, ?, 1.0)",
                   (run_id, outcome, at - 5, at - 1, at))
        for n in ([node] if node else ["n1", "n2"]):
            db.execute("INSERT INTO run_nodes (run_id, node) VALUES (?, ?)", (run_id, n))
        if value is not None:
            db.execute("INSERT INTO measurements (run_id, probe, node, name, labels, value, at)"
                       " VALUES (?, 'nccl', ?, 'busbw_bytes_per_second', '{}', ?, ?)", (run_id, node, value, at))
    db.commit()
    db.close()
    store = Store(path)
    assert store.schema_version == SCHEMA_VERSION
    assert {(m.node, m.value, m.run_id) for m in store.latest_measurements()} == {("n1", 2.0, "b"), ("n2", 5.0, "g")}
    runs = {r.node: r for r in store.last_runs()}
    assert (runs["n1"].last_run_id, runs["n1"].last_outcome, runs["n1"].last_success_at) == ("b", Outcome.FAIL, 15.0)
    assert (runs["n2"].last_run_id, runs["n2"].last_success_at) == ("g", 15.0)
    (timing,) = [t for t in store.last_run_timings() if t.node == "n1"]
    assert (timing.queue_wait_s, timing.duration_s) == (4.0, 1.0)
    store.close()


def test_an_older_result_never_replaces_a_newer_latest_value(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.sqlite")
    for run_id, at, value in (("new", 100.0, 2.0), ("old", 50.0, 1.0)):
        store.add_run(run_id=run_id, probe="gemm", nodes=["n1"], backend="slurm", job_id=None, submitted_at=at - 10,
                      result_path=None)
        store.finish_run(run_id, outcome=Outcome.PASS, reason="", finished_at=at, result=ProbeResult(
            probe="gemm", run_id=run_id, outcome=Outcome.PASS, started_at=at - 10, finished_at=at,
            measurements=[Measurement(name="flop_per_second", value=value, node="n1", labels={"gpu": "0"})]))
    ((m,), (last,)) = store.latest_measurements(), store.last_runs()
    assert (m.value, m.run_id, last.last_run_id, last.last_success_at) == (2.0, "new", "new", 100.0)
    store.prune(older_than=75.0)
    assert [m.run_id for m in store.latest_measurements()] == ["new"]
    store.close()
