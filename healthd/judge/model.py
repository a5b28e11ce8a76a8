"""Types of the judgement layers: findings, reason codes, run inputs and the judge's output.

A *finding* is one layer's statement about one value ("below the floor", "15% under this
node's baseline", "an outlier in its class"). A *mark* is what one run says about one node
(its worst finding, or nothing). Verdicts and recommendations are derived from marks after
confirmation; see ``healthd.judge.engine``.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from enum import IntEnum, StrEnum
from typing import Literal, NamedTuple, overload

from healthd.model import Outcome, RunKind, Verdict

Direction = Literal["higher", "lower"]
RequestKind = Literal["reprobe", "localise", "bisect", "recheck"]


class ReasonCode(StrEnum):
    """Why a verdict or a recommendation is what it is (a closed set, exported as a label)."""

    OK = "ok"
    BELOW_FLOOR = "below_floor"
    """A value worse than the floor of the node's class (``fail`` once confirmed)."""
    BASELINE_DRIFT = "baseline_drift"
    """A value worse than the node's own baseline by the configured fraction (``degraded``)."""
    FLEET_OUTLIER = "fleet_outlier"
    """A robust outlier among the same series of the node's class, or among the node's own GPUs."""
    CHECK_FAILED = "check_failed"
    """The probe's own sanity check failed on the node (wrong data, GPUs missing)."""
    LOCALISED = "localised"
    """Multi-node results are bad with this node in them and good without it."""
    GROUP_SUSPECT = "group_suspect"
    """In a bad multi-node result whose culprit is not known yet (re-pairing requested)."""
    FLEET_EVENT = "fleet_event"
    """The drop is shared by a large part of the class at once: a fleet event, not this node."""
    NCCL_TRANSPORT = "nccl_transport"
    """NCCL used another network transport than the node class expects (e.g. sockets, not IB)."""
    GPUS_MISSING = "gpus_missing"
    """The probe started on the node and found fewer GPUs than it needs (a GPU fell off the bus)."""
    HANG = "hang"
    """The node's ranks hung in the measurement phase while the others went on."""
    CRASH = "crash"
    """A rank on the node died without a word in the measurement phase."""
    CUDA_ERROR = "cuda_error"
    """CUDA failed on the node's ranks."""
    NCCL_ERROR = "nccl_error"
    """NCCL failed on the node's ranks (not a peer's failure reported remotely)."""
    REPEATED_ERRORS = "repeated_errors"
    """The node's probe runs keep erroring while its class passes (an ``error`` verdict: never drains)."""
    PROBE_ERROR = "probe_error"
    """The probe or the infrastructure failed; says nothing about the node."""
    MEASUREMENT_MISSING = "measurement_missing"
    """The probe passed without a measurement it must report (fail closed: ``error``)."""
    MANUAL = "manual"
    """An operator's ``healthd drain``."""
    FABRIC_MANAGER = "fabric_manager"
    """An NVSwitch system's GPU whose fabric registration is not completed with success (Fabric Manager down
    or failed; the node check at job boundaries, ``healthd.judge.sources.boundary``)."""


RECOMMENDABLE = frozenset(
    {ReasonCode.BELOW_FLOOR, ReasonCode.BASELINE_DRIFT, ReasonCode.FLEET_OUTLIER, ReasonCode.CHECK_FAILED,
     ReasonCode.LOCALISED, ReasonCode.NCCL_TRANSPORT, ReasonCode.GPUS_MISSING, ReasonCode.HANG, ReasonCode.CRASH,
     ReasonCode.CUDA_ERROR, ReasonCode.NCCL_ERROR, ReasonCode.FABRIC_MANAGER}
)


class Severity(IntEnum):
    NONE = 0
    DEGRADED = 1
    FAIL = 2


class SeriesKey(NamedTuple):
    """One judged series of one node: probe, measurement name and labels (``labels`` sorted)."""

    probe: str
    name: str
    labels: tuple[tuple[str, str], ...]

    @classmethod
    def of(cls, probe: str, name: str, labels: dict[str, str]) -> SeriesKey:
        return cls(probe, name, tuple(sorted(labels.items())))

    @property
    def label_dict(self) -> dict[str, str]:
        return dict(self.labels)

    def without(self, *keys: str) -> SeriesKey:
        return SeriesKey(self.probe, self.name, tuple(kv for kv in self.labels if kv[0] not in keys))

    def describe(self, uuid: str | None = None) -> str:
        """``gpu 3 flop_per_second{dtype=bf16}``: the GPU first, so one slow GPU is named (with its UUID
        where a failed check or the run's environment gave it: ``gpu 3 (GPU-5e1a…) check:gemm.bf16.result``)."""
        labels = dict(self.labels)
        gpu = labels.pop("gpu", None)
        uuid = labels.pop("gpu_uuid", None) or uuid
        inner = ",".join(f"{k}={_short_size(k, v)}" for k, v in sorted(labels.items()))
        text = f"{self.name}{{{inner}}}" if inner else self.name
        return f"gpu {gpu}{f' ({uuid})' if uuid else ''} {text}" if gpu is not None else text


