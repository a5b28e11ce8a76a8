"""Link findings (``healthd.judge.links``): a slow inter-node link is localised by re-pairing each end with
known-good partners; a link whose ends are clean elsewhere is a finding on the link, never a drain.

The runs are the real pipeline result document (``tests/fixtures/pipeline/sim_2x2_pipeline.json``, a gloo
run over two simulated nodes) under other node names, its inter-node link figures scaled where a link is
slow, through the daemon's own path (``run_from_collected``)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from healthd.collector import Collected
from healthd.config import JudgeSettings, ProbeSettings
from healthd.judge.engine import Judge
from healthd.judge.model import JudgeOutput, LinkFinding, RunInput
from healthd.judge.persist import run_from_collected
from healthd.judge.sources.link import Links
from healthd.model import Node, Outcome, RunKind
from healthd.parsers.healthd_json import parse_result

DOC = Path(__file__).resolve().parents[1] / "fixtures" / "pipeline" / "sim_2x2_pipeline.json"
PROBES = {"pipeline": ProbeSettings(interval_s=3600.0, nodes_per_job=2)}
GROUP_LINKS = ("link_busbw_bytes_per_second", "link_min_busbw_bytes_per_second")


def pipeline_run(run_id: str, a: str, b: str, at: float, *, factor: float = 1.0, jitter: float = 0.0,
                 kind: RunKind = RunKind.PROBE) -> RunInput:
    """The real document as a run of nodes ``a`` and ``b``: every inter-node link (both directions, as a bad
    cable or port between them would) at ``factor`` of what it measured, all figures off by ``jitter``. The
    loaded machine measured the first node's links inside it slower than the second's (a node here is the
    first in some runs and the second in others): both nodes get the second's."""
    doc = json.loads(DOC.read_text().replace('"sim0', f'"{a}').replace("(sim0 ", f"({a} ")
                     .replace('"sim1', f'"{b}').replace("(sim1 ", f"({b} "))
    doc["run_id"], doc["finished_at"] = run_id, at
    own = {(m["name"], json.dumps(m["labels"])): m["value"] for m in doc["measurements"] if m["node"] == b}
    for m in doc["measurements"]:
        if m["node"] == a and m["labels"].get("scope") == "node":
            m["value"] = own[(m["name"], json.dumps(m["labels"]))]
        m["value"] *= 1 + jitter
        if m["name"] in GROUP_LINKS and m["labels"].get("scope") == "group":
            m["value"] *= factor
    slowest = doc["params"]["slowest_link"]["group"]
    slowest["busbw_bytes_per_second"] *= factor * (1 + jitter)
    old = slowest["text"].split(": ")[1].split(",")[0]
    slowest["text"] = slowest["text"].replace(old, f"{slowest['busbw_bytes_per_second'] / 1e9:.3g} GB/s")
    result = parse_result(json.dumps(doc))
    return run_from_collected(Collected(run_id, "pipeline", (a, b), Outcome.PASS, "", result, kind), at)


