"""Layers 2 and 3: the node's own baseline and the fleet, with hand-computed cases."""

from __future__ import annotations

import math

import pytest

from healthd.config import FleetSettings
from healthd.judge.baseline import MAD_TO_SD, Baseline, baseline_of, drift, robust_stats
from healthd.judge.fleet import check_event, fleet_stats, outlier, robust_z
from healthd.judge.model import ReasonCode, SeriesKey, Severity

KEY = SeriesKey.of("nccl", "busbw_bytes_per_second", {"collective": "all_reduce", "size_bytes": "1073741824"})


def test_robust_stats_by_hand() -> None:
    # median of 98, 100, 101, 102 = 100.5; deviations 2.5, 0.5, 0.5, 1.5 -> median 1.0
    assert robust_stats([100.0, 102.0, 98.0, 101.0]) == (100.5, MAD_TO_SD * 1.0)
    assert robust_stats([5.0]) == (5.0, 0.0)


def test_baseline_needs_min_samples() -> None:
    assert baseline_of([1.0, 2.0], min_samples=3) is None
    assert baseline_of([1.0, 2.0, 4.0], min_samples=3) == Baseline(2.0, MAD_TO_SD * 1.0, 3)


def test_drift_uses_the_fraction_or_the_spread_whichever_is_wider() -> None:
    g = 1e9
    tight = Baseline(median=100 * g, spread=1 * g, n=10)
    # allowed = max(0.1 x 100, 4 x 1) = 10 GB/s: flagged below 90 GB/s, not at 90
    finding = drift(KEY, 89.9 * g, tight, "higher", fraction=0.1, spread_k=4.0)
    assert finding is not None and (finding.code, finding.severity) == (ReasonCode.BASELINE_DRIFT, Severity.DEGRADED)
    assert finding.threshold == 90 * g and finding.reference == 100 * g
    assert finding.detail == ("busbw_bytes_per_second{collective=all_reduce,size_bytes=1G} 89.9 GB/s is 10.1% "
                              "below this node's baseline 100 GB/s (median of 10 passing runs)")
    assert drift(KEY, 90 * g, tight, "higher", fraction=0.1, spread_k=4.0) is None
    noisy = Baseline(median=100 * g, spread=3 * g, n=10)
    # allowed = max(10, 4 x 3 = 12) GB/s: 89 is within the noise of this series, 87.9 is not
    assert drift(KEY, 89 * g, noisy, "higher", fraction=0.1, spread_k=4.0) is None
    assert drift(KEY, 87.9 * g, noisy, "higher", fraction=0.1, spread_k=4.0) is not None


def test_drift_for_times_is_upwards() -> None:
    key = SeriesKey.of("ddp", "step_seconds", {"quantile": "0.5"})
    base = Baseline(median=0.2, spread=0.0, n=5)
    finding = drift(key, 0.23, base, "lower", fraction=0.1, spread_k=4.0)
    assert finding is not None and "15.0% above" in finding.detail and math.isclose(finding.threshold, 0.22)
    assert drift(key, 0.17, base, "lower", fraction=0.1, spread_k=4.0) is None


def test_fleet_outlier_by_hand() -> None:
    g = 1e9
    # median 100; deviations 0, 2, 2, 1, 1, 0 -> MAD 1 -> spread 1.4826 (GB/s)
    stats = fleet_stats([v * g for v in (100.0, 102.0, 98.0, 101.0, 99.0, 100.0)], nodes=6, min_nodes=5,
                        peers="the h100x8 class")
    assert stats is not None and (stats.median, stats.n) == (100 * g, 6) and math.isclose(stats.spread, MAD_TO_SD * g)
    # on the log scale: median ln(100 G); deviations ln(1.02), ln(0.98), ln(1.01), ln(0.99), 0, 0 -> MAD ln(1/0.99)
    # (0.01005, the 3rd and 4th of 0, 0, 0.00995, 0.01005, 0.0198, 0.0202): z = ln(0.85) / (1.4826 x 0.01005)
    log_spread = MAD_TO_SD * (math.log(1.01) + math.log(1 / 0.99)) / 2
    assert stats.log_spread is not None and math.isclose(stats.log_spread, log_spread)
    assert math.isclose(robust_z(85 * g, stats, "higher"), math.log(0.85) / log_spread)
    assert math.isclose(math.log(0.85) / log_spread, -10.96, abs_tol=1e-2)  # -15 / 1.4826 = -10.1 on the linear scale
    finding = outlier(KEY, 85 * g, stats, "higher", z_threshold=3.5, min_deviation=0.1)
    assert finding is not None and finding.code is ReasonCode.FLEET_OUTLIER and finding.severity is Severity.DEGRADED
    assert finding.score is not None and math.isclose(finding.score, -10.96, abs_tol=1e-2)
    assert finding.detail.endswith("85 GB/s is 15.0% below the median 100 GB/s of the h100x8 class "
                                   "(robust z -11.0, 6 values)")
    assert math.isclose(finding.threshold, 90 * g)
    # z = -6 / 1.4826 = -4.05 passes the z test, but 6% is under min_deviation: a tight fleet does not flag noise
    assert outlier(KEY, 94 * g, stats, "higher", z_threshold=3.5, min_deviation=0.1) is None
    assert outlier(KEY, 94 * g, stats, "higher", z_threshold=3.5, min_deviation=0.05) is not None
    # 12% worse in a wide fleet (median 100, MAD 10, spread 14.8: z = -0.81) is not an outlier
    wide = fleet_stats([100.0, 80.0, 120.0, 90.0, 110.0], nodes=5, min_nodes=5, peers="x")
    assert wide is not None and math.isclose(wide.spread, 10 * MAD_TO_SD)
    assert outlier(KEY, 88.0, wide, "higher", z_threshold=3.5, min_deviation=0.1) is None


