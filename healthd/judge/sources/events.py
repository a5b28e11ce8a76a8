"""Class-wide (fleet) events as a cause: a large share of a class flagged at once on one series of a probe is
one event of the class, never a recommendation for each node (``fleet.check_event``, ``rounds.event_hold``).

An event is keyed by class, probe and series (``series_of``: the measurement and its labels but those naming
where it was measured, node, GPU or peers): NCCL's intra-node busbw (``scope=node``) and its inter-node busbw
(``scope=group``) are two events, and a GEMM event on per-GPU series is one event of the class's GPUs. An event
holds only values of its own series: a ``group``-scope event never a ``node``-scope value, nor the reverse (a
node whose own NVLink is low during a fabric event is still found). Each node's latest regular result says which
series it flagged (``note``); each series' sample is the class's latest results, flagged when they flagged that
series. A by-node pseudo-probe (passive signals), whose results name no series, has one event for the probe
(key ``ANY_SERIES``), as has an event stored before events had a series (it loads as before).

The broadest cause (``RANK_CLASS``): asked first whether it holds a node's value, tested last, on what the
more specific causes (a switch, ...) leave unexplained. While an event lasts, the class's statistics of its
series start at its beginning; a finding on its series made during it is held unless it is event-proof (a
failed check, a missing GPU); a node's retest shortfalls measured during an ended event of the probe are void
(the node is re-probed first).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import replace
from functools import lru_cache

from healthd.judge.fleet import check_event
from healthd.judge.model import Finding, FleetEvent, GroupRecord, JudgeOutput, JudgeState, SeriesKey
from healthd.judge.rounds import Hold, event_hold
from healthd.judge.sources.seam import RANK_CLASS, BaseCause, Context, Update
from healthd.judge.switches import ambiguity

ANY_SERIES = ""
"""The key of an event on every series of its probe (a by-node pseudo-probe's, or one stored without a key)."""
ANY_SCOPE = "*"
"""``healthd_fleet_event_active{scope}`` of an event on every series of its probe (and of a declared event)."""
WHERE_LABELS = frozenset({"node", "nodes", "gpu", "gpu_uuid", "peer", "rail", "rank", "src_rank", "dst_rank"})
"""Labels that say where a value was measured, not what: left out of an event's series (one event of a class's
nodes and GPUs, whatever the size of the run)."""
_NONE: frozenset[str] = frozenset()

Flags = tuple[float, frozenset[str]]
"""A node's latest regular result of a probe: (when, the event series it flagged)."""


@lru_cache(maxsize=8192)
def series_of(key: SeriesKey) -> tuple[str, str]:
    """(the event series of ``key``, its scope): the measurement with its labels but ``WHERE_LABELS``, and the
    series' ``scope`` label, else ``gpu`` for a per-GPU series, else ``node``.

    >>> series_of(SeriesKey.of("gemm", "flop_per_second", {"gpu": "3", "dtype": "bf16"}))
    ('flop_per_second{dtype=bf16}', 'gpu')
    >>> series_of(SeriesKey.of("nccl", "busbw", {"scope": "group", "nodes": "2"}))
    ('busbw{scope=group}', 'group')
    """
    labels = dict(key.labels)
    kept = ",".join(f"{k}={v}" for k, v in key.labels if k not in WHERE_LABELS)
    scope = labels.get("scope") or ("gpu" if "gpu" in labels else "node")
    return (f"{key.name}{{{kept}}}" if kept else key.name), scope


class ClassEvents(BaseCause):
    """The live fleet events, (class, probe) → series → event, and the span of each one's last ended event."""

    name = "class_event"
    rank = RANK_CLASS
    label = "fleet event"

    def __init__(self) -> None:
        self.live: dict[tuple[str, str], dict[str, FleetEvent]] = {}
        self.spans: dict[tuple[str, str], dict[str, tuple[float, float]]] = {}
        """(class, probe) → series → (start, end) of its last ended event: runs then carry no retest shortfalls."""
        self.flags: dict[tuple[str, str], dict[str, Flags]] = defaultdict(dict)
        """(class, probe) → node → its latest regular result's flagged series (``note``)."""
        self.scopes: dict[str, str] = {}
        """Event series → its scope (``series_of``)."""

    def _series(self, key: SeriesKey) -> str:
        series, scope = series_of(key)
        if series not in self.scopes:
            self.scopes[series] = scope
        return series

    def note(self, ctx: Context, node: str, probe: str, findings: Sequence[Finding], *, own: bool,
             members: Sequence[str]) -> None:
        cls = ctx.node_class(node)
        sample = ctx.samples.get((cls, probe), {}).get(node)
        if sample is not None:
            keys = frozenset(self._series(f.key) for f in findings) if findings else _NONE
            self.flags[(cls, probe)][node] = (sample[0], keys)

    def _rows(self, ctx: Context, cls: str, probe: str, cutoff: float, *, partners: set[str] | None = None,
              node: str = "") -> list[tuple[str, float, bool, frozenset[str] | None]]:
        """(node, at, flagged on any series, the series it flagged or ``None`` where not known) of the class's
        latest regular results in the window that no more specific cause explains."""
        flags = self.flags.get((cls, probe), {})
        rows = []
        for n, (at, bad) in ctx.samples.get((cls, probe), {}).items():
            if at < cutoff or (partners is not None and n in partners and n != node) \
                    or ctx.explained(n, probe, above=self.rank):
                continue
            known = flags.get(n)
            rows.append((n, at, bad, known[1] if known is not None and known[0] == at else None))
        return rows

    def update(self, ctx: Context, touched: set[tuple[str, str]], now: float, out: JudgeOutput) -> Update:
        """Each series of the round's (class, probe) pairs re-tested (``fleet.check_event``): a live event's,
        and those flagged on enough of the sample that one could start (the event rule's least share and
        ``event_min_nodes``; the others cannot)."""
        changed: set[tuple[str, str]] = set()
        cutoff = now - ctx.settings.fleet.event_window_s
        for cls, probe in sorted({(ctx.node_class(n), p) for n, p in touched}):
            rows = self._rows(ctx, cls, probe, cutoff)
            live = self.live.get((cls, probe), {})
            counts: Counter[str] = Counter(s for *_, keys in rows if keys for s in keys)
            unknown = sum(1 for _, _, bad, keys in rows if keys is None and bad)
            fleet = ctx.settings.fleet
            least = max(fleet.event_min_nodes, min(fleet.event_share, fleet.event_recent_min_share) * len(rows))
            candidates = set(live) | {s for s, n in counts.items() if n + unknown >= least}
            if not self.flags.get((cls, probe)):
                candidates.add(ANY_SERIES)
            for series in sorted(candidates):
                sample = [(at, bad if keys is None or series == ANY_SERIES else series in keys)
                          for _, at, bad, keys in rows]
                active = live.get(series)
                check = check_event(sample, ctx.settings.fleet, active=active is not None)
                if active is None and check is not None:
                    self._start(ctx, cls, probe, series, check.started_at, check.flagged, check.sampled,
                                check.text, out)
                    changed.add((cls, probe))
                elif active is not None and check is None:
                    ended = replace(active, ended_at=now, text=active.text + "; over")
                    self.spans.setdefault((cls, probe), {})[series] = (active.started_at, now)
                    del live[series]
                    if not live:
                        del self.live[(cls, probe)]
                    out.fleet_events.append(ended)
                    changed.add((cls, probe))
        return Update(rejudge=changed)

    def _start(self, ctx: Context, cls: str, probe: str, series: str, at: float, flagged: int, sampled: int,
               why: str, out: JudgeOutput) -> None:
        scope = self.scopes.get(series, ANY_SCOPE) if series else \
            ("node" if probe in ctx.by_node_probes else ANY_SCOPE)
        amb = ambiguity(ctx.topology, ctx.classes, node_class=cls)
        what = f"{series} (scope {scope}): " if series else ""
        event = FleetEvent(cls, probe, at, None, flagged, sampled, (),
                           f"fleet event: {probe} on {cls}: {what}{why}" + (f"; {amb.text}" if amb is not None else ""),
                           key=series, scope=scope)
        self.live.setdefault((cls, probe), {})[series] = event
        out.fleet_events.append(event)

    def holding(self, node: str, probe: str, cls: str) -> FleetEvent | None:
        """The live event of the class and probe (the earliest, when several series have one); which of the
        node's findings it holds is the series' (``resists``)."""
        live = self.live.get((cls, probe)) if self.live else None
        if not live:
            return None
        return min(live.values(), key=lambda e: e.started_at) if len(live) > 1 else next(iter(live.values()))

    def resists(self, f: Finding, event: FleetEvent | None = None) -> bool:
        """An event-proof finding, or one on a series with no live event of the class and probe."""
        if f.event_proof or event is None:
            return f.event_proof
        live = self.live.get((event.node_class, event.probe))
        keys = live.keys() if live else (event.key,)
        return ANY_SERIES not in keys and self._series(f.key) not in keys

    def since(self, cls: str, probe: str, key: SeriesKey | None = None) -> float | None:
        live = self.live.get((cls, probe)) if self.live else None
        if not live:
            return None
        if key is None:
            return min(e.started_at for e in live.values())
        event = live.get(self._series(key)) or live.get(ANY_SERIES)
        return event.started_at if event is not None else None

    def ended_over(self, cls: str, probe: str, at: float) -> bool:
        spans = self.spans.get((cls, probe))
        return spans is not None and any(start <= at <= end for start, end in spans.values())

    def sets_aside(self, ctx: Context, record: GroupRecord) -> bool:
        """A bad group result of the class whose every finding is on a series with a live event since before it."""
        live = self.live.get((ctx.node_class(record.members[0]), record.probe)) if self.live else None
        if not live or record.event_proof:
            return False
        everything = live.get(ANY_SERIES)
        if everything is not None:
            return record.at >= everything.started_at
        keys = {self._series(f.key) for f in record.findings}
        if not keys:
            return record.at >= min(e.started_at for e in live.values())
        return all(k in live and record.at >= live[k].started_at for k in keys)

    def hold(self, ctx: Context, node: str, probe: str, findings: Sequence[Finding], since: float,
             partners: set[str], now: float) -> Hold | None:
        """The event barrier on the findings' own series: results flagged on another series (a fabric event
        forming while a node's own NVLink is low) are no event this finding could be part of."""
        if findings and all(f.event_proof for f in findings):
            return None
        mine = {self._series(f.key) for f in findings if not f.event_proof}
        rows = self._rows(ctx, ctx.node_class(node), probe, now - ctx.settings.fleet.event_window_s,
                          partners=partners, node=node)
        sample = [(n, at, bad if keys is None or not mine else bool(keys & mine)) for n, at, bad, keys in rows]
        return event_hold(sample, since, node, now, ctx.settings.fleet)

    def fleet_events(self) -> Iterable[FleetEvent]:
        return [e for live in self.live.values() for e in live.values()]

    def restore(self, ctx: Context, state: JudgeState) -> None:
        """The live events with their series (one stored without a series: on every series of its probe, as
        before), and each node's flagged series from its latest regular mark (the findings an event held are not
        kept in a mark: a flagged mark is taken as flagged on the series whose event began by then)."""
        for event in state.events:
            if not event.switch and not event.cause:
                self.live.setdefault((event.node_class, event.probe), {})[event.key] = event
                if event.key:
                    self.scopes.setdefault(event.key, event.scope)
        for mark in state.marks:
            cls = ctx.node_class(mark.node)
            sample = ctx.samples.get((cls, mark.probe), {}).get(mark.node)
            if not mark.regular or sample is None or sample[0] != mark.at:
                continue
            keys = {self._series(f.key) for f in mark.findings}
            if mark.raw_flagged:
                keys |= {k for k, e in self.live.get((cls, mark.probe), {}).items() if k and e.started_at <= mark.at}
                if not keys:
                    continue
            self.flags[(cls, mark.probe)][mark.node] = (mark.at, frozenset(keys))
