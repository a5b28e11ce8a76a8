"""Many Prometheus scrapers against ``/metrics`` (issue 19): latency percentiles and errors.

Usage: ``PYTHONPATH=. python bench/http_load.py [--scrapers 50] [--seconds 60] [--nodes 256] [--url URL]``.
Without ``--url`` it serves, in this process, the metrics of a synthetic store snapshot of
``--nodes`` nodes (two probes, a verdict and five measurements each) through healthd's own
``HttpServer`` and ``Exposition``, as the daemon does. Each
scraper asks for gzip, like Prometheus. Prints p50/p90/p99/max in ms, requests and errors; exits
1 when there is an error or p99 is over ``--p99-ms`` (500).
"""

from __future__ import annotations

import argparse
import http.client
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from urllib.parse import urlsplit

import structlog
from prometheus_client import CollectorRegistry

from healthd.http import HttpApp, HttpServer
from healthd.metrics import Exposition
from healthd.model import Node, Outcome, Verdict
from healthd.store import Store
from probes.result import Measurement, ProbeResult


def synthetic_store(path: Path, n_nodes: int) -> Store:
    """A store of ``n_nodes`` nodes: two probes, a verdict and five measurements each."""
    store = Store(path)
    now = time.time()
    store.upsert_nodes([Node(name=f"gpu{i:04d}", state="idle", partitions=("gpu",), gpus=8, gpu_type="h100")
                        for i in range(n_nodes)], now)
    verdicts = []
    for i in range(n_nodes):
        name = f"gpu{i:04d}"
        for probe in ("gemm", "nccl"):
            run_id = f"{probe}-{i}"
            store.add_run(run_id=run_id, probe=probe, nodes=[name], backend="slurm", job_id=None, submitted_at=now,
                          result_path=None)
            result = ProbeResult(probe=probe, run_id=run_id, outcome=Outcome.PASS, started_at=now, finished_at=now,
                                 measurements=[Measurement(name="busbw_bytes_per_second", value=1e11 + k, node=name,
                                                           labels={"size_bytes": str(1 << (20 + k)),
                                                                   "collective": "all_reduce"}) for k in range(5)])
            store.finish_run(run_id, outcome=Outcome.PASS, reason="", finished_at=now, result=result)
            verdicts.append(Verdict(node=name, probe=probe, outcome=Outcome.PASS, run_ids=(run_id,), at=now))
    store.put_verdicts(verdicts)
    return store


def scrape_loop(host: str, port: int, path: str, until: float, times: list[float], errors: list[str],
                lock: threading.Lock) -> None:
    while time.monotonic() < until:
        started = time.monotonic()
        try:
            conn = http.client.HTTPConnection(host, port, timeout=30)
            conn.request("GET", path, headers={"Accept-Encoding": "gzip"})
            resp = conn.getresponse()
            resp.read()
            conn.close()
            error = "" if resp.status == 200 else f"HTTP {resp.status}"
        except (OSError, http.client.HTTPException) as exc:
            error = repr(exc)
        with lock:
            times.append(time.monotonic() - started)
            if error:
                errors.append(error)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scrapers", type=int, default=50)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--nodes", type=int, default=256)
    parser.add_argument("--url", default=None, help="scrape this instead of an in-process server")
    parser.add_argument("--p99-ms", type=float, default=500.0)
    args = parser.parse_args(argv)
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(50))
    server: HttpServer | None = None
    with tempfile.TemporaryDirectory() as tmp:
        if args.url:
            parts = urlsplit(args.url)
            host, port, path = parts.hostname or "127.0.0.1", parts.port or 80, parts.path or "/metrics"
        else:
            store = synthetic_store(Path(tmp) / "s.sqlite", args.nodes)
            exposition = Exposition(store, lambda: "slurm", "full")
            server = HttpServer(HttpApp(CollectorRegistry(), store, lambda: (True, "ok"), exposition=exposition),
                                "127.0.0.1", 0)
            server.start()
            host, port, path = "127.0.0.1", server.port, "/metrics"
        times: list[float] = []
        errors: list[str] = []
        lock = threading.Lock()
        until = time.monotonic() + args.seconds
        threads = [threading.Thread(target=scrape_loop, args=(host, port, path, until, times, errors, lock))
                   for _ in range(args.scrapers)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if server is not None:
            server.stop()
            store.close()
    ms = sorted(t * 1000 for t in times)
    q = statistics.quantiles(ms, n=100, method="inclusive") if len(ms) > 1 else ms * 99
    print(f"{args.scrapers} scrapers, {args.seconds:g} s, {len(ms)} requests ({len(ms) / args.seconds:.0f}/s),"
          f" {len(errors)} errors")
    print(f"/metrics latency ms: p50 {q[49]:.1f}  p90 {q[89]:.1f}  p99 {q[98]:.1f}  max {ms[-1]:.1f}")
    for error in sorted(set(errors))[:5]:
        print(f"  error: {error} (x{errors.count(error)})")
    return 1 if errors or q[98] > args.p99_ms else 0


if __name__ == "__main__":
    sys.exit(main())
