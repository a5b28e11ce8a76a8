"""The daemon's collect step for boundary documents (``healthd.collector.collect_boundary``): documents the
real node check (``probes.boundary``) wrote are stored as runs of kind ``boundary`` and judged; hostile
files are refused and moved aside, each file is taken once."""

from __future__ import annotations

import json
import os
import sqlite3
import sys
import time
from pathlib import Path

import pytest

import probes.boundary as b
from healthd.cluster.local import LocalBackend
from healthd.collector import (
    BOUNDARY_DONE,
    BOUNDARY_REFUSED,
    Collector,
    boundary_failures,
    boundary_name,
    collect_boundary,
    prune_boundary_files,
)
from healthd.config import JudgeSettings
from healthd.judge.persist import judge_runs, load_judge, run_from_collected
from healthd.model import Node, Outcome, RunKind
from healthd.store import Store
from healthd.store.schema import MIGRATIONS, SCHEMA_VERSION
from probes.gpus import NodeGpu

UUIDS = [f"GPU-{i}a1b2c3d-0000-1111-2222-33334444555{i}" for i in range(4)]


def make(tmp_path: Path) -> tuple[Collector, Store, list[str]]:
    store = Store(tmp_path / "s.sqlite")
    errors: list[str] = []
    results = tmp_path / "results"
    results.mkdir(mode=0o750)
    collector = Collector(store, LocalBackend(node_name="here", python=Path(sys.executable)), results,
                          on_error=errors.append)
    return collector, store, errors


def write_check(directory: Path, *, node: str = "gpu01", context: b.Context = "epilog", job: int | None = 77,
                gpus: int = 4, started_at: float | None = None) -> Path:
    """The real node check's checks and document, with a fake GPU listing of ``gpus`` H100s (NVML's place)."""
    (directory.parent / "proc").mkdir(exist_ok=True)
    s = b.Setup(context=context, node=node, job_id=job, job_uid=None, expect_gpus=4, expect_uuids=tuple(UUIDS),
                proc_root=directory.parent / "proc", kmsg=directory.parent / "no-kmsg",
                state_dir=directory.parent / "state", gemm=False,
                nvml=lambda: [NodeGpu(i, UUIDS[i], "NVIDIA H100 80GB HBM3") for i in range(gpus)])
    budget = b.Budget(30.0)
    f = b.run_checks(s, budget)
    started = time.time() - 1 if started_at is None else started_at
    name = b.document_name(node, context, job, started)
    result = b.result_of(s, f, budget, run_id=name, started_at=started)
    return b.write_document(directory, name, result.to_json())


@pytest.fixture(autouse=True)
def no_nvidia_smi(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))


def test_boundary_name_round_trips() -> None:
    name = boundary_name(b.document_name("gpu-a.1", "health", None, 1795000000.123) + ".json")
    assert name is not None
    assert (name.node, name.context, name.job_id, name.ms) == ("gpu-a.1", "health", None, 1795000000123)
    assert boundary_name("boundary-n1-lunch-1-2.json") is None
    assert boundary_name("boundary-n1-epilog-1-2.json.tmp") is None


def test_documents_become_judged_boundary_runs_once(tmp_path: Path) -> None:
    collector, store, errors = make(tmp_path)
    good = write_check(collector.results_dir, node="gpu01")
    bad = write_check(collector.results_dir, node="gpu02", gpus=3)
    done = collect_boundary(collector)
    assert errors == []
    by_node = {c.nodes: c for c in done}
    assert by_node[("gpu01",)].outcome is Outcome.PASS
    assert by_node[("gpu02",)].outcome is Outcome.FAIL
    assert {c.kind for c in done} == {RunKind.BOUNDARY}
    row = store.run(bad.stem)
    assert row is not None and row.kind is RunKind.BOUNDARY and row.job_id == "77" and row.state == "finished"
    assert not good.exists() and (collector.results_dir / BOUNDARY_DONE / good.name).is_file()
    assert collect_boundary(collector) == []
    judge = load_judge(store, JudgeSettings(), now=time.time())
    nodes = [Node(name=n, state="idle", gpus=4) for n in ("gpu01", "gpu02")]
    out = judge_runs(judge, store, [run_from_collected(c, time.time()) for c in done], now=time.time(), nodes=nodes)
    # judged like a probe's check: gpus_missing, held until confirmed (Slurm drained at the epilog's exit 1)
    codes = {v.node: (v.reason_code, v.evidence.get("confirmed")) for v in out.verdicts
             if v.outcome is not Outcome.PASS}
    assert codes == {"gpu02": ("gpus_missing", "1/2")}


