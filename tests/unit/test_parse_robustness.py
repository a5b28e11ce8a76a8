"""Robustness of every tool parser: arbitrary text raises nothing but ``ParseError``; empty
input, binary garbage, cut lines, CRLF endings and a 10 MB input (all SYNTHETIC, built here
from the captured fixtures) behave."""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from healthd.errors import ParseError
from healthd.parsers.nccl_tests import parse_nccl_tests
from healthd.parsers.tools import TOOLS, decode_output

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "tools"

SAMPLE_LINES = sorted(
    {
        line
        for path in FIXTURES.rglob("*")
        if path.suffix in (".txt", ".json")
        for line in path.read_text().splitlines()[:60]
    }
)


def _parse_and_convert(tool: str, text: str) -> None:
    """Parse; when that succeeds the converter must succeed too."""
    spec = TOOLS[tool]
    try:
        parsed = spec.parse(text)
    except ParseError as exc:
        assert str(exc)
        return
    spec.convert(parsed, node="n1", at=1.0)


_TEXT = st.text(alphabet=st.characters(codec="utf-8"), max_size=400)
_MIXED = st.lists(
    st.one_of(st.sampled_from(SAMPLE_LINES), _TEXT, st.sampled_from(SAMPLE_LINES).map(lambda s: s[: len(s) // 2])),
    max_size=40,
).map("\n".join)


@pytest.mark.parametrize("tool", sorted(TOOLS))
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=_TEXT)
def test_arbitrary_text_raises_only_parse_error(tool: str, text: str) -> None:
    _parse_and_convert(tool, text)


@pytest.mark.parametrize("tool", sorted(TOOLS))
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=_MIXED)
def test_shuffled_and_cut_fixture_lines_raise_only_parse_error(tool: str, text: str) -> None:
    _parse_and_convert(tool, text)


@pytest.mark.parametrize("tool", sorted(TOOLS))
def test_empty_and_blank_input_is_a_parse_error(tool: str) -> None:
    for text in ("", "\n\n", "   \t  \n"):
        with pytest.raises(ParseError):
            TOOLS[tool].parse(text)


@pytest.mark.parametrize("tool", sorted(TOOLS))
def test_binary_garbage(tool: str) -> None:
    rng = random.Random(20260722)
    for _ in range(20):
        data = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 4096)))
        _parse_and_convert(tool, decode_output(data))
        _parse_and_convert(tool, data.decode("latin-1"))


def test_binary_garbage_between_table_lines_is_ignored() -> None:
    rng = random.Random(7)
    lines = (FIXTURES / "nccl_tests" / "v2.19_all_reduce_8xa100.txt").read_text().splitlines()
    noisy = []
    for line in lines:
        noisy.append(line)
        noisy.append(bytes(rng.randrange(32, 256) for _ in range(80)).decode("latin-1").replace("\n", " "))
    run = parse_nccl_tests("\n".join(noisy)).runs[0]
    clean = parse_nccl_tests("\n".join(lines)).runs[0]
    assert [(r.size_bytes, r.out_of_place, r.in_place) for r in run.rows] == [
        (r.size_bytes, r.out_of_place, r.in_place) for r in clean.rows
    ]
    assert (run.out_of_bounds, run.avg_busbw_gbps) == (clean.out_of_bounds, clean.avg_busbw_gbps)


def test_output_cut_in_the_middle_of_a_row() -> None:
    text = (FIXTURES / "nccl_tests" / "v2.19_all_reduce_8xa100.txt").read_text()
    row = "        4096          1024     float     sum      -1    37.17    0.11    0.19       0    36.85"
    cut = text[: text.index(row) + len(row) - 20]
    run = parse_nccl_tests(cut).runs[0]
    assert len(run.rows) == 9 and run.cut_rows == (27,) and run.truncated
    assert run.rows[-1].size_bytes == 2048


def test_every_prefix_of_a_capture_parses_or_is_refused() -> None:
    text = (FIXTURES / "nccl_tests" / "v2.17_all_reduce_wrong_data_2nodes.txt").read_text()
    for end in range(0, len(text), 37):
        try:
            out = parse_nccl_tests(text[:end])
        except ParseError:
            continue
        for run in out.runs:
            assert all(r.line <= text[:end].count("\n") + 1 for r in run.rows)


