"""Findings of passive signals (the site's dcgm-exporter series, polled by ``healthd.passive``): pure.

A signal firing on a node (and GPU) opens a *track* that follows it through the passive window
(``[judge.passive] window_s``):

- a hard signal (``Strength.FAULT``: a fault-class XID, a row-remap failure, a double-bit ECC error, a
  health status of fail) is a ``fail`` finding waiting for confirmation: the judge asks for a re-probe
  of the node at once. It is **confirmed** by the signal repeating (another event, or a level still
  holding at a later poll) or by a probe of the node failing after it; it becomes **suspect** when a
  probe passes after it and it has not repeated, and a suspect track ends with the window. A confirmed
  one ends only once the window has passed without the signal AND a probe passed since it was last seen.
- a soft signal (``Strength.HINT``: throttling, a pending remap, rising replay or CRC counters, a health
  warning, an XID of no known class) never drains: it annotates the node's passive verdict (a ``pass``
  naming the hint) and asks once for a probe of the node. A level hint ends when a poll that covers
  the node no longer shows it.
- an application's error (``Strength.IGNORED``: XID 13, 31, 43, 45) opens nothing.

The verdict of the node's passive evidence is the verdict of the pseudo-probe ``passive``; its reason
code is the signal's own (``xid_79``, ``row_remap_failure``, ...). A signal on a large share of a class
at once is a fleet event (the judge applies the fleet rule to ``samples``): one finding, no drains.
"""

from __future__ import annotations

import datetime as dt
import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Literal

from healthd.judge.model import (
    JudgeOutput,
    JudgeState,
    ReasonCode,
    RecommendationCandidate,
    Request,
    RunInput,
    Severity,
)
from healthd.judge.sources.seam import BaseSource, Context
from healthd.model import Outcome, Verdict
from healthd.passive.model import PassivePoll, PassiveSignal, SignalName, Strength

__all__ = ["PROBE", "Conclusion", "Passive", "Strength", "Track", "conclude", "evidence", "expire", "observe", "probed",
           "restore"]

PROBE = "passive"
"""The pseudo-probe of passive verdicts, findings and recommendations."""

Stage = Literal["confirmed", "awaiting confirmation", "suspect", "hint"]
CONFIRMED_STAGE: Stage = "confirmed"
PENDING: Stage = "awaiting confirmation"
SUSPECT: Stage = "suspect"
HINT: Stage = "hint"


@dataclass(frozen=True, slots=True)
class Track:
    """One signal (code) on one node and GPU, followed through the passive window."""

    node: str
    code: str
    signal: SignalName
    strength: Strength
    kind: Literal["event", "level"]
    detail: str
    first_at: float
    last_at: float
    seen: int = 1
    """Events counted, or polls in which the level held."""
    gpu: str | None = None
    gpu_uuid: str | None = None
    failed_run: str = ""
    """A probe run of the node that failed after the track began (confirms it)."""
    clean_run: str = ""
    clean_at: float = -math.inf
    """The latest probe run of the node that passed after the track began."""
    confirmed_at: float | None = None

    @property
    def key(self) -> tuple[str, str, str]:
        return self.node, self.code, self.gpu_uuid or self.gpu or ""

    @property
    def where(self) -> str:
        if self.gpu is None and not self.gpu_uuid:
            return ""
        return f"gpu {self.gpu if self.gpu is not None else '?'}" + (f" ({self.gpu_uuid})" if self.gpu_uuid else "")

    @property
    def summary(self) -> str:
        """``xid 79 gpu 3 (GPU-…)``: the drain reason's words."""
        name = self.code.replace("_", " ")
        return f"{name} {self.where}".strip()

    def stage(self) -> Stage:
        if self.strength is not Strength.FAULT:
            return HINT
        if self.confirmed_at is not None:
            return CONFIRMED_STAGE
        if self.clean_run:
            return SUSPECT
        return PENDING


def track_key(sig: PassiveSignal) -> tuple[str, str, str]:
    return sig.node, sig.code, sig.gpu_uuid or sig.gpu or ""


