"""The judge end to end on hand-built runs: what each situation must give, and why."""

from __future__ import annotations

from array import array
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest

from healthd.config import JudgeSettings, ProbeSettings
from healthd.errors import StoreError
from healthd.http import _run as api_run
from healthd.judge.engine import Judge
from healthd.judge.model import (
    CheckInput,
    JudgeOutput,
    MeasurementInput,
    ReasonCode,
    Request,
    RunInput,
    SeriesKey,
    SeriesState,
)
from healthd.judge.persist import keep_seconds, load_judge
from healthd.judge.sources.switch import Switches
from healthd.model import Node, Outcome, RunKind
from healthd.store import Store
from probes.result import Environment, ProbeResult

CLASS = "h100x8"
GIB = str(1 << 30)
GEMM = {"gemm": ProbeSettings()}


def nodes(names: list[str]) -> list[Node]:
    return [Node(n, "idle", gpus=8, gpu_type="h100", node_class=CLASS) for n in names]


def wobble(i: int, j: int) -> float:
    """A deterministic +-0.4% spread, so the fleet has a (small) spread like a real one."""
    return 1 + 0.002 * ((i * 7 + j * 3) % 5 - 2)


def kind_of(priority: bool) -> RunKind:
    return RunKind.REPROBE if priority else RunKind.PROBE


class Fleet:
    """Builds runs with fresh ids and a clock, and feeds them to a judge."""

    def __init__(self, names: list[str], settings: JudgeSettings | None = None) -> None:
        self.names = names
        self.nodes = nodes(names)
        self.judge = Judge(settings or JudgeSettings())
        self.t = 10_000.0
        self.k = 0
        self.store: Store | None = None
        """Where each output is saved, as the daemon does (none: the judge alone)."""

    def rid(self, priority: bool) -> str:
        self.k += 1
        return f"rp{self.k:014x}" if priority else f"{self.k:016x}"

    def gemm(self, node: str, gpu_values: dict[int, float] | None = None, *, scale: float = 1.0,
             priority: bool = False) -> RunInput:
        i = self.names.index(node)
        ms = tuple(MeasurementInput("flop_per_second", (gpu_values or {}).get(g, 700e12 * scale) * wobble(i, g),
                                    {"gpu": str(g), "dtype": "bf16"}, node) for g in range(8))
        return RunInput(self.rid(priority), "gemm", (node,), Outcome.PASS, "", self.t, ms, kind=kind_of(priority))

    def nccl(self, members: tuple[str, ...], group: float = 440e9, *, priority: bool = False) -> RunInput:
        ms = [MeasurementInput("busbw_bytes_per_second", 480e9 * wobble(self.names.index(n), 1),
                               {"collective": "all_reduce", "size_bytes": GIB, "scope": "node"}, n)
              for n in members]
        ms.append(MeasurementInput("busbw_bytes_per_second", group * wobble(self.k, 2),
                                   {"collective": "all_reduce", "size_bytes": GIB, "scope": "group",
                                    "nodes": str(len(members))}, None))
        return RunInput(self.rid(priority), "nccl", members, Outcome.PASS, "", self.t, tuple(ms),
                        kind=kind_of(priority))

    def feed(self, runs: list[RunInput], *, advance: float = 900.0, **kw: object) -> JudgeOutput:
        out = self.judge.evaluate(runs, self.nodes, now=self.t, **kw)  # type: ignore[arg-type]
        if self.store is not None:
            self.store.save_judgement(out, keep_s=keep_seconds(self.judge.settings))
        self.t += advance
        return out

    def healthy_gemm_rounds(self, rounds: int = 3) -> None:
        for _ in range(rounds):
            self.feed([self.gemm(n) for n in self.names])


def findings_of(evidence: dict[str, object]) -> list[dict[str, object]]:
    findings = evidence["findings"]
    assert isinstance(findings, list)
    return findings


def verdict(fleet: Fleet, node: str, probe: str = "gemm") -> tuple[str, str]:
    v = fleet.judge.verdicts[(node, probe)]
    return v.outcome.value, v.reason_code