CRLF_SAMPLES = {
    "nccl-tests": "nccl_tests/v2.17_all_reduce_wrong_data_2nodes.txt",
    "param-comms": "param/synthetic_comms_2020_tab_separated.txt",
    "param-compute": "param/compute_linear_readme_cpu.txt",
    "ddp-benchmark": "ddp_benchmark/readme_2x_dgx1v_four_models.txt",
    "horovod": "horovod/tf2_keras_2gpu_srun_warmup_epoch.txt",
    "dcgmi": "dcgmi/dcgm3.3_diag_targeted_power_fail_gpu1.txt",
}


@pytest.mark.parametrize("tool", sorted(CRLF_SAMPLES))
def test_crlf_line_endings_parse_like_lf(tool: str) -> None:
    text = (FIXTURES / CRLF_SAMPLES[tool]).read_text()
    assert TOOLS[tool].parse(text.replace("\n", "\r\n")) == TOOLS[tool].parse(text)


BIG_INPUTS: list[tuple[str, str, Callable[[Any], int]]] = [
    ("nccl-tests", "nccl_tests/v2.16_all_reduce_debug_info_nccl_failure.txt", lambda p: len(p.runs)),
    ("nccl-tests", "nccl_tests/v2.16_all_reduce_2x8_h100_mpirun.txt", lambda p: len(p.runs)),
    ("param-comms", "param/synthetic_comms_2026_time_columns_srun.txt", lambda p: len(p.rows)),
    ("param-compute", "param/compute_gemm_readme_cpu_gflops.txt", lambda p: len(p.gemm)),
    ("ddp-benchmark", "ddp_benchmark/readme_2x_dgx1v_four_models.txt", lambda p: len(p.benchmarks)),
    ("horovod", "horovod/tf2_8gpu_tag_output_with_elisions.txt", lambda p: len(p.iterations)),
    ("dcgmi", "dcgmi/dcgm3.3_diag_targeted_power_fail_gpu1.txt", lambda p: len(p.tests)),
]


@pytest.mark.slow
@pytest.mark.parametrize(("tool", "path", "count"), BIG_INPUTS, ids=[p for _, p, _ in BIG_INPUTS])
def test_ten_megabyte_input(
    tool: str, path: str, count: Callable[[Any], int], record_property: Callable[[str, object], None]
) -> None:
    """A 10 MB input (a capture repeated) parses; the time is printed and recorded, not asserted."""
    chunk = (FIXTURES / path).read_text()
    copies = 10 * 1024 * 1024 // len(chunk) + 1
    text = chunk * copies
    assert len(text) >= 10 * 1024 * 1024
    start = time.perf_counter()
    parsed = TOOLS[tool].parse(text)
    elapsed = time.perf_counter() - start
    record_property("parse_seconds", round(elapsed, 3))
    print(f"\n{tool}: parsed {len(text) / 1e6:.1f} MB ({copies} copies of {path}) in {elapsed:.2f} s")
    assert count(parsed) > 0


@pytest.mark.parametrize(
    ("row", "column"),
    [
        ("       128,       1e300,       1e300,       0.519193     827.240", "N"),
        ("       128,       4096,       1.5,       0.519193     827.240", "K"),
        ("       128,       4096,       -4096,       0.519193     827.240", "K"),
    ],
)
def test_param_compute_gemm_shape_out_of_range_is_a_parse_error(row: str, column: str) -> None:
    """SYNTHETIC: a GEMM row of the real capture with N and K at 1e300 (finite floats whose
    ``2*M*N*K`` is no float: it raised ``OverflowError``), a fractional and a negative K."""
    text = (FIXTURES / "param" / "compute_gemm_readme_cpu_gflops.txt").read_text()
    original = "       128,       4096,       4096,       0.519193     827.240"
    assert original in text
    with pytest.raises(ParseError, match=rf"line 8: gemm column {column} must be a whole number"):
        TOOLS["param-compute"].results(text.replace(original, row), node="n1", at=1.0)