def test_a_document_already_stored_is_only_moved(tmp_path: Path) -> None:
    collector, _, _ = make(tmp_path)
    doc = write_check(collector.results_dir)
    kept = doc.read_bytes()
    assert len(collect_boundary(collector)) == 1
    doc.write_bytes(kept)  # the daemon stopped between storing and moving
    os.chmod(doc, 0o644)
    assert collect_boundary(collector) == []
    assert not doc.exists()


def test_bounded_per_tick_oldest_first(tmp_path: Path) -> None:
    collector, _, _ = make(tmp_path)
    now = time.time()
    paths = [write_check(collector.results_dir, job=j, started_at=now - 10 + j) for j in (3, 1, 2)]
    first = collect_boundary(collector, limit=2)
    assert [c.run_id for c in first] == [paths[1].stem, paths[2].stem]
    assert [c.run_id for c in collect_boundary(collector, limit=2)] == [paths[0].stem]


def test_times_clamped_to_now_and_a_checks_span(tmp_path: Path) -> None:
    collector, _, _ = make(tmp_path)
    doc = write_check(collector.results_dir)
    data = json.loads(doc.read_text())
    data.update(started_at=time.time() - 86400, finished_at=time.time() + 86400 * 365)
    doc.write_text(json.dumps(data))
    [c] = collect_boundary(collector)
    assert c.result is not None
    assert c.result.finished_at <= time.time() and c.result.finished_at - c.result.started_at <= 600.0


def hostile(directory: Path, kind: str) -> Path:
    doc = write_check(directory)
    data = json.loads(doc.read_text())
    if kind == "symlink":
        target = directory.parent / "elsewhere.json"
        doc.rename(target)
        doc.symlink_to(target)
    elif kind == "group writable":
        os.chmod(doc, 0o664)
    elif kind == "fifo":
        doc.unlink()
        os.mkfifo(doc)
    elif kind == "other node":
        data["nodes"] = ["gpu99"]
        doc.write_text(json.dumps(data))
    elif kind == "measurement of another node":
        data["measurements"][0]["node"] = "gpu99"
        doc.write_text(json.dumps(data))
    elif kind == "other run id":
        data["run_id"] = "boundary-gpu01-epilog-1-1"
        doc.write_text(json.dumps(data))
    elif kind == "other probe":
        data["probe"] = "gemm"
        doc.write_text(json.dumps(data))
    elif kind == "other context":
        data["params"]["context"] = "prolog"
        doc.write_text(json.dumps(data))
    elif kind == "not json":
        doc.write_text("{not json")
    elif kind == "too big":
        doc.write_text(" " * (64 * 1024 * 1024 + 1))
    return doc


@pytest.mark.parametrize("kind", ["symlink", "group writable", "fifo", "other node", "measurement of another node",
                                  "other run id", "other probe", "other context", "not json", "too big"])
def test_hostile_files_are_refused_and_moved_aside(tmp_path: Path, kind: str) -> None:
    collector, store, errors = make(tmp_path)
    doc = hostile(collector.results_dir, kind)
    started = time.monotonic()
    assert collect_boundary(collector) == []
    assert time.monotonic() - started < 5.0
    assert errors == ["parse"]
    assert store.run(doc.stem) is None
    assert not os.path.lexists(doc) and os.path.lexists(collector.results_dir / BOUNDARY_REFUSED / doc.name)
    assert collect_boundary(collector) == [] and errors == ["parse"]


