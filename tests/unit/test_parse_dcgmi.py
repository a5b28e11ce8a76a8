"""The dcgmi diag parser and converter against captured outputs (tests/fixtures/tools/dcgmi,
see its README). Expected values were read off the fixture files by hand."""

from __future__ import annotations

from pathlib import Path

import pytest

from healthd.errors import ParseError
from healthd.parsers.dcgmi import DcgmiGpuResult, DcgmiMessage, DcgmiTest, parse_dcgmi, to_probe_results
from probes.result import Outcome

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "tools" / "dcgmi"

DEPLOYMENT_3X = [
    "Denylist",
    "NVML Library",
    "CUDA Main Library",
    "Permissions and OS Blocks",
    "Persistence Mode",
    "Environment Variables",
    "Page Retirement/Row Remap",
    "Graphics Processes",
    "Inforom",
]
ALL_PASS = (DcgmiGpuResult(None, "pass"),)


def _text(name: str) -> str:
    return (FIXTURES / name).read_text()


def test_text_dcgm_3_3_targeted_power_failure_on_gpu_1() -> None:
    diag = parse_dcgmi(_text("dcgm3.3_diag_targeted_power_fail_gpu1.txt"))
    assert (diag.format, diag.dcgm_version, diag.driver_version) == ("text", "3.3.9", "570.195.03")
    assert diag.gpu_device_ids == ("2237", "2237", "2237", "2237")
    assert diag.complete and diag.errors == () and diag.messages == ()
    assert [(t.category, t.name, t.status) for t in diag.tests] == [
        *[("Deployment", name, "pass") for name in DEPLOYMENT_3X],
        ("Integration", "PCIe", "pass"),
        ("Hardware", "GPU Memory", "pass"),
        ("Hardware", "Diagnostic", "pass"),
        ("Stress", "Targeted Stress", "pass"),
        ("Stress", "Targeted Power", "fail"),
        ("Stress", "Memory Bandwidth", "pass"),
        ("Stress", "EUD Test", "skip"),
    ]
    for test in diag.tests:
        if test.name != "Targeted Power":
            assert test.results == (ALL_PASS if test.status == "pass" else (DcgmiGpuResult(None, "skip"),))
            assert test.messages == ()
    power = next(t for t in diag.tests if t.name == "Targeted Power")
    assert power.line == 26
    assert power.results == (
        DcgmiGpuResult(0, "pass"),
        DcgmiGpuResult(2, "pass"),
        DcgmiGpuResult(3, "pass"),
        DcgmiGpuResult(1, "fail"),
    )
    assert power.failed_gpus == (1,)
    assert power.messages == (
        DcgmiMessage(
            "warning",
            "GPU 1 Max power of 224.1 did not reach desired power minimum target_power_min_ratio of 224.2 for GPU 1 "
            "Verify that the clock speeds and GPU utilization are high.",
            1,
            28,
        ),
        DcgmiMessage("info", "GPU 0 GPU 0 max power: 299.5 W average power usage: 299.0 W", 0, 32),
        DcgmiMessage("info", "GPU 2 GPU 2 max power: 227.0 W average power usage: 224.0 W", 2, 34),
        DcgmiMessage("info", "GPU 3 GPU 3 max power: 225.6 W average power usage: 223.9 W", 3, 36),
    )
    assert diag.status == "fail"


def test_converter_fails_the_node_and_names_the_gpu() -> None:
    diag = parse_dcgmi(_text("dcgm3.3_diag_targeted_power_fail_gpu1.txt"))
    [result] = to_probe_results(diag, node="gpu-a10g-3", at=99.0)
    assert result.probe == "dcgmi" and result.outcome is Outcome.FAIL
    assert result.reason == "dcgmi diag failed: Targeted Power"
    assert result.nodes == ["gpu-a10g-3"] and result.started_at == 99.0
    failed = [c for c in result.checks if not c.ok]
    assert [(c.name, c.gpu, c.node) for c in failed] == [("dcgmi.Targeted Power", 1, "gpu-a10g-3")]
    assert failed[0].detail.startswith("fail: GPU 1 Max power of 224.1 did not reach desired power")
    assert len(result.checks) == 19  # 16 tests with one result, Targeted Power with four
    assert result.params["tests"]["EUD Test"] == "skip"
    assert result.params["dcgm_version"] == "3.3.9"


