"""The Prometheus client of the passive source against a local HTTP server: answers, errors, limits, auth."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

import pytest

from healthd.config import PassiveSettings
from healthd.passive.client import PassiveQueryError, PrometheusClient
from healthd.passive.model import SIGNALS
from healthd.passive.source import PassiveSource, error_signals

OK = json.dumps({"status": "success", "data": {"resultType": "vector", "result": []}}).encode()


class Server:
    """A local HTTP server; ``reply`` decides each answer (it sees the handler)."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.reply: Callable[[BaseHTTPRequestHandler], None] = lambda h: send(h, 200, OK)
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                server.requests.append({"path": self.path, "headers": dict(self.headers),
                                        "form": parse_qs(body.decode())})
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                    server.reply(self)

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"


def send(handler: BaseHTTPRequestHandler, code: int, body: bytes, length: int | None = None) -> None:
    handler.send_response(code)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(body) if length is None else length))
    handler.end_headers()
    handler.wfile.write(body)


@pytest.fixture
def server() -> Iterator[Server]:
    s = Server()
    yield s
    s.httpd.shutdown()
    s.httpd.server_close()


def client(server: Server, **settings: Any) -> PrometheusClient:
    return PrometheusClient(PassiveSettings(prometheus_url=server.url, **settings))


def test_a_query_is_posted_with_its_timeout(server: Server) -> None:
    assert client(server, timeout_s=7).query("DCGM_FI_DEV_XID_ERRORS") == OK
    (request,) = server.requests
    assert request["path"] == "/api/v1/query"
    assert request["form"] == {"query": ["DCGM_FI_DEV_XID_ERRORS"], "timeout": ["7s"]}
    assert "Authorization" not in request["headers"]


def test_a_path_prefix_is_kept(server: Server) -> None:
    PrometheusClient(PassiveSettings(prometheus_url=server.url + "/prometheus/")).query("up")
    assert server.requests[0]["path"] == "/prometheus/api/v1/query"


def test_basic_auth_header(server: Server, tmp_path: Path) -> None:
    password = tmp_path / "password"
    password.write_text("s3cret\n")
    client(server, username="healthd", password_file=password).query("up")
    assert server.requests[0]["headers"]["Authorization"] == "Basic aGVhbHRoZDpzM2NyZXQ="  # healthd:s3cret


def test_bearer_token_read_at_each_query(server: Server, tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("abc\n")
    c = client(server, bearer_token_file=token)
    c.query("up")
    token.write_text("rotated")
    c.query("up")
    assert [r["headers"]["Authorization"] for r in server.requests] == ["Bearer abc", "Bearer rotated"]


def test_an_unreadable_token_file_is_a_query_error(server: Server, tmp_path: Path) -> None:
    with pytest.raises(PassiveQueryError, match="cannot read the bearer_token_file"):
        client(server, bearer_token_file=tmp_path / "missing").query("up")


def test_http_500_with_prometheus_error_text(server: Server) -> None:
    body = json.dumps({"status": "error", "errorType": "internal",
                       "error": "query processing would load too many samples"})
    server.reply = lambda h: send(h, 500, body.encode())
    with pytest.raises(PassiveQueryError, match=r"HTTP 500 .*too many samples"):
        client(server).query("up")


def test_an_answer_after_the_timeout(server: Server) -> None:
    def slow(h: BaseHTTPRequestHandler) -> None:
        time.sleep(1.5)
        send(h, 200, OK)

    server.reply = slow
    started = time.monotonic()
    with pytest.raises(PassiveQueryError, match=r"within 0\.5 s"):
        client(server, timeout_s=0.5).query("up")
    assert time.monotonic() - started < 1.4


def test_an_answer_dripping_past_the_deadline_is_cut_off(server: Server) -> None:
    def drip(h: BaseHTTPRequestHandler) -> None:
        h.send_response(200)
        h.send_header("Content-Length", "100000")
        h.end_headers()
        for _ in range(40):
            h.wfile.write(b" ")
            h.wfile.flush()
            time.sleep(0.05)

    server.reply = drip
    with pytest.raises(PassiveQueryError, match=r"no complete answer within 0\.5 s"):
        client(server, timeout_s=0.5).query("up")


def test_a_50_mb_answer_is_refused(server: Server) -> None:
    big = b" " * (50 * 1000 * 1000)
    server.reply = lambda h: send(h, 200, big)
    with pytest.raises(PassiveQueryError, match=r"more than passive\.max_response_bytes"):
        client(server).query("up")

    def chunked(h: BaseHTTPRequestHandler) -> None:  # no Content-Length: cut off while reading
        h.send_response(200)
        h.end_headers()
        for _ in range(50):
            h.wfile.write(b" " * 1_000_000)

    server.reply = chunked
    with pytest.raises(PassiveQueryError, match=r"longer than passive\.max_response_bytes"):
        client(server).query("up")


def test_nothing_listening(tmp_path: Path) -> None:
    c = PrometheusClient(PassiveSettings(prometheus_url="http://127.0.0.1:1"))
    with pytest.raises(PassiveQueryError, match=r"cannot reach http://127\.0\.0\.1:1"):
        c.query("up")


def test_a_missing_ca_file_is_a_query_error(tmp_path: Path) -> None:
    c = PrometheusClient(PassiveSettings(prometheus_url="https://127.0.0.1:1", tls={"ca_file": tmp_path / "ca.pem"}))
    with pytest.raises(PassiveQueryError, match="TLS setup"):
        c.query("up")


@pytest.mark.parametrize("reply", [
    lambda h: send(h, 500, b"oops"),
    lambda h: send(h, 200, b"{bad json"),
    lambda h: send(h, 200, b" " * (50 * 1000 * 1000)),
])
def test_each_bad_answer_is_one_error_per_signal_and_a_poll_never_raises(
        server: Server, reply: Callable[[BaseHTTPRequestHandler], None]) -> None:
    server.reply = reply
    poll = PassiveSource(PassiveSettings(prometheus_url=server.url)).poll({"gpu01"}, now=1.0)
    assert not poll.up
    parts = ("ib_counters", "ib_present", "ib_links", "ib_physical", "ib_boot",  # [passive.fabric]
             "activity", "pcie")  # [passive.activity], [passive.pcie]
    assert error_signals(poll) == dict.fromkeys(SIGNALS, 1) | dict.fromkeys(parts, 1)
