"""Slurm batch scripts for probe jobs: pure rendering from a ``ProbeJob`` and its launch settings.

One job per probe run, named ``<prefix><probe>.<run id>`` so a restarted daemon finds it again.
The job holds its nodes exclusively for a short time limit and never requeues; ``srun`` starts
one task per GPU (or per configured rank) and rank 0 writes the ``ProbeResult`` to the shared
results directory.

Each task runs in one of five launch environments (:class:`Launcher`, docs/containers.md):
``bare`` (a Python on the node), ``pyxis`` (``srun --container-image=...``, Enroot through the
Pyxis SPANK plugin), ``apptainer`` (``apptainer exec IMAGE ...``, also Singularity), ``oci``
(Slurm's own ``srun --container=BUNDLE``, the runtime of ``oci.conf``; the bundle's ``config.json``
carries the mounts and devices, ``healthd image build --mount``) or ``podman`` (``podman run``
per task: host network and IPC, the GPUs through CDI ``--device=nvidia.com/gpu=all``, the listed
devices such as ``/dev/infiniband``, and the job's ``HEALTHD_*``, ``SLURM_*``, ``NCCL_*`` and
``MASTER_*`` variables passed by name). In a
container the results directory is bind-mounted at its own path and, unless the image has the
``probes`` package itself, the daemon's ``probes`` package is bind-mounted read-only at
``/opt/healthd-probes/probes`` and the task starts there, so ``python -m probes`` finds it first
and everything else (torch, NCCL, its network plugin) comes from the image. A missing image or
runtime makes the step fail before any probe code runs: the job log says why and the collector
records the run as ``error`` with that log tail.
"""

from __future__ import annotations

import math
import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from healthd.errors import ConfigError
from healthd.model import ProbeJob, validate_node_name
from probes.catalogue import CHECK_COMMAND, probe_spec
from probes.timing import CONTAINER_KIND_ENV, LAUNCH_T0_ENV

START_MARGIN_S = 60.0
_UNSAFE = re.compile(r"[\s'\"\\]")

LauncherKind = Literal["bare", "pyxis", "apptainer", "oci", "podman"]
CONTAINER_PROBES_DIR = "/opt/healthd-probes"
"""Where the daemon's ``probes`` package is mounted in a container (as ``<this>/probes``)."""
CONTAINER_IMAGE_ENV = "HEALTHD_CONTAINER_IMAGE"
"""Exported by container launches so the probe can record the image in its environment."""
DEFAULT_CONTAINER_PYTHON = "python3"
DEFAULT_APPTAINER_RUNTIME = "apptainer"
DEFAULT_PODMAN_RUNTIME = "podman"
PODMAN_PASSED_ENV = ("HEALTHD_*", "SLURM_*", "NCCL_*", "MASTER_*", "CUDA_VISIBLE_DEVICES")
"""Passed to ``podman run`` by name (``--env=NAME``, ``--env=PREFIX*``): the host's values win, as
ranks need the step's own ``SLURM_*`` and the site's ``NCCL_*``; ``[slurm] env`` keys are added."""
CDI_ALL_GPUS = "nvidia.com/gpu=all"

_PATH = re.compile(r"^/[A-Za-z0-9._+@%=~/-]*$")
_IMAGE = re.compile(r"^[A-Za-z0-9._+@%=~/:#-]+$")
_COMMAND = re.compile(r"^[A-Za-z0-9._+@%=~/-]+$")
_PYXIS_FLAGS = re.compile(r"^[A-Za-z0-9_=-]+(\+[A-Za-z0-9_=-]+)*$")
_BIND_FLAGS = frozenset({"ro", "rw"})
_OWN_OPTIONS: dict[str, tuple[str, ...]] = {
    "pyxis": ("--container-image", "--container-mounts", "--container-workdir"),
    "apptainer": ("--bind", "-B", "--mount", "--pwd", "--nv"),
    "oci": ("--container",),
    "podman": ("--rm", "--pull", "--network", "--net", "--ipc", "--volume", "-v", "--mount", "--env", "-e",
               "--workdir", "-w", "--device"),
}
_RUNTIME_KINDS = ("apptainer", "podman")


