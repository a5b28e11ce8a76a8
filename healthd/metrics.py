"""Prometheus metrics: the store's state rendered to the text exposition format, kept in memory.

``Exposition`` holds one text fragment per node and metric family and re-renders, at each refresh, only
the nodes whose data changed since the last one (``Store.changes``, discovery, recommendations); the
daemon refreshes it after each tick that changed the store, and a scrape joins cached bytes (and cached
gzip members). What a node exports depends on ``[metrics]
detail``: ``summary`` (the default: a bounded set per node, see docs/metrics.md for the count) or
``full`` (every measurement with its baseline and floor, every run timing).

The daemon's own operations (ticks, errors, missed runs) are direct instrumentation in ``DaemonMetrics``
on a ``prometheus_client`` registry, rendered next to it. Names follow Prometheus conventions:
``healthd_`` prefix, base units, ``_total`` counters; labels are bounded (never run or job ids).
"""

from __future__ import annotations

import gzip
import platform
import threading
import time
from array import array
from collections import defaultdict
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from itertools import accumulate
from sys import intern
from typing import Any, Literal

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

import healthd
from healthd.judge.metrics import (
    JUDGE_FAMILIES,
    REFERENCE_HELP,
    Labels,
    Sample,
    SignalRow,
    drain_reason,
    finding_samples,
    fleet_samples,
    passive_samples,
    series_samples,
)
from healthd.judge.model import LinkFinding
from healthd.judge.peaks import mfu
from healthd.model import Node, Outcome, Verdict
from healthd.passive.fabric import COUNTERS as IB_COUNTERS
from healthd.passive.model import SIGNALS, PassivePoll
from healthd.passive.source import error_signals
from healthd.store import Store
from healthd.store.db import collector_paused
from healthd.store.latest import ChangeCursor, Changes
from healthd.store.rows import GpuSeen, JudgedSeries, LastRun, MeasurementRow, RecommendationRow, RunTiming, Snapshot
from healthd.topology import Topology

Detail = Literal["summary", "full"]
OUTCOMES = tuple(o.value for o in Outcome)
SCHEDULER_TASKS = ("discover", "plan", "collect", "housekeeping", "topology")
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
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
FAMILIES: dict[str, tuple[str, str]] = {
    "healthd_build_info": ("gauge", "healthd build information"),
    "healthd_node_info": ("gauge", "Nodes known to healthd, with their class"),
    "healthd_node_switch": ("gauge", "1 for each node under a leaf switch (or block) of the topology, with its leaf and"
                            " its path of switches up to the root"),
    "healthd_node_gpus": ("gauge", "GPUs on the node as the cluster backend reports them"),
    "healthd_cluster_nodes": ("gauge", "Nodes by base state at the last discovery"),
    "healthd_node_probe_last_run_timestamp_seconds": (
        "gauge", "When the last probe run on the node finished (pass, fail or error)"),
    "healthd_node_probe_last_success_timestamp_seconds": (
        "gauge", "When the last passing probe run on the node finished"),
    "healthd_node_probe_last_outcome": (
        "gauge", "1 for the outcome of the last probe run on the node as the probe reported it (before judgement:"
                 " see healthd_node_verdict)"),
    "healthd_node_verdict": ("gauge", "1, labelled with the node's current verdict for the probe and its reason"),
    "healthd_node_probe_last_queue_wait_seconds": (
        "gauge", "Seconds the last finished probe run on the node waited between submission and start"),
    "healthd_node_probe_last_duration_seconds": (
        "gauge", "Wall-clock seconds the last finished probe run on the node took"),
    "healthd_node_probe_last_gpu_seconds": (
        "gauge", "GPU-seconds the last finished probe run held on the node (duration times the node's GPUs)"),
    "healthd_probe_runs_total": (
        "counter", "Probe runs finished, by probe and the outcome the probe reported (before judgement: see"
                   " healthd_node_verdict)"),
    "healthd_probe_seconds_total": ("counter", "Wall-clock seconds of finished probe runs"),
    "healthd_probe_gpu_seconds_total": (
        "counter", "GPU-seconds held by finished probe runs (wall time x GPUs of the run's nodes): the cost of"
                   " probing"),
    "healthd_probes_in_flight": ("gauge", "Probe runs submitted and not yet finished"),
    "healthd_scaling_busbw_bytes_per_second": (
        "gauge", "Bus bandwidth of the collective over a group of N idle nodes of one class (scaling sweep)"),
    "healthd_scaling_last_run_timestamp_seconds": (
        "gauge", "When the newest passing sweep over N nodes of the class finished"),
    "healthd_ddp_mfu_ratio": (
        "gauge", "Model FLOPs utilisation of the DDP step probe: model FLOP/s per GPU over the node class's dense"
                 " peak for the dtype (last probe run)"),
    **JUDGE_FAMILIES,
}
STANDBY_FAMILIES = frozenset({"healthd_build_info", "healthd_cluster_nodes"})
"""The store part's families an ``[ha]`` standby exports: its own build and what its discovery sees; the
judgement families (``healthd_node_*``, findings, recommendations, counters of probe runs) come from the leader
only, so rules and dashboards see one copy."""
STORE_COUNTERS = {"probe_runs_total": ("probe", "outcome"), "probe_seconds_total": ("probe",),
                  "probe_gpu_seconds_total": ("probe",)}

