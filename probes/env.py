"""The ``env`` probe and the environment record every probe carries.

The record is the equivalent of nccl-tests' header and device lines: versions (Python, torch,
CUDA, NCCL, driver) and, per rank, where it ran and which devices it saw (name, UUID, memory,
PCI bus id from torch, completed by NVML when ``nvidia-ml-py`` is importable).

The probe itself checks one expectation, the GPU count of every node (``--expect-gpus``; on
CUDA it defaults to the number of ranks on the node), and reports ``visible_gpus`` per node.
The same check is added to every other probe's result by the runner.
"""

from __future__ import annotations

import argparse
import importlib
import os
import platform
import re
from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any

from probes.catalogue import ProbeName
from probes.context import ProbeContext, ProbeOutput
from probes.dist import Backend, DeviceType, Launcher, LaunchInfo
from probes.expect import missing, shortfall_text
from probes.result import Check, DeviceInfo, Environment, Measurement, ProbeResult, RankInfo

NAME = ProbeName.ENV
HELP = "environment and device-count check"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The env probe has only the common options (``--expect-gpus`` among them)."""


def _nvml() -> Any | None:
    try:
        pynvml = importlib.import_module("pynvml")
        pynvml.nvmlInit()
        return pynvml
    except Exception:
        return None


def _decode(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


_DRIVER_RE = re.compile(r"Kernel Module(?: for \S+)?\s+(\d+\.\d+(?:\.\d+)?)")


def parse_driver_version(proc_text: str) -> str | None:
    """The driver version from ``/proc/driver/nvidia/version``."""
    m = _DRIVER_RE.search(proc_text)
    return m.group(1) if m else None


def driver_version() -> str | None:
    nvml = _nvml()
    if nvml is not None:
        try:
            return _decode(nvml.nvmlSystemGetDriverVersion())
        except Exception:
            pass
    try:
        with open("/proc/driver/nvidia/version", encoding="utf-8") as f:
            return parse_driver_version(f.read())
    except OSError:
        return None


def versions(device_type: DeviceType) -> dict[str, str | None]:
    import torch

    out: dict[str, str | None] = {
        "python": platform.python_version(),
        "torch": str(torch.__version__),
        "cuda": torch.version.cuda,
        "nccl": None,
        "driver": None,
    }
    if device_type == "cuda":
        try:
            nccl_version: Callable[[], Any] = torch.cuda.nccl.version
            v = nccl_version()
            out["nccl"] = ".".join(str(x) for x in v) if isinstance(v, tuple) else str(v)
        except Exception:
            pass
        out["driver"] = driver_version()
    return out


def _pci_bus_id(props: Any) -> str | None:
    bus = getattr(props, "pci_bus_id", None)
    dev = getattr(props, "pci_device_id", None)
    dom = getattr(props, "pci_domain_id", None)
    if bus is None or dev is None:
        return None
    return f"{int(dom or 0):08x}:{int(bus):02x}:{int(dev):02x}.0".upper()


def cuda_devices(physical_of: dict[int, int] | None = None, uuid_of: dict[int, str] | None = None) -> list[DeviceInfo]:
    """The CUDA devices this process sees; ``physical_of`` maps ordinals to node indices, ``uuid_of`` to the
    UUIDs the node reports (used where torch and NVML give none)."""
    import torch

    if not torch.cuda.is_available():
        return []
    nvml = _nvml()
    devices: list[DeviceInfo] = []
    for ordinal in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(ordinal)
        uuid: str | None = (uuid_of or {}).get(ordinal)
        raw_uuid = getattr(props, "uuid", None)
        if raw_uuid is not None:
            uuid = str(raw_uuid)
            if not uuid.startswith(("GPU-", "MIG-")):
                uuid = "GPU-" + uuid
        pci = _pci_bus_id(props)
        if nvml is not None and pci is not None and uuid is None:
            try:
                handle = nvml.nvmlDeviceGetHandleByPciBusId(pci)
                uuid = _decode(nvml.nvmlDeviceGetUUID(handle))
            except Exception:
                pass
        devices.append(
            DeviceInfo(
                index=(physical_of or {}).get(ordinal, ordinal),
                name=str(props.name),
                uuid=uuid,
                memory_bytes=int(props.total_memory),
                pci_bus_id=pci,
            )
        )
    return devices


def rank_info(launch: LaunchInfo, device: str, devices: list[DeviceInfo]) -> RankInfo:
    return RankInfo(
        rank=launch.rank,
        local_rank=launch.local_rank,
        group_rank=launch.group_rank,
        world_size=launch.world_size,
        local_world_size=launch.local_world_size,
        hostname=launch.hostname,
        node=launch.node,
        device=device,
        devices=devices,
    )


def build_environment(
    launcher: Launcher,
    backend: Backend,
    device_type: DeviceType,
    vers: dict[str, str | None],
    ranks: list[RankInfo],
) -> Environment:
    return Environment(
        launcher=launcher,
        backend=backend,
        device_type=device_type,
        python=vers.get("python") or platform.python_version(),
        torch=vers.get("torch"),
        cuda=vers.get("cuda"),
        nccl=vers.get("nccl"),
        driver=vers.get("driver"),
        container_image=os.environ.get("HEALTHD_CONTAINER_IMAGE") or None,
        ranks=ranks,
    )


def nodes_in_order(ranks: Sequence[RankInfo]) -> list[str]:
    seen: dict[str, None] = {}
    for r in sorted(ranks, key=lambda r: r.rank):
        seen.setdefault(r.node, None)
    return list(seen)


def visible_gpus_per_node(ranks: Sequence[RankInfo]) -> dict[str, int]:
    """Distinct GPUs seen by the ranks of each node (by UUID, else PCI bus id, else index)."""
    per_node: dict[str, set[str]] = defaultdict(set)
    for r in ranks:
        per_node.setdefault(r.node, set())
        for d in r.devices:
            per_node[r.node].add(d.uuid or d.pci_bus_id or f"index:{d.index}")
    return {node: len(ids) for node, ids in per_node.items()}


def ranks_per_node(ranks: Sequence[RankInfo]) -> dict[str, int]:
    counts: dict[str, int] = defaultdict(int)
    for r in ranks:
        counts[r.node] += 1
    return dict(counts)


def gpu_count_checks(
    ranks: Sequence[RankInfo], expect: int | None, device_type: DeviceType, expected_uuids: Sequence[str] = ()
) -> tuple[list[Check], dict[str, int]]:
    """One ``env.gpu_count`` check per node, and the expectation used per node.

    ``expect`` None means: on CUDA, as many GPUs as the node has ranks; on CPU, no check.
    ``expected_uuids`` (the node's GPUs when last seen, single-node runs): a node short of GPUs
    names the ones missing.
    """
    visible = visible_gpus_per_node(ranks)
    seen_uuids = {d.uuid for r in ranks for d in r.devices if d.uuid}
    local = ranks_per_node(ranks)
    checks: list[Check] = []
    expected: dict[str, int] = {}
    for node in nodes_in_order(ranks):
        want = expect if expect is not None else (local[node] if device_type == "cuda" else None)
        if want is None:
            continue
        expected[node] = want
        have = visible[node]
        gone = missing(expected_uuids, sorted(seen_uuids)) if have < want else []
        checks.append(Check(name="env.gpu_count", ok=have >= want, detail=shortfall_text(have, want, gone),
                            node=node, gpu_uuid=gone[0] if len(gone) == 1 else None))
    return checks, expected


def run(ctx: ProbeContext) -> ProbeOutput:
    ctx.mark("env.count")
    out = ProbeOutput()
    if ctx.rank != 0:
        return out
    for node, count in visible_gpus_per_node(ctx.ranks).items():
        out.measurements.append(Measurement(name="visible_gpus", value=float(count), node=node))
    return out


def format_table(result: ProbeResult) -> str:
    lines: list[str] = []
    env = result.environment
    if env is not None:
        lines.append(
            f"# launcher {env.launcher}  backend {env.backend}  device {env.device_type}  "
            f"python {env.python}  torch {env.torch}  cuda {env.cuda}  nccl {env.nccl}  driver {env.driver}"
        )
        lines.append(f"# {'rank':>4}  {'local':>5}  {'node':<20}  {'device':<8}  devices")
        for r in env.ranks:
            devs = ", ".join(f"{d.index}:{d.name}" + (f" [{d.pci_bus_id}]" if d.pci_bus_id else "") for d in r.devices)
            lines.append(f"  {r.rank:>4}  {r.local_rank:>5}  {r.node:<20}  {r.device:<8}  {devs or '-'}")
    lines.append(f"# {'node':<20}  {'visible_gpus':>12}")
    for m in result.measurements:
        if m.name == "visible_gpus":
            lines.append(f"  {m.node or '-':<20}  {int(m.value):>12}")
    return "\n".join(lines)
