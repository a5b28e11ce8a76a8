"""The probes: their names and what healthd does differently per probe.

Adding a probe: write ``probes/<name>.py`` and add its name and one ``ProbeSpec`` here. A torch
probe's module is a ``probes.context.ProbeModule`` run in ranks by ``probes.runner``; one that is
not (``torch=False``) is a ``probes.context.CommandModule`` with its own sub-command. This module
imports nothing but the standard library, so the daemon reads it without torch.

``python -m probes check`` (:data:`CHECK_COMMAND`) is no probe and has no entry here: it runs the
bodies of several probes (those with ``ProbeSpec.check``) in one rank session, after one start-up,
and writes each probe's own document, as if that probe had run alone (its name, its run id, its
outcome). Nothing is ever stored under the name ``check``: the daemon stores each inner probe's
run, and every per-probe rule here (``local_ranks``, ``expect_transport``, ``between_gpus``) still
applies to that probe inside a check.
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
    PIPELINE = "pipeline"


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
    check: bool = False
    """Can run as a part of ``python -m probes check`` (a torch probe whose body needs nothing but
    the shared rank session)."""


CATALOGUE: Mapping[ProbeName, ProbeSpec] = MappingProxyType({spec.name: spec for spec in (
    ProbeSpec(ProbeName.ENV, check=True),
    ProbeSpec(ProbeName.NCCL, local_ranks=True, expect_transport=True, between_gpus=True, check=True),
    ProbeSpec(ProbeName.GEMM, check=True),
    ProbeSpec(ProbeName.DDP, local_ranks=True, check=True),
    ProbeSpec(ProbeName.NCCL_TESTS, torch=False),
    ProbeSpec(ProbeName.COMPUTE, check=True),
    ProbeSpec(ProbeName.PIPELINE, local_ranks=True, between_gpus=True),
)})

CHECK_COMMAND = "check"
"""``python -m probes check``: several probes' bodies after one start-up (see the module docstring)."""

CHECK_COMMON_OPTIONS: frozenset[str] = frozenset({
    "--backend", "--device", "--nproc", "--timeout", "--run-id", "--output", "--format", "--expect-gpus",
    "--expect-gpu-uuids",
})
"""The options every probe shares (``probes.__main__.common_parser``): a check takes them once for all
its probes, never in one probe's own options (``--arg``)."""

CHECK_PROBES: tuple[str, ...] = tuple(spec.name.value for spec in CATALOGUE.values() if spec.check)
"""The probes that can run inside a check, in catalogue order."""

PROBE_NAMES: tuple[str, ...] = tuple(name.value for name in CATALOGUE)
"""Every probe name as a plain string, in catalogue order (sub-commands, settings, messages)."""


def probe_spec(name: str) -> ProbeSpec | None:
    """The catalogue entry of ``name``; ``None`` for a name that is no probe (an ingested tool's)."""
    try:
        return CATALOGUE[ProbeName(name)]
    except ValueError:
        return None
