"""Model FLOPs and MFU of the DDP probe, by hand."""

from __future__ import annotations

import pytest

from healthd.judge.peaks import PeakRule, mfu, packaged_peaks, peak_flops
from probes.ddp import CPU_DEFAULT, GPU_DEFAULT, attention_flop_per_token, build_model, model_flop_per_second


def test_parameter_count_of_the_cpu_model_by_hand() -> None:
    """2 blocks, width 64, seq 64, vocab 512, tied head:
    wte 512*64 = 32768, wpe 64*64 = 4096, ln_f 2*64 = 128; per block ln1 128 + qkv 64*192+192 = 12480
    + proj 64*64+64 = 4160 + ln2 128 + fc 64*256+256 = 16640 + out 256*64+64 = 16448 = 49984."""
    model = build_model(CPU_DEFAULT)
    assert sum(p.numel() for p in model.parameters()) == 32768 + 4096 + 128 + 2 * 49984 == 136_960


def test_model_flop_per_second_by_hand() -> None:
    # the CPU model, 4 x 64 tokens a step at 10 ms: 25,600 tokens/s; 6 * 136,960 = 821,760 FLOP a token
    assert model_flop_per_second(136_960, 4 * 64 / 0.01) == pytest.approx(821_760 * 25_600) == 21_037_056_000
    # GPT-2 small (124M), 8 x 1024 tokens per GPU at 100 ms: 81,920 tokens/s -> 60.95 TFLOP/s
    assert model_flop_per_second(124_000_000, 81_920) == pytest.approx(6.094848e13)


def test_attention_flops_are_stated_not_included() -> None:
    # PaLM's 12 * L * T * d per token: 12 * 12 * 1024 * 768 = 113,246,208 for the GPU default (~15% of 6N)
    assert attention_flop_per_token(GPU_DEFAULT) == 113_246_208
    assert model_flop_per_second(1, 1.0) == 6.0


def test_mfu_against_the_class_peak_by_hand() -> None:
    # 60.95 TFLOP/s on an H100 SXM (989.4 dense bf16) is 6.16% MFU; on an A100 (312) 19.5%
    assert mfu(6.094848e13, "h100x8", "bf16") == pytest.approx(0.0616015, rel=1e-5)
    assert mfu(6.094848e13, "nvidia_a100-sxm4-80gbx8", "bf16") == pytest.approx(0.195348, rel=1e-5)
    assert mfu(6.094848e13, "nvidia_h100_pcie_80gbx2", "bf16") == pytest.approx(6.094848e13 / 756e12)
    assert mfu(1e12, "cpu", "fp32") is None and mfu(1e12, "a100x8", "fp8") is None


def test_every_peak_has_a_source_and_the_narrow_patterns_come_first() -> None:
    rules = packaged_peaks()
    assert all(r.source and r.values for r in rules)
    assert peak_flops("h100nvlx4", "bf16") == 835e12 and peak_flops("h200x8", "fp8") == 1978.9e12
    mine = (PeakRule(("*",), {"bf16": 1.0}, "test"),)
    assert peak_flops("anything", "bf16", mine) == 1.0 and peak_flops("anything", "fp32", mine) is None
