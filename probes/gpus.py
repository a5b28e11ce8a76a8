"""Which physical GPU of the node a rank uses: its index and UUID as the node reports them.

A rank's CUDA ordinal is not the node's GPU index: ``CUDA_VISIBLE_DEVICES`` maps ordinals to
the node's GPUs (``"3,1"``: ordinal 0 is GPU 3), and under ``srun --gpus-per-task=1`` with
``--gpu-bind=map_gpu:`` or ``closest`` the one visible GPU is the one it names, not the local
rank. Entries may be indices or UUIDs (``GPU-…``); ``nvidia-smi -L`` (or NVML) gives the node's
index <-> UUID table. Under a device cgroup that renumbers GPUs (Slurm ``ConstrainDevices``)
every task may see ``CUDA_VISIBLE_DEVICES=0``; the UUID then is the name to trust.
"""

from __future__ import annotations

import importlib
import re
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from probes.dist import LaunchError
from probes.result import Check, RankInfo

NVIDIA_SMI_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class NodeGpu:
    index: int
    """The node's index of the GPU (``nvidia-smi``/NVML order)."""
    uuid: str
    name: str = ""


@dataclass(frozen=True)
class GpuSlot:
    ordinal: int
    """The CUDA device ordinal this rank uses (as seen by this process)."""
    physical: int
    """The GPU's index on the node, used as the ``gpu`` label."""
    uuid: str | None = None
    """The GPU's UUID when the node or ``CUDA_VISIBLE_DEVICES`` names it."""


_SMI_LINE = re.compile(r"^GPU (\d+): (.*?) \(UUID: (GPU-[0-9A-Za-z-]+)\)\s*$")


def parse_nvidia_smi_list(text: str) -> list[NodeGpu]:
    """The GPUs of ``nvidia-smi -L`` (``GPU 3: NVIDIA H100 80GB HBM3 (UUID: GPU-…)``); MIG lines are skipped.

    >>> parse_nvidia_smi_list("GPU 0: NVIDIA A100-SXM4-80GB (UUID: GPU-5e1a)\\n  MIG 1g.10gb Device 0: (UUID: MIG-9)")
    [NodeGpu(index=0, uuid='GPU-5e1a', name='NVIDIA A100-SXM4-80GB')]
    """
    out = []
    for line in text.splitlines():
        m = _SMI_LINE.match(line.strip())
        if m:
            out.append(NodeGpu(index=int(m.group(1)), uuid=m.group(3), name=m.group(2)))
    return out


def node_gpus() -> list[NodeGpu]:
    """The node's GPUs from ``nvidia-smi -L`` when it is on ``PATH``, else NVML, else none."""
    smi = shutil.which("nvidia-smi")
    if smi is not None:
        try:
            done = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=NVIDIA_SMI_TIMEOUT_S,
                                  check=False)
            if done.returncode == 0 and (listed := parse_nvidia_smi_list(done.stdout)):
                return listed
        except (OSError, subprocess.TimeoutExpired):
            pass
    return _nvml_gpus()


def _nvml_gpus() -> list[NodeGpu]:
    try:
        nvml = importlib.import_module("pynvml")
        nvml.nvmlInit()
        out = []
        for i in range(int(nvml.nvmlDeviceGetCount())):
            handle = nvml.nvmlDeviceGetHandleByIndex(i)
            uuid, name = nvml.nvmlDeviceGetUUID(handle), nvml.nvmlDeviceGetName(handle)
            out.append(NodeGpu(i, uuid.decode() if isinstance(uuid, bytes) else str(uuid),
                               name.decode() if isinstance(name, bytes) else str(name)))
        return out
    except Exception:
        return []


def _visible_entries(environ: Mapping[str, str]) -> list[str]:
    return [d.strip() for d in environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]


def name_entry(entry: str | None, fallback: int, listing: Sequence[NodeGpu]) -> tuple[int, str | None]:
    """The node index and UUID of one ``CUDA_VISIBLE_DEVICES`` entry (``None``: not set)."""
    by_index = {g.index: g for g in listing}
    if entry is not None and entry.isdigit():
        index = int(entry)
        known = by_index.get(index)
        return index, known.uuid if known else None
    if entry is not None and entry.startswith("GPU-"):
        match = next((g for g in listing if g.uuid == entry or g.uuid.startswith(entry)), None)
        return (match.index, match.uuid) if match else (fallback, entry)
    known = by_index.get(fallback)
    return fallback, known.uuid if known else None


def gpu_slot(
    local_rank: int,
    local_world_size: int,
    visible: int,
    environ: Mapping[str, str],
    listing: Sequence[NodeGpu] = (),
) -> GpuSlot:
    """Which GPU a rank uses. With all of the node's GPUs visible (torchrun, standalone) rank
    ``l`` takes ordinal ``l``; with one GPU per task (``srun --gpus-per-task=1``) it takes the
    only one. Either way the physical GPU is the one ``CUDA_VISIBLE_DEVICES`` names at that
    ordinal (an index, or a UUID looked up in ``listing``); without it, the ordinal with all
    GPUs visible, the local rank with one."""
    if visible <= 0:
        raise LaunchError("no CUDA device is visible")
    if visible >= local_world_size:
        ordinal, fallback = local_rank, local_rank
    elif visible == 1:
        ordinal, fallback = 0, local_rank
    else:
        raise LaunchError(
            f"{local_world_size} ranks on this node but {visible} GPUs visible to rank {local_rank}: "
            "use one GPU per rank"
        )
    entries = _visible_entries(environ)
    physical, uuid = name_entry(entries[ordinal] if ordinal < len(entries) else None, fallback, listing)
    return GpuSlot(ordinal=ordinal, physical=physical, uuid=uuid)


def name_check_gpus(checks: Sequence[Check], ranks: Sequence[RankInfo]) -> list[Check]:
    """``checks`` with ``gpu_uuid`` set from the ranks' device records where a check names a node and GPU."""
    uuids = {(r.node, d.index): d.uuid for r in ranks for d in r.devices if d.uuid}
    return [
        c.model_copy(update={"gpu_uuid": uuids[(c.node, c.gpu)]})
        if c.gpu_uuid is None and c.node is not None and c.gpu is not None and (c.node, c.gpu) in uuids
        else c
        for c in checks
    ]
