"""The store's row types: plain frozen data, no SQLite (metrics, API, judge and remediation import these)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Literal, TypeAlias

from healthd.model import Node, Outcome, RunKind, Verdict

RunState = Literal["submitted", "running", "finished"]
RecommendationState = Literal["active", "cleared", "withdrawn", "dismissed"]
AuditResult = Literal["done", "refused", "failed", "info"]
ProbeRequestState = Literal["pending", "launched", "refused", "expired"]
AuditAction = Literal["recommend", "clear", "withdraw", "drain", "undrain", "breaker_open", "breaker_close", "repair"]
RepairKind = Literal["reboot", "command"]
RepairState = Literal["rebooting", "validating", "passed", "failed"]
JudgedMark: TypeAlias = tuple[float, str, int, str]
"""(at, probe, severity, code) of one judged result a node took part in."""


def canonical_labels(labels: Mapping[str, str]) -> str:
    """The one text form of a label set (sorted keys, no spaces): how the store keys series by labels."""
    return canonical_items(tuple(sorted(labels.items())))


@lru_cache(maxsize=65536)
def canonical_items(items: tuple[tuple[str, str], ...]) -> str:
    """``canonical_labels`` of label items already sorted."""
    return json.dumps(dict(items), separators=(",", ":"))


@dataclass(frozen=True)
class RunRow:
    run_id: str
    probe: str
    backend: str
    job_id: str | None
    state: RunState
    outcome: Outcome | None
    reason: str
    submitted_at: float
    started_at: float | None
    finished_at: float | None
    duration_s: float | None
    result_path: str | None
    source: str
    nodes: tuple[str, ...]
    kind: RunKind = RunKind.PROBE
    container_image: str | None = None
    """The image the probe recorded (``IMAGE@sha256:…`` for one ``healthd image build`` wrote)."""


@dataclass(frozen=True, slots=True)
class MeasurementRow:
    run_id: str
    probe: str
    node: str | None
    name: str
    labels: dict[str, str]
    value: float
    at: float


@dataclass(frozen=True, slots=True)
class JudgedSeries:
    """A judged series' newest value and its references, as the metrics render them."""

    node: str
    probe: str
    name: str
    labels: dict[str, str]
    last_value: float | None
    last_at: float | None
    floor: float | None
    baseline: float | None

    @classmethod
    def of(cls, row: Mapping[str, Any]) -> JudgedSeries:
        """From a judged series as a dict (``JudgementStore.judge_series``)."""
        return cls(row["node"], row["probe"], row["name"], row["labels"], row.get("last_value"), row.get("last_at"),
                   row.get("floor"), row.get("baseline"))


@dataclass(frozen=True)
class RollupRow:
    """One node's series over one UTC day beyond the detail window (GPUs pooled)."""

    node: str
    probe: str
    name: str
    labels: dict[str, str]
    day: float
    """The day's start (epoch seconds)."""
    n: int
    lo: float
    mean: float
    hi: float


@dataclass(frozen=True)
class LastRun:
    """Per (node, probe): the newest finished run and the newest passing one."""

    node: str
    probe: str
    last_run_at: float
    last_outcome: Outcome
    last_reason: str
    last_run_id: str
    last_success_at: float | None


@dataclass(frozen=True, slots=True)
class GpuSeen:
    """One GPU of a node as the probes last reported it (``Store.gpu_inventory``)."""

    index: int
    uuid: str | None
    name: str | None
    seen_at: float
    """When a finished run last reported a GPU at this index (the run's finish)."""
    present: bool = True
    """Listed by the node's newest run whose environment had ranks on it; ``False``: a later run did not find
    it (a run with fewer GPUs, or on the CPU: none), kept with the UUID it had, which names the missing GPU."""


@dataclass(frozen=True)
class RunTiming:
    """Per (node, probe): queue wait, duration and GPUs held of the newest finished run (as ``LastRun``)."""

    node: str
    probe: str
    queue_wait_s: float
    duration_s: float
    gpus: int


@dataclass(frozen=True)
class Snapshot:
    """An immutable copy of what the metrics endpoint and the API show."""

    taken_at: float
    nodes: tuple[Node, ...]
    last_runs: tuple[LastRun, ...]
    latest: tuple[MeasurementRow, ...]
    verdicts: tuple[Verdict, ...]
    counters: tuple[tuple[str, dict[str, str], float], ...]
    in_flight: int
    run_timings: tuple[RunTiming, ...] = ()
    scaling: tuple[tuple[str, int, float, MeasurementRow], ...] = ()
    series: tuple[JudgedSeries, ...] = ()
    recommendations: tuple[RecommendationRow, ...] = ()
    """The active drain recommendations."""
    gpus: Mapping[str, tuple[GpuSeen, ...]] = field(default_factory=dict)
    """The GPU inventory of the snapshot's nodes (``Store.gpu_inventory``)."""



@dataclass(frozen=True)
class ProbeRequestRow:
    """An on-demand probe of one node (``healthd probe NAME --node N``): ``pending`` until the daemon's
    plan tick launches it (``run_id``), refuses it or gives up (``detail`` says why)."""

    id: int
    probe: str
    node: str
    requested_at: float
    requested_by: str
    state: ProbeRequestState
    seen_at: float | None
    settled_at: float | None
    run_id: str | None
    detail: str


