"""A degraded leaf switch on a real Slurm cluster (issue 27): one switch finding, no node drained for it;
a bad node under another leaf still drained.

A cluster of its own (``scripts/slurm-test-cluster.sh``: 16 nodes, ``HEALTHD_SLURM_LEAVES=6``: leaves
of three nodes in name order, leaf6 = node16 alone, under one spine; the release of the session's
cluster; controller port 50 and slurmd ports 70 above the session cluster's, so that it runs beside
the session's and the boundary test's) and healthd's daemon, in this process, ticking as its
scheduler would (discover, topology, plan, collect): the topology is read from ``scontrol show
topology``, the probes are real ``nccl`` pair jobs (gloo on CPU, one rank per node, 16 MiB
all_reduce) under sbatch/srun, judged with the default judge settings, and acted on in enforce
mode against the real slurmctld.

The fault is the probes' test-only ``slow@<node>`` (``probes.faults``; a job-wide
``HEALTHD_PROBE_FAULT`` naming the nodes, as a TaskProlog delivering it to those nodes only would):
every pair job including one of leaf1's nodes (node1-node3) has a tenth of the busbw, whatever its
partner, as a degraded leaf's inter-node path makes it. Once leaf1 is named, node11 (under leaf4)
is slowed too: a node fault of its own.

Why this shape (the cluster's size, not a loosened judge):

- leaves of three: the switch rule names a leaf when its flagged nodes are beyond chance (``p x
  tested < judge.switch.p_value`` = 1e-4, chance rate never below 2%): three of three at 2% is
  8e-6 x 5 leaves tested = 4e-5; a leaf of four in 16 nodes is a quarter of the class, a fleet
  event's share (``fleet.event_share`` 0.2) before it is a switch;
- the node fault second: it flags node11 and its pair partner, 2 of the 12 nodes outside leaf1
  (17%), a chance rate at which three of three is not beyond chance (0.17^3 x 5 = 0.02); in a fleet
  of hundreds (``tests/unit/test_simulate_switches.py``, 160 nodes) it is 1 of 144 and both faults
  start in the same round. A named leaf stays named while half its nodes (two at least) are flagged;
- a whole round at once (``max_concurrent_jobs`` 8): on a shared 2-core host pairs measured one after
  the other spread 25-35% (MAD) in busbw, too much for the fleet rule to flag anything; pairs measured
  together see the same contention (~10%). A serial round also takes ~80 s, and the first flagged
  node of the leaf is localised (with a partner under its leaf and one under another, both bad) and
  drained before its leafmates' regular results come in (the event barrier holds a finding only
  while other results in its window are flagged).

Opt-in (``HEALTHD_SLURM_LEAF=1``), not in CI: 16 nodes of torch processes take 25-35 s a round on 2
cores, about 4 minutes in all (10 when it fails). What it shows (bench/RESULTS.md, "Switch findings on the
real Slurm test cluster"): leaf1 named, and only leaf1, in its first round (39-49 s), kept named while
node11 is localised and drained (209-295 s), no node of leaf1 drained, no fleet event. Passed in 4 of 6 runs
since the judge's noise went to the log scale and its peers left out what a named switch explains (a pair
of one round spreads 2-7x here, 90-900 MB/s: on the linear scale no value, not even zero, was 3.7 spreads
below such a class, and a failing leaf's pairs, a third of a 16-node class's values, hid the rest); it
never passed before. The other two lost leaf1's finding when one round's healthy pairs spread 111-806
MB/s (the limit of a 16-node class at that noise), one of them then naming leaf4 (node10 is paired with
node1 every round) and holding node11's drain.
Beside a competing load on both cores (two busy loops; bench/RESULTS.md, "Beside a competing load") it is not
yet 10 of 10: a failing leaf's pair measured at a third instead of a tenth in a round whose healthy pairs spread
3-10x ends the leaf's finding, and its slow pairs then fill the class's peers (a within-round spread, not a round
moving as a whole). Hence still opt-in.
The same cluster shape runs in the simulator in a second (``bench/scenarios/small-noisy-fabric-16.toml``,
``tests/unit/test_simulate_small_noisy_fabric.py``).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from healthd.cluster.slurm import SlurmBackend
from healthd.cluster.slurm_cli import SlurmCli
from healthd.config import Settings
from healthd.daemon import Daemon
from healthd.jobs import LaunchSettings
from tests.integration.conftest import CLUSTER_SCRIPT, FAKE_GPU_CLASSES, SlurmTestCluster
from tests.integration.daemons import get

pytestmark = [pytest.mark.slurm, pytest.mark.slow,
              pytest.mark.skipif(os.environ.get("HEALTHD_SLURM_LEAF") != "1",
                                 reason="opt-in: HEALTHD_SLURM_LEAF=1 (minutes on 2 cores; see the docstring)")]

NODES, LEAVES = 16, 6
LEAF = ("node1", "node2", "node3")
"""leaf1: the degraded leaf."""
LONE = "node11"
"""A bad node of its own under leaf4 (node10-node12)."""
ARGS = ["--sizes", "16M", "--warmup", "3", "--iters", "10"]
"""all_reduce of 16 MiB: on gloo over loopback a pair's busbw spreads ~7% (MAD) on a busy 2-core host, 1 MiB ~25%."""
DEADLINE_S = 600.0


