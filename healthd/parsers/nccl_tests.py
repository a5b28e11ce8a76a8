"""Parser for NVIDIA nccl-tests output (``all_reduce_perf``, ``all_gather_perf``...).

Pure: text in, a frozen ``NcclTestsOutput`` out. Every layout from the NCCL 1.x
``all_reduce_test`` table (time in ms, ``res`` column) through the 2.0-2.12 tables
(``error`` column holding the maximum delta), the unified 2.13+ table (``redop`` and
``root`` on every row, ``#wrong`` holding a count of wrong elements) and the 2.17.4+
``getFloatStr`` formats, plus the ``-J`` JSON report, is read. The column header line
drives the mapping, so optional columns (``cputime``, the ``-I`` per-iteration columns,
the timestamp column) are read by name.

Lines may carry launcher prefixes (``0: `` from ``srun -l``, ``[1,0]<stdout>:`` from
Open MPI ``--tag-output``); NCCL INFO/WARN lines, MPI help text and shell lines may sit
anywhere. Several runs in one text (a wrapper running several binaries) give several
``NcclTestRun``. A run that stops before its footer without a failure line is marked
``truncated``; a row cut in half is kept in ``cut_rows``.

Bandwidth definitions (nccl-tests ``*GetBw``, ``doc/PERFORMANCE.md``): GB/s is 1e9 bytes
per second; ``algbw = S / t`` with ``S`` the ``size`` column; ``busbw = algbw * factor``
with factor ``2(n-1)/n`` for all_reduce, ``(n-1)/n`` for all_gather, reduce_scatter,
alltoall, gather and scatter, ``1`` for broadcast, reduce and sendrecv. Releases before
2.13 printed for all_gather/reduce_scatter an algbw already multiplied by ``(n-1)/n``;
their busbw follows the same formula, so ``derived_busbw_gbps`` holds for every layout.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal, NamedTuple

from healthd.errors import ParseError
from healthd.parsers.common import MAX_LINE_CHARS, BusClass, bus_factor_of, check_json_values, timestamp, tool_result
from probes.result import Check, Measurement, Outcome, ProbeResult

__all__ = [
    "KNOWN_COLLECTIVES",
    "NcclDevice",
    "NcclFailure",
    "NcclHeader",
    "NcclRow",
    "NcclTestRun",
    "NcclTestsOutput",
    "NcclTiming",
    "bus_factor",
    "derived_algbw_gbps",
    "derived_busbw_gbps",
    "dtype_size",
    "iter_timings",
    "parse_nccl_tests",
    "strip_launcher_prefix",
    "to_probe_results",
]

Placement = Literal["out_of_place", "in_place"]
Layout = Literal["nccl1", "v1", "v2", "v2.13", "json"]
FailureKind = Literal["NCCL", "CUDA", "timeout"]

KNOWN_COLLECTIVES = frozenset(
    {
        "all_reduce",
        "all_gather",
        "reduce_scatter",
        "alltoall",
        "alltoallv",
        "broadcast",
        "reduce",
        "sendrecv",
        "gather",
        "scatter",
        "hypercube",
    }
)
"""Collectives whose byte counts and bus factors are known (one binary ``<name>_perf`` each)."""

_BUS_CLASSES: dict[str, BusClass] = {
    "all_reduce": "all_reduce",
    **dict.fromkeys(("all_gather", "reduce_scatter", "alltoall", "alltoallv", "gather", "scatter"), "spread"),
    **dict.fromkeys(("broadcast", "reduce", "sendrecv", "hypercube"), "one"),
}

_DTYPE_SIZES = {
    "int8": 1,
    "uint8": 1,
    "char": 1,
    "f8e4m3": 1,
    "f8e5m2": 1,
    "fp8_e4m3": 1,
    "fp8_e5m2": 1,
    "half": 2,
    "float16": 2,
    "bfloat16": 2,
    "int32": 4,
    "uint32": 4,
    "int": 4,
    "float": 4,
    "float32": 4,
    "int64": 8,
    "uint64": 8,
    "double": 8,
    "float64": 8,
}


# --------------------------------------------------------------------------- result types


@dataclass(frozen=True, slots=True)
class NcclHeader:
    """The parameter line (``# nThread 1 nGpus 8 minBytes ...``) and the version line."""

    n_threads: int
    n_gpus: int
    min_bytes: int
    max_bytes: int
    step: int
    step_kind: Literal["factor", "bytes"]
    warmup_iters: int
    iters: int
    validation: int
    agg_iters: int | None = None
    graph: int | None = None
    unalign: int | None = None
    line: int = 0


@dataclass(frozen=True, slots=True)
class NcclDevice:
    """One ``#  Rank ... on host device N [bus] name`` line (or NCCL 1's ``Device i -> j``)."""

    rank: int
    device: int
    bus_id: str
    name: str
    host: str | None = None
    pid: int | None = None
    group: int | None = None


@dataclass(frozen=True, slots=True)
class NcclTiming:
    """One placement (out-of-place or in-place) of one row.

    ``wrong`` is the 2.13+ ``#wrong`` element count (``None`` when printed ``N/A``:
    validation off, or not done for that placement); ``max_error`` is the pre-2.13
    ``error``/``res`` maximum delta. ``time_us`` is always in microseconds (the NCCL 1 and
    v1 tables printed milliseconds and are converted). ``extra`` holds further named
    columns (the ``-I`` per-iteration statistics).
    """

    time_us: float | None
    algbw_gbps: float | None
    busbw_gbps: float | None
    wrong: int | None = None
    max_error: float | None = None
    extra: tuple[tuple[str, float | None], ...] = ()


@dataclass(frozen=True, slots=True)
class NcclRow:
    line: int
    size_bytes: int
    count: int
    dtype: str
    redop: str | None
    root: int | None
    out_of_place: NcclTiming | None
    in_place: NcclTiming | None
    timestamp: str | None = None

    def timing(self, placement: Placement) -> NcclTiming | None:
        return self.out_of_place if placement == "out_of_place" else self.in_place


@dataclass(frozen=True, slots=True)
class NcclFailure:
    """A ``<host>: Test NCCL|CUDA failure <file>:<line> '<message>'`` or timeout line."""

    kind: FailureKind
    host: str
    location: str
    message: str
    line: int


@dataclass(frozen=True, slots=True)
class NcclTestRun:
    """One test binary's output: header, device list, table, footer, failures."""

    collective: str | None
    program: str | None
    version: str | None
    nccl_headers: int | None
    nccl_library: int | None
    nccl_version: str | None
    header: NcclHeader | None
    devices: tuple[NcclDevice, ...]
    layout: Layout | None
    rows: tuple[NcclRow, ...]
    out_of_bounds: int | None
    out_of_bounds_ok: bool | None
    avg_busbw_gbps: float | None
    avg_busbw_check: Literal["OK", "FAILED"] | None
    concluded: bool
    failures: tuple[NcclFailure, ...]
    trace: tuple[str, ...]
    warnings: tuple[str, ...]
    errors: tuple[str, ...]
    cut_rows: tuple[int, ...]
    truncated: bool
    first_line: int
    last_line: int
    columns: tuple[str, ...] = ()

    @property
    def hosts(self) -> tuple[str, ...]:
        """Distinct hosts named by the device list (in rank order), else by failure lines."""
        seen: dict[str, None] = {}
        for dev in self.devices:
            if dev.host:
                seen.setdefault(dev.host, None)
        if not seen:
            for failure in self.failures:
                seen.setdefault(failure.host, None)
        return tuple(seen)

    @property
    def nranks(self) -> int | None:
        """Total rank count (the device list's length); ``None`` without a device list, since
        the parameter line gives the ranks of one process only."""
        if self.devices:
            return len(self.devices)
        return None

    @property
    def tool_failed(self) -> bool:
        return bool(self.failures)

    @property
    def wrong_data(self) -> bool:
        """True when the output shows corrupted results: a ``#wrong`` count above zero or
        ``Out of bounds values : N FAILED`` with N > 0."""
        if self.out_of_bounds is not None and self.out_of_bounds > 0:
            return True
        for row in self.rows:
            for timing in (row.out_of_place, row.in_place):
                if timing is not None and timing.wrong is not None and timing.wrong > 0:
                    return True
        return False


@dataclass(frozen=True, slots=True)
class NcclTestsOutput:
    runs: tuple[NcclTestRun, ...]
    lines: int
    ignored_lines: int


# --------------------------------------------------------------------------- definitions


def dtype_size(dtype: str) -> int | None:
    """Bytes per element of an nccl-tests type name (``float``, ``bfloat16``...)."""
    return _DTYPE_SIZES.get(dtype.lower())


def bus_factor(collective: str, nranks: int) -> float | None:
    """nccl-tests' bus bandwidth factor for ``collective`` over ``nranks`` ranks."""
    return bus_factor_of(_BUS_CLASSES.get(collective), nranks)


def derived_algbw_gbps(size_bytes: int, time_us: float) -> float | None:
    """``size / time`` in GB/s (1e9 bytes/s), the 2.13+ algbw of every standard test."""
    if time_us <= 0 or not math.isfinite(time_us):
        return None
    return size_bytes / 1.0e9 / (time_us * 1.0e-6)


def derived_busbw_gbps(collective: str, size_bytes: int, time_us: float, nranks: int) -> float | None:
    """Bus bandwidth from the size column, the time and the rank count (every layout)."""
    factor = bus_factor(collective, nranks)
    algbw = derived_algbw_gbps(size_bytes, time_us)
    if factor is None or algbw is None:
        return None
    return algbw * factor


# --------------------------------------------------------------------------- line helpers

_PREFIX_SRUN = re.compile(r"^\s{0,8}\d{1,7}: ?")
_PREFIX_SRUN_EMPTY = re.compile(r"^\s{0,8}\d{1,7}:$")
_PREFIX_OMPI = re.compile(r"^\[\d{1,7},\d{1,7}\]<(?:stdout|stderr|stddiag)>: ?")
_PREFIX_BRACKET = re.compile(r"^\[\d{1,7}\] (?=#|\s*\d)")


def strip_launcher_prefix(line: str) -> str:
    """Remove an ``srun -l`` (``0: ``), Open MPI ``--tag-output`` (``[1,0]<stdout>:``) or
    Intel MPI (``[0] ``) prefix."""
    m = _PREFIX_OMPI.match(line)
    if m:
        return line[m.end() :]
    if _PREFIX_SRUN_EMPTY.match(line):
        return ""
    m = _PREFIX_SRUN.match(line)
    if m:
        return line[m.end() :]
    m = _PREFIX_BRACKET.match(line)
    if m:
        return line[m.end() :]
    return line


def _int(token: str) -> int | None:
    if not token or len(token) > 30:
        return None
    try:
        return int(token)
    except ValueError:
        return None


def _float(token: str) -> float | None:
    if not token or len(token) > 40:
        return None
    try:
        value = float(token)
    except ValueError:
        return None
    return value


def _finite(value: float | None) -> float | None:
    if value is None or not math.isfinite(value):
        return None
    return value


# --------------------------------------------------------------------------- regexes

_VERSION = re.compile(
    r"^#\s*(?:nccl|rccl)-tests version\s+(?P<version>\S+)(?:\s+\((?P<git>[^)]*)\))?"
    r"(?:\s+(?:nccl|rccl)-headers=(?P<headers>\d{1,9}))?(?:\s+(?:nccl|rccl)-library=(?P<library>\d{1,9}))?"
)
_STARTING = re.compile(r"^#\s*Collective test starting:\s*(?P<program>\S+)")
_CONCLUDED = re.compile(r"^#\s*Collective test concluded:\s*(?P<program>\S+)")
_PARAMS = re.compile(
    r"^#?\s*nThread (?P<nthread>\d{1,9}) nGpus (?P<ngpus>\d{1,9}) minBytes (?P<min>\d{1,20}) "
    r"maxBytes (?P<max>\d{1,20}) step: (?P<step>\d{1,20})\((?P<kind>factor|bytes)\) "
    r"warmup iters: (?P<warmup>\d{1,9}) iters: (?P<iters>\d{1,9})"
    r"(?: agg iters: (?P<agg>\d{1,9}))? validation: (?P<validation>\d{1,9})"
    r"(?: graph: (?P<graph>\d{1,9}))?(?: unalign: (?P<unalign>\d{1,9}))?"
)
_DEVICE = re.compile(
    r"^#\s+(?:Rank\s+(?P<rank>\d{1,7})(?:\s+Group\s+(?P<group>\d{1,7}))?(?:\s+Pid\s+(?P<pid>\d{1,10}))?"
    r"\s+on\s+(?P<host>\S+)\s+device\s+(?P<dev>\d{1,7})"
    r"|Device\s+(?P<rank1>\d{1,7})\s+->\s+(?P<dev1>\d{1,7}))"
    r"\s+\[(?P<bus>[^\]]{0,64})\](?P<name>.*)$"
)
_NCCL_VERSION = re.compile(r"\bNCCL version (?P<v>\d{1,4}\.\d{1,4}\.\d{1,4}[^\s]*)")
_OOB = re.compile(r"^#?\s*Out of bounds values\s*:\s*(?P<n>\d{1,12})\s+(?P<ok>OK|FAILED)\b")
_AVG = re.compile(r"^#?\s*Avg bus bandwidth\s*:\s*(?P<bw>\S+)(?:\s+(?P<check>OK|FAILED))?")
_ERROR_LINE = re.compile(r"^#\s*error:\s*(?P<msg>.*)$")
_FAILURE = re.compile(
    r"(?P<host>[^\s:]{1,255}): Test (?P<kind>NCCL|CUDA) failure (?P<loc>\S+?:\d{1,9})\s*'?(?P<msg>[^']*)'?"
)
_TIMEOUT = re.compile(r"(?P<host>[^\s:]{1,255}): Test timeout \((?P<secs>\d{1,9})s\) (?P<loc>\S+?:\d{1,9})")
_TRACE = re.compile(r"^\s*\.\. \S+(?: pid \d{1,10})?: Test failure \S+")
_WARN = re.compile(r"\bNCCL WARN\b\s*(?P<msg>.*)$")
_PROGRAM_HINT = re.compile(r"(?:^|[\s/])(?P<prog>[a-z][a-z0-9_]{1,40}_perf(?:_mpi)?)(?:\s|$)")
_ROW_START = re.compile(r"^\s*\d{1,20}\s+\d{1,20}\s+\S")
_TIMESTAMP_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}$")
_TIMESTAMP_TIME = re.compile(r"^\d{2}:\d{2}:\d{2}$")

