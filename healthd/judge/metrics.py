"""The samples of judgement and remediation: per node (confirmed findings, baselines, floors, their ratio,
the drain recommendation) and per fleet (fleet events, remediation actions, the breaker).

Pure: ``healthd.metrics.Exposition`` reads the store and renders what these yield. Labels stay bounded
(node, the measurement's own labels, reason codes, node classes, probes).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from healthd.judge.model import CONFIRMED, EVIDENCE_LABELS, LinkFinding, ReasonCode
from healthd.judge.series import direction_of
from healthd.judge.sources import fabric, pcie, throttle
from healthd.judge.sources.fabric import PortTrack
from healthd.judge.sources.passive import PROBE as PASSIVE
from healthd.model import Outcome, Verdict
from healthd.passive.model import Strength
from healthd.store.rows import JudgedSeries, RecommendationRow

PASSIVE_PROBES = frozenset({PASSIVE, fabric.PROBE, throttle.PROBE, pcie.PROBE})
"""The pseudo-probes of the evidence read from the site's Prometheus: their findings are ``source="passive"``."""

ACTIONS = ("drain", "undrain")
RESULTS = ("done", "refused", "failed")

Labels = tuple[tuple[str, str], ...]
Sample = tuple[str, Labels, float]
"""(family, labels in order, value)."""

FINDING_LABELS = ("node", "probe", "source", "reason_code", "reference", *EVIDENCE_LABELS)
REFERENCE_OF = {ReasonCode.BELOW_FLOOR.value: "floor", ReasonCode.BASELINE_DRIFT.value: "baseline",
                ReasonCode.FLEET_OUTLIER.value: "peers"}
"""The reference a finding's layer compares with: the class's floor, the node's own baseline, the median of its
peers (its class, or its own GPUs for a per-GPU figure)."""

JUDGE_FAMILIES: dict[str, tuple[str, str]] = {
    "healthd_node_finding": ("gauge", "1 while the judge's confirmed finding on the node and probe stands (reason,"
                             " the reference it broke: floor, baseline or peers; empty for a failed check; source:"
                             " probe, or passive for the site's dcgm-exporter signals)"),
    "healthd_node_passive_signal": ("gauge", "1 for each passive signal (dcgm-exporter: XID, row remap, ECC,"
                                    " throttling, health) healthd follows on the node and GPU now, with its code,"
                                    " strength (fault or hint) and stage"),
    "healthd_node_finding_value": ("gauge", "The figure of the confirmed finding (its unit is the measurement's)"),
    "healthd_node_finding_reference": ("gauge", "The reference the figure of the confirmed finding was compared"
                                       " with: the floor, the node's baseline or the median of its peers"),
    "healthd_node_finding_drop_ratio": ("gauge", "How much worse than its reference the figure of the confirmed"
                                        " finding is, as a fraction of the reference"),
    "healthd_node_probe_baseline_ratio": ("gauge", "The worst judged figure of the node's last run of the probe"
                                          " against the node's own baseline (below 1: worse; times inverted)"),
    "healthd_node_probe_floor_ratio": ("gauge", "The worst judged figure of the node's last run of the probe"
                                       " against the floor of its class (below 1: under the floor; times"
                                       " inverted)"),
    "healthd_drain_recommended": ("gauge", "1 while healthd recommends draining the node (with the reason code)"),
    "healthd_remediation_actions_total": ("counter", "Drains and undrains healthd did (done), was refused"
                                          " (ownership, breaker, cap, repeat offender) or could not do (failed)"),
    "healthd_remediation_breaker_open": ("gauge", "1 while the remediation circuit breaker is open (no automatic"
                                         " action)"),
    "healthd_fleet_event_active": ("gauge", "1 while a large share of the class is degraded at once on a series"
                                   " of the probe of this scope (a fleet event; scope * for every series)"),
    "healthd_switch_finding": ("gauge", "1 while the nodes under the switch fail the probe together beyond chance"
                               " (a switch finding: their drains are held)"),
    "healthd_link_finding": ("gauge", "1 while the path between nodes a and b (a < b) is slow on the probe and both"
                             " nodes pass with other partners (a link finding: no node is drained)"),
    "healthd_link_finding_ratio": ("gauge", "The figure of the live link finding over its reference (the pair's"
                                   " baseline, the class's links or the floor; below 1: worse)"),
}
REFERENCE_HELP = {"baseline": "The node's own baseline (median of its recent passing results) of",
                  "floor": "The floor of the node's class (lowest acceptable; highest for times) of"}


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
    source = "passive" if v.probe in PASSIVE_PROBES else "probe"
    labels = (v.node, v.probe, source, v.reason_code, reference_kind, *(str(e.get(k, "")) for k in EVIDENCE_LABELS))
    value, reference = e.get("value"), e.get("reference")
    if not reference_kind or not isinstance(value, float | int) or not isinstance(reference, float | int):
        return ConfirmedFinding(labels, None, None, None)
    drop = abs(reference - value) / abs(reference) if reference else None
    return ConfirmedFinding(labels, float(value), float(reference), drop)


