"""The HTTP endpoint: ``/metrics``, ``/healthz`` and the JSON API under ``/api/v1/``.

A small WSGI app (GET and HEAD only; optional basic auth) served by ``HttpServer``: one thread
accepts connections and reads each request's head without blocking (the TLS handshake too); a
fixed pool of workers answers complete requests. An idle or slow client holds no worker and is
closed when its request has not arrived within ``request_timeout_s``; an answer that takes longer
than twice that is cut off; a full pool answers 503 at once. ``/metrics`` is
built at most once per ``EXPOSITION_MAX_AGE_S`` or store commit and shared by concurrent scrapers.
"""

from __future__ import annotations

import contextlib
import errno
import gzip
import io
import json
import selectors
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, cast
from urllib.parse import parse_qs
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer

from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.exposition import choose_encoder, gzip_accepted

from healthd.errors import HealthdError
from healthd.logging import get_logger
from healthd.store import Store
from healthd.store.rows import Snapshot
from healthd.webconfig import BasicAuth

log = get_logger(__name__)

StartResponse = Callable[..., Any]
Environ = dict[str, Any]

EXPOSITION_MAX_AGE_S = 1.0
ALLOWED_METHODS = ("GET", "HEAD")
LISTEN_BACKLOG = 1024
MAX_QUEUED = 256
MAX_HEAD_BYTES = 64 * 1024
_ACCEPT_BATCH = 64


def nodes_document(snap: Snapshot) -> dict[str, Any]:
    """The ``/api/v1/nodes`` document (pure): each node, its last result per probe, its verdicts."""
    names = sorted({n.name for n in snap.nodes} | {lr.node for lr in snap.last_runs} | {v.node for v in snap.verdicts})
    nodes_by_name = {n.name: n for n in snap.nodes}
    out = []
    for name in names:
        node = nodes_by_name.get(name)
        probes: dict[str, Any] = {}
        for lr in snap.last_runs:
            if lr.node == name:
                probes[lr.probe] = {
                    "last_run_id": lr.last_run_id,
                    "last_outcome": lr.last_outcome.value,
                    "last_reason": lr.last_reason,
                    "last_run_at": lr.last_run_at,
                    "last_success_at": lr.last_success_at,
                    "measurements": [
                        {"name": m.name, "labels": m.labels, "value": m.value, "at": m.at, "run_id": m.run_id}
                        for m in snap.latest
                        if m.node == name and m.probe == lr.probe
                    ],
                }
        out.append(
            {
                "name": name,
                "state": node.state if node else None,
                "flags": sorted(node.flags) if node else [],
                "partitions": list(node.partitions) if node else [],
                "gpus": node.gpus if node else None,
                "node_class": node.node_class if node else None,
                "reason": node.reason if node else None,
                "probes": probes,
                "verdicts": {
                    v.probe: {"outcome": v.outcome.value, "reason": v.reason, "reason_code": v.reason_code,
                              "run_ids": list(v.run_ids), "at": v.at}
                    for v in snap.verdicts
                    if v.node == name
                },
            }
        )
    return {"taken_at": snap.taken_at, "nodes": out}


class ExpositionCache:
    """The ``/metrics`` body per content type (and its gzip), rebuilt when it is ``max_age_s`` old or
    ``version()`` (the store's data version) has changed since it was built.

    Concurrent scrapers wait for the one build in progress and share its bytes.
    """

    def __init__(self, registry: CollectorRegistry, max_age_s: float = EXPOSITION_MAX_AGE_S,
                 clock: Callable[[], float] = time.monotonic, version: Callable[[], object] = lambda: None) -> None:
        self._registry = registry
        self._max_age_s = max_age_s
        self._clock = clock
        self._version = version
        self._lock = threading.Lock()
        self._plain: dict[str, tuple[float, object, bytes]] = {}
        self._gzip: dict[str, tuple[float, bytes]] = {}
        self.builds = 0

    def get(self, accept: str, want_gzip: bool) -> tuple[bytes, str]:
        encoder, ctype = choose_encoder(accept)
        with self._lock:
            now, version = self._clock(), self._version()
            plain = self._plain.get(ctype)
            if plain is None or now - plain[0] >= self._max_age_s or plain[1] != version:
                plain = (now, version, encoder(self._registry))
                self._plain[ctype] = plain
                self.builds += 1
            if not want_gzip:
                return plain[2], ctype
            packed = self._gzip.get(ctype)
            if packed is None or packed[0] != plain[0]:
                packed = (plain[0], gzip.compress(plain[2], compresslevel=6))
                self._gzip[ctype] = packed
            return packed[1], ctype


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


