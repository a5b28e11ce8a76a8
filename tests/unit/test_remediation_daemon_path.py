"""The judge and remediation entry points wired the way the daemon wires them, on a real store in a
temporary directory: collect -> ``judge_collected`` -> ``Remediator.apply`` -> metrics and API; plan
with ``Judge.requests``; a restart through ``load_judge``. The cluster is the Slurm backend over a fake
Slurm; this test plays the probes, writing real result files that the real collector reads."""

from __future__ import annotations

import random
import shutil
import subprocess
from pathlib import Path

from healthd.cluster.slurm import SlurmBackend
from healthd.collector import Collector
from healthd.config import Settings
from healthd.judge.persist import judge_collected, load_judge
from healthd.metrics import render_text
from healthd.model import Outcome
from healthd.planning import PlanLimits, plan
from healthd.remediation import Remediator, recommendations_document
from healthd.store import Store
from probes.result import Measurement, ProbeResult
from tests.fakes.slurm import FakeJob, FakeSlurmClient, fake_backend, gpu_node

EPOCH = 1_767_225_600.0
GEMM = 700e12
NOISE = 0.01
PROBE_S = 30.0
FAULT = ("n3", "2", 0.5, 4)
"""From round 4 on, gpu 2 of n3 does half the gemm rate of the others."""


class Cluster:
    """A fake Slurm whose jobs start at once and run ``PROBE_S``, and the gemm probe they run."""

    def __init__(self) -> None:
        self.now = EPOCH
        self.round = 1
        self.rng = random.Random(7)
        self.slurm = FakeSlurmClient([gpu_node(f"n{i}") for i in range(8)], clock=lambda: self.now)

    def backend(self, settings: Settings) -> SlurmBackend:
        return fake_backend(self.slurm, settings.results_dir, reason_prefix=settings.remediation.reason_prefix)

    def run_probes(self) -> None:
        """Every job that has run its ``PROBE_S`` writes its result and completes."""
        for job in list(self.slurm.jobs_by_id.values()):
            if job.started_at is not None and not job.state.finished and self.now - job.started_at >= PROBE_S:
                self.write_result(job)
                self.slurm.finish(job.job_id)

    def write_result(self, job: FakeJob) -> None:
        node, fault_gpu, factor, from_round = FAULT
        assert job.result_path is not None and job.started_at is not None
        measurements = [
            Measurement(name="flop_per_second", labels={"dtype": "bf16", "gpu": str(gpu)}, node=n,
                        value=GEMM * max(0.01, self.rng.gauss(1.0, NOISE))
                        * (factor if (n, str(gpu)) == (node, fault_gpu) and self.round >= from_round else 1.0))
            for n in job.nodes for gpu in range(8)]
        result = ProbeResult(probe="gemm", run_id=job.result_path.stem, outcome=Outcome.PASS,
                             started_at=job.started_at, finished_at=job.started_at + PROBE_S, nodes=list(job.nodes),
                             measurements=measurements)
        job.result_path.parent.mkdir(parents=True, exist_ok=True)
        job.result_path.write_text(result.to_json())


class Daemon:
    """The daemon's collect/plan ticks, nothing more (see healthd.daemon)."""

    def __init__(self, tmp: Path, settings: Settings, cluster: Cluster) -> None:
        self.settings = settings
        self.cluster = cluster
        self.backend = backend = cluster.backend(settings)
        self.store = Store(settings.store_path)
        self.collector = Collector(self.store, backend, settings.results_dir, clock=lambda: cluster.now)
        self.judge = load_judge(self.store, settings.judge, now=cluster.now)
        self.remediator = Remediator(self.store, backend, settings.remediation, clock=lambda: cluster.now)

    def tick(self) -> None:
        now = self.cluster.now
        self.cluster.run_probes()
        self.store.upsert_nodes(self.backend.list_nodes(), now)
        done = self.collector.collect()
        if done:
            self.remediator.apply(judge_collected(self.judge, self.store, done, now=now))
        runs = self.store.unfinished_runs()
        jobs = plan(self.store.nodes(), probes=self.settings.probes, last_attempts=self.store.last_attempts(),
                    busy_nodes={n for r in runs for n in r.nodes}, in_flight=len(runs), now=now,
                    limits=PlanLimits(max_jobs_in_flight=16), priority=self.judge.requests(now, self.settings.probes))
        for job in jobs:
            self.collector.launch(job)
        self.cluster.slurm.start_all()


