"""The passive source's pure parts: the query answer, names, the signal tracker; and a poll with a fake client."""

from __future__ import annotations

import json
from typing import Any

import pytest

from healthd.config import PassiveSettings
from healthd.parsers.prometheus_query import QueryAnswerError, parse_query_response
from healthd.passive.client import PassiveQueryError
from healthd.passive.model import SIGNALS, Strength
from healthd.passive.names import Located, NodeNamer, gpu_of, locate, strip_port
from healthd.passive.signals import SignalTracker
from healthd.passive.source import PassiveSource, error_signals
from tests.fakes.dcgm_exporter import fake_uuid

NODES = {"gpu01", "gpu02"}


def series(name: str, node: str | None, gpu: int, value: str, host_label: str = "Hostname",
           **extra: str) -> dict[str, Any]:
    metric = {"__name__": name, "gpu": str(gpu), "UUID": fake_uuid(node or "x", gpu), "device": f"nvidia{gpu}",
              "modelName": "NVIDIA H100 80GB HBM3", "DCGM_FI_DRIVER_VERSION": "550.127.05",
              "instance": "10.0.0.1:9400", "job": "dcgm", **extra}
    if node is not None:
        metric[host_label] = node
    return {"metric": metric, "value": [1764130000.123, value]}


def answer(*result: dict[str, Any]) -> bytes:
    return json.dumps({"status": "success", "data": {"resultType": "vector", "result": list(result)}}).encode()


def located(node: str, gpu: int, value: float, **labels: str) -> Located:
    return Located(node, str(gpu), fake_uuid(node, gpu), {"gpu": str(gpu), **labels}, value)


# -- the query answer ---------------------------------------------------------------------------------------
def test_a_vector_answer_gives_its_samples() -> None:
    result = parse_query_response(answer(series("DCGM_FI_DEV_XID_ERRORS", "gpu01", 0, "79")), max_series=10)
    assert len(result.samples) == 1
    assert result.samples[0].value == 79.0
    assert result.samples[0].labels["Hostname"] == "gpu01"
    assert result.bad_values == 0


@pytest.mark.parametrize("bad", ["NaN", "+Inf", "-Inf", "abc", ""])
def test_a_value_that_is_no_finite_number_is_dropped_and_counted(bad: str) -> None:
    result = parse_query_response(answer(series("X", "gpu01", 0, bad), series("X", "gpu01", 1, "1")), max_series=10)
    assert [s.value for s in result.samples] == [1.0]
    assert result.bad_values == 1


@pytest.mark.parametrize(("body", "message"), [
    (b"{not json", "not JSON"),
    (b"[1, 2]", "not a Prometheus API answer"),
    (json.dumps({"status": "error", "errorType": "bad_data", "error": "parse error at char 3"}).encode(),
     "Prometheus: bad_data: parse error at char 3"),
    (json.dumps({"status": "success", "data": {"resultType": "matrix", "result": []}}).encode(), "'matrix'"),
    (json.dumps({"status": "success", "data": {"resultType": "vector", "result": [{"metric": {"a": 1},
                                                                                  "value": [0, "1"]}]}}).encode(),
     "labels are not strings"),
    (json.dumps({"status": "success", "data": {"resultType": "vector", "result": [{"metric": {}}]}}).encode(),
     "[time, value]"),
    (b"[" * 100_000 + b"]" * 100_000, "not JSON"),
])
def test_an_unusable_answer_is_one_error(body: bytes, message: str) -> None:
    with pytest.raises(QueryAnswerError, match=message.replace("[", r"\[").replace("(", r"\(")):
        parse_query_response(body, max_series=10)


def test_ten_thousand_series_are_read_and_more_than_max_series_refused() -> None:
    many = answer(*(series("DCGM_FI_DEV_XID_ERRORS", f"n{i // 8}", i % 8, "0") for i in range(10_000)))
    assert len(parse_query_response(many, max_series=100_000).samples) == 10_000
    with pytest.raises(QueryAnswerError, match=r"10000 series, more than passive\.max_series"):
        parse_query_response(many, max_series=9_999)


