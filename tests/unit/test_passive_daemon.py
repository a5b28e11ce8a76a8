"""The daemon's ``passive`` job: a poll with the nodes the store knows, its metrics, ``/healthz``, the judge's hook."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import generate_latest

from healthd.config import Settings
from healthd.daemon import Daemon
from healthd.passive.client import PassiveQueryError
from healthd.passive.model import SIGNALS, PassivePoll
from healthd.passive.source import PassiveSource
from tests.fakes.slurm import FakeSlurmClient, fake_backend, gpu_node


def vector(*result: tuple[dict[str, str], str]) -> bytes:
    return json.dumps({"status": "success", "data": {"resultType": "vector", "result": [
        {"metric": m, "value": [0, v]} for m, v in result]}}).encode()


class FakePrometheus:
    """Stands in for the HTTP client: one answer (or error) per query."""

    def __init__(self, settings: Settings) -> None:
        self.q = settings.passive.queries
        self.answers: dict[str, bytes | Exception] = {getattr(self.q, s): vector() for s in SIGNALS}
        f = settings.passive.fabric
        self.answers |= {q: vector() for q in (f.counters, f.present, f.links, f.physical, f.boot,
                                                settings.passive.activity.query, settings.passive.pcie.query)}
        self.asked = 0

    def query(self, promql: str) -> bytes:
        self.asked += 1
        answer = self.answers[promql]
        if isinstance(answer, Exception):
            raise answer
        return answer


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[tuple[Daemon, FakePrometheus, list[PassivePoll]]]:
    settings = Settings(backend="slurm", state_dir=tmp_path / "state", http={"host": "127.0.0.1", "port": 0},
                        passive={"prometheus_url": "http://prometheus.test:9090"})
    fake = FakeSlurmClient([gpu_node("gpu01"), gpu_node("gpu02")])
    d = Daemon(settings, None, backend=fake_backend(fake, settings.results_dir))
    prom = FakePrometheus(settings)
    assert d.passive is not None
    d.passive = PassiveSource(settings.passive, client=prom)
    judged: list[PassivePoll] = []
    d.judge_passive = judged.append  # type: ignore[method-assign]
    yield d, prom, judged
    d.http._server.server_close()
    d.store.close()


def healthz(d: Daemon) -> str:
    return d.healthy()[1].rsplit("; ", 1)[-1]


def scrape(d: Daemon) -> str:
    return generate_latest(d.registry).decode()


def test_off_without_a_url(tmp_path: Path) -> None:
    settings = Settings(backend="local", state_dir=tmp_path / "state", http={"host": "127.0.0.1", "port": 0})
    d = Daemon(settings, None)
    try:
        assert d.passive is None
        assert healthz(d) == "passive signals: off"
        assert "healthd_passive_up" not in scrape(d)
        d.poll_passive()
    finally:
        d.http._server.server_close()
        d.store.close()


def test_a_poll_with_the_stores_nodes_its_metrics_healthz_and_the_judge(
        daemon: tuple[Daemon, FakePrometheus, list[PassivePoll]]) -> None:
    d, prom, judged = daemon
    assert healthz(d) == "passive signals: not polled yet"
    d.discover()
    xid = {"__name__": "DCGM_FI_DEV_XID_ERRORS", "gpu": "3", "UUID": "GPU-3", "Hostname": "gpu01"}
    prom.answers[prom.q.xid] = vector((xid, "13"), ({**xid, "Hostname": "stranger"}, "0"))
    d.poll_passive()
    assert prom.asked == len(SIGNALS) + 7  # and [passive.fabric]'s five, [passive.activity]'s, [passive.pcie]'s
    assert len(judged) == 1 and judged[0].up and judged[0].covered == {"gpu01"}
    text = scrape(d)
    assert "healthd_passive_up 1.0" in text
    assert 'healthd_passive_signal_available{signal="xid"} 1.0' in text
    assert 'healthd_passive_signal_available{signal="ecc_dbe"} 0.0' in text
    assert "healthd_passive_unknown_series_total 1.0" in text
    assert healthz(d).startswith("passive signals up: 1 nodes covered, unavailable: row_remap_failure")
    prom.answers[prom.q.xid] = vector((xid, "79"))
    d.poll_passive()
    (fired,) = judged[-1].signals
    assert (fired.node, fired.gpu_uuid, fired.code) == ("gpu01", "GPU-3", "xid_79")


def test_prometheus_down_is_shown_counted_and_not_a_tick_failure(
        daemon: tuple[Daemon, FakePrometheus, list[PassivePoll]]) -> None:
    d, prom, judged = daemon
    for query in prom.answers:
        prom.answers[query] = PassiveQueryError("cannot reach http://prometheus.test:9090: Connection refused")
    d._tick("passive", d.poll_passive)()
    assert "passive" not in d._failing
    assert healthz(d) == "passive signals down: xid: cannot reach http://prometheus.test:9090: Connection refused"
    text = scrape(d)
    assert "healthd_passive_up 0.0" in text
    assert 'healthd_passive_query_errors_total{signal="health"} 1.0' in text
    assert not judged[-1].up
    prom.answers = {getattr(prom.q, s): vector() for s in SIGNALS}
    d.poll_passive()
    assert "healthd_passive_up 1.0" in scrape(d)


def test_the_passive_job_is_scheduled_at_its_interval(daemon: tuple[Daemon, FakePrometheus, Any]) -> None:
    d, _, _ = daemon
    d.start()
    try:
        job = d.scheduler.get_job("passive")
        assert job is not None and job.trigger.interval.total_seconds() == 60
    finally:
        d.scheduler.shutdown(wait=False)
        d.http.stop()


def test_every_passive_family_is_in_the_metrics_catalogue(
        daemon: tuple[Daemon, FakePrometheus, list[PassivePoll]]) -> None:
    d, _, _ = daemon
    d.poll_passive()
    catalogue = (Path(__file__).resolve().parents[2] / "docs" / "metrics.md").read_text()
    families = {line.split()[2] for line in scrape(d).splitlines()
                if line.startswith("# TYPE healthd_passive") and not line.split()[2].endswith("_created")}
    assert len(families) == 5
    assert {f for f in families if f"`{f}`" not in catalogue} == set()