@dataclass(frozen=True)
class Launcher:
    """How a task starts ``python -m probes`` on its node (see the module docstring)."""

    kind: LauncherKind = "bare"
    image: str | None = None
    """pyxis: a squashfs path or an enroot URI; apptainer: a SIF path, sandbox directory or URI."""
    mounts: tuple[str, ...] = ()
    """``SRC:DST[:FLAGS]`` (``SRC`` alone: the same path inside)."""
    args: tuple[str, ...] = ()
    """Extra runtime options (``--opt`` or ``--opt=value``): srun's for pyxis, ``exec``'s for apptainer."""
    python: str | None = None
    """The Python that runs the probe (bare: default ``LaunchSettings.python``; containers: ``python3``)."""
    runtime: str | None = None
    """apptainer only: the runtime command (``apptainer``, ``singularity`` or a path)."""
    probes_dir: Path | None = None
    """Host directory of the ``probes`` package to mount in the container; ``None``: the image has it."""
    devices: tuple[str, ...] = ()
    """podman only: host devices for ``--device`` (``/dev/infiniband``); GPUs come through CDI."""
    image_digest: str | None = None
    """The image's digest (``sha256:…``) when known (``healthd image build``'s record beside it): the
    probe then records ``IMAGE@DIGEST`` as ``environment.container_image``, so a rebuilt image shows."""


def launcher_problems(launcher: Launcher) -> list[str]:
    """What in ``launcher`` cannot be carried into a launch command (pure; empty when it is fine).

    Paths must be absolute and may not hold whitespace, quotes, ``,`` or ``:`` (the runtimes'
    list and field separators); nothing may start with ``-`` where a value is expected (it would
    be read as an option); extra ``args`` must be options and may not repeat the ones healthd sets.
    """
    kind = launcher.kind
    problems: list[str] = []
    if kind == "bare":
        for name, value in (("image", launcher.image), ("runtime", launcher.runtime)):
            if value is not None:
                problems.append(f"{name} is set but the launcher kind is bare")
        if launcher.mounts or launcher.args:
            problems.append("mounts and args need a container launcher (pyxis, apptainer, oci or podman)")
    else:
        if not launcher.image:
            problems.append(f"a {kind} launcher needs an image")
        elif not _IMAGE.match(launcher.image) or launcher.image.startswith("-"):
            problems.append(f"image {launcher.image!r}: only letters, digits and ._+@%=~/:#- are allowed, "
                            "and it may not start with '-'")
        if kind not in _RUNTIME_KINDS and launcher.runtime is not None:
            problems.append(f"runtime is for apptainer and podman launchers; {kind} runs through srun")
        if kind == "oci" and launcher.mounts:
            problems.append("an oci launcher's mounts are in its bundle's config.json (healthd image build --mount)")
        if kind == "oci" and launcher.probes_dir is not None:
            problems.append("an oci launcher cannot mount the daemon's probes package: set probes_from = \"image\"")
        for mount in launcher.mounts:
            problems.extend(_mount_problems(kind, mount))
        for arg in launcher.args:
            name = arg.split("=", 1)[0]
            if not arg.startswith("-") or any(ch in arg for ch in "\n\r\0"):
                problems.append(f"args item {arg!r} is not an option (write --opt or --opt=value)")
            elif name in _OWN_OPTIONS[kind]:
                problems.append(f"args item {arg!r}: healthd sets {name} itself (use image and mounts)")
    if launcher.devices and kind != "podman":
        problems.append("devices are for podman launchers (pyxis, apptainer and oci bring the node's devices "
                        "through their hooks or the bundle)")
    for device in launcher.devices:
        if not _PATH.match(device):
            problems.append(f"device {device!r}: an absolute path without spaces, quotes, ',' or ':'")
    for name, value in (("python", launcher.python), ("runtime", launcher.runtime)):
        if value is not None and (not _COMMAND.match(value) or value.startswith("-")):
            problems.append(f"{name} {value!r}: a command name or absolute path without spaces or quotes")
    if launcher.probes_dir is not None and not _PATH.match(str(launcher.probes_dir)):
        problems.append(f"probes directory {str(launcher.probes_dir)!r} cannot be mounted (absolute path, "
                        "no spaces, quotes, ',' or ':')")
    return problems


