"""``healthd.parsers.expand``: merging a file's results, and the daemon-side parse of the
``nccl_tests`` probe's raw output. Inputs are real captures from ``tests/fixtures/tools/``;
every number asserted is read from them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from healthd.parsers.expand import expand_nccl_tests_result, merge_group, merge_results, worst_outcome
from healthd.parsers.tools import results_from_text
from probes.result import Measurement, Outcome, ProbeResult

NCCL = Path(__file__).resolve().parents[1] / "fixtures" / "tools" / "nccl_tests"
A100 = (NCCL / "v2.19_all_reduce_8xa100.txt").read_text()
WRONG = (NCCL / "v2.17_all_reduce_wrong_data_2nodes.txt").read_text()
CUDA_FAILURE = (NCCL / "v2.19_all_reduce_cuda_failure_no_rows.txt").read_text()
GATHER = (NCCL / "v2.18_all_gather_mpirun_tag_output.txt").read_text()
BIG = {"collective": "all_reduce", "size_bytes": "134217728", "dtype": "float"}


def entry(collective: str, output: str, *, exit_code: int | None = 0, error: str = "", **more: Any) -> dict[str, Any]:
    """One ``raw_outputs`` entry as ``probes.nccl_tests`` writes it."""
    program = f"{collective}_perf"
    return {
        "collective": collective, "program": program, "path": f"/opt/nccl-tests/build/{program}",
        "argv": [f"/opt/nccl-tests/build/{program}", "-b", "8", "-e", "1073741824", "-f", "2", "-g", "8"],
        "exit_code": exit_code, "signal": more.pop("signal", None), "timed_out": more.pop("timed_out", False),
        "error": error, "seconds": 1.5, "output": output, "output_bytes": len(output.encode()), "lines_cut": 0,
        **more,
    }  # fmt: skip


def probe_result(entries: Any, *, nodes: list[str] | None = None, **params: Any) -> ProbeResult:
    failing = [e for e in entries if isinstance(e, dict) and (e["error"] or e["exit_code"] != 0)] \
        if isinstance(entries, list) else []
    return ProbeResult(
        probe="nccl_tests", run_id="r-1", outcome=Outcome.ERROR if failing else Outcome.PASS,
        reason="; ".join(f"{e['program']}: {e['error'] or e['exit_code']}" for e in failing),
        started_at=1000.0, finished_at=1010.0, nodes=nodes if nodes is not None else ["n042"],
        params={"raw_outputs": entries, **params},
    )  # fmt: skip


def value(result: ProbeResult, name: str, **labels: str) -> float:
    found = [m for m in result.measurements if m.name == name and all(m.labels.get(k) == v for k, v in labels.items())]
    assert len(found) == 1, (name, labels, found)
    return found[0].value


def test_a_clean_run_becomes_measurements_on_the_run_node() -> None:
    result = probe_result([entry("all_reduce", A100)], tasks=1, gpus=8)
    out = expand_nccl_tests_result(result)
    assert out.outcome is Outcome.PASS and out.reason == ""
    assert (out.run_id, out.started_at, out.finished_at, out.nodes) == ("r-1", 1000.0, 1010.0, ["n042"])
    assert len(out.measurements) == 151
    # the Slurm node name, not the hostname nccl-tests printed ("dkh")
    assert {m.node for m in out.measurements} == {"n042"}
    assert value(out, "busbw_bytes_per_second", placement="out_of_place", **BIG) == pytest.approx(181.32e9)
    assert value(out, "time_seconds", placement="in_place", **BIG) == pytest.approx(1284.21e-6)
    assert value(out, "avg_busbw_bytes_per_second") == pytest.approx(34.9024e9)
    assert [(c.name, c.ok, c.node) for c in out.checks] == [("nccl_tests.out_of_bounds", True, "n042")]
    parsed = out.params["parsed"][0]
    assert (parsed["program"], parsed["nranks"], parsed["rows"], parsed["version"]) == ("all_reduce_perf", 8, 25,
                                                                                         "2.19.4")
    assert out.params["raw_outputs"] == result.params["raw_outputs"]


def test_two_binaries_add_up() -> None:
    out = expand_nccl_tests_result(probe_result([entry("all_reduce", A100), entry("all_gather", GATHER)]))
    assert out.outcome is Outcome.PASS
    gather = {"collective": "all_gather", "size_bytes": "134217728", "dtype": "float", "placement": "out_of_place"}
    assert value(out, "busbw_bytes_per_second", **gather) == pytest.approx(2.31e9)
    assert value(out, "busbw_bytes_per_second", placement="out_of_place", **BIG) == pytest.approx(181.32e9)
    assert {m.labels["collective"] for m in out.measurements} == {"all_reduce", "all_gather"}


def test_wrong_data_is_a_fail_whatever_the_exit_status() -> None:
    out = expand_nccl_tests_result(probe_result([entry("all_reduce", WRONG, exit_code=7)],
                                                nodes=["gpu-1-1", "gpu-1-7"], tasks=2, gpus=1))
    assert out.outcome is Outcome.FAIL
    assert out.reason == "all_reduce_perf: wrong data: 4 out-of-bounds test instances, 2 results with wrong elements"
    assert {m.node for m in out.measurements} == {None}  # a two-node measurement belongs to the group
    assert [c.detail for c in out.checks if not c.ok] == [
        "all_reduce 1048576 B float out_of_place: 96 wrong elements (line 29)",
        "all_reduce 1048576 B float in_place: 32 wrong elements (line 29)",
        "Out of bounds values : 4 FAILED",
    ]


def test_the_output_must_show_the_job_rank_count() -> None:
    # an 8-task job of a build without MPI: every task ran its own one-GPU test
    one_gpu = (NCCL / "v2.16_all_reduce_1gpu_overflowing_columns.txt").read_text()
    out = expand_nccl_tests_result(probe_result([entry("all_reduce", one_gpu)], tasks=8, gpus=1))
    assert out.outcome is Outcome.ERROR
    assert out.reason == ("all_reduce_perf: nccl-tests ran 1 ranks, the job 8 (8 tasks x 1 GPU); a build without "
                          "MPI needs one task per node (ranks_per_node = 1)")
    assert expand_nccl_tests_result(probe_result([entry("all_reduce", one_gpu)], tasks=1, gpus=1)).outcome \
        is Outcome.PASS
    assert expand_nccl_tests_result(probe_result([entry("all_reduce", A100)], tasks=1, gpus=4)).reason.startswith(
        "all_reduce_perf: nccl-tests ran 8 ranks, the job 4 (1 task x 4 GPUs)")


def test_a_tool_failure_with_its_exit_status_is_an_error() -> None:
    out = expand_nccl_tests_result(probe_result([entry("all_reduce", CUDA_FAILURE, exit_code=2)]))
    assert out.outcome is Outcome.ERROR
    assert out.reason == ("all_reduce_perf: exited with status 2: Test CUDA failure on nccltest08192 at "
                          "common.cu:502: an illegal memory access was encountered")
    assert out.measurements == []


def test_failed_bandwidth_check_exit_7_is_left_to_the_judge() -> None:
    # the A100 capture with the footer nccl-tests prints when NCCL_TESTS_MIN_BW is not met
    text = A100.replace("# Avg bus bandwidth    : 34.9024 ", "# Avg bus bandwidth    : 34.9024 FAILED")
    assert text != A100
    out = expand_nccl_tests_result(probe_result([entry("all_reduce", text, exit_code=7)]))
    assert out.outcome is Outcome.PASS
    assert out.reason == "all_reduce_perf: average bus bandwidth below NCCL_TESTS_MIN_BW (nccl-tests exit status 7)"
    assert len(out.measurements) == 151
    # the same exit status without that footer (and without wrong data) is unexplained: error
    plain = expand_nccl_tests_result(probe_result([entry("all_reduce", A100, exit_code=7)]))
    assert plain.outcome is Outcome.ERROR and plain.reason == "all_reduce_perf: exited with status 7"


def test_timeout_keeps_the_rows_printed_before_it() -> None:
    partial = "".join(A100.splitlines(keepends=True)[:19])  # header + the 8 and 16 byte rows
    out = expand_nccl_tests_result(probe_result([entry("all_reduce", partial, exit_code=None, timed_out=True,
                                                       signal="SIGTERM", error="did not finish within 30 s (killed)")]))
    assert out.outcome is Outcome.ERROR
    assert out.reason == "all_reduce_perf: did not finish within 30 s (killed)"
    assert sorted({m.labels["size_bytes"] for m in out.measurements}) == ["16", "8"]
    assert value(out, "time_seconds", placement="out_of_place", size_bytes="8") == pytest.approx(34.84e-6)
    assert value(out, "time_seconds", placement="in_place", size_bytes="16") == pytest.approx(36.26e-6)


def test_a_missing_binary_is_an_error_but_the_others_count() -> None:
    missing = entry("all_gather", "", exit_code=None,
                    error="not run: /opt/nccl-tests/build/all_gather_perf not found (nor all_gather_perf_mpi)")
    out = expand_nccl_tests_result(probe_result([entry("all_reduce", A100), missing]))
    assert out.outcome is Outcome.ERROR
    assert out.reason == ("all_gather_perf: not run: /opt/nccl-tests/build/all_gather_perf not found "
                          "(nor all_gather_perf_mpi)")
    assert len(out.measurements) == 151


def test_unreadable_or_empty_output_is_an_error() -> None:
    out = expand_nccl_tests_result(probe_result([entry("all_reduce", "Segmentation fault\n")]))
    assert out.outcome is Outcome.ERROR and out.reason.startswith("all_reduce_perf: unreadable output: ")
    out = expand_nccl_tests_result(probe_result([entry("all_reduce", "")]))
    assert (out.outcome, out.reason) == (Outcome.ERROR, "all_reduce_perf: no output")


def test_malformed_raw_outputs() -> None:
    assert expand_nccl_tests_result(probe_result([])).reason == "nccl_tests: no nccl-tests binary was run"
    out = expand_nccl_tests_result(probe_result("not a list"))
    assert (out.outcome, out.reason) == (Outcome.ERROR, "nccl_tests: raw_outputs is not a list")
    out = expand_nccl_tests_result(probe_result([entry("all_reduce", A100), 42]))
    assert out.outcome is Outcome.ERROR and out.reason == "raw_outputs[1]: raw output entry is not an object"


def test_an_interrupted_probe_is_an_error() -> None:
    out = expand_nccl_tests_result(probe_result([entry("all_reduce", A100)], interrupted="terminated by SIGTERM"))
    assert (out.outcome, out.reason) == (Outcome.ERROR, "nccl_tests: terminated by SIGTERM")
    assert len(out.measurements) == 151


def test_other_results_pass_through_unchanged() -> None:
    other = ProbeResult(probe="nccl", outcome=Outcome.PASS, started_at=1.0, finished_at=2.0,
                        measurements=[Measurement(name="busbw_bytes_per_second", value=1.0)])
    assert expand_nccl_tests_result(other) is other
    ingested = results_from_text("nccl-tests", A100, at=5.0)[0]
    assert expand_nccl_tests_result(ingested) is ingested


def test_merge_groups_by_node_set_and_keeps_the_worst() -> None:
    multi = (NCCL / "v2.x_multi_collective_dgx2_error_column.txt").read_text()
    parts = results_from_text("nccl-tests", multi, at=5.0) + results_from_text("nccl-tests", A100, at=6.0)
    merged = merge_results(parts)
    assert [(r.nodes, r.outcome) for r in merged] == [(["seville"], Outcome.FAIL), (["dkh"], Outcome.PASS)]
    assert merged[1] is parts[-1]
    assert len(merged[0].measurements) == sum(len(p.measurements) for p in parts[:5])
    assert (merged[0].started_at, merged[0].finished_at) == (5.0, 5.0)
    doubled = merge_group([parts[-1], parts[-1]])
    assert len(doubled.measurements) == 151 and doubled.params["duplicate_measurements_dropped"] == 151
    with pytest.raises(ValueError, match="different probes"):
        merge_group([parts[-1], parts[-1].model_copy(update={"probe": "nccl"})])
    assert worst_outcome([Outcome.SKIPPED, Outcome.PASS]) is Outcome.PASS
    assert worst_outcome([Outcome.PASS, Outcome.ERROR, Outcome.FAIL]) is Outcome.FAIL
    assert worst_outcome([Outcome.SKIPPED]) is Outcome.SKIPPED
