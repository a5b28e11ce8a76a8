"""A GPU's PCIe link trained down, as a source of the judge (pure).

Reads ``PassivePoll.pcie`` (``healthd.passive.pcie``: dcgm-exporter's current and maximum link width and
generation) with each GPU's activity (``PassivePoll.busy``). A GPU whose link is narrower than its maximum, or,
while the GPU is busy, of a lower generation, in two polls in a row, is a ``degraded`` finding
``pcie_downtrained`` on that GPU under the pseudo-probe ``pcie`` (recommended: ``[remediation] act_on`` acts on
``degraded`` by default): host-to-device copies and GPUDirect RDMA run at a fraction of their speed. A link
back at its maximum in a poll that reads it ends the finding; a poll whose query failed changes nothing.
The node check at job boundaries reads the same links of the GPUs and of the HCAs from sysfs; each boundary
document is one more reading (``after_runs``): a width below the maximum in two documents in a row is the same
finding (an HCA's named by its device); the generation is not judged there (the GPUs are idle).
``observe`` answers ``False``: the poll is the passive source's too.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from healthd.judge.model import CONFIRMED, JudgeOutput, JudgeState, RecommendationCandidate, RunInput
from healthd.judge.sources.boundary import PROBE as BOUNDARY_PROBE
from healthd.judge.sources.seam import BaseSource, Context
from healthd.model import Outcome, Verdict
from healthd.passive.model import PassivePoll
from healthd.passive.pcie import PcieLink, boundary_links

__all__ = ["CODE", "PROBE", "Pcie"]

PROBE = "pcie"
CODE = "pcie_downtrained"
CONFIRM_POLLS = 2


@dataclass(frozen=True, slots=True)
class Low:
    """A GPU's link below its maximum, polls in a row."""

    link: PcieLink
    first_at: float
    last_at: float
    polls: int
    detail: str


def _shortfall(link: PcieLink, busy: bool) -> str:
    if link.narrow:
        return f"PCIe link x{link.width:g}, below its x{link.max_width:g}"
    if busy and link.slow:
        return f"PCIe gen {link.gen:g} while busy, below its gen {link.max_gen:g}"
    return ""


class Pcie(BaseSource):
    name = "pcie"
    by_node_probes = frozenset({PROBE})

    def __init__(self) -> None:
        self.low: dict[tuple[str, str], Low] = {}

    def observe(self, ctx: Context, document: object, now: float, out: JudgeOutput) -> bool:
        if not isinstance(document, PassivePoll) or document.pcie is None:
            return False
        poll = document
        busy = poll.busy or {}
        known = set(ctx.classes)
        touched: set[str] = set()
        for link in poll.pcie or ():
            if not known or link.node in known:
                touched |= self._reading(link, busy.get(link.key, (False, ""))[0], poll.at)
        for node in sorted(touched):
            self._conclude(ctx, node, now, out)
        return False

    def after_runs(self, ctx: Context, judged: Sequence[RunInput], now: float, out: JudgeOutput) -> None:
        """The PCIe links of the round's boundary documents (GPUs and HCAs, read from sysfs): the GPUs are idle at
        a job boundary, so only a width below the maximum counts."""
        known = set(ctx.classes)
        touched: set[str] = set()
        for run in judged:
            if run.probe != BOUNDARY_PROBE or len(run.nodes) != 1 or (known and run.nodes[0] not in known):
                continue
            node = run.nodes[0]
            uuids = {gpu: uuid for (n, gpu), uuid in run.gpu_uuids.items() if n == node}
            for link in boundary_links(node, ((m.name, m.value, m.labels) for m in run.measurements
                                              if m.node in (None, node)), uuids):
                touched |= self._reading(link, False, run.at)
        for node in sorted(touched):
            self._conclude(ctx, node, now, out)

    def _reading(self, link: PcieLink, busy: bool, at: float) -> set[str]:
        """One reading of one link; its node when what it concludes may change."""
        words = _shortfall(link, busy)
        old = self.low.get(link.key)
        if not words:
            if old is not None:
                del self.low[link.key]
                return {link.node}
            return set()
        new = Low(link, old.first_at if old else at, at, (old.polls if old else 0) + 1, f"{words} on {link.where}")
        self.low[link.key] = new
        if old is None or (old.polls >= CONFIRM_POLLS) != (new.polls >= CONFIRM_POLLS) or old.detail != new.detail:
            return {link.node}
        return set()

    def findings(self) -> list[Low]:
        return sorted((lw for lw in self.low.values() if lw.polls >= CONFIRM_POLLS), key=lambda lw: lw.link.key)

    def _conclude(self, ctx: Context, node: str, now: float, out: JudgeOutput) -> None:
        mine = [lw for lw in self.findings() if lw.link.node == node]
        old = ctx.verdicts.get((node, PROBE))
        if not mine and old is None:
            return
        if mine:
            top = mine[0]
            more = f" (and {len(mine) - 1} more GPU{'s' if len(mine) > 2 else ''})" if len(mine) > 1 else ""
            ev: dict[str, float | str] = {"source": PROBE, "stage": CONFIRMED, "first_at": top.first_at,
                                          "last_at": top.last_at,
                                          "polls": float(top.polls), "detail": top.detail}
            if top.link.gpu is not None:
                ev["gpu"] = top.link.gpu
            if top.link.gpu_uuid:
                ev["gpu_uuid"] = top.link.gpu_uuid
            if top.link.device:
                ev["device"] = top.link.device
            verdict = Verdict(node, PROBE, Outcome.DEGRADED, f"{top.detail}{more}; in {top.polls} polls in a row",
                              CODE, (), ev, top.last_at)
        else:
            verdict = Verdict(node, PROBE, Outcome.PASS, "every PCIe link read at its maximum", "ok", (), {}, now)
        out.evaluated.add((node, PROBE))
        ctx.set_verdict(verdict, out)
        if mine:
            out.recommendations.append(RecommendationCandidate(
                node, PROBE, verdict.outcome, CODE, verdict.reason,
                {"run_ids": [], "summary": f"pcie downtrained {mine[0].detail.split(' on ')[-1]}",
                 **verdict.evidence}, verdict.at))

    def restore(self, ctx: Context, state: JudgeState) -> None:
        for v in state.verdicts:
            if v.probe == PROBE and v.outcome is Outcome.DEGRADED and v.evidence:
                ev = v.evidence
                try:
                    link = PcieLink(v.node, str(ev["gpu"]) if "gpu" in ev else None,
                                    str(ev["gpu_uuid"]) if "gpu_uuid" in ev else None,
                                    device=str(ev["device"]) if "device" in ev else None)
                    self.low[link.key] = Low(link, float(ev["first_at"]), float(ev["last_at"]),
                                             int(float(ev.get("polls", CONFIRM_POLLS))), str(ev.get("detail", "")))
                except (KeyError, ValueError, TypeError):
                    continue
