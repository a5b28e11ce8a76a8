"""The InfiniBand port counters as increases (``healthd.passive.fabric``) and the judge's ``fabric`` source
(``healthd.judge.sources.fabric``): a flap or port errors alone are a hint; with the node's inter-node busbw
low in the window one ``degraded`` finding naming the port; a link below its class's rate ``degraded``;
resets, exporter restarts, boots and saturated counters are nothing (saturated: unknown, an ``error``)."""

from __future__ import annotations

from healthd.judge.model import JudgeState
from healthd.judge.sources.fabric import PROBE, Fabric, class_rates
from healthd.model import Outcome
from healthd.passive.fabric import FabricAnswers, FabricTracker
from healthd.passive.model import PassivePoll
from healthd.passive.names import Located
from tests.unit.test_judge_engine import Fleet

NDR = 50e9
HDR = 25e9


def counter(node: str, name: str, value: float, device: str = "mlx5_0", port: str = "1") -> Located:
    return Located(node, None, None, {"__name__": f"node_infiniband_{name}_total", "device": device, "port": port,
                                      "instance": f"{node}:9100"}, value)


def present(*nodes: str, lacking: tuple[str, ...] = ()) -> list[Located]:
    names = ("link_downed", "symbol_error", "port_errors_received", "port_receive_remote_physical_errors",
             "link_error_recovery")
    return [Located(n, None, None, {"counter": c, "instance": f"{n}:9100"}, 2.0) for n in nodes for c in names
            if c not in lacking]


def link(node: str, rate: float = NDR, device: str = "mlx5_0", port: str = "1") -> Located:
    return Located(node, None, None, {"device": device, "port": port, "instance": f"{node}:9100"}, rate)


def boot(node: str, at: float) -> Located:
    return Located(node, None, None, {"instance": f"{node}:9100"}, at)


def answers(nodes: tuple[str, ...], counters: list[Located], *, rates: dict[str, float] | None = None,
            boots: dict[str, float] | None = None) -> FabricAnswers:
    return FabricAnswers(counters, present(*nodes), [link(n, (rates or {}).get(n, NDR)) for n in nodes], None,
                         [boot(n, (boots or {}).get(n, 1000.0)) for n in nodes])


def test_increases_survive_resets_restarts_and_boots_and_saturation_is_unknown() -> None:
    t = FabricTracker()
    nodes = ("a", "b")
    first = t.observe(answers(nodes, [counter("a", "symbol_error", 7)]), 100.0)
    assert first.signals == () and first.covered == {"a", "b"}  # a value at first sight is a baseline
    rose = t.observe(answers(nodes, [counter("a", "symbol_error", 19), counter("b", "link_downed", 1)]), 160.0)
    assert [(s.node, s.code, s.increase, s.device, s.port) for s in rose.signals] == [
        ("a", "ib_symbol_errors", 12.0, "mlx5_0", "1"), ("b", "ib_link_down", 1.0, "mlx5_0", "1")]
    assert "(7 → 19)" in rose.signals[0].detail
    reset = t.observe(answers(nodes, [counter("a", "symbol_error", 3), counter("b", "link_downed", 1)]), 220.0)
    assert reset.signals == ()  # 19 → 3: a reset, 3 the new reference
    # node_exporter of b restarting: b answers nothing this poll; its references are kept
    gone = t.observe(FabricAnswers([counter("a", "symbol_error", 3)], present("a"), [link("a")], None,
                                   [boot("a", 1000.0)]), 280.0)
    assert gone.signals == () and gone.covered == {"a"}
    back = t.observe(answers(nodes, [counter("a", "symbol_error", 3), counter("b", "link_downed", 2)]), 340.0)
    assert [(s.node, s.code, s.increase) for s in back.signals] == [("b", "ib_link_down", 1.0)]
    # cleared to 0 (absent from the "> 0" answer while b answered), then a rise from 0 counts
    t.observe(answers(nodes, [counter("a", "symbol_error", 3)]), 400.0)
    again = t.observe(answers(nodes, [counter("a", "symbol_error", 3), counter("b", "link_downed", 1)]), 460.0)
    assert [(s.node, s.code, s.increase) for s in again.signals] == [("b", "ib_link_down", 1.0)]
    # b booted: its link went down and up with the boot, no flap
    booted = t.observe(answers(nodes, [counter("a", "symbol_error", 3), counter("b", "link_downed", 2)],
                               boots={"b": 5000.0}), 520.0)
    assert booted.signals == () and booted.booted == {"b"}
    # saturation: 65535 symbol errors, 255 link-downed: unknown, never an increase
    sat = t.observe(answers(nodes, [counter("a", "symbol_error", 65535), counter("b", "link_downed", 255)],
                            boots={"b": 5000.0}), 580.0)
    assert sat.signals == ()
    assert sat.saturated == (("a", "mlx5_0", "1", "symbol_error"), ("b", "mlx5_0", "1", "link_downed"))
    still = t.observe(answers(nodes, [counter("a", "symbol_error", 65535)], boots={"b": 5000.0}), 640.0)
    assert still.signals == () and still.saturated == (("a", "mlx5_0", "1", "symbol_error"),)


