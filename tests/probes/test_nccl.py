"""The nccl probe with real torch.distributed ranks (gloo on CPU): standalone, torchrun, srun."""

from __future__ import annotations

import pytest

from probes.result import Measurement, Outcome, ProbeResult
from tests.probes.helpers import dump, measurements_by_key, run_probe, run_simulated_srun, run_torchrun

pytestmark = pytest.mark.slow

ALL = "all_reduce,all_gather,reduce_scatter,alltoall,broadcast,sendrecv"
PLACEMENTS = {
    "all_reduce": {"in_place"},
    "broadcast": {"in_place"},
    "all_gather": {"out_of_place", "in_place"},
    "reduce_scatter": {"out_of_place", "in_place"},
    "alltoall": {"out_of_place"},
    "sendrecv": {"out_of_place"},
}
# nccl-tests busbw factors written out for the group sizes used here (not computed by the probe).
FACTOR = {
    2: {"all_reduce": 1.0, "all_gather": 0.5, "reduce_scatter": 0.5, "alltoall": 0.5},
    4: {"all_reduce": 1.5, "all_gather": 0.75, "reduce_scatter": 0.75, "alltoall": 0.75},
}
for _n in FACTOR:
    FACTOR[_n].update(broadcast=1.0, sendrecv=1.0)


def expected_size(collective: str, requested: int, n: int, typesize: int = 4) -> int:
    """nccl-tests' size column for a requested byte size (whole elements per rank)."""
    if collective in ("all_gather", "reduce_scatter", "alltoall"):
        return requested // (n * typesize) * n * typesize
    return requested // typesize * typesize


def check_arithmetic(result: ProbeResult, collectives: list[str], sizes: list[int], n: int, scope: str) -> None:
    """Every (collective, size, placement) has time, algbw = S/t and busbw = algbw*factor, per
    rank as well, and a passing #wrong check."""
    rows = measurements_by_key(result)
    seen = set()
    for (labels, _node), metrics in rows.items():
        lab = dict(labels)
        assert lab["scope"] == scope
        coll, size = lab["collective"], int(lab["size_bytes"])
        seen.add((coll, size, lab["placement"]))
        t = metrics["time_seconds"]
        alg = metrics["algbw_bytes_per_second"]
        bus = metrics["busbw_bytes_per_second"]
        assert isinstance(t, Measurement) and isinstance(alg, Measurement) and isinstance(bus, Measurement)
        assert t.per_rank is not None and len(t.per_rank) == n
        assert all(x > 0 for x in t.per_rank)
        assert t.value == pytest.approx(sum(t.per_rank) / n, rel=1e-12)
        # S is the size column for every collective (nccl-tests' *GetBw with the rounded count)
        assert alg.value == pytest.approx(size / t.value, rel=1e-12)
        assert bus.value == pytest.approx(size / t.value * FACTOR[n][coll], rel=1e-12)
        assert alg.per_rank == pytest.approx([size / x for x in t.per_rank], rel=1e-12)
        assert bus.per_rank == pytest.approx([size / x * FACTOR[n][coll] for x in t.per_rank], rel=1e-12)
    expected = {
        (c, expected_size(c, s, n), p)
        for c in collectives
        for s in sizes
        for p in PLACEMENTS[c]
        if expected_size(c, s, n)
    }
    assert seen == expected
    checks = {c.name: c for c in result.checks if c.name.startswith("nccl.")}
    assert set(checks) == {f"nccl.{c}.{s}.{p}.wrong" for c, s, p in expected}
    for c in checks.values():
        assert c.ok, c
        assert c.detail == "0 wrong elements"


def test_standalone_two_ranks_all_collectives() -> None:
    run = run_probe(["nccl", "--collectives", ALL, "--sizes", "8K,1000,256K", "--iters", "5", "--warmup", "1"])
    assert run.returncode == 0, run.stderr[-3000:]
    result = run.result
    assert result.outcome is Outcome.PASS, dump(result)
    check_arithmetic(result, ALL.split(","), [8192, 1000, 262144], 2, "node")
    assert result.environment is not None
    assert result.environment.launcher == "standalone"
    assert result.environment.backend == "gloo"
    assert [r.rank for r in result.environment.ranks] == [0, 1]
    assert result.params["sizes"] == [8192, 1000, 262144]
    assert result.params["unmeasured"]["all_reduce.out_of_place"] == "torch.distributed.all_reduce works in place only"
    assert result.startup_seconds is not None and result.measure_seconds is not None
    assert 0 < result.startup_seconds < run.wall
    assert result.started_at <= result.finished_at
    node = result.nodes[0]
    assert result.nodes == [node]
    assert all(m.node == node for m in result.measurements)
    assert run.wall < 60


