"""Compact history (issue 18): the series dictionary, batched closing, rollups and the planner's attempts."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from healthd.model import Outcome, RunKind
from healthd.store import Store
from healthd.store.latest import ChangeCursor
from healthd.store.runs import FinishedRun
from probes.result import Measurement, ProbeResult
from tests.old_stores import store_at

DAY = 86400.0


def gemm(run_id: str, node: str, at: float, value: float) -> ProbeResult:
    return ProbeResult(probe="gemm", run_id=run_id, outcome=Outcome.PASS, started_at=at - 10, finished_at=at,
                       nodes=[node], measurements=[
                           Measurement(name="flop_per_second", value=value + gpu, node=node,
                                       labels={"dtype": "bf16", "gpu": str(gpu)}) for gpu in range(4)])


def add(store: Store, run_id: str, node: str, at: float, kind: RunKind = RunKind.PROBE, probe: str = "gemm") -> None:
    store.add_run(run_id=run_id, probe=probe, nodes=(node,), backend="sim", job_id=None, submitted_at=at,
                  result_path=None, kind=kind)


def test_a_series_label_text_is_stored_once_whatever_the_number_of_runs(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.sqlite")
    for i in range(5):
        add(store, f"r{i}", "n1", 100.0 * i)
        store.finish_run(f"r{i}", outcome=Outcome.PASS, reason="", finished_at=100.0 * i + 50,
                         result=gemm(f"r{i}", "n1", 100.0 * i + 50, 1e12 * (i + 1)))
    db = sqlite3.connect(tmp_path / "s.sqlite")
    assert db.execute("SELECT COUNT(*) FROM series").fetchone()[0] == 4
    assert db.execute("SELECT COUNT(*) FROM samples").fetchone()[0] == 20
    got = store.measurements(run_id="r3")
    assert sorted((m.labels["gpu"], m.value, m.at, m.node) for m in got) == [
        (str(g), 4e12 + g, 350.0, "n1") for g in range(4)]
    assert {m.labels["gpu"]: m.value for m in store.latest_measurements()} == {str(g): 5e12 + g for g in range(4)}


def test_a_batch_is_closed_in_one_transaction_and_a_run_closed_twice_is_stored_once(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.sqlite")
    for i in range(3):
        add(store, f"r{i}", f"n{i}", 0.0)
    commits = store.data_version()[0]
    batch = [FinishedRun(f"r{i}", Outcome.PASS, "", 40.0, gemm(f"r{i}", f"n{i}", 40.0, 1e12)) for i in range(3)]
    assert store.finish_runs([*batch, batch[0]]) == [*batch, None]
    assert store.data_version()[0] == commits + 1
    assert store.finish_runs(batch[:1]) == [None]
    assert ("probe_runs_total", {"outcome": "pass", "probe": "gemm"}, 3.0) in store.counters()
    assert len(store.measurements()) == 12


def test_a_refused_result_closes_only_its_own_run_as_what_refused_makes_it(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.sqlite")
    add(store, "good", "n1", 0.0)
    add(store, "bad", "n2", 0.0)
    bad = gemm("bad", "n2", 40.0, 1e12)
    bad.measurements[0].__dict__["value"] = None  # NOT NULL
    batch = [FinishedRun("good", Outcome.PASS, "", 40.0, gemm("good", "n1", 40.0, 1e12)),
             FinishedRun("bad", Outcome.PASS, "", 40.0, bad)]
    with pytest.raises(sqlite3.IntegrityError):
        store.finish_runs(batch)
    assert store.unfinished_runs() != []
    stored = store.finish_runs(batch, refused=lambda r, exc: FinishedRun(r.run_id, Outcome.ERROR, str(exc), 41.0))
    assert [s.outcome if s else None for s in stored] == [Outcome.PASS, Outcome.ERROR]
    assert store.measurements(run_id="bad") == [] and len(store.measurements(run_id="good")) == 4


def test_last_attempts_are_kept_on_write_and_ignore_ingested_runs(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.sqlite")
    add(store, "a", "n1", 10.0)
    add(store, "b", "n1", 30.0)
    add(store, "c", "n1", 20.0)
    add(store, "d", "n2", 50.0, kind=RunKind.INGEST)
    add(store, "e", "n2", 5.0, probe="nccl")
    assert store.last_attempts() == {("n1", "gemm"): 30.0, ("n2", "nccl"): 5.0}


def test_rollup_folds_old_detail_into_per_node_days_incrementally(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.sqlite")
    for day in range(3):
        for k in range(2):
            run_id = f"d{day}k{k}"
            at = day * DAY + 3600.0 * (k + 1)
            add(store, run_id, "n1", at - 60)
            store.finish_run(run_id, outcome=Outcome.PASS, reason="", finished_at=at,
                             result=gemm(run_id, "n1", at, 100.0 * (k + 1)))
    assert store.rollup(older_than=1 * DAY, batch=1) == 2
    assert store.rollup(older_than=1 * DAY) == 0
    (day0,) = store.rollups()
    assert (day0.node, day0.probe, day0.name, day0.labels, day0.day) == ("n1", "gemm", "flop_per_second",
                                                                         {"dtype": "bf16"}, 0.0)
    assert (day0.n, day0.lo, day0.hi) == (8, 100.0, 203.0)
    assert day0.mean == pytest.approx((sum(100.0 + g for g in range(4)) + sum(200.0 + g for g in range(4))) / 8)
    assert store.measurements(run_id="d0k0") == [] and len(store.measurements(run_id="d1k0")) == 4
    assert store.run("d0k0") is not None
    assert store.rollup(older_than=3 * DAY) == 4
    assert [r.day for r in store.rollups()] == [0.0, DAY, 2 * DAY]
    assert store.measurements() == []


def test_a_version_4_store_keeps_its_measurements_through_the_migration(tmp_path: Path) -> None:
    path = tmp_path / "old.sqlite"
    db = store_at(path, 4)
    db.execute("INSERT INTO runs (run_id, probe, backend, state, outcome, submitted_at, finished_at)"
               " VALUES ('r1', 'nccl', 'local', 'finished', 'pass', 10, 20)")
    db.execute("INSERT INTO run_nodes VALUES ('r1', 'n1'), ('r1', 'n2')")
    labels = json.dumps({"size_bytes": "8"}, separators=(",", ":"))
    db.execute("INSERT INTO measurements (run_id, probe, node, name, labels, value, at)"
               " VALUES ('r1', 'nccl', NULL, 'busbw', ?, 5.0, 20), ('r1', 'nccl', 'n1', 'busbw', ?, 7.0, 20)",
               (labels, labels))
    db.commit()
    db.close()
    store = Store(path)
    got = sorted((m.node or "", m.value, m.at) for m in store.measurements(run_id="r1"))
    assert got == [("", 5.0, 20.0), ("n1", 7.0, 20.0)]
    assert store.last_attempts() == {("n1", "nccl"): 10.0, ("n2", "nccl"): 10.0}


def test_what_a_tick_reads_never_scans_the_history(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.sqlite")
    add(store, "r1", "n1", 10.0)
    store.last_attempts()
    statements: list[str] = []
    store._db.set_trace_callback(statements.append)
    store.unfinished_runs()
    assert store.last_attempts() == {("n1", "gemm"): 10.0}
    store._db.set_trace_callback(None)
    plans = [row[3] for sql in statements if sql.lstrip().upper().startswith("SELECT")
             for row in store._db.execute("EXPLAIN QUERY PLAN " + sql)]
    assert plans and not [p for p in plans if p.split()[:2] in (["SCAN", "r"], ["SCAN", "runs"])]


def test_a_version_8_store_keeps_its_latest_values_through_migration_9(tmp_path: Path) -> None:
    """``latest`` keyed by the series dictionary's id: the values a store of schema 8 holds, a multi-node group's
    included, read the same after the migration, and the next run's end moves them on."""
    path = tmp_path / "v8.sqlite"
    db = store_at(path, 8)
    for run_id, probe, at, nodes in (("g1", "gemm", 20.0, ["n1"]), ("c1", "nccl", 30.0, ["n1", "n2"])):
        db.execute("INSERT INTO runs (run_id, probe, backend, state, outcome, submitted_at, finished_at)"
                   " VALUES (?, ?, 'local', 'finished', 'pass', 10, ?)", (run_id, probe, at))
        db.executemany("INSERT INTO run_nodes VALUES (?, ?)", [(run_id, n) for n in nodes])
    db.execute("INSERT INTO series (id, probe, node, name, labels) VALUES"
               " (1, 'gemm', 'n1', 'flop_per_second', '{\"gpu\":\"0\"}'), (2, 'nccl', '', 'busbw', '{}')")
    db.execute("INSERT INTO samples (run, series, value) VALUES (1, 1, 7.0), (2, 2, 5.0)")
    db.execute("INSERT INTO latest (node, probe, name, labels, value, at, run_id, seq) VALUES"
               " ('n1', 'gemm', 'flop_per_second', '{\"gpu\":\"0\"}', 7.0, 20.0, 'g1', 3),"
               " ('n1', 'nccl', 'busbw', '{}', 5.0, 30.0, 'c1', 4), ('n2', 'nccl', 'busbw', '{}', 5.0, 30.0, 'c1', 4)")
    db.commit()
    db.close()
    store = Store(path)
    before = [("gemm", "n1", "flop_per_second", {"gpu": "0"}, "g1", 7.0, 20.0),
              ("nccl", "n1", "busbw", {}, "c1", 5.0, 30.0), ("nccl", "n2", "busbw", {}, "c1", 5.0, 30.0)]
    assert [(m.probe, m.node, m.name, m.labels, m.run_id, m.value, m.at) for m in store.latest_measurements()] == before
    assert [m.node for m in store.latest_measurements(nodes=["n2"])] == ["n2"]
    changes, cursor = store.changes(ChangeCursor())
    assert sorted((m.probe, m.node, m.value) for m in changes.latest) == [(p, n, v) for p, n, _, _, _, v, _ in before]
    assert cursor.latest == 4
    assert store.changes(cursor, families={("nccl", "busbw")})[0].latest == ()
    add(store, "g2", "n1", 40.0)
    store.finish_run("g2", outcome=Outcome.PASS, reason="", finished_at=50.0,
                     result=ProbeResult(probe="gemm", run_id="g2", outcome=Outcome.PASS, started_at=40.0,
                                        finished_at=50.0, measurements=[Measurement(
                                            name="flop_per_second", value=9.0, node="n1", labels={"gpu": "0"})]))
    (moved,) = store.changes(cursor)[0].latest
    assert (moved.probe, moved.node, moved.value, moved.run_id, moved.at) == ("gemm", "n1", 9.0, "g2", 50.0)
    assert len(store.latest_measurements()) == 3
    store.prune(older_than=40.0)
    assert [m.run_id for m in store.latest_measurements()] == ["g2"]


