"""Properties: noise within the configured band never yields ``fail`` (nor anything but a pass), and
``error`` runs never yield a recommendation or a drain, whatever numbers they carry."""

from __future__ import annotations

import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from healthd.config import FloorRule, JudgeSettings, RemediationSettings
from healthd.judge.engine import Judge
from healthd.judge.model import CheckInput, MeasurementInput, RunInput
from healthd.judge.persist import keep_seconds
from healthd.model import Node, Outcome
from healthd.remediation import Remediator
from healthd.simulate import ClassSpec, Scenario, SimCluster
from healthd.store import Store

GIB = str(1 << 30)


def node_list(n: int) -> list[Node]:
    return [Node(f"n{i}", "idle", gpus=8, gpu_type="h100", node_class="h100x8") for i in range(n)]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    n_nodes=st.integers(1, 7),
    rounds=st.integers(1, 6),
    band=st.floats(0.0, 0.045),
    nominal=st.floats(1e11, 1e15),
    floor_ratio=st.one_of(st.none(), st.floats(0.2, 1.0)),
    data=st.data(),
)
def test_noise_within_the_band_never_fails(n_nodes: int, rounds: int, band: float, nominal: float,
                                           floor_ratio: float | None, data: st.DataObject) -> None:
    floors = []
    if floor_ratio is not None:
        floor = nominal * (1 - band) * floor_ratio  # the floor sits at or under the band's low edge
        floors = [FloorRule(node_class=["*"], probe="gemm", name="flop_per_second", value=floor),
                  FloorRule(node_class=["*"], probe="nccl", name="busbw_bytes_per_second", value=floor)]
    judge = Judge(JudgeSettings(noise_band=band, floors=floors, default_floors=False))
    nodes = node_list(n_nodes)
    mult = st.floats(1 - band, 1 + band)
    t, k = 1000.0, 0
    for _ in range(rounds):
        runs = []
        for node in nodes:
            k += 1
            ms = tuple(MeasurementInput("flop_per_second", nominal * data.draw(mult), {"gpu": str(g), "dtype": "bf16"},
                                        node.name) for g in range(8))
            runs.append(RunInput(f"{k:016x}", "gemm", (node.name,), Outcome.PASS, "", t, ms))
        for a, b in zip(nodes[::2], nodes[1::2], strict=False):
            k += 1
            ms = tuple(MeasurementInput("busbw_bytes_per_second", nominal * data.draw(mult),
                                        {"size_bytes": GIB, "scope": "node"}, n.name) for n in (a, b))
            ms += (MeasurementInput("busbw_bytes_per_second", nominal * data.draw(mult),
                                    {"size_bytes": GIB, "scope": "group"}, None),)
            runs.append(RunInput(f"{k:016x}", "nccl", (a.name, b.name), Outcome.PASS, "", t, ms))
        out = judge.evaluate(runs, nodes, now=t)
        assert {v.outcome for v in out.verdicts} <= {Outcome.PASS}, [v.reason for v in out.verdicts]
        assert out.recommendations == [] and out.requests == [] and out.fleet_events == []
        t += 900.0
    assert all(v.outcome is Outcome.PASS for v in judge.verdicts.values())


KIND = st.sampled_from(["pass", "error_with_terrible_numbers", "error_with_failed_checks", "error_bare"])


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(events=st.lists(st.tuples(st.integers(0, 5), KIND), min_size=1, max_size=40))
def test_errors_never_yield_a_recommendation_or_a_drain(events: list[tuple[int, str]]) -> None:
    scenario = Scenario(classes=[ClassSpec(name="h100x8", count=6, prefix="n", gpu_type="h100")])
    cluster = SimCluster(scenario)
    nodes = cluster.list_nodes()
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(Path(tmp) / "s.sqlite")
        clock = [1000.0]
        remediation = RemediationSettings(mode="enforce", undrain_after_passes=1, max_actions_per_hour=100)
        remediator = Remediator(store, cluster, remediation, clock=lambda: clock[0])
        judge = Judge(JudgeSettings())
        for k, (i, kind) in enumerate(events):
            node = nodes[i].name
            at = clock[0]
            if kind == "pass":
                ms = tuple(MeasurementInput("flop_per_second", 700e12 * (1 + 0.001 * (g % 3)),
                                            {"gpu": str(g), "dtype": "bf16"}, node) for g in range(8))
                run = RunInput(f"{k:016x}", "gemm", (node,), Outcome.PASS, "", at, ms)
            elif kind == "error_with_terrible_numbers":
                ms = tuple(MeasurementInput("flop_per_second", 1e9, {"gpu": str(g), "dtype": "bf16"}, node)
                           for g in range(8))
                run = RunInput(f"{k:016x}", "gemm", (node,), Outcome.ERROR, "rank 3 died", at, ms)
            elif kind == "error_with_failed_checks":
                run = RunInput(f"{k:016x}", "gemm", (node,), Outcome.ERROR, "timeout", at, (),
                               (CheckInput("gemm.gpus", "2 of 8 GPUs", node=node),))
            else:
                run = RunInput(f"{k:016x}", "gemm", (node,), Outcome.ERROR, "submit failed", at)
            out = judge.evaluate([run], nodes, now=at)
            store.save_judgement(out, keep_s=keep_seconds(judge.settings))
            remediator.apply(out)
            assert {v.outcome for v in out.verdicts} <= {Outcome.PASS, Outcome.ERROR}
            clock[0] += 300.0
        assert cluster.drain_log == []
        assert store.recommendations(states=("active", "cleared", "withdrawn", "dismissed")) == []
        assert [a for a in store.audit() if a.action == "drain"] == []
        store.close()
