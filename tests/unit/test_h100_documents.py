"""The real H100 documents (tests/fixtures/h100, README inside) through the daemon's own path: parse,
expand, sort the run (``collector.outcome_of``), judge on the class the local backend gives an H100.

- the healthy documents pass the packaged H100 floors;
- the documents written under a competing load are degraded against the baseline the healthy ones built
  (GEMM, at ~37%, is also under the H100 floor: ``fail``/``below_floor`` with the floors on);
- the documents written with no GPU visible are ``gpus_missing`` once the expectation is passed (a probe
  of that release did not get it from the daemon: it ran on the CPU), never a CPU figure;
- the one-GPU node's nccl documents are ``skipped``, not errors.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import pytest

from healthd.cluster.local import LocalGpus
from healthd.collector import Collected, outcome_of
from healthd.config import JudgeSettings
from healthd.judge.engine import Judge
from healthd.judge.floors import find_floor, packaged_floors
from healthd.judge.persist import run_from_collected
from healthd.judge.series import SeriesKey
from healthd.model import Node, Outcome, RunKind
from healthd.parsers.expand import expand_result
from healthd.parsers.healthd_json import parse_result
from probes.gpus import NodeGpu
from probes.result import Measurement, ProbeResult

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "h100"
GPU = NodeGpu(0, "GPU-3f1c0a52-0000-0000-0000-000000000000", "NVIDIA H100 80GB HBM3")
CLASS = LocalGpus.of([GPU]).node_class
NODE = Node("vm", "idle", gpus=1, gpu_type="nvidia_h100_80gb_hbm3", node_class=CLASS)
LOAD = (275.0, 475.0)
NO_GPU = (667.0, 837.0)


@dataclass(frozen=True)
class Listed:
    start: float
    probe: str
    run_id: str
    device: str


def listed_runs() -> list[Listed]:
    """``daemon-runs.txt``: start, finish, probe, run id, device x ranks, outcome, figures."""
    rows = []
    for line in (FIXTURES / "daemon-runs.txt").read_text().splitlines():
        m = re.match(r"\s*(\d+)\s+\d+\s+(\w+)\s+(\w+)\s+(cuda|cpu) x\d", line)
        if m:
            rows.append(Listed(float(m[1]), m[2], m[3], m[4]))
    return rows


def document(path: Path, *, expect_gpus: int | None = None) -> ProbeResult:
    result = parse_result(path.read_text())
    if expect_gpus is not None:  # what a probe told by the daemon records (common_params)
        result = result.model_copy(update={"params": {**result.params, "expect_gpus": expect_gpus}})
    return expand_result(result)


def collected(result: ProbeResult, run_id: str) -> Collected:
    outcome, reason = outcome_of(None, result, None, ("vm",))
    kind = RunKind.REPROBE if run_id.startswith("rp") else RunKind.PROBE
    return Collected(run_id, result.probe, ("vm",), outcome, reason, result, kind)


def daemon_doc(run_id: str, **kw: int) -> ProbeResult:
    return document(FIXTURES / "daemon-results" / f"{run_id}.json", **kw)


def test_the_local_backend_classes_this_h100_so_the_packaged_floors_apply() -> None:
    assert CLASS == "nvidia_h100_80gb_hbm3x1"
    floor = find_floor(packaged_floors(), CLASS, SeriesKey("gemm", "flop_per_second", (("dtype", "bf16"),)))
    assert floor is not None and floor.value == pytest.approx(525e12)
    ddp = find_floor(packaged_floors(), CLASS, SeriesKey("ddp", "model_flop_per_second", (("dtype", "bf16"),)))
    assert ddp is not None


def test_healthy_documents_pass_the_h100_floors() -> None:
    judge = Judge(JudgeSettings())
    docs = [document(FIXTURES / "standalone" / f"{name}.json") for name in ("full-env", "full-gemm", "full-ddp")]
    docs += [daemon_doc(r.run_id) for r in listed_runs()
             if r.start < LOAD[0] and r.probe in ("env", "gemm", "ddp")]
    out = judge.evaluate([run_from_collected(collected(d, d.run_id or f"s{i}"), d.finished_at)
                          for i, d in enumerate(docs)], [NODE], now=max(d.finished_at for d in docs) + 1)
    verdicts = {(v.probe, v.outcome) for v in out.verdicts}
    assert verdicts == {("env", Outcome.PASS), ("gemm", Outcome.PASS), ("ddp", Outcome.PASS)}, out.verdicts
    gemm = [m for d in docs if d.probe == "gemm" for m in d.measurements
            if m.name == "flop_per_second" and m.labels.get("dtype") == "bf16"]
    assert gemm and min(m.value for m in gemm) > 525e12  # above the floor the verdict was judged against


def test_documents_under_a_competing_load_are_degraded_against_the_healthy_baseline() -> None:
    judge = Judge(JudgeSettings())
    rows = [r for r in listed_runs() if r.probe in ("gemm", "ddp") and r.start < LOAD[1]]
    verdicts: dict[str, tuple[Outcome, str]] = {}
    for row in rows:  # one run at a time, in the daemon's order, as its collect ticks judged them
        d = daemon_doc(row.run_id)
        out = judge.evaluate([run_from_collected(collected(d, row.run_id), d.finished_at)], [NODE],
                             now=d.finished_at + 1)
        if row.start >= LOAD[0]:
            verdicts.update({v.probe: (v.outcome, v.reason_code) for v in out.verdicts})
    # GEMM fell to ~37% (bf16 ~261 TFLOP/s): under the packaged H100 floor (525), which outranks the
    # baseline; DDP fell to ~49%, still above its floor (30): degraded against its own baseline.
    assert verdicts["gemm"] == (Outcome.FAIL, "below_floor"), verdicts
    assert verdicts["ddp"] == (Outcome.DEGRADED, "baseline_drift"), verdicts
    gemm_only = Judge(JudgeSettings(default_floors=False))
    for row in rows:
        if row.probe == "gemm":
            d = daemon_doc(row.run_id)
            out = gemm_only.evaluate([run_from_collected(collected(d, row.run_id), d.finished_at)], [NODE],
                                     now=d.finished_at + 1)
    assert [(v.outcome, v.reason_code) for v in out.verdicts] == [(Outcome.DEGRADED, "baseline_drift")]


@pytest.mark.parametrize("run", [r for r in listed_runs() if NO_GPU[0] <= r.start <= NO_GPU[1] and r.device == "cpu"
                                 and r.probe != "nccl"], ids=lambda r: f"{r.probe}-{r.run_id}")
def test_no_gpu_documents_are_gpus_missing_once_the_expectation_is_passed(run: Listed) -> None:
    d = daemon_doc(run.run_id, expect_gpus=1)
    assert d.outcome is Outcome.FAIL and [m.name for m in d.measurements if m.name != "visible_gpus"] == []
    judge = Judge(JudgeSettings())
    first = judge.evaluate([run_from_collected(collected(d, run.run_id), d.finished_at)], [NODE],
                           now=d.finished_at + 1)
    assert [(v.outcome, v.reason_code) for v in first.verdicts] == [(Outcome.DEGRADED, "gpus_missing")]
    again = d.model_copy(update={"finished_at": d.finished_at + 20})  # the re-probe it asks for, as bad
    out = judge.evaluate([run_from_collected(collected(again, "rp00" + run.run_id[4:]), again.finished_at)], [NODE],
                         now=again.finished_at + 1)
    (verdict,) = out.verdicts
    assert (verdict.outcome, verdict.reason_code) == (Outcome.FAIL, "gpus_missing"), verdict
    assert "0 GPU(s) visible, 1 expected" in verdict.reason


def test_the_no_gpu_documents_without_an_expectation_are_what_the_h100_run_saw() -> None:
    """Without the expectation (healthd e12ebff) they passed as CPU runs: the defect of issue 26."""
    d = daemon_doc("6ae193a6c8804a4a")
    assert d.outcome is Outcome.PASS and d.environment is not None and d.environment.device_type == "cpu"


@pytest.mark.parametrize("name", ["nogpu-env-expect1", "nogpu-env-devcuda"])
def test_standalone_no_gpu_documents_told_what_to_expect_are_gpus_missing(name: str) -> None:
    d = document(FIXTURES / "standalone" / f"{name}.json")
    c = collected(d, name)
    assert c.outcome is Outcome.FAIL, c
    out = Judge(JudgeSettings()).evaluate([run_from_collected(c, d.finished_at)], [NODE], now=d.finished_at + 1)
    assert [v.reason_code for v in out.verdicts] == ["gpus_missing"]


def test_the_one_gpu_nccl_documents_are_skipped() -> None:
    docs = [document(FIXTURES / "standalone" / "full-nccl.json")]
    docs += [daemon_doc(r.run_id) for r in listed_runs() if r.probe == "nccl" and r.device == "cuda"]
    assert len(docs) > 5
    for d in docs:
        outcome, reason = outcome_of(None, d, None, ("vm",))
        assert (outcome, reason) == (Outcome.SKIPPED, "one GPU per node: nothing to measure"), d.run_id


def test_a_slow_gemm_on_a_throttled_gpu_says_so() -> None:
    """The GEMM probe reads NVML during each timed window (``throttle_ratio``, ``sm_clock_hertz``): a GPU
    found slow while its hardware slowed it is judged as such, the verdict naming the throttling."""
    judge = Judge(JudgeSettings(default_floors=False))
    rows = [r for r in listed_runs() if r.probe == "gemm" and r.start < LOAD[0]]
    for row in rows:
        d = daemon_doc(row.run_id)
        judge.evaluate([run_from_collected(collected(d, row.run_id), d.finished_at)], [NODE], now=d.finished_at + 1)
    slow = daemon_doc("3139a651923c4726")
    gpu = next(m.labels["gpu"] for m in slow.measurements if m.name == "flop_per_second")
    extra = [Measurement(name="throttle_ratio", value=0.8, labels={"gpu": gpu, "dtype": "bf16"}, node="vm"),
             Measurement(name="sm_clock_hertz", value=1.33e9, labels={"gpu": gpu, "dtype": "bf16"}, node="vm")]
    slow = slow.model_copy(update={"measurements": [*slow.measurements, *extra]})
    out = judge.evaluate([run_from_collected(collected(slow, "3139a651923c4726"), slow.finished_at)], [NODE],
                         now=slow.finished_at + 1)
    (verdict,) = out.verdicts
    assert verdict.outcome is Outcome.DEGRADED
    assert "throttled (hardware slowdown, thermal or power brake) 80% of the window at 1,330 MHz" in verdict.reason


def test_the_h200_lost_gpu_document_is_gpus_missing_with_the_missing_uuid() -> None:
    """``CUDA_VISIBLE_DEVICES= python -m probes gemm --expect-gpus 1 --expect-gpu-uuids <its GPU>`` on a real
    H200 (bench/gpu_session.sh, 2026-11-26): no rank started, no figure, the node fails naming the GPU."""
    d = document(FIXTURES.parent / "h200" / "lost-gpu.json")
    assert d.measurements == [] and d.params["gpus_seen_by"] == "nvidia-smi/NVML"
    c = collected(d, "h200lost")
    assert c.outcome is Outcome.FAIL, c
    h200 = Node("vm", "idle", gpus=1, gpu_type="nvidia_h200", node_class="nvidia_h200x1")
    (verdict,) = Judge(JudgeSettings()).evaluate([run_from_collected(c, d.finished_at)], [h200],
                                                 now=d.finished_at + 1).verdicts
    assert verdict.reason_code == "gpus_missing" and "GPU-9b6c4a12-9477-8441-e6d1-42584aabc3fa" in verdict.reason


@pytest.mark.parametrize("name", ["boundary-epilog-pass", "boundary-epilog-gpu-missing"])
def test_the_h200_epilog_documents_are_judged_and_a_lost_gpu_is_taken_over(name: str) -> None:
    """``python -m probes.boundary --context epilog`` on a real H200 (bench/gpu_boundary_session.sh): the
    short GEMM per GPU (bf16 ~670 TFLOP/s) within the budget; told one GPU more than the node has, it fails
    the node (exit 1: Slurm drains it) and the daemon takes that drain over as its own."""
    from healthd.collector import boundary_failures

    d = document(FIXTURES.parent / "h200" / f"{name}.json")
    assert d.params["context"] == "epilog" and d.params["elapsed_s"] < d.params["budget_s"]
    (flops,) = [m for m in d.measurements if m.name == "flop_per_second"]
    assert flops.labels == {"dtype": "bf16", "gpu": "0"} and 600e12 < flops.value < 800e12
    outcome, reason = outcome_of(None, d, None, ("vm",))
    c = Collected(str(d.run_id), "boundary", ("vm",), outcome, reason, d, RunKind.BOUNDARY)
    h200 = Node("vm", "idle", gpus=1, gpu_type="nvidia_h200", node_class="nvidia_h200x1")
    (verdict,) = Judge(JudgeSettings()).evaluate([run_from_collected(c, d.finished_at)], [h200],
                                                 now=d.finished_at + 1).verdicts
    failures = boundary_failures([c])
    if name.endswith("pass"):
        assert (outcome, verdict.outcome, failures) == (Outcome.PASS, Outcome.PASS, [])
    else:
        assert outcome is Outcome.FAIL and verdict.reason_code == "gpus_missing"
        assert [(f.node, f.context) for f in failures] == [("vm", "epilog")]
        assert "1 GPU(s) visible, 2 expected" in failures[0].reason
