"""The HTTP endpoint under hostile or heavy use: methods, auth, TLS, idle and slow connections, many scrapers."""

from __future__ import annotations

import base64
import contextlib
import gzip
import http.client
import io
import json
import resource
import shutil
import socket
import ssl
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import bcrypt
import pytest
from prometheus_client import CollectorRegistry, Counter

from healthd.errors import ConfigError
from healthd.http import ExpositionCache, HttpApp, HttpServer
from healthd.metrics import Exposition
from healthd.model import Node, Outcome, Verdict
from healthd.store import Store
from healthd.webconfig import BasicAuth, load_web_config
from probes.result import Measurement, ProbeResult

ServerFactory = Callable[..., HttpServer]


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[ServerFactory]:
    servers: list[HttpServer] = []
    store = Store(tmp_path / "s.sqlite")

    def start(*, auth: BasicAuth | None = None, tls: ssl.SSLContext | None = None, **kwargs: object) -> HttpServer:
        registry = CollectorRegistry()
        Counter("healthd_test_total", "a counter", registry=registry).inc()
        app = HttpApp(registry, store, lambda: (True, "ok"), auth=auth)
        server = HttpServer(app, "127.0.0.1", 0, tls=tls, **kwargs)  # type: ignore[arg-type]
        server.start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()
    store.close()


def request(port: int, method: str = "GET", path: str = "/metrics", headers: dict[str, str] | None = None,
            context: ssl.SSLContext | None = None, timeout: float = 5.0) -> tuple[int, dict[str, str], bytes]:
    conn: http.client.HTTPConnection
    if context is not None:
        conn = http.client.HTTPSConnection("127.0.0.1", port, timeout=timeout, context=context)
    else:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request(method, path, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


def test_stop_without_start(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.sqlite")
    HttpServer(HttpApp(CollectorRegistry(), store, lambda: (True, "ok")), "127.0.0.1", 0).stop()
    store.close()


def test_get_and_head(serve: ServerFactory) -> None:
    port = serve().port
    status, headers, body = request(port)
    assert status == 200 and b"healthd_test_total 1.0" in body
    status, head_headers, head_body = request(port, "HEAD")
    assert status == 200 and head_body == b""
    assert head_headers["content-length"] == headers["content-length"]
    assert request(port, path="/healthz")[0] == 200


@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE", "PATCH", "OPTIONS"])
@pytest.mark.parametrize("path", ["/metrics", "/healthz", "/api/v1/nodes"])
def test_other_methods_are_refused(serve: ServerFactory, method: str, path: str) -> None:
    status, headers, _ = request(serve().port, method, path)
    assert status == 405
    assert headers["allow"] == "GET, HEAD"


def test_an_endless_request_line_is_refused(serve: ServerFactory) -> None:
    port = serve().port
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        with contextlib.suppress(OSError):
            sock.sendall(b"GET /" + b"a" * 70_000)
        assert sock.recv(100).startswith(b"HTTP/1.0 414")
    assert request(port, path="/healthz")[0] == 200


def test_metrics_gzip_and_name_filter(serve: ServerFactory) -> None:
    port = serve().port
    status, headers, body = request(port, headers={"Accept-Encoding": "gzip"})
    assert status == 200 and headers["content-encoding"] == "gzip"
    assert b"healthd_test_total 1.0" in gzip.decompress(body)
    _, _, filtered = request(port, path="/metrics?name[]=nothing_like_this")
    assert b"healthd_test_total" not in filtered


def test_exposition_built_once_per_interval() -> None:
    registry = CollectorRegistry()
    counter = Counter("c_total", "c", registry=registry)
    now = [100.0]
    cache = ExpositionCache(registry, max_age_s=1.0, clock=lambda: now[0])
    first, ctype = cache.get(False)
    counter.inc()
    assert cache.get(False) == (first, ctype)
    assert gzip.decompress(cache.get(True)[0]) == first
    assert cache.builds == 1
    now[0] += 1.0
    assert b"c_total 1.0" in cache.get(False)[0]
    assert cache.builds == 2
    assert ctype.startswith("text/plain; version=0.0.4")


def test_exposition_rebuilt_after_a_store_commit(tmp_path: Path) -> None:
    registry = CollectorRegistry()
    counter = Counter("c_total", "c", registry=registry)
    store = Store(tmp_path / "s.sqlite")
    try:
        cache = ExpositionCache(registry, max_age_s=3600.0, version=store.data_version)
        assert b"c_total 0.0" in cache.get(False)[0]
        counter.inc()
        assert b"c_total 0.0" in cache.get(False)[0]
        store.bump_counter("x", {})
        assert b"c_total 1.0" in cache.get(False)[0]
        other = Store(tmp_path / "s.sqlite")
        counter.inc()
        other.bump_counter("x", {})
        other.close()
        assert b"c_total 2.0" in cache.get(False)[0]
    finally:
        store.close()


def _hash(password: str) -> str:
    return bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=4)).decode()


