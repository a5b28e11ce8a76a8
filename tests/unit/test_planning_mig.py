"""MIG is context, not a fault: on a node whose GPUs are MIG instances the planner skips the whole-GPU probes
(GEMM, NCCL, ...) with the reason, the collector records them ``skipped`` without submitting anything, and the
judge sees nothing of them; ``env`` still runs, and the other nodes are planned as before."""

from __future__ import annotations

import itertools
from pathlib import Path

from healthd.cluster.local import LocalBackend
from healthd.collector import Collector
from healthd.config import ProbeSettings
from healthd.model import Node, Outcome
from healthd.planning import PlanLimits, mig_skip, plan
from healthd.store import Store

PROBES = {"env": ProbeSettings(interval_s=100.0), "gemm": ProbeSettings(interval_s=100.0),
          "nccl": ProbeSettings(interval_s=100.0, nodes_per_job=2)}


def nodes() -> list[Node]:
    return [Node("mig1", "idle", gpus=7, gpu_type="nvidia_a100_1g.10gb", node_class="a100mig"),
            Node("mig2", "idle", gpus=2, gpu_type="h100", features=("mig",), node_class="h100x2"),
            *(Node(f"g{i}", "idle", gpus=8, gpu_type="h100", node_class="h100x8") for i in range(2))]


def test_mig_nodes_are_recognised_from_their_gres_or_feature() -> None:
    mig1, mig2, g0, _ = nodes()
    assert mig_skip(mig1) is not None and "1g.10gb" in str(mig_skip(mig1))
    assert mig_skip(mig2) is not None and mig_skip(g0) is None
    assert mig_skip(Node("x", "idle", gpus=8, gpu_type="nvidia_h100_80gb_hbm3")) is None


def test_whole_gpu_probes_are_skipped_with_the_reason_and_env_still_runs(tmp_path: Path) -> None:
    count = itertools.count()
    jobs = plan(nodes(), probes=PROBES, last_attempts={}, busy_nodes=(), in_flight=0, now=1000.0,
                limits=PlanLimits(max_jobs_in_flight=20), make_run_id=lambda: f"r{next(count):03d}", combine=True)
    skipped = sorted((j.probe, j.nodes) for j in jobs if j.skip)
    assert skipped == [("gemm", ("mig1",)), ("gemm", ("mig2",)), ("nccl", ("mig1",)), ("nccl", ("mig2",))]
    assert all(j.skip.startswith("mig_enabled: ") for j in jobs if j.skip)
    run = {(j.nodes, tuple(r.probe for r in j.runs)) for j in jobs if not j.skip}
    assert run == {(("g0",), ("env", "gemm")), (("g1",), ("env", "gemm")), (("mig1",), ("env",)),
                   (("mig2",), ("env",))}  # a MIG node's check job does not take GEMM along

    store = Store(tmp_path / "s.sqlite")
    collector = Collector(store, LocalBackend(node_name="here", python=Path("/nonexistent/python")),
                          tmp_path / "results")
    for j in (j for j in jobs if j.skip):
        assert collector.launch(j) is None
    rows = {(r.probe, r.nodes[0]): r for r in store.recent_runs(limit=20)}
    assert rows[("gemm", "mig1")].outcome is Outcome.SKIPPED
    assert rows[("gemm", "mig1")].reason.startswith("mig_enabled: ")
    assert store.unfinished_runs() == [] and collector.collect() == []  # nothing submitted, nothing to judge
    last = store.last_attempts()
    again = plan(nodes(), probes=PROBES, last_attempts=last, busy_nodes=(), in_flight=0, now=1050.0,
                 limits=PlanLimits(max_jobs_in_flight=20), make_run_id=lambda: f"s{next(count):03d}")
    assert not [j for j in again if j.skip]  # due again only after its interval
