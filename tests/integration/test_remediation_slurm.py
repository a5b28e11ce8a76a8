"""Remediation in ``enforce`` mode against the real Slurm test cluster (``scripts/slurm-test-cluster.sh``).

Real probe jobs (``python -m probes gemm`` under sbatch, at a small size: these tests are about outcomes,
drains and undrains, not figures); a node's probe is made to fail with the probes' own fault injection
(``HEALTHD_PROBE_FAULT=corrupt:0``: wrong data). The confirmation
re-probe goes through the real planner; drains and undrains through the real ``scontrol``.
"""

from __future__ import annotations

import subprocess
import sys
import time
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
from healthd.parsers.healthd_json import parse_result
from healthd.planning import PlanLimits, new_run_id, plan
from healthd.remediation import Remediator
from healthd.store import Store
from tests.integration.conftest import FAKE_GPU_CLASSES, SlurmTestCluster, wait_for

pytestmark = [pytest.mark.slurm, pytest.mark.slow]
GEMM_ARGS = ("--size", "256", "--dtypes", "fp32", "--copy-bytes", "4M")
"""A small GEMM (the CPU default is 1024, fp32 and bf16, a 64 MiB copy): the same validated result and checks,
about 2 s less a run."""
PROBES = {"gemm": ProbeSettings(interval_s=3600.0, timeout_s=120.0, args=list(GEMM_ARGS))}


class Rig:
    def __init__(self, cluster: SlurmTestCluster, tmp_path: Path, **remediation: object) -> None:
        self.cluster = cluster
        self.results = tmp_path / "results"
        self.good = SlurmBackend(cluster.cli(), LaunchSettings(python=sys.executable, results_dir=self.results),
                                 node_classes=FAKE_GPU_CLASSES)
        self.bad = SlurmBackend(cluster.cli(), LaunchSettings(python=sys.executable, results_dir=self.results,
                                                             env=(("HEALTHD_PROBE_FAULT", "corrupt:0"),)),
                                node_classes=FAKE_GPU_CLASSES)
        self.store = Store(tmp_path / "s.sqlite")
        self.judge = Judge(JudgeSettings())
        settings = RemediationSettings(mode="enforce", **remediation)
        self.remediator = Remediator(self.store, self.good, settings)

    def probe(self, node: str, *, faulty: bool, priority: bool = False) -> JudgeOutput:
        """Run gemm on ``node`` as a Slurm job (a re-probe from the judge's request through the real
        planner when ``priority``), collect it and judge it; remediation is left to the caller."""
        backend = self.bad if faulty else self.good
        nodes = backend.list_nodes()
        now = time.time()
        self.store.upsert_nodes(nodes, now)
        if priority:
            requests = self.judge.requests(now, PROBES)
            assert [r.nodes for r in requests] == [(node,)]
            (job,) = plan(nodes, probes=PROBES, last_attempts={(n.name, "gemm"): now for n in nodes},
                          busy_nodes=(), in_flight=0, now=now, limits=PlanLimits(), priority=requests)
            assert job.kind is RunKind.REPROBE and job.nodes == (node,)
        else:
            job = ProbeJob(new_run_id(), "gemm", (node,), args=GEMM_ARGS, timeout_s=120.0)
        collector = Collector(self.store, backend, self.results)
        assert collector.launch(job) is not None
        done = wait_for(collector.collect, 150, f"the gemm job on {node}")
        return judge_collected(self.judge, self.store, done, now=time.time())  # type: ignore[arg-type]

    def node(self, name: str) -> tuple[bool, str | None]:
        n = self.cluster.cli().node(name)
        return n.drained, n.reason


def test_a_failing_probe_is_confirmed_then_drained_and_undrained_after_passes(
    cluster: SlurmTestCluster, tmp_path: Path
) -> None:
    rig = Rig(cluster, tmp_path, undrain_after_passes=2)
    out = rig.probe("node3", faulty=True)
    verdict = rig.judge.verdicts[("node3", "gemm")]
    assert (verdict.outcome, verdict.reason_code) == (Outcome.DEGRADED, "check_failed")
    assert rig.remediator.apply(out) == []  # one bad run: re-probe, no drain
    assert rig.node("node3") == (False, None)

    out = rig.probe("node3", faulty=True, priority=True)
    assert rig.judge.verdicts[("node3", "gemm")].outcome is Outcome.FAIL
    actions = rig.remediator.apply(out)
    assert [(a.action, a.node, a.result) for a in actions] == [("recommend", "node3", "info"),
                                                               ("drain", "node3", "done")]
    drained, reason = rig.node("node3")
    assert drained and reason is not None
    assert reason.startswith("healthd: check_failed gemm gpu 0 check:gemm.")
    assert reason.endswith(f"run {out.recommendations[0].evidence['run_ids'][-1]}")  # type: ignore[index]

    # repaired. Slurm runs no job on a drained node, so the passes come from the probe run on the node
    # by hand and stored like `healthd ingest` does; healthd undrains its own drain after two of them.
    for _ in range(2):
        probe = subprocess.run([sys.executable, "-m", "probes", "gemm", "--timeout", "60", *GEMM_ARGS],
                               capture_output=True, text=True, timeout=120, check=False,
                               env={**cluster.env, "SLURMD_NODENAME": "node3"})
        result = parse_result(probe.stdout)
        assert result.outcome is Outcome.PASS, probe.stderr[-2000:]
        run_id = rig.store.record_result(result, nodes=["node3"], backend="slurm", source="ingest",
                                         result_path=None)
        out = judge_collected(rig.judge, rig.store, [Collected(run_id, "gemm", ("node3",), Outcome.PASS, "", result)],
                              now=time.time())
        actions = rig.remediator.apply(out)
    assert ("undrain", "node3", "done") in [(a.action, a.node, a.result) for a in actions]
    assert rig.node("node3") == (False, None)
    assert [(a.action, a.result) for a in rig.store.audit()][:2] == [("undrain", "done"), ("clear", "info")]