HEADLINES: dict[tuple[str, str], dict[str, tuple[str, ...]]] = {
    ("gemm", "flop_per_second"): {"dtype": ("bf16", "fp16", "tf32", "fp32", "fp8")},
    ("nccl", "busbw_bytes_per_second"): {"scope": ("node", "group", "rail"), "collective": ("all_reduce",),
                                         "placement": ("out_of_place", "in_place")},
    ("ddp", "throughput_samples_per_second"): {},
    ("nccl_tests", "avg_busbw_bytes_per_second"): {},
    ("param", "compute_flop_per_second"): {"scope": ("node", "total"), "dtype": ("bf16", "fp16", "tf32", "fp32")},
    ("horovod", "throughput_samples_per_second"): {"scope": ("total",)},
    ("ddp_benchmark", "throughput_samples_per_second"): {},
    ("pipeline", "link_min_busbw_bytes_per_second"): {"scope": ("group", "node")},
    ("pipeline", "link_min_ratio"): {"scope": ("group", "node")},
}
"""The measurements a node exports with ``detail = "summary"``, and which of their series: one per GPU (the
``gpu`` label) of the preferred value of every other label (the largest ``size_bytes``)."""
MFU_INPUT = ("ddp", "model_flop_per_second")
MFU_PREFER = {"dtype": ("bf16", "fp16", "fp32")}
"""What ``healthd_ddp_mfu_ratio`` is computed from: read with either detail, exported as a series with
``detail = "full"`` only (the ratio is the summary's figure)."""
FULL_ONLY = ("healthd_node_probe_last_success_timestamp_seconds", "healthd_node_probe_last_outcome",
             "healthd_node_probe_last_queue_wait_seconds", "healthd_node_probe_last_duration_seconds",
             "healthd_node_probe_last_gpu_seconds", "healthd_node_probe_floor_ratio")
"""Per-node families exported with ``detail = "full"`` only (besides non-headline measurements and the
``healthd_baseline_*`` and ``healthd_floor_*`` families)."""
RESYNC_S = 86400.0
"""How often ``Exposition`` reads the whole current state again (what a prune or a deleted node removed)."""
CHUNK = 256
"""Nodes per cached piece of a family: a change re-renders (and re-compresses) the pieces of its nodes."""
READ_NODES = 1000
"""Nodes whose rows a refresh reads and renders at a time: its memory is bounded by this, not by the fleet."""


@lru_cache(maxsize=4096)
def family_name(probe: str, name: str) -> str:
    return f"healthd_{probe}_{name}".replace("-", "_")


def _escape(value: str) -> str:
    if "\\" not in value and "\n" not in value and '"' not in value:
        return value
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _number(value: float) -> str:
    text = repr(float(value))
    if text[-1] == "n":
        return "NaN"
    if text[-1] == "f":
        return "-Inf" if text[0] == "-" else "+Inf"
    return text


def sample_line(family: str, labels: Labels, value: float) -> str:
    if not labels:
        return f"{family} {_number(value)}\n"
    if labels[0][0] == "node":
        if len(labels) > 1 and labels[1][0] == "gpu_uuid":
            parts = _UUID_TEMPLATES.get((family, labels[2:])) or _uuid_template(family, labels[2:])
            return (f"{parts[0]}{_escape(labels[1][1])}{parts[1]}{_escape(labels[0][1])}{parts[2]}"
                    f" {_number(value)}\n")
        found = _TEMPLATES.get((family, labels[1:])) or _template(family, labels[1:])
        return f"{found[0]}{_escape(labels[0][1])}{found[1]} {_number(value)}\n"
    text = ",".join(f'{k}="{_escape(v)}"' for k, v in sorted(labels))
    return f"{family}{{{text}}} {_number(value)}\n"


_TEMPLATES: dict[tuple[str, Labels], tuple[str, str]] = {}


def _template(family: str, others: Labels) -> tuple[str, str]:
    """The text of a sample of ``family`` before and after its ``node`` label's value, with the ``others``
    labels (cached in ``_TEMPLATES``: a fleet's nodes repeat few label sets)."""
    if len(_TEMPLATES) >= 1 << 16:
        _TEMPLATES.clear()
    items = sorted(others)
    at = sum(1 for k, _ in items if k < "node")
    before = "".join(f'{k}="{_escape(v)}",' for k, v in items[:at])
    after = "".join(f',{k}="{_escape(v)}"' for k, v in items[at:])
    found = _TEMPLATES[(family, others)] = (f'{family}{{{before}node="', f'"{after}}}')
    return found


_UUID_TEMPLATES: dict[tuple[str, Labels], tuple[str, str, str]] = {}


