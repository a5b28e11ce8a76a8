"""The node check as Slurm's ``Epilog=`` on a real Slurm cluster (``scripts/slurm-test-cluster.sh``).

A cluster of its own (two nodes, the release of the session's cluster, ports 40 above it) is started
with ``HEALTHD_SLURM_EPILOG`` set to healthd's wrapper (``healthd install-files``' text): a user job
ends, its epilog writes the boundary document into the results directory and the node stays idle;
a job that leaves a process of its user behind makes the epilog exit 1 and Slurm drains the node
(``Epilog error``). Jobs run as ``nobody`` (``sbatch --uid``: root's processes are never a user's
leftovers).
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from healthd.cluster.slurm import SlurmBackend
from healthd.cluster.slurm_cli import SlurmCli
from healthd.collector import Collected, boundary_failures
from healthd.commands.install_files import node_check_wrapper
from healthd.config import RemediationSettings
from healthd.jobs import LaunchSettings
from healthd.model import Outcome, RunKind
from healthd.parsers.healthd_json import parse_result
from healthd.remediation import Remediator
from healthd.store import Store
from tests.integration.conftest import CLUSTER_SCRIPT, REPO, SlurmTestCluster, wait_for

pytestmark = [pytest.mark.slurm, pytest.mark.slurm_release, pytest.mark.slow]


NOBODY = pwd.getpwnam("nobody").pw_uid
"""By number: 26.05's ``sbatch --uid=nobody`` says ``Invalid --uid specification`` (22.05 and 24.11 take either)."""


@pytest.fixture
def epilog_cluster(slurm_cluster: SlurmTestCluster) -> Iterator[tuple[dict[str, str], Path]]:
    if os.geteuid() != 0:
        pytest.skip("the test cluster's daemons need root")
    base = Path(tempfile.mkdtemp(prefix="hd-bd-", dir="/tmp"))
    base.chmod(0o755)  # the jobs run as nobody: their scripts live in the cluster's spool under it
    results = base / "results"
    results.mkdir(mode=0o750)
    inner = base / "node-check-epilog"
    inner.write_text(node_check_wrapper("epilog", sys.executable, results))
    outer = base / "epilog"
    outer.write_text(f"#!/bin/sh\nexport PYTHONPATH={REPO}\nexec {inner} --no-gemm\n")
    for p in (inner, outer):
        p.chmod(0o755)
    ctld = int(slurm_cluster.env.get("HEALTHD_SLURM_CTLD_PORT", "16817")) + 40
    node = int(slurm_cluster.env.get("HEALTHD_SLURM_NODE_PORT", "17001")) + 40
    env = {k: v for k, v in slurm_cluster.env.items() if k not in ("SLURM_CONF", "HEALTHD_SLURM_DIR")}
    env.update(HEALTHD_SLURM_DIR=str(base / "c"), HEALTHD_SLURM_CTLD_PORT=str(ctld),
               HEALTHD_SLURM_NODE_PORT=str(node), HEALTHD_SLURM_NODES="2", HEALTHD_SLURM_EPILOG=str(outer),
               SLURM_CONF=str(base / "c" / "etc" / "slurm.conf"))
    started = subprocess.run([str(CLUSTER_SCRIPT), "start"], env=env, capture_output=True, text=True, timeout=120,
                             check=False)
    try:
        assert started.returncode == 0, started.stderr[-2000:]
        if subprocess.run(["sbatch", "--help"], env=env, capture_output=True, text=True, timeout=15,
                          check=False).stdout.find("--uid") < 0:
            pytest.skip("this release's sbatch has no --uid")
        yield env, results
    finally:
        subprocess.run([str(CLUSTER_SCRIPT), "stop"], env=env, capture_output=True, timeout=60, check=False)
        shutil.rmtree(base, ignore_errors=True)


