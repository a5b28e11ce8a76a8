"""The gemm probe's NVML readings in a real H100 document: the daemon's parser reads them as measurements."""

from __future__ import annotations

import json
from pathlib import Path

from healthd.parsers.healthd_json import parse_result
from probes.gemm import telemetry_measurements
from probes.telemetry import Sample, Summary

H100_GEMM = Path(__file__).resolve().parents[1] / "fixtures" / "h100" / "standalone" / "full-gemm.json"


def test_h100_gemm_document_with_telemetry_parses() -> None:
    doc = json.loads(H100_GEMM.read_text())
    capped = 0x4
    summary = Summary.of([Sample(1330, 699_000, 700_000, capped), Sample(1335, 701_000, 700_000, capped | 0x40)])
    added = [m.model_dump() for m in telemetry_measurements("vm", 0, "fp8", summary)]
    doc["measurements"] += added
    doc["params"]["telemetry"] = "nvml"
    doc["params"]["gpu_state"] = [{"node": "vm", "gpu": 0, "dtype": "fp8", "warmup_s": 1.2, "stable": True,
                                   "iters": 300, "samples": 2, "reasons": list(summary.reasons)}]
    result = parse_result(json.dumps(doc))
    got = {m.name: m for m in result.measurements if m.labels.get("dtype") == "fp8"}
    assert set(got) == {"flop_per_second", "sm_clock_hertz", "power_watts", "power_limit_watts", "throttle_ratio"}
    assert got["sm_clock_hertz"].value == 1.3325e9 and got["power_watts"].value == 700.0
    assert got["throttle_ratio"].value == 0.5 and got["power_limit_watts"].labels == {"gpu": "0", "dtype": "fp8"}
    assert result.params["gpu_state"][0]["reasons"] == ["sw_power_cap", "hw_thermal_slowdown"]


def test_table_shows_the_gpus_state_next_to_the_figure() -> None:
    from probes.gemm import format_table
    from probes.result import ProbeResult

    doc = json.loads(H100_GEMM.read_text())
    summary = Summary.of([Sample(1330, 700_000, 700_000, 0x4), Sample(1330, 700_000, 700_000, 0x4 | 0x40)])
    doc["measurements"] += [m.model_dump() for m in telemetry_measurements("vm", 0, "fp8", summary)]
    rows = {line.split()[2]: line.split() for line in format_table(ProbeResult.model_validate(doc)).splitlines()
            if line.startswith("  vm") and len(line.split()) > 4}
    assert rows["fp8"][3:7] == ["1314.174", "1330", "700", "50%"]
    assert rows["bf16"][4:7] == ["-", "-", "-"]  # a document without readings