def test_one_slow_gpu_is_named_re_probed_then_confirmed() -> None:
    fleet = Fleet([f"n{i}" for i in range(10)])
    fleet.healthy_gemm_rounds()
    assert {verdict(fleet, n) for n in fleet.names} == {("pass", "ok")}

    out = fleet.feed([fleet.gemm(n, {5: 350e12} if n == "n3" else None) for n in fleet.names], advance=60)
    (v,) = out.verdicts
    assert (v.node, v.outcome, v.reason_code) == ("n3", Outcome.DEGRADED, "below_floor")
    assert v.reason.startswith("gpu 5 flop_per_second{dtype=bf16} 349.3 TFLOP/s is below the floor 525 TFLOP/s")
    assert v.reason.endswith("seen in 1 of the last 3 runs, re-probe requested")
    assert v.evidence["gpu"] == "5" and v.evidence["floor"] == 525e12
    assert out.recommendations == []  # one bad run is a reason to re-probe, not to drain
    assert [(r.kind, r.nodes) for r in out.requests] == [("reprobe", ("n3",))]
    (req,) = fleet.judge.requests(fleet.t, GEMM)
    assert (req.probe, req.nodes, req.partners, req.size) == ("gemm", ("n3",), (), 1)

    out = fleet.feed([fleet.gemm("n3", {5: 350e12}, priority=True)])
    (v,) = out.verdicts
    assert (v.outcome, v.reason_code) == (Outcome.FAIL, "below_floor")
    assert v.reason.endswith("confirmed in 2 of the last 3 runs")
    assert out.satisfied == [("n3", "gemm")] and fleet.judge.requests(fleet.t, GEMM) == []
    (rec,) = out.recommendations
    assert (rec.node, rec.probe, rec.outcome, rec.reason_code) == ("n3", "gemm", Outcome.FAIL, ReasonCode.BELOW_FLOOR)
    findings = findings_of(rec.evidence)
    layers = {f["layer"] for f in findings}
    assert layers == {"below_floor", "baseline_drift", "fleet_outlier"}  # all three layers saw it
    assert {f["gpu"] for f in findings} == {"5"}
    assert rec.evidence["confirmed"] == "2/3" and len(rec.evidence["run_ids"]) == 2  # type: ignore[arg-type]
    assert abs(float(rec.evidence["baseline"]) - 700e12) < 10e12  # type: ignore[arg-type]

    # fixed: one pass is not enough to clear a confirmed failure (2 of the last 3 still bad), two are
    fleet.feed([fleet.gemm("n3")])
    assert verdict(fleet, "n3") == ("fail", "below_floor")
    out = fleet.feed([fleet.gemm("n3")])
    assert verdict(fleet, "n3") == ("pass", "ok") and out.recommendations == []
    assert ("n3", "gemm") in out.evaluated  # so remediation clears the recommendation


def test_a_drop_above_the_floor_is_degraded_by_baseline_and_fleet() -> None:
    fleet = Fleet([f"n{i}" for i in range(10)])
    fleet.healthy_gemm_rounds()
    out = fleet.feed([fleet.gemm(n, scale=0.885 if n == "n4" else 1.0) for n in fleet.names], advance=60)
    (v,) = out.verdicts
    assert (v.node, v.outcome, v.reason_code) == ("n4", Outcome.DEGRADED, "fleet_outlier")
    # every GPU is slow: the worst is named, the others counted
    assert v.reason.startswith("gpu 4 flop_per_second{dtype=bf16} 617 TFLOP/s is 11.9% below the median 700 TFLOP/s"
                               " of the h100x8 class")
    assert "(and 7 more series); seen in 1 of the last 3 runs" in v.reason
    out = fleet.feed([fleet.gemm("n4", scale=0.885, priority=True)])
    (rec,) = out.recommendations
    assert (rec.outcome, rec.reason_code) == (Outcome.DEGRADED, ReasonCode.FLEET_OUTLIER)
    assert {f["layer"] for f in findings_of(rec.evidence)} == {"baseline_drift", "fleet_outlier"}


def test_errors_never_count_against_a_node_nor_erase_a_finding() -> None:
    fleet = Fleet([f"n{i}" for i in range(10)])
    fleet.healthy_gemm_rounds()
    crashed = RunInput(fleet.rid(False), "gemm", ("n1",), Outcome.ERROR, "CUDA error: an illegal memory access",
                       fleet.t, (MeasurementInput("flop_per_second", 1.0, {"gpu": "0", "dtype": "bf16"}, "n1"),))
    out = fleet.feed([crashed])
    (v,) = out.verdicts
    assert (v.outcome, v.reason_code) == (Outcome.ERROR, "probe_error")
    assert v.reason == "CUDA error: an illegal memory access"
    assert out.requests == [] and out.recommendations == []
    gpu0 = SeriesKey.of("gemm", "flop_per_second", {"gpu": "0", "dtype": "bf16"})
    assert fleet.judge.series[("n1", gpu0)].last_value != 1.0  # an error's numbers are never used

    # a confirmed failure survives later errors: an error cannot check, so it cannot clear either
    fleet.feed([fleet.gemm("n2", {0: 300e12})], advance=60)
    fleet.feed([fleet.gemm("n2", {0: 300e12}, priority=True)])
    assert verdict(fleet, "n2") == ("fail", "below_floor")
    out = fleet.feed([RunInput(fleet.rid(False), "gemm", ("n2",), Outcome.ERROR, "timeout", fleet.t)])
    assert verdict(fleet, "n2") == ("fail", "below_floor")
    assert [r.node for r in out.recommendations] == ["n2"]


def test_a_pass_without_its_measurement_is_an_error_not_a_pass() -> None:
    fleet = Fleet(["n0"])
    bare = RunInput(fleet.rid(False), "gemm", ("n0",), Outcome.PASS, "", fleet.t,
                    (MeasurementInput("memory_bandwidth_bytes_per_second", 2e12, {"gpu": "0"}, "n0"),))
    (v,) = fleet.feed([bare]).verdicts
    assert (v.outcome, v.reason_code) == (Outcome.ERROR, "measurement_missing")
    assert v.reason == "the probe passed without its flop_per_second measurement (required: failing closed)"


