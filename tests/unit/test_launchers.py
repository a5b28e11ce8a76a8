"""Launch environments: batch scripts per launcher (golden files), what cannot be carried, and
which launcher and transport expectation a job gets from the config (probe vs node class)."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import time
from pathlib import Path

import pytest

from healthd.cluster.slurm import LaunchChoices, choose_launch
from healthd.collector import log_tail
from healthd.config import load_settings
from healthd.errors import ConfigError
from healthd.jobs import Launcher, LaunchSettings, container_mounts, launcher_problems, render_batch_script
from healthd.model import BundledRun, ProbeJob
from probes.result import ContainerStart
from probes.runner import container_start
from probes.timing import budget_t0, container_setup_seconds
from tests.golden_files import assert_golden

FAILURES = Path(__file__).resolve().parents[1] / "fixtures" / "launchers"
RESULTS = Path("/shared/healthd/results")
PROBES_DIR = Path("/opt/healthd/lib/python3.11/site-packages/probes")
PAIR = ProbeJob(run_id="feedfacecafe0002", probe="nccl", nodes=("gpu01", "gpu02"), timeout_s=120.0,
                args=("--sizes", "8K,64M,1G", "--expect-transport", "IB"))

PYXIS = Launcher(
    kind="pyxis",
    image="/shared/images/pytorch-24.05-py3.sqsh",
    mounts=("/opt/hpcx/nccl_rdma_sharp_plugin:/opt/hpcx/nccl_rdma_sharp_plugin:ro", "/etc/nccl.conf:/etc/nccl.conf:ro"),
    args=("--no-container-mount-home", "--container-writable"),
    probes_dir=PROBES_DIR,
)
APPTAINER = Launcher(
    kind="apptainer",
    image="/shared/images/pytorch_24.05.sif",
    mounts=("/opt/amazon/efa:/opt/amazon/efa:ro", "/opt/aws-ofi-nccl:/opt/aws-ofi-nccl:ro", "/scratch"),
    args=("--writable-tmpfs",),
    python="/opt/conda/bin/python",
    runtime="singularity",
)


def settings(launcher: Launcher) -> LaunchSettings:
    return LaunchSettings(python="/opt/healthd/bin/python", results_dir=RESULTS, partition="gpu",
                          pending_timeout_s=600.0, launcher=launcher)


def exec_argv(script: str) -> list[str]:
    (line,) = [ln for ln in script.splitlines() if ln.startswith("exec ")]
    return shlex.split(line)[1:]


def test_pyxis_script() -> None:
    script = render_batch_script(PAIR, settings(PYXIS), ranks_per_node=8, gpus_per_node=8)
    assert_golden("sbatch_pyxis_nccl_pair.sh", script)
    argv = exec_argv(script)
    assert argv[:3] == ["srun", "--kill-on-bad-exit=1", "--ntasks-per-node=8"]
    assert argv[3] == "--container-image=/shared/images/pytorch-24.05-py3.sqsh"
    assert argv[4].split("=", 1)[1].split(",") == [
        "/opt/hpcx/nccl_rdma_sharp_plugin:/opt/hpcx/nccl_rdma_sharp_plugin:ro", "/etc/nccl.conf:/etc/nccl.conf:ro",
        "/shared/healthd/results:/shared/healthd/results",
        "/opt/healthd/lib/python3.11/site-packages/probes:/opt/healthd-probes/probes:ro"]
    assert argv[5] == "--container-workdir=/opt/healthd-probes"
    assert argv[8:12] == ["python3", "-m", "probes", "nccl"]
    assert "export HEALTHD_CONTAINER_IMAGE=/shared/images/pytorch-24.05-py3.sqsh" in script.splitlines()


def test_apptainer_script() -> None:
    script = render_batch_script(PAIR, settings(APPTAINER), ranks_per_node=8, gpus_per_node=8)
    assert_golden("sbatch_apptainer_nccl_pair.sh", script)
    argv = exec_argv(script)
    assert argv[3:5] == ["singularity", "exec"]
    assert argv[5] == "--nv"
    assert argv[6:10] == ["--bind=/opt/amazon/efa:/opt/amazon/efa:ro", "--bind=/opt/aws-ofi-nccl:/opt/aws-ofi-nccl:ro",
                          "--bind=/scratch:/scratch", "--bind=/shared/healthd/results:/shared/healthd/results"]
    assert argv[10:13] == ["--writable-tmpfs", "/shared/images/pytorch_24.05.sif", "/opt/conda/bin/python"]
    assert "--pwd=/opt/healthd-probes" not in argv  # the image has the probes package


def test_apptainer_on_cpu_nodes_has_no_nv_and_mounts_the_probes() -> None:
    launcher = Launcher(kind="apptainer", image="docker://nvcr.io/nvidia/pytorch:24.05-py3", probes_dir=PROBES_DIR)
    job = ProbeJob(run_id="r1", probe="gemm", nodes=("node1",), timeout_s=60.0)
    argv = exec_argv(render_batch_script(job, settings(launcher), ranks_per_node=1, gpus_per_node=0))
    assert argv[3:10] == [
        "apptainer", "exec", "--bind=/shared/healthd/results:/shared/healthd/results",
        "--bind=/opt/healthd/lib/python3.11/site-packages/probes:/opt/healthd-probes/probes:ro",
        "--pwd=/opt/healthd-probes", "docker://nvcr.io/nvidia/pytorch:24.05-py3", "python3"]


def test_bare_launcher_with_its_own_python_and_unchanged_default() -> None:
    job = ProbeJob(run_id="r1", probe="gemm", nodes=("gh01",), timeout_s=60.0)
    argv = exec_argv(render_batch_script(job, settings(Launcher(python="/opt/healthd-arm64/bin/python")),
                                         ranks_per_node=4, gpus_per_node=4))
    assert argv[3:6] == ["/opt/healthd-arm64/bin/python", "-m", "probes"]
    default = render_batch_script(job, settings(Launcher()), ranks_per_node=4, gpus_per_node=4)
    assert exec_argv(default)[3] == "/opt/healthd/bin/python"
    assert "HEALTHD_CONTAINER_IMAGE" not in default and "# Launcher" not in default
    assert "HEALTHD_LAUNCH_T0" not in default and "HEALTHD_CONTAINER_KIND" not in default


def test_a_container_script_stamps_its_launch_and_the_probe_counts_the_start_up_in_its_budget(
        tmp_path: Path) -> None:
    """The exports before ``exec srun``, run by bash as Slurm runs the script (srun replaced by
    ``env``): the launch time is a real clock reading, and the probe's clock (``budget_t0``,
    ``container_start``) counts from it."""
    job = ProbeJob(run_id="r1", probe="gemm", nodes=("node1",), timeout_s=60.0)
    script = render_batch_script(job, settings(Launcher(kind="oci", image="/shared/bundle")), ranks_per_node=1,
                                 gpus_per_node=0)
    exports = "\n".join(ln for ln in script.splitlines() if ln.startswith("export "))
    before = time.time()
    done = subprocess.run(["bash", "-c", exports + "\nexec env"], capture_output=True, text=True, timeout=30,
                          env={"PATH": os.environ["PATH"]})
    env = dict(line.split("=", 1) for line in done.stdout.splitlines() if "=" in line)
    assert env["HEALTHD_CONTAINER_KIND"] == "oci"
    launched = float(env["HEALTHD_LAUNCH_T0"])
    assert before - 0.01 <= launched <= time.time()
    started = launched + 4.25  # the probe's own start, 4.25 s of container start-up later
    assert budget_t0(started, env) == launched and budget_t0(started, {}) == started
    assert container_start(started, env) == ContainerStart(kind="oci", setup_seconds=4.25)
    assert container_start(started, {**env, "HEALTHD_CONTAINER_KIND": "docker"}) is None
    assert container_start(started, {"HEALTHD_CONTAINER_KIND": "oci"}) is None
    assert container_setup_seconds(launched - 1.0, env) == 0.0  # another node's clock a little behind
    assert container_setup_seconds(started, {"HEALTHD_LAUNCH_T0": "nan"}) is None


def test_mounts_already_covering_the_results_or_probes_are_not_repeated() -> None:
    launcher = Launcher(kind="pyxis", image="img.sqsh", mounts=("/shared", "/srv/probes:/opt/healthd-probes:ro"),
                        probes_dir=PROBES_DIR)
    assert container_mounts(launcher, RESULTS) == ["/shared:/shared", "/srv/probes:/opt/healthd-probes:ro"]


@pytest.mark.parametrize(("launcher", "problem"), [
    (Launcher(kind="pyxis"), "a pyxis launcher needs an image"),
    (Launcher(kind="apptainer", image="/images/my image.sif"), "image '/images/my image.sif': only letters"),
    (Launcher(kind="pyxis", image="--container-remap-root"), "may not start with '-'"),
    (Launcher(kind="pyxis", image="i.sqsh", mounts=("/a,/b:/b",)), "'/a,/b' is not an absolute path"),
    (Launcher(kind="pyxis", image="i.sqsh", mounts=("relative:/x",)), "'relative' is not an absolute path"),
    (Launcher(kind="pyxis", image="i.sqsh", mounts=("/a:/b:ro:x",)), "expected SRC, SRC:DST or SRC:DST:FLAGS"),
    (Launcher(kind="apptainer", image="i.sif", mounts=("/a:/b:ro+rprivate",)), "apptainer bind flags are ro or rw"),
    (Launcher(kind="pyxis", image="i.sqsh", mounts=("/a:/b:ro,rprivate",)), "joined with '+'"),
    (Launcher(kind="pyxis", image="i.sqsh", args=("container-writable",)), "is not an option"),
    (Launcher(kind="pyxis", image="i.sqsh", args=("--container-image=other",)), "healthd sets --container-image"),
    (Launcher(kind="apptainer", image="i.sif", args=("-B",)), "healthd sets -B itself"),
    (Launcher(kind="pyxis", image="i.sqsh", runtime="enroot"), "runtime is for apptainer and podman launchers"),
    (Launcher(kind="oci", image="/b", runtime="crun"), "runtime is for apptainer and podman launchers; oci runs"),
    (Launcher(kind="oci", image="/b", mounts=("/a",)), "mounts are in its bundle's config.json"),
    (Launcher(kind="oci", image="/b", probes_dir=PROBES_DIR), 'set probes_from = "image"'),
    (Launcher(kind="oci", image="/b", args=("--container=/other",)), "healthd sets --container itself"),
    (Launcher(kind="podman", image="i", args=("--network=none",)), "healthd sets --network itself"),
    (Launcher(kind="podman", image="i", mounts=("/a:/b:z",)), "podman bind flags are ro or rw"),
    (Launcher(kind="podman", image="i", devices=("dev/infiniband",)), "device 'dev/infiniband'"),
    (Launcher(kind="pyxis", image="i.sqsh", devices=("/dev/infiniband",)), "devices are for podman launchers"),
    (Launcher(kind="apptainer", image="i.sif", runtime="apptainer --debug"), "runtime 'apptainer --debug'"),
    (Launcher(image="i.sif"), "image is set but the launcher kind is bare"),
    (Launcher(mounts=("/a",)), "mounts and args need a container launcher"),
    (Launcher(python="-c"), "python '-c'"),
])
def test_what_cannot_be_carried(launcher: Launcher, problem: str) -> None:
    problems = launcher_problems(launcher)
    assert any(problem in p for p in problems), problems
    with pytest.raises(ConfigError, match=f"launcher \\({launcher.kind}\\): "):
        render_batch_script(PAIR, settings(launcher), ranks_per_node=8, gpus_per_node=8)


def test_results_dir_that_cannot_be_mounted() -> None:
    odd = LaunchSettings(python="python3", results_dir=Path("/shared/a:b"), launcher=PYXIS)
    with pytest.raises(ConfigError, match=re.escape("mount '/shared/a:b:/shared/a:b': expected SRC, SRC:DST or")):
        render_batch_script(PAIR, odd, ranks_per_node=8, gpus_per_node=8)


OCI = Launcher(kind="oci", image="/shared/images/healthd-probe/bundle")
PODMAN = Launcher(
    kind="podman",
    image="localhost/healthd-probe:0123456789abcdef",
    mounts=("/etc/nccl.conf:/etc/nccl.conf:ro",),
    devices=("/dev/infiniband",),
    args=("--security-opt=label=disable",),
    probes_dir=PROBES_DIR,
)
ENV_SETTINGS = (("NCCL_IB_HCA", "mlx5"), ("UCX_TLS", "rc"))


def test_oci_script() -> None:
    """Slurm's own OCI path: the bundle on srun's line; mounts, devices and the network are the
    bundle's (config.json) and Slurm hands the step's environment to the container process."""
    script = render_batch_script(PAIR, settings(OCI), ranks_per_node=8, gpus_per_node=8)
    assert_golden("sbatch_oci_nccl_pair.sh", script)
    argv = exec_argv(script)
    assert argv[3] == "--container=/shared/images/healthd-probe/bundle"
    assert argv[4:8] == ["python3", "-m", "probes", "nccl"]


def test_podman_script() -> None:
    """podman per task: host network and IPC (NCCL across nodes, shared memory), GPUs through CDI,
    /dev/infiniband, the results and probes mounts, the step's variables passed by name."""
    launch = LaunchSettings(python="/opt/healthd/bin/python", results_dir=RESULTS, partition="gpu",
                            pending_timeout_s=600.0, launcher=PODMAN, env=ENV_SETTINGS)
    script = render_batch_script(PAIR, launch, ranks_per_node=8, gpus_per_node=8)
    assert_golden("sbatch_podman_nccl_pair.sh", script)
    argv = exec_argv(script)
    assert argv[3:9] == ["podman", "run", "--rm", "--pull=never", "--network=host", "--ipc=host"]
    assert argv[9:11] == ["--device=nvidia.com/gpu=all", "--device=/dev/infiniband"]
    assert [a for a in argv if a.startswith("--volume=")] == [
        "--volume=/etc/nccl.conf:/etc/nccl.conf:ro", "--volume=/shared/healthd/results:/shared/healthd/results",
        "--volume=/opt/healthd/lib/python3.11/site-packages/probes:/opt/healthd-probes/probes:ro"]
    assert [a for a in argv if a.startswith("--env=")] == [
        "--env=HEALTHD_*", "--env=SLURM_*", "--env=NCCL_*", "--env=MASTER_*", "--env=CUDA_VISIBLE_DEVICES",
        "--env=UCX_TLS"]  # NCCL_IB_HCA is covered by NCCL_*
    assert "export UCX_TLS=rc" in script.splitlines()
    image_at = argv.index("localhost/healthd-probe:0123456789abcdef")
    assert argv[image_at - 2:image_at] == ["--workdir=/opt/healthd-probes", "--security-opt=label=disable"]
    assert argv[image_at + 1:image_at + 5] == ["python3", "-m", "probes", "nccl"]


