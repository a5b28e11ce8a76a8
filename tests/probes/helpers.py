"""Helpers to run ``python -m probes`` as real processes (gloo on CPU) and read their result."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from probes.result import ProbeResult

REPO = Path(__file__).resolve().parents[2]

LAUNCH_VARS = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
    "CUDA_VISIBLE_DEVICES",
)


def clean_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """This environment without any launcher's variables (so a probe runs standalone), on CPU."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in LAUNCH_VARS and not k.startswith(("SLURM_", "TORCHELASTIC_", "HEALTHD_"))
    }
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env["CUDA_VISIBLE_DEVICES"] = ""
    env.update(extra or {})
    return env


@dataclass
class Run:
    returncode: int
    stdout: str
    stderr: str
    wall: float

    @property
    def result(self) -> ProbeResult:
        return ProbeResult.model_validate_json(self.stdout)


def run_probe(
    argv: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    timeout: float = 120,
    launcher: Sequence[str] = (sys.executable, "-m", "probes"),
) -> Run:
    start = time.monotonic()
    proc = subprocess.run(
        [*launcher, *argv],
        env=clean_env(env),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        start_new_session=True,
    )
    return Run(proc.returncode, proc.stdout, proc.stderr, time.monotonic() - start)


def run_torchrun(nproc: int, argv: Sequence[str], *, env: Mapping[str, str] | None = None) -> Run:
    return run_probe(
        argv,
        env=env,
        launcher=(
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            str(nproc),
            "-m",
            "probes",
        ),
    )


@dataclass
class SrunRun:
    returncodes: list[int]
    stdouts: list[str]
    stderrs: list[str]
    wall: float

    @property
    def result(self) -> ProbeResult:
        return ProbeResult.model_validate_json(self.stdouts[0])


def run_simulated_srun(
    nodes: int, tasks_per_node: int, argv: Sequence[str], *, env: Mapping[str, str] | None = None
) -> SrunRun:
    """Start ``nodes * tasks_per_node`` ranks with the variables srun gives each task of a
    step (``srun -N nodes --ntasks-per-node tasks_per_node``); every simulated node is this
    machine under its own ``SLURMD_NODENAME``."""
    n = nodes * tasks_per_node
    job = random.randint(100_000, 999_999)
    procs = []
    start = time.monotonic()
    for rank in range(n):
        node = rank // tasks_per_node
        task_env = {
            "SLURM_JOB_ID": str(job),
            "SLURM_STEP_ID": "0",
            "SLURM_PROCID": str(rank),
            "SLURM_LOCALID": str(rank % tasks_per_node),
            "SLURM_NODEID": str(node),
            "SLURM_NTASKS": str(n),
            "SLURM_STEP_NUM_TASKS": str(n),
            "SLURM_STEP_TASKS_PER_NODE": f"{tasks_per_node}(x{nodes})",
            "SLURM_STEP_NODELIST": "localhost",
            "SLURM_JOB_NODELIST": "localhost",
            "SLURMD_NODENAME": f"sim{node}",
            **(env or {}),
        }
        procs.append(
            subprocess.Popen(
                [sys.executable, "-m", "probes", *argv],
                env=clean_env(task_env),
                cwd=REPO,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                start_new_session=True,
            )
        )
    outs = [p.communicate(timeout=120) for p in procs]
    return SrunRun([p.returncode for p in procs], [o for o, _ in outs], [e for _, e in outs], time.monotonic() - start)


def measurements_by_key(result: ProbeResult) -> dict[tuple[tuple[tuple[str, str], ...], str | None], dict[str, object]]:
    """``{(sorted labels, node): {metric name: Measurement}}``."""
    out: dict[tuple[tuple[tuple[str, str], ...], str | None], dict[str, object]] = {}
    for m in result.measurements:
        out.setdefault((tuple(sorted(m.labels.items())), m.node), {})[m.name] = m
    return out


def dump(result: ProbeResult) -> str:
    return json.dumps(result.model_dump(), indent=1)[:4000]
