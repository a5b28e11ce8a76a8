"""Which measurements are judged: selectors, the largest message size, fail-closed requirements."""

from __future__ import annotations

from healthd.config import JudgeSettings, SeriesSelector
from healthd.judge.model import MeasurementInput, RunInput, SeriesKey
from healthd.judge.series import direction_of, missing_required, select
from healthd.model import Outcome


def m(name: str, value: float, node: str | None = "n1", **labels: str) -> MeasurementInput:
    return MeasurementInput(name, value, labels, node)


def nccl_run(*measurements: MeasurementInput) -> RunInput:
    return RunInput("0000000000000001", "nccl", ("n1", "n2"), Outcome.PASS, "", 10.0, measurements)


def test_default_selectors_judge_the_largest_busbw_per_collective_and_scope() -> None:
    run = nccl_run(
        m("busbw_bytes_per_second", 0.4e9, collective="all_reduce", size_bytes="8192", scope="node"),
        m("busbw_bytes_per_second", 300e9, collective="all_reduce", size_bytes="67108864", scope="node"),
        m("busbw_bytes_per_second", 480e9, collective="all_reduce", size_bytes="1073741824", scope="node"),
        m("busbw_bytes_per_second", 350e9, collective="all_gather", size_bytes="1073741824", scope="node"),
        m("busbw_bytes_per_second", 440e9, None, collective="all_reduce", size_bytes="1073741824", scope="group"),
        m("busbw_bytes_per_second", 90e9, None, collective="all_reduce", size_bytes="8192", scope="group"),
        m("algbw_bytes_per_second", 240e9, collective="all_reduce", size_bytes="1073741824", scope="node"),
        m("time_seconds", 0.004, collective="all_reduce", size_bytes="1073741824", scope="node"),
    )
    chosen = select(run, JudgeSettings().series)
    assert [(x.value, d) for x, d in chosen] == [(480e9, "higher"), (350e9, "higher"), (440e9, "higher")]


def test_min_size_labels_and_direction() -> None:
    selectors = [
        SeriesSelector(probe="nccl", name="time_seconds", labels={"collective": "all_*"}, min_size_bytes=1 << 20),
        SeriesSelector(probe="nccl", name="busbw_*", labels={"scope": "node"}, direction="lower"),
        SeriesSelector(probe="nccl", name="busbw_bytes_per_second"),  # matches again: judged once, under the first
    ]
    run = nccl_run(
        m("time_seconds", 2e-5, collective="all_reduce", size_bytes="8192"),
        m("time_seconds", 4e-3, collective="all_reduce", size_bytes="1073741824"),
        m("time_seconds", 5e-3, collective="alltoall", size_bytes="1073741824"),
        m("busbw_bytes_per_second", 480e9, scope="node", size_bytes="1073741824"),
        m("busbw_bytes_per_second", 440e9, None, scope="group", size_bytes="1073741824"),
    )
    chosen = [(x.name, x.value, d) for x, d in select(run, selectors)]
    assert chosen == [("time_seconds", 4e-3, "lower"), ("busbw_bytes_per_second", 480e9, "lower"),
                      ("busbw_bytes_per_second", 440e9, "higher")]
    assert direction_of("step_seconds") == "lower" and direction_of("scaling_efficiency_ratio") == "higher"


def test_a_pass_without_its_number_is_missing_and_other_probes_are_not_affected() -> None:
    selectors = JudgeSettings().series
    assert [s.name for s in missing_required(nccl_run(m("algbw_bytes_per_second", 1.0)), selectors)] == \
        ["busbw_bytes_per_second"]
    assert missing_required(nccl_run(m("busbw_bytes_per_second", 1.0, size_bytes="8")), selectors) == []
    gemm = RunInput("0000000000000002", "gemm", ("n1",), Outcome.PASS, "", 1.0,
                    (m("memory_bandwidth_bytes_per_second", 2e12, gpu="0"),))
    assert [s.name for s in missing_required(gemm, selectors)] == ["flop_per_second"]
    env = RunInput("0000000000000003", "env", ("n1",), Outcome.PASS, "", 1.0, ())
    assert missing_required(env, selectors) == []


def test_series_keys_describe_the_gpu_first() -> None:
    key = SeriesKey.of("gemm", "flop_per_second", {"dtype": "bf16", "gpu": "7"})
    assert key.describe() == "gpu 7 flop_per_second{dtype=bf16}"
    assert key.without("gpu") == SeriesKey("gemm", "flop_per_second", (("dtype", "bf16"),))
    big = SeriesKey.of("nccl", "busbw_bytes_per_second", {"size_bytes": str(16 << 30), "scope": "group"})
    assert big.describe() == "busbw_bytes_per_second{scope=group,size_bytes=16G}"
