"""How the ddp probe times its two models: warmed up, then in alternating turns (no order favoured)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from probes import ddp


class _Recorder:
    def __init__(self, name: str, log: list[tuple[str, int]]) -> None:
        self.name, self.log = name, log

    def steps(self, count: int) -> list[float]:
        self.log.append((self.name, count))
        return [0.01] * count


def test_turns_alternate_single_ddp_ddp_single() -> None:
    log: list[tuple[str, int]] = []
    marks: list[str] = []
    ctx: Any = SimpleNamespace(mark=marks.append, barrier=lambda: None)
    single, model = _Recorder("single", log), _Recorder("ddp", log)
    s, d = ddp.alternate(ctx, single, model, 5, 20)  # type: ignore[arg-type]
    assert log == [("single", 5), ("ddp", 5), ("single", 10), ("ddp", 10), ("ddp", 10), ("single", 10)]
    assert len(s) == len(d) == 20
    assert marks[-4:] == ["ddp.single.timed", "ddp.ddp.timed", "ddp.ddp.timed", "ddp.single.timed"]
    log.clear()
    s, d = ddp.alternate(ctx, single, model, 0, 1)  # type: ignore[arg-type]
    assert log == [("single", 0), ("ddp", 0), ("single", 1), ("ddp", 1)] and len(s) == len(d) == 1


def test_chunks() -> None:
    assert ddp.chunks(20, 2) == [10, 10]
    assert ddp.chunks(5, 2) == [3, 2]
    assert ddp.chunks(1, 2) == [1]
    assert sum(ddp.chunks(7, 3)) == 7
