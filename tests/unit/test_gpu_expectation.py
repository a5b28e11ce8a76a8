"""The daemon tells every probe what the node must have: from the node's class (a rule's ``expect_gpus``),
Slurm's GRES, or the local machine's own discovery; the planner puts it on the job, the job's argv
carries it (``--expect-gpus``), and a document that ran on the CPU anyway keeps no figure."""

from __future__ import annotations

import shlex
from pathlib import Path

from healthd.cluster.local import LocalBackend, LocalGpus, probe_argv
from healthd.config import NodeClassRule, ProbeSettings
from healthd.jobs import LaunchSettings, render_batch_script
from healthd.model import Node, Outcome, ProbeJob
from healthd.node_class import classed, gpu_type_of
from healthd.parsers.devices import cpu_on_gpu_node
from healthd.planning import PlanLimits, plan
from probes.gpus import NodeGpu
from probes.result import Environment, Measurement, ProbeResult, RankInfo

H100 = "NVIDIA H100 80GB HBM3"


def test_gpu_type_from_the_model_name_matches_the_packaged_patterns() -> None:
    assert gpu_type_of(H100) == "nvidia_h100_80gb_hbm3"
    assert gpu_type_of("NVIDIA A100-SXM4-80GB") == "nvidia_a100_sxm4_80gb"
    assert gpu_type_of("  ") == "gpu"


def test_local_class_from_discovery_or_settings() -> None:
    gpus = [NodeGpu(i, f"GPU-{i}", H100) for i in range(8)]
    assert LocalGpus.of(gpus) == LocalGpus(8, "nvidia_h100_80gb_hbm3", "nvidia_h100_80gb_hbm3x8")
    assert LocalGpus.of([]) == LocalGpus(0, None, "cpu")
    assert LocalGpus.of([], gpus=1, node_class="testgpux1") == LocalGpus(1, None, "testgpux1")
    assert LocalGpus.of(gpus, gpus=0).node_class == "cpu"


def test_the_local_backend_keeps_expecting_a_gpu_that_fell_off_the_bus(tmp_path: Path) -> None:
    listings = [[NodeGpu(0, "GPU-a", H100), NodeGpu(1, "GPU-b", H100)], [NodeGpu(0, "GPU-a", H100)]]
    backend = LocalBackend(node_name="vm", python=Path("python3"), list_gpus=lambda: listings.pop(0))
    (node,) = backend.list_nodes()
    assert (node.gpus, node.node_class, node.required_gpus) == (2, "nvidia_h100_80gb_hbm3x2", 2)
    assert node.gpu_uuids == ("GPU-a", "GPU-b")
    backend._listed_at = float("-inf")  # the next rediscovery is due: it lists one GPU fewer
    (node,) = backend.list_nodes()
    assert node.required_gpus == 2 and node.gpu_uuids == ("GPU-a", "GPU-b") and listings == []
    (job,) = plan([node], probes={"gemm": ProbeSettings()}, last_attempts={}, busy_nodes=(), in_flight=0, now=0.0,
                  limits=PlanLimits())
    assert (job.expect_gpus, job.expect_gpu_uuids) == (2, ("GPU-a", "GPU-b"))


def test_a_class_rule_can_say_the_gres_are_not_gpus() -> None:
    node = Node("n1", "idle", gpus=2, gpu_type="tgpu")
    assert classed(node).required_gpus == 2
    fake = classed(node, [NodeClassRule(name="tgpux2", gpu_type="tgpu", expect_gpus=0)])
    assert (fake.node_class, fake.required_gpus, fake.gpus) == ("tgpux2", 0, 2)
    assert classed(node, [NodeClassRule(name="big", gpu_type="tgpu")]).required_gpus == 2


def test_the_planner_puts_the_expectation_on_each_job() -> None:
    nodes = [Node("g1", "idle", gpus=8, node_class="h100x8"), Node("c1", "idle", node_class="cpu"),
             Node("f1", "idle", gpus=2, node_class="tgpux2", expect_gpus=0)]
    jobs = plan(nodes, probes={"gemm": ProbeSettings()}, last_attempts={}, busy_nodes=(), in_flight=0, now=0.0,
                limits=PlanLimits(max_jobs_in_flight=10))
    assert {j.nodes[0]: j.expect_gpus for j in jobs} == {"g1": 8, "c1": None, "f1": None}


def test_the_argv_and_the_batch_script_carry_it_for_torch_probes_only(tmp_path: Path) -> None:
    job = ProbeJob("0123456789abcdef", "gemm", ("gpu01",), timeout_s=60.0, expect_gpus=8,
                   expect_gpu_uuids=("GPU-a", "GPU-b"))
    argv = probe_argv("python3", job, None, ranks=None)
    assert argv[-4:] == ["--expect-gpus", "8", "--expect-gpu-uuids", "GPU-a,GPU-b"]
    user = ProbeJob("0123456789abcdef", "gemm", ("gpu01",), args=("--expect-gpus", "4"), expect_gpus=8)
    assert probe_argv("python3", user, None, ranks=None)[-4:] == ["--expect-gpus", "8", "--expect-gpus", "4"]
    script = render_batch_script(job, LaunchSettings(python="/opt/py", results_dir=tmp_path), ranks_per_node=8,
                                 gpus_per_node=8)
    srun = shlex.split(script.splitlines()[-1])
    assert srun[srun.index("--expect-gpus") + 1] == "8" and "GPU-a,GPU-b" in srun
    tool = ProbeJob("0123456789abcdef", "nccl_tests", ("gpu01",), expect_gpus=8)
    assert "--expect-gpus" not in probe_argv("python3", tool, None, ranks=None)


def _cpu_doc(expect: int | None) -> ProbeResult:
    rank = RankInfo(rank=0, local_rank=0, world_size=2, local_world_size=2, hostname="vm", node="vm", device="cpu")
    return ProbeResult(probe="gemm", outcome=Outcome.PASS, started_at=1.0, finished_at=2.0, nodes=["vm"],
                       environment=Environment(launcher="standalone", backend="gloo", device_type="cpu",
                                               python="3.11", ranks=[rank]),
                       params={} if expect is None else {"expect_gpus": expect},
                       measurements=[Measurement(name="flop_per_second", value=2e12, labels={"gpu": "1",
                                                                                             "dtype": "bf16"},
                                                 node="vm")])


def test_a_cpu_run_of_a_gpu_node_keeps_no_figure() -> None:
    guarded = cpu_on_gpu_node(_cpu_doc(1))
    assert guarded.outcome is Outcome.FAIL and guarded.measurements == []
    assert [(c.name, c.ok, c.node) for c in guarded.checks] == [("env.gpu_count", False, "vm")]
    assert guarded.params["dropped_cpu_measurements"] == 1
    assert cpu_on_gpu_node(_cpu_doc(None)) == _cpu_doc(None)  # a CPU class's run is a CPU run