class HttpApp:
    def __init__(
        self,
        registry: CollectorRegistry,
        store: Store,
        healthy: Callable[[], tuple[bool, str]],
        extra_routes: dict[str, Callable[[], Any]] | None = None,
        *,
        auth: BasicAuth | None = None,
    ) -> None:
        self._exposition = ExpositionCache(registry, version=store.data_version)
        self._metrics_filtered = make_wsgi_app(registry)
        self._store = store
        self._healthy = healthy
        self._auth = auth
        self._routes: dict[str, Callable[[], Any]] = {
            "/api/v1/nodes": lambda: nodes_document(self._store.snapshot()),
            "/api/v1/runs": self._runs,
            **(extra_routes or {}),
        }

    def _runs(self) -> Any:
        return {
            "runs": [
                {"run_id": r.run_id, "kind": r.kind.value, "probe": r.probe, "nodes": list(r.nodes),
                 "state": r.state,
                 "outcome": r.outcome.value if r.outcome else None, "reason": r.reason,
                 "submitted_at": r.submitted_at, "finished_at": r.finished_at, "duration_s": r.duration_s,
                 "job_id": r.job_id, "result_path": r.result_path}
                for r in self._store.recent_runs(limit=100)
            ]
        }

    def __call__(self, environ: Environ, start_response: StartResponse) -> Iterable[bytes]:
        method = environ.get("REQUEST_METHOD", "GET")
        if method not in ALLOWED_METHODS:
            return _reply(start_response, "405 Method Not Allowed", f"method {method} not allowed: use GET\n",
                          "text/plain", [("Allow", ", ".join(ALLOWED_METHODS))])
        if self._auth is not None and not self._auth.allows(environ.get("HTTP_AUTHORIZATION")):
            return _reply(start_response, "401 Unauthorized", "unauthorized\n", "text/plain",
                          [("WWW-Authenticate", 'Basic realm="healthd"')])
        body = self._answer(environ, start_response)
        return [] if method == "HEAD" else body

    def _answer(self, environ: Environ, start_response: StartResponse) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "/")
        if path == "/metrics":
            return self._metrics(environ, start_response)
        if path == "/healthz":
            ok, detail = self._healthy()
            return _reply(start_response, "200 OK" if ok else "503 Service Unavailable", detail + "\n", "text/plain")
        route = self._routes.get(path.rstrip("/") or "/")
        if route is None:
            return _reply(start_response, "404 Not Found", "not found: try /metrics, /healthz, /api/v1/nodes\n",
                          "text/plain")
        try:
            body = json.dumps(route(), indent=1, sort_keys=True)
        except HealthdError as exc:
            log.error("api_error", path=path, error=str(exc))
            return _reply(start_response, "500 Internal Server Error", json.dumps({"error": str(exc)}),
                          "application/json")
        return _reply(start_response, "200 OK", body, "application/json")

    def _metrics(self, environ: Environ, start_response: StartResponse) -> Iterable[bytes]:
        if "name[]" in parse_qs(environ.get("QUERY_STRING", "")):
            return self._metrics_filtered({**environ, "REQUEST_METHOD": "GET"}, start_response)  # type: ignore[no-any-return]
        want_gzip = gzip_accepted(environ.get("HTTP_ACCEPT_ENCODING", ""))
        data, ctype = self._exposition.get(environ.get("HTTP_ACCEPT", ""), want_gzip)
        headers = [("Content-Type", ctype), ("Content-Length", str(len(data)))]
        if want_gzip:
            headers.append(("Content-Encoding", "gzip"))
        start_response("200 OK", headers)
        return [data]