def test_failed_checks_are_findings_confirmed_like_any_other() -> None:
    fleet = Fleet([f"n{i}" for i in range(6)])
    check = CheckInput("nccl.wrong_data", "1024 wrong elements", node="n2")
    first = RunInput(fleet.rid(False), "nccl", ("n2", "n3"), Outcome.FAIL, "wrong data", fleet.t, (), (check,))
    out = fleet.feed([first], advance=60)
    assert verdict(fleet, "n2", "nccl") == ("degraded", "check_failed")
    assert verdict(fleet, "n3", "nccl") == ("pass", "ok")  # the check named n2
    assert [(r.kind, r.nodes) for r in out.requests] == [("reprobe", ("n2",))]
    again = RunInput(fleet.rid(True), "nccl", ("n2", "n4"), Outcome.FAIL, "wrong data", fleet.t, (), (check,),
                     RunKind.REPROBE)
    out = fleet.feed([again])
    assert verdict(fleet, "n2", "nccl") == ("fail", "check_failed")
    assert "check nccl.wrong_data failed: 1024 wrong elements" in fleet.judge.verdicts[("n2", "nccl")].reason
    # a failed check naming no node in a multi-node run suspects the group, not a node
    anon = RunInput(fleet.rid(False), "nccl", ("n0", "n1"), Outcome.FAIL, "rank 3 saw wrong data", fleet.t, (),
                    (CheckInput("nccl.wrong_data", "rank 3"),))
    fleet.feed([anon])
    assert verdict(fleet, "n0", "nccl") == ("degraded", "group_suspect")
    assert verdict(fleet, "n1", "nccl") == ("degraded", "group_suspect")


def test_nccl_on_the_wrong_transport_is_degraded_on_the_node_named() -> None:
    fleet = Fleet([f"n{i}" for i in range(6)])
    reason = "nccl_transport: expected IB, used Socket (on n3)"
    run = fleet.nccl(("n2", "n3"))
    bad = RunInput(run.run_id, "nccl", run.nodes, Outcome.DEGRADED, reason, run.at, run.measurements)
    fleet.feed([bad])
    assert verdict(fleet, "n3", "nccl") == ("degraded", "nccl_transport")
    assert reason in fleet.judge.verdicts[("n3", "nccl")].reason
    assert verdict(fleet, "n2", "nccl") == ("pass", "ok")
    everyone = fleet.nccl(("n4", "n5"))
    fleet.feed([RunInput(everyone.run_id, "nccl", everyone.nodes, Outcome.DEGRADED,
                         "nccl_transport: expected IB, used Socket", everyone.at, everyone.measurements)])
    # half the class on sockets at once is a configuration change (a plugin missing from the image),
    # not three broken nodes: one fleet event, nothing to drain
    assert verdict(fleet, "n4", "nccl") == verdict(fleet, "n5", "nccl") == ("degraded", "fleet_event")


def test_fleet_event_gives_one_fleet_verdict_and_no_recommendation() -> None:
    fleet = Fleet([f"n{i:02d}" for i in range(12)])
    fleet.healthy_gemm_rounds()
    out = fleet.feed([fleet.gemm(n, scale=0.7) for n in fleet.names], advance=60)  # 490 TFLOP/s: under the floor
    (event,) = out.fleet_events
    assert (event.node_class, event.probe, event.active) == (CLASS, "gemm", True)
    assert (event.key, event.scope) == ("flop_per_second{dtype=bf16}", "gpu")  # the class's GPUs: one event
    assert event.text == ("fleet event: gemm on h100x8: flop_per_second{dtype=bf16} (scope gpu): 12 of 12 nodes"
                          " flagged at once (12 of the 12 newest results)")
    assert {verdict(fleet, n) for n in fleet.names} == {("degraded", "fleet_event")}
    assert out.recommendations == [] and out.requests == []

    # during the event, a GPU far below the class *as it is now* is still found (the event cannot explain it)
    out = fleet.feed([fleet.gemm(n, {1: 245e12} if n == "n02" else None, scale=0.7) for n in fleet.names],
                     advance=60)
    assert verdict(fleet, "n02") == ("degraded", "fleet_outlier")
    assert "since its fleet event began" in fleet.judge.verdicts[("n02", "gemm")].reason
    out = fleet.feed([fleet.gemm("n02", {1: 245e12}, scale=0.7, priority=True)])
    (rec,) = out.recommendations
    assert (rec.node, rec.outcome, rec.reason_code) == ("n02", Outcome.DEGRADED, ReasonCode.FLEET_OUTLIER)

    # back to normal: the event ends, verdicts are passes again
    out = fleet.feed([fleet.gemm(n) for n in fleet.names if n != "n02"])
    (ended,) = out.fleet_events
    assert not ended.active and ended.ended_at is not None and fleet.judge.active_events() == []
    assert verdict(fleet, "n05") == ("pass", "ok")


def pairs_fleet(store: Store | None = None) -> Fleet:
    fleet = Fleet(["a", "b", "c", "d", "e", "f"])
    fleet.store = store
    for round_pairs in ((("a", "b"), ("c", "d"), ("e", "f")), (("a", "c"), ("b", "e"), ("d", "f")),
                        (("a", "d"), ("b", "f"), ("c", "e"))):
        fleet.feed([fleet.nccl(p) for p in round_pairs])
    return fleet


