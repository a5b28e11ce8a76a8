"""A FAKE of NVIDIA's dcgm-exporter (it needs GPUs and DCGM): a small HTTP server whose ``/metrics`` text
follows the real exporter's exposition, for a real Prometheus to scrape in tests.

What it copies from the real one (NVIDIA/dcgm-exporter ``internal/pkg/rendermetrics/render_metrics.go``,
``etc/default-counters.csv``, the collectors of ``internal/pkg/collector/``; checked against output
captured from dcgm-exporter 4.x, driver 580.95.05): the ``# HELP``/``# TYPE`` lines of each field with
the CSV's help text and type; the label order ``gpu, UUID, pci_bus_id, device, modelName``, then the host
(``Hostname`` up to release 4.8, ``hostname`` after, or none with ``--no-hostname``), then the label
counters (``DCGM_FI_DRIVER_VERSION``) and attributes in sorted order; the XID gauge's ``err_code`` and
``err_msg`` attributes; ``DCGM_EXP_XID_ERRORS_COUNT`` with ``window_size_in_ms`` and one series per XID in
the window (one zero-valued series without ``xid`` when there is none); ``DCGM_EXP_GPU_HEALTH_STATUS``
with ``health_watch`` and ``health_error_code`` per watch.

One server holds several nodes: ``/metrics`` serves all of them, ``/metrics?node=N`` one node (a
Prometheus target per node: ``__param_node`` in its static labels). Values change at run time through
method calls (in a thread) or, when started as a subprocess (``python -m tests.fakes.dcgm_exporter``),
through ``POST /control`` with a JSON body ``{"op": "set"|"xid"|"health"|"host_label"|"down", ...}``.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import threading
import time
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

XID_TEXT = {0: "No Error", 13: "Graphics Engine Exception", 31: "GPU memory page fault",
            43: "GPU stopped processing", 48: "Double Bit ECC Error", 74: "NVLINK Error",
            79: "GPU has fallen off the bus", 94: "Contained ECC error", 95: "Uncontained ECC error"}
"""dcgm-exporter's ``xidErrCodeToText`` for the XIDs tests use."""

