"""Parser for PyTorch's ``benchmarks/distributed/ddp/benchmark.py`` output.

The script prints, on rank 0, a preamble (``* PyTorch version: ...``), the
``nvidia-smi topo -m`` matrix, then per model a ``Benchmark: <model> with batch size N``
block whose rows read::

       8 GPUs --    1M/8G:  p50:  0.104s     307/s  p75:  0.104s     307/s  ...

(``"%8s:" % ("%4d GPUs -- %s" % (ranks, config))`` then ``"  p%02d:  %1.3fs  %6d/s"`` for
p50, p75, p90 and p95). The percentiles are over all ranks x measured iterations (5 warm-up
iterations dropped, 10 kept); ``ex/sec`` is ``batch_size / sec_per_iter`` truncated to an
integer, the throughput of one GPU (``derived_samples_per_second`` recomputes it exactly).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from healthd.errors import ParseError
from healthd.parsers.common import strip_tag, tool_result
from probes.result import Measurement, Outcome, ProbeResult

__all__ = [
    "DdpBenchmark",
    "DdpBenchmarkOutput",
    "DdpPercentile",
    "DdpResult",
    "parse_ddp_benchmark",
    "to_probe_results",
]

PROBE = "ddp_benchmark"


@dataclass(frozen=True, slots=True)
class DdpPercentile:
    percentile: int
    sec_per_iter: float
    samples_per_second: int

    def derived_samples_per_second(self, batch_size: int) -> float | None:
        """``batch_size / sec_per_iter`` (the unrounded ex/sec; printed value is its floor)."""
        if self.sec_per_iter <= 0:
            return None
        return batch_size / self.sec_per_iter


@dataclass(frozen=True, slots=True)
class DdpResult:
    """One configuration row: ``ranks`` GPUs, ``config`` as printed (``no ddp``, ``1M/8G``)."""

    ranks: int
    config: str
    percentiles: tuple[DdpPercentile, ...]
    line: int

    @property
    def machines(self) -> int | None:
        m = re.match(r"^(\d+)M/\d+G$", self.config)
        return int(m.group(1)) if m else None

    def percentile(self, p: int) -> DdpPercentile | None:
        return next((x for x in self.percentiles if x.percentile == p), None)


@dataclass(frozen=True, slots=True)
class DdpBenchmark:
    model: str
    batch_size: int
    results: tuple[DdpResult, ...]
    line: int


@dataclass(frozen=True, slots=True)
class DdpBenchmarkOutput:
    pytorch_version: str | None
    cuda_version: str | None
    backend: str | None
    bucket_size_mb: int | None
    benchmarks: tuple[DdpBenchmark, ...]
    errors: tuple[str, ...]
    truncated: bool


_PREAMBLE = re.compile(r"^\* (PyTorch version|CUDA version|Distributed backend|Maximum bucket size): (.*)$")
_BENCHMARK = re.compile(r"^Benchmark: (?P<model>\S+) with batch size (?P<batch>\d{1,9})\s*$")
_ROW = re.compile(r"^\s*(?P<ranks>\d{1,7}) GPUs -- \s*(?P<config>[^:]{1,40}?):(?P<rest>\s+p\d\d:.*)$")
_CELL = re.compile(r"p(?P<p>\d\d):\s+(?P<sec>\d{1,9}(?:\.\d{1,9})?)s\s+(?P<ex>\d{1,12})/s")
_TOPO_DIFFERS = re.compile(r'Output of "nvidia-smi topo -m" differs between machines')


def parse_ddp_benchmark(text: str) -> DdpBenchmarkOutput:
    """Parse the benchmark's stdout. Raises ``ParseError`` when no benchmark block and no
    preamble is found, or a row cannot be read (with its line number)."""
    if not isinstance(text, str):
        raise ParseError(f"ddp benchmark: expected text (str), got {type(text).__name__}")
    preamble: dict[str, str] = {}
    benchmarks: list[DdpBenchmark] = []
    errors: list[str] = []
    model: str | None = None
    batch = 0
    model_line = 0
    rows: list[DdpResult] = []
    saw_suite = False

    def close() -> None:
        if model is not None:
            benchmarks.append(DdpBenchmark(model, batch, tuple(rows), model_line))

    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = strip_tag(raw).rstrip()
        if not line.strip():
            continue
        if line.strip() == "PyTorch distributed benchmark suite":
            saw_suite = True
            continue
        m = _PREAMBLE.match(line.strip())
        if m:
            preamble[m.group(1)] = m.group(2).strip()
            continue
        if _TOPO_DIFFERS.search(line):
            errors.append(line.strip())
            continue
        m = _BENCHMARK.match(line.strip())
        if m:
            close()
            model = m.group("model")
            batch = int(m.group("batch"))
            model_line = lineno
            rows = []
            continue
        m = _ROW.match(line)
        if m:
            if model is None:
                raise ParseError(
                    f"ddp benchmark: line {lineno}: result row before any 'Benchmark: <model> with batch size N' line"
                )
            cells = [
                DdpPercentile(int(c.group("p")), float(c.group("sec")), int(c.group("ex")))
                for c in _CELL.finditer(m.group("rest"))
            ]
            if not cells:
                raise ParseError(
                    f"ddp benchmark: line {lineno}: expected 'pNN:  S.SSSs  N/s' cells after the configuration"
                )
            rows.append(DdpResult(int(m.group("ranks")), " ".join(m.group("config").split()), tuple(cells), lineno))
    close()
    if not benchmarks and not saw_suite and not preamble:
        raise ParseError(
            "ddp benchmark: no output found: expected the 'PyTorch distributed benchmark suite' banner "
            "or a 'Benchmark: <model> with batch size N' block"
        )
    truncated = not benchmarks or any(not b.results for b in benchmarks)
    bucket = preamble.get("Maximum bucket size")
    bucket_mb = None
    if bucket:
        bm = re.match(r"^(\d{1,9})\s*MB$", bucket)
        bucket_mb = int(bm.group(1)) if bm else None
    return DdpBenchmarkOutput(
        pytorch_version=preamble.get("PyTorch version"),
        cuda_version=preamble.get("CUDA version"),
        backend=preamble.get("Distributed backend"),
        bucket_size_mb=bucket_mb,
        benchmarks=tuple(benchmarks),
        errors=tuple(errors),
        truncated=truncated,
    )


def _quantile_label(p: int) -> str:
    return f"{p / 100:g}"


def to_probe_results(
    parsed: DdpBenchmarkOutput, *, node: str | None = None, at: float | None = None
) -> list[ProbeResult]:
    """One ``ProbeResult`` (probe ``ddp_benchmark``) for the whole output.

    Per model, configuration and percentile: ``step_seconds`` and
    ``throughput_samples_per_second`` (per GPU, as the script prints it), labels
    ``quantile`` (``0.5``, ``0.75``...) and ``scope`` = ``<model>:<config>`` (e.g.
    ``resnet50:2M/8G``); ``nodes`` = the machine count for multi-machine rows.
    """
    measurements: list[Measurement] = []
    for bench in parsed.benchmarks:
        for result in bench.results:
            labels_base = {"scope": f"{bench.model}:{result.config}"}
            machines = result.machines
            if machines is not None:
                labels_base["nodes"] = str(machines)
            for cell in result.percentiles:
                labels = {**labels_base, "quantile": _quantile_label(cell.percentile)}
                measurements.append(Measurement(name="step_seconds", value=cell.sec_per_iter, labels=labels, node=node))
                measurements.append(
                    Measurement(
                        name="throughput_samples_per_second",
                        value=float(cell.samples_per_second),
                        labels=dict(labels),
                        node=node,
                    )
                )
    if parsed.errors:
        outcome, reason = Outcome.ERROR, parsed.errors[0]
    elif not measurements:
        outcome, reason = Outcome.ERROR, "no benchmark results in the output"
    elif parsed.truncated:
        outcome, reason = Outcome.PASS, "truncated output: a benchmark block has no rows"
    else:
        outcome, reason = Outcome.PASS, ""
    params: dict[str, Any] = {
        "tool": "ddp-benchmark",
        "pytorch_version": parsed.pytorch_version,
        "cuda_version": parsed.cuda_version,
        "backend": parsed.backend,
        "bucket_size_mb": parsed.bucket_size_mb,
        "models": [b.model for b in parsed.benchmarks],
        "batch_sizes": [b.batch_size for b in parsed.benchmarks],
        "truncated": parsed.truncated,
    }
    return [tool_result(PROBE, outcome, reason, params, at=at, node=node, measurements=measurements)]