@pytest.fixture
def leaf_cluster(slurm_cluster: SlurmTestCluster) -> Iterator[dict[str, str]]:
    if os.geteuid() != 0:
        pytest.skip("the test cluster's daemons need root")
    base = Path(tempfile.mkdtemp(prefix="hd-leaf-", dir="/tmp"))
    ctld = int(slurm_cluster.env.get("HEALTHD_SLURM_CTLD_PORT", "16817")) + 50
    node = int(slurm_cluster.env.get("HEALTHD_SLURM_NODE_PORT", "17001")) + 70
    env = {k: v for k, v in slurm_cluster.env.items() if k not in ("SLURM_CONF", "HEALTHD_SLURM_DIR")}
    env.update(HEALTHD_SLURM_DIR=str(base / "c"), HEALTHD_SLURM_CTLD_PORT=str(ctld),
               HEALTHD_SLURM_NODE_PORT=str(node), HEALTHD_SLURM_NODES=str(NODES),
               HEALTHD_SLURM_LEAVES=str(LEAVES), HEALTHD_SLURM_TOPOLOGY="tree",
               SLURM_CONF=str(base / "c" / "etc" / "slurm.conf"))
    started = subprocess_run(["nice", "-n", "-5", str(CLUSTER_SCRIPT), "start"], env, 120)
    try:
        assert started.returncode == 0, started.stderr[-2000:]
        yield env
    finally:
        subprocess_run(["scancel", "--user=root"], env, 30)
        deadline = time.monotonic() + 60  # a cluster stopped under its jobs' steps leaves their slurmstepd behind
        while time.monotonic() < deadline and subprocess_run(["squeue", "-h"], env, 15).stdout.strip():
            time.sleep(1)
        subprocess_run([str(CLUSTER_SCRIPT), "stop"], env, 60)
        shutil.rmtree(base, ignore_errors=True)


def subprocess_run(argv: list[str], env: dict[str, str], timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout, check=False)


def switch_findings(port: int) -> list[tuple[str, str, str]]:
    """``healthd_switch_finding{switch,level,probe}`` from the daemon's /metrics: (switch, level, probe)."""
    text = get(port, "/metrics")[1]
    return sorted((s.labels["switch"], s.labels["level"], s.labels["probe"])
                  for f in text_string_to_metric_families(text)
                  for s in f.samples if s.name == "healthd_switch_finding" and s.value)


