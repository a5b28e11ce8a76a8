"""``healthd.ingest``: file bytes + tool + node + time → the runs to store (pure).

Every number asserted here is read from the fixture named next to it
(``tests/fixtures/tools/``, provenance in each folder's README).
"""

from __future__ import annotations

import hashlib
from datetime import datetime
from pathlib import Path

import pytest

from healthd.ingest import IngestError, Prepared, content_digest, parse_time, prepare, run_id_for
from probes.result import Outcome, ProbeResult

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "tools"
A100 = FIXTURES / "nccl_tests" / "v2.19_all_reduce_8xa100.txt"
MULTI = FIXTURES / "nccl_tests" / "v2.x_multi_collective_dgx2_error_column.txt"
TWO_NODES_WRONG = FIXTURES / "nccl_tests" / "v2.17_all_reduce_wrong_data_2nodes.txt"
CUDA_FAILURE = FIXTURES / "nccl_tests" / "v2.19_all_reduce_cuda_failure_no_rows.txt"
NO_HOST = FIXTURES / "nccl_tests" / "v2.4_all_gather_no_hash_prefix_out_of_bounds.txt"
GEMM = FIXTURES / "param" / "compute_gemm_readme_cpu_gflops.txt"
COMMS_FRAGMENT = FIXTURES / "param" / "comms_fragment_trimmed_row.txt"
HOROVOD = FIXTURES / "horovod" / "tf2_16gpu_2nodes_mpirun.txt"
DCGMI_FAIL = FIXTURES / "dcgmi" / "dcgm3.3_diag_targeted_power_fail_gpu1.txt"
AT = 1714564800.0  # 2024-05-01T12:00:00Z


def one(prepared: list[Prepared]) -> Prepared:
    assert len(prepared) == 1, prepared
    return prepared[0]


def value(result: ProbeResult, name: str, **labels: str) -> float:
    found = [m.value for m in result.measurements if m.name == name and all(m.labels.get(k) == v
                                                                            for k, v in labels.items())]
    assert len(found) == 1, (name, labels, found)
    return found[0]


# --------------------------------------------------------------------------- time


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1714564800", AT),
        ("1714564800.25", AT + 0.25),
        ("2024-05-01T12:00:00Z", AT),
        ("2024-05-01T14:00:00+02:00", AT),
        ("2024-05-01 12:00:00+00:00", AT),
    ],
)
def test_parse_time_unix_and_iso(text: str, expected: float) -> None:
    assert parse_time(text) == expected


def test_parse_time_without_offset_is_local_time() -> None:
    assert parse_time("2024-05-01T12:00:00") == datetime(2024, 5, 1, 12, 0, 0).timestamp()


@pytest.mark.parametrize("text", ["yesterday", "nan", "inf", "-5", "0", "2024-13-01T00:00:00Z", ""])
def test_parse_time_refuses(text: str) -> None:
    with pytest.raises(ValueError):
        parse_time(text)


# --------------------------------------------------------------------------- nccl-tests


def test_nccl_tests_file_attributed_to_the_device_listing_host() -> None:
    data = A100.read_bytes()
    item = one(prepare(data, tool="nccl-tests", node=None, at=AT, name=str(A100)))
    r = item.result
    assert item.readable
    assert item.nodes == ("dkh",) and r.nodes == ["dkh"]
    assert item.run_id == r.run_id == run_id_for("nccl-tests", ("dkh",), hashlib.sha256(data).hexdigest())
    assert item.run_id.startswith("ingest-nccl-tests-dkh-") and len(item.run_id) == len("ingest-nccl-tests-dkh-") + 16
    assert r.probe == "nccl_tests" and r.outcome is Outcome.PASS and r.reason == ""
    assert r.started_at == r.finished_at == AT
    # 25 rows x 2 placements x (time, algbw, busbw) + the average
    assert len(r.measurements) == 151
    assert {m.node for m in r.measurements} == {"dkh"}
    big = {"collective": "all_reduce", "size_bytes": "134217728", "dtype": "float"}
    assert value(r, "busbw_bytes_per_second", placement="out_of_place", **big) == pytest.approx(181.32e9)
    assert value(r, "busbw_bytes_per_second", placement="in_place", **big) == pytest.approx(182.90e9)
    assert value(r, "algbw_bytes_per_second", placement="out_of_place", **big) == pytest.approx(103.61e9)
    assert value(r, "time_seconds", placement="out_of_place", **big) == pytest.approx(1295.41e-6)
    assert value(r, "time_seconds", placement="in_place", collective="all_reduce", size_bytes="8") == pytest.approx(
        36.18e-6
    )
    assert value(r, "avg_busbw_bytes_per_second") == pytest.approx(34.9024e9)
    assert [(c.name, c.ok) for c in r.checks] == [("nccl_tests.out_of_bounds", True)]


