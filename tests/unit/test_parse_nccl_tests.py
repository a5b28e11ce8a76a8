"""The nccl-tests parser and converter against captured outputs (tests/fixtures/tools/nccl_tests,
see its README for where each file came from).

Every table value is checked twice: against an independent whitespace tokenisation of the
fixture's data lines (``_oracle_rows``, which knows nothing of headers or layouts and is
told each fixture's column order here), and for selected rows against numbers read off the
files by hand. Bandwidths are checked by arithmetic against nccl-tests' definitions, with
the rounding of the printed time taken into account.
"""

from __future__ import annotations

import math
from decimal import Decimal
from pathlib import Path

import pytest

from healthd.errors import ParseError
from healthd.parsers.nccl_tests import (
    NcclRow,
    NcclTestRun,
    NcclTiming,
    bus_factor,
    derived_busbw_gbps,
    dtype_size,
    parse_nccl_tests,
    strip_launcher_prefix,
    to_probe_results,
)
from probes.result import Outcome

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "tools" / "nccl_tests"

UNIFIED = ("size", "count", "type", "redop", "root", "t", "alg", "bus", "wrong", "t", "alg", "bus", "wrong")


def _text(name: str) -> str:
    return (FIXTURES / name).read_text()


def _single(name: str, **kwargs: str) -> NcclTestRun:
    out = parse_nccl_tests(_text(name), **kwargs)
    assert len(out.runs) == 1
    return out.runs[0]


def _oracle_rows(name: str) -> list[tuple[int, list[str]]]:
    """(line number, tokens) of every data line: prefixes cut with plain string operations,
    kept when the first two tokens are digits and the line does not start with '#'."""
    rows = []
    for number, raw in enumerate(_text(name).splitlines(), start=1):
        line = raw
        if line.startswith("[1,0]<stdout>:"):
            line = line[len("[1,0]<stdout>:") :]
        elif line.lstrip().startswith("0:"):
            line = line.lstrip()[2:]
        tokens = line.split()
        if len(tokens) >= 2 and tokens[0].isdigit() and tokens[1].isdigit() and "failure" not in line:
            rows.append((number, tokens))
    return rows


def _check_against_oracle(
    run: NcclTestRun, name: str, columns: tuple[str, ...], *, time_scale: float = 1.0, skip: int = 0
) -> None:
    oracle = _oracle_rows(name)[skip : skip + len(run.rows)]
    assert len(oracle) == len(run.rows)
    for (number, tokens), row in zip(oracle, run.rows, strict=True):
        assert row.line == number
        assert len(tokens) == len(columns), tokens
        timings = [row.out_of_place, row.in_place]
        group = -1
        for column, token in zip(columns, tokens, strict=True):
            if column == "size":
                assert row.size_bytes == int(token)
            elif column == "count":
                assert row.count == int(token)
            elif column == "type":
                assert row.dtype == token
            elif column == "redop":
                assert row.redop == token
            elif column == "root":
                assert row.root == int(token)
            elif column == "t":
                group += 1
                timing = timings[group]
                assert timing is not None
                assert timing.time_us == pytest.approx(float(token) * time_scale, rel=1e-12)
            else:
                timing = timings[group]
                assert timing is not None
                if column == "alg":
                    assert timing.algbw_gbps == float(token)
                elif column == "bus":
                    assert timing.busbw_gbps == float(token)
                elif column == "wrong":
                    assert timing.wrong == (None if token == "N/A" else int(float(token)))
                    assert timing.max_error is None
                elif column == "error":
                    assert timing.max_error == (None if token == "N/A" else float(token))
                    assert timing.wrong is None
                else:
                    extra = dict(timing.extra)
                    assert extra[column] == float(token)


def _delta(token: str) -> float:
    exponent = Decimal(token).as_tuple().exponent
    assert isinstance(exponent, int)
    return 0.5 * 10.0**exponent


def _check_bandwidth_arithmetic(
    run: NcclTestRun,
    name: str,
    columns: tuple[str, ...],
    collective: str,
    nranks: int,
    *,
    time_unit: float = 1.0,
    modern_algbw: bool = True,
) -> int:
    """busbw (and, for 2.13+ definitions, algbw) recomputed from size and the printed time.

    The printed time is rounded, so the recomputed value is an interval; the printed bandwidth
    (two decimals) must fall inside it. Returns how many values were checked."""
    positions = [i for i, c in enumerate(columns) if c == "t"]
    time_tokens = {number: [tokens[i] for i in positions] for number, tokens in _oracle_rows(name)}
    factor = bus_factor(collective, nranks)
    assert factor is not None
    checked = 0
    for row in run.rows:
        for timing, token in zip((row.out_of_place, row.in_place), time_tokens[row.line], strict=True):
            assert timing is not None and timing.time_us is not None and timing.busbw_gbps is not None
            t = float(token) * time_unit
            d = _delta(token) * time_unit
            lo = row.size_bytes * factor / 1e3 / (t + d)
            hi = row.size_bytes * factor / 1e3 / (t - d) if t > d else math.inf
            assert lo - 0.005 - 1e-9 <= timing.busbw_gbps <= hi + 0.005 + 1e-9, (row, lo, hi)
            derived = derived_busbw_gbps(collective, row.size_bytes, t, nranks)
            assert derived is not None and lo - 1e-9 <= derived <= hi + 1e-9
            if modern_algbw:
                alg_lo = row.size_bytes / 1e3 / (t + d)
                alg_hi = row.size_bytes / 1e3 / (t - d) if t > d else math.inf
                assert timing.algbw_gbps is not None
                assert alg_lo - 0.005 - 1e-9 <= timing.algbw_gbps <= alg_hi + 0.005 + 1e-9
            checked += 1
    return checked


