"""The node check as Slurm's ``Prolog=``, ``Epilog=`` and ``HealthCheckProgram=`` on a real Slurm cluster
(``scripts/slurm-test-cluster.sh``).

One cluster of its own for the module (two nodes, the release of the session's cluster, ports 40 above it)
runs healthd's wrappers (``healthd install-files``' text) in all three places, ``HealthCheckInterval`` 3
s, Slurm's prolog and epilog time limit 10 s. Each node has a fake ``nvidia-smi`` (no GPU here: the output
follows the real tool's) listing the two GPUs its GRES and expectation file say, or one GPU while the test
puts a fault file for the node (a GPU gone). Jobs run as ``nobody`` (``sbatch --uid``: root's processes
are never a user's leftovers).

- epilog: a user job ends, its document reaches the results directory and the node stays idle; a job
  that leaves a process of its user behind makes the epilog exit 1 and Slurm drains the node
  (``Epilog error``), which healthd takes over;
- prolog: a job start writes a prolog document within its budget (the prolog's added time to the job's
  start is printed); with a GPU gone the prolog exits 1 and Slurm drains the node (``Prolog error``) and
  requeues the job held, not started anywhere;
- health: slurmd runs the check every interval on every node, within budget; with a GPU gone it exits 1,
  which Slurm ignores (the node stays idle): healthd collects the documents and its own remediation
  drains the node with a ``healthd:`` reason;
- Slurm's time limit (``PrologEpilogTimeout``, 25.05+ ``EpilogTimeout``: 10 s): an epilog whose tool hangs
  is ended by slurmd, which drains the node; the check leaves an ``error`` document and nothing running,
  and healthd does not take that drain over.
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
from dataclasses import dataclass
from pathlib import Path

import pytest

from healthd.cluster.local import LocalBackend
from healthd.cluster.slurm import SlurmBackend
from healthd.cluster.slurm_cli import SlurmCli
from healthd.collector import Collected, Collector, boundary_failures, collect_boundary
from healthd.commands.install_files import node_check_wrapper
from healthd.config import JudgeSettings, RemediationSettings
from healthd.jobs import LaunchSettings
from healthd.judge.persist import judge_runs, load_judge, run_from_collected
from healthd.model import Node, Outcome, RunKind
from healthd.parsers.healthd_json import parse_result
from healthd.remediation import Remediator
from healthd.store import Store
from tests.integration.conftest import CLUSTER_SCRIPT, REPO, SlurmTestCluster, wait_for

pytestmark = [pytest.mark.slurm, pytest.mark.slurm_release, pytest.mark.slow]


NOBODY = pwd.getpwnam("nobody").pw_uid
"""By number: 26.05's ``sbatch --uid=nobody`` says ``Invalid --uid specification`` (22.05 and 24.11 take either)."""
HEALTH_INTERVAL_S = 3
PROLOG_EPILOG_TIMEOUT_S = 10
"""Slurm's limit for a prolog or epilog (``PrologEpilogTimeout``; 25.05+: ``PrologTimeout``, ``EpilogTimeout``)."""
PROLOG_BUDGET_S = 8.0
"""Above the default 5 s (under Slurm's limit): on the shared 2-core machine at load 10+, python's start-up
alone has taken 4 s (the check then skips what no longer fits and reports ``error``). The figures are printed
against 5 s."""
NODES = ("node1", "node2")
UUIDS = ("GPU-0f1e2d3c-4b5a-6978-8695-a4b3c2d1e0f1", "GPU-1f1e2d3c-4b5a-6978-8695-a4b3c2d1e0f2")
FAKE_SMI = """#!/bin/sh
# a fake nvidia-smi (no GPU on the test machine): two GPUs, or one while $FAULTS/$SLURMD_NODENAME exists;
# stuck while $FAULTS/$SLURMD_NODENAME.hang-<context> exists
n=2
[ -e "{faults}/$SLURMD_NODENAME" ] && n=1
[ -e "{faults}/$SLURMD_NODENAME.hang-$HD_CONTEXT" ] && exec sleep 300  # stuck: never answers
case "$1" in
  -L) [ "$n" -ge 1 ] && echo "GPU 0: NVIDIA H100 80GB HBM3 (UUID: {u0})"
      [ "$n" -ge 2 ] && echo "GPU 1: NVIDIA H100 80GB HBM3 (UUID: {u1})"
      exit 0 ;;
  --query-compute-apps=*) exit 0 ;;
  --query-gpu=*) [ "$n" -ge 1 ] && echo "0, {u0}, No, No, 0"
      [ "$n" -ge 2 ] && echo "1, {u1}, No, No, 0"
      exit 0 ;;
  *) exit 9 ;;
esac
"""


