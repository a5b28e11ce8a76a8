"""Throttling that matters and PCIe links trained down, through a real Prometheus (Debian's package)
scraping a fake dcgm-exporter.

The fake (``tests/fakes/dcgm_exporter.py``) serves two nodes of two GPUs: ``ta`` with the profiling field
``DCGM_FI_PROF_GR_ENGINE_ACTIVE`` (DCGM's profiling module on), ``tb`` without (its activity read from
``DCGM_FI_DEV_GPU_UTIL``). ``PassiveSource`` polls Prometheus with the default queries and each poll is handed
to a real ``Judge`` (``[judge.passive] throttle_sustain_s`` shortened to 4 s). Checked: a power brake held on a
busy GPU is ``degraded`` on that GPU (``throttle_power_brake``, its UUID) only once held ``throttle_sustain_s``,
and ends with the brake; a hardware slowdown on a busy GPU without profiling the same (``throttle_hw_slowdown``);
a brake on an idle GPU only the passive source's hint; a software power cap on a busy GPU nothing. PCIe: a
link narrower than its maximum is ``pcie_downtrained`` whatever the load, a lower generation only on a busy GPU
(an idle GPU's link at gen 1 is normal). Root only,
like the other Prometheus tests; skips with the reason otherwise. About 25 s.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from healthd.config import JudgeSettings, PassiveSettings
from healthd.judge.sources.throttle import PROBE
from healthd.passive.model import PassivePoll
from healthd.passive.source import PassiveSource
from tests.fakes.dcgm_exporter import FakeDcgmExporter, fake_uuid
from tests.integration.alerting import prometheus_missing, start_prometheus, stop_prometheus
from tests.unit.test_judge_engine import Fleet

pytestmark = pytest.mark.slow

PROM_PORT = 9193
NODES = ("ta", "tb")
SUSTAIN_S = 4.0
REASONS = "DCGM_FI_DEV_CLOCKS_EVENT_REASONS"


@dataclass
class Stack:
    tmp: Path
    exporter: FakeDcgmExporter
    source: PassiveSource
    fleet: Fleet
    prometheus: subprocess.Popen[bytes] | None = None
    recommendations: list[tuple[str, str, str, str, object]] = field(default_factory=list)

    def poll(self) -> PassivePoll:
        now = time.time()
        poll = self.source.poll(NODES, now)
        out = self.fleet.judge.observe(poll, self.fleet.nodes, now=now)
        self.recommendations += [(r.node, r.probe, r.outcome.value, r.reason_code, r.evidence.get("gpu_uuid"))
                                 for r in out.recommendations]
        return poll

    def until(self, what: str, done: Callable[[], bool], timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            last = self.poll()
            if done():
                return
            time.sleep(0.5)
        log = (self.tmp / "prometheus.log").read_text(errors="replace")[-3000:]
        raise AssertionError(f"timed out waiting for {what}; last poll {last}\n{log}")

    def verdict(self, node: str, probe: str = PROBE) -> tuple[str, str] | None:
        v = self.fleet.judge.verdicts.get((node, probe))
        return (v.outcome.value, v.reason_code) if v is not None else None


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Stack]:
    missing = prometheus_missing()
    if missing:
        pytest.skip(missing)
    exporter = FakeDcgmExporter(NODES, gpus=2, profiling=["ta"], pcie=True).start()
    targets = "\n".join(f"""      - targets: ["{exporter.address}"]
        labels: {{__param_node: "{node}", instance: "{node}:9400"}}""" for node in NODES)
    (tmp_path / "prometheus.yml").write_text(f"""
