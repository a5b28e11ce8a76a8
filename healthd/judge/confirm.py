"""Confirmation and fault localisation (pure).

*N of M*: a node's finding counts only when ``n`` of its last ``m`` judged results of the probe
carry one (errors and skips are not results). One bad run is a reason to re-probe, not to drain.

*Localisation*: a multi-node result names a group, not a node. Each bad group result is
explained by its *candidates*, the suspects of the run (every member of a regular run; the
re-probed nodes of a re-probe) that have not passed a multi-node run since. A node that is the
only candidate of some bad result is *blamed*; bad results that a blamed node explains need no
other culprit; the rest are *unresolved* and their candidates are re-probed with known-good
partners (two at a time), or bisected (larger groups: each half with known-good partners).
A blamed node is confirmed once it is a candidate in ``n`` of its last ``m`` group results.
So an innocent partner of a bad node is cleared by its next good pairing and never blamed.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from healthd.judge.model import GroupRecord, Mark, SeriesKey, Severity


def count_flagged(marks: Sequence[Mark], m: int, severity: Severity) -> tuple[int, int]:
    """(results at or above ``severity``, results considered) among the last ``m`` marks."""
    last = list(marks)[-m:]
    return sum(1 for mk in last if mk.severity >= severity), len(last)


def repeated(marks: Sequence[Mark], m: int, severity: Severity) -> tuple[int, int, dict[SeriesKey, int]]:
    """(results among the last ``m`` marks with a finding at or above ``severity`` on the same series,
    results considered, series → its flagged results). A retest confirms a finding only when it
    repeats it: a run flagged on one GPU and its retest on another are two chance values, not one fault."""
    last = list(marks)[-m:]
    counts: dict[SeriesKey, int] = {}
    for mk in last:
        if mk.severity < severity:
            continue
        keys = {f.key for f in mk.findings if f.severity >= severity} or {_ANY}
        for key in keys:
            counts[key] = counts.get(key, 0) + 1
    return max(counts.values(), default=0), len(last), counts


_ANY = SeriesKey("", "", ())
"""The series of a flagged mark saved without its findings."""


def mean_confirmed(marks: Sequence[Mark], k: float, *, fraction: float = 0.0, severity: Severity = Severity.DEGRADED,
                   min_retests: int = 2) -> dict[SeriesKey, float]:
    """Series a retest mean confirms. The first mark with a finding at or above ``severity`` is the
    trigger; the marks after it are its retests. A series the trigger flagged is confirmed when its
    retests' shortfalls (noise units below the node's own baseline), ``n >= min_retests`` of them, average
    more than ``k / sqrt(n)`` and most of them are at least ``fraction`` of the baseline low (what counts
    as a fault at all): a node that is really worse is worse on average, even when one retest passes by
    chance. The trigger itself is left out (it was selected for being low), and no retest counts for
    more than ``k`` units (one far-off run is as likely an outlier as a fault: it never decides alone).
    Series → the mean x sqrt(n).

    >>> from healthd.judge.model import Finding, ReasonCode
    >>> key = SeriesKey("nccl", "busbw", ())
    >>> f = Finding(ReasonCode.BASELINE_DRIFT, Severity.DEGRADED, key, 0.8, 1.0, 0.83, "low")
    >>> mk = lambda s, fs=(): Mark("r", "a", "nccl", 0.0, s, ReasonCode.OK, "", True, findings=fs,
    ...                            shortfalls=((key, 4.0, 0.2),))
    >>> mean_confirmed([mk(Severity.DEGRADED, (f,)), mk(Severity.NONE), mk(Severity.DEGRADED, (f,))], 5.0)
    {SeriesKey(probe='nccl', name='busbw', labels=()): 5.66}
    >>> mean_confirmed([mk(Severity.DEGRADED, (f,)), mk(Severity.NONE), mk(Severity.NONE)], 5.0, fraction=0.25)
    {}
    """
    last = list(marks)
    first = next((i for i, mk in enumerate(last) if mk.severity >= severity), None)
    if first is None:
        return {}
    out: dict[SeriesKey, float] = {}
    for key in dict.fromkeys(f.key for f in last[first].findings if f.severity >= severity):
        values = [(z, rel) for mk in last[first + 1:] for k2, z, rel in mk.shortfalls if k2 == key]
        if len(values) >= min_retests:
            z = sum(min(v, k) for v, _ in values) / len(values) * math.sqrt(len(values))
            if z >= k and 2 * sum(rel >= fraction for _, rel in values) > len(values):
                out[key] = round(z, 2)
    return out


def confirmed(marks: Sequence[Mark], *, n: int, m: int, severity: Severity) -> bool:
    """True when ``n`` of the last ``m`` marks are at or above ``severity``.

    >>> from healthd.judge.model import ReasonCode
    >>> mk = lambda s: Mark("r", "a", "gemm", 0.0, s, ReasonCode.OK, "", True)
    >>> confirmed([mk(Severity.FAIL), mk(Severity.NONE), mk(Severity.FAIL)], n=2, m=3, severity=Severity.FAIL)
    True
    >>> confirmed([mk(Severity.FAIL), mk(Severity.NONE), mk(Severity.NONE)], n=2, m=3, severity=Severity.FAIL)
    False
    """
    flagged, _ = count_flagged(marks, m, severity)
    return flagged >= n


def candidates(record: GroupRecord, last_pass: Mapping[str, float]) -> tuple[str, ...]:
    """Suspects of a bad group result that have not passed a group result since (at or after it)."""
    return tuple(s for s in record.suspects if last_pass.get(s, float("-inf")) < record.at)


@dataclass
class Attribution:
    blamed: dict[str, list[GroupRecord]] = field(default_factory=dict)
    """Node → the bad results it is a candidate of (it is the only candidate of at least one)."""
    unresolved: list[tuple[GroupRecord, tuple[str, ...]]] = field(default_factory=list)
    """Bad results no blamed node explains, with their candidates (two or more)."""
    cleared: list[GroupRecord] = field(default_factory=list)
    """Bad results every suspect of which has passed since: a path or a transient, no node."""

    def suspects(self) -> dict[str, list[GroupRecord]]:
        out: dict[str, list[GroupRecord]] = {}
        for record, cands in self.unresolved:
            for c in cands:
                out.setdefault(c, []).append(record)
        return out


def attribute(flagged: Iterable[GroupRecord], last_pass: Mapping[str, float]) -> Attribution:
    """Localise bad group results (see the module docstring). Deterministic for a given input."""
    result = Attribution()
    with_cands = [(r, candidates(r, last_pass)) for r in sorted(flagged, key=lambda r: (r.at, r.run_id))]
    for _, cands in with_cands:
        if len(cands) == 1:
            result.blamed.setdefault(cands[0], [])
    for record, cands in with_cands:
        if not cands:
            result.cleared.append(record)
            continue
        hit = [c for c in cands if c in result.blamed]
        for c in hit:
            result.blamed[c].append(record)
        if not hit:
            result.unresolved.append((record, cands))
    return result


def blame_confirmed(node: str, history: Sequence[GroupRecord], last_pass: Mapping[str, float], *, n: int,
                    m: int) -> tuple[int, int]:
    """(bad results among the node's last ``m`` group results in which it is a candidate, results)."""
    last = list(history)[-m:]
    count = sum(1 for r in last if r.flagged and node in candidates(r, last_pass))
    return count, len(last)


def split(nodes: Sequence[str]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Bisect a suspect set: the first half (rounded up) and the rest, in sorted order."""
    ordered = sorted(nodes)
    half = (len(ordered) + 1) // 2
    return tuple(ordered[:half]), tuple(ordered[half:])


def pick_partners(suspect: str, pool: Iterable[str], k: int) -> tuple[str, ...]:
    """``k`` partners from ``pool``: consecutive names of the sorted pool from a place that depends on the
    suspect (spreads the load). A ``tuple`` pool is taken as sorted and unique already (a plan tick
    builds each pool once): the cost is then ``k``, not the pool's size."""
    ordered = pool if isinstance(pool, tuple) else tuple(sorted(set(pool)))
    if not ordered:
        return ()
    start = int.from_bytes(hashlib.blake2b(suspect.encode(), digest_size=8).digest(), "big") % len(ordered)
    out: list[str] = []
    for i in range(len(ordered)):
        name = ordered[(start + i) % len(ordered)]
        if len(out) >= k:
            break
        if name != suspect:
            out.append(name)
    return tuple(out)


def max_severity(records: Iterable[GroupRecord]) -> Severity:
    return max((r.severity for r in records), default=Severity.NONE)
