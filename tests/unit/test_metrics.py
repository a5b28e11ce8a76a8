from __future__ import annotations

import gc
import gzip
import shutil
import subprocess
import tracemalloc
from collections.abc import Callable
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

import healthd.metrics as metrics_module
from healthd.http import ExpositionCache
from healthd.judge.model import JudgeOutput, SeriesKey, SeriesState
from healthd.metrics import DaemonMetrics, Detail, Exposition
from healthd.model import Node, Outcome, Verdict
from healthd.store import Store
from probes.result import Measurement, ProbeResult


@pytest.fixture
def store(tmp_path: Path) -> Store:
    s = Store(tmp_path / "s.sqlite")
    s.upsert_nodes([Node("n1", "idle", gpus=8, gpu_type="h100", node_class="h100x8"), Node("n2", "allocated")], 1.0)
    for run_id, probe, nodes, outcome, ms in [
        ("g1", "gemm", ("n1",), Outcome.PASS,
         [Measurement(name="flop_per_second", value=7.5e14, labels={"gpu": "0", "dtype": "bf16"}, node="n1"),
          Measurement(name="flop_per_second", value=7.4e14, labels={"gpu": "1", "dtype": "bf16"}, node="n1")]),
        ("p1", "nccl", ("n1", "n2"), Outcome.PASS,
         [Measurement(name="busbw_bytes_per_second", value=4.5e11,
                      labels={"collective": "all_reduce", "size_bytes": "1073741824", "placement": "out_of_place",
                              "scope": "group"})]),
        ("e1", "gemm", ("n2",), Outcome.ERROR, []),
    ]:
        s.add_run(run_id=run_id, probe=probe, nodes=nodes, backend="slurm", job_id="1", submitted_at=100.0,
                  result_path=None)
        result = ProbeResult(probe=probe, run_id=run_id, outcome=outcome, started_at=100.0, finished_at=130.0,
                             measurements=ms) if ms else None
        s.finish_run(run_id, outcome=outcome, reason="" if ms else "exit code 1", finished_at=130.0, result=result)
    s.put_verdicts([Verdict("n1", "gemm", Outcome.PASS, reason_code="ok", at=130.0),
                    Verdict("n2", "gemm", Outcome.ERROR, "exit code 1", "probe_error", at=130.0)])
    return s


def scrape(store: Store, detail: Detail = "full") -> bytes:
    """What ``/metrics`` serves: the daemon's registry and the store's exposition."""
    reg = CollectorRegistry()
    DaemonMetrics(reg)
    return ExpositionCache(reg, exposition=Exposition(store, lambda: "slurm", detail)).get(False)[0]


