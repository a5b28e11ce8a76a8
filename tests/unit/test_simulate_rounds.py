"""A bounded slice of ``bench/scenarios/event-cold-1400.toml`` (issue 27 item 0): three noisy classes
with heavy tails from a cold start, a class-wide busbw event on one, and independent faults."""

from __future__ import annotations

from typing import Any

from healthd.simulate import ClassSpec, EventSpec, Scenario, SeriesSpec, SimCluster, simulate

NCCL = {"collective": "all_reduce", "size_bytes": "1073741824"}


def series(flops: float, bw: float) -> list[dict[str, Any]]:
    return [
        {"probe": "gemm", "name": "flop_per_second", "per": "gpu", "labels": {"dtype": "bf16"}, "value": flops},
        {"probe": "nccl", "name": "busbw_bytes_per_second", "per": "node", "labels": {**NCCL, "scope": "node"},
         "value": bw},
        {"probe": "nccl", "name": "busbw_bytes_per_second", "per": "group", "labels": {**NCCL, "scope": "group"},
         "value": bw * 0.9},
    ]


def sliced() -> Scenario:
    probe = {"interval_s": 600.0, "jitter_s": 600.0, "timeout_s": 180.0}
    tails = {"outlier_rate": 0.01, "outlier_factor": 0.6, "outlier_factor_max": 0.7}
    return Scenario(
        name="event-cold-slice", seed=7, rounds=6, round_s=900.0, tick_s=90.0,
        healthd={"probes": {"gemm": probe, "nccl": {**probe, "nodes_per_job": 2}},
                 "slurm": {"max_concurrent_jobs": 40, "max_idle_share": 0.5},
                 "remediation": {"mode": "enforce", "max_actions_per_hour": 30}},
        classes=[
            {"name": "h100x8", "count": 40, "prefix": "h", "noise": 0.03, "spread": 0.02, **tails,
             "series": series(700e12, 480e9)},
            {"name": "a100x8", "count": 30, "prefix": "a", "noise": 0.05, "spread": 0.03, **tails,
             "series": series(270e12, 240e9)},
            {"name": "l40sx8", "count": 30, "prefix": "l", "noise": 0.06, "spread": 0.04, **tails,
             "series": series(360e12, 50e9)},
        ],
        faults=[
            {"kind": "gpu", "node": "a07", "gpu": 4, "probe": "gemm", "name": "flop_per_second", "factor": 0.6,
             "from_round": 3},
            {"kind": "hang", "node": "l11", "probe": "nccl", "from_round": 3},
        ],
        events=[{"node_class": "h100x8", "probe": "nccl", "name": "busbw_bytes_per_second",
                 "labels": {"scope": "group"}, "factor": 0.8, "from_round": 4, "until_round": 5}],
    )


def test_a_class_wide_event_and_a_heavy_tailed_cold_start_drain_no_healthy_node() -> None:
    report = simulate(sliced(), echo=False)
    assert report.false_drains == [], report.false_drains
    rows = {f.fault.node: f for f in report.faults}
    for node in ("a07", "l11"):
        f = rows[node]
        assert f.rounds_to_find is not None and f.rounds_to_find <= 2 and f.named_right, (node, f.detail)
        assert f.drained_round is not None
    assert rows["l11"].detail == "hang"
    events = [(r, cls, probe) for r, cls, probe, _ in report.fleet_events]
    # The h100x8 event is declared in its first round. The simulator draws every value from one random
    # stream, so a judge that asks for a few more re-probes (link findings re-measure a pair whose ends both
    # passed elsewhere) shifts every later draw: with this seed that gives one early a100x8 nccl event on
    # cold-start heavy tails (seeds 1-5 give none, with or without those re-probes); it drains nothing.
    assert [e for e in events if e[1] == "h100x8"][:1] == [(4, "h100x8", "nccl")], events
    assert all(not n.startswith("h") for line in report.rounds if line.round in (4, 5) for n in line.drained)


def test_heavy_tails_draw_their_factor_and_an_event_hits_only_its_labels() -> None:
    spec = ClassSpec(name="c", count=2, outlier_rate=1.0, outlier_factor=0.6, outlier_factor_max=0.7)
    cluster = SimCluster(Scenario(classes=[spec]))
    draws = [cluster._outlier(spec) for _ in range(200)]
    assert min(draws) >= 0.6 and max(draws) <= 0.7 and max(draws) - min(draws) > 0.05
    assert cluster._outlier(ClassSpec(name="d", count=1, outlier_factor=0.75)) == 0.75
    event = EventSpec(node_class="c", probe="nccl", name="busbw_*", labels={"scope": "group"}, factor=0.8,
                      from_round=1)
    group = SeriesSpec(probe="nccl", name="busbw_bytes_per_second", per="group", value=1.0,
                       labels={"scope": "group"})
    own = SeriesSpec(probe="nccl", name="busbw_bytes_per_second", value=1.0, labels={"scope": "node"})
    assert event.hits(group) and not event.hits(own)
