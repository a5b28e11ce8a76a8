"""The HTTP endpoint: ``/metrics``, ``/healthz`` and the JSON API under ``/api/v1/``.

A small WSGI app (GET and HEAD only; optional basic auth) served by ``HttpServer``: one thread
accepts connections and reads each request's head without blocking (the TLS handshake too); a
fixed pool of workers answers complete requests. An idle or slow client holds no worker and is
closed when its request has not arrived within ``request_timeout_s``; an answer that takes longer
than twice that is cut off; a full pool answers 503 at once. ``/metrics`` is
built at most once per ``EXPOSITION_MAX_AGE_S`` or store commit and shared by concurrent scrapers.
"""

from __future__ import annotations

import base64
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
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, cast
from urllib.parse import parse_qs, unquote
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer

from prometheus_client import CollectorRegistry, generate_latest, make_wsgi_app
from prometheus_client.exposition import gzip_accepted

from healthd.errors import HealthdError, InvalidNodeName
from healthd.judge.metrics import FINDING_LABELS, confirmed_finding
from healthd.judge.sources.fabric import PortTrack
from healthd.judge.sources.passive import Track
from healthd.logging import get_logger
from healthd.metrics import (
    CONTENT_TYPE,
    HEADLINES,
    OUTCOMES,
    STANDBY_FAMILIES,
    Exposition,
    NodeView,
    gpu_uuids,
    headline,
    node_views,
)
from healthd.model import validate_node_name
from healthd.store import Store
from healthd.store.rows import RunRow, Snapshot
from healthd.topology import Topology
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


DEFAULT_PAGE = 100
MAX_PAGE = 1000
NODE_FILTERS = ("state", "node_class", "verdict")


class ApiError(Exception):
    """A request the API refuses: its HTTP status and a message for the client."""

    def __init__(self, status: str, message: str) -> None:
        super().__init__(message)
        self.status = status


def node_document(view: NodeView, *, detail: bool = False, topology: Topology | None = None,
                  passive: Sequence[Track | PortTrack] = ()) -> dict[str, Any]:
    """One node of the ``/api/v1/nodes`` documents: its last result per probe with its headline measurements
    (``healthd.metrics.HEADLINES``) and its verdicts; with ``detail``, every measurement, the verdicts'
    evidence, the judged series (baseline, floor) and the confirmed findings. ``gpu_inventory``: the node's GPUs as
    the probes last reported them (``Store.gpu_inventory``); a per-GPU measurement carries its GPU's ``gpu_uuid``.
    ``switch_path``: the switches from the node's leaf (or block) up to the root in ``topology``; empty
    without topology or for a node outside it. ``passive_signals``: the passive signals the judge follows on the
    node now (``passive``: the daemon's, ``Judge.view(Passive, Passive.signals)`` and the fabric source's
    port signals)."""
    node = view.node
    uuids = gpu_uuids(view.gpus)
    latest: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for m in view.latest if detail else headline(view.latest):
        latest[m.probe].append({"name": m.name, "labels": m.labels, "value": m.value, "at": m.at, "run_id": m.run_id}
                               | ({"gpu_uuid": uuids.get(m.labels["gpu"]) or None} if "gpu" in m.labels else {}))
    doc: dict[str, Any] = {
        "name": view.name,
        "state": node.state if node else None,
        "flags": sorted(node.flags) if node else [],
        "partitions": list(node.partitions) if node else [],
        "gpus": node.gpus if node else None,
        "node_class": node.node_class if node else None,
        "reason": node.reason if node else None,
        "gpu_inventory": [{"index": g.index, "uuid": g.uuid, "name": g.name, "present": g.present,
                           "seen_at": g.seen_at} for g in view.gpus],
        "probes": {
            lr.probe: {"last_run_id": lr.last_run_id, "last_outcome": lr.last_outcome.value,
                       "last_reason": lr.last_reason, "last_run_at": lr.last_run_at,
                       "last_success_at": lr.last_success_at, "measurements": latest.get(lr.probe, [])}
            for lr in view.last_runs
        },
        "verdicts": {
            v.probe: {"outcome": v.outcome.value, "reason": v.reason, "reason_code": v.reason_code,
                      "run_ids": list(v.run_ids), "at": v.at, **({"evidence": v.evidence} if detail else {})}
            for v in view.verdicts
        },
        "drain_recommended": view.drain_reason,
        "switch_path": list(topology.path(view.name)) if topology is not None else [],
        "passive_signals": [_signal(t) for t in passive if t.node == view.name],
    }
    if detail:
        doc["series"] = [{"probe": s.probe, "name": s.name, "labels": s.labels, "last_value": s.last_value,
                          "last_at": s.last_at, "baseline": s.baseline, "floor": s.floor} for s in view.series]
        doc["findings"] = [
            {**dict(zip(FINDING_LABELS, f.labels, strict=True)), "value": f.value, "reference": f.reference,
             "drop_ratio": f.drop}
            for v in view.verdicts if (f := confirmed_finding(v)) is not None
        ]
    return doc


