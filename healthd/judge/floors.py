"""Layer 1: floors per node class and series (pure lookups and comparisons).

The packaged table (``floors.toml`` next to this module) documents the source of every number;
``[[judge.floors]]`` rules in the config come first. See ``docs/judgement.md``.

*Floors confirmed like findings* (``confirmable``): a breach counts toward confirming a fault only when
the node's next result of the probe breaches the same series' floor too (or when it is the node's
latest: its re-probe is still to come). In a heavy-tailed fleet (1% of results 30-40% low for no
hardware reason) two unrelated tail results in a node's last few runs are otherwise "confirmed in 2
of the last 5 runs"; a real fault (a GPU at 60%, every run) breaches every run and is confirmed by
its first re-probe, as before.
"""

from __future__ import annotations

import tomllib
from collections.abc import Sequence
from dataclasses import dataclass, replace
from fnmatch import fnmatchcase
from functools import lru_cache
from importlib import resources

from pydantic import ValidationError

from healthd.config import FloorRule, JudgeSettings
from healthd.errors import ConfigError
from healthd.judge.model import Direction, Finding, Mark, ReasonCode, SeriesKey, Severity
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


def _breaches(mark: Mark) -> frozenset[SeriesKey]:
    return frozenset(f.key for f in mark.findings if f.code is ReasonCode.BELOW_FLOOR)


def _rank(f: Finding) -> tuple[int, float]:
    return int(f.severity), abs(f.value - f.reference) / abs(f.reference) if f.reference else 0.0


def confirmable(marks: Sequence[Mark]) -> Sequence[Mark]:
    """``marks`` (one node's judged results of one probe, oldest first) with each floor breach that the
    next result did not repeat taken out (see the module docstring). A breach is kept when the result
    before or after breaches the same series' floor; a lone breach in the latest result (its re-probe is
    still to come) is kept too, unless the series has repeated breaches earlier in ``marks`` (it would
    add a chance value to them: "3 of the last 5" from a pair and an unrelated one). A result left
    with no finding passes (``Severity.NONE``), else it takes its worst remaining finding's severity,
    code and text. Returns ``marks`` itself when nothing is taken out (the common case: no breach).

    >>> from healthd.judge.model import Mark
    >>> key = SeriesKey("gemm", "flop_per_second", (("gpu", "3"),))
    >>> low = Finding(ReasonCode.BELOW_FLOOR, Severity.FAIL, key, 400.0, 525.0, 525.0, "below the floor")
    >>> mk = lambda *fs: Mark("r", "n", "gemm", 0.0, max((f.severity for f in fs), default=Severity.NONE),
    ...                       ReasonCode.OK, "", True, findings=fs)
    >>> [m.severity.name for m in confirmable([mk(low), mk(), mk(), mk(low)])]
    ['NONE', 'NONE', 'NONE', 'FAIL']
    >>> [m.severity.name for m in confirmable([mk(), mk(low), mk(low)])]
    ['NONE', 'FAIL', 'FAIL']
    """
    breaches = [_breaches(mk) for mk in marks]
    if not any(breaches):
        return marks
    out = list(marks)
    last = len(out) - 1
    repeated_keys = {k for i in range(last) for k in breaches[i] & breaches[i + 1]}
    for i, keys in enumerate(breaches):
        if not keys:
            continue
        if i == last:
            lone = {k for k in keys if k in repeated_keys and (i == 0 or k not in breaches[i - 1])}
        else:
            lone = {k for k in keys if k not in breaches[i + 1] and (i == 0 or k not in breaches[i - 1])}
        if not lone:
            continue
        mk = out[i]
        kept = tuple(f for f in mk.findings if not (f.code is ReasonCode.BELOW_FLOOR and f.key in lone))
        top = max(kept, key=_rank, default=None)
        if top is None:
            dropped = next(f for f in mk.findings if f.key in lone)
            out[i] = replace(mk, severity=Severity.NONE, code=ReasonCode.OK, findings=(), event_proof=False,
                             text=f"a floor breach the next run did not repeat: {dropped.detail}")
        else:
            out[i] = replace(mk, severity=top.severity, code=top.code, text=top.detail, findings=kept,
                             event_proof=any(f.event_proof for f in kept))
    return out
