"""The PARAM comms and compute parsers (tests/fixtures/tools/param, see its README).

The compute fixtures are the README's captured tables; the comms fixtures are synthetic (no
public capture exists) and are checked against PARAM's own algBW/busBW definitions."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from healthd.errors import ParseError
from healthd.parsers.param import (
    CommsRow,
    EmbRow,
    GemmRow,
    LinearRow,
    comms_bus_factor,
    comms_to_probe_results,
    compute_to_probe_results,
    parse_param_comms,
    parse_param_compute,
)
from probes.result import Outcome

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "tools" / "param"


def _text(name: str) -> str:
    return (FIXTURES / name).read_text()


def _numbers(name: str, marker: str) -> list[list[float]]:
    """Every number after ``marker`` on each line containing it (independent of the parser)."""
    rows = []
    for line in _text(name).splitlines():
        if marker in line and "(" not in line:
            rest = line.split(marker, 1)[1]
            rest = rest.split(None, 1)[1] if marker == "COMMS-RES-" else rest
            rows.append([float(x) for x in re.findall(r"[\d.]+", rest)])
    return rows


ROW_FIELDS = ("size_bytes", "elements", "p50_us", "p75_us", "p95_us", "min_us", "max_us", "algbw_gbps", "busbw_gbps",
              "total_p50_us")
"""The ``CommsRow`` fields of a 2026 header's columns, in print order."""


def _fields(row: CommsRow, names: tuple[str, ...]) -> list[object]:
    return [getattr(row, name) for name in names]


# --------------------------------------------------------------------------- comms


def test_bus_factors() -> None:
    assert comms_bus_factor("all_reduce", 16) == pytest.approx(1.875)
    assert comms_bus_factor("all_to_all", 16) == pytest.approx(15 / 16)
    assert comms_bus_factor("all_to_allv", 4) == pytest.approx(0.75)
    assert comms_bus_factor("all_gather_base", 8) == pytest.approx(7 / 8)
    assert comms_bus_factor("reduce_scatter", 2) == pytest.approx(0.5)
    assert comms_bus_factor("broadcast", 8) == 1.0
    assert comms_bus_factor("pt2pt", 8) is None
    assert comms_bus_factor("all_reduce", 0) is None


def _check_comms_definitions(rows: tuple[CommsRow, ...], world: int) -> None:
    for row in rows:
        assert row.p50_us is not None and row.algbw_gbps is not None and row.busbw_gbps is not None
        # algBW = memSize / (p50 * 1e3), p50 printed to 0.1 us, algBW to 0.001 GB/s
        lo = row.size_bytes / ((row.p50_us + 0.05) * 1e3)
        hi = row.size_bytes / ((row.p50_us - 0.05) * 1e3)
        assert lo - 0.0005 <= row.algbw_gbps <= hi + 0.0005
        derived = row.derived_busbw_gbps(world)
        factor = comms_bus_factor(row.collective or "", world)
        assert derived is not None and factor is not None
        assert lo * factor - 0.0005 <= row.busbw_gbps <= hi * factor + 0.0005
        assert lo * factor <= derived <= hi * factor


def test_comms_2026_labels_with_srun_prefix() -> None:
    name = "synthetic_comms_2026_time_columns_srun.txt"
    out = parse_param_comms(_text(name))
    assert out.world_size == 16 and out.backend == "nccl"
    assert dict(out.settings)["args.b"] == "1048576" and dict(out.settings)["args.z"] == "0"
    assert out.columns == ROW_FIELDS
    oracle = _numbers(name, "COMMS-RES-")
    assert len(out.rows) == len(oracle) == 4
    for row, numbers in zip(out.rows, oracle, strict=True):
        assert (row.collective, row.dtype, row.tag, row.quantized) == ("all_reduce", "float32", "", False)
        assert _fields(row, ROW_FIELDS) == numbers
    assert out.rows[0] == CommsRow(
        5, "all_reduce", "float32", "", False, 1048576, 262144, 61.3, 62.5, 65.6, 59.5, 68.0, 17.106, 32.073, 0.0
    )
    _check_comms_definitions(out.rows, 16)


def test_comms_2022_labels_all_to_all() -> None:
    name = "synthetic_comms_2022_latency_columns.txt"
    out = parse_param_comms(_text(name))
    oracle = _numbers(name, "COMMS-RES-")
    assert len(out.rows) == 5
    for row, numbers in zip(out.rows, oracle, strict=True):
        assert (row.collective, row.dtype, row.total_p50_us) == ("all_to_all", "bfloat16", None)
        assert _fields(row, ROW_FIELDS[:-1]) == numbers
    assert out.rows[-1].size_bytes == 16777216 and out.rows[-1].busbw_gbps == 19.238
    _check_comms_definitions(out.rows, 16)


