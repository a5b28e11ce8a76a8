"""Data types shared across the daemon: nodes, probe jobs, job status, verdicts.

The probe result document itself lives in ``probes.result`` (shared with compute nodes);
its ``Outcome`` is re-exported here so daemon code has one place to import from.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from healthd.errors import InvalidNodeName
from probes.result import Measurement, Outcome, ProbeResult

__all__ = [
    "JobState",
    "JobStatus",
    "Measurement",
    "Node",
    "Outcome",
    "ProbeJob",
    "ProbeResult",
    "RunKind",
    "Verdict",
    "devices_by_node",
    "validate_node_name",
]

_NODE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")


def validate_node_name(name: str) -> str:
    """Return ``name`` if it is a plausible Slurm NodeName / hostname, else raise ``InvalidNodeName``."""
    if not isinstance(name, str) or not _NODE_NAME.match(name):
        raise InvalidNodeName(
            f"{name!r} is not a node name (letters, digits, '.', '_', '-', at most 63 characters)"
        )
    return name


@dataclass(frozen=True)
class Node:
    """One compute node as the cluster backend sees it.

    ``state`` is the base state in lower case (idle, allocated, mixed, down, unknown, future...);
    ``flags`` are the upper-case modifiers (DRAIN, NOT_RESPONDING, RESERVED, MAINTENANCE,
    POWERED_DOWN, COMPLETING...), compared as a set because their order differs between releases.
    """

    name: str
    state: str
    flags: frozenset[str] = frozenset()
    partitions: tuple[str, ...] = ()
    gpus: int = 0
    gpu_type: str | None = None
    features: tuple[str, ...] = ()
    reason: str | None = None
    reason_user: str | None = None
    reason_time: float | None = None
    cpus: int | None = None
    node_class: str | None = None
    expect_gpus: int | None = None
    """GPUs the probes must find on the node when its class says otherwise than ``gpus`` (a rule's
    ``expect_gpus``); ``None``: ``gpus``. Set by the backend, not stored."""

    gpu_uuids: tuple[str, ...] = ()
    """The UUIDs the node's GPUs had when last seen (the local backend's listing, or the store's
    inventory): a probe that finds fewer GPUs names the missing ones. Not stored with the node."""

    @property
    def required_gpus(self) -> int:
        """The GPUs every probe on this node must find (``--expect-gpus``): fewer is ``gpus_missing``."""
        return self.gpus if self.expect_gpus is None else self.expect_gpus

    @property
    def drained(self) -> bool:
        return "DRAIN" in self.flags or self.state in {"drained", "draining"}

    def owned_by(self, prefix: str) -> bool:
        """Whether the node's drain reason was set by healthd (it starts with healthd's ``prefix``)."""
        return bool(self.reason) and str(self.reason).startswith(prefix)


class JobState(StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    PREEMPTED = "preempted"
    """Slurm took the node back for a job that outranks the probe: Slurm working as designed."""
    TIMEOUT = "timeout"
    UNKNOWN = "unknown"

    @property
    def finished(self) -> bool:
        return self not in {JobState.PENDING, JobState.RUNNING, JobState.UNKNOWN}


class RunKind(StrEnum):
    """Why a run exists (stored with it; never read back from its run id)."""

    PROBE = "probe"
    """A probe of the regular schedule."""
    REPROBE = "reprobe"
    """A re-probe the judge asked for: confirmation, localisation, or a recheck of an own drain."""
    SWEEP = "sweep"
    """A scaling-sweep run over 2, 4, 8... nodes of a class: it feeds the scaling table only."""
    INGEST = "ingest"
    """A result of another tool's run, stored by ``healthd ingest``."""
    BOUNDARY = "boundary"
    """A node check Slurm ran at a job boundary (``probes.boundary``: prolog, epilog, health check),
    collected from the results directory by ``Collector.collect_boundary``."""


@dataclass(frozen=True)
class BundledRun:
    """One probe of a combined job (``python -m probes check``): a run of its own (its run id, its row
    in the store, its result file ``<run_id>.json``), with its probe's options and time limit."""

    run_id: str
    probe: str
    args: tuple[str, ...] = ()
    timeout_s: float = 300.0


@dataclass(frozen=True)
class ProbeJob:
    """A probe to run once on a set of nodes; ``run_id`` ties the backend job to its result."""

    run_id: str
    probe: str
    nodes: tuple[str, ...]
    args: tuple[str, ...] = ()
    timeout_s: float = 300.0
    ranks_per_node: int | None = None
    kind: RunKind = RunKind.PROBE
    expect_gpus: int | None = None
    """GPUs every node of the job must show (``--expect-gpus``; the probe never falls back to the
    CPU when > 0); ``None``: the probe's own default."""
    expect_gpu_uuids: tuple[str, ...] = ()
    """The UUIDs the node's GPUs had when last seen (single-node jobs): a missing GPU is named by it."""
    bundle: tuple[BundledRun, ...] = ()
    """Non-empty: a combined job of one node (``probe`` is ``"check"``, ``run_id`` the first run's,
    ``timeout_s`` the sum of the runs' limits) that runs each of these probes after one start-up
    and writes each run's own result; nothing is stored under the job's own probe name."""
    skip: str = ""
    """Non-empty: the planner skips this probe on these nodes, for this reason (a MIG-enabled GPU, where a
    whole-GPU probe means nothing); the collector records the run as ``skipped`` and submits nothing."""

    @property
    def runs(self) -> tuple[BundledRun, ...]:
        """The runs this job records: its bundle, or itself."""
        return self.bundle or (BundledRun(self.run_id, self.probe, self.args, self.timeout_s),)


@dataclass(frozen=True)
class JobStatus:
    """What a backend knows of a submitted job at one poll."""

    job_id: str
    state: JobState
    exit_code: int | None = None
    reason: str = ""
    started_at: float | None = None
    finished_at: float | None = None
    nodes: tuple[str, ...] = ()
    name: str | None = None


@dataclass(frozen=True, slots=True)
class Verdict:
    """The judgement of one node for one probe (or ``probe='*'`` for the node overall)."""

    node: str
    probe: str
    outcome: Outcome
    reason: str = ""
    reason_code: str = ""
    run_ids: tuple[str, ...] = ()
    evidence: dict[str, float | str] = field(default_factory=dict)
    at: float = 0.0


def devices_by_node(result: ProbeResult, nodes: Sequence[str]) -> dict[str, tuple[tuple[int, str | None, str], ...]]:
    """The GPUs ``result``'s environment lists per node of its run (``nodes``), the union over the node's ranks,
    as (index, uuid, name) by index; a node whose ranks list none (a run on the CPU) maps to ``()``. A rank on a
    node the run does not name counts for the run's node when it has one node only."""
    env = result.environment
    if env is None:
        return {}
    out: dict[str, dict[int, tuple[int, str | None, str]]] = {}
    for rank in env.ranks:
        node = rank.node if rank.node in nodes else nodes[0] if len(nodes) == 1 else None
        if node is None:
            continue
        gpus = out.setdefault(node, {})
        for d in rank.devices:
            gpus.setdefault(d.index, (d.index, d.uuid, d.name))
    return {node: tuple(gpus[i] for i in sorted(gpus)) for node, gpus in out.items()}