def _reply(start_response: StartResponse, status: str, body: str, ctype: str,
           extra: list[tuple[str, str]] | None = None) -> list[bytes]:
    data = body.encode()
    start_response(status, [("Content-Type", f"{ctype}; charset=utf-8"), ("Content-Length", str(len(data))),
                            *(extra or [])])
    return [data]


class _Server(WSGIServer):
    request_queue_size = LISTEN_BACKLOG
    allow_reuse_address = True


class _Server6(_Server):
    address_family = socket.AF_INET6


_BUSY = (b"HTTP/1.0 503 Service Unavailable\r\nContent-Type: text/plain\r\nContent-Length: 5\r\n"
         b"Retry-After: 1\r\nConnection: close\r\n\r\nbusy\n")


@dataclass
class _Conn:
    """A connection whose request head is still arriving."""

    sock: socket.socket
    addr: Any
    since: float
    head: bytearray = field(default_factory=bytearray)
    handshaken: bool = False

    def advance(self) -> bool | None:
        """Read what has arrived: True once the head is complete, False when the peer is gone, None to wait."""
        try:
            if not self.handshaken:
                cast(ssl.SSLSocket, self.sock).do_handshake()
                self.handshaken = True
            while True:
                chunk = self.sock.recv(16384)
                if not chunk:
                    return False
                self.head += chunk
                if b"\r\n\r\n" in self.head or b"\n\n" in self.head or len(self.head) > MAX_HEAD_BYTES:
                    return True
        except (BlockingIOError, ssl.SSLWantReadError, ssl.SSLWantWriteError):
            return None
        except OSError:
            return False


class _Request:
    """What the handler reads is the head already read; what it writes goes to the socket."""

    def __init__(self, sock: socket.socket, head: bytes) -> None:
        self._sock = sock
        self._head = head

    def makefile(self, mode: str = "rb", buffering: int = -1) -> io.BytesIO:
        """The request's reader (the handler writes through ``sendall``: ``wbufsize`` is 0)."""
        if "r" not in mode:
            raise ValueError(f"the request is read-only through makefile, not {mode!r}")
        return io.BytesIO(self._head)

    def settimeout(self, value: float | None) -> None:
        self._sock.settimeout(value)

    def sendall(self, data: bytes) -> None:
        self._sock.sendall(data)

    def fileno(self) -> int:
        return self._sock.fileno()


