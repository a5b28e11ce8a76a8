"""Parse healthd's own probe result document (``probes.result.ProbeResult``) from text."""

from __future__ import annotations

import json
import math

from pydantic import ValidationError

from healthd.errors import ParseError
from healthd.parsers.common import check_json_values, may_hold_surrogates
from probes.result import SCHEMA_VERSION, ProbeResult

MAX_BYTES = 64 * 1024 * 1024
MAX_DEPTH = 32
"""Nesting of objects and arrays a result document may have (real ones: 6)."""
MAX_INT_DIGITS = 19


def _no_constant(name: str) -> object:
    raise ParseError(f"probe result holds {name}: numbers must be finite")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ParseError(f"probe result holds the number {text[:40]}, out of range")
    return value


def _bounded_int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise ParseError(f"probe result holds an integer of {len(text)} digits")
    return int(text)


def _loads(text: str) -> object:
    """``json.loads`` that refuses NaN, the infinities, numbers out of range and deep nesting."""
    try:
        return json.loads(text, parse_constant=_no_constant, parse_float=_finite, parse_int=_bounded_int)
    except RecursionError:
        raise ParseError(f"probe result is nested deeper than {MAX_DEPTH} levels") from None


def parse_result(text: str) -> ProbeResult:
    """Read one ``ProbeResult``.

    Accepts the document alone or as the last line of a longer output (a probe's stdout
    with stray lines before it). Raises ``ParseError`` naming what is wrong otherwise.
    """
    if len(text) > MAX_BYTES:
        raise ParseError(f"probe output is {len(text)} characters, more than the {MAX_BYTES} allowed")
    stripped = text.strip()
    if not stripped:
        raise ParseError("probe output is empty: no result document")
    candidates = [stripped]
    last_line = stripped.rsplit("\n", 1)[-1].strip()
    if last_line != stripped:
        candidates.append(last_line)
    doc: object = None
    error = ""
    for candidate in candidates:
        try:
            doc = _loads(candidate)
            text = candidate
            break
        except ValueError as exc:
            error = str(exc)
    else:
        raise ParseError(f"probe output is not a JSON document ({error}); starts with {stripped[:80]!r}")
    if not isinstance(doc, dict):
        raise ParseError(f"probe output is JSON but not an object (got {type(doc).__name__})")
    check_json_values(doc, "probe result", max_depth=MAX_DEPTH, strings=may_hold_surrogates(text))
    version = doc.get("schema_version")
    if version != SCHEMA_VERSION:
        raise ParseError(
            f"probe result schema_version is {version!r}; this healthd reads version {SCHEMA_VERSION}"
        )
    try:
        return ProbeResult.model_validate(doc)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()[:5]
        )
        raise ParseError(f"probe result does not match the schema: {problems}") from None
