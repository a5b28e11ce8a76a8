"""Peak dense FLOP/s per node class and dtype (``peaks.toml`` next to this module), and MFU.

MFU (model FLOPs utilisation) is a probe's model FLOP/s per GPU over the class's peak for the
dtype the model computed in. Pure lookups; every number in the table says where it comes from.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from fnmatch import fnmatchcase
from functools import lru_cache
from importlib import resources

from healthd.errors import ConfigError


@dataclass(frozen=True)
class PeakRule:
    node_class: tuple[str, ...]
    values: dict[str, float]
    """Peak FLOP/s by dtype (``fp32``, ``tf32``, ``bf16``, ``fp16``, ``fp8``)."""
    source: str


@lru_cache(maxsize=1)
def packaged_peaks() -> tuple[PeakRule, ...]:
    text = resources.files("healthd.judge").joinpath("peaks.toml").read_text()
    try:
        rows = tomllib.loads(text).get("peak", [])
        rules = tuple(PeakRule(tuple(r["node_class"]), {k: float(v) for k, v in r["values"].items()}, r["source"])
                      for r in rows)
    except (tomllib.TOMLDecodeError, KeyError, TypeError, ValueError) as exc:
        raise ConfigError(f"healthd/judge/peaks.toml is broken: {exc}") from None
    if any(v <= 0 for r in rules for v in r.values.values()):
        raise ConfigError("healthd/judge/peaks.toml is broken: a peak must be > 0")
    return rules


def peak_flops(node_class: str, dtype: str, rules: tuple[PeakRule, ...] | None = None) -> float | None:
    """The peak of the first rule whose pattern matches ``node_class``; ``None`` if it has no figure for ``dtype``.

    >>> peak_flops("h100x8", "bf16"), peak_flops("nvidia_h100_pcie_80gbx2", "bf16"), peak_flops("cpu", "fp32")
    (989400000000000.0, 756000000000000.0, None)
    """
    cls = node_class.lower()
    for rule in packaged_peaks() if rules is None else rules:
        if any(fnmatchcase(cls, pattern.lower()) for pattern in rule.node_class):
            return rule.values.get(dtype)
    return None


def mfu(model_flop_per_second: float, node_class: str, dtype: str) -> float | None:
    """``model_flop_per_second`` over the class's peak for ``dtype`` (``None`` without a peak)."""
    peak = peak_flops(node_class, dtype)
    return None if peak is None else model_flop_per_second / peak
