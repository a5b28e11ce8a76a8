"""A round's findings judged together (issue 27 item 0): the event barrier and the cold-start rule."""

from __future__ import annotations

import pytest

from healthd.config import FleetSettings
from healthd.judge.model import CheckInput, ReasonCode, RunInput
from healthd.judge.rounds import HELD, cold_retests, event_hold, rate_bound
from healthd.model import Outcome
from tests.unit.test_judge_engine import Fleet, kind_of, verdict

SLOW = {3: 300e12}
"""One GPU under the floor (525 TFLOP/s): a ``below_floor`` finding."""


def test_the_rate_bound_is_wide_with_few_results_and_narrows_with_more() -> None:
    assert rate_bound(0, 0) == 1.0
    assert rate_bound(1, 40) > 0.1 > rate_bound(10, 1000) > 0.01
    assert rate_bound(10, 1000) > rate_bound(100, 10_000) > 0.01


def test_a_cold_start_needs_the_retests_a_warm_fleet_flagging_at_the_bound_would() -> None:
    args = (0.1, 48.0, 2, 3)
    assert cold_retests(1, 40, *args, extra=2, min_sample=1000) == 4
    assert cold_retests(0, 40, *args, extra=2, min_sample=1000) == 2  # nothing flagged by chance yet
    assert cold_retests(30, 1000, *args, extra=2, min_sample=1000) == 2  # warm: the measured rate decides


@pytest.mark.parametrize(("fresh", "flagged", "held", "forming"), [
    (5, 1, True, False),    # the event rule has seen 5 of the 12 newest results it needs
    (12, 1, False, False),  # seen: one other flagged node in 12 is no event
    (12, 3, True, True),    # 3 of 12 flagged: half the event rule's share, an event may be forming
    (12, 0, False, False),  # nothing else flagged: a lone finding
])
def test_the_event_barrier(fresh: int, flagged: int, held: bool, forming: bool) -> None:
    old = [(f"o{i}", 10.0, False) for i in range(40)]
    new = [(f"n{i}", 100.0 + i, i < flagged) for i in range(fresh)]
    hold = event_hold(old + new, 100.0, "x", 200.0, FleetSettings())
    assert (hold is not None) == held
    if hold is not None:
        assert hold.forming == forming


def test_a_finding_in_a_forming_event_is_held_then_explained_never_drained() -> None:
    fleet = Fleet([f"n{i:02d}" for i in range(40)])
    fleet.healthy_gemm_rounds()
    for _ in range(5):  # enough history that the class's chance rate is no concern here
        fleet.healthy_gemm_rounds()
    low = [f"n{i:02d}" for i in range(4)]
    recs = []
    # the event begins: only four nodes' regular results are in; n00 is re-probed (priority) at once
    out = fleet.feed([fleet.gemm(n, scale=0.7) for n in low], advance=60)
    assert out.fleet_events == []
    for _ in range(3):
        out = fleet.feed([fleet.gemm("n00", scale=0.7, priority=True)], advance=60)
        recs += out.recommendations
    v = fleet.judge.verdicts[("n00", "gemm")]
    assert v.evidence.get("stage") == HELD and "held" in v.reason, v.reason
    assert ("n00", "gemm") in fleet.judge.held
    # the rest of the class's results of the window arrive: a fleet event, n00's finding is the event's
    out = fleet.feed([fleet.gemm(n, scale=0.7) for n in fleet.names[4:]], advance=60)
    recs += out.recommendations
    assert [e.active for e in out.fleet_events] == [True]
    assert recs == []
    assert verdict(fleet, "n00") == ("degraded", "fleet_event")
    assert ("n00", "gemm") not in fleet.judge.held


def test_an_independent_fault_is_recommended_once_the_window_shows_no_event() -> None:
    fleet = Fleet([f"n{i:02d}" for i in range(40)])
    for _ in range(6):
        fleet.healthy_gemm_rounds(1)
    # n00 is slow; one other node is flagged by chance in the same window
    out = fleet.feed([fleet.gemm("n00", SLOW), fleet.gemm("n01", {5: 300e12})], advance=60)
    for _ in range(3):  # 4 of 4: a class with a chance flag and fewer than 1,000 results (the cold-start rule)
        out = fleet.feed([fleet.gemm("n00", SLOW, priority=True)], advance=60)
    assert out.recommendations == []
    assert "held until the fleet-event rule has seen this window" in fleet.judge.verdicts[("n00", "gemm")].reason
    # the class's next results pass: released, recommended, no re-probe of its own needed
    out = fleet.feed([fleet.gemm(n) for n in fleet.names[2:16]], advance=60)
    (rec,) = out.recommendations
    assert (rec.node, rec.outcome, rec.reason_code) == ("n00", Outcome.FAIL, ReasonCode.BELOW_FLOOR)
    assert ("n00", "gemm") not in fleet.judge.held


