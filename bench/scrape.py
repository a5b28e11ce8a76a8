"""The read side at fleet scale (issue 18): build an N-node fleet with history through the simulator (real
planner, collector, store, judge), then time ``/metrics`` and ``/api/v1/nodes`` through the real HTTP app.

    python bench/scrape.py --nodes 1000 [--rounds 3] [--detail summary|full] [--json]

Prints ``nodes``, ``series``, ``series_per_node``, ``first_refresh_ms`` (every node read and rendered),
``refresh_scrape_after_30s_ms`` (the daemon's refresh after 30 s of simulated time brought new results; CPU
time and nodes re-rendered next to it), ``refresh_scrape_after_round_ms`` (after a whole round: every node
has new results), ``scrape_ms`` (a scrape after the refresh), ``scrape_cached_ms``, ``scrape_gzip_ms``,
``scrape_bytes``, ``api_nodes_page_ms`` (one page of 100) and ``api_node_ms`` (one node's detail).
``measure`` is importable (``bench/scale.py``).
"""

from __future__ import annotations

import argparse
import io
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from prometheus_client import CollectorRegistry  # noqa: E402

from healthd.http import HttpApp  # noqa: E402
from healthd.logging import setup_logging  # noqa: E402
from healthd.metrics import DaemonMetrics, Detail, Exposition  # noqa: E402
from healthd.simulate import RoundLine, Scenario, Simulation  # noqa: E402
from healthd.store import Store  # noqa: E402


def scenario(nodes: int, rounds: int) -> Scenario:
    """8-GPU nodes probed by env, gemm (2 dtypes), nccl (2 collectives x 4 sizes x 2 placements) and ddp."""
    series: list[dict[str, Any]] = [
        {"probe": "env", "name": "visible_gpus", "value": 8, "noise": 0.0},
        {"probe": "ddp", "name": "throughput_samples_per_second", "value": 2400.0},
        {"probe": "ddp", "name": "scaling_efficiency_ratio", "value": 0.93},
        {"probe": "gemm", "name": "memory_bandwidth_bytes_per_second", "per": "gpu", "value": 2.9e12},
    ]
    series += [{"probe": "gemm", "name": "flop_per_second", "per": "gpu", "labels": {"dtype": d}, "value": v}
               for d, v in (("bf16", 700e12), ("fp8", 1300e12))]
    series += [{"probe": "nccl", "name": "busbw_bytes_per_second",
                "labels": {"collective": c, "size_bytes": str(size), "placement": p, "scope": "node"},
                "value": 480e9 * min(1.0, size / 2**30) + 1e8}
               for c in ("all_reduce", "all_gather") for size in (2**13, 2**20, 2**26, 2**30)
               for p in ("in_place", "out_of_place")]
    every = {"interval_s": 840.0, "jitter_s": 60.0, "timeout_s": 180.0}
    return Scenario.model_validate({
        "name": f"scrape-{nodes}", "seed": 3, "rounds": rounds, "round_s": 900.0, "tick_s": 150.0,
        "probe_seconds": {"env": 10.0, "gemm": 45.0, "nccl": 75.0, "ddp": 90.0},
        "healthd": {"backend": "local", "probes": {p: every for p in ("env", "gemm", "nccl", "ddp")},
                    "slurm": {"max_concurrent_jobs": nodes * 4, "max_idle_share": 1.0}},
        "classes": [{"name": "h100x8", "count": nodes, "prefix": "gpu", "gpus": 8, "gpu_type": "h100",
                     "noise": 0.02, "series": series}],
    })


CPU_MS: dict[str, float] = {}
"""CPU milliseconds of the last ``_ms`` call, by name (a loaded machine stretches the wall time, not this)."""


def _ms(fn: Callable[[], object], repeat: int = 1, name: str = "") -> float:
    times, cpu = [], []
    for _ in range(repeat):
        start, start_cpu = time.perf_counter(), time.process_time()
        fn()
        times.append((time.perf_counter() - start) * 1000)
        cpu.append((time.process_time() - start_cpu) * 1000)
    if name:
        CPU_MS[name] = round(statistics.median(cpu), 1)
    return round(statistics.median(times), 1)


def _get(app: HttpApp, path: str, query: str = "", gzip: bool = False) -> bytes:
    status: list[str] = []
    environ = {"REQUEST_METHOD": "GET", "PATH_INFO": path, "QUERY_STRING": query, "wsgi.input": io.BytesIO(),
               "HTTP_ACCEPT_ENCODING": "gzip" if gzip else ""}
    body = b"".join(app(environ, lambda s, h, *a: status.append(s)))
    assert status[0].startswith("200"), (path, query, status, body[:200])
    return body


