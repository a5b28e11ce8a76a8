from __future__ import annotations

import contextlib
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from healthd.errors import ParseError
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
