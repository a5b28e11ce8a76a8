"""Parser for Horovod's synthetic benchmarks (``pytorch_synthetic_benchmark.py``,
``tensorflow2_synthetic_benchmark.py``, ``tensorflow2_keras_synthetic_benchmark.py``).

Rank 0 prints::

    Model: resnet50
    Batch size: 32
    Number of GPUs: 8
    Running warmup...
    Running benchmark...
    Iter #0: 1785.8 img/sec per GPU
    ...
    Img/sec per GPU: 1785.2 +-3.1
    Total img/sec on 8 GPU(s): 14281.2 +-25.0

``img/sec per GPU`` of one iteration is ``batch_size * num_batches_per_iter / time``; the
summary is the mean over iterations and ``1.96 * std`` (the total multiplies both by the
device count). The Keras variant prints its warm-up epoch as ``Iter #0`` and leaves it out
of the mean; ``mean_excludes_first`` tells which convention reproduces the printed mean.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Literal

from healthd.errors import ParseError
from healthd.parsers.common import strip_tag, tool_result
from probes.result import Measurement, Outcome, ProbeResult

__all__ = ["HorovodBenchmark", "HorovodIteration", "parse_horovod", "to_probe_results"]

PROBE = "horovod"
Device = Literal["GPU", "CPU"]


@dataclass(frozen=True, slots=True)
class HorovodIteration:
    index: int
    samples_per_second: float
    line: int


@dataclass(frozen=True, slots=True)
class HorovodBenchmark:
    model: str | None
    batch_size: int | None
    device: Device | None
    devices: int | None
    iterations: tuple[HorovodIteration, ...]
    per_device_mean: float | None
    per_device_conf: float | None
    total: float | None
    total_conf: float | None
    total_devices: int | None
    nccl_version: str | None
    truncated: bool

    def derived_mean(self, *, exclude_first: bool) -> float | None:
        """Mean of the iteration rates (without ``Iter #0`` when ``exclude_first``)."""
        values = [i.samples_per_second for i in self.iterations]
        if exclude_first:
            values = values[1:]
        return sum(values) / len(values) if values else None

    @property
    def mean_excludes_first(self) -> bool | None:
        """Whether the printed mean leaves ``Iter #0`` out (Keras variant); ``None`` if unknown."""
        if self.per_device_mean is None or len(self.iterations) < 2:
            return None
        tolerance = 0.05 + 1e-9
        with_first = self.derived_mean(exclude_first=False)
        without_first = self.derived_mean(exclude_first=True)
        if with_first is not None and abs(with_first - self.per_device_mean) <= tolerance:
            return False
        if without_first is not None and abs(without_first - self.per_device_mean) <= tolerance:
            return True
        return None


_NUM = r"(\d{1,12}(?:\.\d{1,12})?)"
_MODEL = re.compile(r"^Model: (\S+)\s*$")
_BATCH = re.compile(r"^Batch size: (\d{1,9})\s*$")
_NDEV = re.compile(r"^Number of (GPU|CPU)s: (\d{1,9})\s*$")
_ITER = re.compile(r"^Iter #(\d{1,9}): " + _NUM + r" img/sec per (GPU|CPU)\b")
_MEAN = re.compile(r"^Img/sec per (GPU|CPU): " + _NUM + r" \+-" + _NUM + r"\s*$")
_TOTAL = re.compile(r"^Total img/sec on (\d{1,9}) (GPU|CPU)\(s\): " + _NUM + r" \+-" + _NUM + r"\s*$")
_NCCL = re.compile(r"^NCCL version (\S+)")


def parse_horovod(text: str) -> HorovodBenchmark:
    """Parse a synthetic benchmark's rank-0 output. Raises ``ParseError`` when neither the
    ``Model:`` preamble nor any ``Iter #``/``Img/sec`` line is present."""
    if not isinstance(text, str):
        raise ParseError(f"horovod: expected text (str), got {type(text).__name__}")
    model: str | None = None
    batch: int | None = None
    device: Device | None = None
    devices: int | None = None
    iterations: list[HorovodIteration] = []
    mean = conf = total = total_conf = None
    total_devices: int | None = None
    nccl: str | None = None
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = strip_tag(raw).strip()
        if not line:
            continue
        if m := _MODEL.match(line):
            model = m.group(1)
        elif m := _BATCH.match(line):
            batch = int(m.group(1))
        elif m := _NDEV.match(line):
            device = "GPU" if m.group(1) == "GPU" else "CPU"
            devices = int(m.group(2))
        elif m := _ITER.match(line):
            iterations.append(HorovodIteration(int(m.group(1)), float(m.group(2)), lineno))
        elif m := _MEAN.match(line):
            mean, conf = float(m.group(2)), float(m.group(3))
        elif m := _TOTAL.match(line):
            total_devices = int(m.group(1))
            total, total_conf = float(m.group(3)), float(m.group(4))
        elif m := _NCCL.match(line):
            nccl = m.group(1)
    if model is None and not iterations and mean is None and total is None:
        raise ParseError(
            "horovod: no synthetic benchmark output found: expected 'Model: ...', "
            "'Iter #N: X img/sec per GPU' or 'Total img/sec on N GPU(s): ...' lines"
        )
    return HorovodBenchmark(
        model=model,
        batch_size=batch,
        device=device,
        devices=devices,
        iterations=tuple(iterations),
        per_device_mean=mean,
        per_device_conf=conf,
        total=total,
        total_conf=total_conf,
        total_devices=total_devices,
        nccl_version=nccl,
        truncated=total is None,
    )


def to_probe_results(
    parsed: HorovodBenchmark, *, node: str | None = None, at: float | None = None
) -> list[ProbeResult]:
    """One ``ProbeResult`` (probe ``horovod``): ``throughput_samples_per_second`` with
    ``scope`` ``per_gpu`` (or ``per_cpu``) and ``total``; the per-iteration rates (of rank 0's
    view, not per rank) go in ``params['iterations']``. Outcome ``error`` when the output
    stops before the ``Total img/sec`` line."""
    unit = (parsed.device or "GPU").lower()
    measurements: list[Measurement] = []
    if parsed.per_device_mean is not None and math.isfinite(parsed.per_device_mean):
        measurements.append(
            Measurement(
                name="throughput_samples_per_second",
                value=parsed.per_device_mean,
                labels={"scope": f"per_{unit}"},
                node=node,
            )
        )
    if parsed.total is not None and math.isfinite(parsed.total):
        measurements.append(
            Measurement(name="throughput_samples_per_second", value=parsed.total, labels={"scope": "total"}, node=node)
        )
    params: dict[str, Any] = {
        "tool": "horovod",
        "model": parsed.model,
        "batch_size": parsed.batch_size,
        "device": parsed.device,
        "devices": parsed.devices,
        "iterations": [i.samples_per_second for i in parsed.iterations],
        "per_device_conf": parsed.per_device_conf,
        "total_conf": parsed.total_conf,
        "mean_excludes_first": parsed.mean_excludes_first,
        "nccl_version": parsed.nccl_version,
    }
    if parsed.total is None:
        outcome = Outcome.ERROR
        reason = f"truncated output: no 'Total img/sec' line after {len(parsed.iterations)} iterations"
    else:
        outcome, reason = Outcome.PASS, ""
    return [tool_result(PROBE, outcome, reason, params, at=at, node=node, measurements=measurements)]
