"""Findings of a run's judged measurements: the floor, the node's own baseline and the fleet (pure,
given the judge's state through ``Context``).

Per measurement and node: below the class's floor (``floors``, widened by the class's noise), off the
node's own baseline (``baseline.drift``, thresholds from the series' noise), an outlier of its class
(``fleet.outlier``; during a fleet event only from the class since the event began), and on a node with
``GPU_PEERS_MIN`` GPUs or more, an outlier of its own GPUs. A GPU slowed by its hardware in the run's own
NVML readings has its findings say so (``throttling``). A node's figures of its links to other nodes
(``link_*{scope=group}``, the pipeline probe's) are the group's findings, with the ends of the run's slowest
inter-node link as the suspects (``RunFindings.ends``): a slow path between two nodes is localised by
re-pairing, and named a link finding when neither end is at fault (``healthd.judge.links``).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Protocol

from healthd.config import JudgeSettings
from healthd.judge.baseline import Baseline, drift, robust_stats
from healthd.judge.fleet import FleetStats, outlier
from healthd.judge.floors import FloorTable, below_floor
from healthd.judge.model import Finding, MeasurementInput, RunInput, SeriesKey, SeriesState
from healthd.judge.noise import OWN_SPREAD_MIN, k_for, noisy_floor, relative_noise
from healthd.judge.sources.seam import BaseSource, FleetCache, RunFindings, Selected
from healthd.model import Outcome
from healthd.node_class import DEFAULT_CLASS

GPU_PEERS_MIN = 4
"""A node's GPUs are compared with each other when it has at least this many."""

THROTTLED_AT = 0.1
"""A GPU slowed by its hardware (HW slowdown, thermal, power brake) in at least this share of a
GEMM window's NVML readings (``throttle_ratio``) has its findings of that window say so."""

class Context(Protocol):
    """What the measurement source reads of the judge's state (``Judge`` provides it)."""

    settings: JudgeSettings
    floors: FloorTable
    classes: dict[str, str]

    @property
    def drift_fraction(self) -> float: ...

    @property
    def min_deviation(self) -> float: ...

    def node_class(self, node: str) -> str: ...

    def state(self, node: str, key: SeriesKey) -> SeriesState: ...

    def fleet(self, cls: str, fkey: SeriesKey, now: float, cache: FleetCache) -> FleetStats | None: ...

    def class_noise(self, cls: str, fkey: SeriesKey) -> float | None: ...

    def in_event(self, cls: str, probe: str, key: SeriesKey | None = None) -> bool: ...


def inter_node_link(m: MeasurementInput, run: RunInput) -> bool:
    """A node's figure of its links to other nodes (``link_*{scope=group}`` of a multi-node run): a finding
    on it is one on the path between two nodes, localised like a pair's result (``healthd.judge.links``),
    not one on the node."""
    return m.name.startswith("link_") and m.labels.get("scope") == "group" and len(run.nodes) > 1


def link_ends(run: RunInput) -> tuple[str, ...]:
    """The nodes at the ends of the run's slowest inter-node link (``RunInput.links``), in the run's order."""
    ends = {node for node, scope in run.links if scope == "group"}
    return tuple(n for n in run.nodes if n in ends)


def small_stats(values: Sequence[float], *, peers: str) -> FleetStats:
    """``fleet_stats`` for a handful of values (a node's GPUs), without numpy's overhead."""
    median, spread = robust_stats(values)
    logs = robust_stats([math.log(v) for v in values]) if all(v > 0 for v in values) else (None, None)
    return FleetStats(median, spread, len(values), len(values), peers, *logs)


def throttling(run: RunInput) -> dict[tuple[str, str | None, str | None], str]:
    """(node, gpu, dtype) -> ``the GPU was throttled 80% of the window at 1,330 MHz`` for the GPUs
    the run's own NVML readings (``probes.telemetry``) show slowed by their hardware."""
    clocks = {(m.node, m.labels.get("gpu"), m.labels.get("dtype")): m.value
              for m in run.measurements if m.name == "sm_clock_hertz" and m.node}
    out: dict[tuple[str, str | None, str | None], str] = {}
    for m in run.measurements:
        if m.name != "throttle_ratio" or not m.node or m.value < THROTTLED_AT:
            continue
        where = (m.node, m.labels.get("gpu"), m.labels.get("dtype"))
        clock = clocks.get(where)
        at = f" at {clock / 1e6:,.0f} MHz" if clock else ""
        out[where] = (f"the GPU was throttled (hardware slowdown, thermal or power brake) {m.value:.0%} "
                      f"of the window{at}")
    return out


def gpu_stats(ctx: Context, node: str, fkey: SeriesKey, values: Sequence[float], now: float,
              cache: FleetCache) -> FleetStats:
    """A node's GPUs as peers; their spread is at least what healthy GPUs show: the class's GPUs'
    relative spread (a handful of values can agree by chance; one GPU's noise is no fault)."""
    stats = small_stats(values, peers=f"this node's {len(values)} GPUs")
    cls = ctx.node_class(node)
    pooled = ctx.fleet(cls, fkey, now, cache)
    rel = pooled.relative_spread if pooled is not None else 0.0
    return stats.with_relative_spread(max(rel, ctx.class_noise(cls, fkey) or 0.0))


