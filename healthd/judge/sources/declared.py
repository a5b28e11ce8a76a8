"""Declared events as a cause: an operator says a class is being changed (``healthd event start --class
h200x8 --reason "driver roll-out"``), and its flags are held as a class-wide event's, by intent, until
``healthd event end``.

The declarations live in the store (they survive a restart); the daemon hands the current ones to the judge
each tick as a ``Declarations`` document (``Judge.observe``). A declaration that starts or ends is a fleet
event of probe and scope ``*`` naming this cause (``healthd_fleet_event_active``). While it lasts, the class's
findings that a class-wide change can explain are held (a failed check, missing GPUs are still the node's
own, ``resists``), group results of the class are set aside, and the class's statistics start at the declaration;
findings from values measured during it are not revived when it ends (the nodes are probed again first).
"""

from __future__ import annotations

from collections.abc import Iterable

from healthd.judge.model import (
    Declaration,
    Declarations,
    Finding,
    FleetEvent,
    GroupRecord,
    JudgeOutput,
    JudgeState,
    ReasonCode,
    SeriesKey,
)
from healthd.judge.sources.seam import RANK_CLASS, BaseCause, Context

ANY_PROBE = "*"
"""The probe of a declared event's fleet event: every probe of the class."""
ANY_SCOPE = "*"
"""The scope of a declared event's fleet event: every series of every probe."""
CAUSE = "declared"
PERFORMANCE = frozenset({ReasonCode.BELOW_FLOOR, ReasonCode.BASELINE_DRIFT, ReasonCode.FLEET_OUTLIER,
                         ReasonCode.LOCALISED})
"""The findings a declared change explains: figures off their floor, baseline or peers."""


def text_of(d: Declaration) -> str:
    who = f" by {d.by}" if d.by else ""
    return f"declared event on {d.node_class}{who}: {d.reason}"


class Declared(BaseCause):
    """The declared events in force, class → its fleet event, and the span of each class's last one."""

    name = CAUSE
    rank = RANK_CLASS
    label = "declared event"

    def __init__(self) -> None:
        self.events: dict[str, FleetEvent] = {}
        self.spans: dict[str, tuple[float, float]] = {}

    def observe(self, ctx: Context, document: object, now: float, out: JudgeOutput) -> bool:
        if not isinstance(document, Declarations):
            return False
        wanted = {d.node_class: d for d in document.items}
        for cls in sorted(set(self.events) - set(wanted)):
            live = self.events.pop(cls)
            self.spans[cls] = (live.started_at, now)
            out.fleet_events.append(FleetEvent(cls, ANY_PROBE, live.started_at, now, 0, 0, (), f"{live.text}; over",
                                               cause=CAUSE, scope=ANY_SCOPE))
        for cls, d in sorted(wanted.items()):
            if cls in self.events:
                continue
            event = FleetEvent(cls, ANY_PROBE, d.started_at, None, 0, 0, (), text_of(d), cause=CAUSE, scope=ANY_SCOPE)
            self.events[cls] = event
            out.fleet_events.append(event)
        return True

    def holding(self, node: str, probe: str, cls: str) -> FleetEvent | None:
        return self.events.get(cls) if self.events else None

    def resists(self, f: Finding, event: FleetEvent | None = None) -> bool:
        """A performance figure is the change's (a node upgraded before the others stands out from its class
        too); a failed check, missing GPUs, a hang or a crash are not."""
        return f.code not in PERFORMANCE

    def since(self, cls: str, probe: str, key: SeriesKey | None = None) -> float | None:
        event = self.events.get(cls) if self.events else None
        return event.started_at if event is not None else None

    def ended_over(self, cls: str, probe: str, at: float) -> bool:
        span = self.spans.get(cls)
        return span is not None and span[0] <= at <= span[1]

    def sets_aside(self, ctx: Context, record: GroupRecord) -> bool:
        event = self.events.get(ctx.node_class(record.members[0])) if self.events else None
        return event is not None and record.at >= event.started_at and \
            not any(self.resists(f) for f in record.findings)

    def fleet_events(self) -> Iterable[FleetEvent]:
        return self.events.values()

    def restore(self, ctx: Context, state: JudgeState) -> None:
        for event in state.events:
            if event.cause == CAUSE and event.active:
                self.events[event.node_class] = event
