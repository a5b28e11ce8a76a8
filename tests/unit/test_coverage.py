"""Coverage (nodes fully checked in the last 24 h), the last full check per node, and the budget
figures: pure functions, the store's queries and the exported metrics."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from healthd.coverage import Coverage, CoverageCollector, CoverageInputs, checked_times, coverage, full_check_times
from healthd.model import Node, Outcome, RunKind
from healthd.store import Store
from tests.old_stores import store_at

DAY = 86400.0


def test_full_check_is_the_oldest_newest_judged_run_of_every_enabled_probe() -> None:
    judged = {("a", "gemm"): 500.0, ("a", "nccl"): 300.0, ("b", "gemm"): 900.0, ("c", "nccl"): 1.0}
    assert full_check_times(["a", "b", "c"], ["gemm", "nccl"], judged) == {"a": 300.0}
    assert full_check_times(["a", "b", "c"], ["gemm"], judged) == {"a": 500.0, "b": 900.0}
    assert full_check_times(["a"], [], judged) == {}


def test_a_one_gpu_node_is_fully_checked_without_the_probes_between_its_gpus() -> None:
    """On one GPU the intra-node nccl probe has nothing to measure (``skipped``, never judged): the
    node's full check needs every other enabled probe only."""
    judged = {("one", "gemm"): 500.0, ("one", "ddp"): 400.0, ("eight", "gemm"): 500.0, ("eight", "ddp"): 400.0}
    probes = ["ddp", "gemm", "nccl"]
    assert full_check_times(["one", "eight"], probes, judged, one_gpu=["one"], between_gpus=["nccl"]) == {"one": 400.0}
    assert full_check_times(["one"], probes, judged) == {}


def test_coverage_per_class_and_in_all() -> None:
    nodes = [Node("a", "idle", node_class="h100"), Node("b", "allocated", node_class="h100"),
             Node("c", "idle", node_class="a100"), Node("d", "idle")]
    now = 10 * DAY
    checks = {"a": now - 3600, "b": now - 2 * DAY, "c": now - DAY + 1}
    cov = coverage(nodes, checks, now)
    assert cov[None] == Coverage(2, 4)
    assert cov[None].ratio == 0.5
    assert cov["h100"] == Coverage(1, 2)
    assert cov["a100"].ratio == 1.0
    assert cov[""].ratio == 0.0
    assert coverage([], {}, now)[None].ratio == 0.0


@pytest.fixture
def store(tmp_path: Path) -> Store:
    s = Store(tmp_path / "s.sqlite")
    s.upsert_nodes([Node("n1", "idle", gpus=8, node_class="h100x8"), Node("n2", "idle", gpus=8, node_class="h100x8"),
                    Node("n3", "allocated", gpus=8, node_class="h100x8")], 1.0)
    now = 10 * DAY
    for run_id, probe, nodes, outcome, finished, kind in [
        ("old", "gemm", ("n1",), Outcome.PASS, now - 2 * DAY, RunKind.PROBE),
        ("g1", "gemm", ("n1",), Outcome.PASS, now - 600, RunKind.PROBE),
        ("p1", "nccl", ("n1", "n2"), Outcome.FAIL, now - 500, RunKind.PROBE),
        ("g2", "gemm", ("n2",), Outcome.DEGRADED, now - 400, RunKind.REPROBE),
        ("e3", "gemm", ("n3",), Outcome.ERROR, now - 300, RunKind.PROBE),
        ("sw", "nccl", ("n3", "n2"), Outcome.PASS, now - 200, RunKind.SWEEP),
        ("b3", "boundary", ("n3",), Outcome.PASS, now - 100, RunKind.BOUNDARY),
        ("b2", "boundary", ("n2",), Outcome.ERROR, now - 50, RunKind.BOUNDARY),
    ]:
        s.add_run(run_id=run_id, probe=probe, nodes=nodes, backend="sim", job_id="1", submitted_at=finished - 100,
                  result_path=None, kind=kind)
        s.finish_run(run_id, outcome=outcome, reason="", finished_at=finished)
    return s


def test_store_spent_durations_and_last_judged(store: Store) -> None:
    now = 10 * DAY
    # g1 100 s x 8 + p1 100 s x 16 + g2 100 x 8 + e3 100 x 8 + sweep 100 x 16; "old" is outside the window
    assert store.gpu_seconds_since(now - DAY) == 800 + 1600 + 800 + 800 + 1600
    assert store.gpu_seconds_since(0.0) == 5600 + 800
    assert store.mean_durations(now - DAY) == {"gemm": 100.0, "nccl": 100.0}
    assert store.last_judged() == {("n1", "gemm"): now - 600, ("n1", "nccl"): now - 500,
                                   ("n2", "nccl"): now - 500, ("n2", "gemm"): now - 400,
                                   ("n3", "boundary"): now - 100}


def scrape(store: Store, *, max_share: float | None = None) -> dict[str, list[tuple[dict[str, str], float]]]:
    now = 10 * DAY
    reg = CollectorRegistry()
    reg.register(CoverageCollector(lambda: CoverageInputs(
        now=now, nodes=tuple(store.nodes()), enabled_probes=("gemm", "nccl"), last_judged=store.last_judged(),
        spent_gpu_s=store.gpu_seconds_since(now - DAY), max_gpu_hours_per_day=None, max_share=max_share)))
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(generate_latest(reg).decode()):
        for sample in family.samples:
            out.setdefault(sample.name, []).append((sample.labels, sample.value))
    return out