# --------------------------------------------------------------------------- launcher prefixes


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        (" 0: # nThread 1 nGpus 1", "# nThread 1 nGpus 1"),
        ("12: #  Rank 12 Group", "#  Rank 12 Group"),
        (" 0:", ""),
        ("[1,0]<stdout>:#       size", "#       size"),
        ("[1,3]<stderr>:Authorization required", "Authorization required"),
        ("[0] #  Rank  0", "#  Rank  0"),
        ("           8             2     float", "           8             2     float"),
        ("GENOA-06:4766:4766 [0] NCCL INFO x", "GENOA-06:4766:4766 [0] NCCL INFO x"),
    ],
)
def test_strip_launcher_prefix(line: str, expected: str) -> None:
    assert strip_launcher_prefix(line) == expected


def test_bus_factors_and_type_sizes_follow_nccl_tests() -> None:
    assert bus_factor("all_reduce", 8) == pytest.approx(1.75)
    assert bus_factor("all_reduce", 1) == 0.0
    assert bus_factor("all_gather", 16) == pytest.approx(15 / 16)
    assert bus_factor("reduce_scatter", 2) == pytest.approx(0.5)
    assert bus_factor("alltoall", 12) == pytest.approx(11 / 12)
    assert bus_factor("broadcast", 12) == 1.0
    assert bus_factor("reduce", 12) == 1.0
    assert bus_factor("sendrecv", 2) == 1.0
    assert bus_factor("mystery", 2) is None
    assert bus_factor("all_reduce", 0) is None
    assert [dtype_size(t) for t in ("int8", "half", "bfloat16", "float", "double", "uint64", "what")] == [
        1,
        2,
        2,
        4,
        8,
        8,
        None,
    ]


# --------------------------------------------------------------------------- 2.13-2.16 unified layout


def test_v2_16_two_hosts_sixteen_ranks() -> None:
    name = "v2.16_all_reduce_2x8_h100_mpirun.txt"
    run = _single(name)
    h = run.header
    assert h is not None
    assert (h.n_threads, h.n_gpus, h.min_bytes, h.max_bytes, h.step, h.step_kind) == (1, 1, 8, 8589934592, 2, "factor")
    assert (h.warmup_iters, h.iters, h.agg_iters, h.validation, h.graph, h.unalign) == (5, 20, 1, 1, 0, None)
    assert run.version is None and run.program is None
    assert run.layout == "v2.13"
    assert run.collective == "all_reduce"  # inferred: redop sum, root -1, count*4 == size
    assert len(run.devices) == 16
    first, last = run.devices[0], run.devices[-1]
    assert (first.rank, first.group, first.pid, first.host, first.device, first.bus_id, first.name) == (
        0,
        0,
        6899,
        "ztan-mig-235z",
        0,
        "0000:04:00",
        "NVIDIA H100 80GB HBM3",
    )
    assert (last.rank, last.pid, last.host, last.device, last.bus_id) == (15, 6740, "ztan-mig-gq73", 7, "0000:8c:00")
    assert [d.rank for d in run.devices] == list(range(16))
    assert run.hosts == ("ztan-mig-235z", "ztan-mig-gq73")
    assert run.nranks == 16
    assert len(run.rows) == 31
    _check_against_oracle(run, name, UNIFIED)
    top = run.rows[-1]
    assert (top.size_bytes, top.count, top.dtype, top.redop, top.root) == (8589934592, 2147483648, "float", "sum", -1)
    assert top.out_of_place == NcclTiming(47535.0, 180.71, 338.82, 0)
    assert top.in_place == NcclTiming(47743.0, 179.92, 337.35, 0)
    assert run.rows[0].out_of_place == NcclTiming(135.8, 0.0, 0.0, 0)
    assert (run.out_of_bounds, run.out_of_bounds_ok, run.avg_busbw_gbps, run.avg_busbw_check) == (0, True, 70.742, None)
    assert not run.truncated and not run.failures and not run.cut_rows and not run.concluded
    assert _check_bandwidth_arithmetic(run, name, UNIFIED, "all_reduce", 16) == 62
    # nccl-tests' average is the arithmetic mean of every printed busbw, both placements
    printed = [t.busbw_gbps for r in run.rows for t in (r.out_of_place, r.in_place) if t and t.busbw_gbps is not None]
    assert sum(printed) / len(printed) == pytest.approx(70.742, abs=0.01)


def test_v2_13_single_node_eight_gpus_one_process() -> None:
    name = "v2.13_all_reduce_1node_8xh100_nvls.txt"
    run = _single(name)
    assert run.header is not None and (run.header.n_gpus, run.header.iters, run.header.min_bytes) == (8, 2, 134217728)
    assert run.hosts == ("node005",) and run.nranks == 8
    assert {d.pid for d in run.devices} == {295203}
    assert [d.bus_id for d in run.devices] == ["0x18", "0x6d", "0x97", "0xc0", "0x19", "0x6c", "0x96", "0xc1"]
    _check_against_oracle(run, name, UNIFIED)
    assert run.rows[-1].in_place == NcclTiming(15773.0, 272.30, 476.53, 0)
    assert (run.out_of_bounds, run.avg_busbw_gbps) == (0, 439.369)
    assert _check_bandwidth_arithmetic(run, name, UNIFIED, "all_reduce", 8) == 12