class Fleet:
    """``size`` nodes probed in pairs (a new pairing each round) and every re-probe the judge asks for run at
    once; ``slow(a, b)`` is the factor of a pair's inter-node links."""

    def __init__(self, slow: Callable[[str, str], float], size: int = 8) -> None:
        self.names = [f"p{i}" for i in range(size)]
        self.nodes = [Node(n, "idle", gpus=2, gpu_type="h100", node_class="h100x2") for n in self.names]
        self.judge = Judge(JudgeSettings())
        self.slow = slow
        self.t = 1000.0
        self.k = 0
        self.outputs: list[JudgeOutput] = []

    def run(self, a: str, b: str, kind: RunKind = RunKind.PROBE) -> RunInput:
        self.k += 1
        return pipeline_run(f"r{self.k:04d}", a, b, self.t, factor=self.slow(a, b),
                            jitter=0.01 * ((self.k % 3) - 1), kind=kind)

    def evaluate(self, runs: list[RunInput]) -> JudgeOutput:
        out = self.judge.evaluate(runs, self.nodes, now=self.t)
        self.outputs.append(out)
        self.t += 300.0
        return out

    def regular_round(self, shift: int) -> JudgeOutput:
        size = len(self.names)
        order = self.names[shift % size:] + self.names[: shift % size]
        pairs = [(order[i], order[i + 1]) for i in range(0, size - 1, 2)]
        return self.evaluate([self.run(a, b) for a, b in pairs])

    def reprobes(self) -> JudgeOutput | None:
        """Run the re-probes the judge asks for (each with its first free known-good partner)."""
        runs, busy = [], set[str]()
        for req in self.judge.requests(self.t, PROBES):
            if busy & set(req.nodes):
                continue
            nodes = list(req.nodes)
            nodes += [p for p in req.partners if p not in busy and p not in nodes][: max(req.size, 2) - len(nodes)]
            busy.update(nodes)
            runs.append(self.run(nodes[0], nodes[1], RunKind.REPROBE))
        return self.evaluate(runs) if runs else None

    def settle(self, rounds: int = 8) -> None:
        for _ in range(rounds):
            if self.reprobes() is None:
                return

    def links(self) -> list[LinkFinding]:
        return self.judge.view(Links, Links.active)

    def recommended(self) -> set[str]:
        return {r.node for out in self.outputs for r in out.recommendations}


def _healthy(fleet: Fleet, rounds: int = 5) -> None:
    for shift in range(rounds):
        fleet.regular_round(shift)


def test_the_fixture_is_the_shape_the_judge_reads() -> None:
    run = pipeline_run("x", "p2", "p3", 5000.0, factor=0.3)
    assert run.links[("p2", "group")] == run.links[("p3", "group")]
    assert run.links[("p2", "group")].startswith("rank 1 (p2 gpu 1) -> rank 2 (p3 gpu 0): 0.129 GB/s")
    assert {m.node for m in run.measurements if m.name == "link_min_busbw_bytes_per_second"} == {"p2", "p3"}


def test_a_slow_link_with_clean_ends_is_a_link_finding_and_no_node_is_drained() -> None:
    bad = {"p2", "p3"}
    fleet = Fleet(lambda a, b: 1.0)
    _healthy(fleet)
    assert not fleet.links()
    fleet.slow = lambda a, b: 0.3 if {a, b} == bad else 1.0
    first = fleet.evaluate([fleet.run("p2", "p3"), fleet.run("p0", "p1")])
    suspects = {v.node: v for v in first.verdicts if v.outcome is not Outcome.PASS}
    assert set(suspects) == bad and {v.reason_code for v in suspects.values()} == {"group_suspect"}
    assert "the slowest link: rank 1 (p2 gpu 1) -> rank 2 (p3 gpu 0)" in suspects["p2"].reason
    asked = {r.nodes for r in first.requests}
    assert asked == {("p2",), ("p3",)}, "each end is re-paired with a known-good partner"

    fleet.settle()
    [link] = fleet.links()
    assert (link.probe, link.a, link.b) == ("pipeline", "p2", "p3")
    assert link.series == "link_min_busbw_bytes_per_second{scope=group,size_bytes=1M}"
    assert link.layer in ("baseline_drift", "fleet_outlier", "below_floor")
    assert 0.25 < link.value / link.reference < 0.4
    assert link.link.startswith("rank 1 (p2 gpu 1) -> rank 2 (p3 gpu 0)")
    assert "link p2 <-> p3" in link.text and "both nodes pass with other partners" in link.text
    assert len(link.run_ids) >= 2 and "p2" in link.action and "neither node is drained" in link.action
    assert not fleet.recommended(), "a link finding drains neither end"
    for node in bad:
        assert fleet.judge.verdicts[(node, "pipeline")].outcome is Outcome.PASS
    ran = [o for o in fleet.outputs[6:] for f in o.link_findings]
    assert len(ran) == 1 and ran[0].link_findings[0].active

    # the pair is measured again while the finding stands; repaired, it measures clean and the finding ends
    fleet.slow = lambda a, b: 1.0
    fleet.t += JudgeSettings().confirm.recheck_interval_s
    fleet.regular_round(1)
    out = fleet.reprobes()
    assert out is not None
    [ended] = out.link_findings
    assert (ended.a, ended.b) == ("p2", "p3") and not ended.active and "measured clean" in ended.text
    assert not fleet.links() and not fleet.recommended()


