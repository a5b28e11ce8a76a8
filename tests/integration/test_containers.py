"""Probes inside real container runtimes (docs/containers.md): the probe image that
``healthd image build`` writes, run by

* crun on the OCI bundle (what Slurm's ``oci.conf`` runs for ``srun --container``),
* ``ch-run`` on the enroot-format ``.sqsh`` (an unprivileged SquashFS runtime, as enroot is),
* podman on the OCI archive (``podman load``), with the exact argv healthd renders for a
  ``podman`` launcher,

each running ``python3 -m probes check --probes env,gemm`` (the daemon's combined job: one start-up,
small CPU sizes) with the results directory bind-mounted. The collector's ``read_result`` accepts
every document, and each has the same shape as the host's run of the same command.

The image is built once per machine (``$HEALTHD_IMAGE_DIR``, default /var/cache/healthd-image/out;
the Debian + torch layer is cached beside it and rebuilt only when its recipe changes). Under
scripts/test.sh it is built in the background while the rest of the suite runs
(``$HEALTHD_TEST_IMAGE_BUILD``); these tests, marked ``containers``, run last and wait for it. Needs root
(mmdebstrap, crun, podman's store). With ``CI=true`` a missing runtime or tool fails the test: on
the CI machine a skip would hide that the runtimes were never run.
"""

from __future__ import annotations

import json
import os
import re
import resource
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from healthd.cluster.slurm import launcher_from_settings
from healthd.collector import log_tail, outcome_of, read_result
from healthd.config import LauncherSettings
from healthd.errors import ParseError
from healthd.image import (
    BUNDLE_DIR,
    IMAGE_NAME,
    OCI_ARCHIVE_FILE,
    SITE_PACKAGES,
    SQSH_FILE,
    BuildInputs,
    BuildRecord,
    build_image,
    image_files,
    image_problems,
    oci_runtime_config,
)
from healthd.jobs import Launcher, LaunchSettings, render_batch_script, task_argv
from healthd.model import JobState, JobStatus, ProbeJob
from probes.result import Outcome, ProbeResult
from tests.integration.conftest import wait_for
from tests.integration.daemons import DaemonProc, free_port, get

pytestmark = [pytest.mark.slow, pytest.mark.containers]

REPO = Path(__file__).resolve().parents[2]
IMAGE_DIR = Path(os.environ.get("HEALTHD_IMAGE_DIR", "/var/cache/healthd-image/out"))
CACHE = Path(os.environ.get("HEALTHD_IMAGE_CACHE", "/var/cache/healthd-image"))
GEMM_ARGS = ("--size", "256", "--dtypes", "fp32", "--copy-bytes", "4M")
TIMEOUT_S = 300.0
"""Generous: the limits only bound a run; on a loaded 2-core machine a cold container start took over a minute."""
BACKGROUND_BUILD = os.environ.get("HEALTHD_TEST_IMAGE_BUILD")
"""scripts/test.sh's background ``healthd image build``: it writes its exit status to ``<this>.rc``
when it ends, its output to ``<this>.log``. Read at import: the tests' own environment is cleared."""
BACKGROUND_BUILD_WAIT_S = 2700.0


def cgroup_hybrid_wrapper() -> list[str]:
    """crun (podman's runtime too) refuses a host whose cgroup v2 hierarchy has controllers in
    hybrid mode ("cgroups in hybrid mode not supported, drop all controllers from cgroupv2"), as
    this machine kind has (v1 plus hugetlb on /sys/fs/cgroup/unified). The runtime then runs in a
    private mount namespace without that mount: it sees cgroup v1 only; the host is untouched."""
    controllers = Path("/sys/fs/cgroup/unified/cgroup.controllers")
    if not controllers.is_file() or not controllers.read_text().strip():
        return []
    return ["unshare", "--mount", "--propagation=private", "--", "sh", "-c",
            'umount /sys/fs/cgroup/unified && exec "$@"', "sh"]