def samples(text: bytes | str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    text = text.decode() if isinstance(text, bytes) else text
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def lookup(text: bytes | str) -> Callable[..., float | None]:
    """``get_sample_value`` over an exposition text."""
    found = samples(text)
    return lambda name, labels=None: found.get((name, frozenset((labels or {}).items())))


def test_values_from_the_store(store: Store) -> None:
    v = lookup(scrape(store))
    assert v("healthd_gemm_flop_per_second", {"node": "n1", "gpu": "1", "gpu_uuid": "", "dtype": "bf16"}) == 7.4e14
    group = {"collective": "all_reduce", "size_bytes": "1073741824", "placement": "out_of_place", "scope": "group"}
    assert v("healthd_nccl_busbw_bytes_per_second", {"node": "n1", **group}) == 4.5e11
    assert v("healthd_nccl_busbw_bytes_per_second", {"node": "n2", **group}) == 4.5e11
    assert v("healthd_node_probe_last_success_timestamp_seconds", {"node": "n1", "probe": "gemm"}) == 130.0
    assert v("healthd_node_probe_last_success_timestamp_seconds", {"node": "n2", "probe": "gemm"}) is None
    assert v("healthd_node_probe_last_run_timestamp_seconds", {"node": "n2", "probe": "gemm"}) == 130.0
    assert v("healthd_node_probe_last_outcome", {"node": "n2", "probe": "gemm", "outcome": "error"}) == 1.0
    assert v("healthd_node_probe_last_outcome", {"node": "n2", "probe": "gemm", "outcome": "pass"}) is None
    assert v("healthd_probe_runs_total", {"probe": "gemm", "outcome": "pass"}) == 1.0
    assert v("healthd_probe_runs_total", {"probe": "gemm", "outcome": "error"}) == 1.0
    assert v("healthd_probe_seconds_total", {"probe": "nccl"}) == 30.0
    assert v("healthd_probe_gpu_seconds_total", {"probe": "gemm"}) == 30.0 * 8  # n1 has 8 GPUs; n2's error run 0
    assert v("healthd_probe_gpu_seconds_total", {"probe": "nccl"}) == 30.0 * 8
    assert v("healthd_node_verdict", {"node": "n2", "probe": "gemm", "outcome": "error",
                                      "reason_code": "probe_error"}) == 1.0
    assert v("healthd_cluster_nodes", {"state": "idle"}) == 1.0
    assert v("healthd_node_info", {"node": "n1", "node_class": "h100x8", "gpu_type": "h100"}) == 1.0
    assert v("healthd_build_info", {"version": __import__("healthd").__version__,
                                    "python_version": __import__("platform").python_version(),
                                    "backend": "slurm"}) == 1.0
    assert v("healthd_probes_in_flight") == 0.0
    assert v("healthd_errors_total", {"kind": "parse"}) == 0.0


def test_no_run_or_job_ids_in_labels(store: Store) -> None:
    text = scrape(store).decode()
    for forbidden in ('run_id=', 'job_id=', '"g1"', '"p1"'):
        assert forbidden not in text


def test_node_leaving_the_store_leaves_the_scrape(tmp_path: Path) -> None:
    empty = Store(tmp_path / "e.sqlite")
    text = scrape(empty).decode()
    assert 'node="' not in text


@pytest.mark.promtool
@pytest.mark.parametrize("detail", ["summary", "full"])
def test_promtool_accepts_the_scrape(store: Store, detail: Detail) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed (Debian package 'prometheus'); scripts/test.sh installs it")
    text = scrape(store, detail)
    done = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, timeout=30, check=False)
    assert done.returncode == 0, done.stdout.decode() + done.stderr.decode()


def eight_gpu_node(store: Store, node: str, at: float) -> None:
    """One 8-GPU node probed by env, gemm (2 dtypes), nccl (2 collectives x 4 sizes x 2 placements) and ddp,
    every series judged with a baseline."""
    per_probe = {
        "env": [Measurement(name="visible_gpus", value=8, node=node)],
        "gemm": [Measurement(name="flop_per_second", value=7e14 if d == "bf16" else 1.3e15, node=node,
                             labels={"gpu": str(g), "dtype": d}) for g in range(8) for d in ("fp8", "bf16")]
        + [Measurement(name="memory_bandwidth_bytes_per_second", value=2.9e12, node=node, labels={"gpu": str(g)})
           for g in range(8)],
        "nccl": [Measurement(name="busbw_bytes_per_second", value=float(size), node=node,
                             labels={"collective": c, "size_bytes": str(size), "placement": p, "scope": "node"})
                 for c in ("all_gather", "all_reduce") for size in (8192, 1 << 20, 1 << 26, 1 << 30)
                 for p in ("in_place", "out_of_place")],
        "ddp": [Measurement(name="throughput_samples_per_second", value=2400.0, node=node),
                Measurement(name="model_flop_per_second", value=1e14, node=node, labels={"dtype": "bf16"}),
                Measurement(name="step_seconds", value=0.1, node=node, labels={"quantile": "0.5"})],
    }
    series = []
    for probe, ms in per_probe.items():
        run_id = f"{probe}-{node}-{at}"
        store.add_run(run_id=run_id, probe=probe, nodes=[node], backend="slurm", job_id=None, submitted_at=at,
                      result_path=None)
        store.finish_run(run_id, outcome=Outcome.PASS, reason="", finished_at=at + 10,
                         result=ProbeResult(probe=probe, run_id=run_id, outcome=Outcome.PASS, started_at=at,
                                            finished_at=at + 10, measurements=ms))
        series += [SeriesState(node, SeriesKey.of(probe, m.name, m.labels), [], m.value, at + 10, run_id,
                               m.value * 0.75, m.value * 1.25, None) for m in ms]
    store.save_judgement(JudgeOutput(at=at + 10, series=series, verdicts=[
        Verdict(node, probe, Outcome.PASS, reason_code="ok", at=at + 10) for probe in per_probe]))