_TIME_NAMES = frozenset({"time", "cputime"})
_WRONG_NAMES = frozenset({"#wrong", "error", "res"})


def _collective_of_program(program: str) -> str | None:
    name = program.rsplit("/", 1)[-1]
    for suffix in ("_mpi", "_perf", "_test"):
        if name.endswith(suffix):
            name = name[: -len(suffix)]
    return name if name in KNOWN_COLLECTIVES else None


# --------------------------------------------------------------------------- table layout


@dataclass(frozen=True, slots=True)
class _Layout:
    prefix: tuple[str, ...]
    groups: tuple[tuple[str, ...], ...]
    timestamp: bool
    time_scale: float
    kind: Layout

    @property
    def tail_len(self) -> int:
        return sum(len(g) for g in self.groups)


def _layout_from_names(tokens: Sequence[str], unit_ms: bool | None) -> _Layout | None:
    names = [t for t in tokens if t != "#"]
    if names and names[0].startswith("#"):
        names[0] = names[0][1:]
    starts = [i for i, t in enumerate(names) if t in _TIME_NAMES]
    if not starts or starts[0] < 3:
        return None
    prefix = tuple(names[: starts[0]])
    timestamp = bool(names) and names[-1] == "timestamp"
    body = names[: len(names) - 1] if timestamp else names
    groups: list[tuple[str, ...]] = []
    for k, start in enumerate(starts):
        end = starts[k + 1] if k + 1 < len(starts) else len(body)
        group = tuple(body[start:end])
        if len(group) < 3 or group[1] != "algbw" or group[2] != "busbw":
            return None
        groups.append(group)
    if len(groups) > 2:
        return None
    kind: Layout
    if prefix[0] == "bytes":
        kind = "v1"
    elif any(g[3:4] == ("#wrong",) for g in groups):
        kind = "v2.13"
    else:
        kind = "v2"
    ms = unit_ms if unit_ms is not None else kind == "v1"
    return _Layout(prefix, tuple(groups), timestamp, 1000.0 if ms else 1.0, kind)


