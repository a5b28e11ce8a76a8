"""Rail grouping and the NICs NCCL used (``healthd.judge.sources.fabric``): on a multi-rail fabric
(``[judge.passive] multi_rail``, each HCA port of a leaf's nodes on a leaf switch of its own) port signals on
several nodes of one leaf on the same rail are that rail's switch's (one switch finding naming the rail, no node
drained), on different rails each node's own; a port NCCL did not use (``params.nccl_transport``) does not
explain a low busbw."""

from __future__ import annotations

from healthd.config import JudgeSettings, PassiveJudgeSettings
from healthd.judge.model import JudgeOutput, JudgeState, RunInput
from healthd.judge.sources.fabric import PROBE, Fabric, rail_key, rail_switch
from healthd.parsers.nccl_transport import expand_nccl_transport, ib_ports_used
from healthd.passive.fabric import FabricTracker
from healthd.passive.model import PassivePoll
from healthd.passive.names import Located
from healthd.topology import SwitchRecord, build_topology
from tests.unit.test_judge_engine import Fleet
from tests.unit.test_nccl_transport import captured, with_debug
from tests.unit.test_passive_fabric import answers, counter

NAMES = [f"n{i}" for i in range(12)]
TOPOLOGY = build_topology([SwitchRecord("L1", nodes=tuple(NAMES[:6])), SwitchRecord("L2", nodes=tuple(NAMES[6:])),
                           SwitchRecord("S", switches=("L1", "L2"))], "tree")


class Rails:
    def __init__(self, *, multi_rail: bool = True) -> None:
        self.fleet = Fleet(NAMES, JudgeSettings(passive=PassiveJudgeSettings(multi_rail=multi_rail)))
        self.fleet.judge.set_topology(TOPOLOGY, now=self.fleet.t)
        self.tracker = FabricTracker()
        self.outs: list[JudgeOutput] = []

    def poll(self, counters: list[Located]) -> None:
        f = self.fleet
        fabric = self.tracker.observe(answers(tuple(NAMES), counters), f.t)
        self.outs.append(f.judge.observe(PassivePoll(at=f.t, up=True, covered=frozenset(NAMES), fabric=fabric),
                                         f.nodes, now=f.t))
        f.t += 60.0

    def low_busbw(self, node: str, partner: str, nics: frozenset[tuple[str, str]] | None = None) -> None:
        """Healthy NCCL rounds, then one pair with ``node`` flagged (its NCCL on ``nics`` when given)."""
        f = self.fleet
        others = [n for n in NAMES if n not in (node, partner)]
        pairs = [(others[i], others[i + 1]) for i in range(0, len(others) - 1, 2)]
        for _ in range(3):
            self.outs.append(f.feed([f.nccl(p) for p in [*pairs, (node, partner)]], advance=60.0))
        low = f.nccl((node, partner), group=200e9)
        if nics is not None:
            low = RunInput(low.run_id, low.probe, low.nodes, low.outcome, low.reason, low.at, low.measurements,
                           nics={node: nics, partner: nics})
        self.outs.append(f.feed([*[f.nccl(p) for p in pairs], low], advance=60.0))

    def verdict(self, node: str) -> tuple[str, str] | None:
        v = self.fleet.judge.verdicts.get((node, PROBE))
        return (v.outcome.value, v.reason_code) if v is not None else None

    def recommended(self) -> list[tuple[str, str]]:
        return [(r.node, r.reason_code) for o in self.outs for r in o.recommendations if r.probe == PROBE]

    def rail_findings(self) -> list[tuple[str, bool, tuple[str, ...]]]:
        return [(e.switch, e.active, e.nodes) for o in self.outs for e in o.switch_findings if e.probe == PROBE]


