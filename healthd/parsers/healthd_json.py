"""Parse healthd's own probe result document (``probes.result.ProbeResult``) from text."""

from __future__ import annotations

import json
import math
from typing import Any

from pydantic import ValidationError

from healthd.errors import ParseError
from healthd.parsers.common import check_json_values, may_hold_surrogates
from probes.result import SCHEMA_VERSION, ProbeResult

MAX_BYTES = 64 * 1024 * 1024
MAX_DEPTH = 32
"""Nesting of objects and arrays a result document may have (real ones: 6)."""
MAX_INT_DIGITS = 19
_DIGIT_RUN = b"0" * 18
_DIGITS = bytes(48 if 48 <= b <= 57 else 32 for b in range(256))
"""``bytes.translate`` table: each digit to ``0``, anything else to a space (a run of digits found in C)."""


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


def _plain_result(text: str) -> ProbeResult | None:
    """``text`` read in one pass by pydantic's JSON parser when it is a plain document, which the careful
    path of ``parse_result`` would read to the same result: ASCII without a ``\\u`` escape (no string can
    hold a surrogate), no run of 18 digits (every integer far inside ``MAX_INT_DIGITS``; the schema's
    floats refuse what is not finite), an explicit ``schema_version``, and ``params`` (the one part the
    schema leaves open) holding only finite numbers, nested no deeper than ``MAX_DEPTH``. ``None`` for
    anything else, valid or not: the careful path reads it and words what is wrong."""
    if not text.isascii() or "\\u" in text or _DIGIT_RUN in text.encode("ascii").translate(_DIGITS):
        return None
    try:
        result = ProbeResult.model_validate_json(text)
    except ValueError:
        return None
    if "schema_version" not in result.model_fields_set or (result.params and not _plain_params(result.params)):
        return None
    return result


def _plain_params(params: dict[str, Any]) -> bool:
    """Whether ``params`` (at depth 1 of its document) holds only finite numbers and nests no deeper than
    ``MAX_DEPTH`` (``check_json_values``' count)."""
    stack: list[tuple[object, int]] = [(params, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, float):
            if not math.isfinite(value):
                return False
        elif isinstance(value, dict | list):
            if depth >= MAX_DEPTH:
                return False
            stack.extend((item, depth + 1) for item in (value.values() if isinstance(value, dict) else value))
    return True


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
    plain = _plain_result(stripped)
    if plain is not None:
        return plain
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
