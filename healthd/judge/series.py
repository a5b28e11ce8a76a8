"""Which measurements of a run are judged, and which way is better (pure).

Selectors come from ``[[judge.series]]``. Bandwidth is judged at large message sizes only
by default (``sizes = "largest"``): small messages are latency-bound and vary by +-20-75%
across nodes (probe-methodology §7.1), which would drown any real drop.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from fnmatch import fnmatchcase

from healthd.config import SeriesSelector
from healthd.judge.model import Direction, MeasurementInput, RunInput, SeriesKey


def direction_of(name: str, selector: SeriesSelector | None = None) -> Direction:
    """``lower`` for times (``*_seconds``), ``higher`` for rates and ratios, unless configured."""
    if selector is not None and selector.direction != "auto":
        return selector.direction
    return "lower" if name.endswith("_seconds") else "higher"


def _like(value: str, pattern: str) -> bool:
    if not any(c in pattern for c in "*?["):
        return value == pattern
    return fnmatchcase(value, pattern)


def matches(selector: SeriesSelector, probe: str, m: MeasurementInput) -> bool:
    if selector.probe != probe or not _like(m.name, selector.name):
        return False
    for key, pattern in selector.labels.items():
        value = m.labels.get(key)
        if value is None or not _like(value, pattern):
            return False
    if selector.min_size_bytes:
        size = _size(m)
        if size is None or size < selector.min_size_bytes:
            return False
    return True


def _size(m: MeasurementInput) -> int | None:
    raw = m.labels.get("size_bytes")
    return int(raw) if raw is not None and raw.isdigit() else None


def select(run: RunInput, selectors: Sequence[SeriesSelector]) -> list[tuple[MeasurementInput, Direction]]:
    """The measurements of ``run`` that are judged, each once, with its direction.

    A measurement matched by several selectors is judged once, under the first. With
    ``sizes = "largest"``, of measurements equal in every label but ``size_bytes``, only the
    largest size is kept.
    """
    chosen: dict[int, tuple[MeasurementInput, Direction]] = {}
    for selector in selectors:
        if selector.probe != run.probe:
            continue
        hits = [(i, m) for i, m in enumerate(run.measurements) if i not in chosen and matches(selector, run.probe, m)]
        if selector.sizes == "largest":
            hits = _largest_only(hits)
        for i, m in hits:
            chosen[i] = (m, direction_of(m.name, selector))
    return [chosen[i] for i in sorted(chosen)]


def _largest_only(hits: Iterable[tuple[int, MeasurementInput]]) -> list[tuple[int, MeasurementInput]]:
    best: dict[tuple[str | None, str, tuple[tuple[str, str], ...]], tuple[int, int, MeasurementInput]] = {}
    for i, m in hits:
        rest = tuple(sorted((k, v) for k, v in m.labels.items() if k != "size_bytes"))
        group = (m.node, m.name, rest)
        size = _size(m) or 0
        if group not in best or size > best[group][1]:
            best[group] = (i, size, m)
    return sorted(((i, m) for i, _, m in best.values()), key=lambda item: item[0])


def missing_required(run: RunInput, selectors: Sequence[SeriesSelector]) -> list[SeriesSelector]:
    """Required selectors of the run's probe that no measurement of the run matches."""
    return [
        s for s in selectors
        if s.required and s.probe == run.probe and not any(matches(s, run.probe, m) for m in run.measurements)
    ]


def key_of(probe: str, m: MeasurementInput) -> SeriesKey:
    return SeriesKey.of(probe, m.name, m.labels)