@dataclass(frozen=True)
class RecommendationRow:
    id: int
    node: str
    probe: str
    outcome: str
    reason_code: str
    text: str
    evidence: dict[str, Any]
    since: float
    updated_at: float
    state: str
    closed_at: float | None
    close_reason: str
    escalated: bool
    last_refusal: str


@dataclass(frozen=True)
class AuditRow:
    at: float
    actor: str
    action: str
    node: str | None
    result: str
    reason: str
    detail: dict[str, Any]


@dataclass(frozen=True)
class DrainRow:
    node: str
    node_class: str
    reason: str
    actor: str
    automatic: bool
    drained_at: float
    undrained_at: float | None
    undrained_by: str | None
    probes: tuple[str, ...] = ()
    check_since: float | None = None
    """Set when a repair revised the drain: its checks count from then (``None``: from ``drained_at``)."""

    @property
    def checks_from(self) -> float:
        return self.drained_at if self.check_since is None else self.check_since


@dataclass(frozen=True)
class RepairRow:
    """One repair (``healthd.remediation.repair``): started, rebooting (or the command ran), validating, ended."""

    id: int
    node: str
    kind: RepairKind
    reason_code: str
    probes: tuple[str, ...]
    """The full check the node must pass before it returns to service."""
    state: RepairState
    started_at: float
    validating_at: float | None
    ended_at: float | None
    reason: str
    """Why it ended (or the drain reason it set last)."""



@dataclass(frozen=True)
class BreakerState:
    open: bool
    opened_at: float | None = None
    reason: str = ""
    closed_at: float | None = None


@dataclass(frozen=True)
class RemediationSnapshot:
    """What remediation decides from, read at once (``RemediationStore.remediation_snapshot``)."""

    recommendations: tuple[RecommendationRow, ...]
    """The active recommendations."""
    open_drains: tuple[DrainRow, ...]
    """healthd's drains not undone yet (automatic and by hand)."""
    recent_drains: tuple[DrainRow, ...]
    """healthd's drains made since the snapshot's ``drains_since`` (open or not), oldest first."""
    breaker: BreakerState
    marks: Mapping[tuple[str, float], tuple[JudgedMark, ...]]
    """Per open automatic drain (node, drained_at): the node's judged results since, oldest first."""
    last_audit: Mapping[str, AuditRow]
    """Per node of an open automatic drain: its newest audit row."""
    repairs: tuple[RepairRow, ...] = ()
    """Open repairs and those started since ``drains_since``, oldest first."""


# -- remediation's writes: applied in order, in one transaction (``RemediationStore.apply_remediation``) --
@dataclass(frozen=True)
class UpsertRecommendation:
    """Open, or refresh, the active recommendation for (node, probe); a refresh keeps its ``since``."""

    node: str
    probe: str
    outcome: str
    reason_code: str
    text: str
    evidence: dict[str, Any]


@dataclass(frozen=True)
class CloseRecommendations:
    """Close the node's active recommendations (of one probe, or all)."""

    node: str
    probe: str | None
    state: RecommendationState
    reason: str


@dataclass(frozen=True)
class NoteRecommendation:
    """Why the active recommendation for (node, probe) was not acted on, and whether it is left to humans."""

    node: str
    probe: str
    refusal: str
    escalated: bool


@dataclass(frozen=True)
class AuditEntry:
    """One action or refusal; also counted in ``remediation_actions_total``."""

    action: AuditAction
    node: str | None
    result: AuditResult
    reason: str
    actor: str
    detail: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class OpenDrain:
    """A drain healthd made; ``probes``: those whose findings caused it (what must pass again)."""

    node: str
    node_class: str
    reason: str
    actor: str
    automatic: bool
    probes: tuple[str, ...] = ()


@dataclass(frozen=True)
class CloseDrain:
    """The node's open drains are undone; with none on record, ``unrecorded`` is recorded as undone."""

    node: str
    by: str
    unrecorded: OpenDrain | None = None


@dataclass(frozen=True)
class SetBreaker:
    state: BreakerState


@dataclass(frozen=True)
class ReviseDrain:
    """The node's open drain gets a new reason and checks, counted from now (a repair's step)."""

    node: str
    reason: str
    probes: tuple[str, ...]


@dataclass(frozen=True)
class OpenRepair:
    node: str
    kind: RepairKind
    reason_code: str
    probes: tuple[str, ...]
    reason: str


@dataclass(frozen=True)
class SetRepair:
    """The node's open repair moves on (``validating``) or ends (``passed``, ``failed``)."""

    node: str
    state: RepairState
    reason: str


RemediationWrite: TypeAlias = (UpsertRecommendation | CloseRecommendations | NoteRecommendation | AuditEntry
                               | OpenDrain | CloseDrain | SetBreaker | ReviseDrain | OpenRepair | SetRepair)


@dataclass(frozen=True)
class RemediationChanges:
    at: float
    writes: tuple[RemediationWrite, ...]