def _short_size(key: str, value: str) -> str:
    if key != "size_bytes" or not value.isdigit():
        return value
    size = int(value)
    for unit, scale in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if size >= scale and size % scale == 0:
            return f"{size // scale}{unit}"
    return value


@dataclass(frozen=True, slots=True)
class Finding:
    """One layer's statement about one value of one series."""

    code: ReasonCode
    severity: Severity
    key: SeriesKey
    value: float
    reference: float
    """The floor, the baseline median or the fleet median the value was compared with."""
    threshold: float
    """The value past which it is flagged (``reference`` shifted by the allowed deviation)."""
    detail: str
    score: float | None = None
    """The robust z-score for fleet findings."""
    event_proof: bool = False
    """True when a fleet-wide shift cannot explain it (a failed check; an outlier against the
    class as it is during the event)."""
    gpu_uuid: str | None = None
    """The UUID of the GPU of a per-GPU series as the run reported it (not part of the series' key)."""
    switch_proof: bool = False
    """True when a failing switch or rack cannot explain it (a GPU slower than the node's others, a failed
    check, GPUs missing, a CUDA error, NCCL on the wrong network): a switch finding does not hold it."""

    def on_gpu(self, uuid: str) -> Finding:
        """This finding naming its GPU by ``uuid`` too: ``gpu 3 (GPU-…) flop_per_second…`` in its text and
        ``gpu_uuid`` in its evidence."""
        plain = self.key.describe()
        detail = self.key.describe(uuid) + self.detail[len(plain):] if self.detail.startswith(plain) else self.detail
        return replace(self, detail=detail, gpu_uuid=uuid)

    def evidence(self) -> dict[str, float | str]:
        out: dict[str, float | str] = {"layer": self.code.value, "series": self.key.describe(), "value": self.value,
                                       "reference": self.reference, "threshold": self.threshold}
        if self.score is not None:
            out["z"] = round(self.score, 2)
        labels = self.key.label_dict
        for name in EVIDENCE_LABELS:
            if name in labels:
                out[name] = labels[name]
        if self.gpu_uuid and "gpu" in labels:
            out["gpu_uuid"] = self.gpu_uuid
            out["series"] = self.key.describe(self.gpu_uuid)
        return out


CONFIRMED = "confirmed"
"""``stage`` in a verdict's evidence: its finding is confirmed (seen in n of the last m runs), the state a
recommendation and the ``healthd_node_finding`` metrics stand on; absent while a re-probe is awaited."""
EVIDENCE_LABELS = ("gpu", "dtype", "collective", "gpu_uuid")
"""Labels of a finding's series that its evidence names (which GPU, dtype or collective is bad; the GPU's UUID
where a failed check gave it)."""


class MeasurementInput(NamedTuple):
    name: str
    value: float
    labels: dict[str, str]
    node: str | None


@dataclass(frozen=True)
class CheckInput:
    name: str
    detail: str
    node: str | None = None
    gpu: int | None = None
    gpu_uuid: str | None = None