def nodes_document(snap: Snapshot, topology: Topology | None = None) -> dict[str, Any]:
    """The whole fleet as ``/api/v1/nodes`` pages it (pure, linear in the snapshot): ``healthd status``."""
    views = node_views(snap)
    return {"taken_at": snap.taken_at,
            "nodes": [node_document(views[name], detail=True, topology=topology) for name in sorted(views)]}


def _one(query: dict[str, list[str]], key: str) -> str | None:
    values = query.get(key)
    if values is None:
        return None
    if len(values) != 1 or not values[0]:
        raise ApiError("400 Bad Request", f"{key}: give it once, not empty")
    return values[0]


def nodes_page(store: Store, query_string: str, topology: Topology | None = None) -> dict[str, Any]:
    """``/api/v1/nodes?state=&node_class=&verdict=&limit=&cursor=``: nodes by name, filtered, one page
    (``limit``, default ``DEFAULT_PAGE``, at most ``MAX_PAGE``); ``next_cursor`` asks for the next one."""
    query = parse_qs(query_string, keep_blank_values=True)
    unknown = sorted(set(query) - {*NODE_FILTERS, "limit", "cursor"})
    if unknown:
        raise ApiError("400 Bad Request", f"unknown parameter(s) {unknown}: use {[*NODE_FILTERS, 'limit', 'cursor']}")
    limit_text = _one(query, "limit")
    if limit_text is not None and not (limit_text.isdigit() and 1 <= int(limit_text) <= MAX_PAGE):
        raise ApiError("400 Bad Request", f"limit: a whole number from 1 to {MAX_PAGE}, not {limit_text!r}")
    limit = int(limit_text) if limit_text is not None else DEFAULT_PAGE
    after = ""
    if (cursor := _one(query, "cursor")) is not None:
        try:
            after = base64.urlsafe_b64decode(cursor.encode()).decode()
            validate_node_name(after)
        except (ValueError, InvalidNodeName):
            raise ApiError("400 Bad Request", f"cursor: not a cursor this API gave ({cursor!r})") from None
    verdict = _one(query, "verdict")
    if verdict is not None and verdict not in OUTCOMES:
        raise ApiError("400 Bad Request", f"verdict: one of {list(OUTCOMES)}, not {verdict!r}")
    names = store.node_names(after=after, limit=limit + 1, state=_one(query, "state"),
                             node_class=_one(query, "node_class"), verdict=verdict)
    page, more = names[:limit], len(names) > limit
    views = node_views(store.snapshot(nodes=page, fleet=False, families=HEADLINES.keys(), judged=False))
    return {
        "taken_at": time.time(),
        "nodes": [node_document(views.get(name) or NodeView(name), topology=topology) for name in page],
        "next_cursor": base64.urlsafe_b64encode(page[-1].encode()).decode() if more else None,
    }


def _signal(t: Track | PortTrack) -> dict[str, Any]:
    """A followed signal in a node document: a GPU's, or an InfiniBand port's (``device`` and ``port``)."""
    doc: dict[str, Any] = {"signal": t.signal, "code": t.code, "strength": t.strength.value, "stage": t.stage(),
                           "gpu": t.gpu, "gpu_uuid": t.gpu_uuid, "detail": t.detail, "first_at": t.first_at,
                           "last_at": t.last_at, "seen": t.seen}
    if isinstance(t, PortTrack):
        doc.update(device=t.device, port=t.port, confirmed_by=t.corroborated or None)
    else:
        doc["confirmed_by"] = t.failed_run or ("repeat" if t.confirmed_at is not None else None)
    return doc


def node_detail(store: Store, name: str, topology: Topology | None = None,
                passive: Sequence[Track | PortTrack] = ()) -> dict[str, Any]:
    """``/api/v1/nodes/<name>``: everything the store holds on the node's current state and its recent runs."""
    try:
        validate_node_name(name)
    except InvalidNodeName as exc:
        raise ApiError("400 Bad Request", str(exc)) from None
    view = node_views(store.snapshot(nodes=[name], fleet=False)).get(name)
    if view is None or view.empty:
        raise ApiError("404 Not Found", f"no node {name!r} known to healthd")
    runs = store.recent_runs(node=name, limit=20)
    return {**node_document(view, detail=True, topology=topology, passive=passive),
            "recent_runs": [_run(r) for r in runs]}


def _run(r: RunRow) -> dict[str, Any]:
    return {"run_id": r.run_id, "kind": r.kind.value, "probe": r.probe, "nodes": list(r.nodes), "state": r.state,
            "outcome": r.outcome.value if r.outcome else None, "reason": r.reason,
            "submitted_at": r.submitted_at, "finished_at": r.finished_at, "duration_s": r.duration_s,
            "job_id": r.job_id, "result_path": r.result_path, "container_image": r.container_image}