def _uuid_template(family: str, others: Labels) -> tuple[str, str, str]:
    """As ``_template`` for a per-GPU sample: its text before its ``gpu_uuid`` label's value, between it and its
    ``node`` label's value, and after (a sample's labels: node, gpu_uuid, then ``others``)."""
    if len(_UUID_TEMPLATES) >= 1 << 16:
        _UUID_TEMPLATES.clear()
    items = sorted(others)
    first = sum(1 for k, _ in items if k < "gpu_uuid")
    second = sum(1 for k, _ in items if k < "node")
    before = "".join(f'{k}="{_escape(v)}",' for k, v in items[:first])
    between = "".join(f'{k}="{_escape(v)}",' for k, v in items[first:second])
    after = "".join(f',{k}="{_escape(v)}"' for k, v in items[second:])
    found = _UUID_TEMPLATES[(family, others)] = (f'{family}{{{before}gpu_uuid="', f'",{between}node="',
                                                 f'"{after}}}')
    return found


_RANKS: dict[tuple[str, str, tuple[tuple[str, str], ...]], tuple[Any, ...]] = {}


def _rank(probe: str, name: str, labels: Mapping[str, str]) -> tuple[Any, ...]:
    """How far the series is from the headline of its measurement (cached: label sets are few)."""
    key = (probe, name, tuple(labels.items()))
    rank = _RANKS.get(key)
    if rank is None:
        rank = _RANKS[key] = _headline_rank(labels, HEADLINES.get((probe, name), MFU_PREFER))
    return rank


def _headline_rank(labels: Mapping[str, str], prefer: Mapping[str, tuple[str, ...]]) -> tuple[Any, ...]:
    key: list[Any] = []
    for k in sorted(labels):
        if k == "gpu":
            continue
        value = labels[k]
        order = prefer.get(k, ())
        key.append((order.index(value) if value in order else len(order),
                    -int(value) if k in ("size_bytes", "nodes") and value.isdigit() else 0, value))
    return tuple(key)


def headline(latest: Iterable[MeasurementRow]) -> list[MeasurementRow]:
    """The series of ``latest`` (one node's) that ``detail = "summary"`` exports (``HEADLINES``)."""
    by_family: dict[tuple[str, str], list[MeasurementRow]] = defaultdict(list)
    for m in latest:
        if (m.probe, m.name) in HEADLINES:
            by_family[(m.probe, m.name)].append(m)
    out: list[MeasurementRow] = []
    for rows in by_family.values():
        ranks = [_rank(m.probe, m.name, m.labels) for m in rows]
        best = min(ranks)
        out += [m for m, rank in zip(rows, ranks, strict=True) if rank == best]
    return out


def _measurement_samples(latest: Iterable[MeasurementRow], meta: dict[str, tuple[str, str]],
                         uuids: Mapping[str, str]) -> Iterator[Sample]:
    for m in latest:
        if m.node is None:
            continue
        family = family_name(m.probe, m.name)
        if family not in meta:
            suffix = family.split("_", 2)[2]
            text = next((t for k, t in MEASUREMENT_HELP.items() if suffix.endswith(k)),
                        f"Last measured {suffix.replace('_', ' ')}")
            # Only a summary may carry a "quantile" label (promtool check metrics): these are the last run's
            # quantiles, without _sum and _count.
            meta[family] = ("summary" if "quantile" in m.labels else "gauge", text + " (last probe run)")
        gpu = m.labels.get("gpu")
        if gpu is None:
            yield family, (("node", m.node), *_series_id(m.probe, m.name, m.labels)[0][2]), m.value
        else:
            yield (family, (("node", m.node), ("gpu_uuid", uuids.get(gpu, "")),
                            *_series_id(m.probe, m.name, m.labels)[0][2]), m.value)


def gpu_uuids(gpus: Iterable[GpuSeen]) -> dict[str, str]:
    """The UUID each GPU index (as a ``gpu`` label) of a node's inventory shows: one per index, the newest."""
    return {str(g.index): g.uuid or "" for g in gpus}


def _with_uuid(samples: Iterable[Sample], uuids: Mapping[str, str]) -> Iterator[Sample]:
    """``samples`` of a node, a per-GPU one (a ``gpu`` label) with the GPU's ``gpu_uuid`` (empty: unknown) where
    it has none or an empty one (a finding's, from its evidence)."""
    for family, labels, value in samples:
        gpu = next((v for k, v in labels if k == "gpu"), None)
        if not gpu:
            yield family, labels, value
        elif any(k == "gpu_uuid" for k, _ in labels):
            yield family, tuple((k, uuids.get(gpu, "")) if k == "gpu_uuid" and not v else (k, v)
                                for k, v in labels), value
        else:
            yield family, (labels[0], ("gpu_uuid", uuids.get(gpu, "")), *labels[1:]), value


@dataclass(frozen=True)
class NodeView:
    """Everything the store holds on one node's current state (what its samples are made of)."""

    name: str
    node: Node | None = None
    last_runs: tuple[LastRun, ...] = ()
    timings: tuple[RunTiming, ...] = ()
    latest: tuple[MeasurementRow, ...] = ()
    verdicts: tuple[Verdict, ...] = ()
    series: tuple[JudgedSeries, ...] = ()
    drain_reason: str | None = None
    gpus: tuple[GpuSeen, ...] = ()
    """The node's GPU inventory (``Store.gpu_inventory``): the UUID of each per-GPU series' ``gpu``."""
    headline: bool = False
    """Whether ``latest`` holds, of each measurement, the series nearest its headline only already (as
    ``headline`` chooses them; with those of ``MFU_INPUT``)."""

    @property
    def empty(self) -> bool:
        return self.node is None and self.drain_reason is None and not (self.last_runs or self.latest or self.verdicts
                                                                          or self.series)