def test_pyxis_names_the_sites_variables_so_they_win_over_the_images() -> None:
    """pyxis: "names of environment variables to override with the host environment and set at the
    entrypoint" (``--container-env=NAME[,NAME...]``); without it the image's values win."""
    launch = LaunchSettings(python="python3", results_dir=RESULTS, launcher=PYXIS, env=ENV_SETTINGS)
    argv = exec_argv(render_batch_script(PAIR, launch, ranks_per_node=8, gpus_per_node=8))
    assert argv[6] == "--container-env=NCCL_IB_HCA,UCX_TLS"
    assert "--container-env" not in " ".join(exec_argv(render_batch_script(PAIR, settings(PYXIS), ranks_per_node=8,
                                                                          gpus_per_node=8)))


def test_podman_on_cpu_nodes_has_no_cdi_device() -> None:
    launcher = Launcher(kind="podman", image="healthd-probe:x", runtime="/usr/bin/podman")
    argv = exec_argv(render_batch_script(PAIR, settings(launcher), ranks_per_node=2, gpus_per_node=0))
    assert argv[3] == "/usr/bin/podman"
    assert not any(a.startswith("--device") for a in argv)


def test_valid_launchers_have_no_problems() -> None:
    for launcher in (PYXIS, APPTAINER, OCI, PODMAN, Launcher(),
                     Launcher(kind="pyxis", image="nvcr.io#nvidia/pytorch:24.05-py3")):
        assert launcher_problems(launcher) == []


