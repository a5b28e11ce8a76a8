"""Attribution: a probe that did not finish is the node's ``fail`` when the evidence points at it,
``error`` (never a drain) when the probe could not check it."""

from __future__ import annotations

import pytest

from healthd.collector import outcome_of
from healthd.config import JudgeSettings
from healthd.judge.hardfault import HardFault, classify, parse_reason
from healthd.judge.model import CheckInput, ReasonCode, RunInput
from healthd.model import JobState, JobStatus, Outcome
from healthd.remediation.decide import drain_reason
from healthd.store.rows import RecommendationRow
from probes.result import ProbeResult
from tests.unit.test_judge_engine import Fleet, verdict

PAIR = ("n1", "n2")
STUCK = "rank 3 (node n2) was stuck in phase 'probe.start' while rank 0 reached 'nccl.all_reduce 1G'"
DIED = "rank 2 (node n2) died without reporting an error, in phase 'gemm.bf16'"
CUDA = "rank 5 (node n2) failed in phase 'gemm.bf16': RuntimeError: CUDA error: uncorrectable ECC error encountered"
NCCL = ("rank 1 (node n1) failed in phase 'nccl.all_reduce': DistBackendError: NCCL error: unhandled system error; "
        "rank 4 (node n2) failed in phase 'nccl.all_reduce': DistBackendError: NCCL error: ncclRemoteError: "
        "remote process exited")
GPUS = "LaunchError: 8 ranks on this node but 7 GPUs visible to rank 7: use one GPU per rank"
# what real probes wrote (2 ranks, gloo on CPU, HEALTHD_PROBE_FAULT=hang:1 / crash:1), the node names set
REAL_HANG = ("rank 1 (node n2) was stuck in phase 'probe.start' while rank 0 reached "
             "'nccl.all_reduce.8192.in_place.warmup'; rank 0 (node n1) failed in phase "
             "'nccl.all_reduce.8192.in_place.warmup': RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/"
             "transport/tcp/unbound_buffer.cc:78] Timed out waiting 11187ms for recv operation to complete; "
             "launcher: rank 1 exited with code 1: [probes] rank 1: rank 0 is gone")
REAL_CRASH = ("rank 1 (node n2) died without reporting an error, in phase 'probe.start'; rank 0 (node n1) failed in "
              "phase 'probe.start': RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/"
              "pair.cc:553] Connection closed by peer [127.0.0.1]:26336. This is typically caused by a remote "
              "worker crashing.; "
              "launcher: rank 1 exited with code 86: [probes] rank 1: injected crash (86)")


@pytest.mark.parametrize(("text", "nodes", "code", "culprits"), [
    (STUCK, PAIR, ReasonCode.HANG, ("n2",)),
    (REAL_HANG, PAIR, ReasonCode.HANG, ("n2",)),
    (REAL_CRASH, PAIR, ReasonCode.CRASH, ("n2",)),
    (DIED, PAIR, ReasonCode.CRASH, ("n2",)),
    (CUDA, PAIR, ReasonCode.CUDA_ERROR, ("n2",)),
    (NCCL, PAIR, ReasonCode.NCCL_ERROR, ("n1",)),  # n2 only reported its peer's failure
    (GPUS, ("n7",), ReasonCode.GPUS_MISSING, ("n7",)),
    ("rank 1 (node n2) failed in phase start-up: " + GPUS, PAIR, ReasonCode.GPUS_MISSING, ("n2",)),
    (STUCK.replace("n2", "n1") + "; " + STUCK, PAIR, ReasonCode.HANG, ()),  # everyone points at everyone
])
def test_evidence_against_a_node_is_its_fault(text: str, nodes: tuple[str, ...], code: ReasonCode,
                                              culprits: tuple[str, ...]) -> None:
    fault = classify(text, nodes)
    assert fault is not None and (fault.code, fault.nodes) == (code, culprits)
    assert parse_reason(fault.reason()) == fault


@pytest.mark.parametrize("text", [
    "cannot determine the launch: SLURM_NODEID=3 but tasks per node is '2(x2)'",
    "rank 3 (node n2) never joined (no heartbeat)",
    "rank 3 (node n2) died without reporting an error, in phase start-up",
    "rank 3 (node n2) was stuck in phase 'init' while rank 0 reached 'probe.start'",
    "all 16 ranks stuck in phase start-up",
    # a loaded node: every rank still measuring when the probe's own timeout came (what a real probe wrote)
    "all 2 ranks stuck in phase 'gemm.bf16.timed'; rank 0 (node n2) failed in phase 'gemm.bf16.timed': probe did "
    "not finish within its 60 s timeout; rank 1 (node n2) failed in phase 'gemm.bf16.timed': probe did not finish "
    "within its 60 s timeout",
    "probe did not finish within its 180 s timeout",
    "terminated by SIGTERM (the launcher stopped the probe)",
    "no result file /var/lib/healthd/results/0001.json",
    "pyxis: failed to import docker image",
])
def test_could_not_check_is_nobodys_fault(text: str) -> None:
    assert classify(text, PAIR) is None