def test_a_counter_an_older_node_exporter_lacks_is_unavailable() -> None:
    t = FabricTracker()
    poll = t.observe(FabricAnswers([], present("a") + present("b", lacking=("port_receive_remote_physical_errors",)),
                                   [link("a"), link("b")], None, None), 1.0)
    assert poll.unavailable == {"b": ("port_receive_remote_physical_errors",)}
    failed = t.observe(FabricAnswers(None, None, [link("a")]), 2.0)
    assert failed.failed == ("counters", "present") and failed.signals == ()


def test_the_class_rate_is_the_most_common() -> None:
    assert class_rates([("x", NDR), ("x", NDR), ("x", HDR), ("y", HDR)]) == {"x": NDR, "y": HDR}


NAMES = [f"n{i}" for i in range(6)]


class Feed:
    """A ``Fleet`` and a tracker: each ``poll`` is the fabric part of a passive poll handed to the judge."""

    def __init__(self) -> None:
        self.fleet = Fleet(NAMES)
        self.tracker = FabricTracker()
        self.recommendations: list[tuple[str, str, str, str]] = []

    def poll(self, counters: list[Located], *, rates: dict[str, float] | None = None,
             boots: dict[str, float] | None = None) -> None:
        f = self.fleet
        fabric = self.tracker.observe(answers(tuple(NAMES), counters, rates=rates, boots=boots), f.t)
        out = f.judge.observe(PassivePoll(at=f.t, up=True, covered=frozenset(NAMES), fabric=fabric), f.nodes,
                              now=f.t)
        self.recommendations += [(r.node, r.probe, r.outcome.value, r.reason_code) for r in out.recommendations]
        f.t += 60.0

    def verdict(self, node: str) -> tuple[str, str] | None:
        v = self.fleet.judge.verdicts.get((node, PROBE))
        return (v.outcome.value, v.reason_code) if v is not None else None


def signals(feed: Feed) -> list[tuple[str, str, str, str, str]]:
    return [(t.node, t.code, t.device, t.port, t.stage()) for t in feed.fleet.judge.view(Fabric, Fabric.signals)]


def test_a_flap_alone_is_a_hint_and_with_low_busbw_one_degraded_finding_naming_the_port() -> None:
    feed = Feed()
    feed.poll([])
    feed.poll([counter("n1", "link_downed", 1, "mlx5_3", "1")])
    feed.poll([counter("n1", "link_downed", 2, "mlx5_3", "1")])
    assert feed.verdict("n1") == ("pass", "ib_link_down")
    assert signals(feed) == [("n1", "ib_link_down", "mlx5_3", "1", "hint")]
    assert feed.recommendations == []
    # the node's inter-node busbw low: an NCCL pair with n1 flagged (n2..n5 pairs healthy)
    f = feed.fleet
    for _ in range(3):
        f.feed([f.nccl(("n0", "n2")), f.nccl(("n3", "n4")), f.nccl(("n1", "n5"))], advance=60.0)
    f.feed([f.nccl(("n0", "n2")), f.nccl(("n3", "n4")), f.nccl(("n1", "n5"), group=200e9)], advance=60.0)
    feed.poll([counter("n1", "link_downed", 2, "mlx5_3", "1")])
    v = f.judge.verdicts[("n1", PROBE)]
    assert (v.outcome, v.reason_code) == (Outcome.DEGRADED, "ib_link_down")
    assert v.evidence["device"] == "mlx5_3" and v.evidence["port"] == "1"
    assert "inter-node bandwidth low" in v.reason and "mlx5_3 port 1" in v.reason
    assert signals(feed) == [("n1", "ib_link_down", "mlx5_3", "1", "confirmed")]
    assert [n for n in NAMES if feed.verdict(n) not in (None, ("pass", "ok"))] == ["n1"]


