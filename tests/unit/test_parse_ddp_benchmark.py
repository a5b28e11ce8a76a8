"""The PyTorch DDP benchmark parser against the README's example output (tests/fixtures/tools/
ddp_benchmark, see its README). Every cell is compared with the file's tokens; rows checked by
hand; ex/sec checked against batch_size / sec_per_iter."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from healthd.errors import ParseError
from healthd.parsers.ddp_benchmark import DdpPercentile, parse_ddp_benchmark, to_probe_results
from probes.result import Outcome

FIXTURE = (
    Path(__file__).resolve().parents[1] / "fixtures" / "tools" / "ddp_benchmark" / "readme_2x_dgx1v_four_models.txt"
)
CONFIGS = [(1, "no ddp"), (1, "1M/1G"), (2, "1M/2G"), (4, "1M/4G"), (8, "1M/8G"), (16, "2M/8G")]


def test_readme_output() -> None:
    out = parse_ddp_benchmark(FIXTURE.read_text())
    assert (out.pytorch_version, out.cuda_version, out.backend, out.bucket_size_mb) == (
        "1.4.0a0+05140f0",
        "10.0",
        "nccl",
        None,
    )
    assert out.errors == () and not out.truncated
    assert [(b.model, b.batch_size, b.line) for b in out.benchmarks] == [
        ("resnet50", 32, 38),
        ("resnet101", 32, 48),
        ("resnext50_32x4d", 32, 58),
        ("resnext101_32x8d", 32, 68),
    ]
    oracle = [line for line in FIXTURE.read_text().splitlines() if " GPUs -- " in line]
    results = [r for b in out.benchmarks for r in b.results]
    assert len(results) == len(oracle) == 24
    for line, result in zip(oracle, results, strict=True):
        head, cells = line.split(":", 1)
        assert result.ranks == int(head.split()[0])
        assert result.config == " ".join(head.split("--")[1].split())
        tokens = re.findall(r"p(\d\d):\s+([\d.]+)s\s+(\d+)/s", cells)
        assert [(c.percentile, c.sec_per_iter, c.samples_per_second) for c in result.percentiles] == [
            (int(p), float(s), int(e)) for p, s, e in tokens
        ]
    assert [(r.ranks, r.config) for r in out.benchmarks[0].results] == CONFIGS
    last = out.benchmarks[1].results[-1]
    assert last.percentiles == (
        DdpPercentile(50, 0.179, 178),
        DdpPercentile(75, 0.180, 177),
        DdpPercentile(90, 0.183, 174),
        DdpPercentile(95, 0.188, 170),
    )
    assert last.machines == 2 and out.benchmarks[0].results[0].machines is None
    # ex/sec is floor(32 / unrounded sec/iter); the printed sec/iter is rounded to 1 ms
    for bench in out.benchmarks:
        for result in bench.results:
            for cell in result.percentiles:
                lo = bench.batch_size / (cell.sec_per_iter + 0.0005)
                hi = bench.batch_size / (cell.sec_per_iter - 0.0005)
                assert int(lo) <= cell.samples_per_second <= hi
                derived = cell.derived_samples_per_second(bench.batch_size)
                assert derived is not None and lo <= derived <= hi


def test_converter() -> None:
    [result] = to_probe_results(parse_ddp_benchmark(FIXTURE.read_text()), node="dgx1-a", at=3.0)
    assert result.probe == "ddp_benchmark" and result.outcome is Outcome.PASS and result.nodes == ["dgx1-a"]
    assert len(result.measurements) == 4 * 6 * 4 * 2
    first = result.measurements[:2]
    assert [(m.name, m.value, m.labels) for m in first] == [
        ("step_seconds", 0.097, {"scope": "resnet50:no ddp", "quantile": "0.5"}),
        ("throughput_samples_per_second", 329.0, {"scope": "resnet50:no ddp", "quantile": "0.5"}),
    ]
    multi = [m for m in result.measurements if m.labels["scope"] == "resnext101_32x8d:2M/8G"]
    assert [(m.name, m.labels["quantile"], m.value, m.labels["nodes"]) for m in multi] == [
        ("step_seconds", "0.5", 0.450, "2"),
        ("throughput_samples_per_second", "0.5", 71.0, "2"),
        ("step_seconds", "0.75", 0.451, "2"),
        ("throughput_samples_per_second", "0.75", 70.0, "2"),
        ("step_seconds", "0.9", 0.451, "2"),
        ("throughput_samples_per_second", "0.9", 70.0, "2"),
        ("step_seconds", "0.95", 0.451, "2"),
        ("throughput_samples_per_second", "0.95", 70.0, "2"),
    ]
    assert result.params["models"] == ["resnet50", "resnet101", "resnext50_32x4d", "resnext101_32x8d"]


def test_topology_mismatch_and_bucket_line() -> None:
    text = (
        "-----------------------------------\nPyTorch distributed benchmark suite\n"
        "-----------------------------------\n\n* PyTorch version: 2.1.0\n* CUDA version: 12.1\n"
        "* Distributed backend: nccl\n* Maximum bucket size: 25MB\n"
        'Output of "nvidia-smi topo -m" differs between machines\n'
    )  # synthetic, from benchmark.py's print statements
    out = parse_ddp_benchmark(text)
    assert out.bucket_size_mb == 25 and out.truncated and out.benchmarks == ()
    [result] = to_probe_results(out, at=1.0)
    assert result.outcome is Outcome.ERROR
    assert result.reason == 'Output of "nvidia-smi topo -m" differs between machines'


def test_unreadable_rows_are_refused_with_their_line() -> None:
    with pytest.raises(ParseError, match="no output found"):
        parse_ddp_benchmark("nothing\n")
    with pytest.raises(ParseError, match="line 1: result row before any 'Benchmark"):
        parse_ddp_benchmark("   1 GPUs --   no ddp:  p50:  0.097s     329/s\n")
    with pytest.raises(ParseError, match=r"line 2: expected 'pNN:  S.SSSs  N/s' cells"):
        parse_ddp_benchmark("Benchmark: resnet50 with batch size 32\n   1 GPUs --   no ddp:  p50:  garbage\n")
