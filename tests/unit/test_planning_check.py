"""The planner combines the single-node probes due on a node into one ``python -m probes check`` job."""

from __future__ import annotations

import itertools

from healthd.config import LauncherSettings, ProbeSettings
from healthd.model import BundledRun, Node, ProbeJob
from healthd.planning import PlanLimits, ProbeBudget, jitter, plan, within_budget

FOUR = {name: ProbeSettings(interval_s=100.0, timeout_s=t) for name, t in
        (("gemm", 60.0), ("nccl", 50.0), ("ddp", 90.0), ("env", 30.0))}


def idle(name: str, **kw: object) -> Node:
    return Node(name=name, state="idle", partitions=("batch",), **kw)  # type: ignore[arg-type]


def jobs_of(nodes: list[Node], last: dict[tuple[str, str], float] | None = None, *,
            probes: dict[str, ProbeSettings] | None = None, combine: bool = True, now: float = 1000.0,
            limits: PlanLimits | None = None) -> list[ProbeJob]:
    counter = itertools.count()
    return plan(nodes, probes=probes or FOUR, last_attempts=last or {}, busy_nodes=set(), in_flight=0, now=now,
                limits=limits or PlanLimits(), make_run_id=lambda: f"r{next(counter)}", combine=combine)


def test_the_probes_due_on_a_node_run_in_one_check_job_each_with_its_own_run() -> None:
    gpu = idle("g1", gpus=8, gpu_uuids=tuple(f"GPU-{i}" for i in range(8)))
    jobs = jobs_of([gpu], probes={**FOUR, "gemm": ProbeSettings(interval_s=100.0, timeout_s=60.0,
                                                                 args=["--size", "4096"])})
    assert len(jobs) == 1
    job = jobs[0]
    assert (job.probe, job.nodes, job.run_id, job.timeout_s, job.expect_gpus) == ("check", ("g1",), "r0", 230.0, 8)
    assert job.expect_gpu_uuids == gpu.gpu_uuids
    # catalogue order (env first), each its own run id, options and limit
    assert job.bundle == (
        BundledRun("r0", "env", (), 30.0),
        BundledRun("r1", "nccl", (), 50.0),
        BundledRun("r2", "gemm", ("--size", "4096"), 60.0),
        BundledRun("r3", "ddp", (), 90.0),
    )
    assert job.runs == job.bundle


def test_off_the_probes_run_one_job_per_plan_as_before() -> None:
    jobs = jobs_of([idle("a")], combine=False)
    assert [(j.probe, j.bundle) for j in jobs] == [("ddp", ())]
    assert jobs[0].runs == (BundledRun(jobs[0].run_id, "ddp", (), 90.0),)


def test_a_probe_joins_once_its_interval_has_passed_without_waiting_for_its_jitter() -> None:
    probes = {name: ProbeSettings(interval_s=100.0, jitter_s=50.0) for name in ("env", "gemm", "nccl")}
    last = {("a", "gemm"): 850.0, ("a", "env"): 850.0, ("a", "nccl"): 870.0}
    assert 950.0 + jitter("a", "gemm", 50.0) < 960.0 < 950.0 + jitter("a", "env", 50.0)
    # at 960 gemm is due; env's interval has passed (its jitter has not): it joins; nccl's has not
    (job,) = jobs_of([idle("a")], last, probes=probes, now=960.0)
    assert [r.probe for r in job.bundle] == ["env", "gemm"]
    # before any is due with its jitter, nothing is planned
    assert jobs_of([idle("a")], last, probes=probes, now=950.5) == []


def test_only_single_node_check_probes_with_the_same_ranks_and_launcher_are_combined() -> None:
    probes = {
        "gemm": ProbeSettings(interval_s=100.0),
        "env": ProbeSettings(interval_s=100.0),
        "nccl": ProbeSettings(interval_s=100.0, ranks_per_node=4),
        "ddp": ProbeSettings(interval_s=100.0, launcher=LauncherSettings(kind="pyxis", image="img")),
        "nccl_tests": ProbeSettings(interval_s=100.0),
    }
    last = {("a", name): 890.0 for name in ("nccl", "ddp", "nccl_tests")}  # due; env and gemm never ran
    jobs = jobs_of([idle("a")], last, probes=probes)
    assert len(jobs) == 1
    assert [r.probe for r in jobs[0].bundle] == ["env", "gemm"]
    # a multi-node probe is never part of a check, and a lone probe runs alone
    multi = {"nccl": ProbeSettings(interval_s=100.0, nodes_per_job=2), "gemm": ProbeSettings(interval_s=100.0)}
    jobs = jobs_of([idle("a"), idle("b")], probes=multi)
    assert [(j.probe, j.nodes, j.bundle) for j in jobs] == [("gemm", ("a",), ()), ("gemm", ("b",), ())]


def test_one_check_job_per_node_and_the_caps_count_jobs() -> None:
    nodes = [idle(f"n{i}") for i in range(4)]
    jobs = jobs_of(nodes, limits=PlanLimits(max_jobs_in_flight=3))
    assert [(j.probe, j.nodes, len(j.bundle)) for j in jobs] == [("check", (f"n{i}",), 4) for i in range(3)]
    assert len({r.run_id for j in jobs for r in j.runs}) == 12


def test_the_budget_counts_every_run_of_a_check() -> None:
    (job,) = jobs_of([idle("a", gpus=2)])
    durations = {"env": 5.0, "nccl": 10.0, "gemm": 10.0, "ddp": 20.0}
    gpus = {"a": 2}
    assert within_budget([job], budget=ProbeBudget(90.0, 0.0), gpus=gpus, duration_s=durations) == [job]
    assert within_budget([job], budget=ProbeBudget(89.0, 0.0), gpus=gpus, duration_s=durations) == []


def test_a_probe_whose_args_hold_a_common_option_runs_alone() -> None:
    probes = {"gemm": ProbeSettings(interval_s=100.0, args=["--timeout=50"]), "env": ProbeSettings(interval_s=100.0),
              "ddp": ProbeSettings(interval_s=100.0)}
    (job,) = jobs_of([idle("a")], probes=probes)
    assert [r.probe for r in job.bundle] == ["env", "ddp"]
    last = {("a", "env"): 950.0, ("a", "ddp"): 950.0}  # gemm leads: it runs alone
    assert [(j.probe, j.bundle) for j in jobs_of([idle("a")], last, probes=probes)] == [("gemm", ())]