def finding_samples(verdicts: Iterable[Verdict]) -> Iterator[Sample]:
    """``healthd_node_finding`` (1 per confirmed finding) and, for a finding with a figure, its value,
    reference and drop; a node and probe without a confirmed finding has no series (the alerts resolve)."""
    for v in sorted(verdicts, key=lambda v: (v.node, v.probe)):
        f = confirmed_finding(v)
        if f is None:
            continue
        labels = tuple(zip(FINDING_LABELS, f.labels, strict=True))
        yield "healthd_node_finding", labels, 1.0
        if f.value is not None and f.reference is not None:
            yield "healthd_node_finding_value", labels, f.value
            yield "healthd_node_finding_reference", labels, f.reference
        if f.drop is not None:
            yield "healthd_node_finding_drop_ratio", labels, f.drop


class SignalRow(Protocol):
    """A signal followed now, as ``healthd_node_passive_signal`` shows it: a GPU's (``Track``) or an
    InfiniBand port's (``healthd.judge.sources.fabric.PortTrack``, with ``device`` and ``port``)."""

    @property
    def node(self) -> str: ...

    @property
    def gpu(self) -> str | None: ...

    @property
    def gpu_uuid(self) -> str | None: ...

    @property
    def signal(self) -> str: ...

    @property
    def code(self) -> str: ...

    @property
    def strength(self) -> Strength: ...

    def stage(self) -> str: ...


def passive_samples(tracks: Iterable[SignalRow]) -> Iterator[Sample]:
    """``healthd_node_passive_signal``: one series per signal followed now (bounded: a firing signal, not
    every XID ever seen; a signal that ended has no series). A port's signal names its ``device`` and
    ``port`` (empty for a GPU's)."""
    rows = [(t.node, t.code, t.gpu_uuid or t.gpu or "", *_port(t), t) for t in tracks]
    for node, code, _, device, port, t in sorted(rows, key=lambda r: r[:5]):
        yield ("healthd_node_passive_signal", (("node", node), ("gpu", t.gpu or ""), ("gpu_uuid", t.gpu_uuid or ""),
                                               ("device", device), ("port", port),
                                               ("signal", t.signal), ("code", code),
                                               ("strength", t.strength.value), ("stage", t.stage())), 1.0)


def _port(t: SignalRow) -> tuple[str, str]:
    return (t.device, t.port) if isinstance(t, PortTrack) else ("", "")


def reference_family(kind: str, probe: str, name: str) -> str:
    return f"healthd_{kind}_{probe}_{name}".replace("-", "_")


def _worse_ratio(name: str, value: float, reference: float) -> float | None:
    """value / reference, inverted for a time (so that below 1 is always worse)."""
    if direction_of(name) == "lower":
        return reference / value if value > 0 else None
    return value / reference if reference > 0 else None


