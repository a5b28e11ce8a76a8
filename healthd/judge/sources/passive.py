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
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Literal

from healthd.model import Outcome
from healthd.passive.model import PassivePoll, PassiveSignal, SignalName, Strength

__all__ = ["PROBE", "Conclusion", "Strength", "Track", "conclude", "evidence", "expire", "observe", "probed",
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