# -- names --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("instance", "host"), [
    ("gpu01:9400", "gpu01"), ("gpu01", "gpu01"), ("10.1.2.3:9400", "10.1.2.3"), ("[fe80::1]:9400", "fe80::1"),
    ("fe80::1", "fe80::1"),
])
def test_the_instance_loses_its_port(instance: str, host: str) -> None:
    assert strip_port(instance) == host


def test_host_label_order_and_mapping() -> None:
    namer = NodeNamer.of(["Hostname", "hostname", "instance"], None, r"\1")
    assert namer.node({"Hostname": "a", "hostname": "b", "instance": "c:1"}) == "a"
    assert namer.node({"hostname": "b", "instance": "c:1"}) == "b"
    assert namer.node({"instance": "c:9400"}) == "c"
    assert namer.node({"job": "dcgm"}) is None
    fqdn = NodeNamer.of(["Hostname", "instance"], r"^([^.]+)\..*$", r"\1")
    assert fqdn.node({"Hostname": "gpu01.cluster.example"}) == "gpu01"
    assert fqdn.node({"Hostname": "gpu01"}) == "gpu01"
    assert fqdn.node({"instance": "gpu02.cluster.example:9400"}) == "gpu02"


def test_gpu_index_and_uuid_from_any_spelling() -> None:
    assert gpu_of({"gpu": "3", "UUID": "GPU-a"}) == ("3", "GPU-a")
    assert gpu_of({"gpu": "3", "uuid": "GPU-b"}) == ("3", "GPU-b")
    assert gpu_of({"gpu": "3", "gpu_uuid": "GPU-c"}) == ("3", "GPU-c")
    assert gpu_of({}) == (None, None)


def test_series_of_unknown_hosts_are_counted_and_left_out() -> None:
    namer = NodeNamer()
    samples = [({"Hostname": "gpu01", "gpu": "0"}, 1.0), ({"Hostname": "stranger", "gpu": "0"}, 79.0),
               ({"job": "no host"}, 1.0)]
    placed, unknown = locate(samples, namer, NODES)
    assert [p.node for p in placed] == ["gpu01"]
    assert unknown == 2


# -- the tracker --------------------------------------------------------------------------------------------
def test_a_stale_xid_at_start_is_a_baseline_and_a_change_fires_once() -> None:
    tracker = SignalTracker()
    assert tracker.observe("xid", [located("gpu01", 3, 48.0)], at=1.0).signals == ()
    assert tracker.observe("xid", [located("gpu01", 3, 48.0)], at=2.0).signals == ()
    (fired,) = tracker.observe("xid", [located("gpu01", 3, 79.0, err_msg="GPU has fallen off the bus")],
                               at=3.0).signals
    assert (fired.node, fired.gpu, fired.gpu_uuid, fired.code, fired.strength, fired.kind) == (
        "gpu01", "3", fake_uuid("gpu01", 3), "xid_79", Strength.FAULT, "event")
    assert fired.detail == f"xid 79 (GPU has fallen off the bus) on gpu 3 ({fake_uuid('gpu01', 3)})"
    assert tracker.observe("xid", [located("gpu01", 3, 79.0)], at=4.0).signals == ()


@pytest.mark.parametrize(("xid", "strength"), [(13, Strength.IGNORED), (31, Strength.IGNORED),
                                                (94, Strength.HINT), (92, Strength.HINT), (48, Strength.FAULT)])
def test_xid_classes(xid: int, strength: Strength) -> None:
    tracker = SignalTracker()
    tracker.observe("xid", [located("gpu01", 0, 0.0)], at=1.0)
    (fired,) = tracker.observe("xid", [located("gpu01", 0, float(xid))], at=2.0).signals
    assert fired.strength is strength and fired.code == f"xid_{xid}"