def _default_layout(tokens: Sequence[str]) -> _Layout | None:
    """The unified 2.13+ layout, for a table whose column header line was not captured."""
    if len(tokens) == 13 and _int(tokens[4]) is not None and _int(tokens[3]) is None:
        group = ("time", "algbw", "busbw", "#wrong")
        return _Layout(("size", "count", "type", "redop", "root"), (group, group), False, 1.0, "v2.13")
    return None


def _parse_timing(names: tuple[str, ...], values: Sequence[str], scale: float) -> NcclTiming | None:
    time_us = _float(values[0])
    algbw = _float(values[1])
    busbw = _float(values[2])
    if time_us is None or algbw is None or busbw is None:
        return None
    wrong: int | None = None
    max_error: float | None = None
    extra: list[tuple[str, float | None]] = []
    for name, value in zip(names[3:], values[3:], strict=True):
        number = None if value == "N/A" else _float(value)
        if value != "N/A" and number is None:
            return None
        if name == "#wrong":
            if number is not None and math.isfinite(number):
                wrong = int(number)
        elif name in ("error", "res"):
            max_error = number
        else:
            extra.append((name, number))
    return NcclTiming(time_us * scale, algbw, busbw, wrong, max_error, tuple(extra))


def _parse_row(tokens: list[str], layout: _Layout, lineno: int) -> NcclRow | None:
    stamp: str | None = None
    if (
        layout.timestamp
        and len(tokens) >= 2
        and _TIMESTAMP_DATE.match(tokens[-2])
        and _TIMESTAMP_TIME.match(tokens[-1])
    ):
        stamp = f"{tokens[-2]} {tokens[-1]}"
        tokens = tokens[:-2]
    tail = layout.tail_len
    n_prefix = len(tokens) - tail
    if n_prefix < 3 or n_prefix > len(layout.prefix):
        return None
    size = _int(tokens[0])
    count = _int(tokens[1])
    dtype = tokens[2]
    if size is None or count is None or size < 0 or count < 0 or _float(dtype) is not None:
        return None
    redop: str | None = None
    root: int | None = None
    for token in tokens[3:n_prefix]:
        as_int = _int(token)
        if as_int is not None:
            if root is not None:
                return None
            root = as_int
        else:
            if redop is not None or root is not None:
                return None
            redop = token
    timings: list[NcclTiming | None] = []
    pos = n_prefix
    for group in layout.groups:
        values = tokens[pos : pos + len(group)]
        timing = _parse_timing(group, values, layout.time_scale)
        if timing is None:
            return None
        timings.append(timing)
        pos += len(group)
    out_of_place = timings[0] if timings else None
    in_place = timings[1] if len(timings) > 1 else None
    return NcclRow(lineno, size, count, dtype, redop, root, out_of_place, in_place, stamp)