def _mount_problems(kind: LauncherKind, mount: str) -> list[str]:
    parts = mount.split(":")
    if len(parts) > 3 or not all(parts[:2]):
        return [f"mount {mount!r}: expected SRC, SRC:DST or SRC:DST:FLAGS"]
    problems = [f"mount {mount!r}: {p!r} is not an absolute path without spaces, quotes or ','"
                for p in parts[:2] if not _PATH.match(p)]
    if len(parts) == 3:
        flags = parts[2]
        if kind in ("apptainer", "podman") and flags not in _BIND_FLAGS:
            problems.append(f"mount {mount!r}: {kind} bind flags are ro or rw")
        elif kind == "pyxis" and not _PYXIS_FLAGS.match(flags):
            problems.append(f"mount {mount!r}: pyxis mount flags are joined with '+', e.g. ro+rprivate")
    return problems


def _destination(mount: str) -> str:
    parts = mount.split(":")
    return parts[1] if len(parts) > 1 else parts[0]


def _within(path: str, directory: str) -> bool:
    directory = directory.rstrip("/") or "/"
    return path == directory or path.startswith(directory + "/") or directory == "/"


def container_mounts(launcher: Launcher, results_dir: Path) -> list[str]:
    """The configured mounts plus the results directory at its own path and, when the image does
    not have it, the ``probes`` package (read-only), unless a configured mount already covers them."""
    mounts = [m if ":" in m else f"{m}:{m}" for m in launcher.mounts]
    targets = [_destination(m) for m in mounts]
    results = str(results_dir)
    if not any(_within(results, t) for t in targets):
        mounts.append(f"{results}:{results}")
    if launcher.probes_dir is not None and not any(_within(CONTAINER_PROBES_DIR, t) for t in targets):
        mounts.append(f"{launcher.probes_dir}:{CONTAINER_PROBES_DIR}/probes:ro")
    return mounts


MAX_NICE = 2147483645
"""The largest ``sbatch --nice`` Slurm accepts."""

DEFAULT_NICE = 1_000_000
"""healthd's ``sbatch --nice``: below every user job, and not Slurm's largest on purpose.

With ``priority/multifactor`` a job's priority is the weighted sum of its factors minus the nice
(at least 1): a million is more than the sum at usual weights. With ``priority/basic`` (FIFO) a job
gets the controller's lowest priority minus one, minus its nice, in 32-bit arithmetic: any nice > 1
puts a probe behind user jobs submitted after it, and the largest one wraps around once a controller
restart has left the lowest priority below it (seen on 22.05 after a restart with a probe queued: the
probe then outranked the users). A million keeps that margin for thousands of such restarts."""


@dataclass(frozen=True)
class LaunchSettings:
    python: str
    results_dir: Path
    job_name_prefix: str = "healthd."
    partition: str | None = None
    qos: str | None = None
    account: str | None = None
    reservation: str | None = None
    extra_sbatch_args: tuple[str, ...] = ()
    pending_timeout_s: float | None = None
    nice: int = DEFAULT_NICE
    env: tuple[tuple[str, str], ...] = field(default_factory=tuple)
    launcher: Launcher = Launcher()