@dataclass(frozen=True)
class RunInput:
    """A finished run as the judge sees it (built from ``Collected`` or from the store)."""

    run_id: str
    probe: str
    nodes: tuple[str, ...]
    outcome: Outcome
    reason: str
    at: float
    measurements: tuple[MeasurementInput, ...] = ()
    failed_checks: tuple[CheckInput, ...] = ()
    kind: RunKind = RunKind.PROBE
    gpu_uuids: Mapping[tuple[str, str], str] = field(default_factory=dict)
    """The UUID of each GPU of the run by (node, GPU index as its ``gpu`` label): per-GPU findings name it."""
    links: Mapping[tuple[str, str], str] = field(default_factory=dict)
    """(node, scope) → the slowest link a run measured there, for people (the pipeline probe's
    ``slowest_link``: ``rank 0 (node1 gpu 0) -> rank 1 (node2 gpu 0): 1.2 GB/s, 0.05 x the median ...``): a
    finding on the node's link figures names both ends."""
    nics: Mapping[str, frozenset[tuple[str, str]]] = field(default_factory=dict)
    """Node → the InfiniBand ports (device, port) NCCL used there (its ``NET/IB : Using [0]mlx5_0:1/IB ...``
    lines, ``params.nccl_transport``); a node absent: not known."""
    image: str | None = None
    """The container image the probe ran in, as it recorded it (``environment.container_image``:
    ``IMAGE@sha256:…`` for an image ``healthd image build`` wrote); ``None``: bare, or not known."""

    @property
    def priority(self) -> bool:
        """A re-probe the judge asked for (confirmation, localisation, recheck), not a regular run."""
        return self.kind is RunKind.REPROBE


@dataclass(frozen=True, slots=True)
class Mark:
    """What one judged run says about one node for its probe (``severity`` NONE: it passed)."""

    run_id: str
    node: str
    probe: str
    at: float
    severity: Severity
    code: ReasonCode
    text: str
    regular: bool
    event_proof: bool = False
    findings: tuple[Finding, ...] = ()
    raw_flagged: bool = False
    """Any finding before fleet-event attribution (what fleet-event detection samples)."""
    shortfalls: tuple[tuple[SeriesKey, float, float], ...] = ()
    """Each series' distance from the node's own baseline in units of its noise and as a fraction of the
    baseline (positive: worse), for the mean test of retests (``confirm.mean_confirmed``); not stored, so
    empty after a restart."""

    @property
    def flagged(self) -> bool:
        return self.severity > Severity.NONE


@dataclass(frozen=True, slots=True)
class GroupRecord:
    """A multi-node result: who was in it, whether it was bad, and who was under suspicion."""

    run_id: str
    probe: str
    at: float
    members: tuple[str, ...]
    severity: Severity
    code: ReasonCode
    text: str
    suspects: tuple[str, ...]
    """Members that may be at fault: all of a regular run; the re-probed ones of a priority run."""
    event_proof: bool = False
    findings: tuple[Finding, ...] = ()

    @property
    def flagged(self) -> bool:
        return self.severity > Severity.NONE


@dataclass(frozen=True)
class FleetEvent:
    """A large share of a class degraded at once on one probe (one fleet-level verdict)."""

    node_class: str
    probe: str
    started_at: float
    ended_at: float | None
    flagged: int
    sampled: int
    series: tuple[str, ...]
    text: str
    switch: str = ""
    """A switch finding (``healthd.judge.switches``): the switch named; empty for a class-wide event."""
    level: int = 0
    """The switch's level (0: a leaf or block)."""
    nodes: tuple[str, ...] = ()
    """A switch finding's flagged nodes."""
    held: tuple[str, ...] = ()
    """A switch finding's switches whose nodes' findings on the probe it holds (itself, or its leaves
    beyond chance)."""
    cause: str = ""
    """The registered cause (``healthd.judge.sources``) that declared it, when not the built-in class event or
    switch rule (empty): the one that restores it after a restart."""
    key: str = ""
    """A class event's series (``healthd.judge.sources.events.series_of``): the measurement and its labels but
    those naming where it was measured (node, GPU, peers), ``busbw_bytes_per_second{collective=all_reduce,
    scope=node,size_bytes=1073741824}``; the event holds only values of that series. Empty: every series of
    the probe (a declared event, a by-node pseudo-probe's, a switch finding, or a row stored before events had
    a series)."""
    scope: str = ""
    """What the event's series measures (``healthd_fleet_event_active{scope}``): its ``scope`` label
    (``node``: a node's own NVLink, ``group``: the inter-node fabric), else ``gpu`` (a per-GPU series) or
    ``node``; ``*`` or empty: every series of the probe."""

    @property
    def active(self) -> bool:
        return self.ended_at is None


