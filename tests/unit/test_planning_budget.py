"""The probe budget in the planner (pure): the limit, the cost estimate, which jobs fit."""

from __future__ import annotations

import pytest

from healthd.config import ProbeSettings
from healthd.model import Node, ProbeJob, RunKind
from healthd.planning import (
    PlanLimits,
    PriorityRequest,
    ProbeBudget,
    budget_limit_gpu_s,
    plan,
    run_cost_gpu_s,
    within_budget,
)

GPUS = {f"n{i}": 8 for i in range(10)}


def job(run_id: str, *nodes: str, probe: str = "gemm", kind: RunKind = RunKind.PROBE,
        timeout_s: float = 100.0) -> ProbeJob:
    return ProbeJob(run_id=run_id, probe=probe, nodes=nodes, timeout_s=timeout_s, kind=kind)


def test_limit_is_the_lower_of_hours_and_share() -> None:
    assert budget_limit_gpu_s(None, None, 8000) is None
    assert budget_limit_gpu_s(10.0, None, 8000) == 36_000.0
    assert budget_limit_gpu_s(None, 0.005, 8000) == pytest.approx(0.005 * 8000 * 86400)
    assert budget_limit_gpu_s(10.0, 0.005, 8000) == 36_000.0
    assert budget_limit_gpu_s(10_000.0, 0.005, 8000) == pytest.approx(3456000.0)


def test_cost_is_expected_duration_times_gpus_else_timeout() -> None:
    assert run_cost_gpu_s("gemm", ("n0", "n1"), GPUS, {"gemm": 30.0}, 100.0) == 480.0
    assert run_cost_gpu_s("nccl", ("n0",), GPUS, {"gemm": 30.0}, 100.0) == 800.0
    assert run_cost_gpu_s("gemm", ("cpu0",), GPUS, {"gemm": 30.0}, 100.0) == 0.0


def test_no_limit_keeps_everything() -> None:
    jobs = [job(f"r{i}", f"n{i}") for i in range(5)]
    assert within_budget(jobs, budget=ProbeBudget(None, 1e12), gpus=GPUS, duration_s={}) == jobs


def test_regular_jobs_stop_at_the_first_that_does_not_fit() -> None:
    # each gemm job: 30 s x 8 GPUs = 240 GPU-s; an nccl pair at the timeout: 100 s x 16 = 1600
    jobs = [job("a", "n0"), job("b", "n1", "n2", probe="nccl"), job("c", "n3"), job("d", "n4")]
    kept = within_budget(jobs, budget=ProbeBudget(1000.0, 300.0), gpus=GPUS, duration_s={"gemm": 30.0})
    assert [j.run_id for j in kept] == ["a"]
    kept = within_budget(jobs, budget=ProbeBudget(10_000.0, 0.0), gpus=GPUS, duration_s={"gemm": 30.0})
    assert [j.run_id for j in kept] == ["a", "b", "c", "d"]


def test_exhausted_budget_holds_every_regular_job_and_sweep() -> None:
    jobs = [job("a", "n0"), job("sw", "n1", "n2", kind=RunKind.SWEEP)]
    assert within_budget(jobs, budget=ProbeBudget(1000.0, 1000.0), gpus=GPUS, duration_s={}) == []
    assert within_budget(jobs, budget=ProbeBudget(1000.0, 5000.0), gpus=GPUS, duration_s={}) == []


def test_reprobes_are_never_held_but_count() -> None:
    jobs = [job("rp1", "n0", kind=RunKind.REPROBE), job("a", "n1")]
    kept = within_budget(jobs, budget=ProbeBudget(1000.0, 990.0), gpus=GPUS, duration_s={"gemm": 30.0})
    assert [j.run_id for j in kept] == ["rp1"]
    kept = within_budget(jobs, budget=ProbeBudget(1000.0, 500.0), gpus=GPUS, duration_s={"gemm": 30.0})
    assert [j.run_id for j in kept] == ["rp1", "a"]
    kept = within_budget(jobs, budget=ProbeBudget(1000.0, 600.0), gpus=GPUS, duration_s={"gemm": 30.0})
    assert [j.run_id for j in kept] == ["rp1"]


def test_budget_after_plan_keeps_the_longest_waiting_nodes() -> None:
    nodes = [Node(f"n{i}", "idle", gpus=8) for i in range(6)]
    last = {(f"n{i}", "gemm"): 100.0 * i for i in range(6)}
    probes = {"gemm": ProbeSettings(interval_s=10.0)}
    jobs = plan(nodes, probes=probes, last_attempts=last, busy_nodes=(), in_flight=0, now=10_000.0,
                limits=PlanLimits(), priority=[PriorityRequest("gemm", ("n5",))])
    kept = within_budget(jobs, budget=ProbeBudget(1000.0, 0.0), gpus=GPUS, duration_s={"gemm": 30.0})
    assert [(j.kind, j.nodes) for j in kept] == [
        (RunKind.REPROBE, ("n5",)), (RunKind.PROBE, ("n0",)), (RunKind.PROBE, ("n1",)), (RunKind.PROBE, ("n2",))]