# --------------------------------------------------------------------------- run builder


@dataclass
class _RunBuilder:
    first_line: int
    program: str | None = None
    version: str | None = None
    nccl_headers: int | None = None
    nccl_library: int | None = None
    nccl_version: str | None = None
    header: NcclHeader | None = None
    devices: list[NcclDevice] = field(default_factory=list)
    layout: _Layout | None = None
    columns: tuple[str, ...] = ()
    units_ms: bool | None = None
    rows: list[NcclRow] = field(default_factory=list)
    out_of_bounds: int | None = None
    out_of_bounds_ok: bool | None = None
    avg_busbw: float | None = None
    avg_check: Literal["OK", "FAILED"] | None = None
    concluded: bool = False
    failures: list[NcclFailure] = field(default_factory=list)
    trace: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    cut_rows: list[int] = field(default_factory=list)
    last_line: int = 0
    nccl1: bool = False

    @property
    def has_content(self) -> bool:
        return bool(
            self.header
            or self.devices
            or self.layout
            or self.rows
            or self.failures
            or self.out_of_bounds is not None
            or self.avg_busbw is not None
            or self.version
        )

    @property
    def has_table(self) -> bool:
        return bool(self.layout or self.rows or self.out_of_bounds is not None or self.concluded)

    @property
    def footer_seen(self) -> bool:
        return self.out_of_bounds is not None or self.avg_busbw is not None or self.concluded

    def build(self, collective_hint: str | None) -> NcclTestRun:
        layout_kind: Layout | None = self.layout.kind if self.layout else None
        if self.nccl1 and layout_kind == "v1":
            layout_kind = "nccl1"
        collective = _collective_of_program(self.program) if self.program else None
        if collective is None:
            collective = collective_hint
        if collective is None:
            collective = _infer_collective(self.rows, self.layout, len(self.devices) or None)
        expect_footer = not self.nccl1
        truncated = (
            expect_footer and not self.footer_seen and not self.failures and (self.has_table or bool(self.header))
        ) or (bool(self.cut_rows) and not self.failures and not self.footer_seen)
        return NcclTestRun(
            collective=collective,
            program=self.program,
            version=self.version,
            nccl_headers=self.nccl_headers,
            nccl_library=self.nccl_library,
            nccl_version=self.nccl_version,
            header=self.header,
            devices=tuple(self.devices),
            layout=layout_kind,
            rows=tuple(self.rows),
            out_of_bounds=self.out_of_bounds,
            out_of_bounds_ok=self.out_of_bounds_ok,
            avg_busbw_gbps=self.avg_busbw,
            avg_busbw_check=self.avg_check,
            concluded=self.concluded,
            failures=tuple(self.failures),
            trace=tuple(self.trace),
            warnings=tuple(self.warnings),
            errors=tuple(self.errors),
            cut_rows=tuple(self.cut_rows),
            truncated=truncated,
            first_line=self.first_line,
            last_line=self.last_line,
            columns=self.columns,
        )


def _infer_collective(rows: Sequence[NcclRow], layout: _Layout | None, nranks: int | None) -> str | None:
    """Guess the collective from the redop/root columns and the size/count relation."""
    if not rows or layout is None:
        return None
    row = next((r for r in rows if r.count > 0 and r.size_bytes > 0), None)
    if row is None:
        return None
    esize = dtype_size(row.dtype)
    if esize is None:
        return None
    per_rank = row.count * esize == row.size_bytes
    total = nranks is not None and nranks > 1 and row.count * esize * nranks == row.size_bytes
    prefix = set(layout.prefix)
    reducing = row.redop is not None and row.redop not in ("none", "")
    has_root = row.root is not None and row.root >= 0
    if layout.kind in ("v1", "nccl1"):
        return None
    multi = nranks is not None and nranks > 1
    if layout.kind == "v2.13":
        if reducing and has_root:
            return "reduce"
        if reducing:
            if not multi:
                return None
            return "all_reduce" if per_rank else "reduce_scatter" if total else None
        if has_root:
            return "broadcast" if per_rank and multi else None
        return "sendrecv" if per_rank and multi else None
    if "redop" in prefix and "root" in prefix:
        return "reduce"
    if "root" in prefix:
        return "broadcast" if per_rank and multi else None
    if "redop" in prefix:
        if row.redop is None:
            return "alltoall"
        if not multi:
            return None
        return "all_reduce" if per_rank else "reduce_scatter" if total else None
    if not multi:
        return None
    return "sendrecv" if per_rank else "all_gather" if total else None


# --------------------------------------------------------------------------- text parser


def parse_nccl_tests(text: str, *, collective: str | None = None) -> NcclTestsOutput:
    """Parse nccl-tests stdout (or a ``-J`` JSON report) into runs.

    ``collective`` names the test when the output does not (no ``Collective test
    starting`` line, no binary name in a command line); without it the collective is
    inferred from the ``redop``/``root`` columns where that is unambiguous. A name outside
    ``KNOWN_COLLECTIVES`` is a ``ValueError`` (a caller's mistake, not unreadable output).

    Raises ``ParseError`` when the text holds no nccl-tests output at all, or holds a JSON
    document that is not an nccl-tests report.
    """
    if not isinstance(text, str):
        raise ParseError(f"nccl-tests: expected text (str), got {type(text).__name__}")
    if collective is not None and collective not in KNOWN_COLLECTIVES:
        raise ValueError(f"unknown collective {collective!r}; known: {', '.join(sorted(KNOWN_COLLECTIVES))}")
    if text.lstrip().startswith("{"):
        return _parse_json(text, collective)
    return _parse_text(text, collective)


class _Line(NamedTuple):
    text: str
    """The line without its launcher prefix."""
    stripped: str
    body: str
    """``stripped`` without a leading ``#``: the words of a column header line."""
    number: int


_Subject = Literal["text", "stripped", "body"]
_SUBJECT_INDEX: dict[_Subject, Literal[0, 1, 2]] = {"text": 0, "stripped": 1, "body": 2}


