"""Probe coverage and budget figures (pure), and the metrics that export them.

A node is **fully checked** at the time every enabled probe had reached a verdict on it (passed,
or was judged degraded or failing; an error checks nothing): the oldest of its newest judged runs,
one per enabled probe. Coverage is the share of known nodes fully checked within the last 24 h.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Literal

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from healthd.model import Node
from healthd.planning import DAY_S, budget_limit_gpu_s


def full_check_times(nodes: Iterable[str], probes: Iterable[str],
                     last_judged: Mapping[tuple[str, str], float],
                     one_gpu: Iterable[str] = (), between_gpus: Iterable[str] = ()) -> dict[str, float]:
    """Per node fully checked at least once: when (the oldest of its newest judged runs, one per
    probe in ``probes``). Nodes missing a judged run of any of them are left out. A node in
    ``one_gpu`` needs none of the probes in ``between_gpus`` (single-node probes measuring between a
    node's GPUs: on one GPU they have nothing to measure and report ``skipped``)."""
    wanted = sorted(set(probes))
    single, skip = set(one_gpu), set(between_gpus)
    out: dict[str, float] = {}
    for node in nodes:
        times = [last_judged.get((node, p)) for p in wanted if not (node in single and p in skip)]
        if times and all(t is not None for t in times):
            out[node] = min(t for t in times if t is not None)
    return out


BOUNDARY_PROBE = "boundary"
"""The probe name of job-boundary checks (``python -m probes.boundary``) in the run history."""

CoveredBy = Literal["probes", "boundary"]


def checked_times(full_checks: Mapping[str, float],
                  boundary_checks: Mapping[str, float]) -> dict[str, tuple[float, CoveredBy]]:
    """Per node last checked by anything: the newer of its last full check by the idle-node probes and
    its last judged job-boundary check (prolog, epilog or HealthCheckProgram), and which it was."""
    out: dict[str, tuple[float, CoveredBy]] = {n: (at, "probes") for n, at in full_checks.items()}
    for node, at in boundary_checks.items():
        if node not in out or at > out[node][0]:
            out[node] = (at, "boundary")
    return out


@dataclass(frozen=True)
class Coverage:
    checked: int
    nodes: int

    @property
    def ratio(self) -> float:
        return self.checked / self.nodes if self.nodes else 0.0


def coverage(nodes: Iterable[Node], full_checks: Mapping[str, float], now: float,
             window_s: float = DAY_S) -> dict[str | None, Coverage]:
    """Nodes fully checked within ``window_s`` of ``now``, per node class, and (key ``None``) in all."""
    counts: dict[str | None, list[int]] = {None: [0, 0]}
    for node in nodes:
        fresh = int(now - full_checks.get(node.name, float("-inf")) <= window_s)
        for key in (None, node.node_class or ""):
            c = counts.setdefault(key, [0, 0])
            c[0] += fresh
            c[1] += 1
    return {key: Coverage(checked, total) for key, (checked, total) in counts.items()}


@dataclass(frozen=True)
class CoverageInputs:
    """What the coverage metrics are computed from, read from the store at scrape time."""

    now: float
    nodes: tuple[Node, ...]
    enabled_probes: tuple[str, ...]
    last_judged: Mapping[tuple[str, str], float]
    spent_gpu_s: float
    max_gpu_hours_per_day: float | None
    max_share: float | None
    between_gpus: tuple[str, ...] = ()
    """Enabled single-node probes a one-GPU node does not need (``full_check_times``)."""


class CoverageCollector(Collector):
    """``healthd_node_last_full_check_timestamp_seconds`` (one series per node), coverage per class and
    in all, and the probe budget: GPU-seconds spent in the last 24 h, the limit, the share of the cluster."""

    def __init__(self, inputs: Callable[[], CoverageInputs], max_age_s: float = 0.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._inputs = inputs
        self._max_age_s = max_age_s
        self._clock = clock
        self._lock = threading.Lock()
        self._families: tuple[float, list[Metric]] | None = None

    def describe(self) -> list[Metric]:
        return []

    def refresh(self, *, force: bool = False) -> bool:
        """Read the inputs and build the families again when they are older than ``max_age_s`` (or
        ``force``): the daemon calls this after its ticks, so a scrape never waits for the store's
        history queries. Whether it did."""
        with self._lock:
            now = self._clock()
            if not force and self._families is not None and now - self._families[0] < self._max_age_s:
                return False
            self._families = (now, list(self._build(self._inputs())))
            return True

    def collect(self) -> Iterator[Metric]:
        if self._families is None:
            self.refresh()
        assert self._families is not None
        yield from self._families[1]

    @staticmethod
    def _build(x: CoverageInputs) -> Iterator[Metric]:
        checks = full_check_times((n.name for n in x.nodes), x.enabled_probes, x.last_judged,
                                  one_gpu=(n.name for n in x.nodes if n.gpus == 1), between_gpus=x.between_gpus)
        last = GaugeMetricFamily("healthd_node_last_full_check_timestamp_seconds",
                                 "When the node was last fully checked: every enabled probe had passed or been"
                                 " judged (the oldest of its newest judged runs, one per enabled probe)",
                                 labels=["node"])
        for node, at in sorted(checks.items()):
            last.add_metric([node], at)
        yield last
        cov = coverage(x.nodes, checks, x.now)
        overall = GaugeMetricFamily("healthd_probe_coverage_ratio",
                                    "Share of known nodes fully checked in the last 24 h")
        overall.add_metric([], cov[None].ratio)
        yield overall
        per_class = GaugeMetricFamily("healthd_probe_class_coverage_ratio",
                                      "Share of the class's known nodes fully checked in the last 24 h",
                                      labels=["node_class"])
        for cls, c in sorted((k, v) for k, v in cov.items() if k is not None):
            per_class.add_metric([cls], c.ratio)
        yield per_class
        boundary = {node: at for (node, probe), at in x.last_judged.items() if probe == BOUNDARY_PROBE}
        last_boundary = GaugeMetricFamily("healthd_node_last_boundary_check_timestamp_seconds",
                                          "When a job-boundary check (prolog, epilog, HealthCheckProgram) of the"
                                          " node last reached a verdict", labels=["node"])
        for node, at in sorted(boundary.items()):
            last_boundary.add_metric([node], at)
        yield last_boundary
        either = {n: at for n, (at, _) in checked_times(checks, boundary).items()}
        by = GaugeMetricFamily("healthd_coverage_ratio",
                               "Share of known nodes checked in the last 24 h, by the idle-node probes (a full"
                               " check), by job-boundary checks, or by either", labels=["by"])
        for label, times in (("probes", checks), ("boundary", boundary), ("either", either)):
            by.add_metric([label], coverage(x.nodes, times, x.now)[None].ratio)
        yield by
        cluster_gpus = sum(n.gpus for n in x.nodes)
        spent = GaugeMetricFamily("healthd_probe_budget_spent_gpu_seconds",
                                  "GPU-seconds held by probe runs that finished in the last 24 h")
        spent.add_metric([], x.spent_gpu_s)
        yield spent
        share = GaugeMetricFamily("healthd_probe_budget_spent_ratio",
                                  "GPU-seconds of probe runs in the last 24 h over the cluster's GPU-seconds"
                                  " in 24 h (every known node's GPUs)")
        share.add_metric([], x.spent_gpu_s / (cluster_gpus * DAY_S) if cluster_gpus else 0.0)
        yield share
        limit = budget_limit_gpu_s(x.max_gpu_hours_per_day, x.max_share, cluster_gpus)
        limit_family = GaugeMetricFamily("healthd_probe_budget_limit_gpu_seconds",
                                         "The probe budget: GPU-seconds regular probes may take in 24 h"
                                         " (absent: no limit)")
        if limit is not None:
            limit_family.add_metric([], limit)
        yield limit_family
