"""Parsers for PARAM (facebookresearch/param) benchmark output.

**Comms** (``train/comms/pt/comms.py``): rank 0 prints a preamble (``PARAM COMM
environment: {...}``, ``backend: ... args.b: ...``), a header line starting with
``COMMS-RES`` and one row per size::

    \\tCOMMS-RES-all_reduce-float32   1048576   262144   41.2   43.0   45.1   40.9   46.0   25.450   47.719

Columns are read by the header's names, which changed over the years (``size (B)`` /
``total-size (B)``, ``num-elements`` / ``nElementsPerRank``, ``Latency(us):p50`` /
``Time(us):p50``, ``algBW``/``AlgBW``...). Without a header, the 9-value (2021+), 10-value
(with ``TotalLatency``) and 7-value (2020, no Min/Max) rows are recognised by count.
Definitions (``comms_utils.getAlgBW``, ``getBusBW``): the p50 (over ranks) time sets
``algBW = memSize / (p50_us * 1e3)`` in GB/s; ``busBW = algBW * factor``, factor
``2(n-1)/n`` for all_reduce, ``(n-1)/n`` for all_to_all*, all_gather*, reduce_scatter*,
gather and scatter, ``1`` for reduce, broadcast, incast and multicast.

**Compute** (``train/compute/pt/driver.py``): the GEMM table (``M, N, K, Time(s),
Rate(GF/s)`` or ``Rate(TF/s)``), the EmbeddingBag table (``Features, embdim, nnz, batch,
Time(s)/step, Data(MB), BW(GB/s)``) and the MLP/linear table (``#Layer, Input, Hidden,
Output, Batch, Time(s)/step, QPS, Rate(GF/s)``). A GEMM does ``2*M*N*K`` floating-point
operations; older releases printed the total time of all steps in ``Time(s)``, newer ones
the time of one step, which ``GemmRow.time_is_total`` tells apart from the printed rate.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Literal

from healthd.errors import ParseError
from healthd.parsers.common import MAX_LINE_CHARS, BusClass, bus_factor_of, strip_tag, tool_result
from probes.result import Measurement, Outcome, ProbeResult

__all__ = [
    "CommsOutput",
    "CommsRow",
    "ComputeOutput",
    "EmbRow",
    "GemmRow",
    "LinearRow",
    "comms_bus_factor",
    "comms_to_probe_results",
    "compute_to_probe_results",
    "parse_param_comms",
    "parse_param_compute",
]

_NUMBER = re.compile(r"[-+]?(?:\d{1,30}(?:\.\d{0,30})?|\.\d{1,30})(?:[eE][-+]?\d{1,4})?|nan|inf")


def _to_float(token: str) -> float | None:
    try:
        return float(token)
    except ValueError:
        return None


MAX_COUNT = 2**53
"""The largest shape or count column (M, N, K, features, batch...) a compute row may have: above it a
float no longer holds every whole number, and products such as ``2*M*N*K`` leave the float range."""


def _counts(values: list[float], lineno: int, table: str, columns: tuple[str, ...]) -> list[int]:
    """The leading ``columns`` of a row as whole numbers in ``[0, MAX_COUNT]``; ``ParseError`` otherwise."""
    out: list[int] = []
    for name, value in zip(columns, values, strict=False):
        if not (0 <= value <= MAX_COUNT and value == int(value)):
            raise ParseError(
                f"param compute: line {lineno}: {table} column {name} must be a whole number "
                f"from 0 to 2**53, got {value!r}"
            )
        out.append(int(value))
    return out


# =========================================================================== comms


@dataclass(frozen=True, slots=True)
class CommsRow:
    """One ``COMMS-RES`` row. Times in microseconds, bandwidths in GB/s (1e9 B/s)."""

    line: int
    collective: str | None
    dtype: str | None
    tag: str
    quantized: bool
    size_bytes: int
    elements: int | None
    p50_us: float | None
    p75_us: float | None
    p95_us: float | None
    min_us: float | None
    max_us: float | None
    algbw_gbps: float | None
    busbw_gbps: float | None
    total_p50_us: float | None
    extra: tuple[tuple[str, float], ...] = ()

    def derived_algbw_gbps(self) -> float | None:
        """``memSize / (p50 * 1e3)``: bytes per nanosecond, i.e. GB/s."""
        if self.p50_us is None or self.p50_us <= 0:
            return None
        return self.size_bytes / (self.p50_us * 1e3)

    def derived_busbw_gbps(self, world_size: int) -> float | None:
        algbw = self.derived_algbw_gbps()
        factor = comms_bus_factor(self.collective or "", world_size)
        if algbw is None or factor is None:
            return None
        return algbw * factor


@dataclass(frozen=True, slots=True)
class CommsOutput:
    rows: tuple[CommsRow, ...]
    world_size: int | None
    backend: str | None
    settings: tuple[tuple[str, str], ...]
    columns: tuple[str, ...]


def comms_bus_factor(collective: str, world_size: int) -> float | None:
    """PARAM's ``getBusBW`` factor."""
    bus_class: BusClass | None = None
    if collective == "all_reduce":
        bus_class = "all_reduce"
    elif collective.startswith(("all_to_all", "all_gather", "reduce_scatter")) or collective in ("gather", "scatter"):
        bus_class = "spread"
    elif collective in ("reduce", "broadcast", "incast", "multicast"):
        bus_class = "one"
    return bus_factor_of(bus_class, world_size)


