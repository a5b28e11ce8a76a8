"""Link findings (pure): a slow path between two nodes, told from a slow node by re-pairing each end.

A multi-node result of two nodes A and B that is bad (an nccl pair's bus bandwidth; a pipeline run's
inter-node link figures, ``link_*{scope=group}``, whose findings are on the group and whose suspects are the
two ends of the run's slowest inter-node link) is localised as every group result is
(``confirm.attribute``): each end is re-probed with known-good partners. When one end is slow with other
partners too, it is blamed (``localised``) and drained as before. When **both** ends have passed a
multi-node result with other partners since the pair's first bad result (and neither has a bad one with
another partner lately, nor a finding on its own figures), no node explains it: the pair is measured
together again, and when as many results of the pair in a row as confirm a group result (``need``: the
class's retest count, ``confirm.n`` at least) are bad, it is a **link finding**: the path between them
(cables, ports, the switches between) is at fault. A link finding drains no node (nothing in Slurm to drain
for a cable); it lasts until the pair measures clean (it is re-measured every
``confirm.recheck_interval_s``), and a switch finding or a fleet event that explains the pair's results
takes precedence (their records are not counted here).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace

from healthd.judge.model import Finding, GroupRecord, LinkFinding

Pair = tuple[str, str]
"""The two ends of a link, in name order."""

KEEP = 8
"""The pair's own results kept (newest), within the confirmation window."""

SLOWEST_LINK = "; the slowest link: "

History = Callable[[str], Sequence[GroupRecord]]
"""A node's recent group results of the probe."""

Own = Callable[[str], bool]
"""Whether a node has a finding of its own on the probe among its recent results (a node figure)."""


def pair_of(record: GroupRecord) -> Pair | None:
    """The link a group result measures: its two members, or the two suspects a larger run named (the
    ends of its slowest inter-node link); ``None``: no single link."""
    for nodes in (record.members, record.suspects):
        if len(nodes) == 2 and nodes[0] != nodes[1]:
            a, b = sorted(nodes)
            return a, b
    return None


def _figure(findings: Iterable[Finding]) -> Finding | None:
    """The worst finding of a bad pair result (the largest relative shortfall)."""
    def gap(f: Finding) -> float:
        return abs(f.value - f.reference) / abs(f.reference) if f.reference else 0.0

    return max(findings, key=gap, default=None)


def _link_text(detail: str) -> str:
    at = detail.find(SLOWEST_LINK)
    return detail[at + len(SLOWEST_LINK):] if at >= 0 else ""


