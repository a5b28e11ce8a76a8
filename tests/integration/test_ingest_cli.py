"""``healthd ingest`` and ``healthd parse`` as real subprocesses against a temporary store, with
the real captures of ``tests/fixtures/tools/``; then the store, the metrics collector
(``healthd.metrics.Exposition``) and ``healthd status`` are read back. Every number asserted is read from
the fixture named next to it."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from healthd.ingest import parse_results, run_id_for
from healthd.metrics import render_text
from healthd.store import Store
from probes.result import Outcome, ProbeResult
from tests.golden_files import assert_golden
from tests.unit.test_metrics import lookup

REPO = Path(__file__).resolve().parents[2]
TOOLS = REPO / "tests" / "fixtures" / "tools"
A100 = TOOLS / "nccl_tests" / "v2.19_all_reduce_8xa100.txt"
WRONG = TOOLS / "nccl_tests" / "v2.17_all_reduce_wrong_data_2nodes.txt"
CUDA_FAILURE = TOOLS / "nccl_tests" / "v2.19_all_reduce_cuda_failure_no_rows.txt"
MULTI = TOOLS / "nccl_tests" / "v2.x_multi_collective_dgx2_error_column.txt"
GEMM = TOOLS / "param" / "compute_gemm_readme_cpu_gflops.txt"
FRAGMENT = TOOLS / "param" / "comms_fragment_trimmed_row.txt"
DCGMI = TOOLS / "dcgmi" / "dcgm3.3_diag_targeted_power_fail_gpu1.txt"
AT = 1714564800.0
AT_ISO = "2024-05-01T12:00:00Z"
BIG = {"collective": "all_reduce", "size_bytes": "134217728", "dtype": "float"}


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "healthd.toml"
    path.write_text(f'backend = "local"\nstate_dir = "{tmp_path / "state"}"\n')
    return path


def healthd(*argv: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "healthd.cli", *map(str, argv)], cwd=REPO, capture_output=True,
                          text=True, timeout=120, check=False)


def rid(tool: str, nodes: tuple[str, ...], path: Path) -> str:
    return run_id_for(tool, nodes, hashlib.sha256(path.read_bytes()).hexdigest())


def open_store(config: Path) -> Store:
    return Store(config.parent / "state" / "healthd.sqlite")


class Scraped:
    """The store's exposition with every detail (``[metrics] detail = "full"``), read back sample by sample."""

    def __init__(self, store: Store) -> None:
        self.get_sample_value = lookup(render_text(store, "slurm", "full"))


def metrics(store: Store) -> Scraped:
    return Scraped(store)


