"""The fleet comparison relative to each value's round (``healthd.judge.fleet.round_frame``): a round that
moves as a whole (a loaded host, a busy fabric) neither hides a fault nor flags the class."""

from __future__ import annotations

import math
import random

import pytest

from healthd.judge.fleet import FleetStats, fleet_stats, outlier, relative_stats, robust_z, round_frame
from healthd.judge.model import SeriesKey

KEY = SeriesKey.of("nccl", "busbw_bytes_per_second", {"scope": "node"})
ROUND = 900.0


def fleet(shifts: list[float], nodes: int = 120, noise: float = 0.03, seed: int = 1,
          bad: dict[int, float] | None = None) -> tuple[list[float], list[float], list[float]]:
    """Each node measured once per round (spread over the round) for len(shifts) rounds; every value of
    round r scaled by shifts[r]. Returns (times, values, each node's last time) in node order per round."""
    rng = random.Random(seed)
    ats, values = [], []
    for r, shift in enumerate(shifts):
        for n in range(nodes):
            at = r * ROUND + (n + 0.5) * ROUND / nodes
            fault = (bad or {}).get(n, 1.0) if r == len(shifts) - 1 else 1.0
            ats.append(at)
            values.append(400.0 * shift * fault * max(0.01, rng.gauss(1.0, noise)))
    return ats, values, ats[-nodes:]


def flagged(value: float, stats: FleetStats) -> bool:
    return outlier(KEY, value, stats, "higher", z_threshold=4.0, min_deviation=0.1) is not None


def test_a_fault_hidden_by_pooled_rounds_is_found_relative_to_its_round() -> None:
    """A node 30% low in a round at full speed, among rounds 40% down: pooled, the spread hides it."""
    shifts = [1.0, 0.6, 1.0, 0.6, 0.65, 1.0]
    ats, values, _ = fleet(shifts, bad={7: 0.7})
    last = slice(-120, None)
    pooled = fleet_stats(values, nodes=120, min_nodes=10, peers="pooled")
    assert pooled is not None
    assert not flagged(values[last][7], pooled)
    frame = round_frame(ats, values, width_s=ROUND / 2, min_values=10)
    assert frame is not None
    rel = relative_stats(frame, ats, values, nodes=120, min_nodes=10, peers="by round")
    assert rel is not None
    at, value = ats[last][7], values[last][7]
    assert flagged(value, rel.at_scale(frame.reference(at)))
    healthy = [flagged(v, rel.at_scale(frame.reference(a))) for i, (a, v) in enumerate(zip(ats[last], values[last],
                                                                                        strict=True)) if i != 7]
    assert not any(healthy)


def test_a_round_that_moves_as_a_whole_flags_nobody() -> None:
    """The latest round 35% down for every node: against the pooled window the whole round is low; against
    its own round nobody is."""
    for seed in range(5):
        ats, values, _ = fleet([1.0, 1.0, 1.0, 0.65], seed=seed)
        pooled = fleet_stats(values, nodes=120, min_nodes=10, peers="pooled")
        frame = round_frame(ats, values, width_s=ROUND / 2, min_values=10)
        assert pooled is not None and frame is not None
        rel = relative_stats(frame, ats, values, nodes=120, min_nodes=10, peers="by round")
        assert rel is not None
        last = list(zip(ats[-120:], values[-120:], strict=True))
        assert sum(flagged(v, pooled) for _, v in last) > 100
        assert sum(flagged(v, rel.at_scale(frame.reference(a))) for a, v in last) == 0


def test_at_scale_keeps_the_z_score_of_the_relative_value() -> None:
    rel = fleet_stats([0.9, 1.0, 1.05, 1.1, 0.95, 1.0], nodes=6, min_nodes=3, peers="x")
    assert rel is not None
    scaled = rel.at_scale(250.0)
    assert scaled.median == pytest.approx(250.0)
    assert robust_z(200.0, scaled, "higher") == pytest.approx(robust_z(0.8, rel, "higher"))
    linear = FleetStats(1.0, 0.05, 6, 6, "x")
    assert robust_z(200.0, linear.at_scale(250.0), "higher") == pytest.approx(robust_z(0.8, linear, "higher"))
    assert rel.at_scale(1.0) is rel and rel.at_scale(0.0) is rel


def test_a_time_with_too_few_values_around_it_takes_the_overall_median() -> None:
    frame = round_frame([0.0, 1.0, 2.0, 5000.0], [10.0, 10.0, 10.0, 100.0], width_s=100.0, min_values=3)
    assert frame is not None
    assert frame.reference(1.0) == 10.0
    assert frame.reference(5000.0) == frame.reference(99999.0) == 10.0
    assert round_frame([], [], width_s=100.0, min_values=1) is None
    assert round_frame([1.0], [1.0], width_s=0.0, min_values=1) is None


def test_a_round_frame_of_ten_thousand_values_is_cheap() -> None:
    """One per class and series per tick: a sort and a median per occupied bin (not per value)."""
    rng = random.Random(3)
    ats = [rng.uniform(0, 86400) for _ in range(10_000)]
    values = [rng.gauss(100, 3) for _ in range(10_000)]
    frame = round_frame(ats, values, width_s=450.0, min_values=10)
    assert frame is not None and frame.references.size <= math.ceil(86400 / 90) + 1