def test_a_lone_fault_in_a_quiet_class_is_not_held() -> None:
    fleet = Fleet([f"n{i:02d}" for i in range(40)])
    for _ in range(6):
        fleet.healthy_gemm_rounds(1)
    fleet.feed([fleet.gemm("n00", SLOW)], advance=60)
    out = fleet.feed([fleet.gemm("n00", SLOW, priority=True)], advance=60)
    (rec,) = out.recommendations
    assert rec.node == "n00"


def test_a_cold_start_does_not_confirm_on_two_chance_flags_of_a_class_that_flags_by_chance() -> None:
    fleet = Fleet([f"n{i:02d}" for i in range(20)])
    # the first round: no history; n05 and n07 are flagged (n07 by chance: the class has heavy tails)
    fleet.feed([fleet.gemm(n, SLOW if n in ("n05", "n07") else None) for n in fleet.names], advance=60)
    out = fleet.feed([fleet.gemm("n05", SLOW, priority=True)], advance=60)
    assert out.recommendations == []  # two of two: what a quiet warm class would need, not this one
    assert "re-probe requested" in fleet.judge.verdicts[("n05", "gemm")].reason
    for _ in range(2):
        out = fleet.feed([fleet.gemm("n05", SLOW, priority=True)], advance=60)
    (rec,) = out.recommendations  # four of four: the warm requirement at the rate's upper bound
    assert rec.node == "n05" and "confirmed in 4 of the last 4 runs" in rec.text


def test_a_failed_check_at_a_cold_start_keeps_the_warm_retests() -> None:
    fleet = Fleet([f"n{i:02d}" for i in range(20)])
    fleet.feed([fleet.gemm(n, SLOW if n == "n07" else None) for n in fleet.names], advance=60)
    recs = []
    for priority in (False, True):
        check = CheckInput("gemm.wrong_data", "1024 wrong elements", "n03")
        run = RunInput(fleet.rid(priority), "gemm", ("n03",), Outcome.FAIL, "wrong data on n03", fleet.t,
                       failed_checks=(check,), kind=kind_of(priority))
        recs += fleet.feed([run], advance=60).recommendations
    (rec,) = recs  # two of two: a failed check is no chance value of a noisy class
    assert (rec.node, rec.reason_code) == ("n03", ReasonCode.CHECK_FAILED)


def test_in_its_first_rounds_a_class_needs_the_bound_even_before_any_chance_flag() -> None:
    fleet = Fleet([f"n{i:02d}" for i in range(20)])
    fleet.feed([fleet.gemm(n, SLOW if n == "n05" else None) for n in fleet.names], advance=60)
    out = fleet.feed([fleet.gemm("n05", SLOW, priority=True)], advance=60)
    assert out.recommendations == []  # 20 results: nothing is known of the class's chance flags yet
    for _ in range(2):
        out = fleet.feed([fleet.gemm("n05", SLOW, priority=True)], advance=60)
    (rec,) = out.recommendations
    assert "confirmed in 4 of the last 4 runs" in rec.text
    # after its first rounds (3 results a node), a quiet class confirms in 2 of 3 again
    warm = Fleet([f"n{i:02d}" for i in range(20)])
    warm.healthy_gemm_rounds()
    warm.feed([warm.gemm("n05", SLOW)], advance=60)
    (rec,) = warm.feed([warm.gemm("n05", SLOW, priority=True)], advance=60).recommendations
    assert rec.node == "n05"


def test_findings_measured_during_a_fleet_event_are_not_revived_when_it_ends() -> None:
    """A node recommended during a class-wide event for a figure measured under it (an outlier of the class
    as it was then) is not recommended again from those values when the event ends: its next results
    decide (issue 37)."""
    from tests.unit.test_judge_engine import Fleet

    fleet = Fleet([f"n{i:02d}" for i in range(20)])
    fleet.healthy_gemm_rounds(6)
    during = [fleet.feed([fleet.gemm(n, scale=0.55 if n == "n03" else 0.8) for n in fleet.names])
              for _ in range(3)]
    assert any(e.active for out in during for e in out.fleet_events)
    assert "n03" in {r.node for out in during for r in out.recommendations}
    after = [fleet.feed([fleet.gemm(n) for n in fleet.names if n != "n03"]) for _ in range(3)]
    assert any(not e.active for out in after for e in out.fleet_events), "the event ended"
    assert [r.node for out in after for r in out.recommendations] == []
    assert fleet.judge.verdicts[("n03", "gemm")].evidence.get("stage") != "confirmed"
