"""A finding of the node check at a job boundary asks for a re-probe: the planner cannot run ``boundary`` (Slurm
runs it at job ends), so the node's single-node probes run instead, and any judged run of the node answers it."""

from __future__ import annotations

from healthd.config import ProbeSettings
from healthd.judge.model import CheckInput, RunInput
from healthd.model import Outcome, RunKind
from tests.unit.test_judge_engine import Fleet

PROBES = {"gemm": ProbeSettings(), "nccl": ProbeSettings(nodes_per_job=2), "ddp": ProbeSettings(enabled=False)}


def test_a_boundary_finding_is_re_probed_by_the_nodes_single_node_probes() -> None:
    fleet = Fleet([f"n{i}" for i in range(8)])
    fleet.healthy_gemm_rounds()
    check = RunInput("boundary-n3-epilog-1", "boundary", ("n3",), Outcome.FAIL, "gpu.leftover_processes", fleet.t,
                     (), (CheckInput("gpu.leftover_processes", "pid 4242 holds 20 GiB on gpu 2", "n3", 2),),
                     kind=RunKind.BOUNDARY)
    out = fleet.feed([check], advance=60)
    assert [(r.probe, r.nodes) for r in out.requests] == [("boundary", ("n3",))]
    asked = fleet.judge.requests(fleet.t, PROBES)
    assert [(r.probe, r.nodes, r.reason.split(":")[0]) for r in asked] == [("gemm", ("n3",), "reprobe")]
    out = fleet.feed([fleet.gemm("n3", priority=True)])
    assert ("n3", "boundary") in out.satisfied and fleet.judge.requests(fleet.t, PROBES) == []