def test_a_bad_link_is_localised_to_its_node_not_its_partner() -> None:
    fleet = pairs_fleet()
    out = fleet.feed([fleet.nccl(("a", "b"), group=220e9), fleet.nccl(("c", "d")), fleet.nccl(("e", "f"))],
                     advance=60)
    assert verdict(fleet, "a", "nccl") == verdict(fleet, "b", "nccl") == ("degraded", "group_suspect")
    assert sorted((r.kind, r.nodes) for r in out.requests) == [("localise", ("a",)), ("localise", ("b",))]
    requests = fleet.judge.requests(fleet.t, {"nccl": ProbeSettings(nodes_per_job=2)})
    assert [(r.nodes, r.size) for r in requests] == [(("a",), 2), (("b",), 2)]
    assert all(set(r.partners) <= {"c", "d", "e", "f"} and len(r.partners) == 4 for r in requests)

    out = fleet.feed([fleet.nccl(("a", "c"), group=220e9, priority=True), fleet.nccl(("b", "d"), priority=True)])
    assert verdict(fleet, "a", "nccl") == ("degraded", "localised")
    assert {verdict(fleet, n, "nccl") for n in "bcd"} == {("pass", "ok")}  # the innocent partner, and c, cleared
    (rec,) = out.recommendations
    assert (rec.node, rec.reason_code) == ("a", ReasonCode.LOCALISED)
    assert rec.evidence["partners"] == ["b", "c"]
    assert rec.text.startswith("multi-node results are bad with this node (2 of its last 3, with b, c)")


def test_a_bad_larger_group_is_bisected() -> None:
    names = [f"n{i:02d}" for i in range(12)]
    fleet = Fleet(names)
    groups = [tuple(names[i:i + 4]) for i in range(0, 12, 4)]
    for shift in range(3):
        fleet.feed([fleet.nccl(tuple(names[(j + shift * 5) % 12] for j in range(i, i + 4))) for i in range(0, 12, 4)])
    out = fleet.feed([fleet.nccl(groups[0], group=180e9), fleet.nccl(groups[1]), fleet.nccl(groups[2])], advance=60)
    assert sorted((r.kind, r.nodes) for r in out.requests) == [("bisect", ("n00", "n01")), ("bisect", ("n02", "n03"))]
    requests = fleet.judge.requests(fleet.t, {"nccl": ProbeSettings(nodes_per_job=4)})
    assert [(r.nodes, r.size, len(r.partners) >= 2) for r in requests] == [(("n00", "n01"), 4, True),
                                                                         (("n02", "n03"), 4, True)]
    out = fleet.feed([fleet.nccl(("n00", "n01", "n04", "n05"), group=180e9, priority=True),
                      fleet.nccl(("n02", "n03", "n06", "n07"), priority=True)], advance=60)
    assert sorted((r.kind, r.nodes) for r in out.requests) == [("localise", ("n00",)), ("localise", ("n01",))]
    out = fleet.feed([fleet.nccl(("n00", "n08", "n09", "n10"), group=180e9, priority=True),
                      fleet.nccl(("n01", "n04", "n05", "n06"), priority=True)])
    assert [(r.node, r.reason_code) for r in out.recommendations] == [("n00", ReasonCode.LOCALISED)]
    assert {verdict(fleet, n, "nccl") for n in names if n != "n00"} == {("pass", "ok")}


def test_an_undrain_resets_the_evidence() -> None:
    fleet = Fleet([f"n{i}" for i in range(10)])
    fleet.healthy_gemm_rounds()
    fleet.feed([fleet.gemm("n7", {3: 300e12})], advance=60)
    fleet.feed([fleet.gemm("n7", {3: 300e12}, priority=True)])
    assert verdict(fleet, "n7") == ("fail", "below_floor")
    repaired_at = fleet.t
    fleet.t += 60
    out = fleet.feed([fleet.gemm("n7")], resets={"n7": repaired_at})
    # without the reset this would still be "fail" (2 of the last 3 bad); after it, only new runs count
    assert verdict(fleet, "n7") == ("pass", "ok") and out.recommendations == []