def test_text_dcgm_4_4_per_gpu_sub_rows() -> None:
    diag = parse_dcgmi(_text("dcgm4.4_diag_r2_pass_per_gpu_rows.txt"))
    assert (diag.dcgm_version, diag.driver_version, diag.gpu_device_ids) == ("4.4.2", "580.105.08", ("2237",))
    assert diag.tests == (
        DcgmiTest("Deployment", "software", "pass", (DcgmiGpuResult(None, "pass"), DcgmiGpuResult(0, "pass")), (), 10),
        DcgmiTest("Hardware", "memory", "pass", (DcgmiGpuResult(None, "pass"), DcgmiGpuResult(0, "pass")), (), 13),
        DcgmiTest("Integration", "pcie", "pass", (DcgmiGpuResult(None, "pass"), DcgmiGpuResult(0, "pass")), (), 16),
    )
    [result] = to_probe_results(diag, node="n1", at=1.0)
    assert result.outcome is Outcome.PASS and result.reason == "" and all(c.ok for c in result.checks)


def test_fragment_with_wrapped_warning_and_a_cut_last_row() -> None:
    diag = parse_dcgmi(_text("dcgm_diag_r2_fragment_thermal_warning_cut_row.txt"))
    assert not diag.complete and diag.dcgm_version is None
    [test] = diag.tests
    assert (test.category, test.name, test.status, test.line) == (None, "GPU Memory", "fail", 1)
    assert test.results == (*(DcgmiGpuResult(g, "pass") for g in range(1, 8)), DcgmiGpuResult(0, "fail"))
    assert test.messages == (
        DcgmiMessage(
            "warning",
            "GPU 0 Thermal violations totaling 13.3 seconds started at 9.7 seconds into the test for GPU 0 "
            "Verify that the cooling on this machine is functional, including external, thermal material "
            "interface, fans, and any other components.",
            0,
            3,
        ),
    )


def test_fragment_with_an_error_row_and_no_test() -> None:
    diag = parse_dcgmi(_text("dcgm_diag_deployment_error_row_remap_fragment.txt"))
    assert diag.tests == ()
    assert diag.messages == (
        DcgmiMessage("error", "GPU 3 has uncorrectable memory errors and row remappings are pending", 3, 5),
    )
    [result] = to_probe_results(diag, node="n7", at=1.0)
    assert result.outcome is Outcome.FAIL
    assert result.reason == "dcgmi diag failed: GPU 3 has uncorrectable memory errors and row remappings are pending"
    [check] = result.checks
    assert (check.name, check.ok, check.gpu) == ("dcgmi.error", False, 3)


def test_json_dcgm_3_r2_single_gpu() -> None:
    diag = parse_dcgmi(_text("dcgm3_diag_r2_1gpu.json"))
    assert diag.format == "json" and diag.dcgm_version is None and diag.complete
    assert [(t.category, t.name, t.status, t.results) for t in diag.tests] == [
        *[("Deployment", name, "pass", ALL_PASS) for name in DEPLOYMENT_3X],
        ("Integration", "PCIe", "pass", (DcgmiGpuResult(0, "pass"),)),
        ("Hardware", "GPU Memory", "pass", (DcgmiGpuResult(0, "pass"),)),
    ]
    pcie = diag.tests[9]
    assert pcie.messages == (
        DcgmiMessage(
            "info",
            "GPU 0 GPU 0 GPU to Host bandwidth:\t\t13.15 GB/s, GPU 0 GPU 0 Host to GPU bandwidth:\t\t13.11 GB/s, "
            "GPU 0 GPU 0 bidirectional bandwidth:\t22.49 GB/s, GPU 0 GPU 0 GPU to Host latency:\t\t2.287 us, "
            "GPU 0 GPU 0 Host to GPU latency:\t\t2.370 us, GPU 0 GPU 0 bidirectional latency:\t\t4.532 us",
            0,
            0,
        ),
    )
    assert diag.tests[10].messages == (DcgmiMessage("info", "GPU 0 Allocated 15206918958 bytes (97.3%)", 0, 0),)


def test_json_dcgm_3_r3_with_skip() -> None:
    diag = parse_dcgmi(_text("dcgm3_diag_r3_1gpu.json"))
    assert [(t.name, t.status) for t in diag.tests[9:]] == [
        ("PCIe", "pass"),
        ("GPU Memory", "pass"),
        ("Diagnostic", "pass"),
        ("EUD Test", "skip"),
        ("Targeted Stress", "pass"),
        ("Targeted Power", "pass"),
        ("Memory Bandwidth", "pass"),
    ]
    assert diag.tests[14].messages[0].text == "GPU 0 GPU 0 power average:\t70 W"
    assert diag.tests[13].messages[0].text == "GPU 0 GPU 0 relative stress level\t3184"
    assert "11103.02 gigaflops" in diag.tests[11].messages[0].text
    [result] = to_probe_results(diag, node="vm1", at=1.0)
    assert result.outcome is Outcome.PASS and len(result.checks) == 16