def _basic(user: str, password: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


def test_basic_auth(serve: ServerFactory, tmp_path: Path) -> None:
    web = tmp_path / "web.yml"
    web.write_text(f"basic_auth_users:\n  prometheus: '{_hash('s3cret')}'\n")
    port = serve(auth=BasicAuth(load_web_config(web).users)).port
    status, headers, _ = request(port)
    assert status == 401 and headers["www-authenticate"].startswith("Basic")
    assert request(port, headers=_basic("prometheus", "wrong"))[0] == 401
    assert request(port, headers=_basic("nobody", "s3cret"))[0] == 401
    assert request(port, headers={"Authorization": "Basic !!!"})[0] == 401
    assert request(port, headers=_basic("prometheus", "s3cret"))[0] == 200
    assert request(port, path="/healthz", headers=_basic("prometheus", "s3cret"))[0] == 200
    assert request(port, "POST", headers=_basic("prometheus", "s3cret"))[0] == 405


def _self_signed(tmp_path: Path) -> tuple[Path, Path]:
    if shutil.which("openssl") is None:
        pytest.skip("no openssl command")
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=localhost",
                    "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True, timeout=60)
    return cert, key


def test_tls_with_basic_auth(serve: ServerFactory, tmp_path: Path) -> None:
    _self_signed(tmp_path)
    web = tmp_path / "web.yml"
    web.write_text("tls_server_config:\n  cert_file: tls.crt\n  key_file: tls.key\n"
                   f"basic_auth_users:\n  prometheus: '{_hash('pw')}'\n")
    config = load_web_config(web)
    assert config.tls is not None
    port = serve(auth=BasicAuth(config.users), tls=config.tls.context()).port
    client = ssl.create_default_context(cafile=str(tmp_path / "tls.crt"))
    assert request(port, headers=_basic("prometheus", "pw"), context=client)[0] == 200
    assert request(port, headers=_basic("prometheus", "nope"), context=client)[0] == 401
    with pytest.raises((OSError, http.client.HTTPException)):
        request(port, timeout=2)
    assert request(port, path="/healthz", headers=_basic("prometheus", "pw"), context=client)[0] == 200


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("tls_server_config:\n  cert_file: a.crt\n", "needs cert_file and key_file"),
        ("tls_server_config:\n  cert_file: a.crt\n  key_file: a.key\n", "cannot load"),
        ("tls_server_config:\n  cert_file: a\n  key_file: b\n  cipher_suites: [x]\n", "unsupported"),
        ("basic_auth_users:\n  bob: plain-text\n", "not a bcrypt hash"),
        ("http_server_config:\n  http2: false\n", "unsupported key"),
        ("[1, 2", "not valid YAML"),
        ("- a\n", "mapping"),
    ],
)
def test_web_config_refused(tmp_path: Path, text: str, message: str) -> None:
    web = tmp_path / "web.yml"
    web.write_text(text)
    with pytest.raises(ConfigError, match=message):
        load_web_config(web)


def test_missing_web_config_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_web_config(tmp_path / "absent.yml")


def _raise_nofile(want: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < want:
        if hard != resource.RLIM_INFINITY and hard < want:
            pytest.skip(f"RLIMIT_NOFILE hard limit {hard} < {want}")
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))


def test_idle_connections_do_not_block_requests(serve: ServerFactory) -> None:
    _raise_nofile(4096)
    port = serve(workers=2).port
    idle: list[socket.socket] = []
    try:
        for _ in range(1000):
            idle.append(socket.create_connection(("127.0.0.1", port), timeout=5))
        started = time.monotonic()
        assert request(port)[0] == 200
        assert request(port, path="/healthz")[0] == 200
        assert time.monotonic() - started < 5
    finally:
        for sock in idle:
            sock.close()


