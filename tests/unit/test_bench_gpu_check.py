"""``bench/gpu_check.py`` on the CPU with tiny sizes: the probes and the independent harness both run,
side by side, and every figure has a probe value, a harness value and their ratio (nothing is
asserted about the ratio's size here: CPU figures at tiny sizes are noise; bench/RESULTS.md has them)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bench.gpu_check import render

REPO = Path(__file__).resolve().parents[2]


def _run(*extra: str) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "TORCHELASTIC_", "HEALTHD_"))
           and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    env["CUDA_VISIBLE_DEVICES"] = ""
    out = subprocess.run(
        [sys.executable, str(REPO / "bench" / "gpu_check.py"), "--device", "cpu", "--tiny", "--json", *extra],
        capture_output=True, text=True, timeout=600, cwd=REPO, env=env, check=False,
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    report: dict[str, Any] = json.loads(out.stdout)
    return report


def _assert_ratios(report: dict[str, Any], rounds: int) -> None:
    figures = {f["key"]: f for f in report["figures"]}
    assert set(figures) == {"gemm.fp32", "gemm.bf16", "compute.mlp", "ddp.model", "ddp.single_rank_model"}
    for f in figures.values():
        assert len(f["probe"]) == len(f["harness"]) == len(f["ratios"]) == rounds, f
        assert f["probe_median"] > 0 and f["harness_median"] > 0
        assert f["ratio"] == pytest.approx(f["probe_median"] / f["harness_median"])
    assert report["errors"] == [] and report["telemetry"] == "not a GPU run"
    text = render(report)
    assert "gemm.fp32" in text and "ratio" in text and f"{figures['gemm.fp32']['ratio']:.3f}" in text


def test_gpu_check_on_cpu_prints_ratios() -> None:
    _assert_ratios(_run("--rounds", "1", "--no-full-check"), 1)


@pytest.mark.slow
def test_gpu_check_alternating_rounds_and_full_check() -> None:
    report = _run("--rounds", "2")
    _assert_ratios(report, 2)
    full = report["full_check"]
    assert set(full["probes_s"]) == set(full["outcomes"]) == {"env", "nccl", "gemm", "ddp"}
    assert full["outcomes"]["gemm"] == "pass"
    assert full["total_s"] == pytest.approx(sum(full["probes_s"].values())) and full["total_s"] > 0
    # the same four in one process (`probes check`, its own argv: --run-ids, not --run-id)
    assert full["one_process_outcome"] == "env pass, nccl pass, gemm pass, ddp pass", full