# Two ranks on one GPU (issue 26, on an H100 with NCCL 2.28.9): NCCL's init check
# (`WARN("Duplicate GPU detected : rank %d and rank %d both on CUDA device %lx")`, then ncclInvalidUsage)
# as torch raises it and as rank 1's diagnosis line carries it; then the NCCL_DEBUG=WARN line itself, and
# NCCL 2.14, which returned ncclInternalError for the same check.
DUPLICATE_GPU = ("rank 1 (node n1) failed in phase 'init': DistBackendError: NCCL error in: "
                 "/pytorch/torch/csrc/distributed/c10d/NCCLUtils.cpp:77, invalid usage (run with NCCL_DEBUG=WARN "
                 "for details), NCCL version 2.28.9\nncclInvalidUsage: This usually reflects invalid usage of NCCL "
                 "library.\nLast error:\nDuplicate GPU detected : rank 1 and rank 0 both on CUDA device 1000")
DUPLICATE_GPU_WARN = ("n1:4242:4250 [0] init.cc:497 NCCL WARN Duplicate GPU detected : rank 1 and rank 0 both on "
                      "CUDA device 1000")
DUPLICATE_GPU_2_14 = ("rank 0 (node n1) failed in phase 'init': DistBackendError: NCCL error in: "
                      "ProcessGroupNCCL.cpp:1275, internal error, NCCL version 2.14.3\nncclInternalError: Internal "
                      "check failed.\nLast error:\nDuplicate GPU detected : rank 0 and rank 1 both on CUDA device 1000")


@pytest.mark.parametrize("text", [DUPLICATE_GPU, DUPLICATE_GPU_WARN, DUPLICATE_GPU_2_14,
                                  DUPLICATE_GPU + "; " + DUPLICATE_GPU.replace("rank 1 (node n1)", "rank 0 (node n1)")])
@pytest.mark.parametrize("nodes", [("n1",), PAIR])
def test_two_ranks_on_one_gpu_is_a_configuration_error_not_a_node_fault(text: str, nodes: tuple[str, ...]) -> None:
    assert classify(text, nodes) is None
    failed = JobStatus("1", JobState.FAILED, exit_code=1, nodes=nodes)
    result = ProbeResult(probe="nccl", outcome=Outcome.ERROR, reason=text, started_at=0, finished_at=1,
                         nodes=list(nodes))
    assert outcome_of(failed, result, None, nodes) == (Outcome.ERROR, text)


def test_an_nccl_failure_of_the_node_at_start_up_is_still_its_fault() -> None:
    text = "rank 1 (node n2) failed in phase 'init': DistBackendError: NCCL error: unhandled system error"
    fault = classify(text, PAIR)
    assert fault is not None and (fault.code, fault.nodes) == (ReasonCode.NCCL_ERROR, ("n2",))


def test_the_collector_sorts_node_faults_from_infrastructure() -> None:
    def error(reason: str, nodes: list[str]) -> ProbeResult:
        return ProbeResult(probe="nccl", outcome=Outcome.ERROR, reason=reason, started_at=0, finished_at=1,
                           nodes=nodes)

    failed = JobStatus("1", JobState.FAILED, exit_code=1, nodes=PAIR)
    outcome, reason = outcome_of(failed, error(STUCK, list(PAIR)), None, PAIR)
    assert outcome is Outcome.FAIL and reason.startswith("hang on n2: rank 3 (node n2) was stuck")
    assert outcome_of(failed, error("rank 3 (node n2) never joined (no heartbeat)", list(PAIR)), None, PAIR)[0] \
        is Outcome.ERROR
    # no document: the probe never said what happened, even if its output shows a CUDA error
    single = JobStatus("2", JobState.FAILED, exit_code=1, nodes=("n7",))
    assert outcome_of(single, None, "no result file x; output: RuntimeError: CUDA error: an illegal memory access",
                      ("n7",))[0] is Outcome.ERROR
    assert outcome_of(None, error(GPUS, ["n7"]), None)[1].startswith("gpus_missing on n7: ")
    # the results directory is unreachable: nothing is known of the node
    assert outcome_of(single, None, "cannot read the result file x: Permission denied", ("n7",))[0] is Outcome.ERROR
    assert outcome_of(JobStatus("3", JobState.TIMEOUT), None, "no result file x", ("n7",))[0] is Outcome.ERROR


def hard(fleet: Fleet, members: tuple[str, ...], fault: HardFault, *, priority: bool = False) -> RunInput:
    run = fleet.nccl(members, priority=priority)
    return RunInput(run.run_id, "nccl", members, Outcome.FAIL, fault.reason(), fleet.t, kind=run.kind)


