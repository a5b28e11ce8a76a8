"""InfiniBand ports through a real Prometheus (Debian's package) scraping a fake node_exporter.

The fake (``tests/fakes/node_exporter.py``: node_exporter's ``infiniband`` exposition, no HCAs) serves three
nodes of two single-port HCAs, each its own scrape target named only by ``instance`` (``host:9100``, as
node_exporter is); ``fc`` runs an older release without ``port_receive_remote_physical_errors_total``.
``healthd.passive.source.PassiveSource`` polls Prometheus's HTTP API with the default ``[passive.fabric]``
queries and each poll is handed to a real ``Judge``. Checked: ``link_downed`` of one port rising twice is an
``ib_link_down`` hint naming its device within a few polls and no recommendation; with the node's inter-node
busbw low (a flagged NCCL pair) one ``degraded`` finding naming the port; a counter cleared, a node rebooted
(its link went down once on the way), node_exporter restarting, and a saturated counter make nothing (the
saturated one: unknown, an ``error`` verdict); a missing counter is unavailable; a link trained below its
class's rate is ``degraded``. Root only, like the other Prometheus tests; skips with the reason otherwise.
About 30 s.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from healthd.config import PassiveSettings
from healthd.judge.sources.fabric import PROBE, Fabric
from healthd.passive.model import PassivePoll
from healthd.passive.source import PassiveSource
from tests.fakes.node_exporter import FakeNodeExporter
from tests.integration.alerting import prometheus_missing, start_prometheus, stop_prometheus
from tests.unit.test_judge_engine import Fleet

pytestmark = pytest.mark.slow

PROM_PORT = 9192
NODES = ("fa", "fb", "fc")
PAIRS = ("fd", "fe", "ff")
"""Nodes without node_exporter: the NCCL partners of the fleet's pairs."""


@dataclass
class Stack:
    tmp: Path
    exporter: FakeNodeExporter
    source: PassiveSource
    fleet: Fleet
    prometheus: subprocess.Popen[bytes] | None = None
    recommendations: list[tuple[str, str, str, str]] = field(default_factory=list)

    def poll(self) -> PassivePoll:
        now = time.time()
        poll = self.source.poll(NODES + PAIRS, now)
        self.fleet.t = now
        out = self.fleet.judge.observe(poll, self.fleet.nodes, now=now)
        self.recommendations += [(r.node, r.probe, r.outcome.value, r.reason_code) for r in out.recommendations]
        return poll

    def until(self, what: str, done: Callable[[PassivePoll], bool], timeout: float = 15.0) -> list[PassivePoll]:
        polls: list[PassivePoll] = []
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            polls.append(self.poll())
            if done(polls[-1]):
                return polls
            time.sleep(0.5)
        log = (self.tmp / "prometheus.log").read_text(errors="replace")[-3000:]
        raise AssertionError(f"timed out waiting for {what}; last poll {polls[-1] if polls else None}\n{log}")

    def signals(self) -> list[tuple[str, str, str, str, str]]:
        return [(t.node, t.code, t.device, t.port, t.stage()) for t in self.fleet.judge.view(Fabric, Fabric.signals)]

    def verdict(self, node: str) -> tuple[str, str] | None:
        v = self.fleet.judge.verdicts.get((node, PROBE))
        return (v.outcome.value, v.reason_code) if v is not None else None


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Stack]:
    missing = prometheus_missing()
    if missing:
        pytest.skip(missing)
    exporter = FakeNodeExporter(NODES, hcas=2, legacy=("fc",)).start()
    targets = "\n".join(f"""      - targets: ["{exporter.address}"]
        labels: {{__param_node: "{node}", instance: "{node}:9100"}}""" for node in NODES)
    (tmp_path / "prometheus.yml").write_text(f"""
global: {{scrape_interval: 1s, evaluation_interval: 1s}}
scrape_configs:
  - job_name: node
    static_configs:
{targets}
""")
    source = PassiveSource(PassiveSettings(prometheus_url=f"http://127.0.0.1:{PROM_PORT}", timeout_s=3))
    s = Stack(tmp_path, exporter, source, Fleet(list(NODES + PAIRS)))
    s.prometheus = start_prometheus(tmp_path, PROM_PORT)
    try:
        exporter.add("fb", "mlx5_0", "symbol_error", 40)  # errors from before healthd: a baseline
        yield s
    finally:
        stop_prometheus(s.prometheus)
        exporter.stop()


