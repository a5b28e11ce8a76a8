"""Hard faults on the real Slurm test cluster (``scripts/slurm-test-cluster.sh``), issue 13.

Real NCCL-probe pairs (gloo on CPU) under sbatch/srun. ``HEALTHD_PROBE_FAULT=hang@node2`` makes
node2's first rank stop in the measurement phase (as a TaskProlog delivering the fault to that
node only would): the probe's own diagnosis names node2, the collector makes the run node2's
``fail`` (``hang``), the judge asks for a re-probe with a known-good partner through the real
planner, confirms it, and enforce mode drains node2, never its partner, with a ``healthd: hang``
reason. A results directory the jobs cannot reach (gone after the submit, as a lost NFS mount would
be) leads to ``error`` runs and no recommendation.
"""

from __future__ import annotations

import shutil
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from healthd.cluster.slurm import SlurmBackend
from healthd.collector import Collected, Collector
from healthd.config import JudgeSettings, ProbeSettings, RemediationSettings
from healthd.jobs import LaunchSettings
from healthd.judge.engine import Judge
from healthd.judge.model import JudgeOutput
from healthd.judge.persist import judge_collected
from healthd.model import Outcome, ProbeJob, RunKind
from healthd.planning import PlanLimits, new_run_id, plan
from healthd.remediation import Remediator
from healthd.store import Store
from tests.integration.conftest import FAKE_GPU_CLASSES, SlurmTestCluster, wait_for

pytestmark = [pytest.mark.slurm, pytest.mark.slow]
ARGS = ("--sizes", "64K", "--warmup", "1", "--iters", "3")
TIMEOUT_S = 30.0
"""Each pair job's ``timeout_s``: a hung rank is named at its watchdog, ``TIMEOUT_S`` less its margin (25.5 s), twice
(the run and its re-probe); a healthy pair of these sizes takes 3-10 s on a loaded 2-core host."""
PROBES = {"nccl": ProbeSettings(interval_s=3600.0, timeout_s=TIMEOUT_S, nodes_per_job=2, args=list(ARGS))}


class Rig:
    def __init__(self, cluster: SlurmTestCluster, tmp_path: Path, *, fault: str = "") -> None:
        self.results = tmp_path / "results"
        env = (("HEALTHD_PROBE_FAULT", fault),) if fault else ()
        self.backend = SlurmBackend(cluster.cli(), LaunchSettings(python=sys.executable, results_dir=self.results,
                                                                  env=env), node_classes=FAKE_GPU_CLASSES)
        self.store = Store(tmp_path / "s.sqlite")
        self.judge = Judge(JudgeSettings())
        self.remediator = Remediator(self.store, self.backend, RemediationSettings(mode="enforce"))
        self.cluster = cluster

    def run(self, jobs: Sequence[ProbeJob], *, lose_results: bool = False) -> tuple[list[Collected], JudgeOutput]:
        collector = Collector(self.store, self.backend, self.results)
        for job in jobs:
            assert collector.launch(job) is not None
        if lose_results:
            shutil.rmtree(self.results)
            self.results.write_text("not a directory any more")
        done: list[Collected] = []

        def finished() -> bool:
            done.extend(collector.collect())
            return len(done) == len(jobs)

        wait_for(finished, 180, f"{len(jobs)} nccl job(s)")
        return done, judge_collected(self.judge, self.store, done, now=time.time())

    def pairs(self, *pairs: tuple[str, str], lose_results: bool = False) -> tuple[list[Collected], JudgeOutput]:
        self.store.upsert_nodes(self.backend.list_nodes(), time.time())
        return self.run([ProbeJob(new_run_id(), "nccl", pair, args=ARGS, timeout_s=TIMEOUT_S) for pair in pairs],
                        lose_results=lose_results)

    def reprobes(self) -> tuple[list[Collected], JudgeOutput]:
        nodes = self.backend.list_nodes()
        now = time.time()
        self.store.upsert_nodes(nodes, now)
        requests = self.judge.requests(now, PROBES)
        jobs = plan(nodes, probes=PROBES, last_attempts={(n.name, "nccl"): now for n in nodes}, busy_nodes=(),
                    in_flight=0, now=now, limits=PlanLimits(max_idle_share=1.0), priority=requests)
        assert jobs and all(j.kind is RunKind.REPROBE for j in jobs)
        return self.run(jobs)

    def node(self, name: str) -> tuple[bool, str | None]:
        n = self.cluster.cli().node(name)
        return n.drained, n.reason


def test_a_hang_on_one_node_is_confirmed_and_drained_with_its_reason(cluster: SlurmTestCluster,
                                                                      tmp_path: Path) -> None:
    rig = Rig(cluster, tmp_path, fault="hang@node2")
    done, out = rig.pairs(("node1", "node2"), ("node3", "node4"))
    hung = next(c for c in done if "node2" in c.nodes)
    assert hung.outcome is Outcome.FAIL and hung.reason.startswith("hang on node2: "), hung.reason
    assert rig.judge.verdicts[("node2", "nccl")].reason_code == "hang"
    assert rig.judge.verdicts[("node1", "nccl")].outcome is Outcome.PASS  # the partner is not blamed
    assert rig.remediator.apply(out) == []  # one run: a re-probe, not a drain

    done, out = rig.reprobes()  # node2 with a known-good partner (node1, node3 or node4)
    assert [c.outcome for c in done] == [Outcome.FAIL]
    assert [(r.node, str(r.reason_code)) for r in out.recommendations] == [("node2", "hang")]
    actions = rig.remediator.apply(out)
    assert ("drain", "node2", "done") in [(a.action, a.node, a.result) for a in actions]
    drained, reason = rig.node("node2")
    assert drained and reason is not None and reason.startswith("healthd: hang nccl run rp"), reason
    assert [n for n in ("node1", "node3", "node4") if rig.node(n)[0]] == []


def test_an_unreachable_results_directory_recommends_nothing(cluster: SlurmTestCluster, tmp_path: Path) -> None:
    rig = Rig(cluster, tmp_path)
    for _ in range(3):
        if rig.results.is_file():
            rig.results.unlink()
        done, out = rig.pairs(("node1", "node2"), lose_results=True)
        assert [c.outcome for c in done] == [Outcome.ERROR], [c.reason for c in done]
        assert out.recommendations == [] and rig.remediator.apply(out) == []
    assert rig.judge.verdicts[("node1", "nccl")].outcome is Outcome.ERROR
    assert (rig.node("node1")[0], rig.node("node2")[0]) == (False, False)