@dataclass
class _TextState:
    """What the text parser carries from line to line."""

    hint: str | None
    runs: list[NcclTestRun] = field(default_factory=list)
    current: _RunBuilder | None = None
    pending_program: str | None = None
    """A test binary named (on a command line) before its run's first line."""
    ignored: int = 0

    def finish(self) -> None:
        if self.current is not None and self.current.has_content:
            self.runs.append(self.current.build(self.hint))
        self.current = None

    def run_at(self, number: int, restart: Callable[[_RunBuilder], bool] | None = None) -> _RunBuilder:
        """The run being read; a new one from line ``number`` when there is none or when
        ``restart`` says the line begins the next run."""
        if self.current is None or (restart is not None and restart(self.current)):
            self.finish()
            self.current = _RunBuilder(first_line=number, program=self.pending_program)
            self.pending_program = None
        return self.current


_Handler = Callable[[_TextState, _Line, re.Match[str]], None]


def _add_failure(state: _TextState, line: _Line, m: re.Match[str], kind: FailureKind, message: str) -> None:
    run = state.run_at(line.number)
    head = line.text[: m.start()]
    if head.strip() and _ROW_START.match(head):
        run.cut_rows.append(line.number)
    run.failures.append(NcclFailure(kind, m.group("host"), m.group("loc"), message, line.number))


def _on_failure(state: _TextState, line: _Line, m: re.Match[str]) -> None:
    kind: FailureKind = "NCCL" if m.group("kind") == "NCCL" else "CUDA"
    _add_failure(state, line, m, kind, m.group("msg").strip())


def _on_timeout(state: _TextState, line: _Line, m: re.Match[str]) -> None:
    _add_failure(state, line, m, "timeout", f"timeout after {m.group('secs')}s")


def _on_trace(state: _TextState, line: _Line, m: re.Match[str]) -> None:
    state.run_at(line.number).trace.append(line.stripped)


def _on_warn(state: _TextState, line: _Line, m: re.Match[str]) -> None:
    run = state.run_at(line.number)
    run.warnings.append(m.group("msg").strip())
    version = _NCCL_VERSION.search(line.text)
    if version:
        run.nccl_version = version.group("v")


def _on_version(state: _TextState, line: _Line, m: re.Match[str]) -> None:
    run = state.run_at(line.number, lambda r: r.has_table or bool(r.version or r.header))
    run.version = m.group("version") + (f" ({m.group('git')})" if m.group("git") else "")
    run.nccl_headers = _int(m.group("headers") or "")
    run.nccl_library = _int(m.group("library") or "")


def _on_starting(state: _TextState, line: _Line, m: re.Match[str]) -> None:
    state.run_at(line.number, lambda r: r.has_table or bool(r.header)).program = m.group("program")


def _on_concluded(state: _TextState, line: _Line, m: re.Match[str]) -> None:
    run = state.current
    if run is not None:
        run.concluded = True
        if run.program is None:
            run.program = m.group("program")


def _on_params(state: _TextState, line: _Line, m: re.Match[str]) -> None:
    state.run_at(line.number, lambda r: r.has_table or bool(r.devices)).header = _header_from_match(m, line.number)


def _on_device(state: _TextState, line: _Line, m: re.Match[str]) -> None:
    run = state.run_at(line.number, lambda r: r.has_table)
    device = _device_from_match(m)
    if device is not None:
        if m.group("rank1") is not None:
            run.nccl1 = True
        run.devices.append(device)


def _on_out_of_bounds(state: _TextState, line: _Line, m: re.Match[str]) -> None:
    run = state.run_at(line.number)
    run.out_of_bounds = _int(m.group("n"))
    run.out_of_bounds_ok = m.group("ok") == "OK"


def _on_avg(state: _TextState, line: _Line, m: re.Match[str]) -> None:
    run = state.run_at(line.number)
    run.avg_busbw = _finite(_float(m.group("bw")))
    check = m.group("check")
    run.avg_check = "OK" if check == "OK" else "FAILED" if check == "FAILED" else None


def _on_error(state: _TextState, line: _Line, m: re.Match[str]) -> None:
    if state.current is not None:
        state.current.errors.append(m.group("msg").strip())


def _on_nccl_version(state: _TextState, line: _Line, m: re.Match[str]) -> None:
    state.run_at(line.number).nccl_version = m.group("v")


def _table_restarts(run: _RunBuilder) -> bool:
    return bool(run.rows) and run.footer_seen


def _on_placement_header(state: _TextState, line: _Line, m: re.Match[str]) -> None:
    state.run_at(line.number, _table_restarts)


def _on_column_header(state: _TextState, line: _Line, m: re.Match[str]) -> None:
    run = state.run_at(line.number, _table_restarts)
    tokens = line.body.split()
    layout = _layout_from_names(tokens, run.units_ms)
    if layout is not None:
        run.layout = layout
        run.columns = tuple(tokens)


def _on_unit_header(state: _TextState, line: _Line, m: re.Match[str]) -> None:
    run = state.current
    if run is not None:
        ms = "(ms)" in line.body.split()
        run.units_ms = ms
        if run.layout is not None:
            run.layout = replace(run.layout, time_scale=1000.0 if ms else 1.0)


def _on_row(state: _TextState, line: _Line, m: re.Match[str]) -> None:
    run = state.current
    tokens = line.text.split()
    if run is not None and run.layout is None:
        run.layout = _default_layout(tokens)
    if run is None or run.layout is None:
        state.ignored += 1
        return
    row = _parse_row(tokens, run.layout, line.number)
    if row is not None:
        run.rows.append(row)
    else:
        run.cut_rows.append(line.number)
    run.last_line = line.number


def _on_program(state: _TextState, line: _Line, m: re.Match[str]) -> None:
    program = m.group("prog")
    if "NCCL INFO" in line.text or _collective_of_program(program) is None:
        state.ignored += 1
        return
    run = state.current
    if run is not None and run.has_content and (run.has_table or run.header):
        state.finish()
    if state.current is None:
        state.pending_program = program
    elif state.current.program is None:
        state.current.program = program


def _word(*words: str) -> str:
    """A lookahead for one of ``words`` as a whole whitespace-separated word."""
    return r"(?=(?:.*\s)?(?:" + "|".join(re.escape(w) for w in words) + r")(?:\s|$))"


_PLACEMENT_HEADER = re.compile(_word("out-of-place", "in-place"))
_COLUMN_HEADER = re.compile(_word("algbw") + _word("busbw") + _word("time", "cputime"))
_UNIT_HEADER = re.compile(_word("(us)", "(ms)") + _word("(GB/s)"))


