"""The Horovod synthetic-benchmark parser against captured outputs (tests/fixtures/tools/horovod,
see its README). Numbers read off the files by hand; means recomputed from the iterations."""

from __future__ import annotations

from pathlib import Path

import pytest

from healthd.errors import ParseError
from healthd.parsers.horovod import HorovodBenchmark, HorovodIteration, parse_horovod, to_probe_results
from probes.result import Outcome

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "tools" / "horovod"


def _parse(name: str) -> HorovodBenchmark:
    return parse_horovod((FIXTURES / name).read_text())


@pytest.mark.parametrize(
    (
        "name",
        "model",
        "batch",
        "devices",
        "rates",
        "first_line",
        "mean",
        "conf",
        "total",
        "total_conf",
        "excludes_first",
    ),
    [
        (
            "tf2_8gpu_tag_output_with_elisions.txt",
            "ResNet50",
            32,
            8,
            [598.3, 598.7, 597.6, 600.6, 599.3, 599.5, 598.4, 601.3, 603.7, 602.8],
            8,
            600.0,
            3.8,
            4800.1,
            30.3,
            False,
        ),
        (
            "tf2_16gpu_2nodes_mpirun.txt",
            "ResNet50",
            32,
            16,
            [572.9, 574.1, 573.8, 573.0, 573.1, 572.5, 573.6, 574.2, 571.6, 572.9],
            8,
            573.2,
            1.5,
            9170.8,
            23.4,
            False,
        ),
        (
            "pytorch_8gpu_nccl_version_line.txt",
            "resnet50",
            96,
            8,
            [1785.8, 1787.9, 1787.6, 1784.7, 1783.5, 1785.2, 1785.0, 1782.4, 1785.3, 1784.1],
            7,
            1785.2,
            3.1,
            14281.2,
            25.0,
            False,
        ),
        (
            "tf2_keras_2gpu_srun_warmup_epoch.txt",
            "ResNet50",
            128,
            2,
            [448.0, 1486.4, 1487.6, 1486.6, 1488.6, 1489.1, 1487.7, 1487.8, 1489.9, 1489.0],
            6,
            1488.1,
            2.2,
            2976.1,
            4.3,
            True,
        ),
    ],
)
def test_captured_outputs(
    name: str,
    model: str,
    batch: int,
    devices: int,
    rates: list[float],
    first_line: int,
    mean: float,
    conf: float,
    total: float,
    total_conf: float,
    excludes_first: bool,
) -> None:
    bench = _parse(name)
    assert (bench.model, bench.batch_size, bench.device, bench.devices) == (model, batch, "GPU", devices)
    assert bench.iterations == tuple(HorovodIteration(i, r, first_line + i) for i, r in enumerate(rates))
    assert (bench.per_device_mean, bench.per_device_conf) == (mean, conf)
    assert (bench.total, bench.total_conf, bench.total_devices) == (total, total_conf, devices)
    assert not bench.truncated
    assert bench.mean_excludes_first is excludes_first
    # the printed mean is the mean of the iterations it covers (to the printed 0.1)
    used = rates[1:] if excludes_first else rates
    assert sum(used) / len(used) == pytest.approx(mean, abs=0.05)
    # the total is the device count times the per-device mean (to the printed 0.1 of each)
    assert devices * mean == pytest.approx(total, abs=devices * 0.05 + 0.05)
    [result] = to_probe_results(bench, node="g1", at=7.0)
    assert result.probe == "horovod" and result.outcome is Outcome.PASS and result.nodes == ["g1"]
    assert [(m.name, m.labels, m.value, m.node) for m in result.measurements] == [
        ("throughput_samples_per_second", {"scope": "per_gpu"}, mean, "g1"),
        ("throughput_samples_per_second", {"scope": "total"}, total, "g1"),
    ]
    assert result.params["iterations"] == rates


def test_nccl_version_line() -> None:
    assert _parse("pytorch_8gpu_nccl_version_line.txt").nccl_version == "2.20.5+cuda12.4"


def test_output_stopped_before_the_totals_is_an_error() -> None:
    text = (FIXTURES / "pytorch_8gpu_nccl_version_line.txt").read_text().split("Iter #5")[0]
    bench = parse_horovod(text)
    assert bench.truncated and len(bench.iterations) == 5 and bench.total is None
    [result] = to_probe_results(bench, at=1.0)
    assert result.outcome is Outcome.ERROR
    assert result.reason == "truncated output: no 'Total img/sec' line after 5 iterations"
    assert result.measurements == []


def test_text_without_benchmark_output_is_refused() -> None:
    with pytest.raises(ParseError, match="no synthetic benchmark output found"):
        parse_horovod("Running warmup...\nRunning benchmark...\n")
