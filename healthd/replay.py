"""``healthd replay``: re-judge the stored history with another config and show what would change.

Both the config in force and the new one re-judge the same stored runs from scratch, in the order
they finished, in batches like the daemon's collect ticks; the report compares final verdicts,
the recommendations each would have made over the period, and the fleet events each would have
raised. Nothing is written to the store.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

from healthd.config import JudgeSettings, Settings
from healthd.errors import HealthdError
from healthd.judge.engine import Judge
from healthd.judge.model import FleetEvent, RunInput
from healthd.model import Node, Outcome, Verdict
from healthd.store import Store

BATCH_S = 60.0


@dataclass
class Rejudged:
    verdicts: dict[tuple[str, str], Verdict] = field(default_factory=dict)
    recommended: dict[tuple[str, str], tuple[float, str, str]] = field(default_factory=dict)
    """(node, probe) → (first time, reason code, text) of each recommendation made."""
    events: list[FleetEvent] = field(default_factory=list)
    outcomes: dict[str, int] = field(default_factory=dict)
    """Verdict outcomes reached over the period (each change counted once)."""


def rejudge(runs: Sequence[RunInput], nodes: Sequence[Node], settings: JudgeSettings, *, act_on: Sequence[str],
            resets: dict[str, float], batch_s: float = BATCH_S) -> Rejudged:
    """Judge ``runs`` from scratch with ``settings`` (pure apart from the judge's own state)."""
    judge = Judge(settings)
    out = Rejudged()
    batches: dict[int, list[RunInput]] = {}
    for run in runs:
        batches.setdefault(int(run.at // batch_s), []).append(run)
    first = True
    for index in sorted(batches):
        now = (index + 1) * batch_s
        applied = {n: t for n, t in resets.items() if t <= now}
        result = judge.evaluate(batches[index], nodes if first else (), now=now, resets=applied)
        first = False
        for v in result.verdicts:
            out.outcomes[v.outcome.value] = out.outcomes.get(v.outcome.value, 0) + 1
        for c in result.recommendations:
            if c.outcome.value in act_on:
                out.recommended.setdefault((c.node, c.probe), (c.at, str(c.reason_code), c.text))
        out.events += [e for e in result.fleet_events if e.active]
    out.verdicts = dict(judge.verdicts)
    return out


@dataclass
class ReplayReport:
    since: float
    until: float
    runs: int
    old: Rejudged
    new: Rejudged
    old_source: str
    new_source: str

    def changed(self) -> list[tuple[str, str, Verdict | None, Verdict | None]]:
        keys = sorted(set(self.old.verdicts) | set(self.new.verdicts))
        out = []
        for key in keys:
            a, b = self.old.verdicts.get(key), self.new.verdicts.get(key)
            before = (a.outcome, a.reason_code) if a else None
            after = (b.outcome, b.reason_code) if b else None
            if before != after:
                out.append((key[0], key[1], a, b))
        return out


def replay(store: Store, old: Settings, new: Settings, *, since: float, until: float = math.inf,
           old_source: str = "current config", new_source: str = "new config") -> ReplayReport:
    runs = store.judge_history(since=since, until=until)
    if not runs:
        raise HealthdError(f"no finished runs in the store since {_when(since)}")
    nodes = store.nodes()
    resets = store.judge_resets()
    return ReplayReport(
        since=runs[0].at, until=runs[-1].at, runs=len(runs),
        old=rejudge(runs, nodes, old.judge, act_on=old.remediation.act_on, resets=resets),
        new=rejudge(runs, nodes, new.judge, act_on=new.remediation.act_on, resets=resets),
        old_source=old_source, new_source=new_source,
    )


def _when(ts: float) -> str:
    return datetime.fromtimestamp(ts, tz=UTC).strftime("%Y-%m-%d %H:%M UTC") if math.isfinite(ts) else "-"


def format_replay(report: ReplayReport) -> str:
    def count(r: Rejudged, outcome: Outcome) -> int:
        return sum(1 for v in r.verdicts.values() if v.outcome is outcome)

    lines = [f"replayed {report.runs} runs finished {_when(report.since)} .. {_when(report.until)}",
             f"  old: {report.old_source}", f"  new: {report.new_source}", "",
             f"{'':<34}{'old':>8}{'new':>8}"]
    for outcome in (Outcome.FAIL, Outcome.DEGRADED, Outcome.ERROR, Outcome.PASS):
        lines.append(f"{'final verdicts ' + outcome.value:<34}{count(report.old, outcome):>8}"
                     f"{count(report.new, outcome):>8}")
    lines.append(f"{'recommendations over the period':<34}{len(report.old.recommended):>8}"
                 f"{len(report.new.recommended):>8}")
    lines.append(f"{'fleet events raised':<34}{len(report.old.events):>8}{len(report.new.events):>8}")
    changed = report.changed()
    lines += ["", f"final verdicts that differ: {len(changed)}"]
    for node, probe, a, b in changed[:50]:
        old = f"{a.outcome.value}/{a.reason_code}" if a else "-"
        new = f"{b.outcome.value}/{b.reason_code}" if b else "-"
        lines.append(f"  {node:<16} {probe:<6} {old:>26} -> {new:<26} {(b.reason if b else '')[:90]}")
    only_new = sorted(set(report.new.recommended) - set(report.old.recommended))
    only_old = sorted(set(report.old.recommended) - set(report.new.recommended))
    lines += ["", f"recommended only with the new config: {len(only_new)}"]
    for key in only_new[:50]:
        at, code, text = report.new.recommended[key]
        lines.append(f"  {key[0]:<16} {key[1]:<6} {_when(at)}  {code}: {text[:90]}")
    lines += [f"recommended only with the old config: {len(only_old)}"]
    for key in only_old[:50]:
        at, code, text = report.old.recommended[key]
        lines.append(f"  {key[0]:<16} {key[1]:<6} {_when(at)}  {code}: {text[:90]}")
    for label, r in (("old", report.old), ("new", report.new)):
        for e in r.events:
            lines.append(f"fleet event ({label}): {_when(e.started_at)} {e.text}")
    return "\n".join(lines)


def to_dict(report: ReplayReport) -> dict[str, object]:
    def side(r: Rejudged) -> dict[str, object]:
        return {
            "verdicts": [{"node": k[0], "probe": k[1], "outcome": v.outcome.value, "reason_code": v.reason_code,
                          "reason": v.reason} for k, v in sorted(r.verdicts.items())],
            "recommended": [{"node": k[0], "probe": k[1], "at": at, "reason_code": code, "text": text}
                            for k, (at, code, text) in sorted(r.recommended.items())],
            "fleet_events": [{"node_class": e.node_class, "probe": e.probe, "started_at": e.started_at,
                              "text": e.text} for e in r.events],
        }

    return {"runs": report.runs, "since": report.since, "until": report.until, "old": side(report.old),
            "new": side(report.new),
            "changed": [{"node": n, "probe": p, "old": a.outcome.value if a else None,
                         "new": b.outcome.value if b else None} for n, p, a, b in report.changed()]}
