from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from healthd.http import ExpositionCache
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
    assert v("healthd_gemm_flop_per_second", {"node": "n1", "gpu": "1", "dtype": "bf16"}) == 7.4e14
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