def node_views(snap: Snapshot) -> dict[str, NodeView]:
    """The snapshot's state per node (linear in its size)."""
    parts: dict[str, dict[str, list[Any]]] = defaultdict(lambda: defaultdict(list))
    nodes = {n.name: n for n in snap.nodes}
    for n in snap.nodes:
        parts[n.name]
    for key, rows in (("last_runs", snap.last_runs), ("timings", snap.run_timings), ("latest", snap.latest),
                      ("verdicts", snap.verdicts)):
        for r in rows:
            if r.node is not None:
                parts[r.node][key].append(r)
    for s in snap.series:
        parts[s.node]["series"].append(s)
    recs: dict[str, list[RecommendationRow]] = defaultdict(list)
    for rec in snap.recommendations:
        recs[rec.node].append(rec)
        parts[rec.node]
    return {name: NodeView(name, nodes.get(name), last_runs=tuple(p["last_runs"]), timings=tuple(p["timings"]),
                           latest=tuple(p["latest"]), verdicts=tuple(p["verdicts"]), series=tuple(p["series"]),
                           drain_reason=drain_reason(recs.get(name, ())), gpus=snap.gpus.get(name, ()))
            for name, p in parts.items()}


def node_samples(v: NodeView, detail: Detail, meta: dict[str, tuple[str, str]],
                 uuids: Mapping[str, str] | None = None) -> Iterator[Sample]:
    """One node's samples; ``meta`` learns the type and help of measurement families it has not seen; ``uuids``:
    the ``gpu_uuids`` of ``v.gpus`` when the caller has them already."""
    full = detail == "full"
    name = ("node", v.name)
    if v.node is not None:
        yield ("healthd_node_info", (name, ("node_class", v.node.node_class or ""),
                                     ("gpu_type", v.node.gpu_type or "")), 1.0)
        yield "healthd_node_gpus", (name,), float(v.node.gpus)
    for lr in v.last_runs:
        labels = (name, ("probe", lr.probe))
        yield "healthd_node_probe_last_run_timestamp_seconds", labels, lr.last_run_at
        if full:
            if lr.last_success_at is not None:
                yield "healthd_node_probe_last_success_timestamp_seconds", labels, lr.last_success_at
            yield "healthd_node_probe_last_outcome", (*labels, ("outcome", lr.last_outcome.value)), 1.0
    if full:
        for t in v.timings:
            labels = (name, ("probe", t.probe))
            yield "healthd_node_probe_last_queue_wait_seconds", labels, t.queue_wait_s
            yield "healthd_node_probe_last_duration_seconds", labels, t.duration_s
            yield "healthd_node_probe_last_gpu_seconds", labels, t.duration_s * t.gpus
    for verdict in v.verdicts:
        yield ("healthd_node_verdict", (name, ("probe", verdict.probe), ("outcome", verdict.outcome.value),
                                        ("reason_code", verdict.reason_code)), 1.0)
    if full:
        shown: Iterable[MeasurementRow] = v.latest
    elif v.headline:
        shown = [m for m in v.latest if (m.probe, m.name) in HEADLINES]
    else:
        shown = headline(v.latest)
    if uuids is None:
        uuids = gpu_uuids(v.gpus)
    yield from _measurement_samples(shown, meta, uuids)
    yield from _mfu_samples(v)
    series = v.series if full else [s for s in v.series if (s.probe, s.name) in HEADLINES]
    for sample in _with_uuid(series_samples(series, full=full), uuids):
        if sample[0] not in meta and sample[0] not in FAMILIES:
            kind = sample[0].split("_", 2)[1]
            meta[sample[0]] = ("gauge", f"{REFERENCE_HELP[kind]} {sample[0].split('_', 3)[3].replace('_', ' ')}")
        yield sample
    yield from _with_uuid(finding_samples(v.verdicts), uuids)
    if v.drain_reason is not None:
        yield "healthd_drain_recommended", (name, ("reason_code", v.drain_reason)), 1.0
    elif full and v.verdicts:
        yield "healthd_drain_recommended", (name, ("reason_code", "")), 0.0


def _mfu_samples(v: NodeView) -> Iterator[Sample]:
    """``healthd_ddp_mfu_ratio{node,dtype}``: the last DDP model FLOP/s per GPU over the node class's peak for
    the dtype (``healthd/judge/peaks.toml``); none for a class without a peak."""
    node_class = v.node.node_class if v.node is not None else None
    if not node_class:
        return
    for m in v.latest:
        if (m.probe, m.name) == MFU_INPUT:
            dtype = m.labels.get("dtype", "")
            ratio = mfu(m.value, node_class, dtype)
            if ratio is not None:
                yield "healthd_ddp_mfu_ratio", (("node", v.name), ("dtype", dtype)), ratio


