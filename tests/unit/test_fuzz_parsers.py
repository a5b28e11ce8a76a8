"""Fuzz every parser on the collect path with mutations of the real fixtures (issue 19): hostile
numbers, long lines, deep nesting, lone surrogates, shuffled, repeated, cut and corrupted lines.
Only ``ParseError`` may leave a parser, and no parse takes a second. Bounded and derandomized for CI;
``bench/fuzz.py`` runs the same cases 20,000 at a time."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.fuzzing import run_case, targets

MAX_PARSE_S = 1.0


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