def settings_for(tmp: Path) -> Settings:
    return Settings(backend="local", state_dir=tmp / "state",
                    probes={"gemm": {"interval_s": 600.0, "timeout_s": 120.0}},
                    remediation={"mode": "enforce"})


def run_rounds(daemon: Daemon, rounds: range) -> None:
    for rnd in rounds:
        daemon.cluster.round = rnd
        for k in range(10):
            daemon.cluster.now = EPOCH + (rnd - 1) * 600 + k * 60
            daemon.tick()


def test_daemon_path_finds_drains_exports_and_restarts(tmp_path: Path) -> None:
    settings = settings_for(tmp_path)
    cluster = Cluster()
    daemon = Daemon(tmp_path, settings, cluster)
    run_rounds(daemon, range(1, 4))
    assert cluster.slurm.drains() == [] and daemon.store.recommendations() == []
    assert {v.outcome.value for v in daemon.store.current_verdicts()} == {"pass"}

    run_rounds(daemon, range(4, 5))
    (drain,) = cluster.slurm.drains()
    assert drain[0] == "n3" and drain[1].startswith("healthd: below_floor gemm gpu 2 flop_per_second{dtype=bf16}")
    verdicts = {(v.node, v.probe): v for v in daemon.store.current_verdicts()}
    n3 = verdicts[("n3", "gemm")]
    assert (n3.outcome.value, n3.reason_code, n3.evidence["gpu"]) == ("fail", "below_floor", "2")
    assert len(n3.run_ids) == 2 and any(r.startswith("rp") for r in n3.run_ids)  # confirmed by a re-probe
    doc = recommendations_document(daemon.store, settings.remediation)
    assert [(r["node"], r["reason_code"]) for r in doc["recommendations"]] == [("n3", "below_floor")]

    text = render_text(daemon.store, "slurm", "full")
    samples = {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line and not line.startswith("#")}
    assert samples['healthd_drain_recommended{node="n3",reason_code="below_floor"}'] == 1.0
    assert samples['healthd_drain_recommended{node="n4",reason_code=""}'] == 0.0
    assert samples['healthd_node_verdict{node="n3",outcome="fail",probe="gemm",reason_code="below_floor"}'] == 1.0
    assert samples['healthd_floor_gemm_flop_per_second{dtype="bf16",gpu="2",gpu_uuid="",node="n3"}'] == 525e12
    baseline = samples['healthd_baseline_gemm_flop_per_second{dtype="bf16",gpu="2",gpu_uuid="",node="n3"}']
    assert abs(baseline - 700e12) < 21e12  # the faulty values never entered the baseline
    assert samples['healthd_remediation_actions_total{action="drain",result="done"}'] == 1.0
    assert samples['healthd_remediation_actions_total{action="undrain",result="done"}'] == 0.0
    assert samples["healthd_remediation_breaker_open"] == 0.0
    promtool = shutil.which("promtool")
    if promtool is not None:
        lint = subprocess.run([promtool, "check", "metrics"], input=text.encode(), capture_output=True, timeout=30,
                              check=False)
        assert lint.returncode == 0, lint.stdout.decode() + lint.stderr.decode()

    # a restart: the new judge picks up where the old one stopped, nothing is re-recommended or re-drained
    old_judge = daemon.judge
    daemon.store.close()
    again = Daemon(tmp_path, settings, cluster)
    assert {k: (v.outcome, v.reason_code) for k, v in again.judge.verdicts.items()} == \
        {k: (v.outcome, v.reason_code) for k, v in old_judge.verdicts.items()}
    assert {k: s.baseline for k, s in again.judge.series.items()} == \
        {k: s.baseline for k, s in old_judge.series.items()}
    run_rounds(again, range(5, 6))
    assert len(cluster.slurm.drains()) == 1
    assert [a.action for a in again.store.audit()].count("recommend") == 1
    again.store.close()