def _fragment(samples: Iterable[Sample]) -> dict[str, bytes]:
    lines: dict[str, list[str]] = defaultdict(list)
    for family, labels, value in samples:
        lines[family].append(sample_line(family, labels, value))
    return {intern(family): "".join(text).encode() for family, text in lines.items()}


def fleet_samples_of(snap: Snapshot, backend: str, states: Mapping[str, int], *, breaker_open: bool,
                     fleet_events: Iterable[Mapping[str, Any]],
                     switch_findings: Iterable[Mapping[str, Any]] = (),
                     topology: Topology | None = None,
                     link_findings: Iterable[LinkFinding] = ()) -> Iterator[Sample]:
    """The samples that are not per node: build, node states, counters, in-flight runs, the scaling table,
    remediation, fleet events, switch and link findings, and each node's place in the topology
    (``healthd_node_switch``, for dashboards that group nodes by switch)."""
    yield ("healthd_build_info", (("version", healthd.__version__), ("python_version", platform.python_version()),
                                  ("backend", backend)), 1.0)
    for state, count in sorted(states.items()):
        yield "healthd_cluster_nodes", (("state", state),), float(count)
    for name, labels, value in snap.counters:
        keys = STORE_COUNTERS.get(name)
        if keys is not None:
            yield f"healthd_{name}", tuple((k, labels.get(k, "")) for k in keys), value
    yield "healthd_probes_in_flight", (), float(snap.in_flight)
    seen: set[tuple[str, int]] = set()
    for cls, size, at, m in snap.scaling:
        if (cls, size) not in seen:
            seen.add((cls, size))
            yield "healthd_scaling_last_run_timestamp_seconds", (("node_class", cls), ("nodes", str(size))), at
        if m.name == "busbw_bytes_per_second":
            yield ("healthd_scaling_busbw_bytes_per_second",
                   (("node_class", cls), ("nodes", str(size)), ("collective", m.labels.get("collective", "")),
                    ("size_bytes", m.labels.get("size_bytes", "")), ("placement", m.labels.get("placement", ""))),
                   m.value)
    yield from fleet_samples(breaker_open=breaker_open, fleet_events=fleet_events, counters=snap.counters,
                             switch_findings=switch_findings, link_findings=link_findings)
    if topology is not None:
        for node in sorted(topology.leaf_of):
            path = topology.path(node)
            yield "healthd_node_switch", (("node", node), ("leaf", path[0]), ("path", "/".join(path))), 1.0


SeriesId = tuple[str, str, Labels]
"""(probe, name, sorted label items): a series of a node."""
_IDS: dict[tuple[str, str, int], tuple[Mapping[str, str], tuple[SeriesId, tuple[str, str], tuple[Any, ...]]]] = {}


def _series_id(probe: str, name: str, labels: Mapping[str, str]) -> tuple[SeriesId, tuple[str, str], tuple[Any, ...]]:
    """The one id of the series, its measurement and its headline rank (``_rank``), shared between nodes: a
    fleet repeats few label sets, and the store's rows share their label dicts (``labels_of``). Cached by the
    dict's identity (the cache holds the dict, so its id is not reused)."""
    found = _IDS.get((probe, name, id(labels)))
    if found is not None and found[0] is labels:
        return found[1]
    if len(_IDS) >= 1 << 16:
        _IDS.clear()
    series_id = (probe, name, tuple(sorted(labels.items())))
    result = (series_id, series_id[:2], _rank(probe, name, labels))
    _IDS[(probe, name, id(labels))] = (labels, result)
    return result


_NO_UUIDS: Mapping[str, str] = {}


@dataclass(slots=True)
class _NodeState:
    """One node's current rows as a refresh reads them (with ``detail = "summary"``: the headline series of
    each measurement only)."""

    node: Node | None = None
    runs: dict[str, tuple[LastRun, RunTiming]] = field(default_factory=dict)
    verdicts: dict[str, Verdict] = field(default_factory=dict)
    latest: dict[SeriesId, MeasurementRow] = field(default_factory=dict)
    series: dict[SeriesId, JudgedSeries] = field(default_factory=dict)
    best: dict[tuple[str, str], tuple[Any, ...]] = field(default_factory=dict)
    best_series: dict[tuple[str, str], tuple[Any, ...]] = field(default_factory=dict)
    drain: str | None = None
    uuids: Mapping[str, str] = field(default_factory=dict)

    def view(self, name: str, *, full: bool) -> NodeView:
        """The node's view (without run timings unless ``full``: the summary does not show them)."""
        gpus = self.node.gpus if self.node is not None else 0
        runs = [self.runs[probe] for probe in sorted(self.runs)]
        return NodeView(name, self.node, last_runs=tuple(lr for lr, _ in runs),
                        timings=tuple(RunTiming(t.node, t.probe, t.queue_wait_s, t.duration_s, gpus)
                                      for _, t in runs) if full else (),
                        latest=tuple(self.latest[k] for k in sorted(self.latest)),
                        verdicts=tuple(self.verdicts[p] for p in sorted(self.verdicts)),
                        series=tuple(self.series[k] for k in sorted(self.series)), drain_reason=self.drain,
                        headline=not full)


