"""This machine as a one-node cluster: the embedded default when no Slurm answers.

Probes run as ``python -m probes <name>`` subprocesses in their own session, with a hard
deadline after which the whole process group is killed. Job ids are
``local:<pid>:<run_id>`` so that, after a daemon restart, a leftover probe process can be
recognised (its command line carries the run id) and killed.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from healthd.cluster.base import BackendTraits
from healthd.config import Settings
from healthd.errors import BackendError, CommandTimeout, ConfigError, HealthdError
from healthd.jobs import check_args, expectation_args
from healthd.logging import get_logger
from healthd.model import JobState, JobStatus, Node, ProbeJob
from healthd.node_class import DEFAULT_CLASS, gpu_type_of
from healthd.process import kill_group, run
from probes.catalogue import probe_spec
from probes.gpus import NodeGpu, node_gpus

log = get_logger(__name__)

KILL_GRACE_S = 10.0
TORCH_CHECK_TIMEOUT_S = 5.0
_NO_TORCH = 3
_FIND_TORCH = f"import importlib.util, sys; sys.exit(0 if importlib.util.find_spec('torch') else {_NO_TORCH})"


def probe_argv(python: Path | str, job: ProbeJob, result_path: Path | None, *, ranks: int | None) -> list[str]:
    """The argv that runs ``job`` on this machine (pure); no ``result_path``: the result goes to stdout.
    No ``ranks`` (nor ``job.ranks_per_node``): the probes' launcher starts one rank per visible GPU."""
    if job.bundle:
        return _check_argv(python, job, result_path, ranks=ranks)
    argv = [str(python), "-m", "probes", job.probe, "--run-id", job.run_id, "--timeout", f"{job.timeout_s:g}"]
    if result_path is not None:
        argv += ["--output", str(result_path)]
    nproc = job.ranks_per_node or ranks
    if (spec := probe_spec(job.probe)) is not None and spec.local_ranks and nproc is not None:
        argv += ["--nproc", str(nproc)]
    return argv + expectation_args(job) + list(job.args)


def _check_argv(python: Path | str, job: ProbeJob, result_path: Path | None, *, ranks: int | None) -> list[str]:
    """A combined job (``job.bundle``): ``python -m probes check``, every run's document next to ``result_path``."""
    argv = [str(python), "-m", "probes", *check_args(job, result_path.parent if result_path is not None else None)]
    nproc = job.ranks_per_node or ranks
    if nproc is not None and any((spec := probe_spec(r.probe)) is not None and spec.local_ranks for r in job.bundle):
        argv += ["--nproc", str(nproc)]
    return argv


def torch_problem(python: Path, *, timeout_s: float = TORCH_CHECK_TIMEOUT_S) -> str | None:
    """What keeps ``python`` from running the probes ("cannot import torch", "cannot be run (...)"), or None.

    This interpreter is asked in-process; another one with a short subprocess. None also when that
    does not answer within ``timeout_s`` or fails otherwise (logged): the probes then report why.
    """
    if os.path.abspath(python) == os.path.abspath(sys.executable):
        return None if importlib.util.find_spec("torch") is not None else "cannot import torch"
    try:
        done = run([str(python), "-c", _FIND_TORCH], timeout=timeout_s)
    except CommandTimeout:
        log.warning("probe_python_unchecked", python=str(python), why=f"no answer within {timeout_s:g} s")
        return None
    except HealthdError as exc:
        return f"cannot be run ({exc.__cause__ or exc})"
    if done.returncode == _NO_TORCH:
        return "cannot import torch"
    if done.returncode != 0:
        log.warning("probe_python_unchecked", python=str(python), why=f"exit code {done.returncode}",
                    stderr=done.stderr[-500:])
    return None


def require_probe_python(python: Path, use: str) -> None:
    """Refuse to start when ``python`` cannot run the probes; ``use`` says why this machine runs them.

    :raises ConfigError: naming ``local.python`` and the ``healthd[probes]`` extra.
    """
    problem = torch_problem(python)
    if problem is not None:
        raise ConfigError(
            f"{use} with local.python = {python}, which {problem}. Install healthd's probes extra there "
            "(pip install 'healthd[probes]') or point local.python at a Python that has it"
        )


