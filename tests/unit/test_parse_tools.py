"""The tool registry: every tool name maps to its parser and converter."""

from __future__ import annotations

from pathlib import Path

import pytest

from healthd.errors import ParseError
from healthd.parsers import dcgmi, ddp_benchmark, horovod, nccl_tests, param
from healthd.parsers.tools import TOOL_NAMES, TOOLS, decode_output, parse_tool_output, results_from_text
from probes.result import Outcome

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "tools"

SAMPLES = {
    "nccl-tests": ("nccl_tests/v2.19_all_reduce_8xa100.txt", "nccl_tests", nccl_tests.NcclTestsOutput),
    "param-comms": ("param/synthetic_comms_2022_latency_columns.txt", "param_comms", param.CommsOutput),
    "param-compute": ("param/compute_gemm_readme_cpu_gflops.txt", "param_compute", param.ComputeOutput),
    "ddp-benchmark": (
        "ddp_benchmark/readme_2x_dgx1v_four_models.txt",
        "ddp_benchmark",
        ddp_benchmark.DdpBenchmarkOutput,
    ),
    "horovod": ("horovod/tf2_16gpu_2nodes_mpirun.txt", "horovod", horovod.HorovodBenchmark),
    "dcgmi": ("dcgmi/dcgm3.3_diag_targeted_power_fail_gpu1.txt", "dcgmi", dcgmi.DcgmiDiag),
}


def test_registry_names_match_the_literal() -> None:
    assert set(TOOLS) == set(TOOL_NAMES) == set(SAMPLES)
    for name, spec in TOOLS.items():
        assert spec.name == name


@pytest.mark.parametrize("tool", sorted(SAMPLES))
def test_each_tool_parses_and_converts_its_sample(tool: str) -> None:
    path, probe, result_type = SAMPLES[tool]
    text = (FIXTURES / path).read_text()
    assert TOOLS[tool].probe == probe
    parsed = parse_tool_output(tool, text)
    assert isinstance(parsed, result_type)
    results = results_from_text(tool, text, node="node-x", at=42.0)
    assert results and all(r.probe == probe for r in results)
    assert all(r.started_at == 42.0 for r in results)
    assert results == TOOLS[tool].convert(parsed, node="node-x", at=42.0)
    expected = Outcome.FAIL if tool == "dcgmi" else Outcome.PASS
    assert [r.outcome for r in results] == [expected]
    for result in results:  # every document survives the JSON round trip the store uses
        assert type(result).model_validate_json(result.to_json()) == result


def test_unknown_tool_and_unreadable_text() -> None:
    with pytest.raises(ValueError, match="unknown tool 'iperf'; known tools: dcgmi, ddp-benchmark, horovod"):
        parse_tool_output("iperf", "x")
    with pytest.raises(ParseError):
        results_from_text("horovod", "nothing to see\n")


def test_decode_output_replaces_invalid_utf8() -> None:
    assert decode_output(b"Iter #0: 1.0 img/sec per GPU\xff\n") == "Iter #0: 1.0 img/sec per GPU\ufffd\n"