global: {{scrape_interval: 1s, evaluation_interval: 1s}}
scrape_configs:
  - job_name: dcgm-exporter
    static_configs:
{targets}
""")
    settings = PassiveSettings(prometheus_url=f"http://127.0.0.1:{PROM_PORT}", timeout_s=3,
                               fabric={"enabled": False})
    fleet = Fleet(list(NODES), JudgeSettings(passive={"throttle_sustain_s": SUSTAIN_S}))
    s = Stack(tmp_path, exporter, PassiveSource(settings), fleet)
    s.prometheus = start_prometheus(tmp_path, PROM_PORT)
    try:
        yield s
    finally:
        stop_prometheus(s.prometheus)
        exporter.stop()


def test_a_brake_held_on_a_busy_gpu_is_degraded_and_idle_or_power_cap_is_not(stack: Stack) -> None:
    e = stack.exporter
    stack.until("both nodes' activity", lambda: stack.poll().busy is not None and
                {n for n, _ in (stack.poll().busy or {})} == set(NODES))
    e.set("ta", 0, "DCGM_FI_PROF_GR_ENGINE_ACTIVE", 0.93)
    e.set("ta", 0, REASONS, 0x80 | 0x8)   # HW power brake (with its HW slowdown bit), busy
    e.set("ta", 1, "DCGM_FI_PROF_GR_ENGINE_ACTIVE", 0.05)
    e.set("ta", 1, REASONS, 0x80 | 0x8)   # the same brake on an idle GPU
    e.set("tb", 0, "DCGM_FI_DEV_GPU_UTIL", 97)
    e.set("tb", 0, REASONS, 0x4)          # software power cap, busy: normal operation
    e.set("tb", 1, "DCGM_FI_DEV_GPU_UTIL", 88)
    e.set("tb", 1, REASONS, 0x8)          # HW slowdown, busy, no profiling
    for node, gpu in (("ta", 0), ("tb", 0)):
        e.set(node, gpu, "DCGM_FI_DEV_PCIE_LINK_GEN", 5)  # busy at full speed
    e.set("tb", 1, "DCGM_FI_DEV_PCIE_LINK_GEN", 3)       # busy at gen 3 of 5: downtrained
    e.set("ta", 1, "DCGM_FI_DEV_PCIE_LINK_WIDTH", 8)     # idle (gen 1: normal) but x8 of x16: downtrained
    stack.until("the passive hints", lambda: stack.verdict("ta", "passive") is not None
                and stack.verdict("tb", "passive") is not None)
    seen = time.time()
    assert stack.verdict("ta") is None and stack.verdict("tb") is None  # not held yet
    stack.until("the brake held on ta's busy GPU",
                lambda: stack.verdict("ta") == ("degraded", "throttle_power_brake"))
    assert time.time() - seen >= SUSTAIN_S - 1.5  # the first poll that saw it is up to a scrape late
    stack.until("the slowdown held on tb's busy GPU",
                lambda: stack.verdict("tb") == ("degraded", "throttle_hw_slowdown"))
    v = stack.fleet.judge.verdicts[("ta", PROBE)]
    assert v.evidence["gpu"] == "0" and v.evidence["gpu_uuid"] == fake_uuid("ta", 0)
    assert "graphics engine active 0.93" in v.reason
    assert "utilisation 88%" in stack.fleet.judge.verdicts[("tb", PROBE)].reason
    recs = {(r[0], r[3], r[4]) for r in stack.recommendations if r[1] == PROBE}
    assert recs == {("ta", "throttle_power_brake", fake_uuid("ta", 0)),
                    ("tb", "throttle_hw_slowdown", fake_uuid("tb", 1))}
    # the idle GPU's brake: the passive source's hint, no more; the power cap: no signal at all
    assert stack.verdict("ta", "passive") == ("pass", "throttle_power_brake")
    assert stack.verdict("tb", "passive") == ("pass", "throttle_hw_slowdown")

    e.set("ta", 0, REASONS, 0x1)
    stack.until("ta's brake released", lambda: stack.verdict("ta") == ("pass", "ok"))

    pcie = {n: stack.fleet.judge.verdicts[(n, "pcie")] for n in NODES}
    assert {n: (v.outcome.value, v.reason_code) for n, v in pcie.items()} == {
        "ta": ("degraded", "pcie_downtrained"), "tb": ("degraded", "pcie_downtrained")}
    assert pcie["ta"].reason.startswith(f"PCIe link x8, below its x16 on gpu 1 ({fake_uuid('ta', 1)})")
    assert pcie["tb"].reason.startswith(f"PCIe gen 3 while busy, below its gen 5 on gpu 1 ({fake_uuid('tb', 1)})")
    e.set("ta", 1, "DCGM_FI_DEV_PCIE_LINK_WIDTH", 16)
    stack.until("ta's link back at x16", lambda: stack.verdict("ta", "pcie") == ("pass", "ok"))