_LineKind = Literal["comment", "plain", "any"]


class _Rule(NamedTuple):
    find: Callable[[str], re.Match[str] | None]
    subject: Literal[0, 1, 2]
    """The index in ``_Line`` of the text ``find`` reads."""
    needle: str
    handler: _Handler
    extends_run: bool
    """The line is the current run's last so far."""
    lines: _LineKind
    """The lines the rule applies to: ``comment`` lines start with ``#``, ``plain`` ones do not."""


def _rule(
    pattern: re.Pattern[str],
    handler: _Handler,
    *,
    on: _Subject = "stripped",
    search: bool = False,
    needle: str = "",
    extends_run: bool = True,
    lines: _LineKind = "any",
) -> _Rule:
    """A line kind: ``pattern`` tried on the line's ``on`` text (``re.match``, or ``re.search``
    with ``search``) when that text holds ``needle``."""
    find = pattern.search if search else pattern.match
    return _Rule(find, _SUBJECT_INDEX[on], needle, handler, extends_run, lines)


_RULES: tuple[_Rule, ...] = (
    _rule(_FAILURE, _on_failure, on="text", search=True, needle="failure"),
    _rule(_TIMEOUT, _on_timeout, on="text", search=True, needle="Test timeout"),
    _rule(_TRACE, _on_trace, on="text", needle="..", lines="plain"),
    _rule(_WARN, _on_warn, on="text", search=True, needle="NCCL WARN", extends_run=False),
    _rule(_VERSION, _on_version, lines="comment"),
    _rule(_STARTING, _on_starting, lines="comment"),
    _rule(_CONCLUDED, _on_concluded, lines="comment"),
    _rule(_PARAMS, _on_params, needle="nThread "),
    _rule(_DEVICE, _on_device, lines="comment"),
    _rule(_OOB, _on_out_of_bounds, needle="Out of bounds values"),
    _rule(_AVG, _on_avg, needle="Avg bus bandwidth"),
    _rule(_ERROR_LINE, _on_error, extends_run=False, lines="comment"),
    _rule(_NCCL_VERSION, _on_nccl_version, on="text", search=True, needle="NCCL version", extends_run=False),
    _rule(_PLACEMENT_HEADER, _on_placement_header, on="body", needle="-place"),
    _rule(_COLUMN_HEADER, _on_column_header, on="body", needle="busbw"),
    _rule(_UNIT_HEADER, _on_unit_header, on="body", needle="(GB/s)", extends_run=False),
    _rule(_ROW_START, _on_row, on="text", extends_run=False, lines="plain"),
    _rule(_PROGRAM_HINT, _on_program, on="text", search=True, needle="_perf", extends_run=False, lines="plain"),
)
"""Every line kind, in the order they are tried: the first match takes the line; a line no
rule takes is counted as ignored."""

_COMMENT_RULES = tuple(rule for rule in _RULES if rule.lines != "plain")
_PLAIN_RULES = tuple(rule for rule in _RULES if rule.lines != "comment")


def _parse_text(text: str, hint: str | None) -> NcclTestsOutput:
    state = _TextState(hint)
    total = 0
    for number, raw in enumerate(text.splitlines(), start=1):
        total = number
        if len(raw) > MAX_LINE_CHARS:
            state.ignored += 1
            continue
        unprefixed = strip_launcher_prefix(raw.replace("\x00", ""))
        stripped = unprefixed.strip()
        if not stripped:
            continue
        comment = stripped.startswith("#")
        line = _Line(unprefixed, stripped, stripped[1:].strip() if comment else stripped, number)
        for find, subject, needle, handler, extends_run, _lines in _COMMENT_RULES if comment else _PLAIN_RULES:
            if needle not in line[subject]:
                continue
            m = find(line[subject])
            if m is None:
                continue
            handler(state, line, m)
            if extends_run and state.current is not None:
                state.current.last_line = number
            break
        else:
            state.ignored += 1
    state.finish()
    if not state.runs:
        raise ParseError(
            f"nccl-tests: no output found in {total} lines: expected a '# nThread ... nGpus ...' "
            "parameter line, a result table (size count type ... time algbw busbw) or a "
            "'<host>: Test NCCL|CUDA failure' line"
        )
    return NcclTestsOutput(tuple(state.runs), total, state.ignored)


def _header_from_match(m: re.Match[str], lineno: int) -> NcclHeader:
    def num(name: str) -> int:
        value = _int(m.group(name) or "")
        return value if value is not None else 0

    def opt(name: str) -> int | None:
        token = m.group(name)
        return _int(token) if token is not None else None

    kind: Literal["factor", "bytes"] = "factor" if m.group("kind") == "factor" else "bytes"
    return NcclHeader(
        n_threads=num("nthread"),
        n_gpus=num("ngpus"),
        min_bytes=num("min"),
        max_bytes=num("max"),
        step=num("step"),
        step_kind=kind,
        warmup_iters=num("warmup"),
        iters=num("iters"),
        validation=num("validation"),
        agg_iters=opt("agg"),
        graph=opt("graph"),
        unalign=opt("unalign"),
        line=lineno,
    )


def _device_from_match(m: re.Match[str]) -> NcclDevice | None:
    if m.group("rank") is not None:
        rank = _int(m.group("rank"))
        dev = _int(m.group("dev"))
        host: str | None = m.group("host")
        pid = _int(m.group("pid")) if m.group("pid") is not None else None
        group = _int(m.group("group")) if m.group("group") is not None else None
    else:
        rank = _int(m.group("rank1"))
        dev = _int(m.group("dev1"))
        host, pid, group = None, None, None
    if rank is None or dev is None:
        return None
    return NcclDevice(rank, dev, m.group("bus"), m.group("name").strip(), host, pid, group)


# --------------------------------------------------------------------------- JSON report (-J)


def _json_number(value: object) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int) and abs(value) > 2**63:
        return None
    if isinstance(value, (int, float)):
        return _finite(float(value))
    if isinstance(value, str):
        return _finite(_float(value.strip()))
    return None


def _json_bool(value: object) -> bool | None:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value in ("true", "false"):
        return value == "true"
    return None


def _json_timing(obj: object) -> NcclTiming | None:
    if not isinstance(obj, dict):
        return None
    time_us = _json_number(obj.get("time", obj.get("cpu_time")))
    algbw = _json_number(obj.get("alg_bw"))
    busbw = _json_number(obj.get("bus_bw"))
    nwrong = _json_number(obj.get("nwrong"))
    return NcclTiming(time_us, algbw, busbw, int(nwrong) if nwrong is not None else None)


