"""A FAKE of Prometheus's node_exporter, its ``infiniband`` collector only (no HCAs here): a small HTTP server
whose ``/metrics`` text follows the real exporter's exposition, for a real Prometheus to scrape in tests.

What it copies from the real one (prometheus/node_exporter ``collector/infiniband_linux.go``, the
``boot_time`` of ``collector/stat_linux.go``): the metric names ``node_infiniband_<name>`` with the collector's
help texts, labels ``device`` and ``port`` (the node only in Prometheus's ``instance``), counters typed
``counter`` and ending ``_total``, ``state_id`` / ``physical_state_id`` / ``rate_bytes_per_second`` gauges per
port, ``node_infiniband_info`` per device (``board_id``, ``device``, ``firmware_version``, ``hca_type``), and
``node_boot_time_seconds``. Like the real collector, a counter the driver does not have is simply absent
(``legacy``: an older release that lacks ``port_receive_remote_physical_errors_total``).

One server holds several nodes: ``/metrics?node=N`` serves one node (a Prometheus target per node:
``__param_node`` in its static labels). Values change at run time through method calls (in a thread).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

COUNTERS: tuple[tuple[str, str], ...] = (
    ("link_downed_total", "Number of times the link failed to recover from an error state and went down"),
    ("link_error_recovery_total", "Number of times the link successfully recovered from an error state"),
    ("port_data_received_bytes_total", "Number of data octets received on all links"),
    ("port_data_transmitted_bytes_total", "Number of data octets transmitted on all links"),
    ("port_discards_transmitted_total",
     "Number of outbound packets discarded by the port because the port is down or congested"),
    ("port_errors_received_total", "Number of packets containing an error that were received on this port"),
    ("port_receive_remote_physical_errors_total",
     "Number of packets marked with the EBP (End of Bad Packet) delimiter received on the port."),
    ("symbol_error_total", "Number of minor link errors detected on one or more physical lanes."),
)
GAUGES: tuple[tuple[str, str], ...] = (
    ("physical_state_id", "Physical state of the InfiniBand port (0: no change, 1: sleep, 2: polling, 3: disable, "
                          "4: shift, 5: link up, 6: link error recover, 7: phytest)"),
    ("rate_bytes_per_second", "Maximum signal transfer rate"),
    ("state_id", "State of the InfiniBand port (0: no change, 1: down, 2: init, 3: armed, 4: active, 5: act defer)"),
)
LEGACY_MISSING = frozenset({"port_receive_remote_physical_errors_total"})
NDR = 50_000_000_000.0
"""An NDR 4x port: 400 Gb/s, as node_exporter reports it (bytes per second)."""


@dataclass
class _Port:
    device: str
    port: str
    values: dict[str, float] = field(default_factory=dict)


@dataclass
class _Node:
    name: str
    ports: list[_Port]
    boot_time: float = 1_700_000_000.0
    legacy: bool = False
    up: bool = True


class FakeNodeExporter:
    """``nodes`` with ``hcas`` single-port HCAs each (``mlx5_0`` ...), every link active at NDR."""

    def __init__(self, nodes: list[str] | tuple[str, ...], *, hcas: int = 2, legacy: tuple[str, ...] = (),
                 host: str = "127.0.0.1", port: int = 0) -> None:
        self.lock = threading.Lock()
        self.nodes = {n: _Node(n, [_Port(f"mlx5_{i}", "1", {"state_id": 4, "physical_state_id": 5,
                                                            "rate_bytes_per_second": NDR}) for i in range(hcas)],
                               legacy=n in legacy) for n in nodes}
        exporter = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                url = urlsplit(self.path)
                only = parse_qs(url.query).get("node", [""])[0]
                node = exporter.nodes.get(only)
                if url.path != "/metrics" or node is None:
                    self._send(404, b"not found\n")
                    return
                if not node.up:
                    self._send(503, b"restarting\n")
                    return
                self._send(200, exporter.render(only).encode(), "text/plain; version=0.0.4; charset=utf-8")

            def _send(self, code: int, body: bytes, kind: str = "text/plain") -> None:
                self.send_response(code)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer((host, port), Handler)
        self.server.daemon_threads = True

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.server.server_address[1]}"

    def start(self) -> FakeNodeExporter:
        threading.Thread(target=self.server.serve_forever, name="fake-node-exporter", daemon=True).start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def _port(self, node: str, device: str) -> _Port:
        return next(p for p in self.nodes[node].ports if p.device == device)

    def add(self, node: str, device: str, name: str, by: float = 1.0) -> None:
        """A counter rises (``name`` without ``_total``), stopping at its width like the PMA counter."""
        width = 255.0 if name in ("link_downed", "link_error_recovery") else 65535.0
        with self.lock:
            values = self._port(node, device).values
            values[f"{name}_total"] = min(values.get(f"{name}_total", 0.0) + by, width)

    def set(self, node: str, device: str, name: str, value: float) -> None:
        with self.lock:
            self._port(node, device).values[name] = value

    def clear(self, node: str, device: str) -> None:
        """``perfquery -x``: every counter of the port back to 0."""
        with self.lock:
            values = self._port(node, device).values
            for name, _ in COUNTERS:
                values.pop(name, None)

    def reboot(self, node: str, at: float) -> None:
        """The node boots: counters cleared, the link went down and up once on the way (link_downed 1)."""
        with self.lock:
            n = self.nodes[node]
            n.boot_time = at
            for p in n.ports:
                for name, _ in COUNTERS:
                    p.values.pop(name, None)
                p.values["link_downed_total"] = 1.0

    def set_up(self, node: str, up: bool) -> None:
        """``False``: the exporter restarting (its scrapes fail)."""
        with self.lock:
            self.nodes[node].up = up

    def render(self, name: str) -> str:
        with self.lock:
            node = self.nodes[name]
            lines = ["# HELP node_boot_time_seconds Node boot time, in unixtime.",
                     "# TYPE node_boot_time_seconds gauge", f"node_boot_time_seconds {node.boot_time:.0f}",
                     "# HELP node_infiniband_info Non-numeric data from /sys/class/infiniband/<device>, value is "
                     "always 1.", "# TYPE node_infiniband_info gauge"]
            lines += [f'node_infiniband_info{{board_id="MT_0000000838",device="{p.device}",'
                      f'firmware_version="28.39.1002",hca_type="MT4129"}} 1' for p in node.ports]
            for metric, help_text, kind in ([(m, h, "counter") for m, h in COUNTERS]
                                            + [(m, h, "gauge") for m, h in GAUGES]):
                if node.legacy and metric in LEGACY_MISSING:
                    continue
                lines += [f"# HELP node_infiniband_{metric} {help_text}", f"# TYPE node_infiniband_{metric} {kind}"]
                lines += [f'node_infiniband_{metric}{{device="{p.device}",port="{p.port}"}} '
                          f"{p.values.get(metric, 0.0):g}" for p in node.ports]
        return "\n".join(lines) + "\n"
