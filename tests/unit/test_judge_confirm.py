"""Confirmation (N of M), localisation of bad group results, and the planner's re-probe requests."""

from __future__ import annotations

import itertools

from healthd.config import ProbeSettings
from healthd.judge.confirm import (
    attribute,
    blame_confirmed,
    candidates,
    confirmed,
    count_flagged,
    mean_confirmed,
    pick_partners,
    split,
)
from healthd.judge.model import Finding, GroupRecord, Mark, ReasonCode, SeriesKey, Severity
from healthd.model import Node, RunKind
from healthd.planning import PlanLimits, PriorityRequest, new_priority_run_id, new_run_id, plan


def mark(severity: Severity) -> Mark:
    return Mark("r", "a", "gemm", 0.0, severity, ReasonCode.OK, "", True)


def group(run_id: str, at: float, members: tuple[str, ...], flagged: bool = True,
          suspects: tuple[str, ...] | None = None) -> GroupRecord:
    sev = Severity.DEGRADED if flagged else Severity.NONE
    return GroupRecord(run_id, "nccl", at, members, sev, ReasonCode.FLEET_OUTLIER if flagged else ReasonCode.OK, "",
                       suspects if suspects is not None else members)


def test_n_of_m() -> None:
    f, d, ok = Severity.FAIL, Severity.DEGRADED, Severity.NONE
    assert count_flagged([mark(f), mark(ok), mark(d)], 3, Severity.DEGRADED) == (2, 3)
    assert count_flagged([mark(f), mark(ok), mark(d)], 3, Severity.FAIL) == (1, 3)
    assert confirmed([mark(f), mark(ok), mark(f)], n=2, m=3, severity=f)
    assert not confirmed([mark(f)], n=2, m=3, severity=f)  # one bad run is a reason to re-probe, not to drain
    # only the last m count: an old failure followed by three passes no longer confirms anything
    assert not confirmed([mark(f), mark(f), mark(ok), mark(ok), mark(ok)], n=2, m=3, severity=d)
    # two passes are needed to clear a confirmed failure (m - n + 1)
    assert confirmed([mark(f), mark(f), mark(ok)], n=2, m=3, severity=f)


BUSBW = SeriesKey("nccl", "busbw_bytes_per_second", (("scope", "node"),))
GEMM = SeriesKey("gemm", "flop_per_second", (("gpu", "0"),))


def scored(z: float, flagged: bool = False, key: SeriesKey = BUSBW) -> Mark:
    """A run ``z`` noise units below the node's baseline, flagged on ``key`` or not."""
    found = (Finding(ReasonCode.BASELINE_DRIFT, Severity.DEGRADED, key, 1.0 - z / 25, 1.0, 0.83, "low"),)
    return Mark("r", "a", "nccl", 0.0, Severity.DEGRADED if flagged else Severity.NONE, ReasonCode.OK, "", True,
                findings=found if flagged else (), shortfalls=((BUSBW, z, z * 0.04), (GEMM, 0.0, 0.0)))


def test_retest_mean_confirms_a_node_whose_retests_pass_by_chance() -> None:
    # -20% at 4% noise: ~5 units low per run; the second retest passes (3.9 units, under the ~4.3 threshold)
    # and 2 of 3 flagged runs would not be enough while the class needs 3, but the mean of the retests
    # (min(6.2, 5) + 3.9) / 2 x sqrt(2) = 6.3 is past k = 5.
    runs = [scored(5.5, True), scored(6.2, True), scored(3.9)]
    assert mean_confirmed(runs, 5.0) == {BUSBW: 6.29}
    # the trigger does not count (it was chosen for being low), and one retest is not a mean
    assert mean_confirmed(runs[:2], 5.0) == {}
    assert mean_confirmed([scored(9.0, True), scored(2.0), scored(2.0)], 5.0) == {}
    # significant, but most retests less than the configured fraction low: no fault (a quiet series)
    assert mean_confirmed(runs, 5.0, fraction=0.25) == {}
    assert mean_confirmed(runs, 5.0, fraction=0.1) == {BUSBW: 6.29}


def test_retest_mean_ignores_chance_and_other_series() -> None:
    # a healthy node: one chance flag, then retests around its baseline (one a 25% outlier, 6 units)
    assert mean_confirmed([scored(4.5, True), scored(6.0), scored(-0.5)], 5.0) == {}
    # at low noise an outlier is 25 units off: it counts for k at most, so it never decides alone
    assert mean_confirmed([scored(25.0, True), scored(25.0), scored(0.5)], 5.0) == {}
    assert mean_confirmed([scored(25.0, True), scored(25.0), scored(25.0)], 5.0) == {BUSBW: 7.07}
    assert mean_confirmed([scored(4.5, True), scored(0.3), scored(-1.0), scored(6.0)], 5.0) == {}
    # only the series the trigger flagged are tested; no trigger, no test
    assert mean_confirmed([scored(4.5, True, key=GEMM), scored(6.0), scored(6.0)], 5.0) == {}
    assert mean_confirmed([scored(6.0), scored(6.0), scored(6.0)], 5.0) == {}