def discover_gpus() -> list[NodeGpu]:
    """This machine's GPUs: ``nvidia-smi -L``, else NVML, else (no names, no UUIDs) one per entry of
    ``/proc/driver/nvidia/gpus``, where the driver is loaded but neither tool is installed."""
    listed = node_gpus()
    if listed:
        return listed
    try:
        return [NodeGpu(i, "") for i, _ in enumerate(sorted(os.listdir("/proc/driver/nvidia/gpus")))]
    except OSError:
        return []


GPU_REDISCOVER_S = 300.0
"""How often the local backend lists this machine's GPUs again (``nvidia-smi -L`` or NVML)."""


@dataclass(frozen=True)
class LocalGpus:
    """What this machine must have, from its GPUs as listed and the ``[local]`` settings (pure)."""

    count: int
    """GPUs every probe must find: ``[local] gpus``, else the most ever listed by this daemon."""
    gpu_type: str | None
    node_class: str

    @classmethod
    def of(cls, most_listed: Sequence[NodeGpu], *, gpus: int | None = None, node_class: str | None = None
           ) -> LocalGpus:
        """``most_listed``: the largest listing seen so far (a GPU that fell off the bus stays expected)."""
        count = len(most_listed) if gpus is None else gpus
        gpu_type = gpu_type_of(most_listed[0].name) if most_listed and most_listed[0].name else None
        if node_class is None:
            node_class = f"{gpu_type or 'gpu'}x{count}" if count else DEFAULT_CLASS
        return cls(count, gpu_type if count else None, node_class)


@dataclass
class _Running:
    proc: subprocess.Popen[bytes]
    run_id: str
    started_at: float
    deadline: float
    log_file: Path
    timed_out: bool = False