CONFIG = """
[probes.nccl]
expected_transport = ["IB", "OFI"]
[probes.nccl.launcher]
kind = "pyxis"
image = "/shared/images/pytorch.sqsh"
mounts = ["/opt/plugins:/opt/plugins:ro"]

[probes.gemm]

[[slurm.node_classes]]
name = "gh200"
gpu_type = "gh200"
expected_transport = ["IB"]
[slurm.node_classes.launcher]
kind = "apptainer"
image = "/shared/images/pytorch-arm64.sif"
probes_from = "image"

[[slurm.node_classes]]
name = "l40s"
gpu_type = "l40s"
expected_transport = []
[slurm.node_classes.launcher]
kind = "bare"
python = "/opt/healthd-l40s/bin/python"
"""


def test_class_settings_override_the_probe_settings(tmp_path: Path) -> None:
    path = tmp_path / "healthd.toml"
    path.write_text(CONFIG)
    loaded, _ = load_settings(path)
    choices = LaunchChoices.from_settings(loaded, probes_dir=PROBES_DIR)
    base = LaunchSettings(python="/opt/healthd/bin/python", results_dir=RESULTS)
    nccl = ProbeJob(run_id="r1", probe="nccl", nodes=("n1",), args=("--sizes", "8K"))
    gemm = ProbeJob(run_id="r2", probe="gemm", nodes=("n1",))

    job, launch = choose_launch(nccl, base, choices, "h100x8")
    assert job.args == ("--sizes", "8K", "--expect-transport", "IB,OFI")
    assert launch.launcher == Launcher(kind="pyxis", image="/shared/images/pytorch.sqsh",
                                       mounts=("/opt/plugins:/opt/plugins:ro",), probes_dir=PROBES_DIR)
    job, launch = choose_launch(nccl, base, choices, "gh200")
    assert job.args[-2:] == ("--expect-transport", "IB")
    assert launch.launcher == Launcher(kind="apptainer", image="/shared/images/pytorch-arm64.sif", probes_dir=None)
    job, launch = choose_launch(nccl, base, choices, "l40s")
    assert job.args == nccl.args  # an explicit empty list: nothing expected on this class
    assert launch.launcher == Launcher(python="/opt/healthd-l40s/bin/python")
    job, launch = choose_launch(gemm, base, choices, "h100x8")
    assert job == gemm and launch == base  # gemm: bare, no transport option
    job, launch = choose_launch(gemm, base, choices, "gh200")
    assert job == gemm and launch.launcher.kind == "apptainer"
    already = ProbeJob(run_id="r3", probe="nccl", nodes=("n1",), args=("--expect-transport", "Socket"))
    assert choose_launch(already, base, choices, None)[0] == already
    check = ProbeJob(run_id="r4", probe="check", nodes=("n1",),
                     bundle=(BundledRun("r4", "env"), BundledRun("r5", "nccl", ("--sizes", "8K"))))
    job, launch = choose_launch(check, base, choices, "h100x8")
    assert job.bundle == (BundledRun("r4", "env"), BundledRun("r5", "nccl", ("--sizes", "8K", "--expect-transport",
                                                                              "IB,OFI")))
    assert launch.launcher.kind == "bare"  # env's: the planner combines only probes with one launcher
    assert choose_launch(check, base, choices, "gh200")[1].launcher.kind == "apptainer"  # the class's


