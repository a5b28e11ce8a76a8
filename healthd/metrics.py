"""Prometheus metrics: one Collector that reads a store snapshot at scrape time.

Per-node series come from the store, so a node that leaves the cluster leaves the scrape.
The daemon's own operations (ticks, errors, missed runs) are direct instrumentation in
``DaemonMetrics`` on the same, dedicated registry. Names follow Prometheus conventions:
``healthd_`` prefix, base units, ``_total`` counters; labels are bounded (never run or job ids).
"""

from __future__ import annotations

import platform
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily, Metric
from prometheus_client.registry import Collector

import healthd
from healthd.judge.peaks import mfu
from healthd.model import Outcome, Verdict
from healthd.store.rows import Snapshot

OUTCOMES = tuple(o.value for o in Outcome)
SCHEDULER_TASKS = ("discover", "plan", "collect", "housekeeping")
MEASUREMENT_HELP = {
    "busbw_bytes_per_second": "Bus bandwidth as nccl-tests defines it (algbw times the collective's bus factor)",
    "algbw_bytes_per_second": "Algorithm bandwidth as nccl-tests defines it (bytes / time)",
    "time_seconds": "Mean time of one collective, averaged across ranks",
    "flop_per_second": "Matrix-multiply rate, 2*M*N*K / time, per GPU and dtype",
    "memory_bandwidth_bytes_per_second": "Device memory bandwidth of a large copy (bytes read + written)",
    "throughput_samples_per_second": "Training samples per second of the DDP step probe",
    "single_rank_throughput_samples_per_second": "Samples per second of the same model without DDP on one rank",
    "step_seconds": "DDP training step time at a quantile",
    "scaling_efficiency_ratio": "DDP samples/s per rank divided by single-rank samples/s",
    "model_flop_per_second": "Model FLOP/s per GPU of the DDP step: 6 x parameters x tokens/s (attention excluded)",
    "mlp_flop_per_second": "MLP training rate per GPU and dtype, 6 x batch x sum(in x out) / step (PARAM's linear)",
    "embedding_bag_bytes_per_second": "EmbeddingBag rows read per second per GPU (PARAM's emb benchmark)",
    "visible_gpus": "GPUs visible to the probe on the node",
}


def verdict_family(verdicts: Iterable[Verdict]) -> GaugeMetricFamily:
    """``healthd_node_verdict``: one sample per outcome, 1 for the current one (with its reason code)."""
    family = GaugeMetricFamily("healthd_node_verdict",
                               "1 for the node's current verdict for the probe, 0 for the others",
                               labels=["node", "probe", "outcome", "reason_code"])
    for v in verdicts:
        for outcome in OUTCOMES:
            current = v.outcome.value == outcome
            family.add_metric([v.node, v.probe, outcome, v.reason_code if current else ""], float(current))
    return family


def _family_name(probe: str, name: str) -> str:
    return f"healthd_{probe}_{name}".replace("-", "_")