class LocalBackend:
    name = "local"

    def __init__(
        self, *, node_name: str, python: Path, ranks: int | None = None, env: dict[str, str] | None = None,
        gpus: int | None = None, node_class: str | None = None,
        list_gpus: Callable[[], list[NodeGpu]] = discover_gpus,
    ) -> None:
        self.node_name = node_name
        self.python = python
        self.ranks = ranks
        self._env = env
        self._jobs: dict[str, _Running] = {}
        self._finished: dict[str, JobStatus] = {}
        self._lock = threading.Lock()
        self._gpus_setting, self._class_setting, self._list_gpus = gpus, node_class, list_gpus
        self._most_listed: list[NodeGpu] = []
        self._listed_at = float("-inf")
        self.gpus = self._discover()

    def _discover(self) -> LocalGpus:
        """This machine's GPUs, listed again every ``GPU_REDISCOVER_S`` (the largest listing is kept)."""
        now = time.monotonic()
        if now - self._listed_at >= GPU_REDISCOVER_S:
            self._listed_at = now
            listed = self._list_gpus()
            if len(listed) > len(self._most_listed):
                if self._most_listed:
                    log.info("local_gpus_more", before=len(self._most_listed), now=len(listed))
                self._most_listed = listed
            elif len(listed) < len(self._most_listed):
                log.warning("local_gpus_fewer", expected=len(self._most_listed), listed=len(listed))
        return LocalGpus.of(self._most_listed, gpus=self._gpus_setting, node_class=self._class_setting)

    def traits(self, settings: Settings) -> BackendTraits:
        return BackendTraits(max_jobs_in_flight=settings.local.max_concurrent, probes_in_daemon=True,
                             runs_jobs_on_drained=True)

    def list_nodes(self) -> list[Node]:
        with self._lock:
            busy = any(r.proc.poll() is None for r in self._jobs.values())
        self.gpus = self._discover()
        return [
            Node(
                name=self.node_name,
                state="allocated" if busy else "idle",
                partitions=("local",),
                gpus=self.gpus.count,
                gpu_type=self.gpus.gpu_type,
                cpus=os.cpu_count(),
                node_class=self.gpus.node_class,
                gpu_uuids=tuple(g.uuid for g in self._most_listed if g.uuid),
            )
        ]

    def submit(self, job: ProbeJob, result_path: Path) -> str:
        if set(job.nodes) != {self.node_name}:
            raise BackendError(f"the local backend only runs on {self.node_name!r}, not {list(job.nodes)}")
        result_path.parent.mkdir(parents=True, exist_ok=True)
        log_file = result_path.with_suffix(".log")
        argv = probe_argv(self.python, job, result_path, ranks=self.ranks)
        env = dict(os.environ if self._env is None else self._env)
        env.setdefault("SLURMD_NODENAME", self.node_name)
        env["PYTHONUNBUFFERED"] = "1"
        try:
            with log_file.open("wb") as out:
                proc = subprocess.Popen(
                    argv,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    env=env,
                    start_new_session=True,
                )
        except OSError as exc:
            raise BackendError(f"cannot start the probe with {argv[0]!r}: {exc}") from None
        now = time.time()
        job_id = f"local:{proc.pid}:{job.run_id}"
        with self._lock:
            self._jobs[job_id] = _Running(proc, job.run_id, now, now + job.timeout_s + KILL_GRACE_S, log_file)
        return job_id

    def poll(self, job_ids: Sequence[str]) -> dict[str, JobStatus]:
        now = time.time()
        statuses: dict[str, JobStatus] = {}
        with self._lock:
            for job_id in job_ids:
                if job_id in self._finished:
                    statuses[job_id] = self._finished[job_id]
                    continue
                running = self._jobs.get(job_id)
                if running is None:
                    continue
                rc = running.proc.poll()
                if rc is None and now > running.deadline:
                    log.warning("probe_timeout_killed", run_id=running.run_id, pid=running.proc.pid)
                    kill_group(running.proc)
                    running.timed_out = True
                    rc = running.proc.returncode
                if rc is None:
                    statuses[job_id] = JobStatus(job_id, JobState.RUNNING, started_at=running.started_at)
                    continue
                if running.timed_out:
                    state, reason = JobState.TIMEOUT, "killed after its timeout"
                elif rc == 0:
                    state, reason = JobState.COMPLETED, ""
                elif rc < 0:
                    state, reason = JobState.FAILED, f"killed by signal {signal.Signals(-rc).name}"
                else:
                    state, reason = JobState.FAILED, f"exit code {rc}"
                status = JobStatus(
                    job_id,
                    state,
                    exit_code=rc,
                    reason=reason,
                    started_at=running.started_at,
                    finished_at=now,
                    nodes=(self.node_name,),
                )
                self._finished[job_id] = status
                del self._jobs[job_id]
                statuses[job_id] = status
        return statuses

    def adopt(self) -> list[JobStatus]:
        return []

    def forget(self, job_ids: Sequence[str]) -> None:
        with self._lock:
            for job_id in job_ids:
                self._finished.pop(job_id, None)

    def cancel(self, job_ids: Sequence[str]) -> None:
        for job_id in job_ids:
            with self._lock:
                running = self._jobs.pop(job_id, None)
            if running is not None:
                kill_group(running.proc)
                continue
            _kill_orphan(job_id)

    def drain(self, node: str, reason: str) -> None:
        raise BackendError("the local backend cannot drain a node; use recommend mode or the Slurm backend")

    def undrain(self, node: str) -> None:
        raise BackendError("the local backend cannot undrain a node")

    def close(self) -> None:
        """Kill every running probe; their next ``poll`` reports them cancelled (daemon stopped)."""
        with self._lock:
            running, self._jobs = dict(self._jobs), {}
        for job_id, r in running.items():
            kill_group(r.proc)
            with self._lock:
                self._finished[job_id] = JobStatus(
                    job_id,
                    JobState.CANCELLED,
                    exit_code=r.proc.returncode,
                    reason="daemon stopped",
                    started_at=r.started_at,
                    finished_at=time.time(),
                    nodes=(self.node_name,),
                )


def _kill_orphan(job_id: str) -> bool:
    """Kill the process group of a probe left by an earlier daemon, if it is still ours."""
    parts = job_id.split(":", 2)
    if len(parts) != 3 or parts[0] != "local" or not parts[1].isdigit():
        return False
    pid, run_id = int(parts[1]), parts[2]
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    named = {piece for token in cmdline for item in token.split(b",") for piece in (item, item.partition(b"=")[2])}
    if run_id.encode() not in named:  # a run id of its own, or one of a check's --run-ids PROBE=ID,...
        return False
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        return False
    log.warning("orphan_probe_killed", pid=pid, run_id=run_id)
    return True