def test_comms_2020_tab_separated_without_collective() -> None:
    out = parse_param_comms(_text("synthetic_comms_2020_tab_separated.txt"))
    assert out.world_size is None
    assert [
        (r.size_bytes, r.elements, r.p50_us, r.p75_us, r.p95_us, r.min_us, r.algbw_gbps, r.busbw_gbps) for r in out.rows
    ] == [
        (8, 2, 24.0, 25.0, 26.4, None, 0.0, 0.001),
        (1024, 256, 24.0, 25.0, 26.4, None, 0.043, 0.080),
        (131072, 32768, 28.4, 29.5, 31.2, None, 4.615, 8.654),
        (16777216, 4194304, 583.2, 606.5, 641.5, None, 28.768, 53.939),
    ]
    assert {r.collective for r in out.rows} == {None}
    [result] = comms_to_probe_results(out, node="n1", at=1.0, collective="all_reduce")
    assert {m.labels["collective"] for m in result.measurements} == {"all_reduce"}


def test_comms_converter() -> None:
    out = parse_param_comms(_text("synthetic_comms_2026_time_columns_srun.txt"))
    [result] = comms_to_probe_results(out, node="node12", at=4.0)
    assert result.probe == "param_comms" and result.outcome is Outcome.PASS and result.nodes == ["node12"]
    assert len(result.measurements) == 4 * 5
    first = {(m.name, m.labels.get("quantile")): m for m in result.measurements if m.labels["size_bytes"] == "1048576"}
    assert first[("time_seconds", "0.5")].value == pytest.approx(61.3e-6)
    assert first[("time_seconds", "0.95")].value == pytest.approx(65.6e-6)
    assert first[("busbw_bytes_per_second", None)].value == pytest.approx(32.073e9)
    assert first[("algbw_bytes_per_second", None)].labels == {
        "collective": "all_reduce",
        "size_bytes": "1048576",
        "dtype": "float32",
    }
    assert result.params["world_size"] == 16


def test_trimmed_row_matches_no_layout() -> None:
    with pytest.raises(ParseError, match=r"line 1: 3 values do not match a known COMMS-RES layout"):
        parse_param_comms(_text("comms_fragment_trimmed_row.txt"))


def test_comms_refusals() -> None:
    with pytest.raises(ParseError, match="no 'COMMS-RES' result rows"):
        parse_param_comms("PARAM nothing\n")
    with pytest.raises(ParseError, match=r"line 2: expected numbers after the COMMS-RES label"):
        parse_param_comms("\tCOMMS-RES size (B) Latency(us):p50\n\tCOMMS-RES-all_reduce-float32 8 oops\n")
    header = "\tCOMMS-RES size (B) nElementsPerRank Latency(us):p50\n"
    with pytest.raises(ParseError, match=r"line 2: 2 values do not match the header's 3 columns"):
        parse_param_comms(header + "\tCOMMS-RES-all_reduce-float32 8 2\n")
    with pytest.raises(ParseError, match=r"line 2: 4 values do not match the header's 3 columns"):
        parse_param_comms(header + "\tCOMMS-RES-all_reduce-float32 8 2 3.5 4\n")


def test_header_naming_a_column_the_rows_do_not_print() -> None:
    header = "\tCOMMS-RES" + "".join(
        f"{name:>22}" for name in ("size (B)", "nElementsPerRank", "Latency(us):p50", "TotalLatency(us):p50")
    )  # synthetic: the 2024-11 header with one name more than the row format prints
    out = parse_param_comms(header + "\n\tCOMMS-RES-broadcast-float32 4096 1024 12.5\n")
    [row] = out.rows
    assert (row.collective, row.size_bytes, row.elements, row.p50_us, row.total_p50_us) == (
        "broadcast",
        4096,
        1024,
        12.5,
        None,
    )


# --------------------------------------------------------------------------- compute


GEMM_README = [
    (128, 4096, 4096, 0.519193, 827.240),
    (256, 4096, 4096, 1.005778, 854.058),
    (512, 4096, 4096, 2.214854, 775.666),
    (1024, 4096, 4096, 3.388758, 1013.933),
    (128, 1024, 1024, 0.555641, 48.311),
    (256, 1024, 1024, 0.145774, 368.291),
    (512, 1024, 1024, 0.177422, 605.189),
    (1024, 1024, 1024, 0.215082, 998.447),
]