def test_a_node_slow_with_every_partner_is_a_node_finding_and_no_link_finding() -> None:
    fleet = Fleet(lambda a, b: 1.0)
    _healthy(fleet)
    fleet.evaluate([fleet.run("p0", "p1")])
    fleet.slow = lambda a, b: 0.3 if "p2" in (a, b) else 1.0
    fleet.evaluate([fleet.run("p2", "p3")])
    fleet.settle()
    assert not fleet.links()
    assert fleet.recommended() == {"p2"}
    verdict = fleet.judge.verdicts[("p2", "pipeline")]
    assert verdict.outcome is Outcome.DEGRADED and verdict.reason_code == "localised", verdict
    assert fleet.judge.verdicts[("p3", "pipeline")].outcome is Outcome.PASS


def test_one_bad_pair_result_that_does_not_repeat_is_no_finding() -> None:
    slow = {"once": True}

    def factor(a: str, b: str) -> float:
        if {a, b} == {"p4", "p5"} and slow["once"]:
            slow["once"] = False
            return 0.3
        return 1.0

    fleet = Fleet(lambda a, b: 1.0)
    _healthy(fleet)
    fleet.slow = factor
    fleet.evaluate([fleet.run("p4", "p5")])
    fleet.settle()
    assert not fleet.links() and not fleet.recommended()
    assert all(fleet.judge.verdicts[(n, "pipeline")].outcome is Outcome.PASS for n in ("p4", "p5"))


def test_the_link_finding_is_kept_exported_recommended_and_restored(tmp_path: Path) -> None:
    from healthd.config import RemediationSettings
    from healthd.judge.persist import load_judge
    from healthd.remediation import recommendations_document
    from healthd.store import Store
    from tests.unit.test_metrics import lookup, scrape

    store = Store(tmp_path / "s.sqlite")
    store.upsert_nodes(Fleet(lambda a, b: 1.0).nodes, 1.0)
    fleet = Fleet(lambda a, b: 1.0)
    _healthy(fleet)
    fleet.slow = lambda a, b: 0.3 if {a, b} == {"p2", "p3"} else 1.0
    fleet.evaluate([fleet.run("p2", "p3")])
    fleet.settle()
    for out in fleet.outputs:
        store.save_judgement(out, keep_s=86400.0)
    [link] = fleet.links()
    assert store.link_findings(active_only=True) == [link]

    where = {"probe": "pipeline", "a": "p2", "b": "p3"}
    for detail in ("summary", "full"):
        v = lookup(scrape(store, detail))
        assert v("healthd_link_finding", where) == 1.0
        assert v("healthd_link_finding_ratio", where) == link.value / link.reference
        assert v("healthd_drain_recommended", {"node": "p2", "reason_code": "localised"}) is None

    doc = recommendations_document(store, RemediationSettings())
    [rec] = doc["link_findings"]
    assert (rec["a"], rec["b"], rec["action"]) == ("p2", "p3", link.action) and not doc["recommendations"]

    restored = load_judge(store, JudgeSettings(), now=fleet.t)
    assert restored.view(Links, Links.active) == [link]
    fleet.judge = restored
    fleet.slow = lambda a, b: 1.0
    fleet.t += JudgeSettings().confirm.recheck_interval_s
    fleet.regular_round(1)
    again = fleet.reprobes()
    assert again is not None and [f.active for f in again.link_findings] == [False]
    store.save_judgement(again, keep_s=86400.0)
    assert store.link_findings(active_only=True) == []
    assert lookup(scrape(store))("healthd_link_finding", where) is None


