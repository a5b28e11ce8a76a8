"""The HTTP endpoint: ``/metrics``, ``/healthz`` and the JSON API under ``/api/v1/``.

A small WSGI app served by a threading ``wsgiref`` server; handlers only read the store.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterable
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app

from healthd.errors import HealthdError
from healthd.logging import get_logger
from healthd.store import Store
from healthd.store.rows import Snapshot

log = get_logger(__name__)

StartResponse = Callable[..., Any]
Environ = dict[str, Any]


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


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True
    allow_reuse_address = True


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
    ) -> None:
        self._metrics = make_wsgi_app(registry)
        self._store = store
        self._healthy = healthy
        self._routes: dict[str, Callable[[], Any]] = {
            "/api/v1/nodes": lambda: nodes_document(self._store.snapshot()),
            "/api/v1/runs": self._runs,
            **(extra_routes or {}),
        }

    def _runs(self) -> Any:
        return {
            "runs": [
                {"run_id": r.run_id, "probe": r.probe, "nodes": list(r.nodes), "state": r.state,
                 "outcome": r.outcome.value if r.outcome else None, "reason": r.reason,
                 "submitted_at": r.submitted_at, "finished_at": r.finished_at, "duration_s": r.duration_s,
                 "job_id": r.job_id, "result_path": r.result_path}
                for r in self._store.recent_runs(limit=100)
            ]
        }

    def __call__(self, environ: Environ, start_response: StartResponse) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "/")
        if path == "/metrics":
            return self._metrics(environ, start_response)  # type: ignore[no-any-return]
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


def _reply(start_response: StartResponse, status: str, body: str, ctype: str) -> list[bytes]:
    data = body.encode()
    start_response(status, [("Content-Type", f"{ctype}; charset=utf-8"), ("Content-Length", str(len(data)))])
    return [data]


class HttpServer:
    """Serves ``app`` on ``host:port`` in a background thread; ``port=0`` picks a free one."""

    def __init__(self, app: HttpApp, host: str, port: int) -> None:
        try:
            self._server = make_server(host, port, app, server_class=_Server, handler_class=_QuietHandler)
        except OSError as exc:
            raise HealthdError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
        self.port = self._server.server_port
        self._thread = threading.Thread(target=self._server.serve_forever, name="http", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