def need(ok: bool, why: str) -> None:
    """Skip when ``ok`` is false, but fail on CI (``CI=true``): there every runtime must run."""
    if ok:
        return
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI=true and {why}: install them (scripts/install-debian-deps.sh containers)")
    pytest.skip(why)


def need_tools(*tools: str) -> None:
    missing = [t for t in tools if shutil.which(t) is None]
    need(not missing, f"{', '.join(missing)} not installed")


def probe_args(results: Path) -> list[str]:
    """``python -m probes check`` for env and gemm, writing ``results/<probe>-run.json``."""
    args = ["check", "--probes", "env,gemm", "--run-ids", "env=env-run,gemm=gemm-run",
            "--limits", "env=150,gemm=150", "--timeout", f"{TIMEOUT_S:g}", "--output-dir", str(results)]
    for token in GEMM_ARGS:
        args += ["--arg", f"gemm={token}"]
    return args


def shape(result: ProbeResult) -> dict[str, Any]:
    """What must be equal between a host run and a container run of one probe."""
    env = result.environment
    return {
        "probe": result.probe,
        "outcome": result.outcome.value,
        "run_id": result.run_id,
        "measurements": sorted({m.name for m in result.measurements}),
        "checks": sorted((c.name, c.ok) for c in result.checks),
        "params": sorted(result.params),
        "environment": None if env is None else sorted(k for k, v in env.model_dump().items()
                                                        if v not in (None, [], "") and k != "container_image"),
        "ranks": None if env is None else len(env.ranks),
    }


def read_both(results: Path) -> dict[str, ProbeResult]:
    found = {p.stem: p for p in results.glob("*.json")}
    assert sorted(found) == ["env-run", "gemm-run"], sorted(os.listdir(results))
    return {name: read_result(path) for name, path in found.items()}


def results_dir(tmp_path: Path, name: str) -> Path:
    path = tmp_path / name
    path.mkdir()
    path.chmod(0o777)
    return path


def await_background_build(prefix: str, limit_s: float) -> float:
    """Seconds spent waiting for the background build at ``prefix`` to end; fails with its log's
    tail when it failed (a rebuild here would only repeat its error, slower)."""
    t0 = time.monotonic()
    rc_file, log_file = Path(prefix + ".rc"), Path(prefix + ".log")
    rc = wait_for(lambda: rc_file.is_file() and rc_file.read_text().strip(), limit_s,
                  f"the background image build ({log_file}) to end")
    if rc != "0":
        tail = log_file.read_text(errors="replace")[-3000:] if log_file.is_file() else "(no log)"
        pytest.fail(f"scripts/test.sh's background healthd image build exited {rc} (log {log_file}):\n{tail}")
    return time.monotonic() - t0


@pytest.fixture(scope="module")
def built() -> BuildRecord:
    need(os.geteuid() == 0, "the probe image is built as root (mmdebstrap --mode=root)")
    need_tools("mmdebstrap", "mksquashfs", "tar")
    if BACKGROUND_BUILD:
        waited = await_background_build(BACKGROUND_BUILD, BACKGROUND_BUILD_WAIT_S)
        print(f"waited {waited:.1f} s for the background image build", file=sys.stderr)
    t0 = time.monotonic()
    record = build_image(IMAGE_DIR, BuildInputs(source=REPO), cache=CACHE, log=lambda m: print(m, file=sys.stderr))
    print(f"probe image ready in {time.monotonic() - t0:.1f} s: {record.digest} {dict(record.sizes)}",
          file=sys.stderr)
    return record


@pytest.fixture(scope="module")
def host_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, ProbeResult]:
    results = tmp_path_factory.mktemp("host-results")
    done = subprocess.run([sys.executable, "-m", "probes", *probe_args(results)], capture_output=True, text=True,
                          timeout=TIMEOUT_S + 30)
    assert done.returncode == 0, done.stderr[-2000:]
    return read_both(results)


