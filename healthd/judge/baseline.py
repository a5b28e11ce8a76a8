"""Layer 2: the node's own baseline (pure).

The baseline of a series is the median of the node's recent *passing* results (flagged results
never enter it, so a fault does not become the new normal), with a robust spread
(1.4826 x MAD, a standard deviation for normal noise). A result worse than the baseline by
``drift_fraction`` (or by ``spread_k`` spreads, when the series is that noisy, taken on the log
scale) is ``degraded``.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from healthd.judge.model import Direction, Finding, ReasonCode, SeriesKey, Severity
from healthd.units import human

MAD_TO_SD = 1.4826
"""Scales a median absolute deviation to a standard deviation for normally distributed noise."""


@dataclass(frozen=True)
class Baseline:
    median: float
    spread: float
    """Robust standard deviation: 1.4826 x the median absolute deviation."""
    n: int


def robust_stats(values: Sequence[float]) -> tuple[float, float]:
    """(median, 1.4826 x MAD) of ``values`` (at least one)."""
    median = statistics.median(values)
    mad = statistics.median(abs(v - median) for v in values)
    return median, MAD_TO_SD * mad


def baseline_of(values: Sequence[float], *, min_samples: int) -> Baseline | None:
    """The baseline of a node's accepted values, or ``None`` with fewer than ``min_samples``.

    >>> baseline_of([100.0, 102.0, 98.0, 101.0], min_samples=3)
    Baseline(median=100.5, spread=1.4826, n=4)
    """
    if len(values) < max(1, min_samples):
        return None
    median, spread = robust_stats(values)
    return Baseline(median, spread, len(values))


def drift(
    key: SeriesKey, value: float, baseline: Baseline, direction: Direction, *, fraction: float, spread_k: float,
    noise_allowed: float = 0.0,
) -> Finding | None:
    """A ``degraded`` finding when ``value`` is worse than the baseline by more than allowed.

    Allowed deviation: ``fraction x |median|``, or the noise's allowance if wider: ``noise_allowed``
    (k x the series' relative noise, ``healthd.judge.noise``) or ``spread_k`` x the baseline's relative
    spread, the larger, as a distance on the log scale (``r`` allows a value down to ``median x e^-r``, or
    up to ``median x e^r`` for a ``lower`` measurement; for a quiet series ``r x |median|`` to within a few
    percent): noise is a share of the value, and a node whose history spreads 30% is still flagged at a
    tenth of its baseline.
    """
    relative = max(noise_allowed, spread_k * baseline.spread / abs(baseline.median) if baseline.median else 0.0)
    noise = -math.expm1(-relative) if direction == "higher" else math.expm1(relative)
    allowed = max(fraction, noise) * abs(baseline.median)
    if direction == "higher":
        threshold = baseline.median - allowed
        worse = value < threshold
    else:
        threshold = baseline.median + allowed
        worse = value > threshold
    if not worse or baseline.median == 0:
        return None
    pct = abs(value - baseline.median) / abs(baseline.median) * 100
    word = "below" if direction == "higher" else "above"
    detail = (f"{key.describe()} {human(key.name, value)} is {pct:.1f}% {word} this node's baseline "
              f"{human(key.name, baseline.median)} (median of {baseline.n} passing runs)")
    return Finding(ReasonCode.BASELINE_DRIFT, Severity.DEGRADED, key, value, baseline.median, threshold, detail)
