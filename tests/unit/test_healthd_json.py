from __future__ import annotations

import contextlib
import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from healthd.errors import ParseError
from healthd.parsers import healthd_json
from healthd.parsers.healthd_json import parse_result
from probes.result import Measurement, Outcome, ProbeResult

GOOD = ProbeResult(
    probe="gemm", run_id="abc", outcome=Outcome.PASS, started_at=1.0, finished_at=2.0, nodes=["n1"],
    measurements=[Measurement(name="flop_per_second", value=1e12, labels={"gpu": "0", "dtype": "bf16"}, node="n1")],
).to_json()


def test_reads_a_document() -> None:
    r = parse_result(GOOD)
    assert r.probe == "gemm" and r.measurements[0].value == 1e12 and r.measurements[0].labels["dtype"] == "bf16"


def test_reads_the_last_line_after_stray_output() -> None:
    assert parse_result("warning: something\n" + GOOD + "\n").run_id == "abc"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "empty"),
        ("   \n", "empty"),
        ("Segmentation fault", "not a JSON document"),
        ("[1, 2]", "not an object"),
        ('{"schema_version": 2, "probe": "x"}', "schema_version is 2"),
        ('{"probe": "x"}', "schema_version is None"),
        (GOOD.replace('"outcome":"pass"', '"outcome":"great"'), "outcome"),
        (GOOD.replace('"outcome":"pass"', '"outcome":"degraded"'), "never reports 'degraded'"),
        (GOOD.replace('"gpu":"0"', '"job_id":"0"'), "unknown label keys"),
        (GOOD[: len(GOOD) // 2], "not a JSON document"),
    ],
)
def test_garbage_is_a_parse_error(text: str, message: str) -> None:
    with pytest.raises(ParseError, match=message):
        parse_result(text)


def test_measurement_names_must_be_snake_case() -> None:
    doc = json.loads(GOOD)
    doc["measurements"][0]["name"] = "Flop/s"
    with pytest.raises(ParseError, match=r"measurements\.0\.name"):
        parse_result(json.dumps(doc))


@given(st.text())
def test_never_raises_anything_else(text: str) -> None:
    with contextlib.suppress(ParseError):
        parse_result(text)


@pytest.mark.parametrize(("params", "message"), [
    ({"x": json.loads("[" * 40 + "]" * 40)}, "nested deeper than 32"),
    ({"\ud800": 1}, "lone surrogate"),
    ({"x": ["é", "\udfff"]}, "lone surrogate"),
])
def test_a_deep_or_surrogate_document_is_refused_with_or_without_escapes(params: dict[str, object],
                                                                        message: str) -> None:
    doc = {**json.loads(GOOD), "params": params}
    for text in (json.dumps(doc), json.dumps(doc, ensure_ascii=False)):
        with pytest.raises(ParseError, match=message):
            parse_result(text)


def _careful(text: str, monkeypatch: pytest.MonkeyPatch) -> ProbeResult:
    """The careful path alone (the plain one turned off)."""
    with monkeypatch.context() as m:
        m.setattr(healthd_json, "_plain_result", lambda _text: None)
        return parse_result(text)


@pytest.mark.parametrize(("change", "message"), [
    (lambda d: d.pop("schema_version"), "schema_version is None"),
    (lambda d: d["measurements"][0].update(value=10**25), "integer of 26 digits"),
    (lambda d: d.update(params={"x": [{"y": 10**20}]}), "integer of 21 digits"),
    (lambda d: d.update(params={"x": json.loads("[" * 31 + "]" * 31)}), "nested deeper than 32"),
    (lambda d: d.update(params={"x": float("nan")}), "NaN: numbers must be finite"),
])
def test_what_the_plain_path_would_take_the_careful_path_refuses(change: Any, message: str) -> None:
    """Each of these is a valid document to pydantic's JSON parser; the careful path's refusal stands."""
    doc = json.loads(GOOD)
    change(doc)
    with pytest.raises(ParseError, match=message):
        parse_result(json.dumps(doc))


def test_params_as_deep_as_allowed_are_read_by_either_path(monkeypatch: pytest.MonkeyPatch) -> None:
    doc = {**json.loads(GOOD), "params": {"x": json.loads("[" * 30 + "]" * 30), "big": 1e300}}
    assert healthd_json._plain_result(json.dumps(doc)) is not None
    assert parse_result(json.dumps(doc)) == _careful(json.dumps(doc), monkeypatch)


@given(st.lists(st.one_of(st.floats(allow_nan=False, allow_infinity=False), st.integers(-10**17, 10**17)),
                min_size=1, max_size=20),
       st.dictionaries(st.text(max_size=5), st.recursive(
           st.none() | st.booleans() | st.floats() | st.integers() | st.text(max_size=8),
           lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3)),
           max_size=4))
def test_the_plain_path_reads_what_the_careful_path_reads(values: list[float], params: dict[str, Any]) -> None:
    """Whichever path reads a document, the result (or the refusal) is the careful path's."""
    doc = json.loads(GOOD)
    doc["measurements"] = [{**doc["measurements"][0], "value": v} for v in values]
    doc["params"] = params
    text = json.dumps(doc, allow_nan=True)
    with pytest.MonkeyPatch.context() as m:
        try:
            expected: ProbeResult | str = _careful(text, m)
        except ParseError as exc:
            expected = str(exc)
    try:
        got: ProbeResult | str = parse_result(text)
    except ParseError as exc:
        got = str(exc)
    assert got == expected