_COLUMN_TOKENS = re.compile(
    r"P95 Latency\(us\): Quant|total-size \(B\)|size \(B\)|[^\s]+",
)
_COLUMN_MAP = {
    "size (B)": "size_bytes",
    "total-size (B)": "size_bytes",
    "num-elements": "elements",
    "nElementsPerRank": "elements",
    "nElementsPairPerRank": "pair_elements",
    "Latency(us):p50": "p50_us",
    "Time(us):p50": "p50_us",
    "Min": "min_us",
    "Max": "max_us",
    "AlgBW(GB/s)": "algbw_gbps",
    "algBW(GB/s)": "algbw_gbps",
    "BusBW(GB/s)": "busbw_gbps",
    "busBW(GB/s)": "busbw_gbps",
    "TotalLatency(us):p50": "total_p50_us",
    "TotalTime(us):p50": "total_p50_us",
    "CompLatency(us):p50": "compute_p50_us",
    "TFlops": "tflops",
    "pingLatency(us):p50": "ping_p50_us",
    "pingPongLatency(us):p50": "pingpong_p50_us",
    "avgUniBW(GB/s)": "avg_uni_bw_gbps",
    "avgBiBW(GB/s)": "avg_bi_bw_gbps",
    "totalUniBW(GB/s)": "total_uni_bw_gbps",
    "totalBiBW(GB/s)": "total_bi_bw_gbps",
    "P95 Latency(us): Quant": "quant_p95_us",
    "Comms": "comms_p95_us",
    "De-Quant": "dequant_p95_us",
    "Overall": "overall_p95_us",
}
_NINE_VALUES = ("size_bytes", "elements", "p50_us", "p75_us", "p95_us", "min_us", "max_us", "algbw_gbps", "busbw_gbps")
_BY_COUNT = {
    9: _NINE_VALUES,
    10: (*_NINE_VALUES, "total_p50_us"),
    7: ("size_bytes", "elements", "p50_us", "p75_us", "p95_us", "algbw_gbps", "busbw_gbps"),
}
_STANDARD = frozenset(_BY_COUNT[10])
_OPTIONAL_TRAILING = frozenset({"total_p50_us", "compute_p50_us", "tflops"})
"""Header columns a row may lack: 2024-11..2026-02 headers named ``TotalLatency(us):p50``
but the row format had no placeholder for it."""
_ROW_LABEL = re.compile(r"COMMS-RES(?P<label>-\S*)?")
_WORLD = re.compile(r"""['"]world_size['"]\s*:\s*(\d{1,9})""")
_SETTING = re.compile(r"(\S{1,64}):\s+(\S{1,200})")