def test_a_series_another_process_added_after_this_one_read_it_is_found(tmp_path: Path) -> None:
    first, second = Store(tmp_path / "s.sqlite"), Store(tmp_path / "s.sqlite")
    add(first, "a", "n1", 0.0)
    first.finish_run("a", outcome=Outcome.PASS, reason="", finished_at=10.0, result=gemm("a", "n1", 10.0, 1.0))
    add(second, "b", "n1", 20.0)
    second.finish_run("b", outcome=Outcome.PASS, reason="", finished_at=30.0, result=ProbeResult(
        probe="gemm", run_id="b", outcome=Outcome.PASS, started_at=20.0, finished_at=30.0,
        measurements=[Measurement(name="memory_bandwidth_bytes_per_second", value=2.0, node="n1", labels={})]))
    add(first, "c", "n1", 40.0)
    first.finish_run("c", outcome=Outcome.PASS, reason="", finished_at=50.0, result=ProbeResult(
        probe="gemm", run_id="c", outcome=Outcome.PASS, started_at=40.0, finished_at=50.0,
        measurements=[Measurement(name="memory_bandwidth_bytes_per_second", value=3.0, node="n1", labels={})]))
    db = sqlite3.connect(tmp_path / "s.sqlite")
    assert db.execute("SELECT COUNT(*) FROM series").fetchone()[0] == 5
    assert [(m.run_id, m.value) for m in first.latest_measurements()
            if m.name == "memory_bandwidth_bytes_per_second"] == [("c", 3.0)]
    assert len(first.measurements(run_id="c")) == 1


