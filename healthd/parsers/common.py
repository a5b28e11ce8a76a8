"""What the tool parsers share: the launcher tag on an output line and the result document a
converter returns."""

from __future__ import annotations

import re
import time
from collections.abc import Sequence
from typing import Any, Literal

from healthd.errors import ParseError
from probes.result import Check, Measurement, Outcome, ProbeResult

__all__ = ["MAX_LINE_CHARS", "BusClass", "bus_factor_of", "check_json_values", "strip_tag", "timestamp", "tool_result"]

MAX_LINE_CHARS = 4096
"""A longer line is no tool's result line (rows and headers are a few hundred characters): the text
parsers skip it, which keeps every line regex linear in the input."""

_SURROGATE = re.compile("[\ud800-\udfff]")

BusClass = Literal["all_reduce", "spread", "one"]
"""How a collective's bus bandwidth relates to its algorithm bandwidth: ``spread`` for those
that spread data over the ranks (all_gather, reduce_scatter, alltoall, gather, scatter),
``one`` for those that move it once (broadcast, reduce, point to point)."""

_TAG = re.compile(r"^(?:\[\d{1,7},\d{1,7}\]<(?:stdout|stderr)>: ?|\s{0,8}\d{1,7}: ?)")


def strip_tag(raw: str) -> str:
    """Remove an Open MPI ``--tag-output`` (``[1,0]<stdout>:``) or ``srun -l`` (``0: ``) tag."""
    return _TAG.sub("", raw, count=1)


def check_json_values(doc: object, what: str, *, max_depth: int = 64) -> None:
    """Refuse (``ParseError``) a decoded JSON document nested deeper than ``max_depth`` or holding a
    string with a lone surrogate (a ``\\ud800`` escape: not UTF-8, so no store could keep it)."""
    stack: list[tuple[object, int]] = [(doc, 0)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, str):
            if not value.isascii() and _SURROGATE.search(value):
                raise ParseError(f"{what} holds a lone surrogate in {value[:40]!r}: not UTF-8 text")
            continue
        if not isinstance(value, dict | list):
            continue
        if depth >= max_depth:
            raise ParseError(f"{what} is nested deeper than {max_depth} levels")
        items = [*value.keys(), *value.values()] if isinstance(value, dict) else value
        stack.extend((item, depth + 1) for item in items)


def bus_factor_of(bus_class: BusClass | None, nranks: int) -> float | None:
    """The bus bandwidth factor over ``nranks`` ranks: ``2(n-1)/n``, ``(n-1)/n`` or ``1``."""
    if nranks <= 0 or bus_class is None:
        return None
    n = float(nranks)
    if bus_class == "all_reduce":
        return 2.0 * (n - 1.0) / n
    return (n - 1.0) / n if bus_class == "spread" else 1.0


def timestamp(at: float | None) -> float:
    return time.time() if at is None else at


def tool_result(
    probe: str,
    outcome: Outcome,
    reason: str,
    params: dict[str, Any],
    *,
    at: float | None,
    node: str | None = None,
    nodes: Sequence[str] | None = None,
    measurements: Sequence[Measurement] = (),
    checks: Sequence[Check] = (),
) -> ProbeResult:
    """A converter's ``ProbeResult``: started and finished ``at`` (now when ``None``), on
    ``nodes`` (by default ``node`` alone, none when ``node`` is empty)."""
    stamp = timestamp(at)
    return ProbeResult(
        probe=probe,
        outcome=outcome,
        reason=reason,
        started_at=stamp,
        finished_at=stamp,
        nodes=list(nodes) if nodes is not None else [node] if node else [],
        params=params,
        measurements=list(measurements),
        checks=list(checks),
    )