@pytest.mark.parametrize(("text", "key", "message"), [
    ("[probes.nccl.launcher]\nkind = 'pyxis'\n", "probes.nccl.launcher", "a pyxis launcher needs an image"),
    ("[probes.nccl.launcher]\nkind = 'docker'\n", "probes.nccl.launcher.kind",
     "'bare', 'pyxis', 'apptainer', 'oci' or 'podman'"),
    ("[probes.nccl.launcher]\nkind = 'oci'\nimage = '/b'\n", "probes.nccl.launcher", 'set probes_from = "image"'),
    ("[probes.nccl.launcher]\nkind = 'apptainer'\nimage = 'x.sif'\nbinds = ['/a']\n",
     "probes.nccl.launcher.binds", "Extra inputs are not permitted"),
    ("[[slurm.node_classes]]\nname = 'a'\n[slurm.node_classes.launcher]\nkind = 'apptainer'\nimage = 'a b.sif'\n",
     "slurm.node_classes.0.launcher", "only letters, digits"),
    ("[probes.nccl]\nexpected_transport = ['IB;rm']\n", "probes.nccl.expected_transport.0", "should match pattern"),
])
def test_bad_launcher_config_names_the_key(tmp_path: Path, text: str, key: str, message: str) -> None:
    path = tmp_path / "healthd.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        load_settings(path)
    assert f"  {key}: " in str(err.value) and message in str(err.value), str(err.value)