def test_node_option_does_not_override_the_output_hosts() -> None:
    item = one(prepare(A100.read_bytes(), tool="nccl-tests", node="n9", at=AT, name="a"))
    assert item.nodes == ("dkh",)


def test_run_id_is_stable_and_depends_on_tool_nodes_and_content() -> None:
    data = GEMM.read_bytes()
    first = one(prepare(data, tool="param-compute", node="n9", at=AT, name="x")).run_id
    assert one(prepare(data, tool="param-compute", node="n9", at=AT + 3600, name="y")).run_id == first
    assert one(prepare(data, tool="param-compute", node="n10", at=AT, name="x")).run_id != first
    assert one(prepare(data + b"\n", tool="param-compute", node="n9", at=AT, name="x")).run_id != first
    assert first == run_id_for("param-compute", ("n9",), content_digest(data))


def test_a_log_of_five_binaries_is_one_run_with_the_worst_outcome() -> None:
    item = one(prepare(MULTI.read_bytes(), tool="nccl-tests", node=None, at=AT, name="multi"))
    r = item.result
    assert item.nodes == ("seville",)
    assert r.outcome is Outcome.FAIL
    assert r.reason == "all_gather_perf: wrong data: 4 out-of-bounds test instances"
    collectives = {m.labels["collective"] for m in r.measurements}
    assert collectives == {"all_gather", "all_reduce", "broadcast", "reduce", "reduce_scatter"}
    avg = {m.labels["collective"]: m.value for m in r.measurements if m.name == "avg_busbw_bytes_per_second"}
    assert avg == pytest.approx({"all_gather": 30.2993e9, "all_reduce": 42.5578e9, "broadcast": 41.2456e9,
                                 "reduce": 41.3386e9, "reduce_scatter": 20.3609e9})
    assert [c.ok for c in r.checks if c.name == "nccl_tests.out_of_bounds"] == [False, True, True, True, True]
    assert [p["program"] for p in r.params["parts"]] == [
        "all_gather_perf", "all_reduce_perf", "broadcast_perf", "reduce_perf", "reduce_scatter_perf"]


def test_a_two_node_run_is_filed_under_both_nodes() -> None:
    item = one(prepare(TWO_NODES_WRONG.read_bytes(), tool="nccl-tests", node=None, at=AT, name="w"))
    r = item.result
    assert item.nodes == ("gpu-1-1", "gpu-1-7")
    assert item.run_id.startswith("ingest-nccl-tests-gpu-1-1+1-")
    assert r.outcome is Outcome.FAIL
    assert r.reason == "wrong data: 4 out-of-bounds test instances, 2 results with wrong elements"
    assert {m.node for m in r.measurements} == {None}
    wrong = [c.detail for c in r.checks if c.name == "nccl_tests.wrong_elements"]
    assert wrong == [
        "all_reduce 1048576 B float out_of_place: 96 wrong elements (line 29)",
        "all_reduce 1048576 B float in_place: 32 wrong elements (line 29)",
    ]