def observe(tracks: Mapping[tuple[str, str, str], Track], poll: PassivePoll, window_s: float
            ) -> tuple[dict[tuple[str, str, str], Track], set[str]]:
    """The tracks after ``poll`` and the nodes whose tracks changed. A repeat (another event, a level
    at a later poll) of a fault confirms it; a level hint a covering poll no longer shows ends, unless
    its query failed in that poll."""
    out = dict(tracks)
    changed: set[str] = set()
    firing: set[tuple[str, str, str]] = set()
    for sig in poll.signals:
        if sig.strength is Strength.IGNORED:
            continue
        key = track_key(sig)
        firing.add(key)
        old = out.get(key)
        if old is None or _ended(old, sig.at, window_s):
            out[key] = Track(sig.node, sig.code, sig.signal, sig.strength, sig.kind, sig.detail, sig.at, sig.at,
                             gpu=sig.gpu, gpu_uuid=sig.gpu_uuid)
            changed.add(sig.node)
            continue
        if sig.at <= old.last_at:
            continue
        seen = old.seen + 1
        confirmed = old.confirmed_at
        if confirmed is None and old.strength is Strength.FAULT and seen >= 2:
            confirmed = sig.at
        new = replace(old, last_at=sig.at, seen=seen, detail=sig.detail or old.detail, confirmed_at=confirmed,
                      strength=max(old.strength, sig.strength, key=_rank))
        if new.stage() != old.stage() or new.detail != old.detail:
            changed.add(sig.node)
        out[key] = new
    failed = set(poll.failed)
    for key, t in list(out.items()):
        if (t.kind == "level" and t.strength is Strength.HINT and key not in firing and t.node in poll.covered
                and t.signal not in failed and poll.up):
            del out[key]
            changed.add(t.node)
    return out, changed


def _rank(s: Strength) -> int:
    return {Strength.IGNORED: 0, Strength.HINT: 1, Strength.FAULT: 2}[s]


def _ended(t: Track, now: float, window_s: float) -> bool:
    """Over: an unconfirmed track (or a hint) not seen for the window; a confirmed one not seen for the
    window and with a passing probe since it was last seen."""
    if now - t.last_at <= window_s:
        return False
    return t.confirmed_at is None or t.clean_at > t.last_at


def expire(tracks: Mapping[tuple[str, str, str], Track], now: float, window_s: float
           ) -> tuple[dict[tuple[str, str, str], Track], set[str]]:
    out = {k: t for k, t in tracks.items() if not _ended(t, now, window_s)}
    return out, {t.node for k, t in tracks.items() if k not in out}


def probed(tracks: Iterable[Track], run_id: str, at: float, *, failed: bool, clean: bool) -> list[Track]:
    """A judged probe run at ``at`` of the node of ``tracks``: a failure confirms its fault tracks begun
    before it; a pass makes them suspect (unless they repeat) and is what a confirmed track needs to end.
    The tracks that changed."""
    out: list[Track] = []
    for t in tracks:
        if t.first_at > at:
            continue
        if failed and t.strength is Strength.FAULT and t.confirmed_at is None:
            out.append(replace(t, failed_run=run_id, confirmed_at=at))
        elif clean and at > t.clean_at:
            out.append(replace(t, clean_run=run_id, clean_at=at))
    return out


@dataclass(frozen=True, slots=True)
class Conclusion:
    """The node's passive verdict as the judge states it."""

    outcome: Outcome
    code: str
    text: str
    stage: Stage | None
    top: Track | None
    recommend: bool
    reprobe: bool
    """Ask for a probe of the node now (a fault awaiting confirmation, or a new hint)."""


NO_SIGNAL = "no passive signal in the window"


def conclude(node_tracks: Iterable[Track], window_s: float, *, in_event: str | None = None) -> Conclusion:
    """The node's verdict from its live tracks (``in_event``: the text of a fleet event of its class
    that explains its faults: a ``degraded`` ``fleet_event`` verdict, no recommendation)."""
    live = sorted(node_tracks, key=lambda t: (_order(t), t.last_at), reverse=True)
    if not live:
        return Conclusion(Outcome.PASS, "ok", NO_SIGNAL, None, None, False, False)
    top = live[0]
    more = len(live) - 1
    also = f" (and {more} more signal{'s' if more > 1 else ''})" if more else ""
    stage = top.stage()
    if stage == HINT:
        return Conclusion(Outcome.PASS, top.code, f"passive hint: {top.detail}{also}; a probe of the node is asked "
                          "for (hints never drain)", HINT, top, False, True)
    if in_event is not None:
        return Conclusion(Outcome.DEGRADED, "fleet_event", f"{in_event}: {top.detail}{also}", stage, top, False,
                          False)
    if stage == CONFIRMED_STAGE:
        how = (f"a probe of the node failed after it ({top.failed_run})" if top.failed_run
               else f"the signal repeated ({top.seen} times, the last at {_clock(top.last_at)})")
        return Conclusion(Outcome.FAIL, top.code, f"{top.detail}{also}; confirmed: {how}", CONFIRMED_STAGE, top, True,
                          False)
    if stage == SUSPECT:
        return Conclusion(Outcome.DEGRADED, top.code,
                          f"{top.detail}{also}; suspect: a probe passed after it ({top.clean_run}) and it has not "
                          f"repeated; ends at {_clock(top.last_at + window_s)} unless it repeats", SUSPECT, top,
                          False, False)
    return Conclusion(Outcome.DEGRADED, top.code, f"{top.detail}{also}; awaiting confirmation: a re-probe of the "
                      "node is asked for", PENDING, top, False, True)


