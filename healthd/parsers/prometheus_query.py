"""Prometheus's ``/api/v1/query`` answer (JSON) to typed samples (pure, bounded).

Only an instant vector is accepted (``resultType: vector``): one sample per series, its labels and its
value. ``status: error`` answers, bad JSON, another result type or more series than allowed raise
``QueryAnswerError`` (the query's whole answer is unusable); a value that is not a finite number (``NaN``,
``+Inf``, ``"abc"``) drops only its sample and is counted in ``QueryResult.bad_values``.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any


class QueryAnswerError(ValueError):
    """The answer cannot be used: Prometheus's own error, or not what a vector query answers."""


@dataclass(frozen=True, slots=True)
class Sample:
    """One series of an instant vector: its labels (``__name__`` included where Prometheus keeps it)."""

    labels: dict[str, str]
    value: float


@dataclass(frozen=True, slots=True)
class QueryResult:
    samples: tuple[Sample, ...]
    bad_values: int = 0
    """Series whose value was not a finite number (dropped)."""
    first_bad: str = ""
    """The first such value, for the error line."""
    warnings: tuple[str, ...] = ()


def _text(value: object, limit: int = 300) -> str:
    return str(value)[:limit]


def parse_query_response(body: bytes | str, *, max_series: int) -> QueryResult:
    """The samples of an instant query's answer.

    :raises QueryAnswerError: not JSON, ``status: error``, not a vector, more than ``max_series``
        series, or a series that is not ``{"metric": {...}, "value": [ts, "v"]}``.
    """
    try:
        doc = json.loads(body)
    except (ValueError, RecursionError) as exc:
        raise QueryAnswerError(f"not JSON: {_text(exc, 120)}") from None
    if not isinstance(doc, dict):
        raise QueryAnswerError(f"not a Prometheus API answer (a JSON {type(doc).__name__})")
    status = doc.get("status")
    if status == "error":
        raise QueryAnswerError(f"Prometheus: {_text(doc.get('errorType', 'error'))}: {_text(doc.get('error', ''))}")
    if status != "success":
        raise QueryAnswerError(f"not a Prometheus API answer (status {_text(status, 40)!r})")
    data = doc.get("data")
    if not isinstance(data, dict):
        raise QueryAnswerError("the answer has no data")
    if data.get("resultType") != "vector":
        raise QueryAnswerError(f"the answer is a {_text(data.get('resultType'), 40)!r}, not an instant vector")
    result = data.get("result")
    if not isinstance(result, list):
        raise QueryAnswerError("the answer's result is not a list")
    if len(result) > max_series:
        raise QueryAnswerError(f"{len(result)} series, more than passive.max_series ({max_series})")
    samples: list[Sample] = []
    bad, first_bad = 0, ""
    for item in result:
        labels, raw = _series(item)
        value = _number(raw)
        if value is None:
            bad += 1
            first_bad = first_bad or _text(raw, 40)
            continue
        samples.append(Sample(labels, value))
    warnings = doc.get("warnings")
    return QueryResult(tuple(samples), bad, first_bad,
                       tuple(_text(w) for w in warnings[:10]) if isinstance(warnings, list) else ())


def _series(item: Any) -> tuple[dict[str, str], Any]:
    if not isinstance(item, dict) or not isinstance(item.get("metric"), dict):
        raise QueryAnswerError("a series without its labels")
    metric: dict[Any, Any] = item["metric"]
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in metric.items()):
        raise QueryAnswerError("a series whose labels are not strings")
    pair = item.get("value")
    if not isinstance(pair, list) or len(pair) != 2:
        raise QueryAnswerError("a series without a [time, value] pair")
    return dict(metric), pair[1]


def _number(raw: object) -> float | None:
    if not isinstance(raw, str | int | float) or isinstance(raw, bool):
        return None
    try:
        value = float(raw)
    except ValueError:
        return None
    return value if math.isfinite(value) else None
