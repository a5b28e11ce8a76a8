"""A seeded, bounded slice of the operating curve (issue 13): a noisy fleet whose healthy nodes
differ, with every hard-fault kind, must find its faults and drain nothing else."""

from __future__ import annotations

from healthd.simulate import Scenario, scale_noise, simulate

SERIES = [
    {"probe": "gemm", "name": "flop_per_second", "per": "gpu", "labels": {"dtype": "bf16"}, "value": 700e12},
    {"probe": "nccl", "name": "busbw_bytes_per_second", "per": "node",
     "labels": {"collective": "all_reduce", "size_bytes": "1073741824", "scope": "node"}, "value": 480e9},
    {"probe": "nccl", "name": "busbw_bytes_per_second", "per": "group",
     "labels": {"collective": "all_reduce", "size_bytes": "1073741824", "scope": "group"}, "value": 440e9},
]


def noisy_fleet() -> Scenario:
    probe = {"interval_s": 840.0, "jitter_s": 30.0, "timeout_s": 180.0}
    return Scenario(
        name="noisy-48", seed=5, rounds=5, round_s=900.0, tick_s=90.0,
        healthd={"probes": {"gemm": probe, "nccl": {**probe, "nodes_per_job": 2}},
                 "slurm": {"max_concurrent_jobs": 64, "max_idle_share": 1.0},
                 "remediation": {"mode": "enforce", "breaker_class_share": 0.25}},
        classes=[{"name": "h100x8", "count": 48, "prefix": "n", "gpus": 8, "gpu_type": "h100", "noise": 0.01,
                  "spread": 0.03, "outlier_rate": 0.002, "outlier_factor": 0.75, "series": SERIES}],
        faults=[
            {"kind": "gpu", "node": "n05", "gpu": 2, "probe": "gemm", "name": "flop_per_second", "factor": 0.65,
             "from_round": 3},
            {"kind": "hang", "node": "n11", "probe": "nccl", "from_round": 3},
            {"kind": "crash", "node": "n20", "probe": "gemm", "from_round": 3},
            {"kind": "gpus_missing", "node": "n30", "visible_gpus": 7, "from_round": 3},
            {"kind": "error", "node": "n40", "probe": "nccl", "rate": 1.0, "from_round": 2},
        ])


def test_a_noisy_fleet_finds_hard_faults_and_drains_nothing_else() -> None:
    report = simulate(scale_noise(noisy_fleet(), 4.0), echo=False)
    assert report.false_recommendations == [] and report.false_drains == []
    rows = {f.fault.node: f for f in report.faults}
    for node in ("n05", "n11", "n20", "n30"):
        f = rows[node]
        assert f.rounds_to_find is not None and f.rounds_to_find <= 2 and f.named_right, (node, f.detail)
    assert rows["n11"].detail == "hang" and rows["n20"].detail == "crash" and rows["n30"].detail == "gpus_missing"
    assert rows["n40"].found_round is None and rows["n40"].drained_round is None  # infrastructure
    assert report.ok


def test_noise_scales_every_class() -> None:
    scaled = scale_noise(noisy_fleet(), 3.0)
    assert [c.noise for c in scaled.classes] == [0.03]