def test_a_document_of_another_owner_or_an_unknown_node_is_refused(tmp_path: Path) -> None:
    collector, store, errors = make(tmp_path)
    collector.owner = os.geteuid() + 1
    doc = write_check(collector.results_dir)
    assert collect_boundary(collector) == [] and store.run(doc.stem) is None
    collector.owner = os.geteuid()
    doc = write_check(collector.results_dir, node="stranger")
    assert collect_boundary(collector, known=lambda names: {"gpu01"}) == []
    assert errors == ["parse", "parse"]


def test_no_results_directory_yet_is_nothing(tmp_path: Path) -> None:
    collector, _, errors = make(tmp_path)
    collector.results_dir = tmp_path / "missing"
    assert collect_boundary(collector) == [] and errors == []


def test_migration_10_widens_the_run_kinds_and_keeps_the_runs(tmp_path: Path) -> None:
    path = tmp_path / "v9.sqlite"
    db = sqlite3.connect(path)
    for migration in MIGRATIONS[:9]:
        db.executescript(migration)
    db.execute("PRAGMA user_version = 9")
    db.execute("INSERT INTO runs (run_id, probe, backend, state, submitted_at, kind) VALUES"
               " ('old', 'gemm', 'slurm', 'submitted', 1.0, 'probe')")
    db.execute("INSERT INTO run_nodes (run_id, node) VALUES ('old', 'n1')")
    db.commit()
    with pytest.raises(sqlite3.IntegrityError):
        db.execute("INSERT INTO runs (run_id, probe, backend, state, submitted_at, kind) VALUES"
                   " ('b', 'boundary', 'boundary', 'submitted', 1.0, 'boundary')")
    db.close()
    store = Store(path)
    assert store.schema_version == SCHEMA_VERSION
    store.add_run(run_id="b", probe="boundary", nodes=("n1",), backend="boundary", job_id=None, submitted_at=2.0,
                  result_path=None, source="boundary", kind=RunKind.BOUNDARY)
    assert [(r.run_id, r.kind) for r in store.unfinished_runs()] == [("old", RunKind.PROBE), ("b", RunKind.BOUNDARY)]
    store.close()
    db = sqlite3.connect(path)
    with pytest.raises(sqlite3.IntegrityError):  # the CHECK still holds for any other kind
        db.execute("INSERT INTO runs (run_id, probe, backend, state, submitted_at, kind) VALUES"
                   " ('x', 'p', 'b', 'submitted', 1.0, 'bogus')")
    assert db.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
    db.close()


def test_the_daemons_collect_tick_takes_boundary_documents(tmp_path: Path) -> None:
    from healthd.config import Settings
    from healthd.daemon import Daemon
    from tests.fakes.slurm import FakeSlurmClient, fake_backend, gpu_node

    fake = FakeSlurmClient([gpu_node("gpu01", gpus=4), gpu_node("gpu02", gpus=4)])
    settings = Settings(backend="slurm", state_dir=tmp_path / "state", http={"host": "127.0.0.1", "port": 0},
                        probes={"nccl": {"enabled": False}})
    d = Daemon(settings, None, backend=fake_backend(fake, settings.results_dir))
    try:
        d.discover()
        assert b.read_expectation(settings.results_dir / "expect" / "gpu02.json") == (4, ())
        doc = write_check(settings.results_dir, node="gpu02", gpus=3)
        stranger = write_check(settings.results_dir, node="gpu77")
        d.collect()
        row = d.store.run(doc.stem)
        assert row is not None and row.kind is RunKind.BOUNDARY and row.outcome is Outcome.FAIL
        assert d.store.unjudged_runs() == []
        assert d.store.run(stranger.stem) is None
        assert (settings.results_dir / BOUNDARY_REFUSED / stranger.name).exists()
    finally:
        d.http._server.server_close()
        d.store.close()