def node_series(text: bytes, node: str) -> list[str]:
    return [line for line in text.decode().splitlines() if f'node="{node}"' in line and not line.startswith("#")]


def v_mfu(text: bytes) -> float | None:
    return lookup(text)("healthd_ddp_mfu_ratio", {"node": "g1", "dtype": "bf16"})


def test_summary_keeps_an_eight_gpu_node_within_the_budget(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.sqlite")
    store.upsert_nodes([Node("g1", "idle", gpus=8, gpu_type="h100", node_class="h100x8")], 1.0)
    eight_gpu_node(store, "g1", 100.0)
    summary, full = scrape(store, "summary"), scrape(store, "full")
    # 2 + 2 x 4 probes + (8 GEMM GPUs + 1 NCCL + 1 DDP + 1 MFU) headline + 3 baseline ratios (docs/metrics.md);
    # the 25th, the last full check, comes from the daemon's coverage collector
    assert len(node_series(summary, "g1")) == 24
    assert v_mfu(summary) == pytest.approx(1e14 / 989.4e12)
    assert len(node_series(full, "g1")) > 150
    v = lookup(summary)
    assert v("healthd_nccl_busbw_bytes_per_second", {"node": "g1", "collective": "all_reduce", "scope": "node",
                                                     "size_bytes": str(1 << 30), "placement": "out_of_place"}) == 2**30
    assert v("healthd_gemm_flop_per_second", {"node": "g1", "gpu": "7", "gpu_uuid": "", "dtype": "bf16"}) == 7e14
    assert v("healthd_gemm_flop_per_second", {"node": "g1", "gpu": "7", "gpu_uuid": "", "dtype": "fp8"}) is None
    assert v("healthd_node_probe_baseline_ratio", {"node": "g1", "probe": "nccl"}) == pytest.approx(1 / 1.25)
    assert v("healthd_node_verdict", {"node": "g1", "probe": "gemm", "outcome": "pass", "reason_code": "ok"}) == 1
    assert lookup(full)("healthd_nccl_busbw_bytes_per_second", {
        "node": "g1", "collective": "all_gather", "scope": "node", "size_bytes": "8192", "placement": "in_place"})
    assert not [line for line in node_series(summary, "g1") if line.endswith(" 0.0")], "no zero rows"


def test_a_refresh_renders_only_the_nodes_that_changed(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.sqlite")
    store.upsert_nodes([Node(f"g{i}", "idle", gpus=8, node_class="h100x8") for i in range(5)], 1.0)
    for i in range(5):
        eight_gpu_node(store, f"g{i}", 100.0)
    exposition = Exposition(store, lambda: "slurm")
    exposition.refresh()
    assert exposition.rendered_nodes == 5
    first = exposition.body()
    exposition.refresh()
    assert exposition.rendered_nodes == 5 and exposition.body() == first, "nothing changed: nothing rendered"
    eight_gpu_node(store, "g3", 200.0)
    store.upsert_nodes([Node("g4", "drained", gpus=8, node_class="h100x8")], 2.0)
    exposition.refresh()
    assert exposition.rendered_nodes == 6, "g3's results; g4's state shows only in healthd_cluster_nodes"
    text = exposition.body()
    assert gzip.decompress(exposition.body_gzip()) == text
    v = lookup(text)
    assert v("healthd_node_probe_last_run_timestamp_seconds", {"node": "g3", "probe": "gemm"}) == 210.0
    assert v("healthd_node_probe_last_run_timestamp_seconds", {"node": "g2", "probe": "gemm"}) == 110.0
    assert v("healthd_cluster_nodes", {"state": "drained"}) == 1.0
    assert text.count(b"# TYPE healthd_gemm_flop_per_second gauge") == 1, "one family block whatever the pieces"
    exposition.set_detail("full")
    exposition.refresh()
    assert exposition.rendered_nodes == 11
    fp8 = {"node": "g0", "gpu": "0", "gpu_uuid": "", "dtype": "fp8"}
    assert lookup(exposition.body())("healthd_gemm_flop_per_second", fp8)


@pytest.mark.parametrize("detail", ["summary", "full"])
def test_a_refresh_shows_what_a_full_read_shows(tmp_path: Path, detail: Detail) -> None:
    """The exposition keeps no rows: a node rendered again for any reason is read again whole."""
    store = Store(tmp_path / "s.sqlite")
    store.upsert_nodes([Node(f"g{i}", "idle", gpus=8, node_class="h100x8") for i in range(4)], 1.0)
    for i in range(4):
        eight_gpu_node(store, f"g{i}", 100.0)
    exposition = Exposition(store, lambda: "slurm", detail)
    exposition.refresh()

    def fresh() -> bytes:
        again = Exposition(store, lambda: "slurm", detail)
        again.refresh()
        return again.body()

    for change in (
        lambda: store.upsert_recommendation(node="g1", probe="gemm", outcome="fail", reason_code="below_floor",
                                            text="t", evidence={}, at=200.0),
        lambda: store.put_verdicts([Verdict("g2", "nccl", Outcome.DEGRADED, reason_code="baseline_drift",
                                            at=300.0)]),
        lambda: store.upsert_nodes([Node("g3", "idle", gpus=4, node_class="h100x4")], 2.0),
        lambda: eight_gpu_node(store, "g0", 400.0),
    ):
        rendered = exposition.rendered_nodes
        change()
        exposition.refresh()
        assert exposition.rendered_nodes == rendered + 1
        assert exposition.body() == fresh()
    assert lookup(exposition.body())("healthd_node_gpus", {"node": "g3"}) == 4.0
    assert lookup(exposition.body())("healthd_drain_recommended", {"node": "g1", "reason_code": "below_floor"}) == 1


def test_the_exposition_keeps_its_text_not_the_rows(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.sqlite")
    for i in range(40):
        eight_gpu_node(store, f"g{i:02}", 100.0)
    Exposition(store, lambda: "slurm", "full").refresh()
    tracemalloc.start()
    try:
        before = tracemalloc.take_snapshot()
        exposition = Exposition(store, lambda: "slurm", "full")
        exposition.refresh()
        gc.collect()
        alive = sum(d.size_diff for d in tracemalloc.take_snapshot().compare_to(before, "filename"))
    finally:
        tracemalloc.stop()
    assert 0 < alive < 4 * len(exposition.body())


def test_a_full_read_reads_and_renders_the_nodes_a_part_at_a_time(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Its memory is bounded by ``READ_NODES``, not by the fleet; the text is the same."""
    store = Store(tmp_path / "s.sqlite")
    for i in range(60):
        eight_gpu_node(store, f"g{i:02}", 100.0)
    store.put_verdicts([Verdict(f"g{i:02}", "gemm", Outcome.PASS, at=200.0) for i in range(60)])

    def first_read(read_nodes: int) -> tuple[bytes, int]:
        monkeypatch.setattr(metrics_module, "READ_NODES", read_nodes)
        tracemalloc.start()
        try:
            exposition = Exposition(store, lambda: "slurm", "full")
            exposition.refresh()
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        return exposition.body(), peak

    whole, whole_peak = first_read(1000)
    parts, parts_peak = first_read(6)
    assert parts == whole
    assert parts_peak < 0.8 * whole_peak, (parts_peak, whole_peak)


def test_each_node_s_switch_is_exported_once_the_topology_is_known(tmp_path: Path) -> None:
    from healthd.topology import SwitchRecord, build_topology

    store = Store(tmp_path / "s.sqlite")
    store.upsert_nodes([Node(f"g{i}", "idle", gpus=8, node_class="h100x8") for i in range(4)], 1.0)
    exposition = Exposition(store, lambda: "slurm")
    assert exposition.refresh_if_changed()
    assert b"healthd_node_switch" not in exposition.body()
    exposition.set_topology(build_topology([SwitchRecord("leaf0", ("g0", "g1")), SwitchRecord("leaf1", ("g2",)),
                                            SwitchRecord("spine0", switches=("leaf0", "leaf1"))], "tree"))
    assert exposition.refresh_if_changed(), "a new topology is a change"
    v = lookup(exposition.body())
    assert v("healthd_node_switch", {"node": "g0", "leaf": "leaf0", "path": "leaf0/spine0"}) == 1.0
    assert v("healthd_node_switch", {"node": "g2", "leaf": "leaf1", "path": "leaf1/spine0"}) == 1.0
    assert b'healthd_node_switch{node="g3"' not in exposition.body()
    exposition.set_topology(None)
    exposition.refresh_if_changed()
    assert b"healthd_node_switch" not in exposition.body()
    store.close()