def test_state_survives_a_restart_through_the_store(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.sqlite")
    store.upsert_nodes(nodes([f"n{i}" for i in range(10)]), 1.0)
    fleet = Fleet([f"n{i}" for i in range(10)])
    keep = keep_seconds(fleet.judge.settings)
    for _ in range(3):
        store.save_judgement(fleet.feed([fleet.gemm(n) for n in fleet.names]), keep_s=keep)
    store.save_judgement(fleet.feed([fleet.gemm(n, {2: 350e12} if n == "n6" else None) for n in fleet.names],
                                    advance=60), keep_s=keep)
    restored = load_judge(store, JudgeSettings(), now=fleet.t)
    judge = fleet.judge
    assert restored.pending == judge.pending == {("n6", "gemm"): restored.pending[("n6", "gemm")]}
    assert isinstance(restored.pending[("n6", "gemm")], Request)
    # verdicts are stored when they change, so a restored pass keeps the run that first made it a pass
    assert {k: (v.outcome, v.reason_code, v.reason) for k, v in restored.verdicts.items()} == \
        {k: (v.outcome, v.reason_code, v.reason) for k, v in judge.verdicts.items()}
    assert {k: (s.accepted, s.baseline, s.floor) for k, s in restored.series.items()} == \
        {k: (s.accepted, s.baseline, s.floor) for k, s in judge.series.items()}
    assert restored.marks == judge.marks

    run = fleet.gemm("n6", {2: 350e12}, priority=True)
    a = judge.evaluate([run], fleet.nodes, now=fleet.t)
    b = restored.evaluate([run], fleet.nodes, now=fleet.t)
    assert [(v.node, v.outcome, v.reason) for v in a.verdicts] == [(v.node, v.outcome, v.reason) for v in b.verdicts]
    assert [r.node for r in b.recommendations] == ["n6"]
    store.close()


def a_bad_link_and_a_slow_gpu(store: Store) -> tuple[Fleet, list[Callable[[Fleet], list[RunInput]]]]:
    """Before the restart: a group suspect pair (localise requests) and a slow GPU (a re-probe)."""
    fleet = pairs_fleet(store)
    fleet.healthy_gemm_rounds()
    fleet.feed([fleet.nccl(("a", "b"), group=220e9), fleet.nccl(("c", "d")), fleet.nccl(("e", "f")),
                *(fleet.gemm(n, {2: 350e12} if n == "e" else None) for n in fleet.names)], advance=60)
    return fleet, [
        lambda f: [f.nccl(("a", "c"), group=220e9, priority=True), f.nccl(("b", "d"), priority=True),
                   f.gemm("e", {2: 350e12}, priority=True)],
        lambda f: [f.nccl(("a", "e"), group=220e9), f.nccl(("b", "c")), f.nccl(("d", "f")),
                   *(f.gemm(n, {2: 350e12} if n == "e" else None) for n in f.names)],
        lambda f: [f.nccl(("a", "f"), group=220e9, priority=True)],
    ]


def an_active_fleet_event(store: Store) -> tuple[Fleet, list[Callable[[Fleet], list[RunInput]]]]:
    """Before the restart: a fleet event on gemm, with one GPU far below the class as it is now."""
    fleet = Fleet([f"n{i:02d}" for i in range(12)])
    fleet.store = store
    fleet.healthy_gemm_rounds()
    fleet.feed([fleet.gemm(n, scale=0.7) for n in fleet.names], advance=60)
    fleet.feed([fleet.gemm(n, {1: 245e12} if n == "n02" else None, scale=0.7) for n in fleet.names], advance=60)
    return fleet, [
        lambda f: [f.gemm("n02", {1: 245e12}, scale=0.7, priority=True)],
        lambda f: [f.gemm(n) for n in f.names if n != "n02"],
        lambda f: [f.gemm(n, {1: 245e12} if n == "n02" else None) for n in f.names],
    ]


@pytest.mark.parametrize("scenario", [a_bad_link_and_a_slow_gpu, an_active_fleet_event])
def test_a_judge_restored_from_the_store_judges_the_next_runs_the_same(
        tmp_path: Path, scenario: Callable[[Store], tuple[Fleet, list[Callable[[Fleet], list[RunInput]]]]]) -> None:
    store = Store(tmp_path / "s.sqlite")
    fleet, rounds = scenario(store)
    store.upsert_nodes(fleet.nodes, 1.0)
    original, restored = fleet.judge, load_judge(store, fleet.judge.settings, now=fleet.t)
    probes = {"gemm": ProbeSettings(), "nccl": ProbeSettings(nodes_per_job=2)}
    assert restored.requests(fleet.t, probes) == original.requests(fleet.t, probes)
    assert restored.active_events() == original.active_events()
    for make in rounds:
        runs = make(fleet)
        a = original.evaluate(runs, fleet.nodes, now=fleet.t)
        b = restored.evaluate(runs, fleet.nodes, now=fleet.t)
        assert a == b and (a.verdicts or a.marks)
        assert restored.requests(fleet.t, probes) == original.requests(fleet.t, probes)
        fleet.t += 60
    assert {k: (v.outcome, v.reason_code, v.reason) for k, v in restored.verdicts.items()} == \
        {k: (v.outcome, v.reason_code, v.reason) for k, v in original.verdicts.items()}
    store.close()


@pytest.mark.parametrize("noise_band", [0.0, 0.06])
def test_noise_band_widens_thresholds(noise_band: float) -> None:
    judge = Judge(JudgeSettings(noise_band=noise_band))
    assert judge.drift_fraction == max(0.1, 2 * noise_band)
    assert judge.min_deviation == max(0.1, 2 * noise_band)


def test_reconfigure_keeps_the_state_and_applies_new_thresholds() -> None:
    fleet = Fleet([f"n{i}" for i in range(10)])
    fleet.healthy_gemm_rounds()
    fleet.judge.reconfigure(JudgeSettings(baseline={"drift_fraction": 0.5}, fleet={"min_deviation": 0.5}))
    out = fleet.feed([fleet.gemm("n4", scale=0.885)])  # 11.5% slow: flagged before, within the new thresholds
    assert [(v.node, v.outcome) for v in out.verdicts] == [] and verdict(fleet, "n4") == ("pass", "ok")
    assert len(fleet.judge.series[("n4", SeriesKey.of("gemm", "flop_per_second",
                                                      {"gpu": "0", "dtype": "bf16"}))].accepted) == 4


def test_a_confirmed_node_in_service_is_rechecked_soon_and_clears_after_a_repair() -> None:
    fleet = Fleet([f"n{i}" for i in range(10)])
    fleet.healthy_gemm_rounds()
    fleet.feed([fleet.gemm(n, {5: 350e12} if n == "n3" else None) for n in fleet.names], advance=60)
    fleet.feed([fleet.gemm("n3", {5: 350e12}, priority=True)], advance=60)
    assert fleet.judge.confirmed_findings() == {"n3": ("gemm",)}
    every = JudgeSettings().confirm.recheck_interval_s
    assert 0 < every < GEMM["gemm"].interval_s
    last = {("n3", "gemm"): fleet.t - every + 1}
    assert fleet.judge.priority_requests({}, GEMM, last, fleet.t) == []  # not yet
    last = {("n3", "gemm"): fleet.t - every}
    (req,) = fleet.judge.priority_requests({}, GEMM, last, fleet.t)
    assert (req.nodes, req.allow_drained, req.reason) == (("n3",), False, "recheck of a confirmed finding")
    # a node healthd drained itself is rechecked at the probe's interval only (it runs no user jobs)
    assert fleet.judge.priority_requests({"n3": ("gemm",)}, GEMM, last, fleet.t) == []
    # repaired: two good rechecks clear the finding
    fleet.feed([fleet.gemm("n3", priority=True)], advance=every)
    fleet.feed([fleet.gemm("n3", priority=True)], advance=every)
    assert verdict(fleet, "n3") == ("pass", "ok")
    assert fleet.judge.confirmed_findings() == {}


def test_chance_flag_counters_and_error_streaks_survive_a_restart(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.sqlite")
    fleet = Fleet([f"n{i}" for i in range(10)])
    fleet.store = store
    fleet.healthy_gemm_rounds()
    fleet.feed([fleet.gemm(n, scale=0.6 if n == "n7" else 1.0) for n in fleet.names], advance=60)  # flagged
    for _ in range(2):
        err = RunInput(fleet.rid(False), "gemm", ("n1",), Outcome.ERROR, "NCCL communicator init timed out", fleet.t)
        fleet.feed([err] + [fleet.gemm(n) for n in fleet.names if n != "n1"])
    original = fleet.judge
    assert original.error_streak == {("n1", "gemm"): 2}
    assert original.flag_rates[(CLASS, "gemm", False)][0] >= 1

    restored = load_judge(store, original.settings, now=fleet.t)
    assert dict(restored.flag_rates) == dict(original.flag_rates)
    assert restored.error_streak == original.error_streak
    assert restored.retests(CLASS, "gemm", group=False) == original.retests(CLASS, "gemm", group=False)

    err = RunInput(fleet.rid(False), "gemm", ("n1",), Outcome.ERROR, "NCCL communicator init timed out", fleet.t)
    runs = [err] + [fleet.gemm(n) for n in fleet.names if n != "n1"]
    a = original.evaluate(runs, fleet.nodes, now=fleet.t)
    b = restored.evaluate(runs, fleet.nodes, now=fleet.t)
    assert a == b and b.error_streaks[("n1", "gemm")] == 3
    assert restored.verdicts[("n1", "gemm")].reason_code == "repeated_errors"  # the third error in a row

    store.save_judgement(b)
    fleet.t += 900
    fleet.feed([fleet.gemm(n) for n in fleet.names])  # n1 passes: its streak ends, in the store too
    assert load_judge(store, original.settings, now=fleet.t).error_streak == {}
    store.close()


def test_series_state_packs_its_numbers_and_reads_them_back() -> None:
    key = SeriesKey.of("gemm", "flop_per_second", {"gpu": "0", "dtype": "bf16"})
    st = SeriesState("n1", key, [(1.0, 5.0), (2.0, 6.0)], None, 2.0, "r2", 3.0, None, 0.5)
    assert (st.accepted, st.accepted_count, st.last_value, st.last_at, st.floor, st.baseline, st.spread) == \
        ([(1.0, 5.0), (2.0, 6.0)], 2, None, 2.0, 3.0, None, 0.5)
    st.last_value, st.baseline = 7.0, 5.5
    st.accepted = [*st.accepted[1:], (3.0, 7.0)]
    assert (st.accepted, st.last_value, st.baseline) == ([(2.0, 6.0), (3.0, 7.0)], 7.0, 5.5)
    twin = st.copy()
    assert twin == st and twin is not st
    twin.floor = None
    assert twin != st and st.floor == 3.0
    assert SeriesState.packed("n1", key, "r2", st.pack()) == st
    with pytest.raises(ValueError, match="5 \\+ 2n"):
        SeriesState.packed("n1", key, "r2", array("d", [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]))


def test_series_windows_saved_before_as_json_are_still_read(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.sqlite")
    key = SeriesKey.of("gemm", "flop_per_second", {"gpu": "0", "dtype": "bf16"})
    store.save_judgement(JudgeOutput(at=10.0, series=[SeriesState("n1", key, [(1.0, 5.0), (2.0, 6.0)], 6.0, 2.0,
                                                                  "r2", 3.0, 5.5, 0.5)]))
    store.save_judgement(JudgeOutput(at=10.0, series=[SeriesState("n2", key, [], 4.0, 2.0, "r2")]))
    with store._tx() as db:
        db.execute("UPDATE judge_series SET accepted = '[[1.0, 4.0], [2.0, 4.5]]' WHERE node = 'n2'")
    saved = {s.node: s for s in store.load_judgement(since=0.0).series}
    assert saved["n1"] == SeriesState("n1", key, [(1.0, 5.0), (2.0, 6.0)], 6.0, 2.0, "r2", 3.0, 5.5, 0.5)
    assert saved["n2"] == SeriesState("n2", key, [(1.0, 4.0), (2.0, 4.5)], 4.0, 2.0, "r2")
    with store._tx() as db:
        db.execute("UPDATE judge_series SET accepted = x'000000000000f03f' WHERE node = 'n2'")
    with pytest.raises(StoreError, match="broken window of 1 numbers for n2"):
        store.load_judgement(since=0.0)
    store.close()


def leaf_fleet(topology: bool) -> Fleet:
    """128 nodes under 8 leaves of 16 (two spines), 3 healthy GEMM rounds."""
    from healthd.topology import SwitchRecord, build_topology

    names = [f"n{i:03d}" for i in range(128)]
    fleet = Fleet(names)
    if topology:
        leaves = [SwitchRecord(f"leaf{j}", tuple(names[j * 16:(j + 1) * 16]), level=0) for j in range(8)]
        spines = [SwitchRecord(f"spine{s}", switches=tuple(f"leaf{j}" for j in range(s * 4, s * 4 + 4)), level=1)
                  for s in range(2)]
        fleet.judge.set_topology(build_topology([*leaves, *spines], "tree"))
    fleet.healthy_gemm_rounds()
    return fleet


def test_a_leaf_failing_together_is_one_switch_finding_and_its_nodes_are_held() -> None:
    bad_leaf = {f"n{i:03d}" for i in range(16, 32)}
    results = {}
    for topology in (False, True):
        fleet = leaf_fleet(topology)
        recs, switch = [], []
        for _ in range(3):
            out = fleet.feed([fleet.gemm(n, scale=0.6 if n in bad_leaf | {"n100"} else 1.0) for n in fleet.names])
            recs += [r.node for r in out.recommendations]
            switch += out.switch_findings
        results[topology] = sorted(set(recs))
        if topology:
            (finding,) = {(e.switch, e.level, e.probe, e.active) for e in switch}
            assert finding == ("leaf1", 0, "gemm", True)
            assert switch[0].nodes == tuple(sorted(bad_leaf)) and switch[0].held == ("leaf1",)
            assert "switch leaf1 (level 0): gemm flagged on 16 of the 16 nodes" in switch[0].text
            outcome, code = verdict(fleet, "n020")
            assert (outcome, code) == ("degraded", "fleet_event")
            assert "switch leaf1" in fleet.judge.verdicts[("n020", "gemm")].reason
    # without topology, 17 of 128 flagged at once is an event forming in the class: every finding, the lone
    # bad node's too, is held for the event rule (healthd.judge.rounds; before it: 17 drains)
    assert results[False] == []
    assert results[True] == ["n100"]  # with it: the switch is named, and the lone bad node recommended


def test_a_repaired_leaf_ends_its_finding_and_no_topology_ends_every_finding() -> None:
    fleet = leaf_fleet(True)
    bad = {f"n{i:03d}" for i in range(32, 48)}
    out = fleet.feed([fleet.gemm(n, scale=0.6 if n in bad else 1.0) for n in fleet.names])
    assert [(e.switch, e.active) for e in out.switch_findings] == [("leaf2", True)]
    out = fleet.feed([fleet.gemm(n) for n in fleet.names])
    assert [(e.switch, e.active) for e in out.switch_findings] == [("leaf2", False)]
    fleet.feed([fleet.gemm(n, scale=0.6 if n in bad else 1.0) for n in fleet.names])
    fleet.judge.set_topology(None, now=fleet.t)
    out = fleet.feed([fleet.gemm(n) for n in fleet.names])
    assert [(e.switch, e.active) for e in out.switch_findings] == [("leaf2", False)]
    assert fleet.judge.part(Switches).findings.held == {}


def test_a_switch_finding_survives_a_restart_and_holds_once_the_topology_is_set(tmp_path: Path) -> None:
    fleet = leaf_fleet(True)
    fleet.store = Store(tmp_path / "s.sqlite")
    bad = {f"n{i:03d}" for i in range(32, 48)}
    fleet.feed([fleet.gemm(n, scale=0.6 if n in bad else 1.0) for n in fleet.names])
    topology = fleet.judge.topology
    restored = load_judge(fleet.store, fleet.judge.settings, now=fleet.t)
    switches = restored.part(Switches).findings
    assert [(e.switch, e.nodes) for e in switches.active.values()] == [("leaf2", tuple(sorted(bad)))]
    assert switches.holding("n040", "gemm") is None        # no topology yet: nothing held
    restored.set_topology(topology, now=fleet.t)
    held = switches.holding("n040", "gemm")
    assert held is not None and held.switch == "leaf2" and switches.holding("n000", "gemm") is None
    assert fleet.store.switch_findings(active_only=True)[0]["held"] == ["leaf2"]
    fleet.store.close()


def test_a_slow_gpu_under_a_held_leaf_is_still_recommended() -> None:
    """A switch (or a rack) explains its nodes being slow together, not one GPU slower than its node's others."""
    fleet = leaf_fleet(True)
    bad = {f"n{i:03d}" for i in range(48, 64)}
    recs = []
    for _ in range(3):
        runs = [fleet.gemm(n, {3: 700e12 * 0.6 * 0.4} if n == "n050" else None, scale=0.6 if n in bad else 1.0)
                for n in fleet.names]
        recs += fleet.feed(runs).recommendations
    assert fleet.judge.part(Switches).findings.holding("n050", "gemm") is not None
    assert sorted({r.node for r in recs}) == ["n050"]
    assert {str(f["gpu"]) for r in recs for f in findings_of(r.evidence)} == {"3"}


def test_a_new_container_image_restarts_the_nodes_baselines_and_says_so() -> None:
    """The whole fleet moves to a new image whose stack is 15% slower: against the old baselines
    every node drifts, which the judge can only call a fleet event (the control fleet, same image);
    with the image named, each node's gemm baselines start again, the run passes and its mark names
    both images."""
    old, new = "/shared/healthd/bundle@sha256:" + "ab" * 32, "/shared/healthd/bundle@sha256:" + "ef" * 32
    names = [f"n{i}" for i in range(6)]
    control, moved = Fleet(names), Fleet(names)
    for fleet in (control, moved):
        for _ in range(3):
            fleet.feed([replace(fleet.gemm(n), image=old) for n in names])
        assert {verdict(fleet, n) for n in names} == {("pass", "ok")}

    control.feed([replace(control.gemm(n, scale=0.85), image=old) for n in names], advance=60)
    assert {verdict(control, n)[1] for n in names} == {"fleet_event"}

    out = moved.feed([replace(moved.gemm(n, scale=0.85), image=new) for n in names])
    assert {verdict(moved, n) for n in names} == {("pass", "ok")}
    texts = {m.node: m.text for m in out.marks}
    assert texts["n0"].endswith(f"; image changed from {old} to {new}: baseline restarted"), texts["n0"]
    assert moved.judge.verdicts[("n0", "gemm")].reason == texts["n0"]
    saved = {(st.node, st.key.name, st.key.label_dict["gpu"]): st for st in out.series}
    assert saved[("n0", "flop_per_second", "0")].accepted_count == 1  # the new image's run alone
    out = moved.feed([replace(moved.gemm(n, scale=0.85), image=new) for n in names])
    assert {verdict(moved, n) for n in names} == {("pass", "ok")}
    assert "image changed" not in " ".join(m.text for m in out.marks)
    assert moved.judge.series[("n0", next(k for (n, k) in moved.judge.series if n == "n0"))].accepted_count == 2


def test_the_image_of_a_nodes_last_judged_run_survives_a_restart(tmp_path: Path) -> None:
    """The store keeps each run's image (``runs.container_image``, shown by ``/api/v1/runs``); a
    restarted daemon's judge knows the image each node's probe last ran in, so a change across the
    restart still restarts the baselines."""
    image = "/shared/healthd/bundle@sha256:" + "ab" * 32
    store = Store(tmp_path / "s.sqlite")
    env = Environment(launcher="srun", backend="gloo", device_type="cpu", python="3.11.2", container_image=image)
    store.add_run(run_id="r1", probe="gemm", nodes=("n0",), backend="slurm", job_id="7", submitted_at=990.0,
                  result_path=None)
    store.finish_run("r1", outcome=Outcome.PASS, reason="", finished_at=1000.0, judge=True,
                     result=ProbeResult(probe="gemm", run_id="r1", outcome=Outcome.PASS, started_at=995.0,
                                        finished_at=1000.0, nodes=["n0"], environment=env))
    (row,) = store.recent_runs()
    assert api_run(row)["container_image"] == image
    assert store.judged_images() == {}  # not judged yet: the restarted judge meets it as a new run
    (run,) = store.unjudged_runs()
    assert run.image == image
    judge = load_judge(store, JudgeSettings(), now=1000.0)
    store.save_judgement(judge.evaluate([run], nodes(["n0"]), now=1000.0), judged=["r1"])
    assert store.judged_images() == {("n0", "gemm"): image}
    assert load_judge(store, JudgeSettings(), now=1001.0).images == {("n0", "gemm"): image}
