"""Who am I in the job: launch-mode detection, rendezvous address, device and backend choice.

Three launch modes, detected from the environment:

- ``torchrun``: ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``GROUP_RANK``,
  ``MASTER_ADDR``/``MASTER_PORT`` (``TORCHELASTIC_USE_AGENT_STORE`` says whether the agent
  hosts the TCPStore);
- ``srun`` (one task per GPU): ``SLURM_PROCID``, ``SLURM_LOCALID``, ``SLURM_NODEID``, the step's
  task count and tasks-per-node, and its node list, whose first host runs rank 0 and the
  store (``MASTER_ADDR``); ``MASTER_PORT`` is derived from the job and step ids unless set;
- ``standalone``: none of these, or a one-task srun step; ``python -m probes`` spawns
  ``--nproc`` local ranks itself (``probes.launch``) and gives them torchrun-style variables
  plus ``HEALTHD_PROBE_LAUNCHER``.

Everything here but :func:`init_process_group` is pure or reads only the environment.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    import torch

Launcher = Literal["standalone", "torchrun", "srun"]
Backend = Literal["gloo", "nccl"]
DeviceType = Literal["cpu", "cuda"]

LAUNCHER_ENV = "HEALTHD_PROBE_LAUNCHER"
"""Set to ``standalone`` by the standalone launcher on the ranks it spawns."""

SRUN_PORT_BASE = 20000
SRUN_PORT_SPAN = 10000
"""Derived srun ports lie in 20000-29999: high, yet below Linux's ephemeral range (32768-60999),
so an outgoing connection's local port can never already hold it."""


class LaunchError(ValueError):
    """The environment describes a launch we cannot make sense of."""


@dataclass(frozen=True)
class LaunchInfo:
    launcher: Launcher
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    group_rank: int | None
    master_addr: str
    master_port: int
    hostname: str
    node: str
    agent_store: bool = False
    """True when the launcher (torchrun's agent) already hosts the TCPStore at the master address."""
    store_prefix: str = "healthd"


def node_name(environ: Mapping[str, str] | None = None) -> str:
    """The Slurm node name (``SLURMD_NODENAME``) or, outside Slurm, the short hostname."""
    env = os.environ if environ is None else environ
    return env.get("SLURMD_NODENAME") or socket.gethostname().split(".", 1)[0]


def _int(env: Mapping[str, str], name: str) -> int:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        raise LaunchError(f"{name} is not set")
    try:
        return int(raw)
    except ValueError:
        raise LaunchError(f"{name}={raw!r} is not an integer") from None


_TASKS_ITEM = re.compile(r"^(\d+)(?:\(x(\d+)\))?$")


def parse_tasks_per_node(value: str) -> list[int]:
    """Expand Slurm's compressed tasks-per-node list: ``"2(x3),1"`` -> ``[2, 2, 2, 1]``."""
    counts: list[int] = []
    for item in value.split(","):
        m = _TASKS_ITEM.match(item.strip())
        if not m:
            raise LaunchError(f"cannot parse tasks-per-node item {item!r} in {value!r}")
        counts.extend([int(m.group(1))] * int(m.group(2) or 1))
    return counts


_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")


def _expand_brackets(pattern: str) -> list[str]:
    open_at = pattern.find("[")
    if open_at < 0:
        if "]" in pattern:
            raise LaunchError(f"unbalanced ']' in host list item {pattern!r}")
        return [pattern]
    close_at = pattern.find("]", open_at)
    if close_at < 0:
        raise LaunchError(f"unbalanced '[' in host list item {pattern!r}")
    prefix, body, rest = pattern[:open_at], pattern[open_at + 1 : close_at], pattern[close_at + 1 :]
    values: list[str] = []
    for part in body.split(","):
        m = _RANGE.match(part.strip())
        if not m:
            raise LaunchError(f"cannot parse range {part!r} in host list item {pattern!r}")
        lo_s, hi_s = m.group(1), m.group(2) or m.group(1)
        lo, hi = int(lo_s), int(hi_s)
        if hi < lo:
            raise LaunchError(f"descending range {part!r} in host list item {pattern!r}")
        width = len(lo_s) if lo_s.startswith("0") else 0
        values.extend(str(i).zfill(width) for i in range(lo, hi + 1))
    tails = _expand_brackets(rest)
    return [prefix + v + t for v in values for t in tails]