def _header_columns(line: str) -> list[str]:
    body = line[line.index("COMMS-RES") + len("COMMS-RES") :]
    if body.startswith("-QUANT"):
        body = body[len("-QUANT") :]
    names: list[str] = []
    context = "p"
    for token in _COLUMN_TOKENS.findall(body):
        if token in ("p75", "p95"):
            base = {"p": "", "ping": "ping_", "pingpong": "pingpong_"}[context]
            names.append(f"{base}{token}_us")
            continue
        name = _COLUMN_MAP.get(token)
        if name is None:
            name = re.sub(r"[^a-z0-9]+", "_", token.lower()).strip("_") or "column"
        if name == "ping_p50_us":
            context = "ping"
        elif name == "pingpong_p50_us":
            context = "pingpong"
        names.append(name)
    return names


def parse_param_comms(text: str) -> CommsOutput:
    """Parse ``comms.py`` stdout. Raises ``ParseError`` when no ``COMMS-RES`` row is found or
    a row's values do not match its header (message names the line)."""
    if not isinstance(text, str):
        raise ParseError(f"param comms: expected text (str), got {type(text).__name__}")
    columns: list[str] = []
    rows: list[CommsRow] = []
    world: int | None = None
    backend: str | None = None
    settings: list[tuple[str, str]] = []
    for lineno, raw in enumerate(text.splitlines(), start=1):
        if len(raw) > MAX_LINE_CHARS:
            continue
        line = strip_tag(raw)
        if "PARAM COMM" in line and "environment" in line:
            wm = _WORLD.search(line)
            if wm:
                world = int(wm.group(1))
            continue
        if line.strip().startswith("backend:"):
            for key, value in _SETTING.findall(line):
                settings.append((key, value))
                if key == "backend":
                    backend = value
            continue
        if "COMMS-RES" not in line:
            continue
        after = line[line.index("COMMS-RES") :]
        if "size (B)" in after or "Latency" in after or "Time(us)" in after:
            columns = _header_columns(line)
            continue
        label = _ROW_LABEL.match(after)
        if label is None:
            continue
        rest = after[label.end() :]
        values = [_to_float(t) for t in rest.split()]
        if any(v is None for v in values):
            raise ParseError(
                f"param comms: line {lineno}: expected numbers after the COMMS-RES label, got {rest.strip()!r}"
            )
        numbers = [v for v in values if v is not None]
        names = tuple(columns) if columns else _BY_COUNT.get(len(numbers), ())
        while columns and len(names) > len(numbers) and names[-1] in _OPTIONAL_TRAILING:
            names = names[:-1]
        if not names or len(numbers) != len(names):
            raise ParseError(
                f"param comms: line {lineno}: {len(numbers)} values do not match "
                + (
                    f"the header's {len(columns)} columns"
                    if columns
                    else "a known COMMS-RES layout (7, 9 or 10 values)"
                )
            )
        rows.append(_comms_row(lineno, label.group("label") or "", dict(zip(names, numbers, strict=True))))
    if not rows:
        raise ParseError("param comms: no 'COMMS-RES' result rows found")
    return CommsOutput(tuple(rows), world, backend, tuple(settings), tuple(columns))


def _comms_row(lineno: int, label: str, values: dict[str, float]) -> CommsRow:
    parts = label.lstrip("-").split("-") if label else []
    quantized = bool(parts) and parts[0] == "QUANT"
    if quantized:
        parts = parts[1:]
    collective = parts[0] if parts and parts[0] else None
    dtype = parts[1] if len(parts) > 1 and parts[1] else None
    tag = "-".join(parts[2:])
    size = values.get("size_bytes")
    if size is None or not math.isfinite(size):
        raise ParseError(f"param comms: line {lineno}: row has no size column")
    elements = values.get("elements")

    def opt(name: str) -> float | None:
        value = values.get(name)
        return value if value is not None and math.isfinite(value) else None

    return CommsRow(
        line=lineno,
        collective=collective,
        dtype=dtype,
        tag=tag,
        quantized=quantized,
        size_bytes=int(size),
        elements=int(elements) if elements is not None and math.isfinite(elements) else None,
        p50_us=opt("p50_us"),
        p75_us=opt("p75_us"),
        p95_us=opt("p95_us"),
        min_us=opt("min_us"),
        max_us=opt("max_us"),
        algbw_gbps=opt("algbw_gbps"),
        busbw_gbps=opt("busbw_gbps"),
        total_p50_us=opt("total_p50_us"),
        extra=tuple((k, v) for k, v in values.items() if k not in _STANDARD),
    )