def test_a_node_drained_by_someone_else_is_left_alone(cluster: SlurmTestCluster, tmp_path: Path) -> None:
    rig = Rig(cluster, tmp_path)
    rig.probe("node2", faulty=True)
    out = rig.probe("node2", faulty=True, priority=True)
    assert [r.node for r in out.recommendations] == ["node2"]
    admin = cluster.command("scontrol", "update", "nodename=node2", "state=drain", "reason=hw: bad PSU ticket 42")
    assert admin.returncode == 0, admin.stderr
    actions = rig.remediator.apply(out)
    assert ("drain", "node2", "refused") in [(a.action, a.node, a.result) for a in actions]
    assert rig.node("node2") == (True, "hw: bad PSU ticket 42")
    undrain = rig.remediator.undrain("node2", actor="operator:test")
    assert (undrain.result, undrain.reason) == ("refused", "drained by someone else (reason: 'hw: bad PSU ticket 42');"
                                                           " not undraining")
    assert rig.node("node2") == (True, "hw: bad PSU ticket 42")


def reservation(cluster: SlurmTestCluster) -> str:
    shown = cluster.command("scontrol", "--oneliner", "show", "reservation", "healthd_recheck")
    return shown.stdout.strip() if shown.returncode == 0 else ""


@pytest.mark.slurm_release  # drain, reservation create/delete, lift and re-drain, undrain: every scontrol path
def test_own_drain_rechecked_in_healthds_reservation_then_undrained_after_passes(
    cluster: SlurmTestCluster, tmp_path: Path
) -> None:
    """The whole way on a plain cluster: drained for a fault, the fault removed, each recheck lifts the drain
    while node3 sits in healthd's reservation (a user's job waits), drains it again with its reason, and
    after two passes healthd undrains node3 and its reservation is gone; node5, drained by an admin, and
    the admin's reservation are never touched."""
    admin = cluster.command("scontrol", "update", "nodename=node5", "state=drain", "reason=hw: bad PSU ticket 42")
    assert admin.returncode == 0, admin.stderr
    made = cluster.command("scontrol", "create", "reservation", "ReservationName=hd_test", "Users=root",
                           "Nodes=node4", "StartTime=now", "Duration=60")
    assert made.returncode == 0, made.stderr
    rig = Rig(cluster, tmp_path, undrain_after_passes=2, recheck_drained=True)
    rig.probe("node3", faulty=True)
    out = rig.probe("node3", faulty=True, priority=True)
    assert ("drain", "node3", "done") in [(a.action, a.node, a.result) for a in rig.remediator.apply(out)]
    drained, reason = rig.node("node3")
    assert drained and reason is not None and reason.startswith("healthd: check_failed gemm")
    assert rig.remediator.recheck_nodes() == {"node3": ("gemm",)}

    actions = []
    for attempt in range(2):
        nodes = rig.good.list_nodes()
        now = time.time()
        requests = rig.judge.priority_requests(rig.remediator.recheck_nodes(), PROBES, {}, now)
        assert [(r.nodes, r.allow_drained) for r in requests] == [(("node3",), True)]
        (job,) = plan(nodes, probes=PROBES, last_attempts={(n.name, "gemm"): now for n in nodes}, busy_nodes=(),
                      in_flight=0, now=now, limits=PlanLimits(), priority=requests)
        assert job.kind is RunKind.REPROBE and job.nodes == ("node3",)
        collector = Collector(rig.store, rig.good, rig.results)
        assert collector.launch(job) is not None
        assert "Nodes=node3 " in reservation(cluster) and "Users=root" in reservation(cluster)
        user = cluster.command("sbatch", "--parsable", "-w", "node3", "-t", "1", "--wrap", "sleep 1")
        assert user.returncode == 0, user.stderr
        done = wait_for(collector.collect, 150, f"recheck {attempt + 1} on node3")
        assert [c.outcome for c in done] == [Outcome.PASS]  # type: ignore[attr-defined]
        state = cluster.command("squeue", "-h", "-j", user.stdout.strip(), "-o", "%T").stdout.strip()
        assert state == "PENDING", f"a user's job ran on node3 during healthd's recheck: {state}"
        cluster.command("scancel", user.stdout.strip())
        if attempt == 0:
            assert rig.node("node3") == (True, reason)  # drained again with its reason between rechecks
            assert reservation(cluster) == ""
        out = judge_collected(rig.judge, rig.store, done, now=time.time())  # type: ignore[arg-type]
        actions = rig.remediator.apply(out)
    assert ("undrain", "node3", "done") in [(a.action, a.node, a.result) for a in actions]
    assert rig.node("node3") == (False, None)
    assert reservation(cluster) == ""
    assert rig.remediator.recheck_nodes() == {}
    assert rig.node("node5") == (True, "hw: bad PSU ticket 42")
    assert "Nodes=node4 " in cluster.command("scontrol", "-o", "show", "reservation", "hd_test").stdout
    assert list(rig.results.glob("*.lift.json")) == []
