"""Job ends without the node check's document (``healthd.node_check_watch``): the watch on its own, then in the
daemon over the fake Slurm client (named a fake: node states set by the test) with a real node check document
(``probes.boundary``) collected for one node and none for the other."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import generate_latest

import healthd.daemon
from healthd.config import Settings
from healthd.daemon import Daemon
from healthd.model import Node
from healthd.node_check_watch import JobEndWatch
from tests.fakes.slurm import FakeSlurmClient, fake_backend, gpu_node
from tests.unit.test_collect_boundary import write_check


def node(name: str, state: str, flags: frozenset[str] = frozenset()) -> Node:
    return Node(name=name, state=state, flags=flags)


def test_a_job_end_with_its_document_is_not_counted() -> None:
    watch = JobEndWatch(grace_s=60)
    assert watch.see([node("a", "allocated"), node("b", "idle")], 100) == []
    assert watch.see([node("a", "idle"), node("b", "idle")], 160) == ["a"]
    assert watch.settle({"a": 150.0}, 170) == [] and watch.ended == {}
    assert watch.missed == {}


def test_a_job_end_without_a_document_counts_after_the_grace_only() -> None:
    watch = JobEndWatch(grace_s=60)
    watch.see([node("a", "mixed")], 100)
    watch.see([node("a", "idle")], 160)
    assert watch.settle({"a": 99.0}, 200) == []  # a document from before the job: not its end's
    assert watch.settle({"a": 99.0}, 221) == ["a"] and watch.missed == {"a": 1}
    watch.see([node("a", "idle", frozenset({"COMPLETING"}))], 300)
    watch.see([node("a", "allocated")], 360)  # the next job: the end seen at 300 awaits its document
    watch.see([node("a", "idle")], 420)
    assert watch.ended == {"a": (360, 420)}
    assert watch.settle({}, 481) == ["a"] and watch.missed == {"a": 2}


def test_a_node_never_seen_busy_owes_nothing() -> None:
    watch = JobEndWatch(grace_s=0)
    assert watch.see([node("a", "idle"), node("b", "down")], 100) == []
    assert watch.settle({}, 1000) == []


@pytest.fixture
def daemon(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Daemon, FakeSlurmClient]]:
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))  # no nvidia-smi: the check's GPU listing is given
    monkeypatch.setattr(healthd.daemon, "JOB_END_SLACK_S", 0.0)
    fake = FakeSlurmClient([gpu_node("gpu01"), gpu_node("gpu02")])
    settings = Settings(backend="slurm", state_dir=tmp_path / "state", http={"host": "127.0.0.1", "port": 0},
                        node_check={"epilog_budget_s": 0.05}, scheduler={"collect_interval_s": 0.05})
    d = Daemon(settings, None, backend=fake_backend(fake, settings.results_dir))
    yield d, fake
    d.http._server.server_close()
    d.store.close()


def states(fake: FakeSlurmClient, state: str) -> None:
    for name, n in list(fake.node_map.items()):
        fake.node_map[name] = Node(**{**n.__dict__, "state": state})


def test_the_daemon_counts_and_exports_missed_job_ends(daemon: tuple[Daemon, FakeSlurmClient]) -> None:
    d, fake = daemon
    d.discover()
    states(fake, "allocated")
    d.discover()
    states(fake, "idle")
    d.discover()
    write_check(d.settings.results_dir, node="gpu01", job=77)  # gpu01's Epilog ran the check; gpu02's did not
    d.collect()
    time.sleep(0.3)
    d.discover()
    assert d.job_ends.missed == {"gpu02": 1}
    text = generate_latest(d.registry).decode()
    assert 'healthd_node_check_missed_total{node="gpu02"} 1.0' in text
    assert 'node="gpu01"' not in text.split("healthd_node_check_missed_total", 1)[1].split("# HELP", 1)[0]