def test_the_simulated_path_fault_is_named_as_a_link_and_its_nodes_are_never_drained() -> None:
    from healthd.simulate import format_report, load_scenario, simulate

    scenario = load_scenario(Path(__file__).resolve().parents[2] / "bench" / "scenarios" / "link-32.toml")
    report = simulate(scenario, echo=False)
    path, node = report.faults
    assert path.fault.path and path.found_round == path.measured_round == 2 and path.named_right
    assert path.drained_round is None
    assert path.detail == "link n06 <-> n21"
    assert node.named_right and node.drained_round is not None and node.detail == "localised"
    assert report.link_findings == [(2, "n06", "n21", "nccl")] and not report.false_link_findings
    assert not report.false_drains and not report.false_recommendations and report.ok
    ended = [r.round for r in report.rounds if any(e.startswith("link finding ended: n06 <-> n21") for e in r.events)]
    assert ended and ended[0] > path.fault.until_round, "the finding ends once the path is repaired"
    assert "path faults 1, measured 1, named as a link 1; link findings 1, false 0" in format_report(report)


def test_a_switch_finding_holding_an_end_wins_over_the_link() -> None:
    from healthd.judge.links import LinkTracker
    from healthd.judge.model import Finding, GroupRecord, ReasonCode, SeriesKey, Severity

    key = SeriesKey.of("nccl", "busbw_bytes_per_second", {"scope": "group"})
    bad = Finding(ReasonCode.FLEET_OUTLIER, Severity.DEGRADED, key, 180e9, 440e9, 400e9, "busbw 180 GB/s is 59% below")

    def record(run_id: str, at: float, flagged: bool) -> GroupRecord:
        sev, code = (Severity.DEGRADED, ReasonCode.FLEET_OUTLIER) if flagged else (Severity.NONE, ReasonCode.OK)
        return GroupRecord(run_id, "nccl", at, ("a", "b"), sev, code, "", ("a", "b"),
                           findings=(bad,) if flagged else ())

    links = LinkTracker()
    for r in (record("r1", 10.0, True), record("r2", 30.0, True)):
        links.note(r)
    clean_elsewhere = {"a": 20.0, "b": 25.0}
    held: set[str] = set()

    def update(now: float) -> tuple[list[LinkFinding], list[tuple[str, str]]]:
        return links.update("nccl", now, cutoff=0.0, need=lambda p: 2, recheck_s=120.0, last_pass=clean_elsewhere,
                            skip=lambda r: bool(held), ended_by=lambda p: "switch leaf1 explains it" if held else None,
                            history=lambda n: (), own=lambda n: False)

    [found], _ = update(40.0)
    assert found.active and found.run_ids == ("r1", "r2") and found.value / found.reference < 0.5
    held.add("leaf1")
    [ended], wanted = update(50.0)
    assert not ended.active and "switch leaf1" in ended.text and not wanted and not links.active
    assert update(60.0) == ([], []), "while the switch holds the pair, its results count neither way"


def test_a_slow_link_in_a_larger_run_suspects_its_two_ends_only() -> None:
    """A real 4-node run (one rank per node, every ring link between nodes) with rank 1 -> rank 2 delayed:
    the group's suspects are that link's ends, so only they are re-paired; the other two nodes are not
    suspects although their own inter-node figures in this loaded run are low too (and the run's throughput,
    stalled by the link, is the group's finding laid on the same ends)."""
    doc = json.loads((DOC.parent / "sim_4x1_slow_link.json").read_text())
    fleet = Fleet(lambda a, b: 1.0, size=24)
    _healthy(fleet)
    text = json.dumps(doc)
    for i, name in enumerate(("p4", "p5", "p6", "p7")):
        text = text.replace(f'"sim{i}', f'"{name}').replace(f"(sim{i} ", f"({name} ")
    doc = json.loads(text)
    doc["finished_at"] = fleet.t
    result = parse_result(json.dumps(doc))
    run = run_from_collected(Collected("big", "pipeline", tuple(result.nodes), Outcome.PASS, "", result), fleet.t)
    out = fleet.evaluate([run])
    [record] = out.groups
    assert record.flagged and record.members == ("p4", "p5", "p6", "p7") and record.suspects == ("p5", "p6")
    links = {f.detail.split("; the slowest link: ")[1].split(":")[0] for f in record.findings
             if "; the slowest link: " in f.detail}
    assert links == {"rank 1 (p5 gpu 0) -> rank 2 (p6 gpu 0)"}
    assert {r.nodes for r in out.requests} == {("p5",), ("p6",)}
    assert {v.node for v in out.verdicts if v.outcome is not Outcome.PASS} == {"p5", "p6"}