def covered(p: PassivePoll) -> bool:
    return p.fabric is not None and p.fabric.covered == set(NODES) and not p.fabric.failed


def test_ports_through_a_real_prometheus(stack: Stack) -> None:
    started = time.monotonic()
    ready = stack.until("every node's InfiniBand series", covered)[-1]
    assert ready.fabric is not None and ready.errors == ()
    assert dict(ready.fabric.unavailable) == {"fc": ("port_receive_remote_physical_errors",)}
    stack.poll()
    assert stack.signals() == [] and stack.recommendations == []

    # a flap on fa's mlx5_1, twice: a hint naming the port, no recommendation
    for n in (1, 2):
        stack.exporter.add("fa", "mlx5_1", "link_downed")
        stack.until(f"flap {n}", lambda p: bool(p.fabric and p.fabric.signals))
    assert stack.signals() == [("fa", "ib_link_down", "mlx5_1", "1", "hint")]
    assert stack.verdict("fa") == ("pass", "ib_link_down")
    assert stack.fleet.judge.verdicts[("fa", PROBE)].evidence["total"] == 2.0
    for _ in range(3):
        stack.poll()
    assert stack.recommendations == []

    # a cleared counter, a reboot (the link went down once on the way), node_exporter restarting, a saturated
    # counter: nothing
    stack.exporter.clear("fb", "mlx5_0")
    stack.exporter.reboot("fc", time.time())
    stack.until("fc's boot seen", lambda p: bool(p.fabric and "fc" in p.fabric.booted))
    stack.exporter.set_up("fb", False)
    stack.until("fb's exporter down", lambda p: bool(p.fabric and "fb" not in p.fabric.covered))
    stack.exporter.add("fb", "mlx5_1", "symbol_error", 65535)
    stack.exporter.set_up("fb", True)
    stack.until("fb saturated", lambda p: bool(p.fabric and p.fabric.saturated))
    for _ in range(3):
        stack.poll()
    assert stack.signals() == [("fa", "ib_link_down", "mlx5_1", "1", "hint")]
    assert stack.verdict("fb") == ("error", "ib_counter_saturated") and stack.verdict("fc") is None
    assert stack.recommendations == []

    # fa's inter-node busbw low in the same window: one degraded finding naming the port, made in the round
    # that judged the slow pair
    f = stack.fleet
    f.t = time.time()
    for _ in range(3):
        f.feed([f.nccl(("fb", "fd")), f.nccl(("fc", "fe")), f.nccl(("fa", "ff"))], advance=1.0)
    out = f.feed([f.nccl(("fb", "fd")), f.nccl(("fc", "fe")), f.nccl(("fa", "ff"), group=200e9)], advance=1.0)
    stack.recommendations += [(r.node, r.probe, r.outcome.value, r.reason_code) for r in out.recommendations]
    stack.poll()
    assert stack.verdict("fa") == ("degraded", "ib_link_down")
    assert [r for r in stack.recommendations if r[1] == PROBE] == [("fa", PROBE, "degraded", "ib_link_down")]
    v = f.judge.verdicts[("fa", PROBE)]
    assert (v.evidence["device"], v.evidence["port"]) == ("mlx5_1", "1") and "mlx5_1 port 1" in v.reason

    # a link trained below its class's rate: degraded at once
    stack.exporter.set("fc", "mlx5_0", "rate_bytes_per_second", 25e9)
    stack.until("fc's degraded link", lambda p: stack.verdict("fc") == ("degraded", "ib_link_degraded"))
    assert ("fc", "ib_link_degraded", "mlx5_0", "1", "confirmed") in stack.signals()
    assert time.monotonic() - started < 60