def comms_to_probe_results(
    parsed: CommsOutput,
    *,
    node: str | None = None,
    at: float | None = None,
    collective: str | None = None,
) -> list[ProbeResult]:
    """One ``ProbeResult`` (probe ``param_comms``): per row ``time_seconds`` (p50 over ranks;
    labels ``quantile`` 0.5/0.75/0.95 for the three printed percentiles),
    ``algbw_bytes_per_second`` and ``busbw_bytes_per_second`` (derived from p50 and the
    world size when not printed), labels ``collective``, ``size_bytes``, ``dtype``."""
    measurements: list[Measurement] = []
    seen: set[tuple[str, tuple[tuple[str, str], ...]]] = set()
    for row in parsed.rows:
        coll = row.collective or collective or "unknown"
        base = {"collective": coll, "size_bytes": str(row.size_bytes)}
        if row.dtype:
            base["dtype"] = row.dtype
        algbw = row.algbw_gbps if row.algbw_gbps is not None else row.derived_algbw_gbps()
        busbw = row.busbw_gbps
        if busbw is None and parsed.world_size is not None:
            busbw = row.derived_busbw_gbps(parsed.world_size)
        entries: list[tuple[str, float | None, dict[str, str]]] = [
            ("time_seconds", None if row.p50_us is None else row.p50_us * 1e-6, {**base, "quantile": "0.5"}),
            ("time_seconds", None if row.p75_us is None else row.p75_us * 1e-6, {**base, "quantile": "0.75"}),
            ("time_seconds", None if row.p95_us is None else row.p95_us * 1e-6, {**base, "quantile": "0.95"}),
            ("algbw_bytes_per_second", None if algbw is None else algbw * 1e9, dict(base)),
            ("busbw_bytes_per_second", None if busbw is None else busbw * 1e9, dict(base)),
        ]
        for name, value, labels in entries:
            if value is None or not math.isfinite(value):
                continue
            key = (name, tuple(sorted(labels.items())))
            if key in seen:
                continue
            seen.add(key)
            measurements.append(Measurement(name=name, value=value, labels=labels, node=node))
    params: dict[str, Any] = {
        "tool": "param-comms",
        "world_size": parsed.world_size,
        "backend": parsed.backend,
        "settings": dict(parsed.settings),
        "rows": len(parsed.rows),
    }
    return [tool_result("param_comms", Outcome.PASS, "", params, at=at, node=node, measurements=measurements)]


# =========================================================================== compute

Kernel = Literal["gemm", "emb", "linear"]


@dataclass(frozen=True, slots=True)
class GemmRow:
    line: int
    m: int
    n: int
    k: int
    time_s: float
    rate_flop_per_second: float
    time_is_total: bool | None

    @property
    def flop(self) -> int:
        return 2 * self.m * self.n * self.k

    def time_per_step_s(self, steps: int | None) -> float | None:
        if self.time_is_total:
            return self.time_s / steps if steps else None
        return self.time_s

    def derived_flop_per_second(self, steps: int | None) -> float | None:
        """``2*M*N*K / time_per_step``."""
        t = self.time_per_step_s(steps)
        if t is None or t <= 0:
            return None
        return self.flop / t


@dataclass(frozen=True, slots=True)
class EmbRow:
    line: int
    features: int
    embdim: int
    nnz: int
    batch: int
    time_per_step_s: float
    data_mb: float
    bw_gbps: float