def test_a_failed_tool_run_is_stored_as_an_error_run() -> None:
    item = one(prepare(CUDA_FAILURE.read_bytes(), tool="nccl-tests", node=None, at=AT, name="f"))
    assert item.readable and item.nodes == ("nccltest08192",)
    assert item.result.outcome is Outcome.ERROR
    assert item.result.reason == (
        "Test CUDA failure on nccltest08192 at common.cu:502: an illegal memory access was encountered")
    assert item.result.measurements == []


def test_output_without_host_needs_a_node() -> None:
    with pytest.raises(IngestError, match=r"^some/file.txt: no node in the output; give --node$"):
        prepare(NO_HOST.read_bytes(), tool="nccl-tests", node=None, at=AT, name="some/file.txt")
    item = one(prepare(NO_HOST.read_bytes(), tool="nccl-tests", node="n9", at=AT, name="x"))
    assert item.nodes == ("n9",)
    assert item.result.outcome is Outcome.FAIL
    assert item.result.reason == "wrong data: 2 out-of-bounds test instances"


def test_a_host_that_is_not_a_node_name_is_refused() -> None:
    text = A100.read_text().replace(" on        dkh device", " on       -dkh device")
    with pytest.raises(IngestError, match=r"^bad: the output names host '-dkh', which is not a node name"):
        prepare(text.encode(), tool="nccl-tests", node="n9", at=AT, name="bad")


# --------------------------------------------------------------------------- other tools


def test_param_compute_on_the_given_node() -> None:
    item = one(prepare(GEMM.read_bytes(), tool="param-compute", node="n9", at=AT, name="g"))
    r = item.result
    assert item.nodes == ("n9",) and r.probe == "param_compute" and r.outcome is Outcome.PASS
    assert {m.node for m in r.measurements} == {"n9"}
    assert value(r, "flop_per_second", scope="gemm:1024x4096x4096", dtype="float32") == pytest.approx(1013.933e9)
    assert value(r, "step_seconds", scope="gemm:128x4096x4096") == pytest.approx(0.519193 / 100)


def test_horovod_and_dcgmi() -> None:
    h = one(prepare(HOROVOD.read_bytes(), tool="horovod", node="n9", at=AT, name="h")).result
    assert value(h, "throughput_samples_per_second", scope="per_gpu") == pytest.approx(573.2)
    assert value(h, "throughput_samples_per_second", scope="total") == pytest.approx(9170.8)
    d = one(prepare(DCGMI_FAIL.read_bytes(), tool="dcgmi", node="n9", at=AT, name="d")).result
    assert d.outcome is Outcome.FAIL and d.reason == "dcgmi diag failed: Targeted Power"
    assert [(c.name, c.gpu) for c in d.checks if not c.ok] == [("dcgmi.Targeted Power", 1)]
    assert len(d.checks) == 19


def test_unreadable_output_becomes_an_error_run_on_the_given_node() -> None:
    data = COMMS_FRAGMENT.read_bytes()
    item = one(prepare(data, tool="param-comms", node="n9", at=AT, name="frag"))
    assert not item.readable
    assert item.nodes == ("n9",) and item.run_id == run_id_for("param-comms", ("n9",), content_digest(data))
    r = item.result
    assert r.probe == "param_comms" and r.outcome is Outcome.ERROR and r.run_id == item.run_id
    assert r.reason == ("unreadable param-comms output: param comms: line 1: 3 values do not match a known "
                        "COMMS-RES layout (7, 9 or 10 values)")
    assert r.measurements == [] and r.started_at == AT
    with pytest.raises(IngestError, match=r"^frag: unreadable param-comms output: .*; no node in the output; give"):
        prepare(data, tool="param-comms", node=None, at=AT, name="frag")


def test_oversized_file_is_an_error_run(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("healthd.ingest.MAX_FILE_BYTES", 500)
    item = one(prepare(GEMM.read_bytes(), tool="param-compute", node="n9", at=AT, name="big"))
    assert not item.readable and item.result.outcome is Outcome.ERROR
    assert "larger than" in item.result.reason


def test_unknown_tool() -> None:
    with pytest.raises(ValueError, match="unknown tool 'iperf'"):
        prepare(b"x", tool="iperf", node="n9", at=AT, name="x")
