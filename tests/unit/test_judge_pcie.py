"""The judge's ``pcie`` source (``healthd.judge.sources.pcie``): a link narrower than its maximum, or of a lower
generation while the GPU is busy, in two polls in a row, is ``pcie_downtrained`` (``degraded``) on that GPU; an
idle GPU's lower generation, one poll, a failed query are nothing; it ends when the link is back and survives a
restart. (Through a real Prometheus: tests/integration/test_passive_throttle_prometheus.py.)"""

from __future__ import annotations

from healthd.judge.model import JudgeState
from healthd.judge.sources.pcie import PROBE, Pcie
from healthd.passive.model import PassivePoll
from healthd.passive.pcie import PcieLink
from tests.unit.test_judge_engine import Fleet

NAMES = ["n0", "n1"]


def link(node: str, *, width: float = 16, gen: float = 5) -> PcieLink:
    return PcieLink(node, "3", f"GPU-{node}-3", width, 16, gen, 5)


def poll(fleet: Fleet, links: tuple[PcieLink, ...] | None, busy: bool = True) -> list[str]:
    table = {(lk.node, lk.gpu_uuid or ""): (busy, "") for lk in links or ()}
    out = fleet.judge.observe(PassivePoll(at=fleet.t, up=True, busy=table, pcie=links), fleet.nodes, now=fleet.t)
    fleet.t += 60
    return [r.node for r in out.recommendations]


def verdict(fleet: Fleet, node: str) -> tuple[str, str] | None:
    v = fleet.judge.verdicts.get((node, PROBE))
    return (v.outcome.value, v.reason_code) if v is not None else None


def test_narrow_or_slow_under_load_is_downtrained_after_two_polls() -> None:
    fleet = Fleet(NAMES)
    assert poll(fleet, (link("n0", width=8), link("n1", gen=1)), busy=False) == []
    assert poll(fleet, None) == [] and verdict(fleet, "n0") is None  # the query failed: nothing changes
    assert poll(fleet, (link("n0", width=8), link("n1", gen=1)), busy=False) == ["n0"]  # n1 idle: gen 1 is normal
    assert verdict(fleet, "n0") == ("degraded", "pcie_downtrained") and verdict(fleet, "n1") is None
    assert poll(fleet, (link("n0", width=8), link("n1", gen=3)), busy=True) == []
    assert poll(fleet, (link("n0", width=8), link("n1", gen=3)), busy=True) == ["n1"]
    assert "gen 3 while busy, below its gen 5 on gpu 3 (GPU-n1-3)" in fleet.judge.verdicts[("n1", PROBE)].reason
    fresh = Pcie()
    fresh.restore(fleet.judge, JudgeState(verdicts=tuple(fleet.judge.verdicts.values())))
    assert [lw.link.key for lw in fresh.findings()] == [("n0", "GPU-n0-3"), ("n1", "GPU-n1-3")]
    poll(fleet, (link("n0"), link("n1", gen=1)), busy=False)
    assert verdict(fleet, "n0") == ("pass", "ok") and verdict(fleet, "n1") == ("pass", "ok")
