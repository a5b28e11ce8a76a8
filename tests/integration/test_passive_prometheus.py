"""The passive source against a real Prometheus (Debian's package) scraping a fake dcgm-exporter.

The fake (``tests/fakes/dcgm_exporter.py``: dcgm-exporter's exposition, no GPUs) serves three nodes of two
GPUs, each as its own scrape target: ``pa`` labelled ``Hostname`` (dcgm-exporter up to 4.8), ``pb``
``hostname`` (newer), ``pc`` with no host label (``--no-hostname``: only the target's ``instance``) and
``DCGM_EXP_XID_ERRORS_COUNT`` (the default query asks for both XID series with ``or``).
Prometheus scrapes every second; ``healthd.passive.source.PassiveSource`` polls Prometheus's HTTP API (healthd
talks only to the real Prometheus). Checked: an XID present before healthd's first poll is nothing; XID 79 on
one GPU is one fault signal naming node, GPU and UUID, once; XID 13 is the application's (ignored); the same
XID twice is two events where the count series exist; a row-remap failure holds; Prometheus stopped is ``up``
False with the error, and the source is back when Prometheus is. Root only, like the alert tests
(``scripts/test.sh`` runs the integration suites as root); skips with the reason otherwise. About 20 s.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from healthd.config import PassiveSettings
from healthd.passive.model import PassivePoll, Strength
from healthd.passive.source import PassiveSource
from tests.fakes.dcgm_exporter import FakeDcgmExporter, fake_uuid
from tests.integration.alerting import prometheus_missing, start_prometheus, stop_prometheus

pytestmark = pytest.mark.slow

PROM_PORT = 9190
NODES = ("pa", "pb", "pc")


@dataclass
class Stack:
    tmp: Path
    exporter: FakeDcgmExporter
    source: PassiveSource
    prometheus: subprocess.Popen[bytes] | None = None

    def start_prometheus(self) -> None:
        self.prometheus = start_prometheus(self.tmp, PROM_PORT)

    def stop_prometheus(self) -> None:
        if self.prometheus is not None:
            stop_prometheus(self.prometheus)
        self.prometheus = None

    def poll(self) -> PassivePoll:
        return self.source.poll(NODES, time.time())

    def until(self, what: str, done: Callable[[PassivePoll], bool], timeout: float = 15.0) -> list[PassivePoll]:
        """Poll every 0.5 s until ``done``; every poll made (the last one satisfies it)."""
        polls: list[PassivePoll] = []
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            polls.append(self.poll())
            if done(polls[-1]):
                return polls
            time.sleep(0.5)
        log = (self.tmp / "prometheus.log").read_text(errors="replace")[-3000:]
        raise AssertionError(f"timed out waiting for {what}; last poll {polls[-1] if polls else None}\n{log}")


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Stack]:
    missing = prometheus_missing()
    if missing:
        pytest.skip(missing)
    exporter = FakeDcgmExporter(NODES, gpus=2, xid_count=["pc"]).start()
    exporter.set_host_label("pb", "hostname")
    exporter.set_host_label("pc", None)
    targets = "\n".join(f"""      - targets: ["{exporter.address}"]
        labels: {{__param_node: "{node}", instance: "{node}:9400"}}""" for node in NODES)
    (tmp_path / "prometheus.yml").write_text(f"""
global: {{scrape_interval: 1s, evaluation_interval: 1s}}
scrape_configs:
  - job_name: dcgm-exporter
    static_configs:
{targets}
""")
    source = PassiveSource(PassiveSettings(prometheus_url=f"http://127.0.0.1:{PROM_PORT}", timeout_s=3))
    s = Stack(tmp_path, exporter, source)
    try:
        exporter.xid("pa", 1, 48)  # last week's XID: the gauge keeps it forever
        s.start_prometheus()
        yield s
    finally:
        s.stop_prometheus()
        exporter.stop()


def faults(poll: PassivePoll) -> list[tuple[str, str | None, str | None, str]]:
    return [(x.node, x.gpu, x.gpu_uuid, x.code) for x in poll.signals if x.strength is Strength.FAULT]


def test_xids_levels_and_an_outage_through_a_real_prometheus(stack: Stack) -> None:
    started = time.monotonic()
    polls = stack.until("every node's series in Prometheus", lambda p: p.up and p.covered == set(NODES))
    assert all(faults(p) == [] for p in polls), "a stale XID at start fired"
    ready = polls[-1]
    assert ready.unknown_series == 0 and ready.errors == ()
    assert "health" in ready.unavailable and "xid" not in ready.unavailable
    assert stack.poll().signals == ()

    stack.exporter.xid("pb", 1, 79)  # pb: labelled hostname
    seen = stack.until("xid 79", lambda p: bool(p.signals))
    assert faults(seen[-1]) == [("pb", "1", fake_uuid("pb", 1), "xid_79")]
    (fired,) = seen[-1].signals
    assert fired.kind == "event" and fired.detail.startswith("xid 79 (GPU has fallen off the bus) on gpu 1 (GPU-")
    assert stack.poll().signals == () and stack.poll().signals == ()  # once

    stack.exporter.xid("pc", 0, 13)  # pc: no host label, named by its instance; its XID count series too
    seen = stack.until("xid 13", lambda p: bool(p.signals))
    assert [(x.node, x.code, x.strength) for x in seen[-1].signals] == [("pc", "xid_13", Strength.IGNORED)]
    for n in (1, 2):  # the same XID twice: the gauge cannot tell, the count series can
        stack.exporter.xid("pc", 1, 79)
        seen = stack.until(f"xid 79 number {n} on pc", lambda p: bool(p.signals))
        assert faults(seen[-1]) == [("pc", "1", fake_uuid("pc", 1), "xid_79")]
        assert "more in the exporter's window" in seen[-1].signals[0].detail

    stack.exporter.set("pa", 0, "DCGM_FI_DEV_ROW_REMAP_FAILURE", 1)  # pa: labelled Hostname
    seen = stack.until("row remap failure", lambda p: bool(p.signals))
    assert faults(seen[-1]) == [("pa", "0", fake_uuid("pa", 0), "row_remap_failure")]
    time.sleep(1.0)
    assert faults(stack.poll()) == [("pa", "0", fake_uuid("pa", 0), "row_remap_failure")]  # a level: again
    stack.exporter.set("pa", 0, "DCGM_FI_DEV_ROW_REMAP_FAILURE", 0)
    stack.until("the remap failure gone", lambda p: p.signals == ())

    stack.stop_prometheus()
    down = stack.poll()
    assert not down.up and down.signals == ()
    assert down.errors[0].startswith(f"xid: cannot reach http://127.0.0.1:{PROM_PORT}")
    stack.start_prometheus()
    back = stack.until("Prometheus back", lambda p: p.up and p.covered == set(NODES))
    assert all(p.signals == () for p in back), "an event fired after the outage"
    assert time.monotonic() - started < 40
