"""The two seams of the judge: a ``Source`` of evidence and a ``Cause`` that explains flagged values.

A **source** observes evidence (a finished run, a passive poll, a boundary document) and offers findings
about a node, a GPU or a link; it restores what it follows after a restart. A **cause** is given each
round's flagged values and claims the subset it can physically explain (a class-wide event, a switch, a
link between two nodes), with a specificity rank (``RANK_*``): the judge asks the causes in rank order
whether one holds a node's value, and what no cause claims is judged as a node's own evidence.

Both see the judge's state only through ``Context`` (``healthd.judge.engine.Judge`` provides it); neither
imports the engine, the collector or the store. Both are registered in ``healthd.judge.sources``; the
engine names none of them. ``BaseSource`` and ``BaseCause`` give every hook a neutral default, so a new
one implements only what it does.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple, Protocol

from healthd.config import JudgeSettings
from healthd.judge.fleet import FleetStats
from healthd.judge.floors import FloorTable
from healthd.judge.model import (
    Direction,
    Finding,
    FleetEvent,
    GroupRecord,
    JudgeOutput,
    JudgeState,
    Mark,
    MeasurementInput,
    Request,
    RunInput,
    SeriesKey,
    SeriesState,
)
from healthd.model import Verdict

if TYPE_CHECKING:
    from healthd.judge.rounds import Hold
    from healthd.topology import Topology

RANK_CLASS = 0
"""A class-wide (fleet) event: the broadest cause, asked first."""
RANK_SPINE = 1
RANK_LEAF = 2
RANK_LINK = 3
RANK_NODE = 4
RANK_GPU = 5

FleetCache = dict[tuple[str, SeriesKey], FleetStats | None]
Sample = tuple[float, bool]
"""A node's latest regular result of a probe: (when, flagged)."""


class Selected(NamedTuple):
    m: MeasurementInput
    direction: Direction
    key: SeriesKey
    fkey: SeriesKey
    """The fleet key: the series without its ``gpu`` label (a class's GPUs are pooled)."""


@dataclass
class RunFindings:
    """What the run-based sources found in one run, before suppression and confirmation."""

    node_findings: dict[str, list[Finding]] = field(default_factory=dict)
    group_findings: list[Finding] = field(default_factory=list)
    """Findings on a multi-node measurement (the group), localised later by ``confirm.attribute``."""
    values: list[tuple[str, SeriesKey, float, bool]] = field(default_factory=list)
    """(node, series, value, from a group measurement): what the baselines may accept."""
    shortfalls: dict[str, list[tuple[SeriesKey, float, float]]] = field(default_factory=dict)
    """Node → (series, distance from its own baseline in noise units and relative, positive: worse)."""
    ends: tuple[str, ...] = ()
    """The two nodes at the ends of the run's slowest inter-node link, when its group findings are on
    inter-node link figures (a link between two nodes, whatever the run's size): the group's suspects."""

    def place(self, nodes: tuple[str, ...], node: str | None, f: Finding) -> None:
        """On ``node`` when it is one of the run's ``nodes``, on the only node of a single-node run,
        else on the group."""
        if node is not None and node in nodes:
            self.node_findings.setdefault(node, []).append(f)
        elif len(nodes) == 1:
            self.node_findings.setdefault(nodes[0], []).append(f)
        else:
            self.group_findings.append(f)


@dataclass
class Update:
    """What a cause's re-test changed: (node, probe) pairs to conclude again, and (class, probe) keys whose
    runs of this round are judged again (their class statistics moved)."""

    touched: set[tuple[str, str]] = field(default_factory=set)
    rejudge: set[tuple[str, str]] = field(default_factory=set)


