"""The node check at job boundaries reads the InfiniBand ports and the PCIe links from sysfs (a FAKE tree in the
kernel's layouts, tests/fakes/sysfs.py); each document goes the daemon's way (the JSON parsed by
``healthd.parsers.healthd_json``, ``run_from_collected``, ``Judge.evaluate``) and the ``fabric`` and ``pcie``
sources judge it as they judge Prometheus polls: the increases between documents by the same tracker (resets,
saturation and reboots are nothing), ``ib_link_down`` a hint alone and ``degraded`` with the node's inter-node
busbw low, ``ib_link_degraded`` for a port below its class's rate or down after being active,
``pcie_downtrained`` for a GPU's or an HCA's width below its maximum in two documents in a row."""

from __future__ import annotations

from pathlib import Path

import probes.boundary as b
from healthd.collector import Collected
from healthd.judge.persist import run_from_collected
from healthd.judge.sources.fabric import PROBE as FABRIC
from healthd.judge.sources.pcie import PROBE as PCIE
from healthd.model import Outcome, RunKind
from healthd.parsers.healthd_json import parse_result
from tests.fakes import sysfs
from tests.unit.test_judge_engine import Fleet

NAMES = [f"n{i}" for i in range(6)]


class Boundaries:
    """Each node's FAKE sysfs tree; ``check`` runs the node check's ``links`` step on every node and feeds the
    documents to the judge."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp = tmp_path
        self.fleet = Fleet(NAMES)
        self.nodes = {n: sysfs.Node() for n in NAMES}
        self.recommendations: list[tuple[str, str, str, str]] = []
        self.k = 0
        self.written: dict[Path, str] = {}

    def document(self, name: str) -> Collected:
        self.k += 1
        root = self.tmp / name
        sys_root = sysfs.write(root, self.nodes[name], self.written)
        s = b.Setup(context="epilog", node=name, job_id=self.k, job_uid=1000, expect_gpus=8, expect_uuids=(),
                    proc_root=root / "proc", sys_root=sys_root)
        f = b.Findings()
        b.check_links(s, b.Budget(5.0), f, None)
        run_id = b.document_name(name, "epilog", self.k, self.fleet.t)
        doc = b.result_of(s, f, b.Budget(5.0), run_id=run_id, started_at=self.fleet.t - 1)
        result = parse_result(doc.model_copy(update={"finished_at": self.fleet.t}).to_json())
        return Collected(run_id, "boundary", (name,), result.outcome, result.reason, result, RunKind.BOUNDARY)

    def check(self, *, advance: float = 60.0) -> None:
        runs = [run_from_collected(self.document(n), self.fleet.t) for n in NAMES]
        assert all(r.outcome is Outcome.PASS for r in runs)
        out = self.fleet.feed(runs, advance=advance)
        self.recommendations += [(r.node, r.probe, r.outcome.value, r.reason_code) for r in out.recommendations]

    def verdict(self, node: str, probe: str = FABRIC) -> tuple[str, str] | None:
        v = self.fleet.judge.verdicts.get((node, probe))
        return (v.outcome.value, v.reason_code) if v is not None else None

    def unhealthy(self, probe: str = FABRIC) -> list[str]:
        return [n for n in NAMES if self.verdict(n, probe) not in (None, ("pass", "ok"))]


def test_a_flap_between_documents_is_a_hint_and_with_low_busbw_one_degraded_finding(tmp_path: Path) -> None:
    bd = Boundaries(tmp_path)
    bd.nodes["n1"].ports["mlx5_3"].counters["link_downed"] = 4  # before healthd's first document: a baseline
    bd.check()
    assert bd.unhealthy() == [] and bd.recommendations == []
    bd.nodes["n1"].ports["mlx5_3"].counters["link_downed"] = 5
    bd.check()
    bd.nodes["n1"].ports["mlx5_3"].counters["link_downed"] = 6
    bd.check()
    assert bd.verdict("n1") == ("pass", "ib_link_down") and bd.unhealthy() == ["n1"]
    v = bd.fleet.judge.verdicts[("n1", FABRIC)]
    assert v.evidence["device"] == "mlx5_3" and v.evidence["port"] == "1" and "port hint" in v.reason
    assert bd.recommendations == []  # a flap alone never drains
    f = bd.fleet
    for _ in range(3):
        f.feed([f.nccl(("n0", "n2")), f.nccl(("n3", "n4")), f.nccl(("n1", "n5"))], advance=60.0)
    f.feed([f.nccl(("n0", "n2")), f.nccl(("n3", "n4")), f.nccl(("n1", "n5"), group=200e9)], advance=60.0)
    bd.check()
    v = f.judge.verdicts[("n1", FABRIC)]
    assert (v.outcome, v.reason_code) == (Outcome.DEGRADED, "ib_link_down")
    assert "inter-node bandwidth low" in v.reason and "mlx5_3 port 1" in v.reason
    assert bd.recommendations == [("n1", FABRIC, "degraded", "ib_link_down")]


def test_a_link_below_its_class_or_down_after_being_active_is_degraded(tmp_path: Path) -> None:
    bd = Boundaries(tmp_path)
    bd.nodes["n5"].ports["mlx5_10"] = sysfs.Port(state=1, phys=3, rate="10 Gb/sec (4X SDR)")  # never cabled
    bd.check()
    bd.nodes["n2"].ports["mlx5_4"].rate = "200 Gb/sec (4X HDR)"
    bd.nodes["n3"].ports["mlx5_0"] = sysfs.Port(state=1, phys=2, rate="10 Gb/sec (4X SDR)")
    bd.check()
    assert bd.unhealthy() == ["n2", "n3"]  # n5's port was never active: nothing
    assert bd.verdict("n2") == ("degraded", "ib_link_degraded") and bd.verdict("n3") == ("degraded", "ib_link_degraded")
    assert "mlx5_4 port 1 trained at 200 Gb/s, below its class's 400 Gb/s" in bd.fleet.judge.verdicts[
        ("n2", FABRIC)].reason
    assert "mlx5_0 port 1 is down (physical state Polling)" in bd.fleet.judge.verdicts[("n3", FABRIC)].reason
    assert sorted(bd.recommendations) == [("n2", FABRIC, "degraded", "ib_link_degraded"),
                                          ("n3", FABRIC, "degraded", "ib_link_degraded")]
    bd.nodes["n2"].ports["mlx5_4"].rate = "400 Gb/sec (4X NDR)"
    bd.nodes["n3"].ports["mlx5_0"] = sysfs.Port()
    bd.check()
    assert bd.unhealthy() == [] and bd.verdict("n2") == ("pass", "ok")


def test_resets_reboots_and_saturation_make_no_finding(tmp_path: Path) -> None:
    bd = Boundaries(tmp_path)
    bd.nodes["n2"].ports["mlx5_5"].counters["symbol_error"] = 40
    bd.check()
    bd.nodes["n2"].ports["mlx5_5"].counters["symbol_error"] = 2  # cleared (perfquery -R): a reset
    bd.nodes["n3"] = sysfs.Node(btime=1_764_400_000)  # rebooted: its links went down and came up again
    bd.nodes["n3"].ports["mlx5_6"].counters["link_downed"] = 1
    bd.check()
    assert bd.unhealthy() == [] and bd.recommendations == []
    bd.nodes["n4"].ports["mlx5_9"].counters["symbol_error"] = 65535
    bd.check()
    bd.check()
    assert bd.verdict("n4") == ("error", "ib_counter_saturated")  # unknown, not healthy; never drains
    assert bd.unhealthy() == ["n4"] and bd.recommendations == []


def test_a_gpu_or_hca_link_narrower_than_its_maximum_is_pcie_downtrained(tmp_path: Path) -> None:
    bd = Boundaries(tmp_path)
    bd.check()
    bd.nodes["n1"].gpus[5] = sysfs.Link(width=8, speed="2.5 GT/s PCIe")
    bd.nodes["n4"].hcas[2] = sysfs.Link(width=8)
    bd.check()
    assert bd.unhealthy(PCIE) == [] and bd.recommendations == []  # one document: not yet
    bd.check()
    assert bd.verdict("n1", PCIE) == ("degraded", "pcie_downtrained")
    assert bd.verdict("n4", PCIE) == ("degraded", "pcie_downtrained")
    assert bd.fleet.judge.verdicts[("n1", PCIE)].reason.startswith("PCIe link x8, below its x16 on gpu 5")
    assert bd.fleet.judge.verdicts[("n4", PCIE)].reason.startswith("PCIe link x8, below its x16 on HCA mlx5_4")
    assert bd.unhealthy(PCIE) == ["n1", "n4"]  # idle GPUs at gen 1: not judged at a boundary
    assert sorted(bd.recommendations) == [("n1", PCIE, "degraded", "pcie_downtrained"),
                                          ("n4", PCIE, "degraded", "pcie_downtrained")]
    bd.nodes["n1"].gpus[5] = sysfs.Link(speed="2.5 GT/s PCIe")
    bd.check()
    assert bd.verdict("n1", PCIE) == ("pass", "ok")
