"""Thresholds that follow the noise (pure).

A fixed fraction suits one noise level: at 2% run-to-run noise a 10% drop is five standard
deviations, at 4% it is two and a half, and a fleet of thousands of nodes with dozens of series
each turns a rare 2.5-sigma value into daily false findings. So every threshold is the wider of
its configured fraction and ``k`` times the series' noise, where ``k`` comes from the target rate
of false drains (``[judge] false_drains_per_1000_node_days``) and the number of tests behind one
drain: a node is tested ``runs_per_node_day`` times a day per probe, on every judged series of the
run and in every layer, and a finding counts only when ``confirm.n`` of ``confirm.m`` runs repeat
it on the same series. With independent normal noise, a single value crosses ``k`` noise units with
probability ``p = 1 - Phi(k)``; a false drain then needs ``n`` such crossings, so

    runs_per_node_day x C(m, n) x (series x layers x p) ** n <= target / 1000

gives ``p`` and ``k = Phi^-1(1 - p)``. Defaults (0.1 per 1,000 node-days, 48 runs, 2 of 3):
``k`` is about 4.1 for a GEMM run (16 per-GPU series) and 3.7 for an NCCL run (2 series).
"""

from __future__ import annotations

import math
from functools import lru_cache
from statistics import NormalDist

LAYERS = 3
"""Floor, own baseline, fleet (and the node's own GPUs): tests one value goes through."""
K_MIN = 2.0
K_MAX = 8.0


@lru_cache(maxsize=256)
def k_for(target_per_1000_node_days: float, runs_per_node_day: float, series: int, n: int, m: int) -> float:
    """Noise units past which one value is flagged, so that false drains stay under the target.

    >>> round(k_for(0.1, 48.0, 16, 2, 3), 2)
    4.14
    """
    per_run = (target_per_1000_node_days / 1000.0 / (max(runs_per_node_day, 1e-9) * math.comb(m, n))) ** (1.0 / n)
    p = min(0.5, per_run / max(1, series * LAYERS))
    return min(K_MAX, max(K_MIN, NormalDist().inv_cdf(1.0 - p)))


EXTRA_RETESTS = 2
"""At most this many retests more than ``confirm.n``."""
MIN_RATE_SAMPLE = 1000
"""Regular results of a class before its chance flag rate is trusted (fewer: ``confirm.n`` of ``confirm.m``)."""


def retests_for(flagged: int, judged: int, target_per_1000_node_days: float, runs_per_node_day: float, n: int,
                m: int, *, extra: int = EXTRA_RETESTS) -> int:
    """How many of ``m + (result - n)`` results must repeat a finding so that chance flags (a class that
    flagged ``flagged`` of ``judged`` regular results) rarely add up to a drain: the smallest ``n' >= n``
    with ``runs_per_node_day x C(m', n') x rate ** n' <= target / 1000``, at most ``n + extra``.

    >>> retests_for(6, 2000, 0.1, 48.0, 2, 3), retests_for(1, 2000, 0.1, 48.0, 2, 3)
    (3, 2)
    """
    if judged < MIN_RATE_SAMPLE or flagged <= 0:
        return n
    rate = flagged / judged
    for need in range(n, n + extra + 1):
        if runs_per_node_day * math.comb(m + need - n, need) * rate ** need <= target_per_1000_node_days / 1000.0:
            return need
    return n + extra


def noisy_floor(floor: float, direction: str, median: float | None, spread: float, k: float) -> float:
    """A floor is never closer to its class's median than ``k`` times the class's spread (across
    nodes, GPUs and runs): a healthy node must not cross it by chance. With a quiet class it is the
    configured floor; with a noisy one it is lowered (raised, for times) to that distance.

    >>> noisy_floor(211.5, "higher", 240.0, 0.05 * 240.0, 4.0)
    192.0
    """
    if median is None or median == 0 or spread <= 0:
        return floor
    if direction == "higher":
        return min(floor, median - k * spread)
    return max(floor, median + k * spread)


OWN_SPREAD_MIN = 6
"""A node's own spread counts from this many passing results (from 3 it is a guess: 0.3-2 x the truth)."""


def relative_noise(own: float | None, baseline: float | None, samples: int, class_noise: float | None) -> float:
    """The run-to-run noise of one node's series relative to its baseline: the wider of the node's own
    spread (once it rests on ``OWN_SPREAD_MIN`` results) and its class's typical one, widened for the
    error of a baseline of ``samples`` values."""
    own_rel = abs(own / baseline) if own is not None and baseline and samples >= OWN_SPREAD_MIN else 0.0
    sigma = max(own_rel, class_noise or 0.0)
    return sigma * math.sqrt(1.0 + math.pi / 2.0 / max(samples, 1))


def unbiased(spread: float, samples: int) -> float:
    """1.4826 x MAD of a handful of normal values is, in the median, ~(1 - 1.25 / n) x the standard
    deviation (0.53 for 3 values, 0.75 for 5, 0.88 for 10): scaled back."""
    return spread / (0.534 if samples <= 3 else 1.0 - 1.25 / samples)


def typical(spreads: list[float]) -> float | None:
    """The class's typical run-to-run noise of a series: the median of its nodes' (unbiased) relative
    spreads."""
    if not spreads:
        return None
    ordered = sorted(spreads)
    mid = len(ordered) // 2
    median = ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2
    return median