def test_a_hang_on_one_node_is_confirmed_by_a_retest_and_names_that_node() -> None:
    fleet = Fleet([f"n{i}" for i in range(10)])
    for _ in range(3):
        fleet.feed([fleet.nccl((fleet.names[i], fleet.names[i + 1])) for i in range(0, 10, 2)])
    hang = HardFault(ReasonCode.HANG, ("n3",), STUCK.replace("n2", "n3"))
    out = fleet.feed([hard(fleet, ("n2", "n3"), hang)], advance=60)
    assert verdict(fleet, "n3", "nccl") == ("degraded", "hang") and out.recommendations == []
    assert verdict(fleet, "n2", "nccl") == ("pass", "ok")
    assert [(r.kind, r.nodes) for r in out.requests] == [("reprobe", ("n3",))]
    out = fleet.feed([hard(fleet, ("n3", "n5"), hang, priority=True)])
    (rec,) = out.recommendations
    assert (rec.node, rec.outcome, rec.reason_code) == ("n3", Outcome.FAIL, ReasonCode.HANG)
    row = RecommendationRow(1, "n3", "nccl", "fail", "hang", rec.text, rec.evidence, since=0.0, updated_at=0.0,
                            state="active", closed_at=None, close_reason="", escalated=False, last_refusal="")
    assert drain_reason("healthd:", row).startswith("healthd: hang nccl run rp")


def test_a_group_hang_is_localised_to_the_node_and_keeps_its_code() -> None:
    fleet = Fleet([f"n{i}" for i in range(10)])
    for _ in range(3):
        fleet.feed([fleet.nccl((fleet.names[i], fleet.names[i + 1])) for i in range(0, 10, 2)])
    group = HardFault(ReasonCode.HANG, (), "all 16 ranks stuck in phase 'nccl.all_reduce 1G'")
    fleet.feed([hard(fleet, ("n2", "n3"), group)], advance=60)
    assert {verdict(fleet, n, "nccl")[1] for n in ("n2", "n3")} == {"group_suspect"}
    # re-paired with known-good partners: n2 passes, n3 hangs again (twice: confirmed)
    for _ in range(2):
        fleet.feed([fleet.nccl(("n2", "n6"), priority=True), hard(fleet, ("n3", "n8"), group, priority=True)],
                   advance=60)
    assert verdict(fleet, "n2", "nccl") == ("pass", "ok")
    assert verdict(fleet, "n3", "nccl") == ("fail", "hang")
    assert verdict(fleet, "n8", "nccl")[0] == "pass"


def test_many_nodes_failing_the_same_way_at_once_is_a_fleet_event() -> None:
    fleet = Fleet([f"n{i}" for i in range(20)])
    for _ in range(3):
        fleet.feed([fleet.gemm(n) for n in fleet.names])
    for _ in range(2):
        runs = [RunInput(fleet.rid(False), "gemm", (n,), Outcome.FAIL,
                         HardFault(ReasonCode.CUDA_ERROR, (n,), "CUDA driver version is insufficient").reason(),
                         fleet.t) for n in fleet.names[:10]]
        out = fleet.feed(runs + [fleet.gemm(n) for n in fleet.names[10:]])
        assert out.recommendations == []
    assert fleet.judge.active_events() and verdict(fleet, "n0") == ("degraded", "fleet_event")


def test_a_missing_gpu_found_by_the_probes_own_check_is_gpus_missing() -> None:
    fleet = Fleet([f"n{i}" for i in range(10)])
    check = CheckInput("env.gpu_count", "7 GPU(s) visible, 8 expected", "n4")
    for priority in (False, True):
        run = RunInput(fleet.rid(priority), "gemm", ("n4",), Outcome.FAIL, "env.gpu_count: 7 GPU(s) visible",
                       fleet.t, failed_checks=(check,))
        out = fleet.feed([run], advance=60)
    (rec,) = out.recommendations
    assert (rec.outcome, rec.reason_code) == (Outcome.FAIL, ReasonCode.GPUS_MISSING)


def test_a_node_that_keeps_erroring_while_its_class_passes_is_a_finding_never_a_drain() -> None:
    fleet = Fleet([f"n{i}" for i in range(10)], JudgeSettings())
    fleet.healthy_gemm_rounds()
    for k in range(3):
        err = RunInput(fleet.rid(False), "gemm", ("n1",), Outcome.ERROR, "NCCL communicator init timed out", fleet.t)
        out = fleet.feed([err] + [fleet.gemm(n) for n in fleet.names if n != "n1"])
        assert out.recommendations == []
        assert verdict(fleet, "n1") == ("error", "repeated_errors" if k == 2 else "probe_error")
    # every node erring: the infrastructure, not the node
    fleet2 = Fleet([f"n{i}" for i in range(10)])
    fleet2.healthy_gemm_rounds()
    for _ in range(3):
        fleet2.feed([RunInput(fleet2.rid(False), "gemm", (n,), Outcome.ERROR, "no result file", fleet2.t)
                     for n in fleet2.names])
    assert verdict(fleet2, "n1") == ("error", "probe_error")