def test_standalone_four_ranks() -> None:
    run = run_probe(
        ["nccl", "--nproc", "4", "--collectives", ALL, "--sizes", "1000,64K", "--iters", "3", "--warmup", "1"]
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.result.outcome is Outcome.PASS, dump(run.result)
    check_arithmetic(run.result, ALL.split(","), [1000, 65536], 4, "node")
    assert run.result.params["nproc"] == 4


def test_torchrun_two_ranks_default_sizes() -> None:
    run = run_torchrun(2, ["nccl", "--collectives", "all_reduce,all_gather", "--iters", "5"])
    assert run.returncode == 0, run.stderr[-3000:]
    result = run.result
    assert result.outcome is Outcome.PASS, dump(result)
    check_arithmetic(result, ["all_reduce", "all_gather"], [8192, 4 << 20], 2, "node")
    assert result.environment is not None and result.environment.launcher == "torchrun"
    assert result.params["warmup"] == 5 and result.params["iters"] == 5


def test_simulated_srun_rails_across_two_nodes() -> None:
    run = run_simulated_srun(2, 2, ["nccl", "--collectives", "all_reduce,sendrecv", "--sizes", "8K", "--scope", "rail"])
    assert run.returncodes == [0, 0, 0, 0], run.stderrs[0][-3000:]
    assert run.stdouts[1:] == ["", "", ""]
    result = run.result
    assert result.outcome is Outcome.PASS, dump(result)
    assert result.nodes == ["sim0", "sim1"]
    assert result.environment is not None and result.environment.launcher == "srun"
    assert [(r.rank, r.local_rank, r.group_rank, r.node) for r in result.environment.ranks] == [
        (0, 0, 0, "sim0"),
        (1, 1, 0, "sim0"),
        (2, 0, 1, "sim1"),
        (3, 1, 1, "sim1"),
    ]
    assert result.params["groups"] == [{"ranks": [0, 2], "rail": 0}, {"ranks": [1, 3], "rail": 1}]
    rails = {(m.labels["rail"], m.labels["collective"]) for m in result.measurements}
    assert rails == {("0", "all_reduce"), ("1", "all_reduce"), ("0", "sendrecv"), ("1", "sendrecv")}
    assert all(m.node is None and m.labels["scope"] == "rail" for m in result.measurements)
    assert all(len(m.per_rank or []) == 2 for m in result.measurements)
    assert sorted((c.name, c.gpu) for c in result.checks) == [
        ("nccl.all_reduce.8192.in_place.wrong", 0),
        ("nccl.all_reduce.8192.in_place.wrong", 1),
        ("nccl.sendrecv.8192.out_of_place.wrong", 0),
        ("nccl.sendrecv.8192.out_of_place.wrong", 1),
    ]


def test_simulated_srun_node_scope_measures_each_node() -> None:
    run = run_simulated_srun(2, 2, ["nccl", "--sizes", "8K", "--scope", "node", "--format", "table"])
    assert run.returncodes == [0, 0, 0, 0], run.stderrs[0][-3000:]
    table = run.stdouts[0]
    assert "# probe nccl  outcome pass" in table
    assert "# all_reduce  scope node  sim0  ranks 2" in table
    assert "# all_reduce  scope node  sim1  ranks 2" in table
    rows = [ln.split() for ln in table.splitlines() if ln.startswith("        8192")]
    assert len(rows) == 2
    for row in rows:
        assert row[:5] == ["8192", "2048", "float", "sum", "-1"]
        assert row[5:9] == ["N/A", "N/A", "N/A", "N/A"]
        assert row[-1] == "0"


def test_simulated_srun_group_scope_default_across_nodes() -> None:
    run = run_simulated_srun(2, 1, ["nccl", "--sizes", "8K"])
    assert run.returncodes == [0, 0], run.stderrs[0][-3000:]
    result = run.result
    assert result.params["scope"] == "group"
    check_arithmetic(result, ["all_reduce"], [8192], 2, "group")
    assert all(m.node is None for m in result.measurements)
    assert result.nodes == ["sim0", "sim1"]


def test_corrupted_rank_fails_the_probe() -> None:
    run = run_probe(
        ["nccl", "--collectives", "all_reduce,all_gather", "--sizes", "8K", "--iters", "2"],
        env={"HEALTHD_PROBE_FAULT": "corrupt:1"},
    )
    assert run.returncode == 0, run.stderr[-3000:]
    result = run.result
    assert result.outcome is Outcome.FAIL
    bad = {c.name: c for c in result.checks if not c.ok}
    assert set(bad) == {
        "nccl.all_reduce.8192.in_place.wrong",
        "nccl.all_gather.8192.out_of_place.wrong",
        "nccl.all_gather.8192.in_place.wrong",
    }
    for c in bad.values():
        assert c.detail == "3 wrong elements (rank 1: 3)"
        assert c.rank == 1
    assert "nccl.all_reduce.8192.in_place.wrong: 3 wrong elements (rank 1: 3)" in result.reason
    # bandwidth is still reported: the node is judged on the checks
    assert len(result.measurements) == 9


def test_a_slowed_node_slows_every_pair_it_is_in_and_not_its_own_groups() -> None:
    """``slow@<node>`` (``probes.faults``): the pair's busbw drops to about ``1 / (1 + SLOW_FACTOR)`` (a
    tenth) on both its members, the data stays right (``pass``); the node's own group (``--scope node``)
    is not slowed. Each figure is the best of two runs (a busy CPU only ever lowers one)."""
    argv = ["nccl", "--sizes", "1M", "--warmup", "2", "--iters", "8"]

    def busbw(nodes: int, tasks: int, extra: list[str], fault: str = "") -> float:
        best = 0.0
        for _ in range(2):
            env = {"HEALTHD_PROBE_FAULT": fault} if fault else None
            run = run_simulated_srun(nodes, tasks, [*argv, *extra], env=env)
            assert run.returncodes == [0] * (nodes * tasks), run.stderrs[0][-3000:]
            assert run.result.outcome is Outcome.PASS, run.result.reason
            assert run.result.params["scope"] == ("group" if nodes > 1 else "node")
            (value,) = [m.value for m in run.result.measurements if m.name == "busbw_bytes_per_second"]
            best = max(best, value)
        return best

    clean, slowed = busbw(2, 1, []), busbw(2, 1, [], "slow@sim1")
    assert slowed < 0.6 * clean, (slowed, clean)
    own, own_slowed = busbw(1, 2, ["--scope", "node"]), busbw(1, 2, ["--scope", "node"], "slow@sim0")
    assert own_slowed > 0.6 * own, (own_slowed, own)