@pytest.mark.parametrize(("log", "reason"), [
    ("slurm-22.05_apptainer_runtime_missing.log",
     "slurmstepd-node1: error: execve(): apptainer: No such file or directory"
     " | slurmstepd-node2: error: execve(): apptainer: No such file or directory"),
    ("slurm-22.05_no_pyxis.log",
     "srun: unrecognized option '--container-image=/nonexistent/x.sqsh' | Try \"srun --help\" for more information"),
    ("pyxis-127_import_failed.log",
     "slurmstepd: error: pyxis: failed to import docker image | slurmstepd: error: pyxis: printing enroot log file:"
     " | slurmstepd: error: pyxis:     [INFO] Querying registry for permission grant"
     " | slurmstepd: error: pyxis:     [INFO] Authenticating with user: <anonymous>"
     " | slurmstepd: error: pyxis: couldn't start container"),
    ("pyxis-61_switchroot_two_nodes.log",
     "slurmstepd: error: pyxis: container start failed with error code: 1"
     " | slurmstepd: error: pyxis: printing contents of log file ..."
     " | slurmstepd: error: pyxis:     enroot-switchroot: failed to execute: /bin/bash: No such file or directory"
     " | slurmstepd: error: pyxis: couldn't start container"
     " | slurmstepd: error: pyxis: if the image has an unusual entrypoint, try using --no-container-entrypoint"),
])
def test_log_tail_keeps_the_launchers_message(tmp_path: Path, log: str, reason: str) -> None:
    (tmp_path / "run1.log").write_bytes((FAILURES / log).read_bytes())
    assert log_tail(tmp_path / "run1.json") == reason


def test_log_tail_of_only_slurm_lines_still_says_something(tmp_path: Path) -> None:
    (tmp_path / "run1.log").write_text("srun: error: node1: task 0: Exited with exit code 1\n")
    assert log_tail(tmp_path / "run1.json") == "srun: error: node1: task 0: Exited with exit code 1"