def test_srun_label_prefix_and_no_validation() -> None:
    name = "v2.13_all_reduce_srun_label_no_validation.txt"
    run = _single(name)
    assert run.header is not None and run.header.validation == 0 and run.header.iters == 200
    assert run.hosts == ("node005", "node007") and run.nranks == 16
    assert run.devices[8].pid == 541703 and run.devices[8].host == "node007"
    _check_against_oracle(run, name, UNIFIED)
    for row in run.rows:
        assert row.out_of_place is not None and row.out_of_place.wrong is None
        assert row.in_place is not None and row.in_place.wrong is None
    assert run.rows[0].out_of_place == NcclTiming(215.3, 38.96, 73.04, None)
    assert run.rows[-1].in_place == NcclTiming(103538.0, 82.96, 155.56, None)
    assert (run.out_of_bounds, run.avg_busbw_gbps) == (0, 142.735)
    assert _check_bandwidth_arithmetic(run, name, UNIFIED, "all_reduce", 16) == 22
    [result] = to_probe_results(parse_nccl_tests(_text(name)), node="ignored", at=10.0)
    assert result.outcome is Outcome.PASS
    assert result.nodes == ["node005", "node007"]
    assert all(m.node is None for m in result.measurements)


def test_every_row_wrong_is_a_failure_with_g_formatted_counts() -> None:
    name = "v2.13_all_reduce_2nodes_every_row_wrong.txt"
    run = _single(name)
    _check_against_oracle(run, name, UNIFIED)
    assert run.rows[0].out_of_place == NcclTiming(21.33, 0.0, 0.0, 4)
    assert run.rows[18].out_of_place == NcclTiming(311.5, 6.73, 6.73, 1048580)  # printed 1.04858e+06
    assert run.rows[-1].in_place == NcclTiming(73092.0, 7.35, 7.35, 268435000)  # printed 2.68435e+08
    assert (run.out_of_bounds, run.out_of_bounds_ok, run.avg_busbw_gbps) == (108, False, 3.02663)
    assert run.wrong_data
    assert _check_bandwidth_arithmetic(run, name, UNIFIED, "all_reduce", 2) == 54
    [result] = to_probe_results(parse_nccl_tests(_text(name)), at=5.0)
    assert result.outcome is Outcome.FAIL
    assert result.reason == "wrong data: 108 out-of-bounds test instances, 54 results with wrong elements"
    wrong = [c for c in result.checks if c.name == "nccl_tests.wrong_elements"]
    assert len(wrong) == 54 and not any(c.ok for c in wrong)
    assert wrong[0].detail == "all_reduce 8 B float out_of_place: 4 wrong elements (line 10)"
    [oob] = [c for c in result.checks if c.name == "nccl_tests.out_of_bounds"]
    assert not oob.ok and oob.detail == "Out of bounds values : 108 FAILED"


def test_one_gpu_overflowing_columns_and_zero_busbw() -> None:
    name = "v2.16_all_reduce_1gpu_overflowing_columns.txt"
    run = _single(name)
    assert run.nranks == 1 and run.hosts == ("GENOA-06",)
    assert run.devices[0].bus_id == "0x21" and run.devices[0].name == "NVIDIA GeForce RTX 5090"
    assert run.collective is None  # one rank: all_reduce and reduce_scatter look the same
    _check_against_oracle(run, name, UNIFIED)
    assert run.rows[-1].in_place == NcclTiming(0.08, 1777718.25, 0.0, 0)
    assert run.rows[14].in_place == NcclTiming(0.07, 1807.89, 0.0, 0)
    assert (run.out_of_bounds, run.avg_busbw_gbps) == (0, 0.0)
    for row in run.rows:
        for timing in (row.out_of_place, row.in_place):
            assert timing is not None and timing.busbw_gbps == 0.0  # factor 2(n-1)/n = 0
    assert _check_bandwidth_arithmetic(run, name, UNIFIED, "all_reduce", 1, modern_algbw=False) == 50
    collective = _single(name, collective="all_reduce")
    assert collective.collective == "all_reduce"


def test_alltoall_one_gpu_in_place_not_validated() -> None:
    name = "v2.16_alltoall_1gpu_in_place_not_checked.txt"
    run = _single(name, collective="alltoall")
    assert run.collective == "alltoall"
    assert run.header is not None and (run.header.step, run.header.step_kind) == (1048576, "bytes")
    _check_against_oracle(run, name, UNIFIED)
    [row] = run.rows
    assert (row.size_bytes, row.count, row.redop, row.root) == (33554432, 8388608, "none", -1)
    assert row.out_of_place == NcclTiming(19.56, 1715.44, 0.0, 0)
    assert row.in_place == NcclTiming(0.78, 43046.10, 0.0, None)


# --------------------------------------------------------------------------- failures


def test_nccl_failure_after_table_header_is_an_error() -> None:
    run = _single("v2.16_all_reduce_nccl_failure_after_header.txt")
    assert run.rows == () and run.layout == "v2.13" and not run.truncated
    [failure] = run.failures
    assert (failure.kind, failure.host, failure.location, failure.line) == ("NCCL", "GENOA-06", "common.cu:392", 10)
    assert failure.message == "unhandled cuda error (run with NCCL_DEBUG=INFO for details) /"
    assert run.trace == (
        ".. GENOA-06 pid 5068: Test failure common.cu:590",
        ".. GENOA-06 pid 5068: Test failure all_reduce.cu:90",
        ".. GENOA-06 pid 5068: Test failure common.cu:623",
        ".. GENOA-06 pid 5068: Test failure common.cu:1078",
        ".. GENOA-06 pid 5068: Test failure common.cu:891",
    )
    [result] = to_probe_results(parse_nccl_tests(_text("v2.16_all_reduce_nccl_failure_after_header.txt")), at=1.0)
    assert result.outcome is Outcome.ERROR
    assert result.reason == (
        "Test NCCL failure on GENOA-06 at common.cu:392: unhandled cuda error (run with NCCL_DEBUG=INFO for details) /"
    )
    assert result.measurements == [] and result.nodes == ["GENOA-06"]