class Context(Protocol):
    """What sources and causes read and write of the judge's state (``Judge`` provides it)."""

    settings: JudgeSettings
    floors: FloorTable
    classes: dict[str, str]
    samples: dict[tuple[str, str], dict[str, Sample]]
    verdicts: dict[tuple[str, str], Verdict]
    marks: dict[tuple[str, str], list[Mark]]
    held: set[tuple[str, str]]
    pending: dict[tuple[str, str], Request]
    drained: set[str]
    group_history: dict[tuple[str, str], list[GroupRecord]]
    last_group_pass: dict[str, dict[str, float]]

    @property
    def drift_fraction(self) -> float: ...

    @property
    def min_deviation(self) -> float: ...

    @property
    def topology(self) -> Topology | None: ...

    @property
    def by_node_probes(self) -> frozenset[str]:
        """Pseudo-probes of evidence no planner runs (passive signals, boundary checks)."""
        ...

    def node_class(self, node: str) -> str: ...

    def state(self, node: str, key: SeriesKey) -> SeriesState: ...

    def fleet(self, cls: str, fkey: SeriesKey, now: float, cache: FleetCache) -> FleetStats | None: ...

    def class_noise(self, cls: str, fkey: SeriesKey) -> float | None: ...

    def in_event(self, cls: str, probe: str, key: SeriesKey | None = None) -> bool:
        """Whether a live event of the class holds the series ``key`` (``None``: any series of the probe)."""
        ...

    def holding(self, node: str, probe: str, *, ranks: range | None = None) -> FleetEvent | None:
        """The first event (in rank order, among causes of ``ranks``) that holds the node on the probe."""
        ...

    def explained(self, node: str, probe: str, *, above: int) -> bool:
        """Whether a cause ranked above ``above`` explains the node's latest flag on the probe."""
        ...

    def set_aside(self, record: GroupRecord) -> bool: ...

    def own_finding(self, node: str, probe: str, cutoff: float) -> bool: ...

    def retests(self, cls: str, probe: str, *, group: bool, node: str | None = None,
                cold: bool = True) -> tuple[int, int]: ...

    def update_causes(self, touched: set[tuple[str, str]], now: float, out: JudgeOutput) -> Update:
        """Re-test every cause on ``touched`` (node, probe) pairs, most specific first."""
        ...

    def set_verdict(self, verdict: Verdict, out: JudgeOutput) -> None:
        """The node's verdict on the probe now; in ``out`` when it says something new."""
        ...

    def ask(self, req: Request, out: JudgeOutput) -> None:
        """A re-probe request, unless a node of it is drained or has one pending on the probe."""
        ...


class Source(Protocol):
    """Evidence in: findings about a node, a GPU or a link. Hooks a source does not need are no-ops
    (``BaseSource``)."""

    name: str
    by_node_probes: frozenset[str]
    """The pseudo-probes this source's verdicts are kept under, not probes the planner runs: a re-probe
    asked for one runs the node's single-node probes, and any judged run of the node answers it."""

    def judge_run(self, ctx: Context, run: RunInput, selected: Sequence[Selected], cache: FleetCache,
                  now: float, ev: RunFindings) -> None:
        """A judged run's findings, added to ``ev``."""
        ...

    def after_runs(self, ctx: Context, judged: Sequence[RunInput], now: float, out: JudgeOutput) -> None:
        """After the round's runs are recorded: what they say of this source's own evidence."""
        ...

    def observe(self, ctx: Context, document: object, now: float, out: JudgeOutput) -> bool:
        """A document other than a run (a poll, ...): ``True`` when it was this source's (no later source sees
        it); a source reading a part of a shared document answers ``False`` (registered before its owner)."""
        ...

    def restore(self, ctx: Context, state: JudgeState) -> None:
        """Rebuild what this source follows from the stored judgement (a restart)."""
        ...