def task_argv(settings: LaunchSettings, probe_args: Sequence[str], *, gpus_per_node: int) -> list[str]:
    """What ``srun`` runs (its own options first, for pyxis): ``python -m probes ARGS`` in the
    launcher's environment."""
    launcher = settings.launcher
    problems = launcher_problems(launcher)
    if problems:
        raise ConfigError(f"launcher ({launcher.kind}): " + "; ".join(problems))
    if launcher.kind == "bare":
        return [launcher.python or settings.python, "-m", "probes", *probe_args]
    assert launcher.image is not None
    mounts = container_mounts(launcher, settings.results_dir)
    for mount in mounts:
        problems += [p for p in _mount_problems(launcher.kind, mount) if p not in problems]
    if problems:
        raise ConfigError(f"launcher ({launcher.kind}): " + "; ".join(problems))
    inside = [launcher.python or DEFAULT_CONTAINER_PYTHON, "-m", "probes", *probe_args]
    workdir = [CONTAINER_PROBES_DIR] if launcher.probes_dir is not None else []
    if launcher.kind == "pyxis":
        # pyxis sets the host's variables after the image's entrypoint, the image's values winning;
        # the site's own ([slurm] env: NCCL_* and the like) must win, so they are named.
        site_env = sorted({key for key, _ in settings.env})
        return [
            f"--container-image={launcher.image}",
            f"--container-mounts={','.join(mounts)}",
            *[f"--container-workdir={w}" for w in workdir],
            *([f"--container-env={','.join(site_env)}"] if site_env else []),
            *launcher.args,
            *inside,
        ]
    if launcher.kind == "oci":
        return [f"--container={launcher.image}", *launcher.args, *inside]
    if launcher.kind == "podman":
        passed = [*PODMAN_PASSED_ENV]
        passed += [key for key, _ in settings.env if not any(_passed_by(p, key) for p in passed)]
        return [
            launcher.runtime or DEFAULT_PODMAN_RUNTIME, "run", "--rm", "--pull=never",
            "--network=host", "--ipc=host",
            *([f"--device={CDI_ALL_GPUS}"] if gpus_per_node > 0 else []),
            *[f"--device={d}" for d in launcher.devices],
            *[f"--volume={m}" for m in mounts],
            *[f"--env={name}" for name in passed],
            *[f"--workdir={w}" for w in workdir],
            *launcher.args,
            launcher.image,
            *inside,
        ]
    return [
        launcher.runtime or DEFAULT_APPTAINER_RUNTIME, "exec",
        *(["--nv"] if gpus_per_node > 0 else []),
        *[f"--bind={m}" for m in mounts],
        *[f"--pwd={w}" for w in workdir],
        *launcher.args,
        launcher.image,
        *inside,
    ]


def _passed_by(pattern: str, key: str) -> bool:
    return key.startswith(pattern[:-1]) if pattern.endswith("*") else key == pattern


def job_name(prefix: str, job: ProbeJob) -> str:
    return f"{prefix}{job.probe}.{job.run_id}"


def run_id_from_job_name(prefix: str, name: str) -> str | None:
    """The run id in a healthd job name, or ``None`` for a job that is not healthd's."""
    if not name.startswith(prefix):
        return None
    rest = name[len(prefix):]
    probe, _, run_id = rest.partition(".")
    return (run_id or None) if probe else None


def time_limit_minutes(timeout_s: float) -> int:
    """Slurm's ``--time`` in whole minutes: the probe's timeout plus start-up margin, rounded up."""
    return max(1, math.ceil((timeout_s + START_MARGIN_S) / 60))


def expectation_args(job: ProbeJob) -> list[str]:
    """``--expect-gpus N [--expect-gpu-uuids GPU-…,…]`` for a torch probe whose nodes must show GPUs
    (pure): the probe then never falls back to the CPU, and a node short of GPUs fails (gpus_missing)."""
    spec = probe_spec(job.probe)
    torch = spec.torch if spec is not None else bool(job.bundle)
    if not job.expect_gpus or not torch:
        return []
    args = ["--expect-gpus", str(job.expect_gpus)]
    if job.expect_gpu_uuids:
        args += ["--expect-gpu-uuids", ",".join(job.expect_gpu_uuids)]
    return args


def check_args(job: ProbeJob, output_dir: Path | None) -> list[str]:
    """The ``python -m probes`` arguments of a combined job (``job.bundle``, pure): ``check`` with each
    run's probe, run id, limit and own options, every document to ``output_dir/<run_id>.json`` (no
    ``output_dir``: stdout)."""
    runs = job.bundle
    args = [
        CHECK_COMMAND,
        "--probes", ",".join(r.probe for r in runs),
        "--run-ids", ",".join(f"{r.probe}={r.run_id}" for r in runs),
        "--limits", ",".join(f"{r.probe}={r.timeout_s:g}" for r in runs),
        "--timeout", f"{job.timeout_s:g}",
    ]
    if output_dir is not None:
        args += ["--output-dir", str(output_dir)]
    args += expectation_args(job)
    for r in runs:
        for token in r.args:
            args += ["--arg", f"{r.probe}={token}"]
    return args