@dataclass(frozen=True, slots=True)
class LinearRow:
    line: int
    layers: int
    input_size: int
    hidden_size: int
    output_size: int
    batch: int
    time_per_step_s: float
    qps: float
    rate_gflops: float

    def derived_qps(self) -> float | None:
        """``batch / time_per_step`` (samples per second)."""
        return self.batch / self.time_per_step_s if self.time_per_step_s > 0 else None


@dataclass(frozen=True, slots=True)
class ComputeOutput:
    kernel: Kernel | None
    device: str | None
    steps: int | None
    warmups: int | None
    dataset: str | None
    dtype: str | None
    gemm: tuple[GemmRow, ...]
    emb: tuple[EmbRow, ...]
    linear: tuple[LinearRow, ...]


_KERNELS: dict[str, Kernel] = {"gemm": "gemm", "emb": "emb", "linear": "linear"}
_MEASURING = re.compile(r"Measuring the performance of\s+(?P<kernel>\w{1,20})\s+on device\s*=\s*(?P<device>\w{1,20})")
_STEPS = re.compile(r"Steps\s*=\s*(?P<steps>\d{1,12})\s+warmups?\s*=\s*(?P<warmups>\d{1,12})")
_DATASET = re.compile(
    r"with (?:matrix|linear|emb) (?:dataset|data)\s+(?P<ds>\w{1,20})\s*[.,]?(?:\s*Data type:\s*(?P<dtype>\w{1,20}))?"
)
_GEMM_HEADER = re.compile(r"^\s*M\s+N\s+K\s+Time\(s\)\s+Rate\((?P<unit>[GT])F/s\)")
_EMB_HEADER = re.compile(r"^\s*Features\s+embdim\s+nnz\s+batch\s+Time\(s\)/step")
_LINEAR_HEADER = re.compile(r"^\s*#Layer\s+Input\s+Hidden\s+Output\s+Batch\s+Time\(s\)/step")
_TABLE_ROW = re.compile(r"^\s*\d{1,20},")


def parse_param_compute(text: str) -> ComputeOutput:
    """Parse ``driver.py``/``pytorch_gemm.py``/``pytorch_emb.py``/``pytorch_linear.py``
    output. Raises ``ParseError`` when no table is found, a table row does not have its
    table's column count, or a shape or count column is not a whole number up to ``MAX_COUNT``
    (message names the line)."""
    if not isinstance(text, str):
        raise ParseError(f"param compute: expected text (str), got {type(text).__name__}")
    kernel: Kernel | None = None
    device = dataset = dtype = None
    steps: int | None = None
    warmups: int | None = None
    table: Kernel | None = None
    unit_scale = 1e9
    gemm: list[GemmRow] = []
    emb: list[EmbRow] = []
    linear: list[LinearRow] = []
    for lineno, raw in enumerate(text.splitlines(), start=1):
        if len(raw) > MAX_LINE_CHARS:
            continue
        line = strip_tag(raw)
        if m := _MEASURING.search(line):
            kernel = _KERNELS.get(m.group("kernel"))
            device = m.group("device")
            continue
        if m := _STEPS.search(line):
            steps, warmups = int(m.group("steps")), int(m.group("warmups"))
            continue
        if m := _DATASET.search(line):
            dataset = m.group("ds")
            dtype = m.group("dtype") or dtype
            continue
        if m := _GEMM_HEADER.match(line):
            table = "gemm"
            unit_scale = 1e12 if m.group("unit") == "T" else 1e9
            continue
        if _EMB_HEADER.match(line):
            table = "emb"
            continue
        if _LINEAR_HEADER.match(line):
            table = "linear"
            continue
        if table is None or not _TABLE_ROW.match(line):
            continue
        numbers = [_to_float(t) for t in _NUMBER.findall(line)]
        values = [v for v in numbers if v is not None and math.isfinite(v)]
        expected = {"gemm": 5, "emb": 7, "linear": 8}[table]
        if len(values) != expected:
            raise ParseError(
                f"param compute: line {lineno}: expected {expected} values in a {table} row, got {len(values)}"
            )
        if table == "gemm":
            dims = _counts(values, lineno, table, ("M", "N", "K"))
            gemm.append(GemmRow(lineno, dims[0], dims[1], dims[2], values[3], values[4] * unit_scale, None))
        elif table == "emb":
            features, embdim, nnz, batch = _counts(values, lineno, table, ("Features", "embdim", "nnz", "batch"))
            emb.append(EmbRow(lineno, features, embdim, nnz, batch, values[4], values[5], values[6]))
        else:
            ints = _counts(values, lineno, table, ("#Layer", "Input", "Hidden", "Output", "Batch"))
            linear.append(
                LinearRow(lineno, ints[0], ints[1], ints[2], ints[3], ints[4], values[5], values[6], values[7])
            )
    if not (gemm or emb or linear):
        raise ParseError(
            "param compute: no result table found: expected a GEMM ('M N K Time(s) Rate(GF/s)'), "
            "EmbeddingBag ('Features embdim nnz batch ...') or linear ('#Layer Input Hidden ...') table"
        )
    gemm = [_classify_gemm_time(row, steps) for row in gemm]
    if kernel is None:
        kernel = "gemm" if gemm else "emb" if emb else "linear"
    return ComputeOutput(kernel, device, steps, warmups, dataset, dtype, tuple(gemm), tuple(emb), tuple(linear))