@dataclass(frozen=True)
class LinkFinding:
    """A confirmed finding on the path between nodes ``a`` and ``b`` (``a`` < ``b``) on one probe."""

    probe: str
    a: str
    b: str
    started_at: float
    run_ids: tuple[str, ...]
    """The pair's bad results that confirm it (oldest first)."""
    series: str
    """The judged figure, as its finding describes it (``busbw_bytes_per_second{...}``)."""
    layer: str
    """The reference it broke: ``below_floor``, ``baseline_drift`` (the pair's own baseline) or
    ``fleet_outlier`` (the class's links)."""
    value: float
    reference: float
    link: str
    """The slowest link's sentence where the run named one (ranks, GPUs and UUIDs of both ends, direction,
    its figure against the median link): empty for a probe that measures the pair as a whole."""
    text: str
    ended_at: float | None = None

    @property
    def active(self) -> bool:
        return self.ended_at is None

    @property
    def ratio(self) -> float | None:
        """The figure over its reference (below 1: worse)."""
        return self.value / self.reference if self.reference else None

    @property
    def action(self) -> str:
        """What the operator should do (the one recommendation a link gets: no node is drained)."""
        return (f"inspect the path between {self.a} and {self.b} (cables, ports, transceivers, the switches "
                f"between them); neither node is drained: both measure clean with other partners")


@dataclass(frozen=True)
class Request:
    """A re-probe the judge wants: confirm a finding, localise a bad group, or bisect one."""

    kind: RequestKind
    probe: str
    nodes: tuple[str, ...]
    requested_at: float
    reason: str
    side: Literal["", "same leaf", "other leaf"] = ""
    """With a topology, a multi-node re-probe of one node runs with partners under its own leaf and under
    others: the side still to run once the first one did (empty: either)."""


@dataclass(frozen=True)
class RecommendationCandidate:
    node: str
    probe: str
    outcome: Outcome
    reason_code: str
    """A ``ReasonCode``, or a passive signal's own code (``xid_79``, ``row_remap_failure``, ...)."""
    text: str
    evidence: dict[str, object]
    at: float


@dataclass
class JudgeOutput:
    """What one evaluation produced; ``evaluated`` are the (node, probe) pairs it re-judged."""

    at: float
    verdicts: list[Verdict] = field(default_factory=list)
    recommendations: list[RecommendationCandidate] = field(default_factory=list)
    evaluated: set[tuple[str, str]] = field(default_factory=set)
    fleet_events: list[FleetEvent] = field(default_factory=list)
    """Events that started or ended in this evaluation."""
    switch_findings: list[FleetEvent] = field(default_factory=list)
    """Switch findings that started, changed (their flagged nodes) or ended in this evaluation."""
    requests: list[Request] = field(default_factory=list)
    """Re-probes asked for in this evaluation (all pending ones: ``Judge.requests``)."""
    marks: list[Mark] = field(default_factory=list)
    groups: list[GroupRecord] = field(default_factory=list)
    series: list[SeriesState] = field(default_factory=list)
    """Series whose state changed (for the store)."""
    satisfied: list[tuple[str, str]] = field(default_factory=list)
    """(node, probe) whose pending re-probe was answered or given up."""
    flag_rates: dict[tuple[str, str, bool], tuple[int, int]] = field(default_factory=dict)
    """(class, probe, group results) → (flagged, judged) regular results, where this evaluation changed them."""
    error_streaks: dict[tuple[str, str], int] = field(default_factory=dict)
    """(node, probe) → its consecutive error runs, for each pair this evaluation saw (0: no streak)."""
    link_findings: list[LinkFinding] = field(default_factory=list)
    """Link findings (``healthd.judge.links``) that started, changed or ended in this evaluation."""


_NONE = float("nan")
_HEAD = 5
"""``SeriesState``'s packed array: last value, last time, floor, baseline, spread, then the window's (at, value)."""


class _Optional:
    """One of ``SeriesState``'s packed numbers that may be None (stored as NaN)."""

    def __init__(self, index: int) -> None:
        self.index = index

    @overload
    def __get__(self, obj: None, owner: type | None = None) -> _Optional: ...
    @overload
    def __get__(self, obj: SeriesState, owner: type | None = None) -> float | None: ...
    def __get__(self, obj: SeriesState | None, owner: type | None = None) -> float | _Optional | None:
        if obj is None:
            return self
        x = obj._v[self.index]
        return None if x != x else x

    def __set__(self, obj: SeriesState, x: float | None) -> None:
        obj._v[self.index] = _NONE if x is None else x


