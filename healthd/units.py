"""Measurement values in the units people read."""

from __future__ import annotations

__all__ = ["human"]

_UNITS: tuple[tuple[str, float, str], ...] = (
    ("flop_per_second", 1e12, "TFLOP/s"),
    ("bytes_per_second", 1e9, "GB/s"),
    ("samples_per_second", 1.0, "samples/s"),
    ("seconds", 1e-3, "ms"),
)


def human(name: str, value: float, *, column: bool = False) -> str:
    """``value`` of the metric ``name`` (a name that ends in its base unit) in the unit people read.

    In prose (findings, drain reasons): four significant digits, seconds as ms. In a column
    (the CLI's measurement listings): three decimals, seconds as us, so that nccl-tests times
    keep the microseconds the tool printed. A name without a known unit gives the bare number.
    """
    for unit, scale, suffix in _UNITS:
        if name.endswith(unit):
            if not column:
                return f"{value / scale:.4g} {suffix}"
            if unit == "seconds":
                scale, suffix = 1e-6, "us"
            return f"{value / scale:.3f} {suffix}"
    return f"{value:.4g}"
