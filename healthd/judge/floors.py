"""Layer 1: floors per node class and series (pure lookups and comparisons).

The packaged table (``floors.toml`` next to this module) documents the source of every number;
``[[judge.floors]]`` rules in the config come first. See ``docs/judgement.md``.
"""

from __future__ import annotations

import tomllib
from collections.abc import Sequence
from dataclasses import dataclass
from fnmatch import fnmatchcase
from functools import lru_cache
from importlib import resources

from pydantic import ValidationError

from healthd.config import FloorRule, JudgeSettings
from healthd.errors import ConfigError
from healthd.judge.model import Direction, Finding, ReasonCode, SeriesKey, Severity
from healthd.units import human


@lru_cache(maxsize=1)
def packaged_floors() -> tuple[FloorRule, ...]:
    """The default floor table shipped with healthd."""
    text = resources.files("healthd.judge").joinpath("floors.toml").read_text()
    try:
        data = tomllib.loads(text)
        return tuple(FloorRule(**row) for row in data.get("floor", []))
    except (tomllib.TOMLDecodeError, ValidationError, TypeError) as exc:
        raise ConfigError(f"healthd/judge/floors.toml is broken: {exc}") from None


def floor_rules(settings: JudgeSettings) -> tuple[FloorRule, ...]:
    return tuple(settings.floors) + (packaged_floors() if settings.default_floors else ())


@dataclass(frozen=True)
class FloorTable:
    """Floor lookups with a cache per (node class, series)."""

    rules: tuple[FloorRule, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "_cache", {})

    def lookup(self, node_class: str, key: SeriesKey) -> FloorRule | None:
        cache: dict[tuple[str, SeriesKey], FloorRule | None] = self._cache  # type: ignore[attr-defined]
        hit = cache.get((node_class, key), _MISS)
        if hit is not _MISS:
            return hit  # type: ignore[return-value]
        found = find_floor(self.rules, node_class, key)
        cache[(node_class, key)] = found
        return found


_MISS = object()


def find_floor(rules: Sequence[FloorRule], node_class: str, key: SeriesKey) -> FloorRule | None:
    """The first rule that applies to ``key`` on ``node_class``, or ``None``."""
    labels = key.label_dict
    cls = node_class.lower()
    for rule in rules:
        if rule.probe != key.probe or not fnmatchcase(key.name, rule.name):
            continue
        if not any(fnmatchcase(cls, pattern.lower()) for pattern in rule.node_class):
            continue
        if any(labels.get(k) is None or not fnmatchcase(labels[k], v) for k, v in rule.labels.items()):
            continue
        if rule.min_size_bytes:
            size = labels.get("size_bytes", "")
            if not size.isdigit() or int(size) < rule.min_size_bytes:
                continue
        return rule
    return None


def below_floor(key: SeriesKey, value: float, floor: float, direction: Direction) -> Finding | None:
    """A ``fail``-severity finding when ``value`` is worse than ``floor``, else ``None``.

    >>> k = SeriesKey.of("gemm", "flop_per_second", {"gpu": "3", "dtype": "bf16"})
    >>> below_floor(k, 400e12, 525e12, "higher").detail
    'gpu 3 flop_per_second{dtype=bf16} 400 TFLOP/s is below the floor 525 TFLOP/s'
    """
    worse = value < floor if direction == "higher" else value > floor
    if not worse:
        return None
    word = "below" if direction == "higher" else "above"
    detail = f"{key.describe()} {human(key.name, value)} is {word} the floor {human(key.name, floor)}"
    return Finding(ReasonCode.BELOW_FLOOR, Severity.FAIL, key, value, floor, floor, detail)
