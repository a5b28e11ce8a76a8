"""Layer 1, floors: the packaged table, lookups by class/labels/size, and the comparison."""

from __future__ import annotations

import pytest

from healthd.config import FloorRule, JudgeSettings
from healthd.judge.confirm import repeated
from healthd.judge.floors import below_floor, confirmable, find_floor, floor_rules, packaged_floors
from healthd.judge.model import Finding, Mark, ReasonCode, SeriesKey, Severity

GIB = 1 << 30


def busbw(scope: str, size: int = GIB, collective: str = "all_reduce") -> SeriesKey:
    return SeriesKey.of("nccl", "busbw_bytes_per_second",
                        {"collective": collective, "scope": scope, "size_bytes": str(size), "placement": "in_place"})


def test_packaged_table_is_valid_and_every_number_has_a_source() -> None:
    rules = packaged_floors()
    assert len(rules) == 14
    for rule in rules:
        assert rule.value > 0
        assert len(rule.source) > 40, rule
    # the documented 8xH100 single-node all_reduce floor: 0.9 x 368.76 GB/s (nccl-tests#309)
    h100 = find_floor(rules, "h100x8", busbw("node"))
    assert h100 is not None and h100.value == 330e9 and "368.76" in h100.source


@pytest.mark.parametrize(
    ("node_class", "key", "expected"),
    [
        ("h100x8", busbw("node"), 330e9),
        ("H100x8", busbw("node"), 330e9),  # class patterns are case-insensitive
        ("nvidia_h100_80gb_hbm3x8", busbw("node"), 330e9),  # Slurm's autodetected GRES type name
        ("h200x8", busbw("node", collective="all_gather"), 325e9),
        ("h100x8", busbw("node", size=512 << 20), None),  # below min_size_bytes: not judged by a floor
        ("h100x8", busbw("group", size=16 * GIB), 100e9),
        ("a100x8", busbw("node"), 211.5e9),
        ("h100x4", busbw("node"), None),  # the 8-GPU floors do not apply to 4-GPU nodes
        ("l40sx8", busbw("node"), None),
        ("h100x8", SeriesKey.of("gemm", "flop_per_second", {"gpu": "3", "dtype": "bf16"}), 525e12),
        ("a100x8", SeriesKey.of("gemm", "flop_per_second", {"gpu": "0", "dtype": "fp64"}), 16e12),
        ("h100x8", SeriesKey.of("gemm", "flop_per_second", {"gpu": "0", "dtype": "fp32"}), None),
        ("a100x8", SeriesKey.of("gemm", "memory_bandwidth_bytes_per_second", {"gpu": "1"}), 1.3e12),
    ],
)
def test_lookup_by_class_labels_and_size(node_class: str, key: SeriesKey, expected: float | None) -> None:
    rule = find_floor(packaged_floors(), node_class, key)
    assert (rule.value if rule else None) == expected


def test_config_rules_come_first_and_the_table_can_be_switched_off() -> None:
    mine = FloorRule(node_class=["*h100*"], probe="nccl", name="busbw_*", labels={"scope": "node"}, value=460e9,
                     min_size_bytes=16 * GIB, source="our acceptance test")
    settings = JudgeSettings(floors=[mine])
    rules = floor_rules(settings)
    assert find_floor(rules, "h100x8", busbw("node", size=16 * GIB)) is mine
    assert find_floor(rules, "h100x8", busbw("node", size=GIB)).value == 330e9  # type: ignore[union-attr]
    only_mine = floor_rules(JudgeSettings(floors=[mine], default_floors=False))
    assert only_mine == (mine,)
    assert find_floor(only_mine, "h100x8", busbw("node", size=GIB)) is None


def test_below_floor_for_rates() -> None:
    key = SeriesKey.of("gemm", "flop_per_second", {"gpu": "3", "dtype": "bf16"})
    finding = below_floor(key, 400e12, 525e12, "higher")
    assert finding is not None
    assert (finding.code, finding.severity) == (ReasonCode.BELOW_FLOOR, Severity.FAIL)
    assert (finding.value, finding.reference, finding.threshold) == (400e12, 525e12, 525e12)
    assert finding.detail == "gpu 3 flop_per_second{dtype=bf16} 400 TFLOP/s is below the floor 525 TFLOP/s"
    assert finding.evidence()["gpu"] == "3"
    assert below_floor(key, 525e12, 525e12, "higher") is None  # at the floor is not below it
    assert below_floor(key, 526e12, 525e12, "higher") is None