@dataclass(frozen=True)
class BoundaryCluster:
    env: dict[str, str]
    results: Path
    faults: Path
    """``faults/<node>``: that node's fake ``nvidia-smi`` lists one GPU of its two."""
    prolog_times: Path
    """One line per prolog: ``job node start end status`` (the wrapper's own wall clock, as slurmd waits for it)."""

    def reset(self) -> None:
        """No fault, no job, both nodes idle."""
        for f in self.faults.iterdir():
            f.unlink()
        subprocess.run(["scancel", "--user=nobody"], env=self.env, capture_output=True, timeout=15, check=False)
        for node in NODES:
            subprocess.run(["scontrol", "update", f"nodename={node}", "state=resume"], env=self.env,
                           capture_output=True, timeout=15, check=False)
        wait_for(lambda: all(node_state(self.env, n).startswith("idle") for n in NODES), 30, "both nodes idle")


@pytest.fixture(scope="module")
def boundary_cluster(slurm_cluster: SlurmTestCluster) -> Iterator[BoundaryCluster]:
    if os.geteuid() != 0:
        pytest.skip("the test cluster's daemons need root")
    base = Path(tempfile.mkdtemp(prefix="hd-bd-", dir="/tmp"))
    base.chmod(0o755)  # the jobs run as nobody: their scripts live in the cluster's spool under it
    results = base / "results"
    (results / "expect").mkdir(parents=True)
    results.chmod(0o750)
    for node in NODES:
        (results / "expect" / f"{node}.json").write_text(json.dumps({"gpus": 2, "gpu_uuids": list(UUIDS)}))
    faults = base / "faults"
    faults.mkdir()
    fake_bin = base / "fake-bin"
    fake_bin.mkdir()
    (fake_bin / "nvidia-smi").write_text(FAKE_SMI.format(faults=faults, u0=UUIDS[0], u1=UUIDS[1]))
    prolog_times = base / "prolog-times"
    scripts: dict[str, Path] = {}
    for context in ("prolog", "epilog", "health"):
        inner = base / f"node-check-{context}"
        inner.write_text(node_check_wrapper(context, sys.executable, results))
        outer = base / context
        run = f"{inner} --no-gemm"
        if context == "prolog":  # its wall time, as slurmd sees it: the job starts after it
            run = (f't0=$(date +%s.%N)\n{run} --budget {PROLOG_BUDGET_S:g}\nrc=$?\n'
                   f'echo "$SLURM_JOB_ID $SLURMD_NODENAME $t0 $(date +%s.%N) $rc" >>{prolog_times}\nexit $rc')
        else:
            run = f"exec {run}"
        outer.write_text(f"#!/bin/sh\nexport PYTHONPATH={REPO} HD_CONTEXT={context}\nexport PATH={fake_bin}:$PATH\n"
                         f"{run}\n")
        scripts[context] = outer
    for p in (*base.glob("node-check-*"), *scripts.values(), fake_bin / "nvidia-smi"):
        p.chmod(0o755)
    ctld = int(slurm_cluster.env.get("HEALTHD_SLURM_CTLD_PORT", "16817")) + 40
    node = int(slurm_cluster.env.get("HEALTHD_SLURM_NODE_PORT", "17001")) + 40
    env = {k: v for k, v in slurm_cluster.env.items() if k not in ("SLURM_CONF", "HEALTHD_SLURM_DIR")}
    env.update(HEALTHD_SLURM_DIR=str(base / "c"), HEALTHD_SLURM_CTLD_PORT=str(ctld),
               HEALTHD_SLURM_NODE_PORT=str(node), HEALTHD_SLURM_NODES=str(len(NODES)),
               HEALTHD_SLURM_PROLOG=str(scripts["prolog"]), HEALTHD_SLURM_EPILOG=str(scripts["epilog"]),
               HEALTHD_SLURM_HEALTH_CHECK=str(scripts["health"]),
               HEALTHD_SLURM_HEALTH_CHECK_INTERVAL=str(HEALTH_INTERVAL_S),
               HEALTHD_SLURM_PROLOG_EPILOG_TIMEOUT=str(PROLOG_EPILOG_TIMEOUT_S),
               SLURM_CONF=str(base / "c" / "etc" / "slurm.conf"))
    t0 = time.monotonic()
    started = subprocess.run([str(CLUSTER_SCRIPT), "start"], env=env, capture_output=True, text=True, timeout=120,
                             check=False)
    print(f"\nboundary cluster ({slurm_cluster.version}) up in {time.monotonic() - t0:.1f} s")
    try:
        assert started.returncode == 0, started.stderr[-2000:]
        if subprocess.run(["sbatch", "--help"], env=env, capture_output=True, text=True, timeout=15,
                          check=False).stdout.find("--uid") < 0:
            pytest.skip("this release's sbatch has no --uid")
        yield BoundaryCluster(env, results, faults, prolog_times)
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