def _keep(held: dict[SeriesId, Any], best: dict[tuple[str, str], tuple[Any, ...]],
          row: MeasurementRow | JudgedSeries, full: bool) -> None:
    key, measurement, rank = _series_id(row.probe, row.name, row.labels)
    if not full:
        top = best.get(measurement)
        if top is not None and rank > top:
            return
        if top is None or rank < top:
            best[measurement] = rank
            for old in [k for k in held if k[:2] == measurement]:
                del held[old]
    held[key] = row


def _states(changes: Changes, *, full: bool) -> dict[str, _NodeState]:
    """The rows of ``changes`` by node."""
    states: dict[str, _NodeState] = defaultdict(_NodeState)
    for m in changes.latest:
        if m.node is not None:
            state = states[m.node]
            _keep(state.latest, state.best, m, full)
    for lr, timing in changes.runs:
        states[lr.node].runs[lr.probe] = (lr, timing)
    for v in changes.verdicts:
        held = states[v.node].verdicts
        old = held.get(v.probe)
        if old is None or v.at >= old.at:
            held[v.probe] = v
    for series in changes.series:
        state = states[series.node]
        _keep(state.series, state.best_series, series, full)
    return states


@dataclass
class _Piece:
    plain: bytes
    packed: bytes | None = None
    ends: array[int] = field(default_factory=lambda: array("I"))
    """Where the text of each node of the piece's chunk ends in ``plain`` (a piece of a family)."""

    def gzip(self) -> bytes:
        if self.packed is None:
            self.packed = gzip.compress(self.plain, compresslevel=6)
        return self.packed


@dataclass
class _Body:
    """One rendering of the store part: its families in order, each a header and its pieces."""

    families: list[tuple[_Piece, list[_Piece]]] = field(default_factory=list)
    plain: bytes | None = None
    packed: bytes | None = None