def test_kept_files_are_pruned_after_the_retention(tmp_path: Path) -> None:
    collector, _, _ = make(tmp_path)
    old, new = (write_check(collector.results_dir, job=j) for j in (1, 2))
    hostile(collector.results_dir, "not json")
    collect_boundary(collector)
    kept = collector.results_dir / BOUNDARY_DONE
    os.utime(kept / old.name, (1.0, 1.0))
    for f in (collector.results_dir / BOUNDARY_REFUSED).iterdir():
        os.utime(f, (1.0, 1.0))
    (kept / "not-ours.txt").write_text("x")
    os.utime(kept / "not-ours.txt", (1.0, 1.0))
    assert prune_boundary_files(collector.results_dir, cutoff=time.time() - 3600) == 2
    assert sorted(p.name for p in kept.iterdir()) == sorted([new.name, "not-ours.txt"])
    assert list((collector.results_dir / BOUNDARY_REFUSED).iterdir()) == []


def test_the_daemon_leaves_each_nodes_expectation_for_the_check(tmp_path: Path) -> None:
    from healthd.boundary import expectation_text, write_expectations

    nodes = [Node(name="gpu01", state="idle", gpus=8, gpu_uuids=tuple(UUIDS)),
             Node(name="cpu01", state="idle", gpus=0), Node(name="odd01", state="idle", gpus=2, expect_gpus=0)]
    written: dict[str, str] = {}
    assert write_expectations(tmp_path, nodes, written) == 3
    assert b.read_expectation(tmp_path / "expect" / "gpu01.json") == (8, tuple(UUIDS))
    assert b.read_expectation(tmp_path / "expect" / "cpu01.json") == (0, ())
    assert b.read_expectation(tmp_path / "expect" / "odd01.json") == (0, ())
    assert oct((tmp_path / "expect" / "gpu01.json").stat().st_mode & 0o777) == "0o644"
    assert write_expectations(tmp_path, nodes, written) == 0  # unchanged: not rewritten
    fewer = [Node(name="gpu01", state="idle", gpus=4)]
    assert write_expectations(tmp_path, fewer, written) == 1
    assert (tmp_path / "expect" / "gpu01.json").read_text() == expectation_text(fewer[0])
    opts = b.options(["--context", "prolog", "--results-dir", str(tmp_path)], {"SLURMD_NODENAME": "gpu01"})
    assert (opts.setup.expect_gpus, opts.setup.expect_uuids) == (4, ())


def test_a_check_ended_by_slurms_time_limit_is_an_error_never_a_drain(tmp_path: Path) -> None:
    """A prolog or epilog that Slurm killed past PrologEpilogTimeout: the document the check wrote on
    SIGTERM (``error``, what it had found dropped) is stored as could-not-check, asks for nothing to
    be taken over and judges to no finding; a document it had no time to start is only a temporary file,
    never collected."""
    collector, store, errors = make(tmp_path)
    opts = b.options(["--context", "epilog", "--results-dir", str(collector.results_dir), "--expect-gpus", "4"],
                     {"SLURMD_NODENAME": "gpu02", "SLURM_JOB_ID": "91"})
    partial = b.Findings(checks=[b.Check(name="env.gpu_count", ok=False, node="gpu02", detail="3 GPU(s) visible")])
    run = b._Run(opts, b.Budget(30.0, started_ago=12.0), time.time() - 12)
    doc = b.terminated_document(run, partial, 15, "errors")
    b.write_document(collector.results_dir, doc.run_id, doc.to_json())
    (collector.results_dir / ".boundary-x.tmp").write_text('{"partial": ')  # a write cut short by SIGKILL
    done = collect_boundary(collector)
    assert errors == [] and [(c.nodes, c.outcome) for c in done] == [(("gpu02",), Outcome.ERROR)]
    assert boundary_failures(done) == []
    judge = load_judge(store, JudgeSettings(), now=time.time())
    out = judge_runs(judge, store, [run_from_collected(c, time.time()) for c in done], now=time.time(),
                     nodes=[Node(name="gpu02", state="drained", gpus=4)])
    assert [(v.node, v.outcome, v.reason_code) for v in out.verdicts] == [("gpu02", Outcome.ERROR, "probe_error")]
    assert out.recommendations == []
    assert (collector.results_dir / ".boundary-x.tmp").exists()