def job_state(env: dict[str, str], job: str) -> str:
    done = subprocess.run(["squeue", "-h", "-j", job, "-o", "%T|%r"], env=env, capture_output=True, text=True,
                          timeout=15, check=False)
    return done.stdout.strip()


def document(results: Path, node: str, job: str, context: str = "epilog") -> dict[str, object] | None:
    found = sorted(results.glob(f"boundary-{node}-{context}-{job}-*.json"))
    return json.loads(found[0].read_text()) if found else None


def health_documents(results: Path, node: str, since: float) -> list[dict[str, object]]:
    """The node's health documents started after ``since``, oldest first."""
    docs = [json.loads(p.read_text()) for p in results.glob(f"boundary-{node}-health-0-*.json")]
    return sorted((d for d in docs if float(str(d["started_at"])) > since), key=lambda d: float(str(d["started_at"])))


def within_budget(doc: dict[str, object]) -> float:
    params = doc["params"]
    assert isinstance(params, dict)
    elapsed, budget = float(params["elapsed_s"]), float(params["budget_s"])
    assert 0 < elapsed < budget, params
    return elapsed


def test_epilog_reports_and_a_leftover_process_drains_the_node(boundary_cluster: BoundaryCluster,
                                                              tmp_path: Path) -> None:
    bc = boundary_cluster
    env, results = bc.env, bc.results
    bc.reset()
    t0 = time.monotonic()
    healthy = submit(env, "node1", "sleep 1")
    doc = wait_for(lambda: document(results, "node1", healthy), 30, "the healthy job's epilog document")
    assert isinstance(doc, dict) and doc["outcome"] == "pass", (doc["reason"], doc["params"])
    params = doc["params"]
    assert isinstance(params, dict) and params["context"] == "epilog" and params["job_id"] == int(healthy)
    print(f"\nepilog: elapsed_s {within_budget(doc):.2f} of {params['budget_s']} s")
    wait_for(lambda: node_state(env, "node1").startswith("idle"), 20, "node1 idle once its epilog ended")

    left = submit(env, "node2", "setsid sleep 300 </dev/null >/dev/null 2>&1 & sleep 1")
    bad = wait_for(lambda: document(results, "node2", left), 30, "the leftover job's epilog document")
    assert isinstance(bad, dict) and bad["outcome"] == "fail", (bad["reason"], bad["params"])
    assert "boundary.leftover_process" in str(bad["reason"])
    try:
        wait_for(lambda: "drain" in node_state(env, "node2"), 20, "Slurm draining node2 after the epilog's exit 1")
        assert "Epilog error" in node_state(env, "node2")
        assert node_state(env, "node1").startswith("idle")
        take_over_and_lift(env, results, bad, tmp_path, "Epilog error")
    finally:
        for pid in (int(w.split(" (")[0]) for w in str(bad["reason"]).split(": ")[-1].split(", ") if w[:1].isdigit()):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    assert time.monotonic() - t0 < 60