class StoreCollector(Collector):
    """Builds every store-derived metric family from one snapshot per scrape."""

    def __init__(self, snapshot: Callable[[], Snapshot], backend_name: Callable[[], str]) -> None:
        self._snapshot = snapshot
        self._backend_name = backend_name

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        snap = self._snapshot()
        info = InfoMetricFamily("healthd_build", "healthd build information")
        info.add_metric([], {"version": healthd.__version__, "python_version": platform.python_version(),
                             "backend": self._backend_name()})
        yield info

        node_info = GaugeMetricFamily("healthd_node_info", "Nodes known to healthd, with their class",
                                      labels=["node", "node_class", "gpu_type"])
        by_state: dict[str, int] = defaultdict(int)
        for node in snap.nodes:
            node_info.add_metric([node.name, node.node_class or "", node.gpu_type or ""], 1.0)
            by_state[node.state] += 1
        yield node_info
        nodes = GaugeMetricFamily("healthd_cluster_nodes", "Nodes by base state at the last discovery",
                                  labels=["state"])
        for state, count in sorted(by_state.items()):
            nodes.add_metric([state], float(count))
        yield nodes

        last_run = GaugeMetricFamily("healthd_node_probe_last_run_timestamp_seconds",
                                     "When the last probe run on the node finished (pass, fail or error)",
                                     labels=["node", "probe"])
        last_ok = GaugeMetricFamily("healthd_node_probe_last_success_timestamp_seconds",
                                    "When the last passing probe run on the node finished", labels=["node", "probe"])
        last_outcome = GaugeMetricFamily("healthd_node_probe_last_outcome",
                                         "1 for the outcome of the last probe run on the node as the probe reported"
                                         " it (before judgement: see healthd_node_verdict), 0 for the others",
                                         labels=["node", "probe", "outcome"])
        for lr in snap.last_runs:
            last_run.add_metric([lr.node, lr.probe], lr.last_run_at)
            if lr.last_success_at is not None:
                last_ok.add_metric([lr.node, lr.probe], lr.last_success_at)
            for outcome in OUTCOMES:
                last_outcome.add_metric([lr.node, lr.probe, outcome], float(lr.last_outcome.value == outcome))
        yield last_run
        yield last_ok
        yield last_outcome

        yield verdict_family(snap.verdicts)

        yield from self._measurements(snap)
        yield mfu_family(snap)

        runs = CounterMetricFamily("healthd_probe_runs", "Probe runs finished, by probe and the outcome the probe"
                                   " reported (before judgement: see healthd_node_verdict)",
                                   labels=["probe", "outcome"])
        seconds = CounterMetricFamily("healthd_probe_seconds", "Wall-clock seconds of finished probe runs",
                                      labels=["probe"])
        gpu_seconds_total = CounterMetricFamily(
            "healthd_probe_gpu_seconds",
            "GPU-seconds held by finished probe runs (wall time x GPUs of the run's nodes): the cost of probing",
            labels=["probe"],
        )
        for name, labels, value in snap.counters:
            if name == "probe_runs_total":
                runs.add_metric([labels["probe"], labels["outcome"]], value)
            elif name == "probe_seconds_total":
                seconds.add_metric([labels["probe"]], value)
            elif name == "probe_gpu_seconds_total":
                gpu_seconds_total.add_metric([labels["probe"]], value)
        yield runs
        yield seconds
        yield gpu_seconds_total

        yield from self._scaling(snap)

        in_flight = GaugeMetricFamily("healthd_probes_in_flight", "Probe runs submitted and not yet finished")
        in_flight.add_metric([], float(snap.in_flight))
        yield in_flight

        gpus = GaugeMetricFamily("healthd_node_gpus", "GPUs on the node as the cluster backend reports them",
                                 labels=["node"])
        for node in snap.nodes:
            gpus.add_metric([node.name], float(node.gpus))
        yield gpus
        queue_wait = GaugeMetricFamily("healthd_node_probe_last_queue_wait_seconds",
                                       "Seconds the last finished probe run on the node waited between submission"
                                       " and start", labels=["node", "probe"])
        duration = GaugeMetricFamily("healthd_node_probe_last_duration_seconds",
                                     "Wall-clock seconds the last finished probe run on the node took",
                                     labels=["node", "probe"])
        gpu_seconds = GaugeMetricFamily("healthd_node_probe_last_gpu_seconds",
                                        "GPU-seconds the last finished probe run held on the node"
                                        " (duration times the node's GPUs)", labels=["node", "probe"])
        for t in snap.run_timings:
            queue_wait.add_metric([t.node, t.probe], t.queue_wait_s)
            duration.add_metric([t.node, t.probe], t.duration_s)
            gpu_seconds.add_metric([t.node, t.probe], t.duration_s * t.gpus)
        yield queue_wait
        yield duration
        yield gpu_seconds

    @staticmethod
    def _scaling(snap: Snapshot) -> Iterator[Metric]:
        """The scaling table: the newest passing sweep per node class and node count."""
        busbw = GaugeMetricFamily(
            "healthd_scaling_busbw_bytes_per_second",
            "Bus bandwidth of the collective over a group of N idle nodes of one class (scaling sweep)",
            labels=["node_class", "nodes", "collective", "size_bytes", "placement"],
        )
        last = GaugeMetricFamily("healthd_scaling_last_run_timestamp_seconds",
                                 "When the newest passing sweep over N nodes of the class finished",
                                 labels=["node_class", "nodes"])
        seen: set[tuple[str, int]] = set()
        for cls, size, at, m in snap.scaling:
            if (cls, size) not in seen:
                seen.add((cls, size))
                last.add_metric([cls, str(size)], at)
            if m.name == "busbw_bytes_per_second":
                busbw.add_metric([cls, str(size), m.labels.get("collective", ""), m.labels.get("size_bytes", ""),
                                  m.labels.get("placement", "")], m.value)
        yield busbw
        yield last

    @staticmethod
    def _measurements(snap: Snapshot) -> Iterator[Metric]:
        series: dict[str, list[tuple[dict[str, str], float]]] = defaultdict(list)
        for m in snap.latest:
            if m.node is None:
                continue
            series[_family_name(m.probe, m.name)].append(({"node": m.node, **m.labels}, m.value))
        for family_name in sorted(series):
            rows = series[family_name]
            keys = ["node", *sorted({k for labels, _ in rows for k in labels} - {"node"})]
            suffix = family_name.split("_", 2)[2]
            help_text = MEASUREMENT_HELP.get(suffix) or next(
                (text for key, text in MEASUREMENT_HELP.items() if suffix.endswith(key)),
                f"Last measured {suffix.replace('_', ' ')}")
            if "quantile" in keys:
                # Only a summary may carry a "quantile" label (promtool check metrics); these are the last
                # run's quantiles, without _sum and _count.
                summary = Metric(family_name, help_text + " (last probe run)", "summary")
                for labels, value in rows:
                    summary.add_sample(family_name, {k: labels.get(k, "") for k in keys}, value)
                yield summary
                continue
            family = GaugeMetricFamily(family_name, help_text + " (last probe run)", labels=keys)
            for labels, value in rows:
                family.add_metric([labels.get(k, "") for k in keys], value)
            yield family