def test_debug_info_lines_interleaved_with_header_and_failure() -> None:
    out = parse_nccl_tests(_text("v2.16_all_reduce_debug_info_nccl_failure.txt"), collective="all_reduce")
    [run] = out.runs
    assert run.collective == "all_reduce"
    assert len(run.devices) == 2 and run.devices[1].bus_id == "0x61"
    assert run.nccl_version == "2.25.1+cuda12.8"
    assert run.warnings == (
        "Could not find a path for pattern 4, falling back to simple order",
        "Could not find a path for pattern 1, falling back to simple order",
        "Could not find a path for pattern 4, falling back to simple order",
        "Could not find a path for pattern 1, falling back to simple order",
        "Cuda failure 1 'invalid argument'",
    )
    assert [f.kind for f in run.failures] == ["NCCL"] and run.failures[0].line == 71
    assert len(run.trace) == 5 and run.rows == ()
    assert out.ignored_lines == 53  # 50 NCCL INFO lines, '# Using devices' and two bare '#' lines


def test_cuda_failure_on_two_hosts_before_any_table() -> None:
    name = "v2.17_all_reduce_cuda_busy_failure.txt"
    run = _single(name)
    assert (run.version, run.nccl_headers, run.nccl_library) == ("2.17.8", 22606, 22606)
    assert (run.program, run.collective) == ("all_reduce_perf", "all_reduce")
    assert run.header is not None and (run.header.warmup_iters, run.header.iters) == (1, 20)
    assert run.devices[4].bus_id == "0009:01:00" and run.devices[4].host == "gpu-1-7"
    assert run.layout is None and run.rows == ()
    assert [(f.kind, f.host, f.location) for f in run.failures] == [
        ("CUDA", "gpu-1-1", "common.cu:1304"),
        ("CUDA", "gpu-1-7", "common.cu:1304"),
        ("CUDA", "gpu-1-7", "common.cu:1304"),
        ("CUDA", "gpu-1-7", "common.cu:1304"),
        ("CUDA", "gpu-1-7", "common.cu:1304"),
        ("CUDA", "gpu-1-1", "common.cu:1304"),
    ]
    assert {f.message for f in run.failures} == {"CUDA-capable device(s) is/are busy or unavailable"}
    assert len(run.trace) == 6
    [result] = to_probe_results(parse_nccl_tests(_text(name)), at=3.0)
    assert result.outcome is Outcome.ERROR
    assert result.nodes == ["gpu-1-1", "gpu-1-7"]
    assert result.reason.startswith("Test CUDA failure on gpu-1-1 at common.cu:1304:")


def test_wrong_data_on_two_nodes_with_trace_after_footer() -> None:
    name = "v2.17_all_reduce_wrong_data_2nodes.txt"
    run = _single(name)
    assert run.version == "2.17.8" and run.nccl_library == 22902 and run.concluded
    _check_against_oracle(run, name, UNIFIED)
    bad = run.rows[17]
    assert bad.size_bytes == 1048576
    assert bad.out_of_place == NcclTiming(477.32, 2.20, 2.20, 96)
    assert bad.in_place == NcclTiming(492.81, 2.13, 2.13, 32)
    assert (run.out_of_bounds, run.out_of_bounds_ok, run.avg_busbw_gbps) == (4, False, 4.79995)
    assert run.trace == (
        ".. gpu-1-1 pid 662195: Test failure common.cu:1189",
        ".. gpu-1-7 pid 2448661: Test failure common.cu:1189",
    )
    assert not run.failures
    assert _check_bandwidth_arithmetic(run, name, UNIFIED, "all_reduce", 2) == 50
    [result] = to_probe_results(parse_nccl_tests(_text(name)), at=2.0)
    assert result.outcome is Outcome.FAIL
    assert [c.detail for c in result.checks if c.name == "nccl_tests.wrong_elements"] == [
        "all_reduce 1048576 B float out_of_place: 96 wrong elements (line 29)",
        "all_reduce 1048576 B float in_place: 32 wrong elements (line 29)",
    ]


def test_failure_printed_in_the_middle_of_a_row() -> None:
    run = _single("v2.17_alltoall_cuda_failure_mid_row.txt")
    assert (run.version, run.program, run.collective) == ("2.17.6", "alltoall_perf", "alltoall")
    assert run.header is not None and (run.header.step_kind, run.header.warmup_iters) == ("bytes", 0)
    assert run.nccl_version == "2.28.7+cuda13.0"
    assert len(run.devices) == 16 and run.hosts == ("node0", "node1")
    assert run.rows == () and run.cut_rows == (27,)
    [failure] = run.failures
    assert (failure.host, failure.location, failure.message) == (
        "node0",
        "common.cu:389",
        "an illegal memory access was encountered",
    )
    assert len(run.trace) == 6 and not run.truncated


def test_cuda_failure_after_header_v2_19() -> None:
    run = _single("v2.19_all_reduce_cuda_failure_no_rows.txt")
    assert (run.version, run.nccl_headers) == ("2.19.7", 21803)
    assert run.header is not None and run.header.unalign == 0 and run.header.step == 1048576
    assert [d.bus_id for d in run.devices] == ["0000:f9:05", "0000:fb:05", "0000:fd:05", "0000:ff:05"]
    assert run.failures[0].message == "an illegal memory access was encountered" and run.rows == ()


# --------------------------------------------------------------------------- 2.17.4+ formats


def test_v2_18_open_mpi_tag_output() -> None:
    name = "v2.18_all_reduce_mpirun_tag_output.txt"
    run = _single(name)
    assert (run.version, run.program, run.collective) == ("2.18.0", "all_reduce_perf_mpi", "all_reduce")
    assert run.header is not None and (run.header.warmup_iters, run.header.iters) == (10, 50)
    assert run.hosts == ("lab",) and [d.pid for d in run.devices] == [2994447, 2994448]
    _check_against_oracle(run, name, UNIFIED)
    assert run.rows[5].out_of_place == NcclTiming(14977.1, 2.24, 2.24, 0)
    assert (run.out_of_bounds, run.avg_busbw_gbps, run.concluded) == (0, 1.57614, True)
    assert _check_bandwidth_arithmetic(run, name, UNIFIED, "all_reduce", 2) == 16