# (field, type, help) as in etc/default-counters.csv; DEFAULT ones are enabled in the shipped CSV.
DEFAULT_FIELDS: tuple[tuple[str, str, str], ...] = (
    ("DCGM_FI_DEV_SM_CLOCK", "gauge", "SM clock frequency (in MHz)."),
    ("DCGM_FI_DEV_MEM_CLOCK", "gauge", "Memory clock frequency (in MHz)."),
    ("DCGM_FI_DEV_MEMORY_TEMP", "gauge", "Memory temperature (in C)."),
    ("DCGM_FI_DEV_GPU_TEMP", "gauge", "GPU temperature (in C)."),
    ("DCGM_FI_DEV_POWER_USAGE", "gauge", "Power draw (in W)."),
    ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "counter", "Total energy consumption since boot (in mJ)."),
    ("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "counter", "Total number of PCIe retries."),
    ("DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilization (in %)."),
    ("DCGM_FI_DEV_MEM_COPY_UTIL", "gauge", "Memory utilization (in %)."),
    ("DCGM_FI_DEV_XID_ERRORS", "gauge", "Value of the last XID error encountered."),
    ("DCGM_FI_DEV_FB_FREE", "gauge", "Framebuffer memory free (in MiB)."),
    ("DCGM_FI_DEV_FB_USED", "gauge", "Framebuffer memory used (in MiB)."),
    ("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "counter", "Number of remapped rows for uncorrectable errors"),
    ("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "counter", "Number of remapped rows for correctable errors"),
    ("DCGM_FI_DEV_ROW_REMAP_FAILURE", "gauge", "Whether remapping of rows has failed"),
    ("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", "counter", "Total number of NVLink bandwidth counters for all lanes."),
)
EXTRA_FIELDS: tuple[tuple[str, str, str], ...] = (
    ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "counter", "Total number of double-bit volatile ECC errors."),
    ("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", "counter", "Total number of NVLink flow-control CRC errors."),
    ("DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL", "counter", "Total number of NVLink retries."),
    ("DCGM_FI_DEV_ROW_REMAP_PENDING", "gauge", "Whether remapping of rows is pending"),
    ("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "gauge", "Current clock event reasons (bitmask)."),
)
"""Fields a site adds to its CSV (commented out, or absent, in the shipped one)."""
PCIE_FIELDS: tuple[tuple[str, str, str], ...] = (
    ("DCGM_FI_DEV_PCIE_MAX_LINK_GEN", "gauge", "PCIe Max Link Generation."),
    ("DCGM_FI_DEV_PCIE_MAX_LINK_WIDTH", "gauge", "PCIe Max Link Width."),
    ("DCGM_FI_DEV_PCIE_LINK_GEN", "gauge", "PCIe Current Link Generation."),
    ("DCGM_FI_DEV_PCIE_LINK_WIDTH", "gauge", "PCIe Current Link Width."),
)
"""The PCIe link fields (DCGM 235-238) a site adds to its CSV (``pcie=True``); an idle GPU's link at gen 1."""
PROFILING_FIELD = ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "gauge", "Ratio of time the graphics engine is active.")
"""A profiling (DCP) field: exported only where DCGM's profiling module runs (``profiling`` nodes)."""
HEALTH_WATCHES = ("PCIE", "NVLINK", "PMU", "MCU", "MEM", "SM", "INFOROM", "THERMAL", "POWER", "DRIVER", "ALL")
IDLE_VALUES = {"DCGM_FI_DEV_SM_CLOCK": "1980", "DCGM_FI_DEV_MEM_CLOCK": "2619", "DCGM_FI_DEV_GPU_TEMP": "34",
               "DCGM_FI_DEV_MEMORY_TEMP": "31", "DCGM_FI_DEV_POWER_USAGE": "71.418000",
               "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": "319159391", "DCGM_FI_DEV_FB_FREE": "81004",
               "DCGM_FI_DEV_FB_USED": "1", "DCGM_FI_DEV_CLOCKS_EVENT_REASONS": "1",
               "DCGM_FI_DEV_PCIE_MAX_LINK_GEN": "5", "DCGM_FI_DEV_PCIE_MAX_LINK_WIDTH": "16",
               "DCGM_FI_DEV_PCIE_LINK_GEN": "1", "DCGM_FI_DEV_PCIE_LINK_WIDTH": "16"}


def fake_uuid(node: str, gpu: int) -> str:
    h = hashlib.sha256(f"{node}/{gpu}".encode()).hexdigest()
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


@dataclass
class _Gpu:
    index: int
    uuid: str
    values: dict[str, str] = field(default_factory=dict)
    xids: list[tuple[float, int]] = field(default_factory=list)
    health: dict[str, tuple[int, str]] = field(default_factory=dict)


@dataclass
class _Node:
    name: str
    host_label: str | None
    gpus: list[_Gpu]


class FakeDcgmExporter:
    """Several nodes' dcgm-exporters in one server (a fake: no GPU, no DCGM)."""

    def __init__(self, nodes: Sequence[str], *, gpus: int = 2, host_label: str | None = "Hostname",
                 model: str = "NVIDIA H100 80GB HBM3", driver: str = "550.127.05",
                 extra_fields: bool = True, xid_count: bool | Collection[str] = False, health: bool = False,
                 xid_window_ms: int = 300_000, host: str = "127.0.0.1", port: int = 0,
                 profiling: Collection[str] = (), pcie: bool = False) -> None:
        self.model, self.driver = model, driver
        self.profiling = set(profiling or ())
        """The nodes whose exporter has the profiling field ``DCGM_FI_PROF_GR_ENGINE_ACTIVE``."""
        self.fields = (DEFAULT_FIELDS + (EXTRA_FIELDS if extra_fields else ()) + (PCIE_FIELDS if pcie else ())
                       + ((PROFILING_FIELD,) if profiling else ()))
        self.xid_count = set(nodes) if xid_count is True else set(xid_count or ())
        """The nodes whose exporter has ``DCGM_EXP_XID_ERRORS_COUNT`` in its CSV."""
        self.health = health
        self.xid_window_ms = xid_window_ms
        self.lock = threading.Lock()
        self.up = True
        self.nodes = {name: _Node(name, host_label, [_Gpu(i, fake_uuid(name, i)) for i in range(gpus)])
                      for name in nodes}
        exporter = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                url = urlsplit(self.path)
                if url.path != "/metrics":
                    self._send(404, b"not found\n")
                    return
                if not exporter.up:
                    self._send(503, b"down\n")
                    return
                only = parse_qs(url.query).get("node")
                self._send(200, exporter.render(only).encode(), "text/plain; version=0.0.4; charset=utf-8")

            def do_POST(self) -> None:
                if urlsplit(self.path).path != "/control":
                    self._send(404, b"not found\n")
                    return
                try:
                    exporter.control(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
                except (KeyError, ValueError, TypeError) as exc:
                    self._send(400, f"{exc}\n".encode())
                    return
                self._send(200, b"ok\n")

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
        self.thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return int(self.server.server_address[1])

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> FakeDcgmExporter:
        self.thread = threading.Thread(target=self.server.serve_forever, name="fake-dcgm-exporter", daemon=True)
        self.thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    # -- changing values ------------------------------------------------------------------------
    def gpu(self, node: str, gpu: int) -> _Gpu:
        return self.nodes[node].gpus[gpu]

    def set(self, node: str, gpu: int, field_name: str, value: float | str) -> None:
        with self.lock:
            self.gpu(node, gpu).values[field_name] = str(value)

    def xid(self, node: str, gpu: int, xid: int) -> None:
        """The GPU logs an XID: the last-XID gauge takes its value; the count series count it."""
        with self.lock:
            g = self.gpu(node, gpu)
            g.values["DCGM_FI_DEV_XID_ERRORS"] = str(xid)
            g.xids.append((time.time(), xid))

    def set_health(self, node: str, gpu: int, watch: str, value: int, code: str) -> None:
        with self.lock:
            self.gpu(node, gpu).health[watch] = (value, code)

    def set_host_label(self, node: str, label: str | None) -> None:
        with self.lock:
            self.nodes[node].host_label = label

    def control(self, doc: dict[str, Any]) -> None:
        """``POST /control``: the method calls above, for a fake run as a subprocess."""
        op = doc["op"]
        if op == "set":
            self.set(doc["node"], int(doc["gpu"]), str(doc["field"]), doc["value"])
        elif op == "xid":
            self.xid(doc["node"], int(doc["gpu"]), int(doc["xid"]))
        elif op == "health":
            self.set_health(doc["node"], int(doc["gpu"]), doc["watch"], int(doc["value"]), doc["code"])
        elif op == "host_label":
            self.set_host_label(doc["node"], doc["label"])
        elif op == "down":
            self.up = not bool(doc.get("up", False))
        else:
            raise ValueError(f"unknown op {op!r}")

    # -- the exposition -------------------------------------------------------------------------
    def _labels(self, node: _Node, g: _Gpu, extra: dict[str, str]) -> str:
        pairs = [("gpu", str(g.index)), ("UUID", g.uuid), ("pci_bus_id", f"00000000:{0x18 + 0x10 * g.index:02X}:00.0"),
                 ("device", f"nvidia{g.index}"), ("modelName", self.model)]
        if node.host_label:
            pairs.append((node.host_label, node.name))
        pairs += sorted({"DCGM_FI_DRIVER_VERSION": self.driver, **extra}.items())
        return ",".join(f'{k}="{_escape(v)}"' for k, v in pairs)

    def render(self, only: Iterable[str] | None = None) -> str:
        with self.lock:
            nodes = [n for n in self.nodes.values() if only is None or n.name in set(only)]
            lines: list[str] = []
            for name, kind, help_text in self.fields:
                lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]
                for node in nodes:
                    if name == PROFILING_FIELD[0] and node.name not in self.profiling:
                        continue
                    for g in node.gpus:
                        value = g.values.get(name, IDLE_VALUES.get(name, "0"))
                        extra: dict[str, str] = {}
                        if name == "DCGM_FI_DEV_XID_ERRORS":
                            code = int(float(value))
                            extra = {"err_code": str(code), "err_msg": XID_TEXT.get(code, "Unknown Error")}
                        lines.append(f"{name}{{{self._labels(node, g, extra)}}} {value}")
            if self.xid_count & {n.name for n in nodes}:
                lines += ["# HELP DCGM_EXP_XID_ERRORS_COUNT reported XIDs during last window",
                          "# TYPE DCGM_EXP_XID_ERRORS_COUNT counter"]
                since = time.time() - self.xid_window_ms / 1000
                window = {"window_size_in_ms": str(self.xid_window_ms)}
                for node in (n for n in nodes if n.name in self.xid_count):
                    for g in node.gpus:
                        counts: dict[int, int] = {}
                        for at, xid in g.xids:
                            if at >= since:
                                counts[xid] = counts.get(xid, 0) + 1
                        if not counts:
                            lines.append(f"DCGM_EXP_XID_ERRORS_COUNT{{{self._labels(node, g, window)}}} 0")
                        for xid, n in sorted(counts.items()):
                            labels = self._labels(node, g, {**window, "xid": str(xid)})
                            lines.append(f"DCGM_EXP_XID_ERRORS_COUNT{{{labels}}} {n}")
            if self.health:
                lines += ["# HELP DCGM_EXP_GPU_HEALTH_STATUS DCGM reported health status",
                          "# TYPE DCGM_EXP_GPU_HEALTH_STATUS counter"]
                for node in nodes:
                    for g in node.gpus:
                        for watch in HEALTH_WATCHES:
                            value, code = g.health.get(watch, (0, "DCGM_FR_OK"))
                            labels = self._labels(node, g, {"health_watch": watch, "health_error_code": code})
                            lines.append(f"DCGM_EXP_GPU_HEALTH_STATUS{{{labels}}} {value}")
        return "\n".join(lines) + "\n"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="A fake dcgm-exporter (no GPUs): /metrics, POST /control")
    parser.add_argument("--port", type=int, default=9400)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--nodes", default="node1", help="comma-separated node names")
    parser.add_argument("--gpus", type=int, default=2)
    parser.add_argument("--host-label", default="Hostname", help="Hostname, hostname or none")
    parser.add_argument("--xid-count", action="store_true")
    parser.add_argument("--health", action="store_true")
    args = parser.parse_args(argv)
    exporter = FakeDcgmExporter(args.nodes.split(","), gpus=args.gpus, host=args.host, port=args.port,
                                host_label=None if args.host_label == "none" else args.host_label,
                                xid_count=args.xid_count, health=args.health)
    print(f"fake dcgm-exporter on {args.host}:{exporter.port}", flush=True)
    with contextlib.suppress(KeyboardInterrupt):
        exporter.server.serve_forever()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