def test_ingest_stores_runs_that_metrics_and_status_show(config: Path) -> None:
    done = healthd("ingest", "--config", config, "--tool", "nccl-tests", "--time", AT_ISO, A100, WRONG, CUDA_FAILURE)
    assert done.returncode == 0, done.stderr
    a100_id = rid("nccl-tests", ("dkh",), A100)
    wrong_id = rid("nccl-tests", ("gpu-1-1", "gpu-1-7"), WRONG)
    cuda_id = rid("nccl-tests", ("nccltest08192",), CUDA_FAILURE)
    assert done.stdout.splitlines() == [
        f"{A100}: stored run {a100_id}: nccl_tests on dkh, outcome pass, 151 measurements, 1 check",
        f"{WRONG}: stored run {wrong_id}: nccl_tests on gpu-1-1,gpu-1-7, outcome fail, 151 measurements, 3 checks: "
        "wrong data: 4 out-of-bounds test instances, 2 results with wrong elements",
        f"{CUDA_FAILURE}: stored run {cuda_id}: nccl_tests on nccltest08192, outcome error, 0 measurements, "
        "0 checks: Test CUDA failure on nccltest08192 at common.cu:502: an illegal memory access was encountered",
    ]
    assert done.stderr == ""

    store = open_store(config)
    try:
        run = store.run(a100_id)
        assert run is not None
        assert (run.probe, run.state, run.outcome, run.source, run.backend) == (
            "nccl_tests", "finished", Outcome.PASS, "ingest", "ingest")
        assert (run.nodes, run.finished_at, run.started_at, run.result_path) == (("dkh",), AT, AT, str(A100))
        assert len(store.measurements(run_id=a100_id)) == 151
        wrong = store.run(wrong_id)
        assert wrong is not None and wrong.nodes == ("gpu-1-1", "gpu-1-7") and wrong.outcome is Outcome.FAIL
        failed = [c["detail"] for c in store.checks(wrong_id) if not c["ok"]]
        assert "all_reduce 1048576 B float out_of_place: 96 wrong elements (line 29)" in failed

        v = metrics(store).get_sample_value
        assert v("healthd_nccl_tests_busbw_bytes_per_second",
                 {"node": "dkh", "placement": "out_of_place", **BIG}) == pytest.approx(181.32e9)
        assert v("healthd_nccl_tests_time_seconds",
                 {"node": "dkh", "placement": "in_place", **BIG}) == pytest.approx(1284.21e-6)
        assert v("healthd_nccl_tests_avg_busbw_bytes_per_second",
                 {"node": "dkh", "collective": "all_reduce"}) == pytest.approx(34.9024e9)
        for node in ("gpu-1-1", "gpu-1-7"):  # a two-node measurement is shown for each node of the run
            assert v("healthd_nccl_tests_busbw_bytes_per_second",
                     {"node": node, "placement": "out_of_place", **BIG}) == pytest.approx(22.87e9)
            assert v("healthd_node_probe_last_outcome", {"node": node, "probe": "nccl_tests", "outcome": "fail"}) == 1
        assert v("healthd_node_probe_last_outcome",
                 {"node": "nccltest08192", "probe": "nccl_tests", "outcome": "error"}) == 1
        assert v("healthd_node_probe_last_run_timestamp_seconds", {"node": "dkh", "probe": "nccl_tests"}) == AT
        assert v("healthd_node_probe_last_success_timestamp_seconds", {"node": "dkh", "probe": "nccl_tests"}) == AT
        for outcome in ("pass", "fail", "error"):
            assert v("healthd_probe_runs_total", {"probe": "nccl_tests", "outcome": outcome}) == 1
    finally:
        store.close()

    status = healthd("status", "--config", config)
    lines = status.stdout.splitlines()
    assert "dkh  state=?  class=-" in lines
    assert any(line.startswith("  nccl_tests pass      last run 2024-05-01 12:00:00 UTC") for line in lines)
    assert any(line.startswith("  nccl_tests fail      last run 2024-05-01 12:00:00 UTC  wrong data: 4 out-of-bounds")
               for line in lines)


def test_the_same_file_is_stored_once(config: Path) -> None:
    first = healthd("ingest", "--config", config, "--tool", "nccl-tests", A100)
    assert first.returncode == 0, first.stderr
    again = healthd("ingest", "--config", config, "--tool", "nccl-tests", "--time", AT_ISO, A100)
    assert again.returncode == 0, again.stderr
    run_id = rid("nccl-tests", ("dkh",), A100)
    assert again.stdout.splitlines() == [f"{A100}: already stored as run {run_id} (nccl_tests on dkh, outcome pass)"]
    store = open_store(config)
    try:
        assert [r.run_id for r in store.recent_runs()] == [run_id]
        assert len(store.measurements()) == 151
        assert metrics(store).get_sample_value("healthd_probe_runs_total",
                                               {"probe": "nccl_tests", "outcome": "pass"}) == 1
        # without --time, the file's modification time
        assert store.run(run_id).finished_at == A100.stat().st_mtime  # type: ignore[union-attr]
    finally:
        store.close()


def test_bad_files_do_not_stop_the_others(config: Path, tmp_path: Path) -> None:
    missing = tmp_path / "missing.txt"
    done = healthd("ingest", "--config", config, "--tool", "param-compute", "--node", "n9", "--time", "1714564800",
                   missing, FRAGMENT, GEMM)
    assert done.returncode == 1
    assert done.stderr.splitlines() == [f"{missing}: cannot read: No such file or directory"]
    fragment_id = rid("param-compute", ("n9",), FRAGMENT)
    gemm_id = rid("param-compute", ("n9",), GEMM)
    out = done.stdout.splitlines()
    assert len(out) == 2
    assert out[0].startswith(f"{FRAGMENT}: stored run {fragment_id}: param_compute on n9, outcome error, "
                             "0 measurements, 0 checks: unreadable param-compute output: param compute: ")
    assert out[1] == f"{GEMM}: stored run {gemm_id}: param_compute on n9, outcome pass, 16 measurements, 0 checks"
    store = open_store(config)
    try:
        assert store.run(fragment_id).outcome is Outcome.ERROR  # type: ignore[union-attr]
        v = metrics(store).get_sample_value
        assert v("healthd_param_compute_flop_per_second",
                 {"node": "n9", "dtype": "float32", "scope": "gemm:1024x4096x4096"}) == pytest.approx(1013.933e9)
        for outcome in ("pass", "error"):
            assert v("healthd_probe_runs_total", {"probe": "param_compute", "outcome": outcome}) == 1
    finally:
        store.close()