def mfu_family(snap: Snapshot) -> GaugeMetricFamily:
    """``healthd_ddp_mfu_ratio{node,dtype}``: the last DDP model FLOP/s per GPU over the node class's peak for
    the dtype (``healthd/judge/peaks.toml``); one series per node, none for a class without a peak."""
    family = GaugeMetricFamily("healthd_ddp_mfu_ratio", "Model FLOPs utilisation of the DDP step probe: model"
                               " FLOP/s per GPU over the node class's dense peak for the dtype (last probe run)",
                               labels=["node", "dtype"])
    classes = {n.name: n.node_class for n in snap.nodes}
    for m in snap.latest:
        cls = classes.get(m.node or "")
        if m.probe != "ddp" or m.name != "model_flop_per_second" or not cls:
            continue
        dtype = m.labels.get("dtype", "")
        ratio = mfu(m.value, cls, dtype)
        if ratio is not None:
            family.add_metric([m.node or "", dtype], ratio)
    return family


class DaemonMetrics:
    """Direct instrumentation of the daemon's own work."""

    def __init__(self, registry: CollectorRegistry) -> None:
        # The label is "task", not "job": Prometheus renames a scraped "job" label to "exported_job".
        self.ticks = Counter("healthd_scheduler_ticks", "Scheduler ticks run, by task", ["task"], registry=registry)
        self.tick_errors = Counter("healthd_scheduler_tick_errors", "Scheduler ticks that raised, by task",
                                   ["task"], registry=registry)
        self.missed = Counter("healthd_scheduler_missed_runs", "Scheduled ticks skipped (missed or still running)",
                              ["task"], registry=registry)
        self.last_tick = Gauge("healthd_scheduler_last_tick_timestamp_seconds", "When each scheduler task last ran",
                               ["task"], registry=registry)
        self.errors = Counter("healthd_errors", "Errors handled without stopping, by kind", ["kind"],
                              registry=registry)
        self.backend_up = Gauge("healthd_backend_up", "1 if the last call to the cluster backend worked",
                                ["backend"], registry=registry)
        self.slurm_up = Gauge("healthd_slurm_up", "1 if the last Slurm command worked (0 on the local backend)",
                              registry=registry)
        for kind in ("tick", "submit", "parse", "collect", "backend", "store", "config_reload"):
            self.errors.labels(kind)
        for task in SCHEDULER_TASKS:
            self.ticks.labels(task)
            self.tick_errors.labels(task)
            self.missed.labels(task)
