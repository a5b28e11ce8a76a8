"""Prometheus families of judgement and remediation, built from the store at scrape time.

``judge_metric_families(judge_snapshot(store))`` yields them; ``JudgeCollector(store)`` is a
ready ``prometheus_client`` collector to register next to the daemon's ``StoreCollector``.
Labels stay bounded (node, the measurement's own labels, reason codes, node classes, probes).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from healthd.judge.model import CONFIRMED, EVIDENCE_LABELS, ReasonCode
from healthd.metrics import verdict_family
from healthd.model import Outcome, Verdict
from healthd.store import Store
from healthd.store.rows import RecommendationRow

ACTIONS = ("drain", "undrain")
RESULTS = ("done", "refused", "failed")


@dataclass(frozen=True)
class JudgeSnapshot:
    series: tuple[dict[str, Any], ...]
    """Judged series: node, probe, name, labels, floor, baseline."""
    recommendations: tuple[RecommendationRow, ...]
    verdicts: tuple[Verdict, ...]
    breaker_open: bool
    fleet_events: tuple[dict[str, Any], ...]
    """Recent fleet events (active ones have ``ended_at`` None)."""
    counters: tuple[tuple[str, dict[str, str], float], ...]


def judge_snapshot(store: Store) -> JudgeSnapshot:
    breaker = store.remediation_state("breaker")
    return JudgeSnapshot(
        series=tuple(store.judge_series()),
        recommendations=tuple(store.recommendations()),
        verdicts=tuple(store.current_verdicts()),
        breaker_open=bool(isinstance(breaker, dict) and breaker.get("open")),
        fleet_events=tuple(store.fleet_events(limit=200)),
        counters=tuple(store.counters()),
    )


def _family(kind: str, probe: str, name: str) -> str:
    return f"healthd_{kind}_{probe}_{name}".replace("-", "_")


FINDING_LABELS = ("node", "probe", "reason_code", "reference", *EVIDENCE_LABELS)
REFERENCE_OF = {ReasonCode.BELOW_FLOOR.value: "floor", ReasonCode.BASELINE_DRIFT.value: "baseline",
                ReasonCode.FLEET_OUTLIER.value: "peers"}
"""The reference a finding's layer compares with: the class's floor, the node's own baseline, the median of its
peers (its class, or its own GPUs for a per-GPU figure)."""


@dataclass(frozen=True)
class ConfirmedFinding:
    """The confirmed finding of a verdict, as the ``healthd_node_finding*`` families export it."""

    labels: tuple[str, ...]
    """Values of ``FINDING_LABELS``."""
    value: float | None
    reference: float | None
    drop: float | None
    """How much worse than the reference, as a fraction of it (0.86: 86% below a bandwidth baseline)."""


def confirmed_finding(v: Verdict) -> ConfirmedFinding | None:
    """The finding a confirmed ``degraded`` or ``fail`` verdict stands on; None for any other verdict."""
    if v.outcome not in (Outcome.DEGRADED, Outcome.FAIL) or v.evidence.get("stage") != CONFIRMED:
        return None
    e = v.evidence
    reference_kind = REFERENCE_OF.get(str(e.get("layer", "")), "")
    labels = (v.node, v.probe, v.reason_code, reference_kind, *(str(e.get(k, "")) for k in EVIDENCE_LABELS))
    value, reference = e.get("value"), e.get("reference")
    if not reference_kind or not isinstance(value, float | int) or not isinstance(reference, float | int):
        return ConfirmedFinding(labels, None, None, None)
    drop = abs(reference - value) / abs(reference) if reference else None
    return ConfirmedFinding(labels, float(value), float(reference), drop)


def finding_families(verdicts: Iterable[Verdict]) -> Iterator[Metric]:
    """``healthd_node_finding`` (1 per confirmed finding) and, for a finding with a figure, its value,
    reference and drop; a node and probe without a confirmed finding has no series (the alerts resolve)."""
    found = GaugeMetricFamily("healthd_node_finding",
                              "1 while the judge's confirmed finding on the node and probe stands (reason, the"
                              " reference it broke: floor, baseline or peers; empty for a failed check)",
                              labels=list(FINDING_LABELS))
    value = GaugeMetricFamily("healthd_node_finding_value", "The figure of the confirmed finding (its unit is the"
                              " measurement's)", labels=list(FINDING_LABELS))
    reference = GaugeMetricFamily("healthd_node_finding_reference", "The reference the figure of the confirmed"
                                  " finding was compared with: the floor, the node's baseline or the median of its"
                                  " peers",
                                  labels=list(FINDING_LABELS))
    drop = GaugeMetricFamily("healthd_node_finding_drop_ratio", "How much worse than its reference the figure of"
                             " the confirmed finding is, as a fraction of the reference", labels=list(FINDING_LABELS))
    for v in sorted(verdicts, key=lambda v: (v.node, v.probe)):
        f = confirmed_finding(v)
        if f is None:
            continue
        found.add_metric(list(f.labels), 1.0)
        if f.value is not None and f.reference is not None:
            value.add_metric(list(f.labels), f.value)
            reference.add_metric(list(f.labels), f.reference)
        if f.drop is not None:
            drop.add_metric(list(f.labels), f.drop)
    yield from (found, value, reference, drop)


def judge_metric_families(snap: JudgeSnapshot, *, verdicts: bool = False) -> Iterator[Metric]:
    """The judgement families. ``verdicts=True`` also yields ``healthd_node_verdict`` (the daemon's
    ``StoreCollector`` yields it today; exactly one of the two must)."""
    if verdicts:
        yield verdict_family(snap.verdicts)
    yield from finding_families(snap.verdicts)

    for kind, column, help_text in (
        ("baseline", "baseline", "The node's own baseline (median of its recent passing results) of"),
        ("floor", "floor", "The floor of the node's class (lowest acceptable; highest for times) of"),
    ):
        rows: dict[str, list[tuple[dict[str, str], float]]] = defaultdict(list)
        for s in snap.series:
            value = s.get(column)
            if value is None:
                continue
            rows[_family(kind, s["probe"], s["name"])].append(({"node": s["node"], **s["labels"]}, float(value)))
        for family_name in sorted(rows):
            entries = rows[family_name]
            keys = ["node", *sorted({k for labels, _ in entries for k in labels} - {"node"})]
            suffix = family_name.split("_", 3)[3]
            family = GaugeMetricFamily(family_name, f"{help_text} {suffix.replace('_', ' ')}", labels=keys)
            for labels, value in entries:
                family.add_metric([labels.get(k, "") for k in keys], value)
            yield family

    recommended = GaugeMetricFamily("healthd_drain_recommended",
                                    "1 while healthd recommends draining the node (with the reason code), else 0",
                                    labels=["node", "reason_code"])
    by_node: dict[str, RecommendationRow] = {}
    for r in snap.recommendations:
        best = by_node.get(r.node)
        if best is None or (r.outcome == Outcome.FAIL.value and best.outcome != Outcome.FAIL.value):
            by_node[r.node] = r
    for node in sorted(by_node):
        recommended.add_metric([node, by_node[node].reason_code], 1.0)
    for node in sorted({v.node for v in snap.verdicts} - set(by_node)):
        recommended.add_metric([node, ""], 0.0)
    yield recommended

    actions = CounterMetricFamily("healthd_remediation_actions",
                                  "Drains and undrains healthd did (done), was refused (ownership, breaker, cap,"
                                  " repeat offender) or could not do (failed)", labels=["action", "result"])
    seen: dict[tuple[str, str], float] = {(a, r): 0.0 for a in ACTIONS for r in RESULTS}
    for name, labels, value in snap.counters:
        if name == "remediation_actions_total":
            seen[(labels.get("action", ""), labels.get("result", ""))] = value
    for (action, result), value in sorted(seen.items()):
        actions.add_metric([action, result], value)
    yield actions

    breaker = GaugeMetricFamily("healthd_remediation_breaker_open",
                                "1 while the remediation circuit breaker is open (no automatic action)")
    breaker.add_metric([], float(snap.breaker_open))
    yield breaker

    events = GaugeMetricFamily("healthd_fleet_event_active",
                               "1 while a large share of the class is degraded at once on the probe (a fleet event)",
                               labels=["node_class", "probe"])
    state: dict[tuple[str, str], bool] = {}
    for e in sorted(snap.fleet_events, key=lambda e: e["started_at"]):
        key = (e["node_class"], e["probe"])
        state[key] = state.get(key, False) or e["ended_at"] is None
    for (cls, probe), active in sorted(state.items()):
        events.add_metric([cls, probe], float(active))
    yield events


class JudgeCollector(Collector):
    """A ``prometheus_client`` collector of the judgement families (one store read per scrape)."""

    def __init__(self, store: Store, *, verdicts: bool = False) -> None:
        self._store = store
        self._verdicts = verdicts

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        yield from judge_metric_families(judge_snapshot(self._store), verdicts=self._verdicts)


__all__ = ["ConfirmedFinding", "JudgeCollector", "JudgeSnapshot", "ReasonCode", "confirmed_finding", "finding_families",
           "judge_metric_families", "judge_snapshot"]