def _parse_json(text: str, hint: str | None) -> NcclTestsOutput:
    try:
        doc, _end = json.JSONDecoder().raw_decode(text.lstrip())
    except json.JSONDecodeError as exc:
        raise ParseError(f"nccl-tests JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from exc
    except (ValueError, RecursionError) as exc:
        raise ParseError(f"nccl-tests JSON: unreadable document ({exc.__class__.__name__})") from exc
    if not isinstance(doc, dict) or not isinstance(doc.get("results"), list):
        raise ParseError("nccl-tests JSON: expected an object with a 'results' list (the -J report)")
    check_json_values(doc, "nccl-tests JSON")
    config = doc.get("config") if isinstance(doc.get("config"), dict) else {}
    assert isinstance(config, dict)
    header = _json_header(config)
    devices = tuple(d for d in (_json_device(x) for x in _as_list(config.get("devices"))) if d is not None)
    rows: list[NcclRow] = []
    for index, item in enumerate(doc["results"], start=1):
        if not isinstance(item, dict):
            raise ParseError(f"nccl-tests JSON: results[{index - 1}] is not an object")
        size = _json_number(item.get("size"))
        count = _json_number(item.get("count"))
        if size is None or count is None:
            raise ParseError(f"nccl-tests JSON: results[{index - 1}] lacks a numeric 'size' or 'count'")
        root_value = _json_number(item.get("root"))
        redop = item.get("redop")
        dtype = item.get("type")
        rows.append(
            NcclRow(
                line=index,
                size_bytes=int(size),
                count=int(count),
                dtype=dtype if isinstance(dtype, str) else "",
                redop=redop if isinstance(redop, str) else None,
                root=int(root_value) if root_value is not None else None,
                out_of_place=_json_timing(item.get("out_of_place")),
                in_place=_json_timing(item.get("in_place")),
            )
        )
    oob = doc.get("out_of_bounds") if isinstance(doc.get("out_of_bounds"), dict) else {}
    avg = doc.get("average_bus_bandwidth") if isinstance(doc.get("average_bus_bandwidth"), dict) else {}
    assert isinstance(oob, dict) and isinstance(avg, dict)
    oob_count = _json_number(oob.get("count"))
    avg_okay = avg.get("okay")
    avg_check: Literal["OK", "FAILED"] | None = None
    if _json_bool(avg_okay) is not None:
        avg_check = "OK" if _json_bool(avg_okay) else "FAILED"
    args = [a for a in _as_list(doc.get("args")) if isinstance(a, str)]
    program = args[0].rsplit("/", 1)[-1] if args else None
    nccl_version = _json_number(doc.get("nccl_version"))
    errors = tuple(e for e in _as_list(doc.get("errors")) if isinstance(e, str) and e)
    layout = _Layout(
        ("size", "count", "type", "redop", "root"),
        (("time", "algbw", "busbw", "#wrong"),) * 2,
        False,
        1.0,
        "json",
    )
    collective = _collective_of_program(program) if program else None
    if collective is None:
        collective = hint or _infer_collective(rows, replace(layout, kind="v2.13"), len(devices) or None)
    run = NcclTestRun(
        collective=collective,
        program=program,
        version=None,
        nccl_headers=None,
        nccl_library=int(nccl_version) if nccl_version is not None else None,
        nccl_version=None,
        header=header,
        devices=devices,
        layout="json",
        rows=tuple(rows),
        out_of_bounds=int(oob_count) if oob_count is not None else None,
        out_of_bounds_ok=_json_bool(oob.get("okay")),
        avg_busbw_gbps=_json_number(avg.get("bandwidth")),
        avg_busbw_check=avg_check,
        concluded="end_time" in doc,
        failures=(),
        trace=(),
        warnings=(),
        errors=errors,
        cut_rows=(),
        truncated=False,
        first_line=1,
        last_line=len(rows),
        columns=(),
    )
    return NcclTestsOutput((run,), text.count("\n") + 1, 0)


def _as_list(value: object) -> list[Any]:
    return value if isinstance(value, list) else []


def _json_header(config: dict[str, Any]) -> NcclHeader | None:
    def num(key: str) -> int | None:
        value = _json_number(config.get(key))
        return int(value) if value is not None else None

    nthreads, ngpus = num("nthreads"), num("ngpus")
    if nthreads is None or ngpus is None:
        return None
    factor = num("step_factor")
    step_bytes = num("step_bytes")
    return NcclHeader(
        n_threads=nthreads,
        n_gpus=ngpus,
        min_bytes=num("minimum_bytes") or 0,
        max_bytes=num("maximum_bytes") or 0,
        step=factor if factor is not None else step_bytes or 0,
        step_kind="factor" if factor is not None else "bytes",
        warmup_iters=num("warmup_iters") or 0,
        iters=num("iterations") or 0,
        validation=num("validation") or 0,
        agg_iters=num("aggregated_iterations"),
        graph=num("graph"),
        line=0,
    )


def _json_device(obj: object) -> NcclDevice | None:
    if not isinstance(obj, dict):
        return None
    rank = _json_number(obj.get("rank"))
    device = _json_number(obj.get("device"))
    if rank is None or device is None:
        return None
    pid = _json_number(obj.get("pid"))
    group = _json_number(obj.get("group"))
    host = obj.get("hostname")
    bus = obj.get("device_hex")
    name = obj.get("device_info")
    return NcclDevice(
        rank=int(rank),
        device=int(device),
        bus_id=bus if isinstance(bus, str) else "",
        name=name if isinstance(name, str) else "",
        host=host if isinstance(host, str) else None,
        pid=int(pid) if pid is not None else None,
        group=int(group) if group is not None else None,
    )


# --------------------------------------------------------------------------- converter

PROBE = "nccl_tests"


def _labels(collective: str, row: NcclRow, placement: Placement) -> dict[str, str]:
    return {
        "collective": collective,
        "size_bytes": str(row.size_bytes),
        "placement": placement,
        "dtype": row.dtype,
    }


def _run_measurements(run: NcclTestRun, node: str | None) -> tuple[list[Measurement], int]:
    collective = run.collective or "unknown"
    nranks = run.nranks
    out: list[Measurement] = []
    seen: set[tuple[str, tuple[tuple[str, str], ...]]] = set()
    dropped = 0
    placements: tuple[Placement, Placement] = ("out_of_place", "in_place")
    for row in run.rows:
        for placement in placements:
            timing = row.timing(placement)
            if timing is None:
                continue
            labels = _labels(collective, row, placement)
            key_labels = tuple(sorted(labels.items()))
            if ("time_seconds", key_labels) in seen:
                dropped += 1
                continue
            busbw = timing.busbw_gbps
            algbw = timing.algbw_gbps
            if timing.time_us is not None and nranks is not None and run.collective is not None:
                if busbw is None:
                    busbw = derived_busbw_gbps(run.collective, row.size_bytes, timing.time_us, nranks)
                if algbw is None:
                    algbw = derived_algbw_gbps(row.size_bytes, timing.time_us)
            values = (
                ("time_seconds", None if timing.time_us is None else timing.time_us * 1e-6),
                ("algbw_bytes_per_second", None if algbw is None else algbw * 1e9),
                ("busbw_bytes_per_second", None if busbw is None else busbw * 1e9),
            )
            for name, value in values:
                if value is None or not math.isfinite(value):
                    continue
                seen.add((name, key_labels))
                out.append(Measurement(name=name, value=value, labels=dict(labels), node=node))
    if run.avg_busbw_gbps is not None and math.isfinite(run.avg_busbw_gbps * 1e9):
        out.append(
            Measurement(
                name="avg_busbw_bytes_per_second",
                value=run.avg_busbw_gbps * 1e9,
                labels={"collective": collective},
                node=node,
            )
        )
    return out, dropped


def _run_checks(run: NcclTestRun, node: str | None) -> list[Check]:
    collective = run.collective or "unknown"
    checks: list[Check] = []
    placements: tuple[Placement, Placement] = ("out_of_place", "in_place")
    for row in run.rows:
        for placement in placements:
            timing = row.timing(placement)
            if timing is not None and timing.wrong is not None and timing.wrong > 0:
                checks.append(
                    Check(
                        name="nccl_tests.wrong_elements",
                        ok=False,
                        detail=(
                            f"{collective} {row.size_bytes} B {row.dtype} {placement}: "
                            f"{timing.wrong} wrong elements (line {row.line})"
                        ),
                        node=node,
                    )
                )
    if run.out_of_bounds is not None:
        checks.append(
            Check(
                name="nccl_tests.out_of_bounds",
                ok=run.out_of_bounds == 0,
                detail=f"Out of bounds values : {run.out_of_bounds} {'OK' if run.out_of_bounds == 0 else 'FAILED'}",
                node=node,
            )
        )
    return checks


def _outcome(run: NcclTestRun) -> tuple[Outcome, str]:
    if run.wrong_data:
        parts = []
        if run.out_of_bounds:
            parts.append(f"{run.out_of_bounds} out-of-bounds test instances")
        wrong_rows = sum(
            1
            for row in run.rows
            for t in (row.out_of_place, row.in_place)
            if t is not None and t.wrong is not None and t.wrong > 0
        )
        if wrong_rows:
            parts.append(f"{wrong_rows} results with wrong elements")
        return Outcome.FAIL, "wrong data: " + ", ".join(parts)
    if run.failures:
        first = run.failures[0]
        label = "Test timeout" if first.kind == "timeout" else f"Test {first.kind} failure"
        return Outcome.ERROR, f"{label} on {first.host} at {first.location}: {first.message}"
    if not run.rows:
        if run.truncated:
            return Outcome.ERROR, "truncated output: no result rows"
        return Outcome.ERROR, "no result rows"
    if run.truncated:
        return Outcome.PASS, f"truncated output: {len(run.rows)} rows before the output stopped"
    return Outcome.PASS, ""


def to_probe_results(parsed: NcclTestsOutput, *, node: str | None = None, at: float | None = None) -> list[ProbeResult]:
    """One ``ProbeResult`` (probe ``nccl_tests``) per test run in ``parsed``.

    Measurements: ``time_seconds``, ``algbw_bytes_per_second``, ``busbw_bytes_per_second``
    per row and placement (labels ``collective``, ``size_bytes``, ``placement``, ``dtype``)
    and ``avg_busbw_bytes_per_second``. A row repeating an earlier row's labels (another
    redop, another ``-N`` cycle) is dropped; ``params['duplicate_rows_dropped']`` counts
    them. Node: the device list's host when it names one, else ``node``; several hosts
    leave ``node`` empty and list the hosts in ``nodes``.
    """
    stamp = timestamp(at)
    results: list[ProbeResult] = []
    for run in parsed.runs:
        hosts = run.hosts
        if len(hosts) == 1:
            attributed: str | None = hosts[0]
            nodes = [hosts[0]]
        elif len(hosts) > 1:
            attributed = None
            nodes = list(hosts)
        else:
            attributed = node
            nodes = [node] if node else []
        measurements, dropped = _run_measurements(run, attributed)
        outcome, reason = _outcome(run)
        params: dict[str, Any] = {
            "tool": "nccl-tests",
            "collective": run.collective,
            "program": run.program,
            "version": run.version,
            "nccl_version": run.nccl_version,
            "layout": run.layout,
            "nranks": run.nranks,
            "rows": len(run.rows),
            "truncated": run.truncated,
            "duplicate_rows_dropped": dropped,
            "avg_busbw_check": run.avg_busbw_check,
            "lines": [run.first_line, run.last_line],
        }
        if run.header is not None:
            params.update(
                {
                    "nthreads": run.header.n_threads,
                    "ngpus": run.header.n_gpus,
                    "min_bytes": run.header.min_bytes,
                    "max_bytes": run.header.max_bytes,
                    "warmup_iters": run.header.warmup_iters,
                    "iters": run.header.iters,
                    "validation": run.header.validation,
                }
            )
        if run.cut_rows:
            params["cut_rows"] = list(run.cut_rows)
        if run.warnings:
            params["nccl_warnings"] = list(run.warnings[:20])
        checks = _run_checks(run, attributed)
        results.append(
            tool_result(PROBE, outcome, reason, params, at=stamp, nodes=nodes, measurements=measurements, checks=checks)
        )
    return results


def iter_timings(run: NcclTestRun) -> Iterable[tuple[NcclRow, Placement, NcclTiming]]:
    """Every (row, placement, timing) of a run, out-of-place first."""
    for row in run.rows:
        if row.out_of_place is not None:
            yield row, "out_of_place", row.out_of_place
        if row.in_place is not None:
            yield row, "in_place", row.in_place
