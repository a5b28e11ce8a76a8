"""Isolation on the collect path (issue 19): one run that cannot be collected is closed as ``error`` and
the others go on; the store's faults are reported with their real cause and never hold readers up; a
run whose judgement was not saved is judged later; ``/healthz`` says when a tick keeps failing. The
daemon is the real one over the fake Slurm; the results are real files the real collector reads."""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

import healthd.collector as collector_module
import healthd.store.db as db_module
from healthd.collector import Collector
from healthd.config import Settings
from healthd.daemon import FAILING_TICKS, Daemon
from healthd.errors import StoreUnavailable
from healthd.model import Outcome, ProbeResult
from healthd.store import Store
from probes.result import Measurement
from tests.fakes.slurm import FakeSlurmClient, fake_backend, gpu_node


@pytest.fixture
def fake() -> FakeSlurmClient:
    return FakeSlurmClient([gpu_node(f"n{i}") for i in range(1, 9)])


def make_daemon(fake: FakeSlurmClient, tmp_path: Path) -> Daemon:
    settings = Settings(backend="slurm", state_dir=tmp_path / "state", http={"host": "127.0.0.1", "port": 0},
                        probes={"gemm": {"interval_s": 600.0, "timeout_s": 120.0}})
    return Daemon(settings, None, backend=fake_backend(fake, settings.results_dir))


@pytest.fixture
def daemon(fake: FakeSlurmClient, tmp_path: Path) -> Iterator[Daemon]:
    d = make_daemon(fake, tmp_path)
    yield d
    d.http._server.server_close()
    d.store.close()


def write_result(fake: FakeSlurmClient, job_id: str, value: float = 700e12) -> str:
    """The probe of ``job_id`` writes a passing gemm result and its job completes; returns the run id."""
    job = fake.jobs_by_id[job_id]
    assert job.result_path is not None
    now = time.time()
    result = ProbeResult(
        probe="gemm", run_id=job.result_path.stem, outcome=Outcome.PASS, started_at=now - 5, finished_at=now,
        nodes=list(job.nodes),
        measurements=[Measurement(name="flop_per_second", labels={"gpu": "0", "dtype": "bf16"}, node=n, value=value)
                      for n in job.nodes])
    job.result_path.parent.mkdir(parents=True, exist_ok=True)
    job.result_path.write_text(result.to_json())
    fake.finish(job_id)
    return job.result_path.stem


def launch_two(daemon: Daemon, fake: FakeSlurmClient) -> list[str]:
    """Two gemm runs finished with their results written; returns their run ids."""
    daemon.discover()
    daemon.plan_and_launch()
    daemon.plan_and_launch()
    fake.start_all()
    submitted = fake.submitted()[:2]
    assert len(submitted) == 2
    return [write_result(fake, job_id) for job_id in submitted]


def break_reading(monkeypatch: pytest.MonkeyPatch, run_id: str, exc: Exception) -> None:
    """Reading the result of ``run_id`` raises ``exc`` (a bug of healthd's, not a bad file)."""
    real = collector_module.read_result

    def read(path: Path, **kw: int | None) -> ProbeResult:
        if path.stem == run_id:
            raise exc
        return real(path, **kw)

    monkeypatch.setattr(collector_module, "read_result", read)