def test_the_gauge_going_back_to_zero_is_no_event() -> None:
    tracker = SignalTracker()
    tracker.observe("xid", [located("gpu01", 0, 79.0)], at=1.0)
    assert tracker.observe("xid", [located("gpu01", 0, 0.0)], at=2.0).signals == ()
    (again,) = tracker.observe("xid", [located("gpu01", 0, 79.0)], at=3.0).signals
    assert again.code == "xid_79"


def count(node: str, gpu: int, value: float, xid: int | None) -> Located:
    labels = {"__name__": "DCGM_EXP_XID_ERRORS_COUNT", "window_size_in_ms": "300000"}
    if xid is not None:
        labels["xid"] = str(xid)
    return located(node, gpu, value, **labels)


def test_the_count_series_increases_fire_per_xid_and_the_gauge_is_not_used() -> None:
    tracker = SignalTracker()
    assert tracker.observe("xid", [count("gpu01", 0, 2, 79), located("gpu01", 0, 79.0)], at=1.0).signals == ()
    # the same XID again: the gauge cannot see it (same value), the count can
    (fired,) = tracker.observe("xid", [count("gpu01", 0, 3, 79), located("gpu01", 0, 79.0)], at=2.0).signals
    assert fired.code == "xid_79" and fired.value == 1.0 and fired.strength is Strength.FAULT
    # the window slides (the count goes down, then its series goes): no event; it comes back: an event
    assert tracker.observe("xid", [count("gpu01", 0, 1, 79), located("gpu01", 0, 79.0)], at=3.0).signals == ()
    assert tracker.observe("xid", [count("gpu01", 0, 0, None), located("gpu01", 0, 79.0)], at=4.0).signals == ()
    (back,) = tracker.observe("xid", [count("gpu01", 0, 1, 79), located("gpu01", 0, 79.0)], at=5.0).signals
    assert back.code == "xid_79"
    fired13 = tracker.observe("xid", [count("gpu01", 0, 1, 79), count("gpu01", 0, 1, 13),
                                      located("gpu01", 0, 13.0)], at=6.0).signals
    assert [(f.code, f.strength) for f in fired13] == [("xid_13", Strength.IGNORED)]


def test_counters_fire_on_increase_and_a_reset_is_no_event() -> None:
    tracker = SignalTracker()
    assert tracker.observe("ecc_dbe", [located("gpu01", 1, 4.0)], at=1.0).signals == ()
    (dbe,) = tracker.observe("ecc_dbe", [located("gpu01", 1, 6.0)], at=2.0).signals
    assert (dbe.code, dbe.strength, dbe.value, dbe.kind) == ("ecc_dbe", Strength.FAULT, 2.0, "event")
    assert tracker.observe("ecc_dbe", [located("gpu01", 1, 0.0)], at=3.0).signals == ()  # reset
    assert tracker.observe("ecc_dbe", [located("gpu01", 1, 0.0)], at=4.0).signals == ()
    (rows,) = [*tracker.observe("uncorrectable_remapped_rows", [located("gpu01", 0, 0.0)], at=1.0).signals,
               *tracker.observe("uncorrectable_remapped_rows", [located("gpu01", 0, 1.0)], at=2.0).signals]
    assert (rows.code, rows.strength) == ("uncorrectable_remapped_rows", Strength.HINT)
    assert "reset pending" in rows.detail
    nv = "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL"
    tracker.observe("nvlink_errors", [located("gpu01", 0, 5.0, __name__=nv)], at=1.0)
    (link,) = tracker.observe("nvlink_errors", [located("gpu01", 0, 9.0, __name__=nv)], at=2.0).signals
    assert (link.code, link.strength, link.value) == ("nvlink_replay", Strength.HINT, 4.0)