class Cause(Protocol):
    """A physical explanation of flagged values. Hooks a cause does not need are neutral (``BaseCause``)."""

    name: str
    rank: int
    label: str
    """How a class statistic names what it leaves out or starts from (``switch findings``, ``fleet event``)."""

    def set_topology(self, topology: Topology | None, now: float) -> None: ...

    def observe(self, ctx: Context, document: object, now: float, out: JudgeOutput) -> bool:
        """A document other than a run that tells of a cause (an operator's declaration): ``True`` when it
        was this cause's."""
        ...

    def note(self, ctx: Context, node: str, probe: str, findings: Sequence[Finding], *, own: bool,
             members: Sequence[str]) -> None:
        """A node's regular result of the round, with its raw findings (``own``: some are the node's own)."""
        ...

    def note_group(self, record: GroupRecord) -> None:
        """A multi-node result as recorded (also when the stored judgement is restored)."""
        ...

    def update(self, ctx: Context, touched: set[tuple[str, str]], now: float, out: JudgeOutput) -> Update:
        """Re-test on the (node, probe) pairs of the round; started and ended events go to ``out``."""
        ...

    def holding(self, node: str, probe: str, cls: str) -> FleetEvent | None:
        """The live event of this cause that holds the node's values of the probe."""
        ...

    def explains(self, node: str, probe: str) -> bool:
        """Whether this cause explains the node's latest flag on the probe (left out of broader tests)."""
        ...

    def resists(self, f: Finding, event: FleetEvent | None = None) -> bool:
        """Whether ``f`` is evidence this cause (its live ``event``, when given) cannot physically explain:
        it stays the node's own."""
        ...

    def since(self, cls: str, probe: str, key: SeriesKey | None = None) -> float | None:
        """When a live event of the whole class on the series ``key`` (``None``: on any series of the probe)
        began (the series' class statistics start then), else ``None``."""
        ...

    def leaves_out(self, probe: str) -> Callable[[str], bool] | None:
        """Node → whether its values of ``probe`` leave the class statistics (``None``: none do)."""
        ...

    def ended_over(self, cls: str, probe: str, at: float) -> bool:
        """Whether ``at`` fell in this cause's last ended event of the class (no retest shortfalls then)."""
        ...

    def sets_aside(self, ctx: Context, record: GroupRecord) -> bool:
        """Whether a bad group result is this cause's, so no node need explain it."""
        ...

    def claims_group(self, ctx: Context, record: GroupRecord, cutoff: float) -> bool:
        """Whether a bad group result is localised to this cause (a link) rather than to a member."""
        ...

    def hold(self, ctx: Context, node: str, probe: str, findings: Sequence[Finding], since: float,
             partners: set[str], now: float) -> Hold | None:
        """Whether a new recommendation of the node waits for this cause's rule to see its window."""
        ...

    def localise(self, ctx: Context, probe: str, now: float, out: JudgeOutput) -> None:
        """After the probe's group results are localised: this cause's own findings and requests."""
        ...

    def fleet_events(self) -> Iterable[FleetEvent]:
        """The live class-wide events (``healthd_fleet_event_active``)."""
        ...

    def restore(self, ctx: Context, state: JudgeState) -> None: ...


class BaseSource:
    """A source whose hooks do nothing: subclass it and implement what the source does."""

    name = "source"
    by_node_probes: frozenset[str] = frozenset()

    def judge_run(self, ctx: Context, run: RunInput, selected: Sequence[Selected], cache: FleetCache,
                  now: float, ev: RunFindings) -> None:
        return None

    def after_runs(self, ctx: Context, judged: Sequence[RunInput], now: float, out: JudgeOutput) -> None:
        return None

    def observe(self, ctx: Context, document: object, now: float, out: JudgeOutput) -> bool:
        return False

    def restore(self, ctx: Context, state: JudgeState) -> None:
        return None


class BaseCause:
    """A cause that explains nothing: subclass it and implement what the cause does."""

    name = "cause"
    rank = RANK_NODE
    label = "cause"

    def set_topology(self, topology: Topology | None, now: float) -> None:
        return None

    def observe(self, ctx: Context, document: object, now: float, out: JudgeOutput) -> bool:
        return False

    def note(self, ctx: Context, node: str, probe: str, findings: Sequence[Finding], *, own: bool,
             members: Sequence[str]) -> None:
        return None

    def note_group(self, record: GroupRecord) -> None:
        return None

    def update(self, ctx: Context, touched: set[tuple[str, str]], now: float, out: JudgeOutput) -> Update:
        return Update()

    def holding(self, node: str, probe: str, cls: str) -> FleetEvent | None:
        return None

    def explains(self, node: str, probe: str) -> bool:
        return False

    def resists(self, f: Finding, event: FleetEvent | None = None) -> bool:
        return False

    def since(self, cls: str, probe: str, key: SeriesKey | None = None) -> float | None:
        return None

    def leaves_out(self, probe: str) -> Callable[[str], bool] | None:
        return None

    def ended_over(self, cls: str, probe: str, at: float) -> bool:
        return False

    def sets_aside(self, ctx: Context, record: GroupRecord) -> bool:
        return False

    def claims_group(self, ctx: Context, record: GroupRecord, cutoff: float) -> bool:
        return False

    def hold(self, ctx: Context, node: str, probe: str, findings: Sequence[Finding], since: float,
             partners: set[str], now: float) -> Hold | None:
        return None

    def localise(self, ctx: Context, probe: str, now: float, out: JudgeOutput) -> None:
        return None

    def fleet_events(self) -> Iterable[FleetEvent]:
        return ()

    def restore(self, ctx: Context, state: JudgeState) -> None:
        return None


SourceFactory = Callable[[], Source]
CauseFactory = Callable[[], Cause]
Samples = Mapping[str, Sample]
