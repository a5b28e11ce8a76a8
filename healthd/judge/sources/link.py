"""The path between two nodes as a cause: a pair bad together while both ends pass with other partners is
a link finding (``healthd.judge.links``), drained nowhere; the pair's bad results need no node localised.

Ranked after the switches (``RANK_LINK``): a live link finding ends when a switch finding holds one of its
ends (the switch explains it).
"""

from __future__ import annotations

from healthd.judge.links import LinkTracker
from healthd.judge.model import GroupRecord, JudgeOutput, JudgeState, LinkFinding, Request
from healthd.judge.sources.seam import RANK_LINK, RANK_SPINE, BaseCause, Context


class Links(BaseCause):
    """Pairs measured together and the live link findings (``links.LinkTracker``)."""

    name = "link"
    rank = RANK_LINK
    label = "link findings"

    def __init__(self) -> None:
        self.tracker = LinkTracker()

    def note_group(self, record: GroupRecord) -> None:
        self.tracker.note(record)

    def claims_group(self, ctx: Context, record: GroupRecord, cutoff: float) -> bool:
        probe = record.probe
        return self.tracker.explains(record, ctx.last_group_pass.get(probe, {}), cutoff, ctx.set_aside,
                                     lambda n: ctx.group_history.get((n, probe), ()),
                                     lambda n: ctx.own_finding(n, probe, cutoff))

    def localise(self, ctx: Context, probe: str, now: float, out: JudgeOutput) -> None:
        """Link findings of ``probe``: started, changed or ended; a pair whose ends both pass with other
        partners is measured together (a re-probe of the two nodes alone)."""
        c = ctx.settings.confirm

        def ended_by(pair: tuple[str, str]) -> str | None:
            held = next((h for h in (ctx.holding(n, probe, ranks=range(RANK_SPINE, self.rank)) for n in pair)
                         if h is not None), None)
            return f"switch {held.switch} explains it" if held is not None else None

        changes, wanted = self.tracker.update(
            probe, now, cutoff=now - c.window_s, recheck_s=c.recheck_interval_s,
            need=lambda pair: ctx.retests(ctx.node_class(pair[0]), probe, group=True)[0],
            last_pass=ctx.last_group_pass.get(probe, {}), skip=ctx.set_aside, ended_by=ended_by,
            history=lambda n: ctx.group_history.get((n, probe), ()),
            own=lambda n: ctx.own_finding(n, probe, now - c.window_s))
        out.link_findings.extend(changes)
        for pair in wanted:
            ctx.ask(Request("reprobe", probe, pair, now, f"measure the link {pair[0]} <-> {pair[1]} again: both "
                            "ends pass with other partners"), out)

    def active(self) -> list[LinkFinding]:
        """The live link findings (``healthd_link_finding``, the API)."""
        return sorted(self.tracker.active.values(), key=lambda f: (f.probe, f.a, f.b))

    def restore(self, ctx: Context, state: JudgeState) -> None:
        self.tracker.restore(state.links)