def judge(ctx: Context, run: RunInput, selected: Sequence[Selected], cache: FleetCache, now: float,
          ev: RunFindings) -> None:
    """Add the findings of ``selected`` (the run's judged measurements) to ``ev``."""
    s = ctx.settings
    gpu_values: dict[tuple[str, SeriesKey], list[float]] = defaultdict(list)
    for sel in selected:
        if sel.m.node and "gpu" in sel.m.labels:
            gpu_values[(sel.m.node, sel.fkey)].append(sel.m.value)
    gpu_peers: Mapping[tuple[str, SeriesKey], FleetStats] = {
        k: gpu_stats(ctx, k[0], k[1], v, now, cache) for k, v in gpu_values.items() if len(v) >= GPU_PEERS_MIN}
    classes = ctx.classes
    per_node: dict[str | None, int] = defaultdict(int)
    for sel in selected:
        per_node[sel.m.node] += 1
    c = s.confirm
    throttled = throttling(run)
    for m, direction, key, fkey in selected:
        members = (m.node,) if m.node else run.nodes
        k = k_for(s.false_drains_per_1000_node_days, s.runs_per_node_day,
                  per_node[m.node] + per_node[None], c.n, c.m)
        z_threshold = max(s.fleet.z_threshold, k)
        for node in members:
            cls = classes.get(node, DEFAULT_CLASS)
            found: list[Finding] = []
            st = ctx.state(node, key)
            rule = ctx.floors.lookup(cls, key)
            st.floor = rule.value if rule is not None else None
            stats = ctx.fleet(cls, fkey, now, cache)
            in_event = ctx.in_event(cls, run.probe, fkey)
            if rule is not None:
                floor = noisy_floor(rule.value, direction, stats.median if stats else None,
                                    stats.spread if stats else 0.0, k)
                f = below_floor(key, m.value, floor, direction)
                if f is not None:
                    found.append(f)
            if st.baseline is not None and st.spread is not None and st.accepted_count >= s.baseline.min_samples:
                base = Baseline(st.baseline, st.spread, st.accepted_count)
                class_noise = ctx.class_noise(cls, fkey)
                if class_noise is None and stats is not None and stats.median:
                    class_noise = stats.spread / abs(stats.median)
                noise = relative_noise(st.spread, st.baseline, st.accepted_count, class_noise)
                spread_k = s.baseline.spread_k if st.accepted_count >= OWN_SPREAD_MIN else 0.0
                f = drift(key, m.value, base, direction, fraction=ctx.drift_fraction, spread_k=spread_k,
                          noise_allowed=k * noise)
                if f is not None:
                    found.append(f)
                if m.node and noise > 0 and st.baseline and not in_event:
                    gap = (st.baseline - m.value) if direction == "higher" else (m.value - st.baseline)
                    rel = gap / abs(st.baseline)
                    ev.shortfalls.setdefault(node, []).append((key, rel / noise, rel))
            if stats is not None:
                f = outlier(key, m.value, stats, direction, z_threshold=z_threshold,
                            min_deviation=ctx.min_deviation, event_proof=in_event)
                if f is not None:
                    found.append(f)
            gstats = gpu_peers.get((node, fkey)) if m.node else None
            if gstats is not None:
                f = outlier(key, m.value, gstats, direction, z_threshold=z_threshold,
                            min_deviation=ctx.min_deviation, event_proof=True)
                if f is not None:
                    found.append(replace(f, switch_proof=True))
            uuid = run.gpu_uuids.get((node, m.labels["gpu"])) if found and "gpu" in m.labels else None
            if uuid:
                found = [f.on_gpu(uuid) for f in found]
            ev.values.append((node, key, m.value, m.node is None))
            why = throttled.get((node, m.labels.get("gpu"), m.labels.get("dtype"))) if found else None
            if why:
                found = [replace(f, detail=f"{f.detail}; {why}") for f in found]
            link = run.links.get((node, m.labels.get("scope", ""))) if found and m.name.startswith("link_") else None
            if link:
                found = [replace(f, detail=f"{f.detail}; the slowest link: {link}") for f in found]
            if m.node and not (found and inter_node_link(m, run)):
                ev.node_findings.setdefault(node, []).extend(found)
            else:
                ev.group_findings.extend(found)
                if m.node:
                    ev.ends = link_ends(run)


class Measurements(BaseSource):
    """A run's judged measurements against floor, own baseline and fleet (``judge``)."""

    name = "measurements"

    def judge_run(self, ctx: Context, run: RunInput, selected: Sequence[Selected], cache: FleetCache,
                  now: float, ev: RunFindings) -> None:
        if run.outcome is not Outcome.FAIL:
            judge(ctx, run, selected, cache, now, ev)