def measure(store: Store, detail: Detail = "summary",
            ticks: Mapping[str, Callable[[], None]] | None = None) -> dict[str, Any]:
    """Scrape and API figures of ``store``'s fleet, served as the daemon serves them (the exposition refreshed
    after a tick, a scrape joins its bytes). Each of ``ticks`` (name: what it does to the store) is played,
    then the refresh is timed (``refresh_<name>_ms``, ``…_cpu_ms``, ``…_nodes``: the nodes re-rendered) and
    a scrape (``<name>_ms``; the first tick's is also ``scrape_ms``)."""
    registry = CollectorRegistry()
    DaemonMetrics(registry)
    exposition = Exposition(store, lambda: "slurm", detail)
    app = HttpApp(registry, store, lambda: (True, "ok"), exposition=exposition, refresh_on_scrape=False)
    body = b""

    def scrape() -> None:
        nonlocal body
        body = _get(app, "/metrics")

    result: dict[str, Any] = {"first_refresh_ms": _ms(exposition.refresh)}
    for name, tick in (ticks or {"scrape": lambda: None}).items():
        tick()
        rendered = exposition.rendered_nodes
        result[f"refresh_{name}_ms"] = _ms(exposition.refresh, name=name)
        result[f"refresh_{name}_cpu_ms"] = CPU_MS[name]
        result[f"refresh_{name}_nodes"] = exposition.rendered_nodes - rendered
        result[f"{name}_ms"] = _ms(scrape)
        result.setdefault("scrape_ms", result[f"{name}_ms"])
    cached = _ms(lambda: _get(app, "/metrics"), repeat=5)
    gzip_ms = _ms(lambda: _get(app, "/metrics", gzip=True))
    gzip_bytes = len(_get(app, "/metrics", gzip=True))
    nodes = len(store.node_names(limit=10**9))
    series = sum(1 for line in body.split(b"\n") if line and not line.startswith(b"#"))
    node_series = sum(1 for line in body.split(b"\n") if b'node="' in line and not line.startswith(b"#"))
    cursor: list[str] = []
    pages = 0

    def page() -> None:
        nonlocal pages
        doc = json.loads(_get(app, "/api/v1/nodes", f"limit=100&cursor={cursor[0]}" if cursor else "limit=100"))
        pages += 1
        cursor[:] = [doc["next_cursor"]] if doc["next_cursor"] else []

    page_ms = _ms(page, repeat=5, name="page")
    name = store.node_names(limit=1)[0]
    return {
        "nodes": nodes, "detail": detail, "series": series,
        "series_per_node": round(node_series / max(nodes, 1), 1), **result, "scrape_cached_ms": cached,
        "scrape_gzip_ms": gzip_ms,
        "scrape_bytes": len(body), "scrape_gzip_bytes": gzip_bytes, "api_nodes_page_ms": page_ms,
        "api_nodes_page_cpu_ms": CPU_MS["page"],
        "api_node_ms": _ms(lambda: _get(app, f"/api/v1/nodes/{name}"), repeat=5),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--detail", choices=["summary", "full"], default="summary")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--no-round", action="store_true", help="skip the scrape after a whole round (slow at 10k)")
    args = parser.parse_args(argv)
    setup_logging("warning")
    with tempfile.TemporaryDirectory() as tmp:
        started = time.perf_counter()
        sim = Simulation(scenario(args.nodes, args.rounds + 1), Path(tmp), echo=False)
        for rnd in range(1, args.rounds + 1):
            sim.play_round(rnd)
        build_s = round(time.perf_counter() - started, 1)

        def scrape_interval() -> None:
            """30 s of simulated time: what a Prometheus scrape interval sees change."""
            sim.cluster.now += 30.0
            sim._tick(args.rounds + 1, RoundLine(args.rounds + 1))

        ticks = {"scrape_after_30s": scrape_interval}
        if not args.no_round:
            ticks["scrape_after_round"] = lambda: sim.play_round(args.rounds + 1)  # every node has new results
        result = measure(sim.store, args.detail, ticks)
        result["build_s"] = build_s
        result["rounds"] = args.rounds
    if args.json:
        print(json.dumps(result))
    else:
        for key, value in result.items():
            print(f"{key:>20}: {value}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
