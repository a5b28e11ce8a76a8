"""The judge and remediation entry points wired the way the daemon wires them, on a real store in a
temporary directory: collect -> ``judge_collected`` -> ``Remediator.apply`` -> metrics and API; plan
with ``Judge.requests``; a restart through ``load_judge``. The cluster is the simulator's in-memory one,
whose probes write real result files that the real collector reads."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest

from healthd.collector import Collector
from healthd.config import Settings
from healthd.judge.metrics import JudgeCollector
from healthd.judge.persist import judge_collected, load_judge
from healthd.planning import PlanLimits, plan
from healthd.remediation import Remediator, recommendations_document
from healthd.simulate import SIM_EPOCH, ClassSpec, FaultSpec, Scenario, SeriesSpec, SimCluster
from healthd.store import Store

SCENARIO = Scenario(
    classes=[ClassSpec(name="h100x8", count=8, prefix="n", gpu_type="h100", noise=0.01, series=[
        SeriesSpec(probe="gemm", name="flop_per_second", per="gpu", labels={"dtype": "bf16"}, value=700e12)])],
    faults=[FaultSpec(kind="gpu", node="n3", gpu=2, probe="gemm", name="flop_per_second", factor=0.5,
                      from_round=4)],
    probe_seconds={"gemm": 30.0},
)


class Daemon:
    """The daemon's collect/plan ticks, nothing more (see healthd.daemon)."""

    def __init__(self, tmp: Path, settings: Settings, cluster: SimCluster) -> None:
        self.settings = settings
        self.cluster = cluster
        self.store = Store(settings.store_path)
        self.collector = Collector(self.store, cluster, settings.results_dir, clock=lambda: cluster.now)
        self.judge = load_judge(self.store, settings.judge, now=cluster.now)
        self.remediator = Remediator(self.store, cluster, settings.remediation, clock=lambda: cluster.now)

    def tick(self) -> None:
        now = self.cluster.now
        self.store.upsert_nodes(self.cluster.list_nodes(), now)
        done = self.collector.collect()
        if done:
            self.remediator.apply(judge_collected(self.judge, self.store, done, now=now))
        runs = self.store.unfinished_runs()
        jobs = plan(self.store.nodes(), probes=self.settings.probes, last_attempts=self.store.last_attempts(),
                    busy_nodes={n for r in runs for n in r.nodes}, in_flight=len(runs), now=now,
                    limits=PlanLimits(max_jobs_in_flight=16), priority=self.judge.requests(now, self.settings.probes))
        for job in jobs:
            self.collector.launch(job)


def settings_for(tmp: Path) -> Settings:
    return Settings(backend="local", state_dir=tmp / "state",
                    probes={"gemm": {"interval_s": 600.0, "timeout_s": 120.0}},
                    remediation={"mode": "enforce"})


def run_rounds(daemon: Daemon, rounds: range) -> None:
    for rnd in rounds:
        daemon.cluster.round = rnd
        for k in range(10):
            daemon.cluster.now = SIM_EPOCH + (rnd - 1) * 600 + k * 60
            daemon.tick()


def test_daemon_path_finds_drains_exports_and_restarts(tmp_path: Path) -> None:
    settings = settings_for(tmp_path)
    cluster = SimCluster(SCENARIO)
    daemon = Daemon(tmp_path, settings, cluster)
    run_rounds(daemon, range(1, 4))
    assert cluster.drain_log == [] and daemon.store.recommendations() == []
    assert {v.outcome.value for v in daemon.store.current_verdicts()} == {"pass"}

    run_rounds(daemon, range(4, 5))
    (drain,) = cluster.drain_log
    assert drain[1] == "n3" and drain[2].startswith("healthd: below_floor gemm gpu 2 flop_per_second{dtype=bf16}")
    verdicts = {(v.node, v.probe): v for v in daemon.store.current_verdicts()}
    n3 = verdicts[("n3", "gemm")]
    assert (n3.outcome.value, n3.reason_code, n3.evidence["gpu"]) == ("fail", "below_floor", "2")
    assert len(n3.run_ids) == 2 and any(r.startswith("rp") for r in n3.run_ids)  # confirmed by a re-probe
    doc = recommendations_document(daemon.store, settings.remediation)
    assert [(r["node"], r["reason_code"]) for r in doc["recommendations"]] == [("n3", "below_floor")]

    registry = CollectorRegistry()
    registry.register(JudgeCollector(daemon.store, verdicts=True))
    text = generate_latest(registry).decode()
    samples = {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line and not line.startswith("#")}
    assert samples['healthd_drain_recommended{node="n3",reason_code="below_floor"}'] == 1.0
    assert samples['healthd_drain_recommended{node="n4",reason_code=""}'] == 0.0
    assert samples['healthd_node_verdict{node="n3",outcome="fail",probe="gemm",reason_code="below_floor"}'] == 1.0
    assert samples['healthd_floor_gemm_flop_per_second{dtype="bf16",gpu="2",node="n3"}'] == 525e12
    baseline = samples['healthd_baseline_gemm_flop_per_second{dtype="bf16",gpu="2",node="n3"}']
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
    assert len(cluster.drain_log) == 1
    assert [a.action for a in again.store.audit()].count("recommend") == 1
    again.store.close()