class SeriesState:
    """Per node and series: the accepted (passing) history, the latest value, the floor.

    Packed for a fleet's hundreds of thousands of series: the numbers live in one ``array('d')`` (NaN: None;
    ~220 bytes a series with a window of 3, against ~1 KB as Python floats and tuples), read and written
    through the attributes below. ``accepted`` builds a new list on each read: use ``accepted_count`` for its
    length and assign a whole new window to change it."""

    __slots__ = ("_v", "key", "last_run_id", "node")

    def __init__(self, node: str, key: SeriesKey, accepted: Iterable[tuple[float, float]] = (),
                 last_value: float | None = None, last_at: float = 0.0, last_run_id: str = "",
                 floor: float | None = None, baseline: float | None = None, spread: float | None = None) -> None:
        self.node = node
        self.key = key
        self.last_run_id = last_run_id
        self._v = array("d", (_NONE if last_value is None else last_value, last_at,
                              _NONE if floor is None else floor, _NONE if baseline is None else baseline,
                              _NONE if spread is None else spread))
        for at, value in accepted:
            self._v.append(at)
            self._v.append(value)

    @classmethod
    def packed(cls, node: str, key: SeriesKey, last_run_id: str, numbers: array[float]) -> SeriesState:
        """From ``numbers`` as ``pack`` gives them (taken over, not copied): the store's fast path."""
        if len(numbers) < _HEAD or len(numbers) % 2 != _HEAD % 2:
            raise ValueError(f"a packed series state has 5 + 2n numbers, not {len(numbers)}")
        st = cls.__new__(cls)
        st.node, st.key, st.last_run_id, st._v = node, key, last_run_id, numbers
        return st

    def pack(self) -> array[float]:
        """The numbers (last value, last time, floor, baseline, spread, then (at, value) pairs; NaN: None)."""
        return array("d", self._v)

    def copy(self) -> SeriesState:
        return SeriesState.packed(self.node, self.key, self.last_run_id, self.pack())

    @property
    def accepted(self) -> list[tuple[float, float]]:
        """(at, value) of recent passing results, oldest first, at most ``baseline.window``."""
        v = self._v
        return [(v[i], v[i + 1]) for i in range(_HEAD, len(v), 2)]

    @accepted.setter
    def accepted(self, window: Iterable[tuple[float, float]]) -> None:
        del self._v[_HEAD:]
        for at, value in window:
            self._v.append(at)
            self._v.append(value)

    @property
    def accepted_count(self) -> int:
        return (len(self._v) - _HEAD) // 2

    last_value = _Optional(0)
    floor = _Optional(2)
    baseline = _Optional(3)
    spread = _Optional(4)

    @property
    def last_at(self) -> float:
        return self._v[1]

    @last_at.setter
    def last_at(self, x: float) -> None:
        self._v[1] = x

    def _fields(self) -> tuple[object, ...]:
        return (self.node, self.key, self.accepted, self.last_value, self.last_at, self.last_run_id, self.floor,
                self.baseline, self.spread)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SeriesState) and self._fields() == other._fields()

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        names = ("node", "key", "accepted", "last_value", "last_at", "last_run_id", "floor", "baseline", "spread")
        return f"SeriesState({', '.join(f'{n}={v!r}' for n, v in zip(names, self._fields(), strict=True))})"


@dataclass(frozen=True)
class JudgeState:
    """The judge's saved state, as the store keeps it and ``Judge.restore`` rebuilds from it."""

    series: tuple[SeriesState, ...] = ()
    marks: tuple[Mark, ...] = ()
    """Recent marks (the confirmation window), any order."""
    groups: tuple[GroupRecord, ...] = ()
    """Recent group records, any order."""
    events: tuple[FleetEvent, ...] = ()
    """Active fleet events and switch findings."""
    pending: tuple[tuple[str, Request], ...] = ()
    """(node, its pending re-probe of the request's probe)."""
    verdicts: tuple[Verdict, ...] = ()
    """The current verdict of each (node, probe)."""
    resets: tuple[tuple[str, float], ...] = ()
    """(node, when healthd last undrained it): its evidence from before no longer counts."""
    flag_rates: tuple[tuple[str, str, bool, int, int], ...] = ()
    """(class, probe, group results, flagged, judged): how often the class flags a result by chance."""
    error_streaks: tuple[tuple[str, str, int], ...] = ()
    """(node, probe, consecutive error runs)."""
    links: tuple[LinkFinding, ...] = ()
    """Active link findings (``healthd.judge.links``)."""


@dataclass(frozen=True, slots=True)
class Declaration:
    """An operator's statement that a class is being changed (``healthd event start``,
    ``healthd.judge.sources.declared``)."""

    node_class: str
    reason: str
    started_at: float
    by: str = ""


@dataclass(frozen=True, slots=True)
class Declarations:
    """The declarations in force (all of them: one missing has ended)."""

    at: float
    items: tuple[Declaration, ...]
