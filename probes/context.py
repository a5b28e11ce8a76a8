"""What a probe body receives (:class:`ProbeContext`) and returns (:class:`ProbeOutput`)."""

from __future__ import annotations

import argparse
import importlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Protocol

from probes.catalogue import ProbeName
from probes.dist import Backend, DeviceType, LaunchInfo
from probes.faults import FaultKind
from probes.result import Check, Measurement, ProbeResult, RankInfo

if TYPE_CHECKING:
    import torch


@dataclass
class ProbeOutput:
    """A probe's findings; only rank 0's instance is used (the others return an empty one)."""

    measurements: list[Measurement] = field(default_factory=list)
    checks: list[Check] = field(default_factory=list)
    params: dict[str, Any] = field(default_factory=dict)
    skipped: str | None = None
    """Why there was nothing to measure (a one-GPU node for an intra-node collective): the
    outcome is ``skipped`` with this reason, unless a check failed."""


@dataclass
class ProbeContext:
    args: argparse.Namespace
    launch: LaunchInfo
    device: torch.device
    device_type: DeviceType
    backend: Backend
    gpu: int
    """This rank's ``gpu`` label: the GPU's local index on the node (the local rank on CPU)."""
    ranks: list[RankInfo]
    """Every rank's identity, indexed by global rank."""
    faults: frozenset[FaultKind]
    mark: Callable[[str], None]
    """Record that this rank entered a phase (names a hung rank if the probe stalls)."""
    meta_group: Any
    """A gloo process group over all ranks for metadata (object gathers, barriers)."""
    deadline_at: float
    """Unix time at which this rank gives up (its watchdog fires)."""
    gpu_uuid: str | None = None
    """This rank's GPU's UUID as the node reports it (``None`` on CPU or when unknown)."""

    @property
    def rank(self) -> int:
        return self.launch.rank

    @property
    def world_size(self) -> int:
        return self.launch.world_size

    def node_of(self, rank: int) -> str:
        return self.ranks[rank].node

    def collective_timeout(self) -> timedelta:
        """Timeout for process groups created by the probe: up to shortly before the deadline."""
        return timedelta(seconds=max(1.0, self.deadline_at - time.time() - 2.0))

    def gather(self, obj: Any) -> list[Any]:
        """Every rank's ``obj`` (pickled over the gloo metadata group), on every rank."""
        import torch.distributed as dist

        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, obj, group=self.meta_group)
        return out

    def barrier(self) -> None:
        import torch.distributed as dist

        dist.barrier(group=self.meta_group)

    def sync(self) -> None:
        """Wait for this rank's queued device work."""
        if self.device_type == "cuda":
            import torch

            torch.cuda.synchronize(self.device)


class ProbeModule(Protocol):
    """A torch probe (``ProbeSpec.torch``): its body runs in every rank."""

    NAME: ProbeName
    HELP: str

    def add_arguments(self, parser: argparse.ArgumentParser) -> None: ...

    def run(self, ctx: ProbeContext) -> ProbeOutput: ...

    def format_table(self, result: ProbeResult) -> str: ...


class CommandModule(Protocol):
    """A probe without torch ranks: it adds its own sub-command and runs it."""

    NAME: ProbeName

    def register(
        self, sub: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser
    ) -> None: ...

    def run(self, args: argparse.Namespace) -> int: ...


def probe_module(name: ProbeName) -> Any:
    """``probes.<name>``: a ``ProbeModule``, or a ``CommandModule`` where its catalogue entry says ``torch=False``."""
    return importlib.import_module(f"probes.{name.value}")