def _order(t: Track) -> int:
    return {CONFIRMED_STAGE: 4, PENDING: 3, SUSPECT: 2, HINT: 1}[t.stage()]


def _clock(at: float) -> str:
    return dt.datetime.fromtimestamp(at, dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def evidence(c: Conclusion) -> dict[str, float | str]:
    """The verdict's flat evidence: enough to rebuild the track after a restart (``restore``)."""
    t = c.top
    if t is None:
        return {}
    out: dict[str, float | str] = {
        "source": PROBE, "signal": t.signal, "strength": t.strength.value, "kind": t.kind, "summary": t.summary,
        "first_at": t.first_at, "last_at": t.last_at, "seen": float(t.seen), "detail": t.detail[:300],
    }
    if c.stage is not None:
        out["stage"] = c.stage
    if t.gpu is not None:
        out["gpu"] = t.gpu
    if t.gpu_uuid:
        out["gpu_uuid"] = t.gpu_uuid
    if t.failed_run:
        out["failed_run"] = t.failed_run
    if t.clean_run:
        out["clean_run"] = t.clean_run
        out["clean_at"] = t.clean_at
    if t.confirmed_at is not None:
        out["confirmed_at"] = t.confirmed_at
    return out


def restore(node: str, code: str, ev: Mapping[str, float | str]) -> Track | None:
    """The top track a stored passive verdict's evidence describes (``None``: not a passive track)."""
    try:
        signal = str(ev["signal"])
        strength = Strength(str(ev["strength"]))
        kind = str(ev.get("kind", "event"))
        confirmed = ev.get("confirmed_at")
        return Track(node, code, signal, strength, "level" if kind == "level" else "event",  # type: ignore[arg-type]
                     str(ev.get("detail", code)), float(ev["first_at"]), float(ev["last_at"]),
                     int(float(ev.get("seen", 1))), str(ev["gpu"]) if "gpu" in ev else None,
                     str(ev["gpu_uuid"]) if "gpu_uuid" in ev else None, str(ev.get("failed_run", "")),
                     str(ev.get("clean_run", "")), float(ev.get("clean_at", -math.inf)),
                     float(confirmed) if confirmed is not None else None)
    except (KeyError, ValueError, TypeError):
        return None


class Passive(BaseSource):
    """The passive tracks followed, (node, code, GPU) → track, and their verdicts under ``PROBE``: a poll
    updates them (``observe``), a judged probe run of the node answers them (``after_runs``)."""

    name = "passive"
    by_node_probes = frozenset({PROBE})

    def __init__(self) -> None:
        self.tracks: dict[tuple[str, str, str], Track] = {}

    def signals(self) -> list[Track]:
        """The tracks followed now (``healthd_node_passive_signal``, the API, ``healthd status``)."""
        return sorted(self.tracks.values(), key=lambda t: t.key)

    def observe(self, ctx: Context, document: object, now: float, out: JudgeOutput) -> bool:
        """One poll of the site's Prometheus: new and repeated signals update their tracks, fault-class
        signals ask for a re-probe, a signal on a large share of a class is a fleet event. A poll that is not
        ``up`` changes nothing (could not check is no evidence)."""
        if not isinstance(document, PassivePoll):
            return False
        poll = document
        if not poll.up:
            return True
        known = set(ctx.classes)
        signals = tuple(s for s in poll.signals if not known or s.node in known)
        window = ctx.settings.passive.window_s
        self.tracks, changed = observe(self.tracks, replace(poll, signals=signals), window)
        self.tracks, ended = expire(self.tracks, now, window)
        touched = changed | ended | {n for (n, p) in ctx.verdicts if p == PROBE and n in ended}
        self._samples(ctx, poll, now)
        events = len(out.fleet_events)
        ctx.update_causes({(n, PROBE) for n in poll.covered}, now, out)
        if any(e.probe == PROBE for e in out.fleet_events[events:]):
            touched |= {n for (n, p) in ctx.verdicts if p == PROBE}
            touched |= {t.node for t in self.tracks.values()}
        crowded = self._crowded_hints(ctx, poll)
        by_node = self._by_node()
        for name in sorted(touched):
            self._conclude(ctx, name, by_node.get(name, []), now, out,
                           ask=name in changed and ctx.node_class(name) not in crowded)
        return True

    def _crowded_hints(self, ctx: Context, poll: PassivePoll) -> set[str]:
        """Classes with a hint on ``fleet.event_share`` of their covered nodes or more (a hot machine room,
        a firmware default): a condition of the class, not a reason to probe each of its nodes at once."""
        covered: dict[str, int] = defaultdict(int)
        for node in poll.covered:
            covered[ctx.node_class(node)] += 1
        hinted: dict[str, set[str]] = defaultdict(set)
        for t in self.tracks.values():
            if t.strength is Strength.HINT:
                hinted[ctx.node_class(t.node)].add(t.node)
        share = ctx.settings.fleet.event_share
        return {cls for cls, nodes in hinted.items() if covered.get(cls) and len(nodes) >= share * covered[cls]}

    def _samples(self, ctx: Context, poll: PassivePoll, now: float) -> None:
        """Each covered node's sample for the fleet rule: flagged while a fault track of it is live in the
        event window (at its start), else the poll's time."""
        cutoff = now - ctx.settings.fleet.event_window_s
        faults: dict[str, float] = {}
        for t in self.tracks.values():
            if t.strength is Strength.FAULT and t.last_at >= cutoff:
                faults[t.node] = min(faults.get(t.node, t.first_at), t.first_at)
        for node in poll.covered:
            if node in ctx.classes:
                first = faults.get(node)
                ctx.samples.setdefault((ctx.node_class(node), PROBE), {})[node] = \
                    (first, True) if first is not None else (poll.at, False)

    def after_runs(self, ctx: Context, judged: Sequence[RunInput], now: float, out: JudgeOutput) -> None:
        """Judged probe runs answer the passive tracks of their nodes: a failure confirms, a pass makes
        suspect (``probed``)."""
        touched: set[str] = set()
        by_node = self._by_node()
        for run in judged:
            for n in run.nodes:
                if n not in by_node:
                    continue
                mark = next((mk for mk in reversed(ctx.marks.get((n, run.probe), ())) if mk.run_id == run.run_id),
                            None)
                failed = run.outcome is Outcome.FAIL or (mark is not None and mark.severity is Severity.FAIL)
                clean = not failed and mark is not None and mark.severity is Severity.NONE and \
                    mark.code is ReasonCode.OK
                mine = [self.tracks[t.key] for t in by_node.get(n, ()) if t.key in self.tracks]
                for t in probed(mine, run.run_id, run.at, failed=failed, clean=clean):
                    if t.stage() != self.tracks[t.key].stage():
                        touched.add(n)
                    self.tracks[t.key] = t
        self.tracks, ended = expire(self.tracks, now, ctx.settings.passive.window_s)
        touched |= {n for n in ended if (n, PROBE) in ctx.verdicts}
        by_node = self._by_node()
        for node in sorted(touched):
            self._conclude(ctx, node, by_node.get(node, []), now, out, ask=False)

    def _by_node(self) -> dict[str, list[Track]]:
        by_node: dict[str, list[Track]] = defaultdict(list)
        for t in self.tracks.values():
            by_node[t.node].append(t)
        return by_node

    def _conclude(self, ctx: Context, node: str, tracks: list[Track], now: float, out: JudgeOutput, *,
                  ask: bool) -> None:
        event = ctx.holding(node, PROBE)
        explained = event.text if event is not None and tracks and \
            all(t.first_at >= event.started_at for t in tracks if t.strength is Strength.FAULT) else None
        c = conclude(tracks, ctx.settings.passive.window_s, in_event=explained)
        ev = evidence(c)
        run_ids = (c.top.failed_run,) if c.top is not None and c.top.failed_run else ()
        at = c.top.last_at if c.top is not None else now
        verdict = Verdict(node, PROBE, c.outcome, c.text, c.code, run_ids, ev, at)
        out.evaluated.add((node, PROBE))
        ctx.set_verdict(verdict, out)
        if c.recommend and c.top is not None:
            out.recommendations.append(RecommendationCandidate(
                node, PROBE, c.outcome, c.code, c.text,
                {"run_ids": list(run_ids), "summary": c.top.summary, **ev}, at))
        if (ask or c.stage == PENDING) and c.reprobe:
            ctx.ask(Request("reprobe", PROBE, (node,), now, c.text[:200]), out)

    def restore(self, ctx: Context, state: JudgeState) -> None:
        for verdict in state.verdicts:
            if verdict.probe == PROBE and verdict.evidence:
                track = restore(verdict.node, verdict.reason_code, verdict.evidence)
                if track is not None:
                    self.tracks[track.key] = track