def test_a_degraded_link_is_degraded_and_ends_when_the_rate_is_back() -> None:
    feed = Feed()
    feed.poll([])
    feed.poll([], rates={"n4": HDR})
    assert feed.verdict("n4") == ("degraded", "ib_link_degraded")
    assert feed.recommendations == [("n4", PROBE, "degraded", "ib_link_degraded")]
    assert "trained at 200 Gb/s, below its class's 400 Gb/s" in feed.fleet.judge.verdicts[("n4", PROBE)].reason
    feed.poll([])
    assert feed.verdict("n4") == ("pass", "ok") and signals(feed) == []


def test_resets_boots_and_saturation_make_no_finding() -> None:
    feed = Feed()
    feed.poll([counter("n2", "symbol_error", 40), counter("n3", "link_downed", 3)])
    feed.poll([counter("n2", "symbol_error", 2), counter("n3", "link_downed", 4)], boots={"n3": 9000.0})
    assert signals(feed) == [] and feed.recommendations == []
    feed.poll([counter("n2", "symbol_error", 65535), counter("n3", "link_downed", 4)], boots={"n3": 9000.0})
    assert signals(feed) == [] and feed.recommendations == []
    assert feed.verdict("n2") == ("error", "ib_counter_saturated")  # unknown, not healthy; never drains


def test_a_port_finding_survives_a_restart() -> None:
    feed = Feed()
    feed.poll([])
    feed.poll([], rates={"n4": HDR})
    fresh = Fabric()
    fresh.restore(feed.fleet.judge, JudgeState(verdicts=tuple(feed.fleet.judge.verdicts.values())))
    assert [(t.node, t.code, t.device, t.port) for t in fresh.signals()] == [("n4", "ib_link_degraded", "mlx5_0", "1")]


def test_availability_of_the_ports_and_of_each_counter_is_exported() -> None:
    from prometheus_client import CollectorRegistry

    from healthd.metrics import PassiveMetrics

    registry = CollectorRegistry()
    metrics = PassiveMetrics(registry)
    t = FabricTracker()
    fabric = t.observe(FabricAnswers([], present("a") + present("b", lacking=("symbol_error",)), [link("a")]), 1.0)
    metrics.record(PassivePoll(at=1.0, up=True, fabric=fabric))

    def available(signal: str) -> float | None:
        return registry.get_sample_value("healthd_passive_signal_available", {"signal": signal})

    assert available("infiniband") == 1.0
    assert available("ib_symbol_error") == 0.0 and available("ib_link_downed") == 1.0
    metrics.record(PassivePoll(at=2.0, up=True, fabric=t.observe(FabricAnswers([], [], []), 2.0)))
    assert available("infiniband") == 0.0 and available("ib_link_downed") == 0.0


def test_port_signals_are_in_the_node_document_and_the_metric_with_device_and_port() -> None:
    from prometheus_client import CollectorRegistry, generate_latest

    from healthd.http import node_document
    from healthd.metrics import NodeView, PassiveSignalCollector

    feed = Feed()
    feed.poll([])
    feed.poll([counter("n1", "link_downed", 1, "mlx5_3", "1")])
    ports = feed.fleet.judge.view(Fabric, Fabric.signals)
    (doc,) = node_document(NodeView("n1"), passive=ports)["passive_signals"]
    assert (doc["signal"], doc["code"], doc["device"], doc["port"], doc["stage"], doc["gpu"]) == \
        ("infiniband", "ib_link_down", "mlx5_3", "1", "hint", None)
    registry = CollectorRegistry()
    registry.register(PassiveSignalCollector(lambda: ports))
    assert ('healthd_node_passive_signal{code="ib_link_down",device="mlx5_3",gpu="",gpu_uuid="",node="n1",port="1",'
            'signal="infiniband",stage="hint",strength="hint"} 1.0') in generate_latest(registry).decode()