def test_levels_fire_every_poll_while_they_hold_even_at_start() -> None:
    tracker = SignalTracker()
    for at in (1.0, 2.0):
        (failure,) = tracker.observe("row_remap_failure", [located("gpu01", 2, 1.0), located("gpu01", 3, 0.0)],
                                     at=at).signals
        assert (failure.code, failure.strength, failure.kind, failure.gpu) == (
            "row_remap_failure", Strength.FAULT, "level", "2")
    (pending,) = tracker.observe("row_remap_pending", [located("gpu02", 0, 1.0)], at=1.0).signals
    assert pending.strength is Strength.HINT
    assert tracker.observe("row_remap_failure", [located("gpu01", 2, 0.0)], at=3.0).signals == ()


@pytest.mark.parametrize(("mask", "code"), [(0x1, None), (0x4, None), (0x8, "throttle_hw_slowdown"),
                                            (0x48, "throttle_thermal"), (0x20, "throttle_thermal"),
                                            (0x88, "throttle_power_brake")])
def test_throttle_bits(mask: int, code: str | None) -> None:
    observed = SignalTracker().observe("throttle", [located("gpu01", 0, float(mask))], at=1.0)
    assert [s.code for s in observed.signals] == ([code] if code else [])
    if code:
        assert observed.signals[0].strength is Strength.HINT and f"0x{mask:x}" in observed.signals[0].detail


def test_a_bitmask_that_is_no_integer_is_a_bad_value() -> None:
    observed = SignalTracker().observe("throttle", [located("gpu01", 0, 0.5), located("gpu01", 1, -8.0)], at=1.0)
    assert observed.signals == () and observed.bad_values == 2


def test_health_warn_is_a_hint_and_fail_a_fault() -> None:
    tracker = SignalTracker()

    def health(gpu: int, watch: str, value: float, code: str) -> Located:
        return located("gpu01", gpu, value, health_watch=watch, health_error_code=code)

    signals = tracker.observe("health", [health(0, "MEM", 0, "DCGM_FR_OK"),
                                         health(0, "PCIE", 10, "DCGM_FR_PCI_REPLAY_RATE"),
                                         health(1, "MEM", 20, "DCGM_FR_VOLATILE_DBE_DETECTED"),
                                         health(1, "PCIE", 10, "DCGM_FR_PCI_REPLAY_RATE")], at=1.0).signals
    by_gpu = {s.gpu: s for s in signals}
    assert (by_gpu["0"].code, by_gpu["0"].strength) == ("health_warn", Strength.HINT)
    assert (by_gpu["1"].code, by_gpu["1"].strength) == ("health_fail", Strength.FAULT)
    assert "MEM fail (DCGM_FR_VOLATILE_DBE_DETECTED)" in by_gpu["1"].detail


def test_a_node_healthd_forgets_starts_from_a_baseline_again() -> None:
    tracker = SignalTracker()
    tracker.observe("xid", [located("gpu01", 0, 0.0)], at=1.0)
    tracker.forget({"gpu01"})
    assert tracker.observe("xid", [located("gpu01", 0, 79.0)], at=2.0).signals == ()


# -- a poll (a fake client standing in for the HTTP client) --------------------------------------------------
class Answers:
    """Answers per query: bytes, or an exception to raise."""

    def __init__(self, settings: PassiveSettings) -> None:
        self.by_query = {getattr(settings.queries, s): answer() for s in SIGNALS}
        self.queries: list[str] = []

    def query(self, promql: str) -> bytes:
        self.queries.append(promql)
        reply = self.by_query[promql]
        if isinstance(reply, Exception):
            raise reply
        return reply


def source(**settings: Any) -> tuple[PassiveSource, Answers, PassiveSettings]:
    off = {"fabric": {"enabled": False}, "activity": {"enabled": False}, "pcie": {"enabled": False}}
    s = PassiveSettings(prometheus_url="http://prometheus.test:9090", **(off | settings))
    fake = Answers(s)
    return PassiveSource(s, client=fake), fake, s