def test_prolog_reports_within_budget_and_a_gpu_gone_drains_the_node_and_holds_the_job(
        boundary_cluster: BoundaryCluster, slurm_cluster: SlurmTestCluster, tmp_path: Path) -> None:
    bc = boundary_cluster
    env, results = bc.env, bc.results
    bc.reset()
    healthy = submit(env, "node1", "sleep 1")
    doc = wait_for(lambda: document(results, "node1", healthy, "prolog"), 30, "the healthy job's prolog document")
    assert isinstance(doc, dict) and doc["outcome"] == "pass", (doc["reason"], doc["params"])
    params = doc["params"]
    assert isinstance(params, dict) and params["context"] == "prolog" and params["job_id"] == int(healthy)
    assert params["budget_s"] == PROLOG_BUDGET_S and "gemm" in params["skipped"] and "leftover" in params["skipped"]
    elapsed = within_budget(doc)
    wait_for(lambda: document(results, "node1", healthy), 30, "the healthy job's epilog (the job ran)")
    line = next(ln.split() for ln in bc.prolog_times.read_text().splitlines() if ln.split()[0] == healthy)
    wall = float(line[3]) - float(line[2])
    print(f"\nprolog (Slurm {'.'.join(map(str, slurm_cluster.version))}): elapsed_s {elapsed:.2f} (default budget "
          f"5 s), the wrapper's wall time (the job's start waits for it) {wall:.2f} s")
    assert line[4] == "0" and wall < PROLOG_BUDGET_S
    wait_for(lambda: node_state(env, "node1").startswith("idle"), 20, "node1 idle after the job")

    (bc.faults / "node2").touch()  # node2's fake nvidia-smi lists one GPU of two
    held = submit(env, "node2", "sleep 1")
    bad = wait_for(lambda: document(results, "node2", held, "prolog"), 30, "the prolog document of node2")
    assert isinstance(bad, dict) and bad["outcome"] == "fail", (bad["reason"], bad["params"])
    assert "env.gpu_count: 1 GPU(s) visible, 2 expected" in str(bad["reason"])
    wait_for(lambda: "drain" in node_state(env, "node2"), 20, "Slurm draining node2 after the prolog's exit 1")
    state = node_state(env, "node2")
    # what Slurm does with a failed prolog (every release): the node drained, the job requeued and held
    assert state.endswith("|Prolog error"), state
    job = wait_for(lambda: (st := job_state(env, held)).startswith("PENDING") and st, 20, "the job back in the queue")
    print(f"prolog exit 1: node2 {state}; job {held} {job}")
    assert "held" in str(job).lower(), job
    assert node_state(env, "node1").startswith("idle")
    take_over_and_lift(env, results, bad, tmp_path, "Prolog error")