def test_a_fleet_whose_healthy_values_spread_widely_still_flags_a_tenth_of_them() -> None:
    """Pair busbw on a loaded host (the real test cluster's round: 147-344 MB/s healthy, each pair's value on
    both its nodes): on the linear scale no value, not even zero, is 3.7 spreads below this fleet's median;
    on the log scale a pair at a tenth of its peers is an outlier and a pair at 70% is not."""
    healthy = [162.0, 147.0, 158.0, 203.0, 344.0, 225.0]
    values = [v for v in [*healthy, 15.0, 12.0] for _ in range(2)]
    stats = fleet_stats(values, nodes=16, min_nodes=5, peers="x")
    assert stats is not None
    assert (stats.median - 0.0) / stats.spread < 3.7  # linear: even zero is within the threshold
    assert outlier(KEY, 15.0, stats, "higher", z_threshold=3.7, min_deviation=0.1) is not None
    assert outlier(KEY, 0.0, stats, "higher", z_threshold=3.7, min_deviation=0.1) is not None
    assert outlier(KEY, 0.7 * stats.median, stats, "higher", z_threshold=3.7, min_deviation=0.1) is None
    assert robust_z(0.0, stats, "higher") == -math.inf and robust_z(0.0, stats, "lower") == math.inf
    with_zero = fleet_stats([0.0, *values], nodes=17, min_nodes=5, peers="x")
    assert with_zero is not None and with_zero.log_spread is None  # a value of zero: the linear scale


def test_fleet_needs_enough_nodes_and_handles_no_spread() -> None:
    assert fleet_stats([1.0, 2.0, 3.0], nodes=3, min_nodes=5, peers="x") is None
    flat = fleet_stats([10.0] * 6 + [9.0, 11.0], nodes=8, min_nodes=5, peers="x")
    assert flat is not None and flat.spread == 0.0
    finding = outlier(KEY, 8.0, flat, "higher", z_threshold=3.5, min_deviation=0.1)
    assert finding is not None and finding.score is None and "no spread among peers" in finding.detail
    assert outlier(KEY, 9.5, flat, "higher", z_threshold=3.5, min_deviation=0.1) is None
    assert robust_z(10.0, flat, "higher") == 0.0


def test_fleet_outlier_for_times() -> None:
    key = SeriesKey.of("nccl", "time_seconds", {"size_bytes": "8192"})
    stats = fleet_stats([2.0, 2.0, 2.1, 1.9, 2.0], nodes=5, min_nodes=5, peers="x")
    assert stats is not None
    assert outlier(key, 2.5, stats, "lower", z_threshold=3.5, min_deviation=0.1) is not None
    assert outlier(key, 1.5, stats, "lower", z_threshold=3.5, min_deviation=0.1) is None  # faster is never bad


SETTINGS = FleetSettings()  # share 0.2, recent 12, recent share 0.5, min nodes 3


def sample(n: int, flagged_newest: int = 0, flagged_oldest: int = 0) -> list[tuple[float, bool]]:
    """n nodes' latest results at times 0..n-1, the newest or the oldest ones flagged."""
    return [(float(i), i >= n - flagged_newest or i < flagged_oldest) for i in range(n)]


@pytest.mark.parametrize(
    ("samples", "expect"),
    [
        (sample(100, flagged_oldest=5), None),  # 5% flagged, none among the 12 newest: broken nodes, not an event
        (sample(100, flagged_newest=5), None),  # 5 of the 12 newest: under half
        (sample(100, flagged_newest=6), (6, 94.0)),  # 6 of the 12 newest: an event, since the first of them
        (sample(100, flagged_oldest=20), (20, 0.0)),  # 20% of the sample at once
        ([(1.0, True), (2.0, True)], None),  # two nodes are never a fleet (event_min_nodes 3)
        ([(1.0, True), (2.0, True), (3.0, True)], (3, 1.0)),
    ],
)
def test_event_starts(samples: list[tuple[float, bool]], expect: tuple[int, float] | None) -> None:
    check = check_event(samples, SETTINGS, active=False)
    assert (None if check is None else (check.flagged, check.started_at)) == expect


def test_active_event_ends_under_half_the_thresholds() -> None:
    # active: holds while >= 10% of the sample or >= 3 of the 12 newest are flagged
    assert check_event(sample(100, flagged_newest=3), SETTINGS, active=True) is not None
    assert check_event(sample(100, flagged_newest=2), SETTINGS, active=True) is None
    assert check_event(sample(100, flagged_oldest=10), SETTINGS, active=True) is not None
    assert check_event(sample(100, flagged_oldest=9), SETTINGS, active=True) is None
    assert check_event([], SETTINGS, active=True) is None


@pytest.mark.parametrize("nodes", [1000, 3000, 10_000])
def test_one_percent_of_bad_nodes_rechecked_most_often_is_no_event_at_any_fleet_size(nodes: int) -> None:
    # the bad nodes are re-probed every couple of minutes: their results are always the newest
    bad = nodes // 100
    samples = [(float(i), i >= nodes - bad) for i in range(nodes)]
    assert check_event(samples, SETTINGS, active=False) is None
    assert check_event(samples, SETTINGS, active=True) is None


@pytest.mark.parametrize("nodes", [100, 1000, 10_000])
def test_a_class_wide_change_starts_an_event_early_at_any_fleet_size(nodes: int) -> None:
    # the change is seen by the newest 6% of the class so far
    seen = math.ceil(nodes * 0.06)
    check = check_event([(float(i), i >= nodes - seen) for i in range(nodes)], SETTINGS, active=False)
    assert check is not None and check.flagged == seen
