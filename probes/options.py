"""Argument types shared by the probes' command lines (argparse ``type=`` callables)."""

from __future__ import annotations

import argparse
from collections.abc import Callable


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value > 0:  # NaN too
        raise argparse.ArgumentTypeError(f"must be > 0: {text!r}")
    return value


def non_negative_float(text: str) -> float:
    """A number ``>= 0`` (a duration where 0 turns something off)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value >= 0 or value == float("inf"):  # NaN too
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0: {text!r}")
    return value


def int_at_least(minimum: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}: {text!r}")
        return value

    return parse
