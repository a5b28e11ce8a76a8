"""Throttling that matters, as a source of the judge (pure): a power brake or a hardware slowdown held on a
busy GPU.

The passive source already makes every power-brake, thermal and hardware-slowdown clock reason a hint (a
``pass`` naming it, never a drain). This source reads the same poll with each GPU's activity
(``PassivePoll.busy``, ``healthd.passive.activity``) and follows, per GPU and code (``throttle_power_brake``,
``throttle_hw_slowdown``), the stretch of polls in which the reason held while the GPU was busy. A stretch of
``[judge.passive] throttle_sustain_s`` (default 300 s) or more is a ``degraded`` finding on that GPU, under
the pseudo-probe ``throttle`` (recommended: ``[remediation] act_on`` acts on ``degraded`` by default): a GPU
braked under load runs its jobs slow, and it explains a low GEMM there.

- the reason gone, or the GPU idle, in a poll that covers the node ends the stretch (an idle GPU's brake
  stays the passive source's hint); a gap between polls longer than ``throttle_sustain_s`` starts it again;
- a poll whose throttle or activity query failed changes nothing (unknown, not healthy);
- a software power cap, the idle reason, sync boost and the clock settings are never a throttle signal.

``observe`` answers ``False``: the poll is the passive source's too.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass, replace

from healthd.judge.model import CONFIRMED, JudgeOutput, JudgeState, RecommendationCandidate
from healthd.judge.sources.seam import BaseSource, Context
from healthd.model import Outcome, Verdict
from healthd.passive.model import PassivePoll

__all__ = ["CODES", "PROBE", "Stretch", "Throttle"]

PROBE = "throttle"
CODES = frozenset({"throttle_power_brake", "throttle_hw_slowdown"})


@dataclass(frozen=True, slots=True)
class Stretch:
    """Polls in a row in which ``code`` held on one busy GPU."""

    node: str
    code: str
    gpu: str | None
    gpu_uuid: str | None
    first_at: float
    last_at: float
    detail: str
    activity: str

    @property
    def key(self) -> tuple[str, str, str]:
        return self.node, self.gpu_uuid or self.gpu or "", self.code

    @property
    def held_s(self) -> float:
        return self.last_at - self.first_at

    @property
    def where(self) -> str:
        return f"gpu {self.gpu if self.gpu is not None else '?'}" + (f" ({self.gpu_uuid})" if self.gpu_uuid else "")


class Throttle(BaseSource):
    """The stretches followed, (node, GPU, code) → stretch, and their verdicts under ``PROBE``."""

    name = "throttle"
    by_node_probes = frozenset({PROBE})

    def __init__(self) -> None:
        self.stretches: dict[tuple[str, str, str], Stretch] = {}

    def observe(self, ctx: Context, document: object, now: float, out: JudgeOutput) -> bool:
        if not isinstance(document, PassivePoll) or document.busy is None or not document.up \
                or "throttle" in document.failed:
            return False
        poll = document
        busy = poll.busy
        assert busy is not None
        sustain = ctx.settings.passive.throttle_sustain_s
        known = set(ctx.classes)
        touched: set[str] = set()
        held: set[tuple[str, str, str]] = set()
        for sig in poll.signals:
            if sig.code not in CODES or (known and sig.node not in known):
                continue
            gpu_key = sig.gpu_uuid or sig.gpu or ""
            is_busy, words = busy.get((sig.node, gpu_key), (False, ""))
            if not is_busy:
                continue
            key = (sig.node, gpu_key, sig.code)
            held.add(key)
            old = self.stretches.get(key)
            if old is None or sig.at - old.last_at > sustain:
                self.stretches[key] = Stretch(sig.node, sig.code, sig.gpu, sig.gpu_uuid, sig.at, sig.at, sig.detail,
                                              words)
            elif sig.at > old.last_at:
                new = replace(old, last_at=sig.at, detail=sig.detail, activity=words)
                self.stretches[key] = new
                if (old.held_s >= sustain) != (new.held_s >= sustain):
                    touched.add(sig.node)
        for key, s in list(self.stretches.items()):
            if key not in held and s.node in poll.covered:
                del self.stretches[key]
                touched.add(s.node)
        for node in sorted(touched):
            self._conclude(ctx, node, now, out)
        return False

    def findings(self, sustain_s: float) -> list[Stretch]:
        """The stretches held long enough to be findings."""
        return sorted((s for s in self.stretches.values() if s.held_s >= sustain_s), key=lambda s: s.key)

    def _conclude(self, ctx: Context, node: str, now: float, out: JudgeOutput) -> None:
        sustain = ctx.settings.passive.throttle_sustain_s
        mine = [s for s in self.findings(sustain) if s.node == node]
        old = ctx.verdicts.get((node, PROBE))
        if not mine and old is None:
            return
        if mine:
            top = max(mine, key=lambda s: (s.code == "throttle_power_brake", s.held_s))
            more = f" (and {len(mine) - 1} more)" if len(mine) > 1 else ""
            what = "power brake" if top.code == "throttle_power_brake" else "hardware slowdown"
            text = (f"{what} held {top.held_s:.0f} s on {top.where} while busy ({top.activity}), since "
                    f"{_clock(top.first_at)}: {top.detail}{more}")
            verdict = Verdict(node, PROBE, Outcome.DEGRADED, text, top.code, (), evidence(top), top.last_at)
        else:
            verdict = Verdict(node, PROBE, Outcome.PASS, "no throttling held on a busy GPU", "ok", (), {}, now)
        out.evaluated.add((node, PROBE))
        ctx.set_verdict(verdict, out)
        if mine:
            out.recommendations.append(RecommendationCandidate(
                node, PROBE, verdict.outcome, verdict.reason_code, verdict.reason,
                {"run_ids": [], "summary": f"{verdict.reason_code.replace('_', ' ')} {mine[0].where}",
                 **verdict.evidence}, verdict.at))

    def restore(self, ctx: Context, state: JudgeState) -> None:
        for verdict in state.verdicts:
            if verdict.probe == PROBE and verdict.evidence:
                s = restore(verdict.node, verdict.reason_code, verdict.evidence)
                if s is not None:
                    self.stretches[s.key] = s


def evidence(s: Stretch) -> dict[str, float | str]:
    out: dict[str, float | str] = {"source": PROBE, "stage": CONFIRMED, "first_at": s.first_at, "last_at": s.last_at,
                                   "held_s": s.held_s, "detail": s.detail[:300], "activity": s.activity}
    if s.gpu is not None:
        out["gpu"] = s.gpu
    if s.gpu_uuid:
        out["gpu_uuid"] = s.gpu_uuid
    return out


def restore(node: str, code: str, ev: Mapping[str, float | str]) -> Stretch | None:
    try:
        return Stretch(node, code, str(ev["gpu"]) if "gpu" in ev else None,
                       str(ev["gpu_uuid"]) if "gpu_uuid" in ev else None, float(ev["first_at"]),
                       float(ev["last_at"]), str(ev.get("detail", code)), str(ev.get("activity", "")))
    except (KeyError, ValueError, TypeError):
        return None


def _clock(at: float) -> str:
    return dt.datetime.fromtimestamp(at, dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")