class Exposition:
    """The store's part of ``/metrics``, kept in memory and refreshed incrementally (thread-safe)."""

    def __init__(self, store: Store, backend_name: Callable[[], str], detail: Detail = "summary") -> None:
        self._store = store
        self._backend_name = backend_name
        self.detail: Detail = detail
        self._lock = threading.Lock()
        self._cursor: ChangeCursor | None = None
        self._version: object = None
        self._synced_at = 0.0
        self._nodes: dict[str, tuple[str, str | None, str | None, int]] = {}
        """(state, class, GPU type, GPUs) of each node at the discovery that last changed what its own series
        show of it (all but its state, which only counts in ``healthd_cluster_nodes``)."""
        self._drains: dict[str, str] = {}
        self._meta: dict[str, tuple[str, str]] = dict(FAMILIES)
        self._order: list[str] = []
        self._index: dict[str, int] = {}
        self._pieces: dict[tuple[str, int], _Piece] = {}
        self._chunk_families: dict[int, set[str]] = {}
        self._headers: dict[str, _Piece] = {}
        self._body = _Body()
        self._topology: Topology | None = None
        self.rendered_nodes = 0
        """How many node renderings the refreshes so far took (a test's measure of incrementality)."""

    def set_topology(self, topology: Topology | None) -> None:
        """Export each node's switch (``healthd_node_switch``) from the next refresh on; ``None``: none."""
        with self._lock:
            self._topology = topology
            self._version = None

    def set_detail(self, detail: Detail) -> None:
        """Export ``detail`` from the next refresh on (every node is read and rendered again)."""
        with self._lock:
            if detail != self.detail:
                self.detail = detail
                self._cursor = None
                self._version = None

    def refresh_if_changed(self) -> bool:
        """``refresh`` when the store has changed since the last one (a commit by this process or another);
        whether it did."""
        version = self._store.data_version()
        if version == self._version:
            return False
        self.refresh()
        self._version = version
        return True

    def refresh(self) -> None:
        """Read what changed in the store since the last refresh and re-render the nodes it touched (read again
        from the store: only their rendering is kept); every ``RESYNC_S`` (and when the store's rows were
        renumbered) everything is read again."""
        with self._lock, collector_paused():
            store = self._store
            families = None if self.detail == "full" else {*HEADLINES.keys(), MFU_INPUT}
            resync = self._cursor is None or time.monotonic() - self._synced_at > RESYNC_S
            changed: set[str] = set()
            if not resync and self._cursor is not None:
                try:
                    changes, cursor = store.changes(self._cursor, families)
                    changed |= changes.nodes()
                except LookupError:
                    resync = True
            if resync:
                cursor = store.change_marks()
                changed |= self._index.keys() | set(store.shown_nodes())
                self._nodes = {}
                self._drains = {}
                self._synced_at = time.monotonic()
            self._cursor = cursor
            nodes = store.node_summaries()
            for name, base, node_class, gpu_type, gpus in nodes:
                old = self._nodes.get(name)
                if old is None or old[1:] != (node_class, gpu_type, gpus):
                    self._nodes[intern(name)] = (intern(base), node_class and intern(node_class),
                                                 gpu_type and intern(gpu_type), gpus)
                    changed.add(name)
            for name in self._nodes.keys() - {n[0] for n in nodes}:
                del self._nodes[name]
                changed.add(name)
            by_node: dict[str, list[RecommendationRow]] = defaultdict(list)
            for r in store.recommendations(limit=1_000_000):
                by_node[r.node].append(r)
            for name in by_node.keys() | self._drains.keys():
                reason = drain_reason(by_node.get(name, ()))
                if self._drains.get(name) != reason:
                    if reason is None:
                        del self._drains[name]
                    else:
                        self._drains[name] = reason
                    changed.add(name)
            rendered: dict[str, dict[str, bytes]] = {}
            ordered = sorted(changed)
            for start in range(0, len(ordered), READ_NODES):
                part = ordered[start:start + READ_NODES]
                states = _states(self._read(part, families), full=families is None)
                inventory = store.gpu_uuids(part)
                for name in part:
                    state = states.pop(name, None) or _NodeState()
                    node = self._nodes.get(name)
                    state.node = (Node(name, node[0], gpus=node[3], gpu_type=node[2], node_class=node[1])
                                  if node else None)
                    state.drain = self._drains.get(name)
                    state.uuids = inventory.get(name, _NO_UUIDS)
                    view = state.view(name, full=families is None)
                    if not view.empty:
                        rendered[name] = _fragment(node_samples(view, self.detail, self._meta, state.uuids))
                        self.rendered_nodes += 1
                del states
            counts: dict[str, int] = defaultdict(int)
            for n in nodes:
                counts[n[1]] += 1
            breaker = store.remediation_state("breaker")
            breaker_open = bool(isinstance(breaker, dict) and breaker.get("open"))
            fleet = _fragment(fleet_samples_of(store.snapshot(nodes=(), fleet=True), self._backend_name(), counts,
                                               breaker_open=breaker_open, fleet_events=store.fleet_events(limit=200),
                                               switch_findings=store.switch_findings(limit=200),
                                               topology=self._topology,
                                               link_findings=store.link_findings(active_only=True, limit=1000)))
            self._assemble(fleet, rendered, changed - rendered.keys())

    def _read(self, names: Sequence[str], families: Collection[tuple[str, str]] | None) -> Changes:
        """The current rows of the nodes ``names`` (as ``Store.changes`` gives every row)."""
        store = self._store
        runs = {(lr.node, lr.probe): lr for lr in store.last_runs(names)}
        return Changes(latest=tuple(store.latest_measurements(names, families)),
                       runs=tuple((runs[(t.node, t.probe)], t) for t in store.last_run_timings(names)
                                  if (t.node, t.probe) in runs),
                       verdicts=tuple(store.current_verdicts_of(names)),
                       series=tuple(store.judge_series_of(names, families)))

    def _assemble(self, fleet: Mapping[str, bytes], rendered: Mapping[str, Mapping[str, bytes]],
                  gone: Collection[str]) -> None:
        """Rebuild the pieces of the chunks with a node in ``rendered`` (its new text by family) or ``gone`` (no
        longer shown), and every chunk when the nodes shown changed: each other node's text is cut out of the
        pieces it was in (``_Piece.ends``)."""
        old_index, old_pieces, old_families = self._index, self._pieces, self._chunk_families

        def text_of(name: str) -> Mapping[str, bytes]:
            if name in rendered:
                return rendered[name]
            chunk, at = divmod(old_index[name], CHUNK)
            out: dict[str, bytes] = {}
            for family in old_families[chunk]:
                piece = old_pieces[(family, chunk)]
                start, end = piece.ends[at - 1] if at else 0, piece.ends[at]
                if end > start:
                    out[family] = piece.plain[start:end]
            return out

        if rendered.keys() - old_index.keys() or not old_index.keys().isdisjoint(gone):
            order = sorted((old_index.keys() - set(gone)) | rendered.keys())
            self._order, self._index = order, {name: i for i, name in enumerate(order)}
            self._pieces, self._chunk_families = {}, {}
            dirty = set(range((len(order) + CHUNK - 1) // CHUNK))
        else:
            order = self._order
            dirty = {old_index[n] // CHUNK for n in rendered}
        for chunk in sorted(dirty):
            texts = [text_of(n) for n in order[chunk * CHUNK:(chunk + 1) * CHUNK]]
            for family in self._chunk_families.pop(chunk, ()):
                del self._pieces[(family, chunk)]
            found = {family for text in texts for family in text}
            for family in found:
                parts = [text.get(family, b"") for text in texts]
                self._pieces[(family, chunk)] = _Piece(b"".join(parts), ends=array("I", accumulate(map(len, parts))))
            self._chunk_families[chunk] = found
        present: dict[str, list[int]] = defaultdict(list)
        for chunk, found in sorted(self._chunk_families.items()):
            for family in found:
                present[family].append(chunk)
        body = _Body()
        for family in sorted(present.keys() | fleet.keys()):
            pieces = [_Piece(fleet[family])] if family in fleet else []
            pieces += [self._pieces[(family, chunk)] for chunk in present[family]]
            body.families.append((self._header(family), pieces))
        self._body = body

    def _header(self, family: str) -> _Piece:
        header = self._headers.get(family)
        if header is None:
            kind, text = self._meta.get(family, ("gauge", family))
            header = self._headers[family] = _Piece(f"# HELP {family} {text}\n# TYPE {family} {kind}\n".encode())
        return header

    def body(self) -> bytes:
        """The last refresh's text (the store part of ``/metrics``)."""
        with self._lock:
            body = self._body
            if body.plain is None:
                body.plain = b"".join(h.plain + b"".join(p.plain for p in pieces) for h, pieces in body.families)
            return body.plain

    def body_of(self, families: Collection[str]) -> bytes:
        """The last refresh's text of ``families`` only (not cached: an ``[ha]`` standby's few lines)."""
        with self._lock:
            return b"".join(h.plain + b"".join(p.plain for p in pieces) for h, pieces in self._body.families
                            if h.plain.split(b" ", 3)[2].decode() in families)

    def body_gzip(self) -> bytes:
        """``body()`` gzip-compressed: one gzip member per piece, each compressed once while it is unchanged
        (a gzip stream may be a series of members)."""
        with self._lock:
            body = self._body
            if body.packed is None:
                body.packed = b"".join(h.gzip() + b"".join(p.gzip() for p in pieces) for h, pieces in body.families)
            return body.packed


def render_text(store: Store, backend: str = "slurm", detail: Detail = "summary",
                registry: CollectorRegistry | None = None) -> str:
    """One rendering of what ``/metrics`` serves from ``store`` (and ``registry`` first): for tools and tests."""
    exposition = Exposition(store, lambda: backend, detail)
    exposition.refresh()
    head = generate_latest(registry).decode() if registry is not None else ""
    return head + exposition.body().decode()


class PassiveSignalCollector(Collector):
    """``healthd_node_passive_signal`` from the judge's passive tracks at scrape time (a handful: only the
    signals followed now)."""

    def __init__(self, tracks: Callable[[], Iterable[SignalRow]]) -> None:
        self._tracks = tracks

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        family = GaugeMetricFamily("healthd_node_passive_signal", JUDGE_FAMILIES["healthd_node_passive_signal"][1],
                                   labels=["node", "gpu", "gpu_uuid", "device", "port", "signal", "code", "strength",
                                           "stage"])
        for _, labels, value in passive_samples(self._tracks()):
            family.add_metric([v for _, v in labels], value)
        yield family


CONTAINER_SETUP_BUCKETS = (0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
"""From a warm local image (about a second) to a cold import of a multi-GB image over a shared file system."""


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
        self.topology_errors = Counter("healthd_topology_read_errors",
                                       "Topology reads that failed (the previous topology kept)", registry=registry)
        self.topology_nodes = Gauge("healthd_topology_nodes", "Nodes under a leaf switch or block of the topology in "
                                    "use (0: no topology)", registry=registry)
        self.container_setup = Histogram(
            "healthd_probe_container_setup_seconds", "Seconds from a containerised probe step's launch to the probe's "
            "own start (image import or mount, the runtime, the interpreter), by node class and launcher kind",
            ["node_class", "kind"], buckets=CONTAINER_SETUP_BUCKETS, registry=registry)
        for kind in ("tick", "submit", "parse", "collect", "backend", "store", "config_reload"):
            self.errors.labels(kind)
        for task in SCHEDULER_TASKS:
            self.ticks.labels(task)
            self.tick_errors.labels(task)
            self.missed.labels(task)


class PassiveMetrics:
    """The passive source's own health (``[passive]``; registered only while it is on)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.up = Gauge("healthd_passive_up", "1 if the last poll of the site's Prometheus got an answer",
                        registry=registry)
        self.query_errors = Counter("healthd_passive_query_errors", "Passive-signal queries that failed or "
                                    "answered bad values, by signal", ["signal"], registry=registry)
        self.unknown_series = Counter("healthd_passive_unknown_series", "Passive-signal series naming a host "
                                      "healthd does not know (ignored)", registry=registry)
        self.available = Gauge("healthd_passive_signal_available", "1 if the site's Prometheus has series of "
                               "the signal, 0 if it has none (unavailable, never healthy)", ["signal"],
                               registry=registry)
        self.last_poll = Gauge("healthd_passive_last_poll_timestamp_seconds",
                               "When the passive source last polled the site's Prometheus", registry=registry)
        for signal in SIGNALS:
            self.query_errors.labels(signal)

    def record(self, poll: PassivePoll) -> None:
        self.up.set(1 if poll.up else 0)
        self.last_poll.set(poll.at)
        for signal, n in error_signals(poll).items():
            self.query_errors.labels(signal).inc(n)
        self.unknown_series.inc(poll.unknown_series)
        for signal in SIGNALS:
            if signal in poll.unavailable:
                self.available.labels(signal).set(0)
            elif signal not in poll.failed:
                self.available.labels(signal).set(1)
        fabric = poll.fabric
        if fabric is not None and "present" not in fabric.failed:
            self.available.labels("infiniband").set(1 if fabric.covered else 0)
            for counter in IB_COUNTERS:
                lacking = fabric.covered and any(counter in missing for missing in fabric.unavailable.values())
                self.available.labels(f"ib_{counter}").set(0 if not fabric.covered or lacking else 1)