def series_samples(series: Iterable[JudgedSeries], *, full: bool) -> Iterator[Sample]:
    """Per probe, the worst ratio of the last value to its baseline; with ``full``, the worst ratio to the
    floor too and every series' baseline and floor (with the measurement's own labels)."""
    worst: dict[tuple[str, str, str], float] = {}
    for s in series:
        value = s.last_value
        for kind, reference in (("baseline", s.baseline), ("floor", s.floor)):
            if reference is None:
                continue
            if full:
                yield (reference_family(kind, s.probe, s.name), (("node", s.node), *sorted(s.labels.items())),
                       float(reference))
            if kind == "floor" and not full:
                continue
            ratio = _worse_ratio(s.name, float(value), float(reference)) if value is not None else None
            key = (s.node, s.probe, kind)
            if ratio is not None and ratio < worst.get(key, float("inf")):
                worst[key] = ratio
    for (node, probe, kind), ratio in sorted(worst.items()):
        yield f"healthd_node_probe_{kind}_ratio", (("node", node), ("probe", probe)), ratio


def drain_reason(recommendations: Iterable[RecommendationRow]) -> str | None:
    """The reason code the node's drain recommendation shows (a ``fail`` over a ``degraded``); None: none."""
    best: RecommendationRow | None = None
    for r in recommendations:
        if best is None or (r.outcome == Outcome.FAIL.value and best.outcome != Outcome.FAIL.value):
            best = r
    return best.reason_code if best is not None else None


def fleet_samples(*, breaker_open: bool, fleet_events: Iterable[Mapping[str, Any]],
                  counters: Iterable[tuple[str, Mapping[str, str], float]],
                  switch_findings: Iterable[Mapping[str, Any]] = (),
                  link_findings: Iterable[LinkFinding] = ()) -> Iterator[Sample]:
    """Remediation actions by result, the breaker, whether each (class, probe, scope) has a fleet event (the
    events of a class and probe on several series of one scope are one sample: 1 while any is active), the
    switch findings (``healthd_switch_finding``: 1 while active, 0 once ended, while the store keeps it) and
    the live link findings (``healthd_link_finding``: one series per live finding, none once it ended)."""
    seen: dict[tuple[str, str], float] = {(a, r): 0.0 for a in ACTIONS for r in RESULTS}
    for name, labels, value in counters:
        if name == "remediation_actions_total":
            seen[(labels.get("action", ""), labels.get("result", ""))] = value
    for (action, result), value in sorted(seen.items()):
        yield "healthd_remediation_actions_total", (("action", action), ("result", result)), value
    yield "healthd_remediation_breaker_open", (), float(breaker_open)
    state: dict[tuple[str, str, str], bool] = {}
    for e in sorted(fleet_events, key=lambda e: e["started_at"]):
        key = (e["node_class"], e["probe"], e.get("scope") or "*")
        state[key] = state.get(key, False) or e["ended_at"] is None
    for (cls, probe, scope), active in sorted(state.items()):
        yield "healthd_fleet_event_active", (("node_class", cls), ("probe", probe), ("scope", scope)), float(active)
    switches: dict[tuple[str, str, str], bool] = {}
    for e in sorted(switch_findings, key=lambda e: e["started_at"]):
        where = (str(e["switch"]), str(e["level"]), str(e["probe"]))
        switches[where] = switches.get(where, False) or e["ended_at"] is None
    for (switch, level, probe), active in sorted(switches.items()):
        yield "healthd_switch_finding", (("switch", switch), ("level", level), ("probe", probe)), float(active)
    for f in sorted((f for f in link_findings if f.active), key=lambda f: (f.probe, f.a, f.b)):
        link_labels: Labels = (("probe", f.probe), ("a", f.a), ("b", f.b))
        yield "healthd_link_finding", link_labels, 1.0
        if f.ratio is not None:
            yield "healthd_link_finding_ratio", link_labels, f.ratio


__all__ = ["FINDING_LABELS", "JUDGE_FAMILIES", "ConfirmedFinding", "ReasonCode", "Sample", "confirmed_finding",
           "drain_reason", "finding_samples", "fleet_samples", "passive_samples", "series_samples"]
