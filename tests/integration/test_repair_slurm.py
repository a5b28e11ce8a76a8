"""Reboot and validate (``[remediation] repair = "reboot"``) on a real Slurm test cluster whose
``RebootProgram`` is ``scripts/slurm-test-reboot.sh``: it restarts the node's own slurmd with ``-b``, so
slurmctld sees the reboot complete as it would after a real one (slurmd(8)).

The hard fault is ``gpus_missing``: the cluster's GRES ``gpu:tgpu:2`` are no CUDA GPUs, so a gemm job
launched without the rule that expects none (``FAKE_GPU_CLASSES``) finds 0 of 2 GPUs, as a node whose GPU
fell off the bus does. A reboot that cures the node is modelled by the full check being run with that rule
(the "GPU" is back); one that does not, without it. Everything else is real: the confirmation through the
judge, the drain, the reservation, ``scontrol reboot ASAP nextstate=DOWN``, Slurm bringing the node back,
the resume, the recheck lifting the drain in healthd's reservation, the undrain, and ``repair failed``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from healthd.cluster.slurm import SlurmBackend
from healthd.collector import Collector
from healthd.config import JudgeSettings, ProbeSettings, RemediationSettings
from healthd.evidence import evidence_document
from healthd.jobs import LaunchSettings
from healthd.judge.engine import Judge
from healthd.judge.model import JudgeOutput, ReasonCode, RecommendationCandidate
from healthd.judge.persist import judge_collected
from healthd.model import Outcome, ProbeJob, RunKind
from healthd.planning import PlanLimits, new_run_id, plan
from healthd.remediation import Remediator
from healthd.store import Store
from tests.integration.conftest import CLUSTER_SCRIPT, FAKE_GPU_CLASSES, REPO, SlurmTestCluster, wait_for

pytestmark = [pytest.mark.slurm, pytest.mark.slow]
GEMM_ARGS = ("--size", "256", "--dtypes", "fp32", "--copy-bytes", "4M")
PROBES = {"gemm": ProbeSettings(interval_s=3600.0, timeout_s=120.0, args=list(GEMM_ARGS))}
REBOOT_PROGRAM = REPO / "scripts" / "slurm-test-reboot.sh"


@pytest.fixture(scope="module")
def reboot_cluster(slurm_cluster: SlurmTestCluster) -> Iterator[SlurmTestCluster]:
    """A cluster of its own (the release of the session's) with ``RebootProgram`` set."""
    if os.geteuid() != 0:
        pytest.skip("the test cluster's daemons need root")
    base = Path(tempfile.mkdtemp(prefix="hd-rb-", dir="/tmp"))
    ctld = int(slurm_cluster.env.get("HEALTHD_SLURM_CTLD_PORT", "16817")) + 50
    node = int(slurm_cluster.env.get("HEALTHD_SLURM_NODE_PORT", "17001")) + 50
    env = {k: v for k, v in slurm_cluster.env.items() if k not in ("SLURM_CONF", "HEALTHD_SLURM_DIR")}
    env.update(HEALTHD_SLURM_DIR=str(base / "c"), HEALTHD_SLURM_CTLD_PORT=str(ctld),
               HEALTHD_SLURM_NODE_PORT=str(node), HEALTHD_SLURM_NODES="5",
               HEALTHD_SLURM_REBOOT_PROGRAM=str(REBOOT_PROGRAM), SLURM_CONF=str(base / "c" / "etc" / "slurm.conf"))
    started = subprocess.run([str(CLUSTER_SCRIPT), "start"], env=env, capture_output=True, text=True, timeout=120,
                             check=False)
    try:
        assert started.returncode == 0, started.stderr[-2000:]
        yield SlurmTestCluster(base / "c" / "etc" / "slurm.conf", env, base / "c", slurm_cluster.version,
                               tuple(f"node{i}" for i in range(1, 6)))
    finally:
        subprocess.run([str(CLUSTER_SCRIPT), "stop"], env=env, capture_output=True, timeout=60, check=False)
        shutil.rmtree(base, ignore_errors=True)


class Rig:
    def __init__(self, cluster: SlurmTestCluster, tmp_path: Path) -> None:
        self.cluster = cluster
        self.results = tmp_path / "results"
        launch = LaunchSettings(python=sys.executable, results_dir=self.results)
        self.cured = SlurmBackend(cluster.cli(), launch, node_classes=FAKE_GPU_CLASSES)
        self.broken = SlurmBackend(cluster.cli(), launch)  # no rule: 0 of 2 GPUs, gpus_missing
        self.store = Store(tmp_path / "s.sqlite")
        self.judge = Judge(JudgeSettings())
        self.outcomes: list[tuple[tuple[str, ...], Outcome, str]] = []
        self.settings = RemediationSettings(mode="enforce", repair="reboot", repair_on=["gpus_missing"],
                                            recheck_drained=True, undrain_after_passes=2)
        self.remediator = Remediator(self.store, self.cured, self.settings, full_check=("gemm",))

    def run(self, backend: SlurmBackend, job: ProbeJob) -> JudgeOutput:
        collector = Collector(self.store, backend, self.results)
        assert collector.launch(job) is not None
        done = wait_for(collector.collect, 150, f"the gemm job on {job.nodes}")
        self.outcomes = [(c.nodes, c.outcome, c.reason) for c in done]  # type: ignore[attr-defined]
        return judge_collected(self.judge, self.store, done, now=time.time())  # type: ignore[arg-type]

    def confirm_fault(self, node: str) -> JudgeOutput:
        """gemm on ``node`` without its GPUs, then the judge's re-probe through the real planner."""
        self.store.upsert_nodes(self.broken.list_nodes(), time.time())
        self.run(self.broken, ProbeJob(new_run_id(), "gemm", (node,), args=GEMM_ARGS, timeout_s=120.0, expect_gpus=2))
        nodes = self.broken.list_nodes()
        now = time.time()
        requests = self.judge.requests(now, PROBES)
        jobs = plan(nodes, probes=PROBES, last_attempts={(n.name, "gemm"): now for n in nodes}, busy_nodes=(),
                    in_flight=0, now=now, limits=PlanLimits(), priority=requests)
        assert len(jobs) == 1, (requests, [(n.name, n.state, n.flags) for n in nodes])
        (job,) = jobs
        assert job.kind is RunKind.REPROBE and job.nodes == (node,)
        out = self.run(self.broken, job)
        assert [(r.node, str(r.reason_code)) for r in out.recommendations] == [(node, "gpus_missing")]
        return out

    def full_check(self, backend: SlurmBackend, node: str) -> JudgeOutput:
        """The recheck the daemon plans for a node under validation (its last attempts before the validation
        do not count), in healthd's reservation."""
        assert node in self.remediator.validating_since()

        def planned() -> list[ProbeJob]:  # a plan tick; the node may not answer Slurm's pings yet
            nodes = backend.list_nodes()
            now = time.time()
            requests = [r for r in self.judge.priority_requests(self.remediator.recheck_nodes(), PROBES, {}, now)
                        if r.allow_drained]  # (a confirmed finding on an administrator's drain asks too: never planned)
            assert [r.nodes for r in requests] == [(node,)]
            return plan(nodes, probes=PROBES, last_attempts={(n.name, "gemm"): now for n in nodes}, busy_nodes=(),
                        in_flight=0, now=now, limits=PlanLimits(), priority=requests)

        (job,) = wait_for(planned, 60, f"{node} probeable")  # type: ignore[misc]
        return self.run(backend, job)

    def ticks_until(self, node: str, action: tuple[str, str], timeout: float) -> list[tuple[str, str]]:
        """Remediation ticks (every half second) until ``action`` (action, result) on ``node``."""
        seen: list[tuple[str, str]] = []

        def tick() -> bool:
            seen.extend((a.action, a.result) for a in self.remediator.apply(JudgeOutput(at=time.time()))
                        if a.node == node)
            return action in seen

        wait_for(tick, timeout, f"{action} on {node}")
        return seen

    def node(self, name: str) -> tuple[str, str | None]:
        n = self.cluster.cli().node(name)
        return "+".join([n.state, *sorted(n.flags)]), n.reason

    def reservation(self) -> str:
        shown = self.cluster.command("scontrol", "--oneliner", "show", "reservation", "healthd_recheck")
        return shown.stdout.strip() if shown.returncode == 0 else ""


def test_a_hard_fault_is_rebooted_validated_and_returned_to_service_or_left_drained(
    reboot_cluster: SlurmTestCluster, tmp_path: Path
) -> None:
    cluster = reboot_cluster
    rig = Rig(cluster, tmp_path)
    assert rig.cured.reboot_program() == str(REBOOT_PROGRAM)

    admin = cluster.command("scontrol", "update", "nodename=node5", "state=drain", "reason=hw: bad PSU ticket 42")
    assert admin.returncode == 0, admin.stderr

    # node3: the reboot cures it
    out = rig.confirm_fault("node3")
    confirmed = time.time()
    assert ("drain", "node3", "done") in [(a.action, a.node, a.result) for a in rig.remediator.apply(out)]
    assert rig.ticks_until("node3", ("repair", "done"), 30) == [("repair", "done")]
    assert "Nodes=node3 " in rig.reservation()  # held before the reboot: no user's job lands on it after
    seen = rig.ticks_until("node3", ("repair", "info"), 120)  # Slurm rebooted it; resumed and drained again
    rebooted = time.time()
    state, reason = rig.node("node3")
    assert "DRAIN" in state.split("+"), state  # drained again (then out of the reservation)
    assert rig.reservation() == ""
    assert reason == "healthd: repair validating gpus_missing after reboot", seen
    out = rig.full_check(rig.cured, "node3")
    assert [o[:2] for o in rig.outcomes] == [(("node3",), Outcome.PASS)], rig.outcomes
    actions = [(a.action, a.node, a.result) for a in rig.remediator.apply(out)]
    in_service = time.time()
    assert ("undrain", "node3", "done") in actions and ("repair", "node3", "done") in actions
    # back in service (a ping that failed while slurmd restarted may leave NOT_RESPONDING for a few seconds)
    wait_for(lambda: rig.node("node3") == ("idle", None), 30, "node3 idle without a reason")
    assert rig.reservation() == ""
    print(f"\nnode3 ({'.'.join(map(str, cluster.version))}): confirmed hard fault to back in service "
          f"{in_service - confirmed:.1f} s (reboot done after {rebooted - confirmed:.1f} s)")

    # node2: the fault survives the reboot
    out = rig.confirm_fault("node2")
    rig.remediator.apply(out)
    rig.ticks_until("node2", ("repair", "info"), 120)
    out = rig.full_check(rig.broken, "node2")
    actions = [(a.action, a.node, a.result) for a in rig.remediator.apply(out)]
    assert ("repair", "node2", "failed") in actions, actions
    state, reason = rig.node("node2")
    assert "DRAIN" in state and reason is not None
    assert reason.startswith("healthd: repair failed gpus_missing after reboot: gemm gpus_missing in the full check")
    assert rig.remediator.recheck_nodes() == {}  # no recheck, no undrain: left to humans
    assert rig.reservation() == ""
    assert [r.node for r in rig.store.recommendations()] == ["node2"]  # the finding stays...
    for _ in range(3):  # ...but no second reboot within the repeat window
        assert rig.remediator.apply(JudgeOutput(at=time.time())) == []
        time.sleep(0.5)
    assert [(r.node, r.state) for r in rig.store.repairs()] == [("node3", "passed"), ("node2", "failed")]
    assert rig.node("node2")[1] == reason
    assert rig.node("node5") == ("idle+DRAIN", "hw: bad PSU ticket 42")

    # the evidence for node2's ticket, read back read-only from the store all this filled
    reader = Store(rig.store.path, read_only=True)
    try:
        doc = evidence_document(reader, "node2")
    finally:
        reader.close()
    assert [(r["kind"], r["state"], r["reason"]) for r in doc["repairs"]] == [("reboot", "failed", reason)]
    assert [(d["reason"], d["probes"]) for d in doc["drains"]] == [(reason, [])]
    assert [a["action"] for a in doc["audit"]][:4] == ["repair", "repair", "repair", "drain"]
    assert {r["outcome"] for r in doc["runs"]} == {"fail"} and len(doc["runs"]) == 3
    assert all("0 GPU(s) visible, 2 expected" in r["reason"] for r in doc["runs"])


@pytest.mark.slurm_release  # scontrol reboot ASAP nextstate=DOWN, the node's return, resume: what releases differ in
def test_the_reboot_path_of_this_release(reboot_cluster: SlurmTestCluster, tmp_path: Path) -> None:
    """Slurm's side only, fast enough for every release: a confirmed finding as the judge hands it over,
    the drain, the reservation, the reboot through ``RebootProgram``, the node's return (DOWN or IDLE, as
    the release brings it back), resume and drain for the full check, out of the reservation; the full
    check's pass returns it to service."""
    admin = reboot_cluster.command("scontrol", "update", "nodename=node1", "state=drain", "reason=hw: fan ticket 9")
    assert admin.returncode == 0, admin.stderr
    rig = Rig(reboot_cluster, tmp_path)
    now = time.time()
    out = JudgeOutput(at=now, evaluated={("node4", "gemm"), ("node1", "gemm")}, recommendations=[
        RecommendationCandidate(node, "gemm", Outcome.FAIL, ReasonCode.GPUS_MISSING, "0 GPU(s) visible, 2 expected",
                                {"run_ids": ["rp1"]}, now) for node in ("node1", "node4")])
    actions = [(a.action, a.node, a.result) for a in rig.remediator.apply(out)]
    assert ("drain", "node4", "done") in actions and ("drain", "node1", "refused") in actions
    assert rig.ticks_until("node4", ("repair", "done"), 30) == [("repair", "done")]
    state, reason = rig.node("node4")
    assert reason is not None and reason.startswith("healthd: repair reboot gpus_missing"), (state, reason)
    assert "Nodes=node4 " in rig.reservation()
    rig.ticks_until("node4", ("repair", "info"), 120)
    state, reason = rig.node("node4")
    assert "DRAIN" in state.split("+") and reason == "healthd: repair validating gpus_missing after reboot", state
    assert rig.reservation() == ""
    rig.full_check(rig.cured, "node4")
    assert [o[:2] for o in rig.outcomes] == [(("node4",), Outcome.PASS)], rig.outcomes
    actions = [(a.action, a.node, a.result) for a in rig.remediator.apply(JudgeOutput(at=time.time()))]
    assert ("repair", "node4", "done") in actions, actions
    wait_for(lambda: rig.node("node4") == ("idle", None), 30, "node4 idle without a reason")
    assert rig.reservation() == ""
    assert rig.node("node1") == ("idle+DRAIN", "hw: fan ticket 9")  # the administrator's drain: never touched
    assert [r.node for r in rig.store.repairs()] == ["node4"]


def test_check_config_refuses_a_reboot_repair_without_reboot_program(
    reboot_cluster: SlurmTestCluster, slurm_cluster: SlurmTestCluster, tmp_path: Path
) -> None:
    """``healthd check-config`` asks Slurm (``scontrol show config``): the session's cluster has no
    ``RebootProgram``, this module's has."""
    config = tmp_path / "healthd.toml"
    results = tmp_path / "results"
    results.mkdir()
    config.write_text(f'backend = "slurm"\nstate_dir = "{tmp_path / "state"}"\n[slurm]\nresults_dir = "{results}"\n'
                      '[remediation]\nmode = "enforce"\nrepair = "reboot"\nrecheck_drained = true\n'
                      'undrain_after_passes = 1\n')

    def check(cluster: SlurmTestCluster) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(Path(sys.executable).parent / "healthd"), "check-config", "--config", str(config)],
                              env={**cluster.env, "PYTHONPATH": str(REPO)}, capture_output=True, text=True,
                              timeout=60, check=False)

    refused = check(slurm_cluster)
    assert refused.returncode != 0
    assert "needs Slurm's RebootProgram, and slurm.conf sets none" in refused.stderr, refused.stderr
    accepted = check(reboot_cluster)
    assert accepted.returncode == 0, accepted.stderr
    assert "remediation: enforce, repair: reboot" in accepted.stdout
