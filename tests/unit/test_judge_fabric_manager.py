"""Fabric Manager on NVSwitch systems: the daemon marks the nodes of a class with ``nvswitch = true`` in their
expectation file, the node check at job boundaries reports each GPU's fabric state and status
(tests/probes/test_boundary.py), and the judge's ``boundary`` source makes a GPU whose fabric is not
completed with success a ``fail`` (``fabric_manager``), confirmed by the next boundary document."""

from __future__ import annotations

from pathlib import Path

import probes.boundary as b
from healthd.boundary import write_expectations
from healthd.config import NodeClassRule, Settings
from healthd.judge.model import MeasurementInput, RunInput
from healthd.model import Node, Outcome, RunKind
from tests.unit.test_judge_engine import Fleet


def boundary(fleet: Fleet, node: str, k: int, *, state: float = 3.0, status: float = 0.0, gpu: int = 5) -> RunInput:
    ms = tuple(MeasurementInput(name, value if g == gpu else ok, {"gpu": str(g)}, node) for g in range(8)
               for name, value, ok in (("fabric_state", state, 3.0), ("fabric_status", status, 0.0)))
    return RunInput(f"boundary-{node}-prolog-{k}-1", "boundary", (node,), Outcome.PASS, "", fleet.t, ms,
                    kind=RunKind.BOUNDARY)


def test_a_fabric_not_completed_is_a_fail_on_its_gpu_and_a_healthy_one_passes() -> None:
    fleet = Fleet([f"n{i}" for i in range(8)])
    fleet.healthy_gemm_rounds()
    first = fleet.feed([boundary(fleet, "n3", 1, state=1.0), boundary(fleet, "n4", 1),
                        boundary(fleet, "n5", 1, status=6.0, gpu=0)], advance=60)
    assert first.recommendations == []  # one document: a re-probe first
    out = fleet.feed([boundary(fleet, "n3", 2, state=1.0), boundary(fleet, "n4", 2),
                      boundary(fleet, "n5", 2, status=6.0, gpu=0)], advance=60)
    assert sorted((r.node, r.probe, r.outcome.value, r.reason_code) for r in out.recommendations) == [
        ("n3", "boundary", "fail", "fabric_manager"), ("n5", "boundary", "fail", "fabric_manager")]
    v = fleet.judge.verdicts[("n3", "boundary")]
    assert v.outcome is Outcome.FAIL and v.reason.startswith("gpu 5: fabric not started, status 0")
    assert fleet.judge.verdicts[("n5", "boundary")].reason.startswith("gpu 0: fabric completed, status 6")
    assert fleet.judge.verdicts[("n4", "boundary")].outcome is Outcome.PASS


def test_only_an_nvswitch_class_is_told_to_read_its_fabric(tmp_path: Path) -> None:
    settings = Settings(slurm={"node_classes": [{"name": "hgx", "gpus": 8, "nvswitch": True},
                                                {"name": "pcie", "gpus": 4}]})
    assert [r.nvswitch for r in settings.slurm.node_classes] == [True, False]
    assert NodeClassRule(name="x").nvswitch is False
    nodes = [Node(name="h1", state="idle", gpus=8, node_class="hgx"), Node(name="p1", state="idle", gpus=4,
                                                                            node_class="pcie")]
    write_expectations(tmp_path, nodes, {}, nvswitch={r.name for r in settings.slurm.node_classes if r.nvswitch})
    assert b.read_expectation_file(tmp_path / "expect" / "h1.json") == (8, (), True)
    assert b.read_expectation_file(tmp_path / "expect" / "p1.json") == (4, (), False)
    assert "nvswitch" not in (tmp_path / "expect" / "p1.json").read_text()
    opts = b.options(["--context", "prolog", "--results-dir", str(tmp_path)], {"SLURMD_NODENAME": "h1"})
    assert opts.setup.nvswitch and opts.setup.expect_gpus == 8
    opts = b.options(["--context", "prolog", "--results-dir", str(tmp_path), "--expect-gpus", "8"],
                     {"SLURMD_NODENAME": "h1"})
    assert opts.setup.nvswitch  # --expect-gpus given: the file still says what the node is