class HttpServer:
    """Serves ``app`` on ``host:port`` in a background thread; ``port=0`` picks a free one.

    ``workers`` threads answer requests, at most ``MAX_QUEUED`` wait for one (more are answered 503);
    at most ``max_connections`` connections wait for their request (the oldest is closed beyond that).
    """

    def __init__(self, app: HttpApp, host: str, port: int, *, tls: ssl.SSLContext | None = None, workers: int = 8,
                 request_timeout_s: float = 10.0, max_connections: int = 4096) -> None:
        server_class = _Server6 if ":" in host else _Server
        try:
            self._server = server_class((host, port), _QuietHandler)
        except OSError as exc:
            raise HealthdError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
        self._server.set_app(app)
        if tls is not None:
            self._server.base_environ["HTTPS"] = "on"
        self._server.socket.setblocking(False)
        self.port = self._server.server_port
        self._tls = tls
        self._timeout_s = request_timeout_s
        self._max_connections = max_connections
        self._slots = threading.BoundedSemaphore(workers + MAX_QUEUED)
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="http")
        self._active: dict[socket.socket, float] = {}
        self._active_lock = threading.Lock()
        self._stopping = threading.Event()
        self._warned_at = -1e9
        self._thread = threading.Thread(target=self._serve, name="http", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        if self._thread.ident is not None:
            self._thread.join(timeout=5)
        self._pool.shutdown(wait=False, cancel_futures=True)
        with self._active_lock:
            for conn in self._active:
                _cut(conn)
        self._server.server_close()

    def _serve(self) -> None:
        listener = self._server.socket
        waiting: dict[socket.socket, _Conn] = {}
        with selectors.DefaultSelector() as sel:
            sel.register(listener, selectors.EVENT_READ, None)
            while not self._stopping.is_set():
                for key, _ in sel.select(timeout=0.25):
                    if key.data is None:
                        self._accept(listener, sel, waiting)
                        continue
                    conn: _Conn = key.data
                    done = conn.advance()
                    if done is None:
                        continue
                    sel.unregister(conn.sock)
                    del waiting[conn.sock]
                    if done:
                        self._dispatch(conn)
                    else:
                        conn.sock.close()
                self._expire(sel, waiting)
            for conn in waiting.values():
                conn.sock.close()

    def _accept(self, listener: socket.socket, sel: selectors.BaseSelector,
                waiting: dict[socket.socket, _Conn]) -> None:
        for _ in range(_ACCEPT_BATCH):
            try:
                sock, addr = listener.accept()
            except BlockingIOError:
                return
            except OSError as exc:
                if time.monotonic() - self._warned_at > 10:
                    self._warned_at = time.monotonic()
                    log.warning("http_accept_failed", error=str(exc), waiting=len(waiting))
                if exc.errno in (errno.EMFILE, errno.ENFILE) and waiting:
                    self._close_oldest(sel, waiting, max(1, len(waiting) // 10))
                    continue
                time.sleep(0.05)
                return
            if len(waiting) >= self._max_connections:
                self._close_oldest(sel, waiting, 1)
            sock.setblocking(False)
            if self._tls is not None:
                try:
                    sock = self._tls.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
                except (OSError, ValueError):
                    sock.close()
                    continue
            conn = _Conn(sock, addr, time.monotonic(), handshaken=self._tls is None)
            waiting[sock] = conn
            sel.register(sock, selectors.EVENT_READ, conn)

    @staticmethod
    def _close_oldest(sel: selectors.BaseSelector, waiting: dict[socket.socket, _Conn], n: int) -> None:
        for sock in list(waiting)[:n]:
            sel.unregister(sock)
            del waiting[sock]
            sock.close()

    def _expire(self, sel: selectors.BaseSelector, waiting: dict[socket.socket, _Conn]) -> None:
        now = time.monotonic()
        stale = [sock for sock, conn in waiting.items() if now - conn.since > self._timeout_s]
        for sock in stale:
            sel.unregister(sock)
            del waiting[sock]
            sock.close()
        with self._active_lock:
            for sock, since in self._active.items():
                if now - since > 2 * self._timeout_s:
                    _cut(sock)

    def _dispatch(self, conn: _Conn) -> None:
        if not self._slots.acquire(blocking=False):
            with contextlib.suppress(OSError, ValueError):
                conn.sock.send(_BUSY)
            conn.sock.close()
            return
        try:
            self._pool.submit(self._handle, conn)
        except RuntimeError:
            self._slots.release()
            conn.sock.close()

    def _handle(self, conn: _Conn) -> None:
        sock = conn.sock
        with self._active_lock:
            self._active[sock] = time.monotonic()
        try:
            sock.settimeout(self._timeout_s)
            request = cast(socket.socket, _Request(sock, bytes(conn.head)))
            self._server.finish_request(request, conn.addr)
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_WR)
        except (OSError, ValueError) as exc:
            log.debug("http_connection_failed", peer=str(conn.addr), error=str(exc))
        finally:
            with self._active_lock:
                self._active.pop(sock, None)
            sock.close()
            self._slots.release()


def _cut(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