def test_health_check_runs_every_interval_slurm_ignores_its_exit_and_healthd_drains(
        boundary_cluster: BoundaryCluster, tmp_path: Path) -> None:
    bc = boundary_cluster
    env, results = bc.env, bc.results
    bc.reset()
    wait = 3 * HEALTH_INTERVAL_S + 15  # slurmd's timer, at load: with margin

    def passed(node: str) -> list[dict[str, object]]:  # since the cluster started (the tests before ran meanwhile)
        return [d for d in health_documents(results, node, 0.0) if d["outcome"] == "pass"]

    docs = wait_for(lambda: all(passed(n) for n in NODES) and {n: passed(n)[-1] for n in NODES}, wait,
                    "a passed health check per node")
    assert isinstance(docs, dict)
    for node, doc in docs.items():
        assert doc["nodes"] == [node] and doc["params"]["job_id"] is None, doc  # type: ignore[index]
        print(f"\nhealth {node}: elapsed_s {within_budget(doc):.2f} of {doc['params']['budget_s']} s")  # type: ignore[index]

    (bc.faults / "node2").touch()
    fault_at = time.time()
    failed = wait_for(lambda: len(f := [d for d in health_documents(results, "node2", fault_at)
                                        if d["outcome"] == "fail"]) >= 2 and f, 2 * wait,
                      "two failed health checks of node2")
    assert isinstance(failed, list)
    assert "env.gpu_count: 1 GPU(s) visible, 2 expected" in str(failed[0]["reason"])
    time.sleep(1)  # slurmctld has had the second exit status for a moment
    assert node_state(env, "node2").startswith("idle"), node_state(env, "node2")  # Slurm ignores the exit status

    # the daemon's steps: collect, judge (two failed runs confirm), remediation (enforce) drains
    store = Store(tmp_path / "s.sqlite")
    try:
        backend = SlurmBackend(SlurmCli(env=env), LaunchSettings(python=sys.executable, results_dir=results))
        nodes = [Node(name=n, state="idle", gpus=2) for n in NODES]
        store.upsert_nodes(nodes, time.time())
        collector = Collector(store, LocalBackend(node_name="node1", python=Path(sys.executable)), results)
        collected = [c for c in collect_boundary(collector) if c.result is not None
                     and c.result.params.get("context") == "health"]
        assert {c.nodes[0] for c in collected if c.outcome is Outcome.FAIL} == {"node2"}
        remediator = Remediator(store, backend, RemediationSettings(mode="enforce", breaker_class_share=1.0))
        assert remediator.adopt_boundary_drains(boundary_failures(collected)) == []  # Slurm drained nothing
        judge = load_judge(store, JudgeSettings(), now=time.time())
        out = judge_runs(judge, store, [run_from_collected(c, time.time()) for c in collected], now=time.time(),
                         nodes=nodes)
        actions = [(a.action, a.node, a.result) for a in remediator.apply(out)]
        assert ("drain", "node2", "done") in actions, actions
        state = node_state(env, "node2")
        assert "drain" in state and "|healthd: gpus_missing" in state, state
        assert node_state(env, "node1").startswith("idle")
        print(f"health exit 1: Slurm left node2 idle; healthd's remediation: {state}")
    finally:
        store.close()


def take_over_and_lift(env: dict[str, str], results: Path, bad: dict[str, object], tmp_path: Path,
                       slurm_reason: str) -> None:
    """The daemon's step after collecting the failed prolog or epilog document: Slurm's ``slurm_reason``
    becomes healthd's reason and drain (an operator's reason elsewhere is untouched), which ``healthd
    undrain`` may then lift like any of its own."""
    context = str(bad["params"]["context"])  # type: ignore[index]
    result = parse_result(json.dumps(bad))
    collected = Collected(str(bad["run_id"]), "boundary", ("node2",), Outcome.FAIL, str(bad["reason"]), result,
                          RunKind.BOUNDARY)
    backend = SlurmBackend(SlurmCli(env=env), LaunchSettings(python=sys.executable, results_dir=results))
    subprocess.run(["scontrol", "update", "nodename=node1", "state=drain", f"reason={slurm_reason}"], env=env,
                   capture_output=True, timeout=15, check=True)  # someone else's, without a failed check
    store = Store(tmp_path / "adopt.sqlite")
    try:
        remediator = Remediator(store, backend, RemediationSettings(mode="recommend"))
        actions = remediator.adopt_boundary_drains(boundary_failures([collected]))
        assert [(a.action, a.node, a.result) for a in actions] == [("drain", "node2", "done")], actions
        state = node_state(env, "node2")
        assert "drain" in state and f"healthd: boundary {context} " in state, state
        assert f"run {bad['run_id']}" in state
        (drain,) = store.drains(open_only=True)
        assert (drain.node, drain.actor, drain.automatic) == ("node2", "healthd", True)
        assert node_state(env, "node1").endswith(f"|{slurm_reason}")  # not healthd's: left alone
        assert remediator.adopt_boundary_drains([]) == []  # taken once
        lifted = remediator.undrain("node2", actor="test")
        assert lifted.result == "done", lifted
        assert not node_state(env, "node2").startswith("drain")
    finally:
        store.close()