def test_innocent_partner_is_cleared_and_the_bad_node_blamed() -> None:
    ab = group("ab", 1.0, ("a", "b"))  # a has a bad link; b is innocent
    ad = group("ad", 2.0, ("a", "d"), suspects=("a",))  # re-probe of a with known-good d
    last_pass = {"b": 3.0, "d": 0.5}  # b passed with a known-good partner after "ab"; d passed before
    assert candidates(ab, last_pass) == ("a",)
    assert candidates(ad, last_pass) == ("a",)  # d was a partner, not a suspect
    result = attribute([ab, ad], last_pass)
    assert result.blamed == {"a": [ab, ad]}
    assert result.unresolved == [] and result.cleared == []
    history = [group("old", 0.0, ("a", "c"), flagged=False), ab, ad]
    assert blame_confirmed("a", history, last_pass, n=2, m=3) == (2, 3)


def test_unresolved_explained_and_cleared() -> None:
    ab = group("ab", 1.0, ("a", "b"))
    bc = group("bc", 2.0, ("b", "c"))  # b is the only candidate left here once c passed
    ef = group("ef", 1.0, ("e", "f"))  # nobody has passed since: both are suspects
    gh = group("gh", 1.0, ("g", "h"))  # both passed since: a path or a transient, no node
    last_pass = {"c": 5.0, "g": 4.0, "h": 4.0}
    result = attribute([ab, bc, ef, gh], last_pass)
    assert result.blamed == {"b": [ab, bc]}  # b explains ab too, so a is not blamed
    assert result.unresolved == [(ef, ("e", "f"))]
    assert result.cleared == [gh]
    assert result.suspects() == {"e": [ef], "f": [ef]}


def test_split_and_partners_are_deterministic() -> None:
    assert split(["d", "a", "c", "b", "e"]) == (("a", "b", "c"), ("d", "e"))
    assert split(["x"]) == (("x",), ())
    pool = [f"n{i}" for i in range(20)]
    first = pick_partners("n3", pool, 4)
    assert len(first) == 4 and "n3" not in first and first == pick_partners("n3", reversed(pool), 4)
    assert pick_partners("n4", pool, 4) != first  # spread over the pool, not always the same partners


# -- the planner's side ------------------------------------------------------------------------
def idle(name: str, **kw: object) -> Node:
    return Node(name=name, state="idle", partitions=("gpu",), node_class="h100x8", **kw)  # type: ignore[arg-type]


def run_plan(nodes: list[Node], requests: list[PriorityRequest], *, busy: set[str] | None = None,
             probes: dict[str, ProbeSettings] | None = None, limits: PlanLimits | None = None,
             last: dict[tuple[str, str], float] | None = None) -> list[tuple[str, tuple[str, ...], bool]]:
    counter = itertools.count()
    jobs = plan(nodes, probes=probes or {"nccl": ProbeSettings(nodes_per_job=2), "gemm": ProbeSettings()},
                last_attempts=last or {}, busy_nodes=busy or set(), in_flight=0, now=1000.0,
                limits=limits or PlanLimits(), make_run_id=lambda: f"{next(counter):016x}", priority=requests)
    return [(j.probe, j.nodes, j.kind is RunKind.REPROBE) for j in jobs]


def test_priority_ids_stand_out_and_never_collide_with_regular_ids() -> None:
    regular = {new_run_id() for _ in range(200)}
    assert not any(r.startswith("rp") for r in regular)
    assert new_priority_run_id().startswith("rp") and len(new_priority_run_id()) == 16


def test_priority_requests_come_first_with_free_known_good_partners() -> None:
    nodes = [idle(n) for n in ("a", "b", "c", "d", "e")]
    recent = {(n.name, p): 990.0 for n in nodes for p in ("nccl", "gemm")}  # nothing regular is due
    requests = [PriorityRequest("nccl", ("a",), partners=("b", "c"), size=2)]
    # b is busy with another healthd job: the first free partner, c, is taken
    assert run_plan(nodes, requests, busy={"b"}, last=recent) == [("nccl", ("a", "c"), True)]
    # no free partner: the request waits, nothing else is invented
    assert run_plan(nodes, requests, busy={"b", "c"}, last=recent) == []
    # a single-node probe needs no partner; regular due probes follow the priority ones
    out = run_plan(nodes, [PriorityRequest("gemm", ("e",))], last={**recent, ("d", "gemm"): -5000.0})
    assert out == [("gemm", ("e",), True), ("gemm", ("d",), False)]


def test_priority_requests_respect_caps_and_node_states() -> None:
    nodes = [idle("a"), idle("b"), idle("c", flags=frozenset({"DRAIN"})), Node("d", "allocated", node_class="h")]
    recent = {(n.name, p): 990.0 for n in nodes for p in ("nccl", "gemm")}
    reqs = [PriorityRequest("gemm", ("a",)), PriorityRequest("gemm", ("b",))]
    assert len(run_plan(nodes, reqs, limits=PlanLimits(max_jobs_in_flight=1), last=recent)) == 1
    assert run_plan(nodes, [PriorityRequest("gemm", ("c",))], last=recent) == []  # drained: not without leave
    assert run_plan(nodes, [PriorityRequest("gemm", ("c",), allow_drained=True)], last=recent) == \
        [("gemm", ("c",), True)]
    assert run_plan(nodes, [PriorityRequest("gemm", ("d",), allow_drained=True)], last=recent) == []  # a user's
    disabled = {"gemm": ProbeSettings(enabled=False)}
    assert run_plan(nodes, [PriorityRequest("gemm", ("a",))], probes=disabled, last=recent) == []
    # partners are never drained nodes, even when the request may use a drained suspect
    assert run_plan(nodes, [PriorityRequest("nccl", ("a",), partners=("c",), size=2)], last=recent) == []