def test_output_without_a_node_needs_one(config: Path) -> None:
    done = healthd("ingest", "--config", config, "--tool", "dcgmi", DCGMI)
    assert done.returncode == 1
    assert done.stderr.splitlines() == [f"{DCGMI}: no node in the output; give --node"]
    assert done.stdout == ""
    store = open_store(config)
    try:
        assert store.recent_runs() == []
    finally:
        store.close()
    done = healthd("ingest", "--config", config, "--tool", "dcgmi", "--node", "gpu-07", DCGMI)
    assert done.returncode == 0, done.stderr
    assert done.stdout.endswith("dcgmi on gpu-07, outcome fail, 0 measurements, 19 checks: "
                                "dcgmi diag failed: Targeted Power\n")


def test_modification_time_is_the_default_time(config: Path, tmp_path: Path) -> None:
    copy = tmp_path / "ar.log"
    shutil.copyfile(A100, copy)
    os.utime(copy, (AT - 60, AT - 60))
    done = healthd("ingest", "--config", config, "--tool", "nccl-tests", copy)
    assert done.returncode == 0, done.stderr
    store = open_store(config)
    try:
        run = store.run(rid("nccl-tests", ("dkh",), copy))
        assert run is not None and run.finished_at == AT - 60
    finally:
        store.close()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--node", "bad node"], "argument --node: 'bad node' is not a node name"),
        (["--time", "yesterday"], "argument --time: 'yesterday' is neither unix seconds nor an ISO 8601 time"),
        (["--tool", "iperf"], "argument --tool: invalid choice: 'iperf'"),
    ],
)
def test_usage_errors(config: Path, argv: list[str], message: str) -> None:
    base = {"--tool": "nccl-tests"}
    args = [*(x for k, val in base.items() if k not in argv for x in (k, val)), *argv]
    done = healthd("ingest", "--config", config, *args, A100)
    assert done.returncode == 2
    assert message in done.stderr


def test_parse_prints_without_storing(config: Path) -> None:
    done = healthd("parse", "--tool", "nccl-tests", "--time", AT_ISO, MULTI)
    assert done.returncode == 0, done.stderr
    assert_golden("parse_nccl_tests_multi_collective.txt", done.stdout)
    as_json = healthd("parse", "--tool", "nccl-tests", "--time", AT_ISO, "--json", A100)
    assert as_json.returncode == 0, as_json.stderr
    docs = [ProbeResult.model_validate_json(line) for line in as_json.stdout.splitlines()]
    assert docs == parse_results(A100.read_text(), tool="nccl-tests", node=None, at=AT)
    assert len(docs[0].measurements) == 151 and docs[0].run_id is None
    assert not (config.parent / "state").exists()

    bad = healthd("parse", "--tool", "param-comms", FRAGMENT)
    assert bad.returncode == 1 and bad.stdout == ""
    assert bad.stderr.startswith(f"{FRAGMENT}: unreadable param-comms output: param comms: line 1: 3 values")


def test_a_half_written_run_is_finished(config: Path) -> None:
    run_id = rid("nccl-tests", ("dkh",), A100)
    store = open_store(config)
    try:  # what an ingest killed between its two store writes leaves behind
        store.add_run(run_id=run_id, probe="nccl_tests", nodes=("dkh",), backend="ingest", job_id=None,
                      submitted_at=AT, result_path=str(A100), source="ingest")
    finally:
        store.close()
    done = healthd("ingest", "--config", config, "--tool", "nccl-tests", "--time", AT_ISO, A100)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"{A100}: stored run {run_id}: nccl_tests on dkh, outcome pass, 151 measurements")
    store = open_store(config)
    try:
        run = store.run(run_id)
        assert run is not None and run.state == "finished" and run.outcome is Outcome.PASS
        assert len(store.measurements(run_id=run_id)) == 151
    finally:
        store.close()