def test_v2_18_all_gather_count_per_rank() -> None:
    name = "v2.18_all_gather_mpirun_tag_output.txt"
    run = _single(name)
    assert run.collective == "all_gather"
    _check_against_oracle(run, name, UNIFIED)
    first = run.rows[0]
    assert (first.size_bytes, first.count, first.redop, first.root) == (1048576, 131072, "none", -1)
    assert first.out_of_place == NcclTiming(2190.17, 0.48, 0.24, 0)
    assert run.avg_busbw_gbps == 1.55649
    assert _check_bandwidth_arithmetic(run, name, UNIFIED, "all_gather", 2) == 16


def test_v2_18_alltoall_sixteen_ranks_after_mpi_help_text() -> None:
    name = "v2.18_alltoall_2nodes_openmpi_help_text.txt"
    out = parse_nccl_tests(_text(name))
    [run] = out.runs
    assert (run.version, run.collective, run.nccl_version) == ("2.18.3", "alltoall", "2.30.3+cuda13.0")
    assert run.header is not None and run.header.unalign == 0 and run.header.min_bytes == 1024
    assert run.hosts == ("R6KD-CX8aaS-GPU-14", "R6KD-CX8aaS-GPU-15")
    _check_against_oracle(run, name, UNIFIED)
    assert run.rows[0].out_of_place == NcclTiming(49.94, 0.02, 0.02, 0)
    assert run.rows[0].in_place == NcclTiming(30.35, 0.03, 0.03, None)
    assert run.rows[-1].out_of_place == NcclTiming(251298.0, 34.18, 32.05, 0)
    assert (run.out_of_bounds, run.avg_busbw_gbps) == (0, 8.84861)
    assert _check_bandwidth_arithmetic(run, name, UNIFIED, "alltoall", 16) == 48


def test_v2_19_eight_a100() -> None:
    name = "v2.19_all_reduce_8xa100.txt"
    run = _single(name)
    assert (run.version, run.nccl_headers, run.nccl_library) == ("2.19.4", 21903, 21903)
    assert run.header is not None and run.header.n_gpus == 8 and run.header.unalign == 0
    _check_against_oracle(run, name, UNIFIED)
    assert run.rows[-1].out_of_place == NcclTiming(1295.41, 103.61, 181.32, 0)
    assert (run.avg_busbw_gbps, run.concluded) == (34.9024, True)
    assert _check_bandwidth_arithmetic(run, name, UNIFIED, "all_reduce", 8) == 50


def test_truncated_output_keeps_the_rows_it_has() -> None:
    name = "v2.19_all_reduce_truncated_after_two_rows.txt"
    run = _single(name)
    assert run.truncated and run.out_of_bounds is None and not run.failures
    _check_against_oracle(run, name, UNIFIED)
    assert run.rows[1].size_bytes == 1074790400 and run.rows[1].in_place == NcclTiming(4542.38, 236.61, 354.92, 0)
    assert _check_bandwidth_arithmetic(run, name, UNIFIED, "all_reduce", 4) == 4
    [result] = to_probe_results(parse_nccl_tests(_text(name)), at=1.0)
    assert result.outcome is Outcome.PASS
    assert result.reason == "truncated output: 2 rows before the output stopped"
    assert result.params["truncated"] is True


def test_per_iteration_columns_read_by_name() -> None:
    name = "synthetic_v2.19_all_reduce_per_iteration_columns.txt"
    run = _single(name)
    cols = ("size", "count", "type", "redop", "root")
    group = ("t", "alg", "bus", "wrong", "i_min", "i_max", "i_p99", "i_cv%")
    _check_against_oracle(run, name, cols + group + group)
    assert run.rows[0].out_of_place is not None
    assert run.rows[0].out_of_place.extra == (("i_min", 14.02), ("i_max", 19.87), ("i_p99", 18.4), ("i_cv%", 6.1))
    assert _check_bandwidth_arithmetic(run, name, cols + group + group, "all_reduce", 2) == 6


def test_json_report() -> None:
    json_run = _single("synthetic_v2.17_all_reduce_json_report.json")
    text_run = _single("v2.19_all_reduce_8xa100.txt")
    assert json_run.layout == "json"
    assert (json_run.program, json_run.collective, json_run.nccl_library) == ("all_reduce_perf", "all_reduce", 21903)
    assert json_run.header is not None
    assert (json_run.header.n_gpus, json_run.header.max_bytes, json_run.header.step_kind) == (8, 134217728, "factor")
    assert json_run.devices == text_run.devices
    assert [(r.size_bytes, r.count, r.dtype, r.redop, r.root) for r in json_run.rows] == [
        (r.size_bytes, r.count, r.dtype, r.redop, r.root) for r in text_run.rows
    ]
    assert [(r.out_of_place, r.in_place) for r in json_run.rows] == [
        (r.out_of_place, r.in_place) for r in text_run.rows
    ]
    assert (json_run.out_of_bounds, json_run.out_of_bounds_ok, json_run.avg_busbw_gbps) == (0, True, 34.9024)
    assert json_run.avg_busbw_check is None and json_run.errors == ()


def test_json_that_is_not_a_report_is_refused() -> None:
    with pytest.raises(ParseError, match="expected an object with a 'results' list"):
        parse_nccl_tests('{"version": 1}')
    with pytest.raises(ParseError, match=r"line 2 column 1"):
        parse_nccl_tests('{"results": [\n')
    with pytest.raises(ParseError, match=r"results\[0\] lacks a numeric 'size'"):
        parse_nccl_tests('{"results": [{"count": 3}]}')