def test_slow_clients_hold_no_worker_and_are_closed(serve: ServerFactory) -> None:
    port = serve(workers=1, request_timeout_s=1.0).port
    slow = []
    try:
        for _ in range(50):
            sock = socket.create_connection(("127.0.0.1", port), timeout=5)
            sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
            slow.append(sock)
        started = time.monotonic()
        assert request(port, path="/healthz")[0] == 200
        assert request(port)[0] == 200
        assert time.monotonic() - started < 1.0
        assert slow[0].recv(100) == b""  # closed once its request had not arrived within the timeout
        assert time.monotonic() - started < 3.0
    finally:
        for sock in slow:
            sock.close()


def test_many_concurrent_scrapers(serve: ServerFactory) -> None:
    port = serve().port
    errors: list[str] = []
    done = [0]
    lock = threading.Lock()
    stop = time.monotonic() + 3

    def scrape() -> None:
        while time.monotonic() < stop:
            try:
                status, _, body = request(port, headers={"Accept-Encoding": "gzip"}, timeout=10)
                ok = status == 200 and b"healthd_test_total" in gzip.decompress(body)
            except (OSError, http.client.HTTPException) as exc:
                ok, status = False, repr(exc)  # type: ignore[assignment]
            with lock:
                done[0] += 1
                if not ok:
                    errors.append(str(status))

    threads = [threading.Thread(target=scrape) for _ in range(50)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert done[0] >= 50


def test_check_config_and_the_daemon_validate_the_web_config(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    from healthd.cli import main
    from healthd.config import load_settings
    from healthd.daemon import Daemon

    web = tmp_path / "web.yml"
    config = tmp_path / "healthd.toml"
    config.write_text(f'backend = "local"\nstate_dir = "{tmp_path / "state"}"\n'
                      f'[http]\nhost = "127.0.0.1"\nport = 0\nweb_config_file = "{web}"\n')
    web.write_text("basic_auth_users:\n  prometheus: secret\n")
    assert main(["check-config", "--config", str(config)]) == 2
    assert "not a bcrypt hash" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="not a bcrypt hash"):
        Daemon(load_settings(config)[0], config)
    web.write_text(f"basic_auth_users:\n  prometheus: '{_hash('pw')}'\n")
    assert main(["check-config", "--config", str(config)]) == 0
    assert "web config OK" in capsys.readouterr().out
    daemon = Daemon(load_settings(config)[0], config)
    try:
        daemon.http.start()
        assert request(daemon.http.port, path="/healthz")[0] == 401
        assert request(daemon.http.port, path="/api/v1/runs", headers=_basic("prometheus", "pw"))[0] == 200
    finally:
        daemon.http.stop()
        daemon.store.close()


def api(app: HttpApp, path: str, query: str = "") -> tuple[str, Any]:
    status: list[str] = []
    environ = {"REQUEST_METHOD": "GET", "PATH_INFO": path, "QUERY_STRING": query, "wsgi.input": io.BytesIO()}
    body = b"".join(app(environ, lambda s, h, *a: status.append(s)))
    return status[0], json.loads(body)


@pytest.fixture
def fleet_app(tmp_path: Path) -> Iterator[HttpApp]:
    store = Store(tmp_path / "s.sqlite")
    store.upsert_nodes([Node(f"n{i:02d}", "idle" if i % 2 else "allocated", gpus=8, node_class="a" if i < 10 else "b")
                        for i in range(25)], 1.0)
    for i in (3, 4):
        store.add_run(run_id=f"r{i}", probe="nccl", nodes=[f"n{i:02d}"], backend="slurm", job_id=None,
                      submitted_at=10.0, result_path=None)
        store.finish_run(f"r{i}", outcome=Outcome.PASS, reason="", finished_at=20.0, result=ProbeResult(
            probe="nccl", run_id=f"r{i}", outcome=Outcome.PASS, started_at=10.0, finished_at=20.0,
            measurements=[Measurement(name="busbw_bytes_per_second", value=float(size), node=f"n{i:02d}",
                                      labels={"collective": "all_reduce", "size_bytes": str(size), "scope": "node"})
                          for size in (8192, 1 << 30)]))
    store.put_verdicts([Verdict("n03", "nccl", Outcome.PASS, reason_code="ok", at=20.0),
                        Verdict("n04", "nccl", Outcome.DEGRADED, "slow", "baseline_drift", ("r4",), at=20.0),
                        Verdict("n04", "nccl", Outcome.PASS, reason_code="ok", at=10.0)])
    yield HttpApp(CollectorRegistry(), store, lambda: (True, "ok"))
    store.close()


def test_nodes_are_paged_with_a_stable_cursor(fleet_app: HttpApp) -> None:
    names: list[str] = []
    query = "limit=10"
    while True:
        status, doc = api(fleet_app, "/api/v1/nodes", query)
        assert status == "200 OK" and len(doc["nodes"]) <= 10
        names += [n["name"] for n in doc["nodes"]]
        if doc["next_cursor"] is None:
            break
        query = f"limit=10&cursor={doc['next_cursor']}"
    assert names == [f"n{i:02d}" for i in range(25)]
    _, doc = api(fleet_app, "/api/v1/nodes")
    assert len(doc["nodes"]) == 25 and doc["next_cursor"] is None
    (n04,) = [n for n in doc["nodes"] if n["name"] == "n04"]
    assert [m["labels"]["size_bytes"] for m in n04["probes"]["nccl"]["measurements"]] == [str(1 << 30)]
    assert n04["verdicts"]["nccl"]["outcome"] == "degraded", "the newest verdict, not the last written"


def test_nodes_are_filtered(fleet_app: HttpApp) -> None:
    def names(query: str) -> list[str]:
        status, doc = api(fleet_app, "/api/v1/nodes", query)
        assert status == "200 OK", doc
        return [n["name"] for n in doc["nodes"]]

    assert names("node_class=a&state=idle") == ["n01", "n03", "n05", "n07", "n09"]
    assert names("verdict=degraded") == ["n04"]
    assert names("verdict=pass") == ["n03"]
    assert names("node_class=nothing") == []


@pytest.mark.parametrize(("query", "message"), [
    ("limit=0", "limit"), ("limit=100000", "limit"), ("limit=x", "limit"), ("cursor=%%%", "cursor"),
    ("verdict=great", "verdict"), ("colour=red", "unknown parameter"), ("state=idle&state=down", "state"),
])
def test_bad_parameters_are_refused_with_a_reason(fleet_app: HttpApp, query: str, message: str) -> None:
    status, doc = api(fleet_app, "/api/v1/nodes", query)
    assert status == "400 Bad Request" and message in doc["error"]


def test_one_node_in_full_detail(fleet_app: HttpApp) -> None:
    status, doc = api(fleet_app, "/api/v1/nodes/n04")
    assert status == "200 OK"
    assert sorted(m["labels"]["size_bytes"] for m in doc["probes"]["nccl"]["measurements"]) == ["1073741824", "8192"]
    assert doc["verdicts"]["nccl"]["reason_code"] == "baseline_drift"
    assert [r["run_id"] for r in doc["recent_runs"]] == ["r4"]
    assert doc["findings"] == []
    assert api(fleet_app, "/api/v1/nodes/n99")[0] == "404 Not Found"
    status, doc = api(fleet_app, "/api/v1/nodes/bad name!")
    assert status == "400 Bad Request" and "not a node name" in doc["error"]


def test_a_scrape_without_refresh_serves_what_the_last_refresh_built(tmp_path: Path) -> None:
    """The daemon refreshes the exposition after its ticks; a scrape then only joins bytes."""
    store = Store(tmp_path / "s.sqlite")
    exposition = Exposition(store, lambda: "slurm")
    cache = ExpositionCache(CollectorRegistry(), version=store.data_version, exposition=exposition, refresh=False)
    assert exposition.refresh_if_changed()
    assert b'node="n1"' not in cache.get(False)[0]
    store.upsert_nodes([Node("n1", "idle", gpus=8)], 1.0)
    assert b'node="n1"' not in cache.get(False)[0], "no refresh on a scrape"
    assert exposition.refresh_if_changed() and not exposition.refresh_if_changed()
    assert b'healthd_node_gpus{node="n1"} 8.0' in cache.get(False)[0]
    assert gzip.decompress(cache.get(True)[0]) == cache.get(False)[0]
    store.close()