def _classify_gemm_time(row: GemmRow, steps: int | None) -> GemmRow:
    if row.time_s <= 0 or row.rate_flop_per_second <= 0:
        return row
    ratio = (row.flop / row.time_s) / row.rate_flop_per_second
    if abs(ratio - 1.0) < 0.02:
        return GemmRow(row.line, row.m, row.n, row.k, row.time_s, row.rate_flop_per_second, False)
    if steps and abs(ratio * steps - 1.0) < 0.02:
        return GemmRow(row.line, row.m, row.n, row.k, row.time_s, row.rate_flop_per_second, True)
    return row


def compute_to_probe_results(
    parsed: ComputeOutput, *, node: str | None = None, at: float | None = None
) -> list[ProbeResult]:
    """One ``ProbeResult`` (probe ``param_compute``). GEMM rows: ``flop_per_second`` and
    ``step_seconds``; linear rows: ``flop_per_second``, ``throughput_samples_per_second``
    and ``step_seconds``; EmbeddingBag rows: ``bandwidth_bytes_per_second`` and
    ``step_seconds``. Labels: ``dtype`` where printed and ``scope`` naming the shape
    (``gemm:MxNxK``, ``linear:LxIxHxOxB``, ``emb:FxDxNNZxB``)."""
    measurements: list[Measurement] = []
    base = {"dtype": parsed.dtype} if parsed.dtype else {}

    def add(name: str, value: float | None, scope: str) -> None:
        if value is None or not math.isfinite(value):
            return
        measurements.append(Measurement(name=name, value=value, labels={**base, "scope": scope}, node=node))

    for g in parsed.gemm:
        scope = f"gemm:{g.m}x{g.n}x{g.k}"
        add("flop_per_second", g.rate_flop_per_second, scope)
        add("step_seconds", g.time_per_step_s(parsed.steps), scope)
    for lr in parsed.linear:
        scope = f"linear:{lr.layers}x{lr.input_size}x{lr.hidden_size}x{lr.output_size}x{lr.batch}"
        add("flop_per_second", lr.rate_gflops * 1e9, scope)
        add("throughput_samples_per_second", lr.qps, scope)
        add("step_seconds", lr.time_per_step_s, scope)
    for e in parsed.emb:
        scope = f"emb:{e.features}x{e.embdim}x{e.nnz}x{e.batch}"
        add("bandwidth_bytes_per_second", e.bw_gbps * 1e9, scope)
        add("step_seconds", e.time_per_step_s, scope)
    params: dict[str, Any] = {
        "tool": "param-compute",
        "kernel": parsed.kernel,
        "device": parsed.device,
        "steps": parsed.steps,
        "warmups": parsed.warmups,
        "dataset": parsed.dataset,
    }
    return [tool_result("param_compute", Outcome.PASS, "", params, at=at, node=node, measurements=measurements)]