def test_a_run_that_crashes_the_collector_is_closed_as_error_and_the_others_go_on(
    daemon: Daemon, fake: FakeSlurmClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    bad, good = launch_two(daemon, fake)
    break_reading(monkeypatch, bad, RecursionError("maximum recursion depth exceeded"))
    daemon._tick("collect", daemon.collect)()
    assert daemon.store.unfinished_runs() == []
    bad_run, good_run = daemon.store.run(bad), daemon.store.run(good)
    assert bad_run is not None and bad_run.outcome is Outcome.ERROR
    assert bad_run.reason == "healthd could not collect this run: RecursionError: maximum recursion depth exceeded"
    assert good_run is not None and good_run.outcome is Outcome.PASS
    assert daemon.registry.get_sample_value("healthd_errors_total", {"kind": "collect"}) == 1.0
    assert daemon.registry.get_sample_value("healthd_scheduler_tick_errors_total", {"task": "collect"}) == 0.0
    assert daemon.store.unjudged_runs() == []


def test_a_result_the_store_refuses_closes_that_run_as_error(
    daemon: Daemon, fake: FakeSlurmClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    bad, good = launch_two(daemon, fake)
    real = daemon.store._insert_result

    def insert_result(db: sqlite3.Connection, position: int, run_id: str, probe: str, result: ProbeResult,
                      finished_at: float, nodes: Sequence[str], pending: Any) -> None:
        if run_id == bad:
            raise sqlite3.IntegrityError("NOT NULL constraint failed: samples.value")
        real(db, position, run_id, probe, result, finished_at, nodes, pending)

    monkeypatch.setattr(daemon.store, "_insert_result", insert_result)
    daemon.collect()
    bad_run, good_run = daemon.store.run(bad), daemon.store.run(good)
    assert bad_run is not None and bad_run.outcome is Outcome.ERROR and "NOT NULL constraint" in bad_run.reason
    assert good_run is not None and good_run.outcome is Outcome.PASS


def test_recover_never_dies_of_one_run(fake: FakeSlurmClient, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first = make_daemon(fake, tmp_path)
    bad, good = launch_two(first, fake)
    first.http._server.server_close()
    first.store.close()
    fake.purge()
    break_reading(monkeypatch, bad, OverflowError("int too large to convert to float"))
    store = Store(tmp_path / "state" / "healthd.sqlite")
    closed = Collector(store, fake_backend(fake, tmp_path / "state" / "results"), tmp_path).recover()
    assert {(c.run_id, c.outcome) for c in closed} == {(bad, Outcome.ERROR), (good, Outcome.PASS)}


def test_a_full_store_names_its_real_cause_and_the_tick_reports_it(
    daemon: Daemon, fake: FakeSlurmClient
) -> None:
    run_ids = launch_two(daemon, fake)
    pages = daemon.store._db.execute("PRAGMA page_count").fetchone()[0]
    daemon.store._db.execute(f"PRAGMA max_page_count = {pages}")
    for size in (4000, 400, 4):
        with pytest.raises(StoreUnavailable, match="database or disk is full"):
            for i in range(10_000):
                daemon.store.bump_counter("filler", {"i": f"{size}-{i}" + "x" * size})
    for _ in range(FAILING_TICKS):
        daemon._tick("collect", daemon.collect)()
    daemon._heartbeat = time.monotonic()
    daemon.scheduler.start(paused=True)
    try:
        ok, text = daemon.healthy()
        assert not ok
        assert f"tick collect failed {FAILING_TICKS} times in a row: StoreUnavailable:" in text
        assert "database or disk is full" in text and "cannot rollback" not in text
        assert {r.run_id for r in daemon.store.unfinished_runs()} == set(run_ids)  # nothing lost

        daemon.store._db.execute("PRAGMA max_page_count = 1073741823")
        daemon._tick("collect", daemon.collect)()
        assert daemon.store.unfinished_runs() == [] and daemon.healthy()[0]
    finally:
        daemon.scheduler.shutdown(wait=False)


def test_a_backend_outage_is_not_a_failing_tick(daemon: Daemon, fake: FakeSlurmClient) -> None:
    launch_two(daemon, fake)
    fake.outage = "down"
    for _ in range(FAILING_TICKS + 1):
        daemon._tick("collect", daemon.collect)()
    daemon._heartbeat = time.monotonic()
    daemon.scheduler.start(paused=True)
    try:
        ok, text = daemon.healthy()
        assert ok and "not answering" in text
    finally:
        daemon.scheduler.shutdown(wait=False)


def test_an_external_write_lock_never_holds_readers_up(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(db_module, "BUSY_TIMEOUT_S", 1.5)
    store = Store(tmp_path / "s.sqlite")
    other = sqlite3.connect(tmp_path / "s.sqlite", isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    failed: list[BaseException] = []

    def write() -> None:
        try:
            store.bump_counter("x", {})
        except StoreUnavailable as exc:
            failed.append(exc)

    writer = threading.Thread(target=write)
    started = time.monotonic()
    writer.start()
    time.sleep(0.2)
    reads = []
    while writer.is_alive():
        t = time.monotonic()
        store.recent_runs()
        reads.append(time.monotonic() - t)
        time.sleep(0.05)
    writer.join()
    assert time.monotonic() - started >= 1.4
    assert len(failed) == 1 and "database is locked" in str(failed[0])
    assert reads and max(reads) < 0.5
    other.execute("ROLLBACK")
    store.bump_counter("x", {})  # once the lock is gone, writes go through
    other.close()
    store.close()


def test_a_run_whose_judgement_was_not_saved_is_judged_at_the_next_collect_and_at_start(
    fake: FakeSlurmClient, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    daemon = make_daemon(fake, tmp_path)
    first, second = launch_two(daemon, fake)

    def refuse(*args: object, **kw: object) -> None:
        raise StoreUnavailable("cannot write the state store: disk I/O error")

    with monkeypatch.context() as m:
        m.setattr(daemon.store, "save_judgement", refuse)
        daemon._tick("collect", daemon.collect)()
    assert daemon.store.unfinished_runs() == []
    assert {r.run_id for r in daemon.store.unjudged_runs()} == {first, second}
    assert daemon.store.judge_series() == []

    daemon.collect()  # nothing new finished: the two left over are judged
    assert daemon.store.unjudged_runs() == []
    assert {s["node"] for s in daemon.store.judge_series()} == {"n1", "n2"}
    daemon.http._server.server_close()
    daemon.store.close()

    restarted = make_daemon(fake, tmp_path)
    try:
        restarted.store._db.execute("UPDATE runs SET judged = 0 WHERE run_id = ?", (first,))
        restarted._judge(restarted.collector.recover())
        assert restarted.store.unjudged_runs() == []
    finally:
        restarted.http._server.server_close()
        restarted.store.close()


def test_an_ingested_run_never_waits_for_a_judgement(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.sqlite")
    now = time.time()
    store.record_result(ProbeResult(probe="gemm", run_id="i1", outcome=Outcome.PASS, started_at=now - 1,
                                    finished_at=now, nodes=["n1"]), nodes=["n1"], backend="ingest", source="ingest",
                        result_path=None)
    assert store.unjudged_runs() == []
    store.close()


def test_a_store_locked_by_another_process_keeps_the_runs_for_the_next_tick(
    daemon: Daemon, fake: FakeSlurmClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(db_module, "BUSY_TIMEOUT_S", 0.5)
    run_ids = launch_two(daemon, fake)
    other = sqlite3.connect(daemon.store.path, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    daemon._tick("collect", daemon.collect)()
    assert daemon.registry.get_sample_value("healthd_scheduler_tick_errors_total", {"task": "collect"}) == 1.0
    assert {r.run_id for r in daemon.store.unfinished_runs()} == set(run_ids)
    started = time.monotonic()
    assert list(daemon.registry.collect())  # /metrics reads the store while it is locked
    assert time.monotonic() - started < 0.5
    other.execute("ROLLBACK")
    other.close()
    daemon._tick("collect", daemon.collect)()
    assert daemon.store.unfinished_runs() == [] and daemon.store.unjudged_runs() == []


def test_housekeeping_folds_detail_older_than_detail_days(daemon: Daemon) -> None:
    old = time.time() - (daemon.settings.store.detail_days + 1) * 86400
    daemon.store.add_run(run_id="old", probe="gemm", nodes=("n1",), backend="slurm", job_id=None,
                         submitted_at=old - 60, result_path=None)
    daemon.store.finish_run("old", outcome=Outcome.PASS, reason="", finished_at=old, result=ProbeResult(
        probe="gemm", run_id="old", outcome=Outcome.PASS, started_at=old - 30, finished_at=old, nodes=["n1"],
        measurements=[Measurement(name="flop_per_second", labels={"gpu": "0"}, node="n1", value=5.0)]))
    daemon.housekeeping()
    assert daemon.store.measurements(run_id="old") == []
    (day,) = daemon.store.rollups(node="n1")
    assert (day.name, day.n, day.mean) == ("flop_per_second", 1, 5.0)
    assert daemon.store.run("old") is not None
