"""The probes: their names and what healthd does differently per probe.

Adding a probe: write ``probes/<name>.py`` and add its name and one ``ProbeSpec`` here. A torch
probe's module is a ``probes.context.ProbeModule`` run in ranks by ``probes.runner``; one that is
not (``torch=False``) is a ``probes.context.CommandModule`` with its own sub-command. This module
imports nothing but the standard library, so the daemon reads it without torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from types import MappingProxyType


class ProbeName(StrEnum):
    ENV = "env"
    NCCL = "nccl"
    GEMM = "gemm"
    DDP = "ddp"
    NCCL_TESTS = "nccl_tests"
    COMPUTE = "compute"


@dataclass(frozen=True)
class ProbeSpec:
    name: ProbeName
    torch: bool = True
    """Runs in torch ranks (``probes.runner``); else the module parses and runs its own command."""
    local_ranks: bool = False
    """Its ranks measure together: the local backend starts ``--nproc`` of them."""
    expect_transport: bool = False
    """Takes ``--expect-transport`` (the NCCL networks allowed, from the settings)."""
    between_gpus: bool = False
    """Measures between the GPUs of a node when it runs on one node: a one-GPU node has nothing to
    measure (the probe reports ``skipped``) and is fully checked without it."""


CATALOGUE: Mapping[ProbeName, ProbeSpec] = MappingProxyType({spec.name: spec for spec in (
    ProbeSpec(ProbeName.ENV),
    ProbeSpec(ProbeName.NCCL, local_ranks=True, expect_transport=True, between_gpus=True),
    ProbeSpec(ProbeName.GEMM),
    ProbeSpec(ProbeName.DDP, local_ranks=True),
    ProbeSpec(ProbeName.NCCL_TESTS, torch=False),
    ProbeSpec(ProbeName.COMPUTE),
)})

PROBE_NAMES: tuple[str, ...] = tuple(name.value for name in CATALOGUE)
"""Every probe name as a plain string, in catalogue order (sub-commands, settings, messages)."""


def probe_spec(name: str) -> ProbeSpec | None:
    """The catalogue entry of ``name``; ``None`` for a name that is no probe (an ingested tool's)."""
    try:
        return CATALOGUE[ProbeName(name)]
    except ValueError:
        return None
