"""The judge's ``throttle`` source (``healthd.judge.sources.throttle``): a power brake or hardware slowdown held
``throttle_sustain_s`` on a busy GPU is ``degraded`` on it; idle, a gap, a failed query or a released brake are
not; its finding survives a restart. (Through a real Prometheus:
tests/integration/test_passive_throttle_prometheus.py.)"""

from __future__ import annotations

from healthd.config import JudgeSettings
from healthd.judge.model import JudgeState
from healthd.judge.sources.throttle import PROBE, Throttle
from healthd.passive.model import PassivePoll, PassiveSignal, Strength
from tests.unit.test_judge_engine import Fleet

NAMES = ["n0", "n1", "n2"]


def brake(node: str, at: float, gpu: str = "2", code: str = "throttle_power_brake") -> PassiveSignal:
    return PassiveSignal(node, "throttle", code, Strength.HINT, at, 136.0, "level", gpu, f"GPU-{node}-{gpu}",
                         "clock event reasons 0x88 (hw_slowdown, hw_power_brake)")


class Feed:
    def __init__(self) -> None:
        self.fleet = Fleet(NAMES, JudgeSettings(passive={"throttle_sustain_s": 300.0}))
        self.recs: list[tuple[str, str, str]] = []

    def poll(self, signals: list[PassiveSignal], busy: dict[str, bool] | None, *, advance: float = 60.0,
             failed: tuple[str, ...] = ()) -> None:
        f = self.fleet
        table = None if busy is None else {(n.split("/")[0], f"GPU-{n.split('/')[0]}-{n.split('/')[1]}"):
                                           (b, "graphics engine active 0.90" if b else "idle")
                                           for n, b in busy.items()}
        poll = PassivePoll(at=f.t, up=True, signals=tuple(signals), covered=frozenset(NAMES), busy=table,
                           failed=failed)  # type: ignore[arg-type]
        out = f.judge.observe(poll, f.nodes, now=f.t)
        self.recs += [(r.node, r.probe, r.reason_code) for r in out.recommendations]
        f.t += advance

    def verdict(self, node: str) -> tuple[str, str] | None:
        v = self.fleet.judge.verdicts.get((node, PROBE))
        return (v.outcome.value, v.reason_code) if v is not None else None


def test_held_on_a_busy_gpu_for_sustain_s_is_degraded_on_that_gpu() -> None:
    feed = Feed()
    for _ in range(5):  # 0, 60, ... 240 s: not yet
        feed.poll([brake("n1", feed.fleet.t)], {"n1/2": True})
    assert feed.verdict("n1") is None and feed.recs == []
    feed.poll([brake("n1", feed.fleet.t)], {"n1/2": True})  # 300 s
    assert feed.verdict("n1") == ("degraded", "throttle_power_brake")
    assert feed.recs == [("n1", PROBE, "throttle_power_brake")]
    v = feed.fleet.judge.verdicts[("n1", PROBE)]
    assert v.evidence["gpu_uuid"] == "GPU-n1-2" and "held 300 s on gpu 2" in v.reason
    fresh = Throttle()
    fresh.restore(feed.fleet.judge, JudgeState(verdicts=tuple(feed.fleet.judge.verdicts.values())))
    assert [s.key for s in fresh.findings(300.0)] == [("n1", "GPU-n1-2", "throttle_power_brake")]
    feed.poll([brake("n1", feed.fleet.t)], None)  # the activity query failed: unknown, nothing changes
    assert feed.verdict("n1") == ("degraded", "throttle_power_brake")
    feed.poll([brake("n1", feed.fleet.t)], {"n1/2": True}, failed=("throttle",))
    assert feed.verdict("n1") == ("degraded", "throttle_power_brake")
    feed.poll([], {"n1/2": True})  # released
    assert feed.verdict("n1") == ("pass", "ok")


def test_idle_gaps_and_interruptions_are_not_held() -> None:
    feed = Feed()
    for _ in range(8):
        feed.poll([brake("n0", feed.fleet.t), brake("n2", feed.fleet.t, code="throttle_hw_slowdown")],
                  {"n0/2": False, "n2/2": True}, advance=60.0)
        feed.poll([brake("n0", feed.fleet.t)], {"n0/2": False, "n2/2": True}, advance=60.0)  # n2 released
    assert feed.verdict("n0") is None and feed.verdict("n2") is None and feed.recs == []
    feed.poll([brake("n2", feed.fleet.t)], {"n2/2": True}, advance=400.0)
    feed.poll([brake("n2", feed.fleet.t)], {"n2/2": True}, advance=60.0)  # a gap longer than sustain_s
    assert feed.verdict("n2") is None