def test_an_epilog_ended_by_slurms_time_limit_is_an_error_and_no_drain_of_healthds(
        boundary_cluster: BoundaryCluster, slurm_cluster: SlurmTestCluster, tmp_path: Path) -> None:
    """An epilog whose tool hangs, with the check's budget (30 s) above Slurm's limit: slurmd ends the
    script (SIGTERM) at the limit and drains the node with ``Epilog error``; the check kills its tool,
    writes an ``error`` document and exits; healthd does not take that drain over (no failed check)."""
    bc = boundary_cluster
    env, results = bc.env, bc.results
    bc.reset()
    (bc.faults / "node1.hang-epilog").touch()  # only the epilog's nvidia-smi hangs
    t0 = time.monotonic()
    job = submit(env, "node1", "true")
    try:
        doc = wait_for(lambda: document(results, "node1", job), PROLOG_EPILOG_TIMEOUT_S + 30,
                       "the stuck epilog's document")
    except AssertionError:
        log = results.parent / "c" / "log" / "slurmd.node1.log"
        raise AssertionError(f"no document: node1 {node_state(env, 'node1')}, job {job} {job_state(env, job)}, "
                             f"{sorted(p.name for p in results.glob('*node1-epilog*'))}, slurmd: "
                             f"{log.read_text(errors='replace')[-3000:] if log.exists() else '?'}") from None
    assert isinstance(doc, dict) and doc["outcome"] == "error", (doc["reason"], doc["params"])
    took = time.monotonic() - t0
    errors = doc["params"]["errors"]  # type: ignore[index]
    assert str(errors["gpus"]).startswith("ended by signal 15 after "), errors
    elapsed = float(doc["params"]["elapsed_s"])  # type: ignore[index]
    assert PROLOG_EPILOG_TIMEOUT_S - 1 < elapsed < 30.0, elapsed  # Slurm's limit ended it, not the budget
    wait_for(lambda: "drain" in node_state(env, "node1"), 20, "Slurm draining node1 for its epilog's time limit")
    state = node_state(env, "node1")
    print(f"\nepilog stuck past {PROLOG_EPILOG_TIMEOUT_S} s (Slurm {'.'.join(map(str, slurm_cluster.version))}): "
          f"SIGTERM at elapsed_s {elapsed:.1f}, error document after {took:.1f} s; node1 {state}")
    assert state.endswith("|Epilog error"), state
    fake_bin = str(bc.results.parent / "fake-bin").encode()
    stuck = [pid for pid in map(int, filter(str.isdigit, os.listdir("/proc")))
             if _reads(f"/proc/{pid}/cmdline").startswith(b"sleep\0300") and fake_bin in _reads(f"/proc/{pid}/environ")]
    assert stuck == [], "the stuck tool outlived the check"

    result = parse_result(json.dumps(doc))
    collected = Collected(str(doc["run_id"]), "boundary", ("node1",), Outcome.ERROR, str(doc["reason"]), result,
                          RunKind.BOUNDARY)
    store = Store(tmp_path / "s.sqlite")
    try:
        backend = SlurmBackend(SlurmCli(env=env), LaunchSettings(python=sys.executable, results_dir=results))
        remediator = Remediator(store, backend, RemediationSettings(mode="enforce"))
        assert boundary_failures([collected]) == [] and remediator.adopt_boundary_drains([]) == []
        assert node_state(env, "node1") == state and store.drains(open_only=True) == []  # Slurm's, not healthd's
    finally:
        store.close()


def _reads(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        return b""
