"""On-demand probing (``healthd probe NAME --node N``): the refusal rules (pure), the planning of
requests, and the daemon's plan tick settling requests over ``FakeSlurmClient``. On a real
cluster: tests/integration/test_daemon_slurm.py::test_probe_on_demand."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from healthd.commands.probe import format_report, request_report, requested_nodes
from healthd.config import ProbeSettings, Settings
from healthd.daemon import Daemon
from healthd.errors import InvalidNodeName
from healthd.model import JobState, Node, RunKind
from healthd.planning import PlanLimits, PriorityRequest, plan_requests, why_refused
from tests.fakes.slurm import FakeSlurmClient, fake_backend, gpu_node

PREFIX = "healthd:"


def refused(node: Node | None, limits: PlanLimits | None = None, held: bool = False,
            jobs_on_drained: bool = True) -> str | None:
    return why_refused(node, reason_prefix=PREFIX, limits=limits or PlanLimits(), held_by_healthd=held,
                       jobs_on_drained=jobs_on_drained)


def test_idle_nodes_and_healthds_own_drains_may_be_probed() -> None:
    assert refused(Node("a", "idle")) is None
    assert refused(Node("a", "idle", frozenset({"DRAIN"}), reason="healthd: below_floor gemm")) is None
    assert refused(Node("a", "drained", frozenset({"DRAIN"}), reason="healthd: manual")) is None
    # plain Slurm starts no job on a drained node: said, not left to pend
    why = refused(Node("a", "idle", frozenset({"DRAIN"}), reason="healthd: manual"), jobs_on_drained=False)
    assert why is not None and why.startswith("drained by healthd (healthd: manual), and this cluster starts no job")
    assert "`healthd undrain a` first" in why


def test_busy_nodes_are_refused_unless_healthd_holds_them() -> None:
    for state in ("allocated", "mixed", "completing"):
        assert refused(Node("a", state)) == f"busy: {state}, a job runs on it"
    assert refused(Node("a", "idle", frozenset({"COMPLETING"}))) == "busy: idle, a job runs on it"
    assert refused(Node("a", "draining", frozenset({"DRAIN"}), reason="healthd: x")) == \
        "busy: draining, a job runs on it"
    assert refused(Node("a", "allocated"), held=True) is None  # healthd's own probe: the request waits


def test_nodes_drained_by_someone_else_are_refused_with_their_reason() -> None:
    assert refused(Node("a", "idle", frozenset({"DRAIN"}), reason="NHC: ib0 down")) == \
        "drained by someone else (reason: NHC: ib0 down)"
    assert refused(Node("a", "drained", frozenset({"DRAIN"}))) == "drained by someone else (reason: none given)"
    assert refused(Node("a", "drained", frozenset({"DRAIN"}), reason="hw: fan"), held=True) is not None


def test_unknown_down_excluded_and_foreign_partitions_are_refused() -> None:
    assert refused(None) == "not a node of the cluster"
    assert refused(Node("a", "down")) == "not probeable: state down"
    assert refused(Node("a", "idle", frozenset({"NOT_RESPONDING"}))) == "not probeable: flags NOT_RESPONDING"
    assert refused(Node("a", "idle"), PlanLimits(exclude=frozenset({"a"}))) == "not probeable: excluded by config"
    assert refused(Node("a", "idle", partitions=("cpu",)), PlanLimits(partitions=frozenset({"gpu"}))) == \
        "not probeable: not in a probed partition"


def test_plan_requests_one_job_each_partners_for_pairs_and_waits() -> None:
    nodes = [Node(n, "idle") for n in ("a", "b", "c")] + [
        Node("d", "idle", frozenset({"DRAIN"}), reason="healthd: x")]
    probes = {"gemm": ProbeSettings(enabled=False), "nccl": ProbeSettings(nodes_per_job=2)}
    ids = iter(range(100))
    jobs = plan_requests(nodes, [PriorityRequest("gemm", ("a",)), PriorityRequest("gemm", ("a",)),
                                 PriorityRequest("nccl", ("d",), partners=("a", "b", "c"), allow_drained=True),
                                 PriorityRequest("ddp", ("c",))],
                         probes=probes, busy_nodes={"c"}, limits=PlanLimits(), make_run_id=lambda: f"r{next(ids)}")
    assert [(j.probe, j.nodes, j.kind) if j else None for j in jobs] == [
        ("gemm", ("a",), RunKind.PROBE),  # a disabled probe still runs on demand
        None,  # the node is taken by the first request
        ("nccl", ("d", "b"), RunKind.REPROBE),  # a recheck of healthd's own drain, with a free partner
        None,  # busy: waits
    ]


def test_requested_nodes_expand_hostlists_and_check_names() -> None:
    assert requested_nodes(["x1"], "gpu[01-03],x1") == ["x1", "gpu01", "gpu02", "gpu03"]
    with pytest.raises(InvalidNodeName):
        requested_nodes(["bad name"], "")


@pytest.fixture
def fake() -> FakeSlurmClient:
    return FakeSlurmClient([gpu_node(f"n{i}") for i in range(1, 7)])


@pytest.fixture
def daemon(fake: FakeSlurmClient, tmp_path: Path) -> Iterator[Daemon]:
    settings = Settings(backend="slurm", state_dir=tmp_path / "state", http={"host": "127.0.0.1", "port": 0},
                        probes={"gemm": {"interval_s": 600.0, "timeout_s": 120.0}, "nccl": {"enabled": False}},
                        slurm={"max_idle_share": 1.0, "max_concurrent_jobs": 1}, scheduler={"plan_interval_s": 0.05},
                        budget={"max_gpu_hours_per_day": 0.001})
    d = Daemon(settings, None, backend=fake_backend(fake, settings.results_dir))
    yield d
    d.http._server.server_close()
    d.store.close()


def test_the_plan_tick_settles_requests(daemon: Daemon, fake: FakeSlurmClient) -> None:
    fake.occupy("n1")
    fake.admin_drain("n2", "hw: fan")
    fake.admin_drain("n3", "healthd: manual replaced GPU")
    ids = daemon.store.add_probe_requests("gemm", ["n1", "n2", "n3", "n4", "n5", "n9"], at=time.time(), by="admin")
    daemon.plan_and_launch()
    rows = {r.node: r for r in daemon.store.probe_requests(ids)}
    assert {n: (r.state, r.detail) for n, r in rows.items()} == {
        "n1": ("refused", "busy: allocated, a job runs on it"),
        "n2": ("refused", "drained by someone else (reason: hw: fan)"),
        "n3": ("launched", ""),  # healthd's own drain: rechecked in its reservation
        "n4": ("launched", ""),
        "n5": ("launched", ""),
        "n9": ("refused", "not a node of the cluster"),
    }
    # launched past the in-flight cap of 1 and a budget they exceed; the regular probe of idle n6 waits
    assert sorted(n for j in fake.jobs_by_id.values() for n in j.nodes) == ["n3", "n4", "n5"]
    assert fake.reservations["healthd_recheck"].nodes == ("n3",) and not fake.node_map["n3"].drained
    assert daemon.store.probe_requests() == []
    for job in fake.start_all():
        fake.finish(job.job_id, JobState.COMPLETED)
    daemon.collect()
    report = [request_report(daemon.store, r) for r in daemon.store.probe_requests(ids)]
    by_node = {r["node"]: r for r in report}
    assert by_node["n4"]["run_id"] == rows["n4"].run_id and by_node["n4"]["outcome"] == "error"
    assert by_node["n4"]["verdict"] is not None
    text = format_report(report)
    assert "n2 gemm: refused: drained by someone else (reason: hw: fan)" in text
    assert f"run {rows['n4'].run_id}" in text


def test_a_request_for_a_node_healthd_is_probing_waits(daemon: Daemon, fake: FakeSlurmClient) -> None:
    daemon.settings = daemon.settings.model_copy(update={"budget": Settings().budget})
    daemon.plan_and_launch()  # the regular probe takes one node (cap 1)
    (job,) = fake.jobs_by_id.values()
    fake.start(job.job_id)
    (node,) = job.nodes
    (rid,) = daemon.store.add_probe_requests("gemm", [node], at=time.time(), by="admin")
    daemon.plan_and_launch()
    (row,) = daemon.store.probe_requests([rid])
    assert row.state == "pending" and row.seen_at is not None
    fake.finish(job.job_id)
    daemon.collect()
    daemon.plan_and_launch()
    (row,) = daemon.store.probe_requests([rid])
    assert row.state == "launched"


def test_cli_without_a_store_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from healthd.cli import main

    config = tmp_path / "h.toml"
    config.write_text(f'backend = "local"\nstate_dir = "{tmp_path / "none"}"\n')
    assert main(["probe", "gemm", "--node", "n1", "--config", str(config)]) == 1
    assert "no store at" in capsys.readouterr().err


def test_settled_requests_are_pruned_pending_ones_kept(tmp_path: Path) -> None:
    from healthd.store import Store

    store = Store(tmp_path / "s.sqlite")
    old, pending = store.add_probe_requests("gemm", ["a", "b"], at=100.0, by="admin")
    assert store.settle_probe_request(old, "refused", at=101.0, detail="busy")
    assert not store.settle_probe_request(old, "launched", at=102.0, run_id="r1")  # settled once
    assert store.prune_probe_requests(1000.0) == 1
    assert [r.id for r in store.probe_requests()] == [pending]
    store.close()
