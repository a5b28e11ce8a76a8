"""Layer 3: the fleet (pure): robust outliers within a node class, and fleet events.

Outliers: for the same probe, measurement and labels (GPUs pooled), the class's latest values
give a median and a robust spread (1.4826 x MAD); a value is an outlier when its robust z-score
is below ``-z_threshold`` *and* it is at least ``min_deviation`` worse than the median, so a
straggler that still passes its floor is flagged, and a very tight fleet does not flag noise.

The z-score is taken on the log scale when the peers' values are all positive (bandwidths,
throughputs, times: ratio-scale quantities whose noise is a share of the value). For a fleet at a
few percent of noise this is the linear z-score to within a few percent; for a noisy one it is
what keeps a value at a tenth of its peers an outlier: on the linear scale a fleet whose healthy
values spread 30% cannot flag a value below it by more than 1/0.3 = 3.3 spreads, even at zero.

Round-relative comparison (``round_frame``, ``relative_stats``, ``FleetStats.at_scale``): the
class's values over the fleet window were measured in different rounds, under different loads; when a
whole round moves 20-40% together (a loaded host, a busy fabric), pooling the rounds widens the
spread until a bad value hides in it, and a round's values all sit at one side of the pooled median.
So each value is taken relative to the median of the class's values measured around the same time
(within ``width_s``: its round), the spread is that of the relative values, and a node's value is
compared with the statistics scaled back to its own round's median. A round moving as a whole then
neither hides a fault nor flags the class.

Fleet events: when a large share of a class is flagged at once on one probe, the cause is a
fabric, firmware or software change, not that many broken nodes; one fleet verdict is raised
and the nodes' drops are attributed to it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from healthd.config import FleetSettings
from healthd.judge.baseline import MAD_TO_SD
from healthd.judge.model import Direction, Finding, ReasonCode, SeriesKey, Severity
from healthd.units import human


@dataclass(frozen=True)
class FleetStats:
    median: float
    spread: float
    n: int
    nodes: int
    peers: str
    """Who the value was compared with: ``h100x8 fleet`` or ``the node's 8 GPUs``."""
    log_median: float | None = None
    log_spread: float | None = None
    """Median and robust spread of the values' natural logs, when every value is positive."""

    @property
    def relative_spread(self) -> float:
        """The spread as a share of the value: the log-scale spread, else spread / |median|."""
        if self.log_spread is not None:
            return self.log_spread
        return self.spread / abs(self.median) if self.median else 0.0

    def with_relative_spread(self, floor: float) -> FleetStats:
        """These statistics with their relative spread raised to at least ``floor``."""
        if self.relative_spread >= floor:
            return self
        log_spread = floor if self.log_spread is not None else None
        return FleetStats(self.median, max(self.spread, floor * abs(self.median)), self.n, self.nodes, self.peers,
                          self.log_median, log_spread)

    def at_scale(self, factor: float) -> FleetStats:
        """These statistics (of values relative to their round) at a round whose median is ``factor``: a
        value's robust z-score against the result is its relative value's against these."""
        if factor <= 0 or factor == 1.0:
            return self
        log_median = self.log_median + math.log(factor) if self.log_median is not None else None
        return FleetStats(self.median * factor, self.spread * factor, self.n, self.nodes, self.peers, log_median,
                          self.log_spread)


ROUND_BINS = 5
"""A round's window is this many time bins, centred on the value's bin."""
MAX_ROUND_BINS = 1_000_000
"""More bins than this between the oldest and newest value: no round frame (times that make no sense)."""


@dataclass(frozen=True)
class RoundFrame:
    """The medians of a class's values of one series around each time (its rounds), from ``round_frame``."""

    bin_s: float
    first_bin: int
    references: np.ndarray
    """Per bin from ``first_bin`` on: the median of the bin medians of its window (the overall median
    where the window holds too few values)."""
    overall: float
    """The median of every value: the reference of a time with too few values around it."""

    def reference(self, at: float) -> float:
        """The median of the values measured around ``at`` (its round)."""
        b = math.floor(at / self.bin_s) - self.first_bin
        return float(self.references[b]) if 0 <= b < self.references.size else self.overall

    def references_of(self, ats: np.ndarray) -> np.ndarray:
        b = np.floor(ats / self.bin_s).astype(np.int64) - self.first_bin
        inside = (b >= 0) & (b < self.references.size)
        out = np.full(ats.shape, self.overall)
        out[inside] = self.references[b[inside]]
        return out


