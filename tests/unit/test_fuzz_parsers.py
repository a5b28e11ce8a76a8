"""Fuzz every parser on the collect path with mutations of the real fixtures (issue 19): hostile
numbers, long lines, deep nesting, lone surrogates, shuffled, repeated, cut and corrupted lines.
Only ``ParseError`` may leave a parser, and no parse takes a second. Bounded and derandomized for CI;
``bench/fuzz.py`` runs the same cases 20,000 at a time."""

from __future__ import annotations

import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from healthd.errors import ParseError
from tests.fuzzing import LARGE_FINITE_NUMBERS, run_case, targets

MAX_PARSE_S = 1.0
NUMBER = re.compile(r"-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?")


@settings(max_examples=300, derandomize=True, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(target=st.sampled_from(sorted(targets())), fixture=st.integers(0, 1 << 16), seed=st.integers(0, 1 << 62))
def test_mutated_fixtures_raise_only_parse_errors_and_parse_fast(target: str, fixture: int, seed: int) -> None:
    case = run_case(target, fixture, seed)
    where = f"{target} fixture {case.fixture} seed {seed}"
    assert case.crash is None, f"{where}: {case.crash}"
    assert case.seconds < MAX_PARSE_S, f"{where}: {case.seconds:.2f} s"


@pytest.mark.parametrize("target", sorted(targets()))
def test_every_target_has_real_fixtures(target: str) -> None:
    _, fixtures = targets()[target]
    assert fixtures and all(fixtures)


@pytest.mark.parametrize("target", sorted(targets()))
def test_each_number_of_each_fixture_replaced_by_a_large_finite_number(target: str) -> None:
    """Every number of every real fixture (up to 60 spots each), in turn, replaced by each of
    ``LARGE_FINITE_NUMBERS``: ``1e300`` as a GEMM's N and K made ``2*M*N*K / time`` raise
    ``OverflowError: int too large to convert to float``."""
    function, fixtures = targets()[target]
    crashes: list[str] = []
    for index, text in enumerate(fixtures):
        spots = [m.span() for m in NUMBER.finditer(text[:100_000])]
        for start, end in spots[:: max(1, len(spots) // 60)]:
            for number in LARGE_FINITE_NUMBERS:
                try:
                    function(text[:start] + number + text[end:])
                except ParseError:
                    pass
                except Exception as exc:
                    crashes.append(f"fixture {index} at {start} = {number}: {type(exc).__name__}: {exc}"[:300])
    assert not crashes, "\n".join(crashes[:10])