def render_batch_script(job: ProbeJob, settings: LaunchSettings, *, ranks_per_node: int, gpus_per_node: int) -> str:
    """The complete sbatch script for ``job`` (pure; golden-file tested)."""
    for node in job.nodes:
        validate_node_name(node)
    result = settings.results_dir / f"{job.run_id}.json"
    log = settings.results_dir / f"{job.run_id}.log"
    directives = [
        f"--job-name={job_name(settings.job_name_prefix, job)}",
        f"--nodelist={','.join(job.nodes)}",
        f"--nodes={len(job.nodes)}",
        f"--ntasks-per-node={ranks_per_node}",
        "--exclusive",
        f"--time={time_limit_minutes(job.timeout_s)}",
        "--no-requeue",
        f"--output={log}",
        "--open-mode=append",
    ]
    if gpus_per_node > 0:
        directives.append(f"--gpus-per-node={gpus_per_node}")
    if settings.nice:
        directives.append(f"--nice={settings.nice}")
    if settings.pending_timeout_s is not None:
        deadline_s = int(settings.pending_timeout_s + job.timeout_s + START_MARGIN_S)
        directives.append(f"--deadline=now+{deadline_s}")
    for option, value in (("partition", settings.partition), ("qos", settings.qos),
                          ("account", settings.account), ("reservation", settings.reservation)):
        if value:
            directives.append(f"--{option}={value}")
    directives.extend(settings.extra_sbatch_args)

    for directive in directives:
        if _UNSAFE.search(directive):
            raise ConfigError(f"sbatch option {directive!r} has whitespace or quotes, which #SBATCH lines cannot carry")
    probe_args: Sequence[str] = [
        job.probe,
        "--run-id", job.run_id,
        "--output", str(result),
        "--timeout", f"{job.timeout_s:g}",
        *expectation_args(job),
        *job.args,
    ] if not job.bundle else check_args(job, settings.results_dir)
    task = task_argv(settings, probe_args, gpus_per_node=gpus_per_node)
    srun_argv = ["srun", "--kill-on-bad-exit=1", f"--ntasks-per-node={ranks_per_node}", *task]
    launcher = settings.launcher
    lines = ["#!/bin/bash"]
    lines += [f"#SBATCH {d}" for d in directives]
    lines += [
        "# Generated by healthd: one probe run. Rank 0 writes the result document; the daemon",
        "# reads it from the shared results directory and this job's log on failure.",
    ] if not job.bundle else [
        f"# Generated by healthd: {len(job.bundle)} probe runs after one start-up (python -m probes check).",
        "# Rank 0 writes each run's result document; the daemon reads them from the shared results",
        "# directory and this job's log on failure.",
    ]
    if launcher.kind != "bare":
        lines.append(f"# Launcher: {launcher.kind}; a missing image or runtime fails the step before the probe "
                     "starts (recorded as error).")
    lines += [
        "set -u",
        f"export HEALTHD_RUN_ID={shlex.quote(job.run_id)}",
    ]
    if launcher.image is not None:
        named = f"{launcher.image}@{launcher.image_digest}" if launcher.image_digest else launcher.image
        lines.append(f"export {CONTAINER_IMAGE_ENV}={shlex.quote(named)}")
    lines += [f"export {key}={shlex.quote(value)}" for key, value in settings.env]
    if launcher.kind != "bare":  # the probe counts its container's start-up from here (probes.timing)
        lines += [f"export {CONTAINER_KIND_ENV}={launcher.kind}", f'export {LAUNCH_T0_ENV}="$(date +%s.%N)"']
    lines += [
        "exec " + shlex.join(srun_argv),
        "",
    ]
    return "\n".join(lines)