def test_floor_for_times_is_a_ceiling() -> None:
    key = SeriesKey.of("ddp", "step_seconds", {"quantile": "0.5"})
    finding = below_floor(key, 0.25, 0.2, "lower")
    assert finding is not None and finding.detail == "step_seconds{quantile=0.5} 250 ms is above the floor 200 ms"
    assert below_floor(key, 0.19, 0.2, "lower") is None


def _gpu(i: int) -> SeriesKey:
    return SeriesKey.of("gemm", "flop_per_second", {"dtype": "bf16", "gpu": str(i)})


def _mark(i: int, *findings: Finding) -> Mark:
    sev = max((f.severity for f in findings), default=Severity.NONE)
    return Mark(f"r{i}", "n1", "gemm", float(i), sev, findings[0].code if findings else ReasonCode.OK,
                findings[0].detail if findings else "ok", True, findings=findings)


def _low(gpu: int, value: float = 420e12) -> Finding:
    f = below_floor(_gpu(gpu), value, 525e12, "higher")
    assert f is not None
    return f


def test_two_unrelated_tail_results_are_not_a_confirmed_floor_breach() -> None:
    marks = [_mark(0, _low(3)), _mark(1), _mark(2), _mark(3), _mark(4, _low(3))]
    assert repeated(marks, 5, Severity.FAIL)[0] == 2  # today: "confirmed in 2 of the last 5 runs"
    kept = confirmable(marks)
    assert repeated(kept, 5, Severity.FAIL)[0] == 1  # the latest waits for its re-probe
    assert kept[0].severity is Severity.NONE and "did not repeat" in kept[0].text and kept[0].findings == ()
    assert kept[4] is marks[4]


def test_a_breach_the_next_run_repeats_is_confirmed_at_once() -> None:
    """A GPU at 60%, every run: the trigger and its re-probe confirm it (2 of 2)."""
    assert repeated(confirmable([_mark(0), _mark(1, _low(5)), _mark(2, _low(5))]), 5, Severity.FAIL)[0] == 2
    every = [_mark(i, _low(5)) for i in range(5)]
    assert confirmable(every) == every
    passed_since = confirmable([_mark(0, _low(5)), _mark(1, _low(5)), _mark(2)])
    assert [m.severity for m in passed_since] == [Severity.FAIL, Severity.FAIL, Severity.NONE]


def test_a_repeat_must_be_on_the_same_series() -> None:
    kept = confirmable([_mark(0, _low(3)), _mark(1, _low(5))])
    assert [m.severity for m in kept] == [Severity.NONE, Severity.FAIL]


def test_other_findings_of_a_result_stay_when_its_breach_is_taken_out() -> None:
    outlier = Finding(ReasonCode.FLEET_OUTLIER, Severity.DEGRADED, _gpu(3), 420e12, 700e12, 630e12, "outlier",
                      event_proof=True)
    kept = confirmable([_mark(0, _low(3), outlier), _mark(1)])
    assert (kept[0].severity, kept[0].code, kept[0].findings, kept[0].event_proof) == (
        Severity.DEGRADED, ReasonCode.FLEET_OUTLIER, (outlier,), True)


def test_no_breach_returns_the_marks_themselves() -> None:
    marks = [_mark(0), _mark(1)]
    assert confirmable(marks) is marks
    assert confirmable([]) == []


def test_an_unrelated_latest_breach_does_not_add_to_an_earlier_pair() -> None:
    """Two consecutive tail results long ago and one more now: 2, not "3 of the last 5"."""
    marks = [_mark(0, _low(3)), _mark(1, _low(3)), _mark(2), _mark(3), _mark(4, _low(3))]
    assert repeated(marks, 5, Severity.FAIL)[0] == 3
    kept = confirmable(marks)
    assert repeated(kept, 5, Severity.FAIL)[0] == 2
    assert kept[4].severity is Severity.NONE
    growing = confirmable([_mark(0, _low(3)), _mark(1, _low(3)), _mark(2, _low(3))])
    assert repeated(growing, 5, Severity.FAIL)[0] == 3