# --------------------------------------------------------------------------- pre-2.13 layouts


DGX2_COLUMNS = {
    "all_gather": ("size", "count", "type", "t", "alg", "bus", "error", "t", "alg", "bus", "error"),
    "all_reduce": ("size", "count", "type", "redop", "t", "alg", "bus", "error", "t", "alg", "bus", "error"),
    "broadcast": ("size", "count", "type", "root", "t", "alg", "bus", "error", "t", "alg", "bus", "error"),
    "reduce": ("size", "count", "type", "redop", "root", "t", "alg", "bus", "error", "t", "alg", "bus", "error"),
    "reduce_scatter": ("size", "count", "type", "redop", "t", "alg", "bus", "error", "t", "alg", "bus", "error"),
}


def test_five_binaries_in_one_pre_2_13_log() -> None:
    name = "v2.x_multi_collective_dgx2_error_column.txt"
    out = parse_nccl_tests(_text(name))
    assert [r.collective for r in out.runs] == list(DGX2_COLUMNS)
    assert [r.program for r in out.runs] == [f"{c}_perf" for c in DGX2_COLUMNS]
    assert [r.devices[0].pid for r in out.runs] == [87569, 88131, 88618, 89207, 89663]
    skip = 0
    for run, (collective, columns) in zip(out.runs, DGX2_COLUMNS.items(), strict=True):
        assert run.layout == "v2"
        assert run.header is not None and (run.header.n_gpus, run.header.agg_iters, run.header.graph) == (
            12,
            None,
            None,
        )
        assert run.nranks == 12 and run.hosts == ("seville",)
        assert len(run.rows) == 31
        _check_against_oracle(run, name, columns, skip=skip)
        skip += len(run.rows)
        assert _check_bandwidth_arithmetic(run, name, columns, collective, 12, modern_algbw=False) == 62
    gather, reduce_run = out.runs[0], out.runs[3]
    assert (gather.out_of_bounds, gather.out_of_bounds_ok, gather.avg_busbw_gbps) == (4, False, 30.2993)
    assert gather.rows[-2].out_of_place == NcclTiming(53902.0, 73.04, 73.04, None, 1.0)
    assert gather.rows[0].size_bytes == 0 and gather.rows[0].count == 0
    assert (reduce_run.rows[0].redop, reduce_run.rows[0].root) == ("sum", 0)
    assert [r.avg_busbw_gbps for r in out.runs] == [30.2993, 42.5578, 41.2456, 41.3386, 20.3609]
    results = to_probe_results(out, at=1.0)
    assert [r.outcome for r in results] == [Outcome.FAIL, Outcome.PASS, Outcome.PASS, Outcome.PASS, Outcome.PASS]
    assert results[0].reason == "wrong data: 4 out-of-bounds test instances"
    assert all(r.nodes == ["seville"] for r in results)


def test_v2_4_all_gather_without_hash_prefixes() -> None:
    name = "v2.4_all_gather_no_hash_prefix_out_of_bounds.txt"
    run = _single(name)
    assert (run.program, run.collective, run.layout) == ("all_gather_perf", "all_gather", "v2")
    assert run.header is None and run.devices == ()
    _check_against_oracle(run, name, DGX2_COLUMNS["all_gather"])
    [row] = run.rows
    assert row.out_of_place == NcclTiming(29122.0, 129.05, 129.05, None, 1.0)
    assert (run.out_of_bounds, run.avg_busbw_gbps) == (2, 128.942)
    assert _check_bandwidth_arithmetic(run, name, DGX2_COLUMNS["all_gather"], "all_gather", 8, modern_algbw=False) == 2
    [result] = to_probe_results(parse_nccl_tests(_text(name)), node="gpu17", at=1.0)
    assert result.outcome is Outcome.FAIL and result.nodes == ["gpu17"]
    assert {m.node for m in result.measurements} == {"gpu17"}


def test_nccl1_table_in_milliseconds() -> None:
    name = "nccl1_all_reduce_test_readme.txt"
    run = _single(name, collective="all_reduce")
    assert run.layout == "nccl1" and run.collective == "all_reduce" and not run.truncated
    assert [(d.rank, d.device, d.bus_id, d.host) for d in run.devices] == [
        (0, 0, "0x0a", None),
        (1, 1, "0x09", None),
        (2, 2, "0x06", None),
        (3, 3, "0x05", None),
    ]
    assert run.devices[0].name == "GeForce GTX TITAN X"
    columns = ("size", "count", "type", "redop", "t", "alg", "bus", "error", "t", "alg", "bus", "error")
    _check_against_oracle(run, name, columns, time_scale=1000.0)
    assert run.rows[8].dtype == "half" and run.rows[8].redop == "sum"
    assert run.rows[8].out_of_place == NcclTiming(1617.0, 6.18, 9.28, None, 4e-3)
    assert _check_bandwidth_arithmetic(run, name, columns, "all_reduce", 4, time_unit=1000.0) == 40
    [result] = to_probe_results(parse_nccl_tests(_text(name), collective="all_reduce"), node="n1", at=1.0)
    # 5 types x 4 reduction ops of one size: only the first op of each type is kept, per placement
    assert result.params["duplicate_rows_dropped"] == 30
    busbw = [m for m in result.measurements if m.name == "busbw_bytes_per_second"]
    types = ("char", "int", "half", "float", "double")
    assert [(m.labels["dtype"], m.labels["placement"]) for m in busbw] == [
        (t, p) for t in types for p in ("out_of_place", "in_place")
    ]
    assert [m.value for m in busbw] == pytest.approx(
        [9.21e9, 7.77e9, 9.31e9, 9.23e9, 9.28e9, 9.17e9, 9.27e9, 9.25e9, 9.21e9, 9.21e9]
    )