def expand_hostlist_simple(nodelist: str) -> list[str]:
    """Expand a Slurm host list (``gpu[01-03,07],login1``, ``r[1-2]-n[1-2]``) in Slurm's order.

    A small expander for the common forms, used when neither the ``hostlist`` module nor
    ``scontrol`` is available.
    """
    items: list[str] = []
    depth = 0
    start = 0
    for i, ch in enumerate(nodelist):
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        elif ch == "," and depth == 0:
            items.append(nodelist[start:i])
            start = i + 1
    items.append(nodelist[start:])
    hosts: list[str] = []
    for item in items:
        item = item.strip()
        if item:
            hosts.extend(_expand_brackets(item))
    if not hosts:
        raise LaunchError(f"empty host list {nodelist!r}")
    return hosts


def expand_hostlist(nodelist: str, *, use_tools: bool = True) -> list[str]:
    """Expand a Slurm host list: the ``hostlist`` module if importable, else
    ``scontrol show hostnames``, else :func:`expand_hostlist_simple`."""
    if use_tools:
        try:
            import hostlist

            hosts = [str(h) for h in hostlist.expand_hostlist(nodelist)]
            if hosts:
                return hosts
        except ImportError:
            pass
        except Exception as exc:
            raise LaunchError(f"cannot expand host list {nodelist!r}: {exc}") from exc
        scontrol = shutil.which("scontrol")
        if scontrol:
            try:
                out = subprocess.run(
                    [scontrol, "show", "hostnames", nodelist],
                    capture_output=True,
                    text=True,
                    timeout=10,
                    start_new_session=True,
                    check=True,
                )
                hosts = out.stdout.split()
                if hosts:
                    return hosts
            except (OSError, subprocess.SubprocessError):
                pass
    return expand_hostlist_simple(nodelist)


def srun_master_port(job_id: int, step_id: int) -> int:
    """A port for the step's rendezvous, the same on every task of the step."""
    return SRUN_PORT_BASE + (job_id * 10 + step_id % 10) % SRUN_PORT_SPAN