def submit(env: dict[str, str], node: str, script: str) -> str:
    done = subprocess.run(["sbatch", "--parsable", f"--uid={NOBODY}", "-w", node, "-D", "/tmp", "-o", "/dev/null",
                           "--wrap", script], env=env, capture_output=True, text=True, timeout=30, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().split(";")[0]


def node_state(env: dict[str, str], node: str) -> str:
    done = subprocess.run(["sinfo", "-h", "-n", node, "-o", "%T|%E"], env=env, capture_output=True, text=True,
                          timeout=15, check=False)
    return done.stdout.strip().splitlines()[0] if done.stdout.strip() else ""


def document(results: Path, node: str, job: str) -> dict[str, object] | None:
    found = sorted(results.glob(f"boundary-{node}-epilog-{job}-*.json"))
    return json.loads(found[0].read_text()) if found else None


def test_epilog_reports_and_a_leftover_process_drains_the_node(epilog_cluster: tuple[dict[str, str], Path]) -> None:
    env, results = epilog_cluster
    t0 = time.monotonic()
    healthy = submit(env, "node1", "sleep 1")
    doc = wait_for(lambda: document(results, "node1", healthy), 30, "the healthy job's epilog document")
    assert isinstance(doc, dict) and doc["outcome"] == "pass", doc
    params = doc["params"]
    assert isinstance(params, dict) and params["context"] == "epilog" and params["job_id"] == int(healthy)
    assert params["elapsed_s"] < params["budget_s"]
    assert node_state(env, "node1").startswith("idle")

    left = submit(env, "node2", "setsid sleep 300 </dev/null >/dev/null 2>&1 & sleep 1")
    bad = wait_for(lambda: document(results, "node2", left), 30, "the leftover job's epilog document")
    assert isinstance(bad, dict) and bad["outcome"] == "fail", bad
    assert "boundary.leftover_process" in str(bad["reason"])
    try:
        wait_for(lambda: "drain" in node_state(env, "node2"), 20, "Slurm draining node2 after the epilog's exit 1")
        assert "Epilog error" in node_state(env, "node2")
        assert node_state(env, "node1").startswith("idle")
        take_over_and_lift(env, results, bad)
    finally:
        for pid in (int(w.split(" (")[0]) for w in str(bad["reason"]).split(": ")[-1].split(", ") if w[:1].isdigit()):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    assert time.monotonic() - t0 < 60


def take_over_and_lift(env: dict[str, str], results: Path, bad: dict[str, object]) -> None:
    """The daemon's step after collecting the failed epilog's document: Slurm's ``Epilog error`` becomes
    healthd's reason and drain (an operator's reason elsewhere is untouched), which ``healthd undrain``
    may then lift like any of its own."""
    result = parse_result(json.dumps(bad))
    collected = Collected(str(bad["run_id"]), "boundary", ("node2",), Outcome.FAIL, str(bad["reason"]), result,
                          RunKind.BOUNDARY)
    backend = SlurmBackend(SlurmCli(env=env), LaunchSettings(python=sys.executable, results_dir=results))
    subprocess.run(["scontrol", "update", "nodename=node1", "state=drain", "reason=Epilog error"], env=env,
                   capture_output=True, timeout=15, check=True)  # someone else's, without a failed check
    store = Store(results.parent / "s.sqlite")
    try:
        remediator = Remediator(store, backend, RemediationSettings(mode="recommend"))
        actions = remediator.adopt_boundary_drains(boundary_failures([collected]))
        assert [(a.action, a.node, a.result) for a in actions] == [("drain", "node2", "done")], actions
        state = node_state(env, "node2")
        assert "drain" in state and "healthd: boundary epilog boundary.leftover_process" in state, state
        assert f"run {bad['run_id']}" in state
        (drain,) = store.drains(open_only=True)
        assert (drain.node, drain.actor, drain.automatic) == ("node2", "healthd", True)
        assert node_state(env, "node1").endswith("|Epilog error")  # not healthd's: left alone
        assert remediator.adopt_boundary_drains([]) == []  # taken once
        lifted = remediator.undrain("node2", actor="test")
        assert lifted.result == "done", lifted
        assert not node_state(env, "node2").startswith("drain")
    finally:
        store.close()