def assert_like_host(results: Path, host: dict[str, ProbeResult], digest: str) -> None:
    inside = read_both(results)
    for name, result in inside.items():
        assert result.outcome.value == "pass", (name, result.reason)
        assert shape(result) == shape(host[name]), name
        assert result.environment is not None
        assert result.environment.container_image == digest
        assert result.environment.torch == host[name].environment.torch  # type: ignore[union-attr]
        assert result.nodes == host[name].nodes  # the host's name: the container shares its UTS namespace


def test_the_image_has_what_probes_need(built: BuildRecord) -> None:
    for image in (IMAGE_DIR / BUNDLE_DIR, IMAGE_DIR / SQSH_FILE, IMAGE_DIR / OCI_ARCHIVE_FILE):
        assert image_problems(image_files(image)) == [], image
    with (IMAGE_DIR / BUNDLE_DIR / "rootfs" / "etc" / "rc").open() as rc:
        assert 'exec "$@"' in rc.read()
    assert built.digest.startswith("sha256:") and len(built.digest) == 71


def test_crun_runs_the_bundle(built: BuildRecord, host_run: dict[str, ProbeResult], tmp_path: Path) -> None:
    """The bundle's root under a config.json that bind-mounts the results, as Slurm's generated
    config does: ``crun run`` (oci.conf's RunTimeRun)."""
    need_tools("crun")
    results = results_dir(tmp_path, "results")
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    config = oci_runtime_config(["python3", "-m", "probes", *probe_args(results)],
                                root=str(IMAGE_DIR / BUNDLE_DIR / "rootfs"),
                                env=[("HEALTHD_CONTAINER_IMAGE", built.digest)],
                                mounts=[(str(results), str(results), False)])
    (bundle / "config.json").write_text(json.dumps(config))
    name = f"healthd-test-{uuid.uuid4().hex[:8]}"
    done = subprocess.run([*cgroup_hybrid_wrapper(), "crun", "--root", str(tmp_path / "state"), "run",
                           "--bundle", str(bundle), name], capture_output=True, text=True, timeout=TIMEOUT_S + 30)
    assert done.returncode == 0, done.stderr[-2000:]
    assert_like_host(results, host_run, built.digest)