def test_values_of_one_batch_keep_the_newest_per_series_whatever_their_order(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.sqlite")
    for run_id in ("new", "old", "same"):
        add(store, run_id, "n1", 0.0)
    store.finish_runs([FinishedRun("new", Outcome.PASS, "", 50.0, gemm("new", "n1", 50.0, 5.0)),
                       FinishedRun("old", Outcome.PASS, "", 40.0, gemm("old", "n1", 40.0, 4.0))])
    assert {m.run_id for m in store.latest_measurements()} == {"new"}
    store.finish_runs([FinishedRun("same", Outcome.PASS, "", 50.0, gemm("same", "n1", 50.0, 6.0))])
    assert {(m.run_id, m.value) for m in store.latest_measurements() if m.labels["gpu"] == "0"} == {("same", 6.0)}


def test_an_older_pass_moves_only_the_last_success_on(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.sqlite")
    for run_id in ("fail", "pass", "older"):
        add(store, run_id, "n1", 0.0)
    store.finish_runs([FinishedRun("fail", Outcome.FAIL, "slow", 50.0), FinishedRun("pass", Outcome.PASS, "", 40.0)])
    (last,) = store.last_runs()
    assert (last.last_run_id, last.last_outcome, last.last_run_at, last.last_success_at) == (
        "fail", Outcome.FAIL, 50.0, 40.0)
    _, cursor = store.changes(ChangeCursor())
    store.finish_runs([FinishedRun("older", Outcome.PASS, "", 30.0)])
    assert store.changes(cursor)[0].runs == ()
    (last,) = store.last_runs()
    assert (last.last_run_id, last.last_success_at) == ("fail", 40.0)


def test_changes_read_the_nodes_changed_not_every_latest_value(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.sqlite")
    for i, node in enumerate(("n1", "n2", "n3")):
        add(store, f"g{i}", node, 0.0)
    store.finish_runs([FinishedRun(f"g{i}", Outcome.PASS, "", 10.0, gemm(f"g{i}", n, 10.0, 1.0))
                       for i, n in enumerate(("n1", "n2"))])
    _, cursor = store.changes(ChangeCursor())
    store.add_run(run_id="pair", probe="nccl", nodes=("n2", "n3"), backend="sim", job_id=None, submitted_at=20.0,
                  result_path=None)
    store.finish_run("pair", outcome=Outcome.PASS, reason="", finished_at=30.0, result=ProbeResult(
        probe="nccl", run_id="pair", outcome=Outcome.PASS, started_at=20.0, finished_at=30.0, nodes=["n2", "n3"],
        measurements=[Measurement(name="busbw", value=5.0, node=None, labels={})]))
    statements: list[str] = []
    store._db.set_trace_callback(statements.append)
    changes, _ = store.changes(cursor)
    store._db.set_trace_callback(None)
    assert sorted((m.probe, m.node, m.value, m.run_id) for m in changes.latest) == [
        ("nccl", "n2", 5.0, "pair"), ("nccl", "n3", 5.0, "pair")]
    (read,) = [sql for sql in statements if "FROM latest_nodes k" in sql]
    plan = [row[3] for row in store._db.execute("EXPLAIN QUERY PLAN " + read)]
    assert not [p for p in plan if p.startswith("SCAN")], plan


def test_last_partners_are_kept_on_write_and_read_back_after_a_restart(tmp_path: Path) -> None:
    """The planner's partner rotation: per (node, probe) the other nodes of its latest attempt; an older run
    written late does not replace it, a single-node run leaves none."""
    path = tmp_path / "s.sqlite"
    store = Store(path)
    assert store.last_partners() == {}

    def pair(run_id: str, nodes: tuple[str, ...], at: float) -> None:
        store.add_run(run_id=run_id, probe="nccl", nodes=nodes, backend="sim", job_id=None, submitted_at=at,
                      result_path=None)

    pair("p1", ("n1", "n2"), 10.0)
    pair("p2", ("n1", "n3", "n5"), 20.0)
    pair("p0", ("n1", "n4"), 5.0)
    pair("s2", ("n2",), 30.0)
    add(store, "g1", "n1", 40.0)
    want = {("n1", "nccl"): frozenset({"n3", "n5"}), ("n3", "nccl"): frozenset({"n1", "n5"}),
            ("n5", "nccl"): frozenset({"n1", "n3"}), ("n4", "nccl"): frozenset({"n1"})}
    assert store.last_partners() == want
    store.close()
    again = Store(path)
    assert again.last_partners() == want
    assert again.last_attempts()[("n2", "nccl")] == 30.0


def test_a_version_13_store_has_no_partners_until_its_next_runs(tmp_path: Path) -> None:
    path = tmp_path / "v13.sqlite"
    db = store_at(path, 13)
    db.execute("INSERT INTO runs (run_id, probe, backend, state, submitted_at) VALUES ('p', 'nccl', 'sim', "
               "'submitted', 10)")
    db.executemany("INSERT INTO run_nodes VALUES ('p', ?)", [("n1",), ("n2",)])
    db.executemany("INSERT INTO attempts VALUES (?, 'nccl', 10)", [("n1",), ("n2",)])
    db.commit()
    db.close()
    store = Store(path)
    assert store.last_attempts() == {("n1", "nccl"): 10.0, ("n2", "nccl"): 10.0} and store.last_partners() == {}
    store.add_run(run_id="q", probe="nccl", nodes=("n2", "n1"), backend="sim", job_id=None, submitted_at=20.0,
                  result_path=None)
    assert store.last_partners() == {("n1", "nccl"): frozenset({"n2"}), ("n2", "nccl"): frozenset({"n1"})}


def test_last_partners_first_asked_after_runs_were_added_read_the_store(tmp_path: Path) -> None:
    """A daemon that plans without rotation never reads the partners; asked later, they are the store's."""
    store = Store(tmp_path / "s.sqlite")
    store.last_attempts()
    store.add_run(run_id="p", probe="nccl", nodes=("n1", "n2"), backend="sim", job_id=None, submitted_at=10.0,
                  result_path=None)
    assert store.last_partners() == {("n1", "nccl"): frozenset({"n2"}), ("n2", "nccl"): frozenset({"n1"})}
    store.add_run(run_id="q", probe="nccl", nodes=("n1", "n3"), backend="sim", job_id=None, submitted_at=20.0,
                  result_path=None)
    assert store.last_partners() == {("n1", "nccl"): frozenset({"n3"}), ("n2", "nccl"): frozenset({"n1"}),
                                     ("n3", "nccl"): frozenset({"n1"})}