def round_frame(ats: Sequence[float] | np.ndarray, values: Sequence[float] | np.ndarray, *, width_s: float,
                min_values: int) -> RoundFrame | None:
    """Each time's round median: the values are put in bins of ``width_s / ROUND_BINS``; a time's reference
    is the median of the bin medians of the ``ROUND_BINS`` bins centred on its own (the window of
    ``width_s`` around it), or the overall median when that window holds fewer than ``min_values``
    values. ``None`` without values or a positive width. Vectorised: one sort, no loop over bins.

    >>> f = round_frame([0, 10, 20, 1000, 1010, 1020], [10, 11, 12, 6, 7, 8], width_s=100, min_values=3)
    >>> f.reference(15), f.reference(1005), f.reference(500)
    (11.25, 7.25, 9.0)
    """
    arr = np.asarray(values, dtype=float)
    times = np.asarray(ats, dtype=float)
    if arr.size == 0 or width_s <= 0 or arr.size != times.size:
        return None
    bin_s = width_s / ROUND_BINS
    bins = np.floor(times / bin_s).astype(np.int64)
    first, span = int(bins.min()), int(bins.max() - bins.min()) + 1
    overall = float(np.median(arr))
    if span > MAX_ROUND_BINS:
        return None
    order = np.lexsort((arr, bins))
    sorted_bins, x = bins[order], arr[order]
    occupied, start, counts = np.unique(sorted_bins, return_index=True, return_counts=True)
    medians = (x[start + (counts - 1) // 2] + x[start + counts // 2]) / 2
    half = ROUND_BINS // 2
    dense = np.full(span + 2 * half, np.nan)
    dense_counts = np.zeros(span + 2 * half)
    dense[occupied - first + half] = medians
    dense_counts[occupied - first + half] = counts
    windows = np.lib.stride_tricks.sliding_window_view(dense, ROUND_BINS)
    in_window = np.lib.stride_tricks.sliding_window_view(dense_counts, ROUND_BINS).sum(axis=1)
    enough = in_window >= max(1, min_values)
    references = np.full(span, overall)
    if bool(enough.any()):
        references[enough] = np.nanmedian(windows[enough], axis=1)
    return RoundFrame(bin_s, first, references, overall)


def relative_stats(frame: RoundFrame, ats: Sequence[float] | np.ndarray, values: Sequence[float] | np.ndarray, *,
                   nodes: int, min_nodes: int, peers: str) -> FleetStats | None:
    """``fleet_stats`` of each value relative to its round's median (``frame.reference``): a median near 1
    and the spread within rounds. Compare a value measured at ``at`` with
    ``stats.at_scale(frame.reference(at))``.

    >>> ats = [0.0] * 20 + [1000.0] * 20
    >>> vals = [100.0 + i % 5 for i in range(20)] + [65.0 + 0.65 * (i % 5) for i in range(20)]
    >>> frame = round_frame(ats, vals, width_s=100, min_values=5)
    >>> st = relative_stats(frame, ats, vals, nodes=40, min_nodes=10, peers="c")
    >>> round(st.median, 6), round(st.at_scale(frame.reference(1000.0)).median, 2)
    (1.0, 66.3)
    """
    arr = np.asarray(values, dtype=float)
    refs = frame.references_of(np.asarray(ats, dtype=float))
    if not bool(np.all(refs != 0)):
        return None
    return fleet_stats(arr / refs, nodes=nodes, min_nodes=min_nodes, peers=peers)


def log_stats(values: Sequence[float] | np.ndarray) -> tuple[float, float] | None:
    """(median, 1.4826 x MAD) of the natural logs of ``values``, or ``None`` if one is not positive."""
    arr = np.asarray(values, dtype=float)
    if arr.size == 0 or not bool(np.all(arr > 0)):
        return None
    logs = np.log(arr)
    median = float(np.median(logs))
    return median, MAD_TO_SD * float(np.median(np.abs(logs - median)))


def fleet_stats(values: Sequence[float] | np.ndarray, *, nodes: int, min_nodes: int, peers: str) -> FleetStats | None:
    """Median and robust spread of ``values`` from ``nodes`` nodes, or ``None`` if too few nodes."""
    if nodes < min_nodes or len(values) == 0:
        return None
    arr = np.asarray(values, dtype=float)
    median = float(np.median(arr))
    spread = MAD_TO_SD * float(np.median(np.abs(arr - median)))
    logs = log_stats(arr)
    return FleetStats(median, spread, int(arr.size), nodes, peers, *(logs or (None, None)))


def robust_z(value: float, stats: FleetStats, direction: Direction) -> float:
    """Signed so that negative is worse; ``-inf`` for a worse value in a fleet with no spread. On the log
    scale when the peers' values are all positive (a value of zero or less is then infinitely worse, or
    better for a ``lower`` measurement)."""
    sign = 1.0 if direction == "higher" else -1.0
    if stats.log_median is not None and stats.log_spread is not None:
        if value <= 0:
            return -math.inf * sign
        delta = sign * (math.log(value) - stats.log_median)
        spread = stats.log_spread
    else:
        delta = sign * (value - stats.median)
        spread = stats.spread
    if spread > 0:
        return delta / spread
    if delta == 0:
        return 0.0
    return math.copysign(math.inf, delta)


def outlier(
    key: SeriesKey, value: float, stats: FleetStats, direction: Direction, *, z_threshold: float,
    min_deviation: float, event_proof: bool = False,
) -> Finding | None:
    """A ``degraded`` finding when ``value`` is a low robust outlier of ``stats``, else ``None``."""
    if stats.median == 0:
        return None
    z = robust_z(value, stats, direction)
    deficit = -(value - stats.median) / abs(stats.median) if direction == "higher" else \
        (value - stats.median) / abs(stats.median)
    if z > -z_threshold or deficit < min_deviation:
        return None
    word = "below" if direction == "higher" else "above"
    threshold = stats.median * (1 - min_deviation) if direction == "higher" else stats.median * (1 + min_deviation)
    z_text = f"robust z {z:.1f}" if math.isfinite(z) else "no spread among peers"
    detail = (f"{key.describe()} {human(key.name, value)} is {deficit * 100:.1f}% {word} the median "
              f"{human(key.name, stats.median)} of {stats.peers} ({z_text}, {stats.n} values)")
    return Finding(ReasonCode.FLEET_OUTLIER, Severity.DEGRADED, key, value, stats.median, threshold, detail,
                   score=z if math.isfinite(z) else None, event_proof=event_proof)


@dataclass(frozen=True)
class EventCheck:
    flagged: int
    sampled: int
    recent_flagged: int
    recent: int
    started_at: float
    """The earliest flagged result in the triggering sample (the event's onset)."""

    @property
    def text(self) -> str:
        return (f"{self.flagged} of {self.sampled} nodes flagged at once "
                f"({self.recent_flagged} of the {self.recent} newest results)")


def check_event(samples: Sequence[tuple[float, bool]], settings: FleetSettings, *, active: bool) -> EventCheck | None:
    """Whether the class is in a fleet event, from each node's latest regular ``(at, flagged)``.

    Every rule is a share of the class's sample, so the judgement does not change with the fleet's
    size. Starts when ``event_share`` of the sample is flagged, or when ``event_recent_share`` of the
    newest results (``event_recent`` of them, or ``event_recent_fraction`` of the sample if more) and
    ``event_recent_min_share`` of the sample are (and at least ``event_min_nodes`` nodes); an active
    event ends when every share falls under half its threshold (hysteresis). Returns the check when
    the class is (still) in an event, else ``None``.
    """
    if not samples:
        return None
    ordered = sorted(samples, key=lambda s: s[0], reverse=True)
    recent = ordered[: max(settings.event_recent, math.ceil(settings.event_recent_fraction * len(ordered)))]
    flagged = sum(1 for _, f in ordered if f)
    recent_flagged = sum(1 for _, f in recent if f)
    scale = 0.5 if active else 1.0
    need_all = max(settings.event_min_nodes if not active else 1, settings.event_share * scale * len(ordered))
    need_recent = max(settings.event_min_nodes if not active else 1,
                      math.ceil(settings.event_recent_share * scale * len(recent)))
    by_window = flagged >= need_all and flagged >= (1 if active else settings.event_min_nodes)
    by_recent = recent_flagged >= need_recent and flagged >= settings.event_recent_min_share * scale * len(ordered)
    if not (by_window or by_recent):
        return None
    source = recent if by_recent and not by_window else ordered
    onset = min((at for at, f in source if f), default=ordered[0][0])
    return EventCheck(flagged, len(ordered), recent_flagged, len(recent), onset)