def test_ch_run_runs_the_squashfs_image(built: BuildRecord, host_run: dict[str, ProbeResult], tmp_path: Path) -> None:
    """``ch-run`` mounts the .sqsh itself (libsquashfuse; /dev/fuse is root's here, and CI is root)
    in an unprivileged user namespace, as enroot runs its images."""
    need_tools("ch-run")
    results = results_dir(tmp_path, "results")
    env = {**os.environ, "USER": os.environ.get("USER", "root"), "HEALTHD_CONTAINER_IMAGE": built.digest}
    done = subprocess.run(["ch-run", f"--bind={results}:{results}", "--unset-env=*",
                           "--set-env=" + str(IMAGE_DIR / BUNDLE_DIR / "rootfs" / "etc" / "environment"),
                           "--set-env=HEALTHD_CONTAINER_IMAGE=" + built.digest,
                           str(IMAGE_DIR / SQSH_FILE), "--", "python3", "-m", "probes", *probe_args(results)],
                          capture_output=True, text=True, timeout=TIMEOUT_S + 30, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    assert_like_host(results, host_run, built.digest)


def podman_conf() -> str:
    """containers.conf for a host without systemd (cgroupfs, file events) whose root lacks
    CAP_SYS_RESOURCE (this machine kind): podman's default rlimits for root (nofile 1048576,
    nproc 4194304) cannot be set there, so they are the caller's own, nproc at most 16384 (root
    is not held to it)."""
    nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    nproc = min(resource.getrlimit(resource.RLIMIT_NPROC)[1], 16384)
    return (f'[containers]\ndefault_ulimits = ["nofile={nofile}:{nofile}", "nproc={nproc}:{nproc}"]\n'
            '[engine]\ncgroup_manager = "cgroupfs"\nevents_logger = "file"\n')


@pytest.fixture(scope="module")
def podman_env(built: BuildRecord, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """podman as this machine allows it (``podman_conf``) and its store beside the image (kept: a
    loaded image is found again by its tag; a new one whose base layer is stored already adds
    only the healthd layer)."""
    need_tools("podman")
    conf = tmp_path_factory.mktemp("podman")
    (conf / "containers.conf").write_text(podman_conf())
    store = CACHE / "podman"
    (conf / "storage.conf").write_text(f'[storage]\ndriver = "overlay"\ngraphroot = "{store}/root"\n'
                                       f'runroot = "{conf}/run"\n')
    env = {**os.environ, "CONTAINERS_CONF": str(conf / "containers.conf"),
           "CONTAINERS_STORAGE_CONF": str(conf / "storage.conf")}
    tag = f"localhost/{IMAGE_NAME}:{built.healthd_key}"
    if subprocess.run(["podman", "image", "exists", tag], env=env, timeout=60).returncode != 0:
        done = subprocess.run([*cgroup_hybrid_wrapper(), "podman", "load", "-q", "-i",
                               str(IMAGE_DIR / OCI_ARCHIVE_FILE)], env=env,
                              capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-2000:]
        listed = subprocess.run(["podman", "images", "--format", "{{.Repository}}:{{.Tag}}"], env=env,
                                capture_output=True, text=True, timeout=60).stdout.split()
        stale = [t for t in listed if t.startswith(f"localhost/{IMAGE_NAME}:") and t != tag]
        if stale:  # earlier code's images: their healthd layers go, the shared base layer stays
            subprocess.run(["podman", "rmi", *stale], env=env, capture_output=True, timeout=120)
    yield env


def test_podman_runs_healthds_rendered_line(built: BuildRecord, host_run: dict[str, ProbeResult],
                                            podman_env: dict[str, str], tmp_path: Path) -> None:
    """The argv a ``podman`` launcher renders (host network and IPC, results volume, variables
    passed by name), minus srun, on the loaded archive; the image digest podman reports is ours."""
    results = results_dir(tmp_path, "results")
    tag = f"localhost/{IMAGE_NAME}:{built.healthd_key}"
    inspect = subprocess.run(["podman", "image", "inspect", "--format", "{{.Digest}}", tag], env=podman_env,
                             capture_output=True, text=True, timeout=60)
    assert inspect.stdout.strip() == built.digest, inspect.stderr
    launch = LaunchSettings(python="python3", results_dir=results,
                            launcher=Launcher(kind="podman", image=tag))
    argv = task_argv(launch, probe_args(results), gpus_per_node=0)
    done = subprocess.run([*cgroup_hybrid_wrapper(), *argv], capture_output=True, text=True, timeout=TIMEOUT_S + 30,
                          env={**podman_env, "HEALTHD_CONTAINER_IMAGE": built.digest})
    assert done.returncode == 0, done.stderr[-2000:]
    assert_like_host(results, host_run, built.digest)


def test_a_broken_image_is_an_error_with_the_runtimes_message(built: BuildRecord, tmp_path: Path) -> None:
    """The image's site-packages hidden (a tmpfs over it: ``probes``, torch and pydantic missing
    inside): no document, the step's output holds Python's own message, and the collector's sorting
    makes the run ``error`` with that message, never ``fail`` (could not check never drains)."""
    need_tools("crun")
    results = results_dir(tmp_path, "results")
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    config = oci_runtime_config(["python3", "-m", "probes", "gemm", "--output", str(results / "broken.json")],
                                root=str(IMAGE_DIR / BUNDLE_DIR / "rootfs"),
                                mounts=[(str(results), str(results), False)])
    config["mounts"].append({"destination": f"/{SITE_PACKAGES}", "type": "tmpfs", "source": "tmpfs",
                             "options": ["nosuid", "nodev", "ro"]})
    (bundle / "config.json").write_text(json.dumps(config))
    with (results / "broken.log").open("w") as log:
        done = subprocess.run([*cgroup_hybrid_wrapper(), "crun", "--root", str(tmp_path / "state"), "run",
                               "--bundle", str(bundle), f"healthd-test-{uuid.uuid4().hex[:8]}"], stdout=log,
                              stderr=subprocess.STDOUT, timeout=120)
    assert done.returncode != 0
    with pytest.raises(ParseError) as missing:
        read_result(results / "broken.json")
    tail = log_tail(results / "broken.json")
    assert "No module named probes" in tail, tail
    outcome, reason = outcome_of(JobStatus("1", JobState.FAILED, exit_code=done.returncode), None,
                                 f"{missing.value}; output: {tail}", ("node1",))
    assert outcome is Outcome.ERROR
    assert "No module named probes" in reason


CRUN_V1 = """#!/bin/sh
# crun for slurmstepd where cgroup v2 has controllers in hybrid mode (see cgroup_hybrid_wrapper).
exec unshare --mount --propagation=private -- sh -c 'umount /sys/fs/cgroup/unified 2>/dev/null; exec "$@"' sh crun "$@"
"""


@pytest.fixture(scope="module")
def oci_cluster(built: BuildRecord, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """A one-node Slurm cluster of its own (scripts/slurm-test-cluster.sh: own directory and ports,
    $HEALTHD_CONTAINERS_SLURM_CTLD_PORT/NODE_PORT, default 16887/17251, apart from the main cluster's
    and slurm-matrix.sh's) whose oci.conf runs crun, as Slurm's containers page shows for crun
    (``RunTimeRun``; 22.05 wants Query, Kill and Delete too)."""
    need(os.geteuid() == 0, "the Slurm test cluster runs as root")
    need_tools("crun", "slurmctld", "slurmd", "munged", "srun", "sbatch")
    work = tmp_path_factory.mktemp("oci-slurm")
    crun = work / "crun-v1"
    crun.write_text(CRUN_V1 if cgroup_hybrid_wrapper() else '#!/bin/sh\nexec crun "$@"\n')
    crun.chmod(0o755)
    state, ident = work / "crun-state", "%n.%u.%j.%s.%t"
    (work / "oci.conf").write_text(
        f'RunTimeQuery="{crun} --root={state} state {ident}"\n'
        f'RunTimeKill="{crun} --root={state} kill -a {ident}"\n'
        f'RunTimeDelete="{crun} --root={state} delete --force {ident}"\n'
        f'RunTimeRun="{crun} --root={state} run --bundle %b {ident}"\n')
    env = {**os.environ,
           "HEALTHD_SLURM_DIR": str(work / "slurm"), "HEALTHD_SLURM_NODES": "1",
           "HEALTHD_SLURM_CTLD_PORT": os.environ.get("HEALTHD_CONTAINERS_SLURM_CTLD_PORT", "16887"),
           "HEALTHD_SLURM_NODE_PORT": os.environ.get("HEALTHD_CONTAINERS_SLURM_NODE_PORT", "17251"),
           "HEALTHD_SLURM_OCI_CONF": str(work / "oci.conf")}
    env.pop("HEALTHD_SLURM_RELEASE", None)
    script = str(REPO / "scripts" / "slurm-test-cluster.sh")
    started = subprocess.run([script, "start"], env=env, capture_output=True, text=True, timeout=180)
    assert started.returncode == 0, started.stderr[-2000:]
    env["SLURM_CONF"] = str(work / "slurm" / "etc" / "slurm.conf")
    try:
        yield env
    finally:
        subprocess.run([script, "stop"], env=env, capture_output=True, timeout=120)


FINAL_STATES = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "DEADLINE")


def sbatch_wait(script: str, env: dict[str, str], folder: Path) -> str:
    """Submit ``script`` and poll (0.5 s; ``sbatch --wait`` sleeps up to 10 s between looks) until
    the job ends; its final state."""
    path = folder / "job.sh"
    path.write_text(script)
    submitted = subprocess.run(["sbatch", "--parsable", str(path)], env=env, capture_output=True, text=True,
                               timeout=60)
    assert submitted.returncode == 0, submitted.stderr
    job_id = submitted.stdout.strip().split(";")[0]

    def state() -> str | None:
        shown = subprocess.run(["scontrol", "show", "job", "-o", job_id], env=env, capture_output=True,
                               text=True, timeout=30).stdout
        found = re.search(r"\bJobState=(\S+)", shown)
        return found.group(1) if found and found.group(1) in FINAL_STATES else None

    return str(wait_for(state, TIMEOUT_S + 60, f"job {job_id} to end"))


def test_slurm_runs_the_bundle_with_srun_container(built: BuildRecord, oci_cluster: dict[str, str],
                                                   tmp_path: Path) -> None:
    """healthd's batch script for an ``oci`` launcher (``srun --container=BUNDLE``) on Slurm 22.05
    with oci.conf running crun: the results directory is a mount of the bundle's config.json
    (``healthd image build --mount``), and the collector reads the gemm document, whose
    ``environment.container_image`` names the bundle by the image's digest.

    What 22.05 does (found here): one task per node only (``_modify_config: unexpected number of
    tasks 2 > 1``), and no ``SLURM_PROCID``/``SLURM_LOCALID``/``SLURM_NODEID`` inside the container,
    so the probe starts its local ranks itself (``standalone``)."""
    results = results_dir(tmp_path, "results")
    build_image(IMAGE_DIR, BuildInputs(source=REPO), cache=CACHE, mounts=[(str(results), str(results), False)])
    job = ProbeJob(run_id="oci0000000000001", probe="gemm", nodes=("node1",), timeout_s=TIMEOUT_S,
                   args=GEMM_ARGS)
    launcher = launcher_from_settings(LauncherSettings(kind="oci", image=str(IMAGE_DIR / BUNDLE_DIR),
                                                       probes_from="image"), REPO / "probes")
    launch = LaunchSettings(python="python3", results_dir=results, nice=0, launcher=launcher)
    script = render_batch_script(job, launch, ranks_per_node=1, gpus_per_node=0)
    assert f"--container={IMAGE_DIR / BUNDLE_DIR}" in script
    assert sbatch_wait(script, oci_cluster, tmp_path) == "COMPLETED"
    result = read_result(results / f"{job.run_id}.json")
    assert result.outcome is Outcome.PASS, (result.reason, log_tail(results / f"{job.run_id}.json"))
    assert result.environment is not None
    assert result.environment.container_image == f"{IMAGE_DIR / BUNDLE_DIR}@{built.digest}"
    assert result.environment.launcher == "standalone"
    assert len(result.environment.ranks) == 2 and {m.name for m in result.measurements}
    assert result.container is not None and result.container.kind == "oci" and result.container.setup_seconds > 0


def test_slurm_with_a_broken_bundle_is_an_error_with_cruns_message(oci_cluster: dict[str, str],
                                                                  tmp_path: Path) -> None:
    """A bundle without its root: the step fails before the probe; the collector's sorting is
    ``error`` with crun's own message from the job log, never ``fail``."""
    results = results_dir(tmp_path, "results")
    bundle = tmp_path / "broken-bundle"
    bundle.mkdir()
    (bundle / "config.json").write_text(json.dumps(oci_runtime_config(["true"])))
    job = ProbeJob(run_id="oci0000000000002", probe="gemm", nodes=("node1",), timeout_s=60.0)
    launch = LaunchSettings(python="python3", results_dir=results, nice=0,
                            launcher=Launcher(kind="oci", image=str(bundle)))
    final = sbatch_wait(render_batch_script(job, launch, ranks_per_node=1, gpus_per_node=0), oci_cluster, tmp_path)
    assert final == "FAILED"
    path = results / f"{job.run_id}.json"
    with pytest.raises(ParseError) as missing:
        read_result(path)
    tail = log_tail(path)
    assert "rootfs" in tail and "No such file or directory" in tail, tail
    outcome, reason = outcome_of(JobStatus("1", JobState.FAILED, exit_code=1), None,
                                 f"{missing.value}; output: {tail}", ("node1",))
    assert outcome is Outcome.ERROR and "No such file or directory" in reason


def test_the_daemon_runs_its_gemm_probe_with_srun_container(built: BuildRecord, oci_cluster: dict[str, str],
                                                            tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``healthd run`` on the oci.conf cluster with ``[probes.gemm.launcher] kind = "oci"``: the
    daemon's own planner submits ``srun --container=BUNDLE``, its collector reads the document and
    its judge passes it; the run's document names the image by the digest the daemon read from
    ``healthd-probe.json`` at start."""
    results = tmp_path / "results"
    results.mkdir(mode=0o750)  # the daemon refuses a results directory others may write to
    build_image(IMAGE_DIR, BuildInputs(source=REPO), cache=CACHE, mounts=[(str(results), str(results), False)])
    monkeypatch.setenv("SLURM_CONF", oci_cluster["SLURM_CONF"])
    port = free_port()
    config = tmp_path / "healthd.toml"
    config.write_text(f"""
backend = "slurm"
state_dir = "{tmp_path / 'state'}"
[http]
host = "127.0.0.1"
port = {port}
[scheduler]
discover_interval_s = 1
plan_interval_s = 1
collect_interval_s = 1
[slurm]
python = "{sys.executable}"
results_dir = "{results}"
job_name_prefix = "hdoci."
max_idle_share = 1.0
max_concurrent_jobs = 1
command_timeout_s = 20
[[slurm.node_classes]]
name = "testgpu"
gpu_type = "tgpu"
expect_gpus = 0
[probes.gemm]
interval_s = 3600
timeout_s = {TIMEOUT_S:g}
ranks_per_node = 1
args = {json.dumps(list(GEMM_ARGS))}
[probes.gemm.launcher]
kind = "oci"
image = "{IMAGE_DIR / BUNDLE_DIR}"
probes_from = "image"
""")
    daemon = DaemonProc(config, port, tmp_path / "daemon.log")
    try:
        daemon.wait_http()

        def finished() -> dict[str, Any] | None:
            assert daemon.proc.poll() is None, daemon.log_path.read_text()[-4000:]
            runs = json.loads(get(port, "/api/v1/runs")[1])["runs"]
            done = [r for r in runs if r["state"] == "finished"]
            return dict(done[0]) if done else None

        run = wait_for(finished, TIMEOUT_S + 60, "the daemon's gemm run to finish")
        assert isinstance(run, dict)
        assert run["outcome"] == "pass", (run, log_tail(Path(str(run["result_path"]))))
        script = Path(str(run["result_path"])).with_suffix(".sbatch").read_text()
        assert f"--container={IMAGE_DIR / BUNDLE_DIR} " in script
        result = read_result(Path(str(run["result_path"])))
        assert result.environment is not None
        assert result.environment.container_image == f"{IMAGE_DIR / BUNDLE_DIR}@{built.digest}"
        assert run["container_image"] == result.environment.container_image  # the API names it by digest
        assert {m.name for m in result.measurements}
        assert result.container is not None and result.container.kind == "oci", result.container
        assert 0 < result.container.setup_seconds < TIMEOUT_S
        assert result.startup_seconds is not None and result.startup_seconds >= result.container.setup_seconds
        metrics = get(port, "/metrics")[1]
        assert re.search(r'^healthd_probe_runs_total\{outcome="pass",probe="gemm"\} [1-9]', metrics, re.M), metrics
        assert re.search(r'^healthd_probe_container_setup_seconds_count\{kind="oci",node_class="testgpu"\} 1\.0$',
                         metrics, re.M), metrics
        print(f"container setup {result.container.setup_seconds:.2f} s, start-up {result.startup_seconds:.2f} s",
              file=sys.stderr)
    finally:
        daemon.kill()