def test_one_query_per_signal_per_poll_and_what_a_poll_says() -> None:
    src, fake, s = source()
    xid_q = s.queries.xid
    fake.by_query[xid_q] = answer(series("DCGM_FI_DEV_XID_ERRORS", "gpu01", 0, "48"),
                                  series("DCGM_FI_DEV_XID_ERRORS", "gpu02", 0, "0", host_label="hostname"),
                                  series("DCGM_FI_DEV_XID_ERRORS", "elsewhere", 0, "0"))
    fake.by_query[s.queries.pcie_replay] = answer(series("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "gpu01", 0, "NaN"))
    first = src.poll(NODES, now=100.0)
    assert len(fake.queries) == len(SIGNALS)
    assert first.up and first.signals == ()
    assert first.covered == {"gpu01", "gpu02"}
    assert first.unknown_series == 1
    assert "ecc_dbe" in first.unavailable and "xid" not in first.unavailable and "pcie_replay" not in first.unavailable
    assert error_signals(first) == {"pcie_replay": 1}
    fake.by_query[xid_q] = answer(series("DCGM_FI_DEV_XID_ERRORS", "gpu01", 0, "48"),
                                  series("DCGM_FI_DEV_XID_ERRORS", "gpu02", 0, "79", host_label="hostname"))
    second = src.poll(NODES, now=160.0)
    assert [(x.node, x.code, x.strength, x.at) for x in second.signals] == [("gpu02", "xid_79", Strength.FAULT, 160.0)]


def test_a_failed_query_is_its_signals_error_and_all_failing_is_down() -> None:
    src, fake, s = source()
    fake.by_query[s.queries.ecc_dbe] = PassiveQueryError("HTTP 500 Internal Server Error")
    poll = src.poll(NODES, now=1.0)
    assert poll.up and poll.failed == ("ecc_dbe",)
    assert poll.errors == ("ecc_dbe: HTTP 500 Internal Server Error",)
    for q in list(fake.by_query):
        fake.by_query[q] = PassiveQueryError("cannot reach http://prometheus.test:9090: Connection refused")
    down = src.poll(NODES, now=2.0)
    assert not down.up and set(down.failed) == set(SIGNALS) and len(down.errors) == len(SIGNALS)


def test_garbage_answers_never_raise() -> None:
    src, fake, s = source()
    fake.by_query[s.queries.xid] = b"\xff\xfe garbage"
    fake.by_query[s.queries.health] = answer(series("DCGM_EXP_GPU_HEALTH_STATUS", "gpu01", 0, "20"))
    poll = src.poll(NODES, now=1.0)
    assert "xid" in poll.failed and [x.code for x in poll.signals] == ["health_fail"]


def test_a_failed_query_keeps_the_previous_values() -> None:
    src, fake, s = source()
    fake.by_query[s.queries.xid] = answer(series("DCGM_FI_DEV_XID_ERRORS", "gpu01", 0, "0"))
    src.poll(NODES, now=1.0)
    fake.by_query[s.queries.xid] = PassiveQueryError("no answer within 10 s")
    assert src.poll(NODES, now=2.0).signals == ()
    fake.by_query[s.queries.xid] = answer(series("DCGM_FI_DEV_XID_ERRORS", "gpu01", 0, "79"))
    assert [x.code for x in src.poll(NODES, now=3.0).signals] == ["xid_79"]


def test_node_mapping_from_the_config() -> None:
    src, fake, s = source(node_regex=r"^([^.]+)\.cluster\.example$", node_replacement=r"\1")
    fake.by_query[s.queries.row_remap_failure] = answer(
        series("DCGM_FI_DEV_ROW_REMAP_FAILURE", "gpu01.cluster.example", 0, "1"))
    (signal,) = src.poll(NODES, now=1.0).signals
    assert signal.node == "gpu01" and signal.code == "row_remap_failure"