def test_a_degraded_leaf_is_one_switch_finding_and_a_lone_bad_node_is_drained(
        leaf_cluster: dict[str, str], tmp_path: Path) -> None:
    env = leaf_cluster
    settings = Settings.model_validate({
        "backend": "slurm", "state_dir": str(tmp_path / "state"), "http": {"host": "127.0.0.1", "port": 0},
        "slurm": {"python": sys.executable, "max_idle_share": 1.0, "max_concurrent_jobs": 8,
                  "node_classes": [{"name": "tgpux2", "gpu_type": "tgpu", "expect_gpus": 0}]},
        "probes": {"nccl": {"interval_s": 1.0, "jitter_s": 0.0, "timeout_s": 60.0, "nodes_per_job": 2,
                            "ranks_per_node": 1, "args": ARGS}},
        "remediation": {"mode": "enforce"},
    })
    fault = ",".join(f"slow@{n}" for n in LEAF)
    backend = SlurmBackend(SlurmCli(env=env), LaunchSettings(python=sys.executable, results_dir=settings.results_dir,
                                                            env=(("HEALTHD_PROBE_FAULT", fault),)),
                           node_classes=FAKE_GPU_CLASSES)
    daemon = Daemon(settings, None, backend=backend)
    daemon.http.start()
    port = daemon.http.port
    t0 = time.monotonic()
    ticks = [daemon._tick(name, fn) for name, fn in (
        ("discover", daemon.discover), ("topology", daemon.refresh_topology), ("plan", daemon.plan_and_launch),
        ("collect", daemon.collect))]
    seen_switches: set[str] = set()
    trace: list[str] = []
    """Each finished run: seconds, kind, nodes, busbw (MB/s), whether its nodes' latest regular result is flagged."""
    traced: set[str] = set()

    def tick() -> None:
        for t in ticks:
            t()
        for e in daemon.store.switch_findings(limit=1000):
            seen_switches.add(str(e["switch"]))
        for r in json.loads(get(port, "/api/v1/runs?limit=1000")[1])["runs"]:
            if r["state"] == "finished" and r["run_id"] not in traced:
                traced.add(r["run_id"])
                doc = json.loads(Path(str(r["result_path"])).read_text()) if r.get("result_path") else {}
                bw = [round(m["value"] / 1e6) for m in doc.get("measurements", [])
                      if m["name"] == "busbw_bytes_per_second"]
                flags = {n: v[1] for s in daemon.judge.samples.values() for n, v in s.items() if n in r["nodes"]}
                trace.append(f"{time.monotonic() - t0:5.0f} s {r['kind']} {r['nodes']} {bw} {flags} "
                             f"switches {switch_findings(port)}")
        assert not daemon._failing, daemon._failing
        assert time.monotonic() - t0 < DEADLINE_S, "deadline; switches seen: " + ", ".join(seen_switches) + "\n" + \
            "\n".join(trace)
        time.sleep(1.0)

    def recommended() -> set[str]:
        doc = json.loads(get(port, "/api/v1/recommendations")[1])
        return {r["node"] for r in doc["recommendations"]}

    try:
        while not switch_findings(port):
            tick()
        named_s = time.monotonic() - t0
        assert switch_findings(port) == [("leaf1", "0", "nccl")], "\n".join(trace)
        print(f"leaf1 named after {named_s:.0f} s")
        backend.launch = replace(backend.launch, env=(("HEALTHD_PROBE_FAULT", f"{fault},slow@{LONE}"),))
        while LONE not in {d.node for d in daemon.store.drains(open_only=True)}:
            tick()
        print(f"{LONE} drained after {time.monotonic() - t0:.0f} s")
        assert switch_findings(port) == [("leaf1", "0", "nccl")], "\n".join(trace)
        assert seen_switches == {"leaf1"}
        assert daemon.store.fleet_events(limit=1000) == []
        assert recommended() == {LONE}, recommended()
        assert [d.node for d in daemon.store.drains()] == [LONE]
        doc = json.loads(get(port, "/api/v1/recommendations")[1])
        (finding,) = doc["switch_findings"]
        assert finding["switch"] == "leaf1" and "inspect switch leaf1" in finding["action"], finding
        drained = subprocess_run(["sinfo", "-h", "-N", "-t", "drain,drained,draining", "-o", "%N"], env, 15)
        assert set(drained.stdout.split()) == {LONE}, drained.stdout  # once per partition it is in
    finally:
        daemon.http.stop()
        daemon.store.close()
