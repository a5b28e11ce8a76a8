"""A combined job for real: the planner bundles the probes due on this machine, the local backend
runs ``python -m probes check`` (gloo, 2 ranks on CPU) once, and the collector stores each run."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from healthd.cluster.local import LocalBackend
from healthd.collector import Collector, read_result
from healthd.config import ProbeSettings
from healthd.model import Node, Outcome
from healthd.planning import PlanLimits, plan
from healthd.store import Store

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]


def test_a_bundled_job_through_the_collector_stores_each_run(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "TORCHELASTIC_", "HEALTHD_"))}
    env.update({"PYTHONPATH": str(REPO), "CUDA_VISIBLE_DEVICES": ""})
    backend = LocalBackend(node_name="here", python=Path(sys.executable), ranks=2, env=env, gpus=0)
    store = Store(tmp_path / "s.sqlite")
    collector = Collector(store, backend, tmp_path / "results")
    probes = {
        "env": ProbeSettings(interval_s=3600.0, timeout_s=60.0),
        "gemm": ProbeSettings(interval_s=3600.0, timeout_s=60.0,
                              args=["--size", "256", "--iters", "3", "--warmup", "1", "--copy-bytes", "4M"]),
        "ddp": ProbeSettings(interval_s=3600.0, timeout_s=60.0, args=["--steps", "2", "--warmup", "1"]),
    }
    (job,) = plan([Node("here", "idle")], probes=probes, last_attempts={}, busy_nodes=(), in_flight=0,
                  now=time.time(), limits=PlanLimits(), combine=True)
    assert job.probe == "check" and [r.probe for r in job.bundle] == ["env", "gemm", "ddp"]
    job_id = collector.launch(job)
    assert job_id is not None
    done: list[object] = []
    deadline = time.time() + 170
    while len(done) < 3 and time.time() < deadline:
        done += collector.collect()
        time.sleep(0.2)
    by_probe = {d.probe: d for d in done}  # type: ignore[attr-defined]
    assert sorted(by_probe) == ["ddp", "env", "gemm"], (tmp_path / "results" / f"{job.run_id}.log").read_text()[-3000:]
    for r in job.bundle:
        collected = by_probe[r.probe]
        assert (collected.run_id, collected.outcome) == (r.run_id, Outcome.PASS), collected.reason
        run = store.run(r.run_id)
        assert run is not None and run.job_id == job_id and run.state == "finished"
        assert run.duration_s is not None and run.duration_s < 60
        result = read_result(tmp_path / "results" / f"{r.run_id}.json")
        assert (result.probe, result.run_id) == (r.probe, r.run_id)
        assert store.measurements(run_id=r.run_id)
    assert store.last_attempts().keys() >= {("here", "env"), ("here", "gemm"), ("here", "ddp")}