def test_an_end_slow_with_some_other_partner_is_not_clean_and_the_pair_is_no_link() -> None:
    """An uplink: A passes with a partner under its own leaf but is slow with one under another leaf. A is
    not clean elsewhere, so A <-> B is no link finding (the switch finding or A's localisation names it)."""
    from healthd.judge.links import LinkTracker
    from healthd.judge.model import GroupRecord, ReasonCode, Severity

    def record(run_id: str, at: float, members: tuple[str, str], flagged: bool) -> GroupRecord:
        sev, code = (Severity.DEGRADED, ReasonCode.FLEET_OUTLIER) if flagged else (Severity.NONE, ReasonCode.OK)
        return GroupRecord(run_id, "nccl", at, members, sev, code, "", members)

    links = LinkTracker()
    pair = [record("r1", 10.0, ("a", "b"), True), record("r4", 40.0, ("a", "b"), True)]
    for r in pair:
        links.note(r)
    history = {"a": [pair[0], record("r2", 20.0, ("a", "c"), False), record("r3", 25.0, ("a", "d"), True), pair[1]],
               "b": [pair[0], record("r5", 22.0, ("b", "e"), False), pair[1]]}
    args = dict(cutoff=0.0, need=lambda p: 2, recheck_s=120.0, last_pass={"a": 20.0, "b": 22.0}, skip=lambda r: False,
                ended_by=lambda p: None, own=lambda n: False)
    assert links.update("nccl", 50.0, history=lambda n: history[n], **args) == ([], [])  # type: ignore[arg-type]
    assert not links.explains(pair[1], {"a": 20.0, "b": 22.0}, 0.0, lambda r: False, lambda n: history[n],
                              lambda n: False)
    history["a"].remove(history["a"][2])
    own = dict(args, own=lambda n: n == "a")
    assert links.update("nccl", 50.0, history=lambda n: history[n], **own)[0] == [], \
        "an end with a finding on its own figures of the probe is not clean either"  # type: ignore[arg-type]
    [found], _ = links.update("nccl", 50.0, history=lambda n: history[n], **args)  # type: ignore[arg-type]
    assert (found.a, found.b, found.run_ids) == ("a", "b", ("r1", "r4"))


def test_with_rotating_partners_the_path_is_seen_only_in_a_round_that_pairs_its_nodes() -> None:
    """``[scheduler] rotate_partners`` through the simulator: the scenario's pinned pair n06-n21 is broken
    up, the node with its own slow link is still localised and drained, and the path is named in the round
    its pair is first measured, if any (bench/RESULTS.md: in 12 rounds of 32 nodes it never was)."""
    from healthd.simulate import load_scenario, simulate

    scenario = load_scenario(Path(__file__).resolve().parents[2] / "bench" / "scenarios" / "link-32.toml")
    healthd = {**scenario.healthd, "scheduler": {"rotate_partners": True}}
    report = simulate(scenario.model_copy(update={"healthd": healthd}), echo=False)
    path, node = report.faults
    assert path.measured_round != 2 and path.found_round == path.measured_round
    assert node.named_right and node.drained_round is not None and node.detail == "localised"
    assert not report.false_drains and not report.false_recommendations and not report.false_link_findings