def test_v1_table_in_milliseconds() -> None:
    name = "synthetic_v1_all_reduce_ms_table.txt"
    run = _single(name, collective="all_reduce")
    assert run.layout == "v1" and run.header is not None and run.header.agg_iters is None
    assert run.devices[3].host == "dgx1-03" and run.devices[3].bus_id == "0x09"
    columns = ("size", "count", "type", "redop", "t", "alg", "bus", "error", "t", "alg", "bus", "error")
    _check_against_oracle(run, name, columns, time_scale=1000.0)
    assert _check_bandwidth_arithmetic(run, name, columns, "all_reduce", 8, time_unit=1000.0) == 8
    assert (run.out_of_bounds, run.avg_busbw_gbps) == (0, None)


# --------------------------------------------------------------------------- converter


def test_converter_measurements_for_one_host() -> None:
    out = parse_nccl_tests(_text("v2.19_all_reduce_8xa100.txt"))
    [result] = to_probe_results(out, node="other", at=1234.5)
    assert result.probe == "nccl_tests" and result.outcome is Outcome.PASS and result.reason == ""
    assert result.started_at == result.finished_at == 1234.5
    assert result.nodes == ["dkh"]
    by_key = {
        (m.name, m.labels["size_bytes"], m.labels["placement"]): m
        for m in result.measurements
        if m.labels.get("size_bytes")
    }
    top = by_key[("busbw_bytes_per_second", "134217728", "out_of_place")]
    assert top.value == pytest.approx(181.32e9)
    assert top.labels == {
        "collective": "all_reduce",
        "size_bytes": "134217728",
        "placement": "out_of_place",
        "dtype": "float",
    }
    assert top.node == "dkh"
    assert by_key[("algbw_bytes_per_second", "134217728", "in_place")].value == pytest.approx(104.51e9)
    assert by_key[("time_seconds", "8", "out_of_place")].value == pytest.approx(34.84e-6)
    assert len(result.measurements) == 25 * 2 * 3 + 1
    [avg] = [m for m in result.measurements if m.name == "avg_busbw_bytes_per_second"]
    assert avg.value == pytest.approx(34.9024e9) and avg.labels == {"collective": "all_reduce"}
    assert result.params["nranks"] == 8 and result.params["iters"] == 20 and result.params["version"] == "2.19.4"
    assert [c.name for c in result.checks] == ["nccl_tests.out_of_bounds"] and result.checks[0].ok


def test_rows_without_a_known_collective_get_the_unknown_label() -> None:
    [result] = to_probe_results(parse_nccl_tests(_text("v2.16_all_reduce_1gpu_overflowing_columns.txt")), at=1.0)
    assert {m.labels["collective"] for m in result.measurements} == {"unknown"}
    assert result.nodes == ["GENOA-06"]


def test_unknown_collective_argument_is_a_caller_error() -> None:
    with pytest.raises(ValueError, match="unknown collective 'allreduce'"):
        parse_nccl_tests(_text("v2.19_all_reduce_8xa100.txt"), collective="allreduce")


def test_text_without_nccl_tests_output_is_refused() -> None:
    with pytest.raises(ParseError, match=r"no output found in 3 lines"):
        parse_nccl_tests("hello\nworld\nNCCL INFO only\n")
    with pytest.raises(ParseError, match=r"no output found in 0 lines"):
        parse_nccl_tests("")


def test_row_shapes_that_do_not_fit_are_kept_as_cut_rows() -> None:
    text = _text("v2.19_all_reduce_8xa100.txt").replace(
        "     2097152        524288     float     sum      -1    81.12   25.85   45.24       0",
        "     2097152        524288     float     sum      -1    81.12   25.85",
    )
    run = parse_nccl_tests(text).runs[0]
    assert len(run.rows) == 24 and run.cut_rows == (36,)
    assert not run.truncated  # the footer follows


def test_row_dataclass_accessor() -> None:
    row = NcclRow(1, 8, 2, "float", "sum", -1, NcclTiming(1.0, 2.0, 3.0, 0), None)
    assert row.timing("out_of_place") == NcclTiming(1.0, 2.0, 3.0, 0)
    assert row.timing("in_place") is None


# --------------------------------------------------------------------------- optional columns (SYNTHETIC)

_SYNTHETIC_HEAD = """\
# nccl-tests version 2.17.4 nccl-headers=22703 nccl-library=22703
# Collective test starting: broadcast_perf
# nThread 1 nGpus 2 minBytes 1024 maxBytes 2048 step: 2(factor) warmup iters: 1 iters: 20 agg iters: 1 \
validation: 1 graph: 0
#
# Using devices
#  Rank  0 Group  0 Pid   1001 on      node9 device  0 [0000:18:00] NVIDIA H100 80GB HBM3
#  Rank  1 Group  0 Pid   1001 on      node9 device  1 [0000:2a:00] NVIDIA H100 80GB HBM3
#
"""