def test_gemm_readme_table_time_is_the_total_of_all_steps() -> None:
    out = parse_param_compute(_text("compute_gemm_readme_cpu_gflops.txt"))
    assert (out.kernel, out.device, out.steps, out.warmups, out.dataset, out.dtype) == (
        "gemm",
        "cpu",
        100,
        10,
        "A",
        "float32",
    )
    assert out.gemm == tuple(
        GemmRow(8 + i, m, n, k, t, rate * 1e9, True) for i, (m, n, k, t, rate) in enumerate(GEMM_README)
    )
    for row in out.gemm:
        # 2*M*N*K over the per-step time reproduces the printed rate (printed to 0.001 GF/s,
        # time to 1 us over 100 steps)
        derived = row.derived_flop_per_second(out.steps)
        assert derived is not None
        assert derived == pytest.approx(row.rate_flop_per_second, rel=2e-6 / row.time_s + 1e-6)
    [result] = compute_to_probe_results(out, node="cpu1", at=1.0)
    assert result.probe == "param_compute" and result.outcome is Outcome.PASS
    flops = [m for m in result.measurements if m.name == "flop_per_second"]
    assert [m.labels["scope"] for m in flops] == [f"gemm:{m}x{n}x{k}" for m, n, k, _, _ in GEMM_README]
    assert [m.value for m in flops] == pytest.approx([rate * 1e9 for *_, rate in GEMM_README])
    steps = [m for m in result.measurements if m.name == "step_seconds"]
    assert steps[0].value == pytest.approx(0.00519193) and steps[0].labels == {
        "dtype": "float32",
        "scope": "gemm:128x4096x4096",
    }


def test_gemm_tflops_table_time_per_step() -> None:
    out = parse_param_compute(_text("synthetic_compute_gemm_tflops.txt"))
    assert out.kernel == "gemm" and out.steps is None and out.dtype is None
    assert out.gemm == (
        GemmRow(4, 8192, 8192, 8192, 0.001603, 685.909e12, False),
        GemmRow(5, 4096, 4096, 4096, 0.000212, 648.297e12, False),
        GemmRow(6, 16384, 16384, 16384, 0.012411, 708.734e12, False),
    )
    for row in out.gemm:
        derived = row.derived_flop_per_second(None)
        assert derived is not None and derived == pytest.approx(row.rate_flop_per_second, rel=1e-6)


def test_emb_readme_table() -> None:
    out = parse_param_compute(_text("compute_emb_readme_cpu.txt"))
    assert (out.kernel, out.steps, out.warmups, out.dataset) == ("emb", 10, 1, "A")
    assert out.emb == (
        EmbRow(7, 14000000, 128, 30, 2048, 0.002067, 31.5, 15.222),
        EmbRow(8, 14000000, 128, 30, 4096, 0.004611, 62.9, 13.644),
        EmbRow(9, 14000000, 128, 30, 8192, 0.006464, 125.8, 19.466),
        EmbRow(10, 14000000, 128, 30, 16384, 0.009102, 251.7, 27.649),
    )
    for row in out.emb:  # BW = Data / time (MB of 1e6 bytes, GB of 1e9), data printed to 0.1 MB
        assert row.data_mb * 1e6 / row.time_per_step_s / 1e9 == pytest.approx(row.bw_gbps, rel=0.0025)
    [result] = compute_to_probe_results(out, at=1.0)
    assert [(m.name, m.labels, m.value) for m in result.measurements[:2]] == [
        ("bandwidth_bytes_per_second", {"scope": "emb:14000000x128x30x2048"}, pytest.approx(15.222e9)),
        ("step_seconds", {"scope": "emb:14000000x128x30x2048"}, 0.002067),
    ]


def test_linear_readme_table() -> None:
    out = parse_param_compute(_text("compute_linear_readme_cpu.txt"))
    assert (out.kernel, out.dtype) == ("linear", "float")
    assert out.linear == (
        LinearRow(8, 18, 1024, 1024, 1024, 128, 0.344426, 371.6, 46.8),
        LinearRow(9, 18, 1024, 1024, 1024, 256, 0.206910, 1237.3, 155.7),
        LinearRow(10, 18, 1024, 1024, 1024, 512, 0.279407, 1832.5, 230.6),
    )
    for row in out.linear:  # QPS = batch / time per step
        assert row.derived_qps() == pytest.approx(row.qps, abs=0.05)
    [result] = compute_to_probe_results(out, at=1.0)
    assert [(m.name, m.value) for m in result.measurements[:3]] == [
        ("flop_per_second", pytest.approx(46.8e9)),
        ("throughput_samples_per_second", 371.6),
        ("step_seconds", 0.344426),
    ]
    assert result.measurements[0].labels == {"dtype": "float", "scope": "linear:18x1024x1024x1024x128"}


def test_compute_refusals() -> None:
    with pytest.raises(ParseError, match="no result table found"):
        parse_param_compute("Measuring the performance of  gemm  on device =  cpu\n")
    text = "         M         N          K          Time(s)      Rate(GF/s)\n       128,       4096,     0.5\n"
    with pytest.raises(ParseError, match=r"line 2: expected 5 values in a gemm row, got 3"):
        parse_param_compute(text)