def test_the_same_rail_on_several_nodes_of_one_leaf_is_the_rail_switchs() -> None:
    r = Rails()
    r.poll([])
    r.poll([counter(n, "symbol_error", 50, "mlx5_2") for n in ("n0", "n1", "n2")])
    assert r.rail_findings() == [("L1:mlx5_2/1", True, ("n0", "n1", "n2"))]
    [event] = [e for o in r.outs for e in o.switch_findings]
    assert event.cause == PROBE and event.held == ("L1",) and "rail mlx5_2/1 of L1" in event.text
    assert {r.verdict(n) for n in ("n0", "n1", "n2")} == {("pass", "ib_symbol_errors")}
    assert "the switch's: rail L1:mlx5_2/1" in r.fleet.judge.verdicts[("n0", PROBE)].reason
    fresh = Fabric()  # a restart: the rail's finding and its tracks come back from the stored judgement
    fresh.restore(r.fleet.judge, JudgeState(verdicts=tuple(r.fleet.judge.verdicts.values()), events=(event,)))
    assert list(fresh.rails) == [("L1", "mlx5_2", "1")]
    assert {t.rail for t in fresh.signals() if t.device == "mlx5_2"} == {"L1:mlx5_2/1"}
    r.low_busbw("n0", "n7")  # the rail explains it: no node of it is drained
    assert r.verdict("n0") == ("pass", "ib_symbol_errors") and r.recommended() == []
    # the rail's errors stop: the window passes, the rail's finding ends
    r.fleet.t += r.fleet.judge.settings.passive.window_s + 60.0
    r.poll([counter(n, "symbol_error", 50, "mlx5_2") for n in ("n0", "n1", "n2")])
    assert r.rail_findings()[-1] == ("L1:mlx5_2/1", False, ("n0", "n1", "n2"))


def test_different_rails_of_one_leaf_stay_each_nodes_own() -> None:
    r = Rails()
    r.poll([])
    r.poll([counter("n3", "link_downed", 1, "mlx5_0"), counter("n4", "link_downed", 1, "mlx5_1"),
            counter("n5", "link_downed", 1, "mlx5_3")])
    assert r.rail_findings() == [] and r.verdict("n3") == ("pass", "ib_link_down")
    r.low_busbw("n3", "n8")
    assert r.verdict("n3") == ("degraded", "ib_link_down") and r.recommended() == [("n3", "ib_link_down")]
    assert r.verdict("n4") == ("pass", "ib_link_down")


def test_without_multi_rail_one_device_on_several_nodes_makes_no_rail_finding() -> None:
    r = Rails(multi_rail=False)
    r.poll([])
    r.poll([counter(n, "symbol_error", 50, "mlx5_2") for n in ("n0", "n1", "n2")])
    assert r.rail_findings() == [] and "the switch's" not in r.fleet.judge.verdicts[("n0", PROBE)].reason


def test_a_port_nccl_did_not_use_does_not_explain_a_low_busbw() -> None:
    r = Rails()
    r.poll([])
    r.poll([counter("n1", "link_downed", 1, "mlx5_3")])
    r.low_busbw("n1", "n9", nics=frozenset({("mlx5_0", "1"), ("mlx5_1", "1")}))
    assert r.verdict("n1") == ("pass", "ib_link_down") and r.recommended() == []
    r.low_busbw("n1", "n9", nics=frozenset({("mlx5_0", "1"), ("mlx5_3", "1")}))
    assert r.verdict("n1") == ("degraded", "ib_link_down") and r.recommended() == [("n1", "ib_link_down")]


def test_the_ports_nccl_used_come_from_its_own_lines() -> None:
    result = expand_nccl_transport(with_debug(captured((0, "gpu19", "nccl-1357_ibext_sharp.log")), ["IB"]))
    assert ib_ports_used(result.params) == {"gpu19": frozenset({("mlx5_0", "1"), ("mlx5_1", "1"), ("mlx5_4", "1"),
                                                                ("mlx5_5", "1")})}
    socket = expand_nccl_transport(with_debug(captured((0, "gpu01", "nccl-tests-217_socket_no_ib.log")), ["IB"]))
    assert ib_ports_used(socket.params) == {}  # a Socket run: not known, never "no port used"
    assert ib_ports_used({"nccl_transport": {"nodes": {"a": {"nics": ["mlx5_0+mlx5_1:1/IB"]}}}}) == {
        "a": frozenset({("mlx5_0", "1"), ("mlx5_1", "1")})}


def test_rail_names_round_trip() -> None:
    assert rail_key(rail_switch(("leaf3", "mlx5_2", "1"))) == ("leaf3", "mlx5_2", "1")
    assert rail_key("leaf3") is None and rail_key("leaf3/spine1") is None