class ExpositionCache:
    """The ``/metrics`` body (and its gzip): the daemon's registry, rendered at most once per ``max_age_s``,
    followed by the store's part (``Exposition``), refreshed when ``version()`` (the store's data version)
    has changed since the last refresh; with ``refresh`` False the scrape never refreshes it (the daemon
    does after each tick: a scrape only joins bytes). While ``store_part()`` is false (an ``[ha]`` standby)
    only the store part's ``STANDBY_FAMILIES`` follow: the judgement families come from the leader only. A
    change of ``store_part()`` (this instance took or lost the lease) renders the registry afresh.

    Concurrent scrapers wait for the one build in progress and share its bytes.
    """

    def __init__(self, registry: CollectorRegistry, max_age_s: float = EXPOSITION_MAX_AGE_S,
                 clock: Callable[[], float] = time.monotonic, version: Callable[[], object] = lambda: None,
                 exposition: Exposition | None = None, refresh: bool = True,
                 store_part: Callable[[], bool] = lambda: True) -> None:
        self._registry = registry
        self._exposition = exposition
        self._store_part = store_part
        self._refresh = refresh
        self._max_age_s = max_age_s
        self._clock = clock
        self._version = version
        self._lock = threading.Lock()
        self._built: tuple[float, object] | None = None
        self._daemon = b""
        self._daemon_gzip: bytes | None = None
        self._joined: dict[bool, tuple[bytes, bytes, bytes]] = {}
        self.builds = 0

    def get(self, want_gzip: bool) -> tuple[bytes, str]:
        with self._lock:
            store_part = self._store_part()
            now, version = self._clock(), (self._version(), store_part)
            if self._built is None or now - self._built[0] >= self._max_age_s or self._built[1] != version:
                if self._exposition is not None and self._refresh and (self._built is None
                                                                       or self._built[1] != version):
                    self._exposition.refresh()
                self._daemon, self._daemon_gzip = generate_latest(self._registry), None
                self._built = (now, version)
                self.builds += 1
            if want_gzip and self._daemon_gzip is None:
                self._daemon_gzip = gzip.compress(self._daemon, compresslevel=6)
            head = self._daemon_gzip if want_gzip else self._daemon
            assert head is not None
            if self._exposition is None:
                return head, CONTENT_TYPE
            if not store_part:
                tail = self._exposition.body_of(STANDBY_FAMILIES)
                return head + (gzip.compress(tail, compresslevel=6) if want_gzip else tail), CONTENT_TYPE
            tail = self._exposition.body_gzip() if want_gzip else self._exposition.body()
            joined = self._joined.get(want_gzip)
            if joined is None or joined[0] is not head or joined[1] is not tail:
                joined = (head, tail, head + tail)
                self._joined[want_gzip] = joined
            return joined[2], CONTENT_TYPE


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
        exposition: Exposition | None = None,
        refresh_on_scrape: bool = True,
        topology: Callable[[], Topology | None] = lambda: None,
        passive: Callable[[], Sequence[Track | PortTrack]] = lambda: (),
        store_part: Callable[[], bool] = lambda: True,
    ) -> None:
        """``store_part``: whether ``/metrics`` serves the store's judgement families (``ExpositionCache``)."""
        self._exposition = ExpositionCache(registry, version=store.data_version, exposition=exposition,
                                           refresh=refresh_on_scrape, store_part=store_part)
        self._metrics_filtered = make_wsgi_app(registry)
        self._store = store
        self._healthy = healthy
        self._topology = topology
        self._passive = passive
        self._auth = auth
        self._routes: dict[str, Callable[[], Any]] = {
            "/api/v1/runs": self._runs,
            **(extra_routes or {}),
        }

    def _runs(self) -> Any:
        return {"runs": [_run(r) for r in self._store.recent_runs(limit=100)]}

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
        path = path.rstrip("/") or "/"
        route = self._routes.get(path)
        if path == "/api/v1/nodes":
            query = environ.get("QUERY_STRING", "")
            route = lambda: nodes_page(self._store, query, self._topology())  # noqa: E731
        elif path.startswith("/api/v1/nodes/"):
            name = unquote(path.removeprefix("/api/v1/nodes/"))
            route = lambda: node_detail(self._store, name, self._topology(), self._passive())  # noqa: E731
        if route is None:
            return _reply(start_response, "404 Not Found", "not found: try /metrics, /healthz, /api/v1/nodes\n",
                          "text/plain")
        try:
            body = json.dumps(route(), sort_keys=True)
        except ApiError as exc:
            return _reply(start_response, exc.status, json.dumps({"error": str(exc)}), "application/json")
        except HealthdError as exc:
            log.error("api_error", path=path, error=str(exc))
            return _reply(start_response, "500 Internal Server Error", json.dumps({"error": str(exc)}),
                          "application/json")
        return _reply(start_response, "200 OK", body, "application/json")

    def _metrics(self, environ: Environ, start_response: StartResponse) -> Iterable[bytes]:
        if "name[]" in parse_qs(environ.get("QUERY_STRING", "")):
            return self._metrics_filtered({**environ, "REQUEST_METHOD": "GET"}, start_response)  # type: ignore[no-any-return]
        want_gzip = gzip_accepted(environ.get("HTTP_ACCEPT_ENCODING", ""))
        data, ctype = self._exposition.get(want_gzip)
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