def detect_launch(environ: Mapping[str, str], *, use_tools: bool = True) -> LaunchInfo | None:
    """The launch described by ``environ``; ``None`` means standalone: spawn the ranks ourselves."""
    env = environ
    hostname = socket.gethostname()
    node = node_name(env)
    if "RANK" in env and "WORLD_SIZE" in env:
        standalone = env.get(LAUNCHER_ENV) == "standalone"
        world = _int(env, "WORLD_SIZE")
        rank = _int(env, "RANK")
        local_rank = _int(env, "LOCAL_RANK") if "LOCAL_RANK" in env else rank
        local_world = _int(env, "LOCAL_WORLD_SIZE") if "LOCAL_WORLD_SIZE" in env else world
        group_rank = _int(env, "GROUP_RANK") if "GROUP_RANK" in env else None
        agent_store = env.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
        prefix = "healthd"
        if "TORCHELASTIC_RESTART_COUNT" in env:
            prefix = f"healthd/{env.get('TORCHELASTIC_RUN_ID', '')}/{env['TORCHELASTIC_RESTART_COUNT']}"
        info = LaunchInfo(
            launcher="standalone" if standalone else "torchrun",
            rank=rank,
            world_size=world,
            local_rank=local_rank,
            local_world_size=local_world,
            group_rank=group_rank,
            master_addr=env.get("MASTER_ADDR", "127.0.0.1"),
            master_port=_int(env, "MASTER_PORT"),
            hostname=hostname,
            node=node,
            agent_store=agent_store,
            store_prefix=prefix,
        )
    elif "SLURM_PROCID" in env and "SLURM_LOCALID" in env and ("SLURM_STEP_ID" in env or "SLURM_STEPID" in env):
        rank = _int(env, "SLURM_PROCID")
        world = _int(env, "SLURM_STEP_NUM_TASKS" if "SLURM_STEP_NUM_TASKS" in env else "SLURM_NTASKS")
        if world == 1:
            return None  # a one-task step (srun -n1): the probe spawns its local ranks itself
        node_id = _int(env, "SLURM_NODEID")
        per_node_raw = env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE")
        if per_node_raw:
            per_node = parse_tasks_per_node(per_node_raw)
            if node_id >= len(per_node):
                raise LaunchError(f"SLURM_NODEID={node_id} but tasks per node is {per_node_raw!r}")
            local_world = per_node[node_id]
        elif env.get("SLURM_NTASKS_PER_NODE"):
            local_world = _int(env, "SLURM_NTASKS_PER_NODE")
        else:
            raise LaunchError("srun launch without SLURM_STEP_TASKS_PER_NODE/SLURM_TASKS_PER_NODE")
        nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
        master_addr = env.get("MASTER_ADDR")
        if not master_addr:
            if not nodelist:
                raise LaunchError("srun launch without SLURM_STEP_NODELIST/SLURM_JOB_NODELIST")
            master_addr = expand_hostlist(nodelist, use_tools=use_tools)[0]
        if env.get("MASTER_PORT"):
            port = _int(env, "MASTER_PORT")
        else:
            job_id = _int(env, "SLURM_JOB_ID" if "SLURM_JOB_ID" in env else "SLURM_JOBID")
            step_raw = env.get("SLURM_STEP_ID", env.get("SLURM_STEPID", "0"))
            port = srun_master_port(job_id, int(step_raw) if step_raw.isdigit() else 0)
        info = LaunchInfo(
            launcher="srun",
            rank=rank,
            world_size=world,
            local_rank=_int(env, "SLURM_LOCALID"),
            local_world_size=local_world,
            group_rank=node_id,
            master_addr=master_addr,
            master_port=port,
            hostname=hostname,
            node=node,
        )
    else:
        return None
    if not 0 <= info.rank < info.world_size:
        raise LaunchError(f"rank {info.rank} outside world size {info.world_size}")
    if not 0 <= info.local_rank < info.local_world_size:
        raise LaunchError(f"local rank {info.local_rank} outside local world size {info.local_world_size}")
    if not 0 < info.master_port < 65536:
        raise LaunchError(f"master port {info.master_port} out of range")
    return info


def resolve_device(requested: str, cuda_available: bool) -> DeviceType:
    if requested == "cpu":
        return "cpu"
    if requested == "cuda":
        if not cuda_available:
            raise LaunchError("--device cuda but no CUDA device is visible")
        return "cuda"
    return "cuda" if cuda_available else "cpu"


def resolve_backend(requested: str, device: DeviceType) -> Backend:
    if requested == "auto":
        return "nccl" if device == "cuda" else "gloo"
    if requested == "nccl" and device != "cuda":
        raise LaunchError("--backend nccl needs CUDA devices (use --device cuda or --backend gloo)")
    if requested not in ("gloo", "nccl"):
        raise LaunchError(f"unknown backend {requested!r}")
    return requested  # type: ignore[return-value]


def init_process_group(
    backend: Backend,
    store: Any,
    rank: int,
    world_size: int,
    timeout_s: float,
    device: torch.device,
) -> None:
    """``torch.distributed.init_process_group`` over our own store, with a timeout; on NCCL
    the communicator is bound to the rank's device (eager init where torch supports it)."""
    import inspect

    import torch.distributed as dist

    kwargs: dict[str, Any] = {}
    if backend == "nccl" and "device_id" in inspect.signature(dist.init_process_group).parameters:
        kwargs["device_id"] = device
    dist.init_process_group(
        backend=backend,
        store=store,
        rank=rank,
        world_size=world_size,
        timeout=timedelta(seconds=max(1.0, timeout_s)),
        **kwargs,
    )