def test_json_with_warning_prefix_nulls_and_upper_case_status() -> None:
    diag = parse_dcgmi(_text("dcgm3.1_diag_json_with_warning_prefix_and_nulls.txt"))
    assert diag.dcgm_version == "3.1.0"
    names = [
        "Denylist",
        "NVML Library",
        "CUDA Main Library",
        "Permissions and OS-related Blocks",
        "Persistence Mode",
        "Environmental Variables",
        "Page Retirement/Row Remap",
        "Graphics Processes",
        "Inforom",
    ]
    eight = tuple(DcgmiGpuResult(g, "pass") for g in range(8))
    assert [(t.category, t.name, t.status, t.results) for t in diag.tests] == [
        *[("Deployment", n, "pass", eight) for n in names],
        ("Custom", "software", "pass", eight),
    ]


def test_json_dcgm_4_entities_warnings_and_metadata() -> None:
    diag = parse_dcgmi(_text("dcgm4.2_diag_json_gb10_software_fail.json"))
    assert (diag.dcgm_version, diag.driver_version) == ("4.2.3", "580.82.09")
    [test] = diag.tests
    assert (test.category, test.name, test.status, test.results) == (
        "Deployment",
        "software",
        "fail",
        (DcgmiGpuResult(0, "fail"),),
    )
    assert test.messages == (
        DcgmiMessage(
            "warning",
            "Persistence Mode: Persistence mode for GPU 0 is disabled. Enable persistence mode by running "
            '"nvidia-smi -i <gpuId> -pm 1 " as root.',
            0,
            0,
        ),
        DcgmiMessage(
            "info",
            "Error getting the SRAM Threshold Count for GPU 0. Status = 0. Value = 9223372036854775794. "
            "SRAM Threshold checking was skipped.",
            None,
            0,
        ),
    )
    [result] = to_probe_results(diag, node="spark-1", at=1.0)
    assert result.outcome is Outcome.FAIL
    [check] = result.checks
    assert (check.name, check.ok, check.gpu) == ("dcgmi.software", False, 0)
    assert check.detail.startswith("fail: Persistence Mode: Persistence mode for GPU 0 is disabled.")


def test_error_line_without_table_is_a_tool_error() -> None:
    diag = parse_dcgmi("Error: Unable to complete diagnostic for group 2147483647. Return: (-33) Timeout.\n")
    assert diag.tests == () and diag.errors == (
        "Error: Unable to complete diagnostic for group 2147483647. Return: (-33) Timeout.",
    )
    [result] = to_probe_results(diag, at=1.0)
    assert result.outcome is Outcome.ERROR and result.reason.startswith("Error: Unable to complete diagnostic")


def test_json_runtime_error_without_tests() -> None:
    text = '{"DCGM GPU Diagnostic": {"runtime_error": "Unable to load the diagnostic library", "version": "3.3.5"}}'
    diag = parse_dcgmi(text)  # synthetic: the 3.x runtime_error key with no test_categories
    assert diag.tests == () and diag.errors == ("Unable to load the diagnostic library",)
    assert diag.dcgm_version == "3.3.5"
    [result] = to_probe_results(diag, at=1.0)
    assert result.outcome is Outcome.ERROR and result.reason == "Unable to load the diagnostic library"


def test_all_skipped_is_skipped() -> None:
    text = (
        "+---------------------------+------------------------------------------------+\n"
        "| Diagnostic                | Result                                         |\n"
        "+===========================+================================================+\n"
        "+-----  Hardware  ----------+------------------------------------------------+\n"
        "| EUD Test                  | Skip - All                                     |\n"
        "+---------------------------+------------------------------------------------+\n"
    )
    [result] = to_probe_results(parse_dcgmi(text), at=1.0)  # synthetic: built from the 3.3.9 layout
    assert result.outcome is Outcome.SKIPPED


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "no diagnostic output found"),
        ("nothing here\n", "no diagnostic output found"),
        ('{"something": 1, "DCGM": 2}', "expected a 'DCGM GPU Diagnostic' or 'DCGM Diagnostic' object"),
        ('{"DCGM GPU Diagnostic": {\n"x": [}', "dcgmi JSON: Expecting value at line 2 column 7"),
        ('["DCGM GPU Diagnostic"]', "no diagnostic output found"),
    ],
)
def test_unreadable_output_is_refused(text: str, message: str) -> None:
    with pytest.raises(ParseError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_dcgmi(text)