def test_cputime_and_timestamp_columns_and_failed_bandwidth_check() -> None:
    """SYNTHETIC: the -C (cputime) and timestamp columns of util.cu's writeResultHeader, the
    NCCL_TESTS_MIN_BW verdict on the average and a '# error:' line; numbers made up to fit
    nccl-tests' broadcast definitions."""
    text = _SYNTHETIC_HEAD + (
        "#                                                              out-of-place                       in-place\n"
        "#       size         count      type   redop    root  cputime   algbw   busbw  #wrong  cputime   algbw   busbw"
        "  #wrong            timestamp\n"
        "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)             (us)  (GB/s)  (GB/s)"
        "          %Y-%m-%d %H:%M:%S\n"
        "        1024           256     float    none       0     8.50    0.12    0.12       0     8.40    0.12    0.12"
        "       0  2025-11-03 10:15:02\n"
        "        2048           512     float    none       0     8.60    0.24    0.24       0     8.55    0.24    0.24"
        "       0  2025-11-03 10:15:03\n"
        "# Out of bounds values : 0 OK\n"
        "# Avg bus bandwidth    : 0.18 FAILED\n"
        "#\n"
        "# Collective test concluded: broadcast_perf\n"
        "# error: remote process exited or there was a network error\n"
    )
    run = parse_nccl_tests(text).runs[0]
    assert run.collective == "broadcast" and run.hosts == ("node9",)
    assert [(r.size_bytes, r.count, r.redop, r.root, r.timestamp) for r in run.rows] == [
        (1024, 256, "none", 0, "2025-11-03 10:15:02"),
        (2048, 512, "none", 0, "2025-11-03 10:15:03"),
    ]
    assert run.rows[1].out_of_place == NcclTiming(8.60, 0.24, 0.24, 0)
    assert run.rows[1].in_place == NcclTiming(8.55, 0.24, 0.24, 0)
    assert (run.avg_busbw_gbps, run.avg_busbw_check) == (0.18, "FAILED")
    assert run.errors == ("remote process exited or there was a network error",)
    for row in run.rows:
        for timing in (row.out_of_place, row.in_place):
            assert timing is not None and timing.time_us is not None
            derived = derived_busbw_gbps("broadcast", row.size_bytes, timing.time_us, 2)
            assert derived == pytest.approx(timing.busbw_gbps, abs=0.005 + 0.01)
    [result] = to_probe_results(parse_nccl_tests(text), at=1.0)
    assert result.outcome is Outcome.PASS  # the bandwidth verdict is the daemon's, not a node fault
    assert result.params["avg_busbw_check"] == "FAILED"


def test_timeout_line_is_a_tool_error() -> None:
    """SYNTHETIC: the '-T' timeout message of common.cu's testStreamSynchronize."""
    text = _SYNTHETIC_HEAD + "node9: Test timeout (60s) common.cu:432\n .. node9 pid 1001: Test failure common.cu:589\n"
    run = parse_nccl_tests(text).runs[0]
    [failure] = run.failures
    assert (failure.kind, failure.host, failure.location, failure.message, failure.line) == (
        "timeout",
        "node9",
        "common.cu:432",
        "timeout after 60s",
        9,
    )
    [result] = to_probe_results(parse_nccl_tests(text), at=1.0)
    assert result.outcome is Outcome.ERROR
    assert result.reason == "Test timeout on node9 at common.cu:432: timeout after 60s"


# --------------------------------------------------------------------------- sendrecv_perf

SENDRECV = "synthetic_v2.16_sendrecv_2nodes.txt"


def test_sendrecv_between_two_hosts_reads_busbw_as_nccl_tests_defines_it() -> None:
    """sendrecv's bus factor is 1 (nccl-tests ``SendRecvGetBw``, doc/PERFORMANCE.md): busbw is algbw, and the
    stored ``busbw_bytes_per_second`` is the printed busbw column, in bytes/s."""
    run = _single(SENDRECV)
    assert (run.program, run.collective, run.layout, run.nranks, run.hosts) == (
        "sendrecv_perf", "sendrecv", "v2.13", 2, ("gpu-b07", "gpu-b08"))
    assert bus_factor("sendrecv", 2) == bus_factor("sendrecv", 16) == 1.0
    _check_against_oracle(run, SENDRECV, UNIFIED)
    assert _check_bandwidth_arithmetic(run, SENDRECV, UNIFIED, "sendrecv", 2) == 12
    assert all(row.redop == "sum" and row.root == -1 for row in run.rows)
    assert all(row.in_place is not None and row.in_place.wrong is None for row in run.rows)  # N/A: not checked
    last = run.rows[-1]
    assert last.out_of_place == NcclTiming(22471.0, 47.78, 47.78, 0, None)
    assert run.avg_busbw_gbps == 40.0058
    [result] = to_probe_results(parse_nccl_tests(_text(SENDRECV)), at=1.0)
    assert result.outcome is Outcome.PASS and result.nodes == ["gpu-b07", "gpu-b08"]
    by = {(m.name, m.labels.get("size_bytes"), m.labels.get("placement")): m.value for m in result.measurements}
    assert by[("busbw_bytes_per_second", "1073741824", "out_of_place")] == pytest.approx(47.78e9)
    for (name, size, placement), value in by.items():
        if name == "busbw_bytes_per_second":
            assert value == by[("algbw_bytes_per_second", size, placement)]
    assert {m.labels.get("collective") for m in result.measurements} == {"sendrecv"}


def test_sendrecv_without_its_binary_name_needs_the_collective() -> None:
    """A 2.13-2.16 sendrecv table prints ``sum``/``-1`` like all_reduce: without the command line the caller
    names it (``collective=``), and its busbw is still the printed one."""
    text = "\n".join(line for line in _text(SENDRECV).splitlines() if not line.startswith("$"))
    [run] = parse_nccl_tests(text, collective="sendrecv").runs
    assert (run.program, run.collective) == (None, "sendrecv")
    named = _single(SENDRECV)
    assert [(r.size_bytes, r.out_of_place, r.in_place) for r in run.rows] == [
        (r.size_bytes, r.out_of_place, r.in_place) for r in named.rows]


def test_sendrecv_golden(capsys: pytest.CaptureFixture[str]) -> None:
    from healthd.cli import main
    from tests.golden_files import assert_golden

    assert main(["parse", "--tool", "nccl-tests", "--time", "2024-05-01T12:00:00Z", str(FIXTURES / SENDRECV)]) == 0
    assert_golden("parse_nccl_tests_sendrecv.txt", capsys.readouterr().out)