class LinkTracker:
    """The pairs measured together (per probe) and the live link findings. Fed every group result
    (``note``), asked which bad results a link explains (``explains``) and updated after each evaluation."""

    def __init__(self) -> None:
        self.joint: dict[tuple[str, Pair], list[GroupRecord]] = {}
        self.active: dict[tuple[str, Pair], LinkFinding] = {}

    def note(self, record: GroupRecord) -> None:
        """A group result: kept when it measured one link that had a bad result or a finding (a clean
        result of a pair never bad is nothing to follow: a fleet measures thousands of pairs a day)."""
        pair = pair_of(record)
        if pair is None:
            return
        key = (record.probe, pair)
        if not record.flagged and key not in self.joint and key not in self.active:
            return
        records = self.joint.setdefault(key, [])
        if any(r.run_id == record.run_id for r in records):
            return
        records.append(record)
        records.sort(key=lambda r: (r.at, r.run_id))
        del records[:-KEEP]

    def restore(self, findings: Iterable[LinkFinding]) -> None:
        for f in findings:
            if f.active:
                self.active[(f.probe, (f.a, f.b))] = f

    def _streak(self, key: tuple[str, Pair], cutoff: float, skip: Callable[[GroupRecord], bool]) -> list[GroupRecord]:
        """The pair's bad results since its last clean one, within the window (those ``skip`` sets aside,
        a switch finding's or a fleet event's, are neither)."""
        out: list[GroupRecord] = []
        for r in self.joint.get(key, ()):
            if r.at < cutoff or skip(r):
                continue
            out = [*out, r] if r.flagged else []
        return out

    def _latest(self, key: tuple[str, Pair], cutoff: float, skip: Callable[[GroupRecord], bool]) -> GroupRecord | None:
        return next((r for r in reversed(self.joint.get(key, ())) if r.at >= cutoff and not skip(r)), None)

    @staticmethod
    def _cleared(pair: Pair, streak: list[GroupRecord], last_pass: Mapping[str, float], history: History,
                 skip: Callable[[GroupRecord], bool], own: Own) -> bool:
        """Both ends passed a multi-node result since the pair's first bad one (with other partners: every
        result of the pair since then is bad) and neither has a bad one with any other partner among its
        recent results: an end slow with some partners beyond this one (its uplink: the cross-leaf pairs; a
        node slow with two partners) is not clean, nor one with a finding of its own on the probe (a node
        whose own figures are low passes a pair result now and then by chance)."""
        first = streak[0].at
        for n in pair:
            if last_pass.get(n, float("-inf")) <= first or own(n):
                return False
            if any(r.flagged and pair_of(r) != pair and not skip(r) for r in history(n)):
                return False
        return True

    def explains(self, record: GroupRecord, last_pass: Mapping[str, float], cutoff: float,
                 skip: Callable[[GroupRecord], bool], history: History, own: Own) -> bool:
        """Whether a bad result is the pair's link (both ends clean elsewhere since the pair's first bad
        result): it needs no node localised."""
        pair = pair_of(record)
        if pair is None or not record.flagged:
            return False
        key = (record.probe, pair)
        streak = self._streak(key, cutoff, skip)
        return any(r.run_id == record.run_id for r in streak) and \
            self._cleared(pair, streak, last_pass, history, skip, own)

    def update(self, probe: str, now: float, *, cutoff: float, need: Callable[[Pair], int], recheck_s: float,
               last_pass: Mapping[str, float], skip: Callable[[GroupRecord], bool],
               ended_by: Callable[[Pair], str | None], history: History,
               own: Own) -> tuple[list[LinkFinding], list[Pair]]:
        """Re-judge the pairs of ``probe``: the findings that started, changed or ended, and the pairs to
        measure together now (a cleared pair short of ``need(pair)`` bad results; a live finding not measured for
        ``recheck_s``). ``ended_by``: why a live finding no longer stands (a switch finding now holds an
        end), or ``None``; ``history``: a node's recent group results of ``probe``; ``own``: whether a node has a
        finding of its own on ``probe`` lately."""
        changes: list[LinkFinding] = []
        wanted: list[Pair] = []
        for key in sorted(k for k in set(self.joint) | set(self.active) if k[0] == probe):
            _, pair = key
            live = self.active.get(key)
            if key in self.joint:
                kept = [r for r in self.joint[key] if r.at >= cutoff]
                if any(r.flagged for r in kept) or live is not None:
                    self.joint[key] = kept
                else:
                    del self.joint[key]
            latest = self._latest(key, cutoff, skip)
            streak = self._streak(key, cutoff, skip)
            why = ended_by(pair) if live is not None else None
            if live is not None and (why is not None or (latest is not None and not latest.flagged)):
                reason = why or f"the pair measured clean ({latest.run_id if latest else ''})"
                del self.active[key]
                changes.append(replace(live, ended_at=now, text=f"{live.text}; over: {reason}"))
                continue
            if not streak or not self._cleared(pair, streak, last_pass, history, skip, own):
                if live is not None and now - (latest.at if latest else live.started_at) >= recheck_s:
                    wanted.append(pair)
                continue
            if len(streak) < need(pair) and live is None:
                wanted.append(pair)
                continue
            found = self._finding(probe, pair, streak, live)
            if live is None or (live.run_ids, live.text) != (found.run_ids, found.text):
                self.active[key] = found
                changes.append(found)
            if now - streak[-1].at >= recheck_s:
                wanted.append(pair)
        return changes, wanted

    @staticmethod
    def _finding(probe: str, pair: Pair, streak: list[GroupRecord], live: LinkFinding | None) -> LinkFinding:
        top = _figure(f for r in streak for f in r.findings)
        link = _link_text(top.detail) if top is not None else ""
        series = top.key.describe() if top is not None else ""
        if top is not None:
            figure = top.detail[: len(top.detail) - len(SLOWEST_LINK) - len(link)] if link else top.detail
        else:
            figure = streak[-1].text
        a, b = pair
        text = (f"link {a} <-> {b}: {figure}; bad in {len(streak)} results of the pair in a row while both "
                f"nodes pass with other partners")
        if link:
            text += f"; the slowest link: {link}"
        return LinkFinding(probe, a, b, live.started_at if live is not None else streak[0].at,
                           tuple(r.run_id for r in streak), series, top.code.value if top is not None else "",
                           top.value if top is not None else 0.0, top.reference if top is not None else 0.0,
                           link, text)
