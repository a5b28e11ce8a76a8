"""The first judgement layer: a node's verdict for a probe follows its latest run's outcome.

``skipped`` runs leave the verdict as it was. ``error`` is recorded as such ("could not
check"), never as a failure of the node.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from healthd.model import Outcome, Verdict


@dataclass(frozen=True)
class FinishedRun:
    run_id: str
    probe: str
    nodes: tuple[str, ...]
    outcome: Outcome
    reason: str
    at: float


REASON_CODES = {
    Outcome.PASS: "ok",
    Outcome.DEGRADED: "degraded",
    Outcome.FAIL: "probe_failed",
    Outcome.ERROR: "probe_error",
}


def verdicts_from_runs(runs: Iterable[FinishedRun]) -> list[Verdict]:
    latest: dict[tuple[str, str], FinishedRun] = {}
    for run in runs:
        if run.outcome is Outcome.SKIPPED:
            continue
        for node in run.nodes:
            key = (node, run.probe)
            if key not in latest or latest[key].at <= run.at:
                latest[key] = run
    return [
        Verdict(
            node=node,
            probe=probe,
            outcome=run.outcome,
            reason=run.reason,
            reason_code=REASON_CODES[run.outcome],
            run_ids=(run.run_id,),
            at=run.at,
        )
        for (node, probe), run in sorted(latest.items())
    ]
