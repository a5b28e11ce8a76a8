"""Class-wide (fleet) events as a cause: a large share of a class flagged at once on one probe is one
event of the class, never a recommendation for each node (``fleet.check_event``, ``rounds.event_hold``).

The broadest cause (``RANK_CLASS``): asked first whether it holds a node's value, tested last, on what the
more specific causes (a switch, ...) leave unexplained. While an event lasts, the class's statistics start
at its beginning; a finding made during it is held unless it is event-proof (a failed check, a missing
GPU); a node's retest shortfalls measured during an ended event are void (the node is re-probed first).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import replace

from healthd.judge.fleet import check_event
from healthd.judge.model import Finding, FleetEvent, GroupRecord, JudgeOutput, JudgeState
from healthd.judge.rounds import Hold, event_hold
from healthd.judge.sources.seam import RANK_CLASS, BaseCause, Context, Update
from healthd.judge.switches import ambiguity


class ClassEvents(BaseCause):
    """The live fleet events, (class, probe) → event, and the span of each key's last ended one."""

    name = "class_event"
    rank = RANK_CLASS
    label = "fleet event"

    def __init__(self) -> None:
        self.events: dict[tuple[str, str], FleetEvent] = {}
        self.spans: dict[tuple[str, str], tuple[float, float]] = {}
        """(class, probe) → (start, end) of its last ended event: runs then carry no retest shortfalls."""

    def update(self, ctx: Context, touched: set[tuple[str, str]], now: float, out: JudgeOutput) -> Update:
        changed: set[tuple[str, str]] = set()
        cutoff = now - ctx.settings.fleet.event_window_s
        for cls, probe in sorted({(ctx.node_class(n), p) for n, p in touched}):
            sample = [s for n, s in ctx.samples.get((cls, probe), {}).items()
                      if s[0] >= cutoff and not ctx.explained(n, probe, above=self.rank)]
            active = self.events.get((cls, probe))
            check = check_event(sample, ctx.settings.fleet, active=active is not None)
            if active is None and check is not None:
                amb = ambiguity(ctx.topology, ctx.classes, node_class=cls)
                event = FleetEvent(cls, probe, check.started_at, None, check.flagged, check.sampled, (),
                                   f"fleet event: {probe} on {cls}: {check.text}"
                                   + (f"; {amb.text}" if amb is not None else ""))
                self.events[(cls, probe)] = event
                out.fleet_events.append(event)
                changed.add((cls, probe))
            elif active is not None and check is None:
                ended = replace(active, ended_at=now, text=active.text + "; over")
                self.spans[(cls, probe)] = (active.started_at, now)
                del self.events[(cls, probe)]
                out.fleet_events.append(ended)
                changed.add((cls, probe))
        return Update(rejudge=changed)

    def holding(self, node: str, probe: str, cls: str) -> FleetEvent | None:
        return self.events.get((cls, probe)) if self.events else None

    def resists(self, f: Finding, event: FleetEvent | None = None) -> bool:
        return f.event_proof

    def since(self, cls: str, probe: str) -> float | None:
        event = self.events.get((cls, probe)) if self.events else None
        return event.started_at if event is not None else None

    def ended_over(self, cls: str, probe: str, at: float) -> bool:
        span = self.spans.get((cls, probe))
        return span is not None and span[0] <= at <= span[1]

    def sets_aside(self, ctx: Context, record: GroupRecord) -> bool:
        event = self.events.get((ctx.node_class(record.members[0]), record.probe)) if self.events else None
        return event is not None and not record.event_proof and record.at >= event.started_at

    def hold(self, ctx: Context, node: str, probe: str, findings: Sequence[Finding], since: float,
             partners: set[str], now: float) -> Hold | None:
        if findings and all(f.event_proof for f in findings):
            return None
        cls = ctx.node_class(node)
        cutoff = now - ctx.settings.fleet.event_window_s
        sample = [(n, at, bad) for n, (at, bad) in ctx.samples.get((cls, probe), {}).items()
                  if at >= cutoff and (n not in partners or n == node)
                  and not ctx.explained(n, probe, above=self.rank)]
        return event_hold(sample, since, node, now, ctx.settings.fleet)

    def fleet_events(self) -> Iterable[FleetEvent]:
        return self.events.values()

    def restore(self, ctx: Context, state: JudgeState) -> None:
        for event in state.events:
            if not event.switch and not event.cause:
                self.events[(event.node_class, event.probe)] = event