def test_coverage_metrics(store: Store) -> None:
    now = 10 * DAY
    m = scrape(store, max_share=0.005)
    assert m["healthd_node_last_full_check_timestamp_seconds"] == [({"node": "n1"}, now - 600),
                                                                   ({"node": "n2"}, now - 500)]
    assert m["healthd_probe_coverage_ratio"] == [({}, pytest.approx(2 / 3))]
    assert m["healthd_probe_class_coverage_ratio"] == [({"node_class": "h100x8"}, pytest.approx(2 / 3))]
    assert m["healthd_probe_budget_spent_gpu_seconds"] == [({}, 5600.0)]
    assert m["healthd_probe_budget_spent_ratio"] == [({}, pytest.approx(5600.0 / (24 * DAY)))]
    assert m["healthd_probe_budget_limit_gpu_seconds"] == [({}, pytest.approx(0.005 * 24 * DAY))]
    assert "healthd_probe_budget_limit_gpu_seconds" not in scrape(store)


def test_boundary_checks_cover_the_node_the_idle_probes_never_reach(store: Store) -> None:
    """n3 runs jobs (never idle: its only probe run was an error) but its epilog passed: covered by a
    boundary check; n2's boundary check could not run (error): it stays covered by its probes only."""
    now = 10 * DAY
    m = scrape(store)
    assert m["healthd_node_last_boundary_check_timestamp_seconds"] == [({"node": "n3"}, now - 100)]
    assert sorted((labels["by"], value) for labels, value in m["healthd_coverage_ratio"]) == [
        ("boundary", pytest.approx(1 / 3)), ("either", pytest.approx(1.0)), ("probes", pytest.approx(2 / 3))]
    assert m["healthd_probe_coverage_ratio"] == [({}, pytest.approx(2 / 3))]
    assert checked_times({"a": 5.0, "b": 9.0}, {"b": 7.0, "c": 1.0}) == {
        "a": (5.0, "probes"), "b": (9.0, "probes"), "c": (1.0, "boundary")}


GROUPED = ("SELECT n.node, r.probe, MAX(r.finished_at) FROM runs r JOIN run_nodes n ON n.run_id = r.run_id"
           " WHERE r.state = 'finished' AND r.outcome IN ('pass', 'degraded', 'fail')"
           " AND r.kind IN ('probe', 'reprobe', 'boundary') GROUP BY n.node, r.probe")
"""What ``last_judged`` means, read from the whole history (as it was before ``latest_runs`` kept it)."""


def test_last_judged_is_kept_whatever_order_runs_finish_in(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.sqlite")
    for run_id, probe, nodes, outcome, finished, kind in [
        ("a", "gemm", ("n1",), Outcome.PASS, 100.0, RunKind.PROBE),
        ("b", "gemm", ("n1",), Outcome.ERROR, 300.0, RunKind.PROBE),
        ("late", "gemm", ("n1",), Outcome.DEGRADED, 200.0, RunKind.REPROBE),
        ("ing", "gemm", ("n1",), Outcome.PASS, 400.0, RunKind.INGEST),
        ("sk", "gemm", ("n2",), Outcome.SKIPPED, 50.0, RunKind.PROBE),
        ("pair", "nccl", ("n1", "n2"), Outcome.FAIL, 150.0, RunKind.PROBE),
        ("older", "nccl", ("n2",), Outcome.PASS, 120.0, RunKind.PROBE),
    ]:
        store.add_run(run_id=run_id, probe=probe, nodes=nodes, backend="sim", job_id="1", submitted_at=finished - 10,
                      result_path=None, kind=kind)
        store.finish_run(run_id, outcome=outcome, reason="", finished_at=finished)
    grouped = {(r[0], r[1]): r[2] for r in store._db.execute(GROUPED)}
    assert store.last_judged() == grouped == {("n1", "gemm"): 200.0, ("n1", "nccl"): 150.0, ("n2", "nccl"): 150.0}
    assert [(r.node, r.probe, r.last_run_id) for r in store.last_runs(["n1"])] == [("n1", "gemm", "ing"),
                                                                                  ("n1", "nccl", "pair")]


def test_migration_9_carries_last_judged_over_from_the_history(tmp_path: Path) -> None:
    path = tmp_path / "v8.sqlite"
    db = store_at(path, 8)
    for run_id, kind, outcome, at in (("p", "probe", "pass", 10.0), ("r", "reprobe", "fail", 20.0),
                                      ("e", "probe", "error", 30.0), ("s", "sweep", "pass", 40.0)):
        db.execute("INSERT INTO runs (run_id, probe, backend, state, outcome, submitted_at, finished_at, kind)"
                   " VALUES (?, 'gemm', 'local', 'finished', ?, 1, ?, ?)", (run_id, outcome, at, kind))
        db.execute("INSERT INTO run_nodes VALUES (?, 'n1')", (run_id,))
    db.execute("INSERT INTO latest_runs (node, probe, run_id, outcome, reason, submitted_at, finished_at, seq)"
               " VALUES ('n1', 'gemm', 's', 'pass', '', 1, 40.0, 1)")
    db.commit()
    db.close()
    store = Store(path)
    assert store.last_judged() == {("n1", "gemm"): 20.0}
