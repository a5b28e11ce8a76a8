"""What the tool parsers share: the launcher tag on an output line and the result document a
converter returns."""

from __future__ import annotations

import re
import time
from collections.abc import Iterable, Sequence
from typing import Any, Literal

from healthd.errors import ParseError
from probes.result import Check, Measurement, Outcome, ProbeResult

__all__ = ["MAX_LINE_CHARS", "BusClass", "bus_factor_of", "check_json_values", "may_hold_surrogates", "strip_tag",
           "timestamp", "tool_result"]

MAX_LINE_CHARS = 4096
"""A longer line is no tool's result line (rows and headers are a few hundred characters): the text
parsers skip it, which keeps every line regex linear in the input."""

_SURROGATE = re.compile("[\ud800-\udfff]")
_ESCAPED_SURROGATE = re.compile(r"\\u[dD][89a-fA-F]")

BusClass = Literal["all_reduce", "spread", "one"]
"""How a collective's bus bandwidth relates to its algorithm bandwidth: ``spread`` for those
that spread data over the ranks (all_gather, reduce_scatter, alltoall, gather, scatter),
``one`` for those that move it once (broadcast, reduce, point to point)."""

_TAG = re.compile(r"^(?:\[\d{1,7},\d{1,7}\]<(?:stdout|stderr)>: ?|\s{0,8}\d{1,7}: ?)")


def strip_tag(raw: str) -> str:
    """Remove an Open MPI ``--tag-output`` (``[1,0]<stdout>:``) or ``srun -l`` (``0: ``) tag."""
    return _TAG.sub("", raw, count=1)


def check_json_values(doc: object, what: str, *, max_depth: int = 64, strings: bool = True) -> None:
    """Refuse (``ParseError``) a decoded JSON document nested deeper than ``max_depth`` or holding a
    string with a lone surrogate (a ``\\ud800`` escape: not UTF-8, so no store could keep it).
    ``strings=False``: the caller knows no string can hold one (``may_hold_surrogates`` of its text)."""
    if isinstance(doc, str):
        _check_string(doc, what)
        return
    if not isinstance(doc, dict | list):
        return
    stack: list[tuple[dict[Any, Any] | list[Any], int]] = [(doc, 0)]
    while stack:
        value, depth = stack.pop()
        if depth >= max_depth:
            raise ParseError(f"{what} is nested deeper than {max_depth} levels")
        if isinstance(value, dict):
            if strings:
                for key in value:
                    _check_string(key, what)
            items: Iterable[object] = value.values()
        else:
            items = value
        for item in items:
            if isinstance(item, dict | list):
                stack.append((item, depth + 1))
            elif strings and isinstance(item, str):
                _check_string(item, what)


def may_hold_surrogates(text: str) -> bool:
    """Whether a JSON document's ``text`` may decode to a string with a lone surrogate (a raw one, or a
    ``\\udXXX`` escape); ``False`` lets ``check_json_values`` skip its strings."""
    return not text.isascii() or _ESCAPED_SURROGATE.search(text) is not None


def _check_string(value: str, what: str) -> None:
    if not value.isascii() and _SURROGATE.search(value):
        raise ParseError(f"{what} holds a lone surrogate in {value[:40]!r}: not UTF-8 text")


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
