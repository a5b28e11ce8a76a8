"""The judge: finished runs in, verdicts, recommendations, fleet events and re-probe requests out.

``Judge.evaluate`` is deterministic: the same state and runs give the same output. It keeps its
state in memory (each node's accepted history per series, recent marks, group results, fleet
pools, pending re-probes) and reports every change in the ``JudgeOutput`` so that the store can
persist it and a restarted daemon can ``Judge.restore`` it (``healthd.judge.persist`` connects the
two; this module imports no store). ``replay`` runs the same code without a store.

Per run and node: the judged series (``series.select``) go through the three layers, floor
(``floors``), own baseline (``baseline``) and fleet (``fleet``, including the node's own GPUs
as peers); a failed probe check is a finding too. A multi-node measurement becomes a group
record, localised by ``confirm.attribute``; a pair bad together while both ends pass with other partners is a
link finding (``links``), drained nowhere. A hard fault the collector attributed to nodes
(``hardfault``: GPUs missing, a hang, a crash, a CUDA or NCCL error) is a ``fail`` finding on them,
or on the group. Thresholds follow each series' noise (``noise``). A finding becomes a verdict of
``fail`` (floor, check, hard fault) or ``degraded`` (drift, outlier) only once confirmed: N of M
runs repeat it on the same series, N raised while the class flags results by chance often; a drop
shared by a large part of the class is a fleet event and never a recommendation. ``error`` runs
say nothing about a node: they never make a finding and never erase one (a node erring again and
again while its class passes gets the ``error`` verdict ``repeated_errors``).

The evidence comes from the registered *sources* and the explanations from the registered *causes*
(``healthd.judge.sources``: checks, measurements, passive signals, boundary checks; class events, declared
events, switches, links): this module names none of them and calls them only through the two seams of
``healthd.judge.sources.seam``. Each round: the sources judge the runs, the causes are re-tested on the
round's flags (the most specific first), the round's runs are judged again when a cause changed the class
statistics, and each finding is recorded as the node's own unless a cause holds it (asked in rank order).
"""

from __future__ import annotations

import threading
from bisect import bisect_left, insort
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Literal, TypeVar

from healthd.config import JudgeSettings, ProbeSettings
from healthd.judge.baseline import baseline_of
from healthd.judge.confirm import (
    Attribution,
    attribute,
    blame_confirmed,
    max_severity,
    mean_confirmed,
    pick_partners,
    repeated,
    split,
)
from healthd.judge.fleet import FleetStats, fleet_stats
from healthd.judge.floors import FloorTable, confirmable, floor_rules
from healthd.judge.hardfault import HARD_FAULTS
from healthd.judge.model import (
    CONFIRMED,
    Finding,
    FleetEvent,
    GroupRecord,
    JudgeOutput,
    JudgeState,
    Mark,
    ReasonCode,
    RecommendationCandidate,
    Request,
    RunInput,
    SeriesKey,
    SeriesState,
    Severity,
)
from healthd.judge.noise import (
    EXTRA_RETESTS,
    MIN_RATE_SAMPLE,
    k_for,
    retests_for,
    typical,
    unbiased,
)
from healthd.judge.rounds import HELD, Hold, cold_retests
from healthd.judge.series import key_of, missing_required, select
from healthd.judge.sources import causes as registered_causes
from healthd.judge.sources import sources as registered_sources
from healthd.judge.sources.seam import Cause, FleetCache, RunFindings, Selected, Source, Update
from healthd.model import Node, Outcome, Verdict
from healthd.node_class import DEFAULT_CLASS, class_of
from healthd.planning import PriorityRequest
from healthd.topology import Topology

P = TypeVar("P")
T = TypeVar("T")

_CODE_RANK = {
    ReasonCode.GPUS_MISSING: 10, ReasonCode.CUDA_ERROR: 9, ReasonCode.NCCL_ERROR: 8, ReasonCode.CRASH: 7,
    ReasonCode.HANG: 6, ReasonCode.CHECK_FAILED: 5, ReasonCode.BELOW_FLOOR: 4, ReasonCode.LOCALISED: 3,
    ReasonCode.FLEET_OUTLIER: 2,
    ReasonCode.BASELINE_DRIFT: 1,
}
PASS_TEXT = "every judged series within its floor, baseline and fleet"


def worst(findings: Iterable[Finding]) -> Finding | None:
    def rank(f: Finding) -> tuple[int, int, float]:
        spread = abs(f.value - f.reference) / abs(f.reference) if f.reference else 0.0
        return int(f.severity), _CODE_RANK.get(f.code, 0), spread

    return max(findings, key=rank, default=None)


@dataclass(frozen=True, slots=True)
class _Status:
    kind: Literal["judged", "error", "missing"]
    at: float
    run_id: str
    text: str


_NO_STATUS = _Status("missing", 0.0, "", "")


class Judge:
    """Judgement state and its evaluation. One instance per daemon (or replay, or simulation)."""

    def __init__(self, settings: JudgeSettings) -> None:
        self.settings = settings
        self.floors = FloorTable(floor_rules(settings))
        self._lock = threading.RLock()
        self.series: dict[tuple[str, SeriesKey], SeriesState] = {}
        self.pools: dict[tuple[str, SeriesKey], dict[tuple[str, SeriesKey], SeriesState]] = defaultdict(dict)
        self.pool_members: dict[tuple[str, str], tuple[str, ...]] = {}
        """(node, probe) → the nodes of the run its pooled values of the probe come from (a pair's other node:
        a value a failing switch made bad on a node outside it)."""
        self.marks: dict[tuple[str, str], list[Mark]] = {}
        self.status: dict[tuple[str, str], _Status] = {}
        self._unsettled: set[tuple[str, str]] = set()
        self._after_events: set[tuple[str, str]] = set()
        """(node, probe) whose latest flagged results were measured during an event that has ended, with no
        result since: re-probed now (``_after_event``)."""
        """(node, probe) passing now, with an earlier finding in the window that more runs could still
        confirm: re-probed until it is confirmed or drops out (a fault seen in 2 of 3 runs is found now,
        not a probe interval later)."""
        self._class_noise: dict[tuple[str, SeriesKey], float] = {}
        """(class, series without ``gpu``) → typical relative run-to-run noise, as of the first ``class_noise``
        of an evaluation (brought up to date then from ``_noise_dirty``, not rebuilt from every series)."""
        self._noise_stale = True
        self._noise_of: dict[tuple[str, SeriesKey], tuple[tuple[str, SeriesKey], float]] = {}
        """(node, series) → its group and its (unbiased) relative spread, for a series that counts."""
        self._noise_values: dict[tuple[str, SeriesKey], list[float]] = {}
        """Group → the relative spreads of its series, sorted."""
        self._noise_dirty: set[tuple[str, SeriesKey]] | None = None
        """Series whose history changed since ``_class_noise`` was brought up to date; ``None``: all of them
        (start, restore, a node's class changed)."""
        self._fkeys: dict[SeriesKey, SeriesKey] = {}
        self._sizes: dict[str, int] | None = None
        """Class → its nodes (built once per evaluation)."""
        self.flag_rates: dict[tuple[str, str, bool], list[int]] = defaultdict(lambda: [0, 0])
        """(class, probe, group results) → [flagged, judged] regular results: how often a healthy class
        flags a result by chance (outlier runs), which decides how many retests confirm a finding."""
        self.error_streak: dict[tuple[str, str], int] = {}
        """(node, probe) → its consecutive ``error`` runs (a judged run ends the streak)."""
        self.group_history: dict[tuple[str, str], list[GroupRecord]] = {}
        self.flagged_groups: dict[str, list[GroupRecord]] = defaultdict(list)
        self.last_group_pass: dict[str, dict[str, float]] = defaultdict(dict)
        self.samples: dict[tuple[str, str], dict[str, tuple[float, bool]]] = defaultdict(dict)
        self.pending: dict[tuple[str, str], Request] = {}
        self.held: set[tuple[str, str]] = set()
        """(node, probe) whose confirmed finding waits for the event rule (``rounds.event_hold``): judged
        again at every evaluation until it is released or explained."""
        self.verdicts: dict[tuple[str, str], Verdict] = {}
        self.classes: dict[str, str] = {}
        self.drained: set[str] = set()
        self.resets: dict[str, float] = {}
        self.images: dict[tuple[str, str], str] = {}
        """(node, probe) → the container image of its newest judged run that named one."""
        self.image_notes: dict[tuple[str, str], str] = {}
        """(node, run id) → "image changed from A to B: baseline restarted", for that run's mark."""
        self._topology: Topology | None = None
        self.sources: tuple[Source, ...] = tuple(registered_sources())
        """The evidence sources registered (``healthd.judge.sources``), in their order."""
        self.causes: tuple[Cause, ...] = tuple(registered_causes())
        """The causes registered (``healthd.judge.sources``), in rank order: asked in this order whether one
        holds a value, re-tested in the reverse (the specific ones first, the broad ones on what is left)."""
        self._by_node = frozenset(p for src in self.sources for p in src.by_node_probes)

    def part(self, kind: type[P]) -> P:
        """The judge's source or cause of type ``kind`` (its state; read it under ``view``)."""
        for part in (*self.sources, *self.causes):
            if isinstance(part, kind):
                return part
        raise LookupError(f"no registered source or cause of type {kind.__name__}")

    def view(self, kind: type[P], read: Callable[[P], T]) -> T:
        """``read`` of the judge's source or cause of type ``kind``, under the judge's lock (thread-safe)."""
        with self._lock:
            return read(self.part(kind))

    @property
    def by_node_probes(self) -> frozenset[str]:
        """Pseudo-probes of evidence no planner runs (the sources'): a re-probe asked for one runs the
        node's single-node probes, and any judged run of the node answers it."""
        return self._by_node

    @property
    def topology(self) -> Topology | None:
        """The topology the switch findings are judged with (``set_topology``)."""
        return self._topology

    def set_topology(self, topology: Topology | None, *, now: float | None = None) -> None:
        """The cluster's topology (``None``: none known; switch correlation off, findings judged per
        node and per class as without it). Findings on switches it no longer has end at the next
        evaluation."""
        with self._lock:
            self._topology = topology
            for cause in self.causes:
                cause.set_topology(topology, 0.0 if now is None else now)

    def reconfigure(self, settings: JudgeSettings) -> None:
        """New settings (SIGHUP) with the state kept: new thresholds apply from the next evaluation."""
        with self._lock:
            self.settings = settings
            self.floors = FloorTable(floor_rules(settings))

    # -- thresholds ---------------------------------------------------------------------------
    @property
    def drift_fraction(self) -> float:
        return max(self.settings.baseline.drift_fraction, 2 * self.settings.noise_band)

    @property
    def min_deviation(self) -> float:
        return max(self.settings.fleet.min_deviation, 2 * self.settings.noise_band)

    def node_class(self, node: str) -> str:
        return self.classes.get(node, DEFAULT_CLASS)

    def _note_classes(self, nodes: Sequence[Node]) -> None:
        """Take the nodes' classes; a class that changed regroups every series' noise (``class_noise``)."""
        classes = self.classes
        for node in nodes:
            cls = class_of(node)
            if classes.get(node.name) != cls:
                classes[node.name] = cls
                self._noise_dirty = None

    # -- evaluation ---------------------------------------------------------------------------
    def evaluate(
        self, runs: Sequence[RunInput], nodes: Sequence[Node] = (), *, now: float,
        resets: Mapping[str, float] | None = None,
    ) -> JudgeOutput:
        """Judge newly finished ``runs`` (any order); ``nodes``: the cluster's nodes (classes, drains);
        ``resets``: node → time before which its evidence is forgotten (an undrain). Thread-safe."""
        with self._lock:
            return self._evaluate(runs, nodes, now, resets)

    def _evaluate(self, runs: Sequence[RunInput], nodes: Sequence[Node], now: float,
                  resets: Mapping[str, float] | None) -> JudgeOutput:
        out = JudgeOutput(at=now)
        self._noise_stale = True
        self._sizes = None
        self._unsettled = set()
        self._after_events = set()
        self._note_classes(nodes)
        if nodes:
            self.drained = {n.name for n in nodes if n.drained}
        touched: set[tuple[str, str]] = set()
        rates_before = {k: (v[0], v[1]) for k, v in self.flag_rates.items()}
        seen: set[tuple[str, str]] = set()
        if resets:
            touched |= self._apply_resets(resets)
        self._expire(now, out)

        judged: list[RunInput] = []
        for run in sorted(runs, key=lambda r: (r.at, r.run_id)):
            if run.outcome is Outcome.SKIPPED or self._seen(run):
                continue
            touched.update((n, run.probe) for n in run.nodes)
            seen.update((n, run.probe) for n in run.nodes)
            if run.outcome is Outcome.ERROR:
                for n in run.nodes:
                    self.status[(n, run.probe)] = _Status("error", run.at, run.run_id, run.reason or "probe error")
                    self.error_streak[(n, run.probe)] = self.error_streak.get((n, run.probe), 0) + 1
                continue
            if run.outcome is not Outcome.FAIL:
                missing = missing_required(run, self.settings.series)
                if missing:
                    names = ", ".join(sorted({s.name for s in missing}))
                    text = f"the probe passed without its {names} measurement (required: failing closed)"
                    for n in run.nodes:
                        self.status[(n, run.probe)] = _Status("missing", run.at, run.run_id, text)
                    continue
            judged.append(run)

        self._restart_baselines_on_image_change(judged, out)
        selections = {run.run_id: self._ingest(run) for run in judged}
        cache: FleetCache = {}
        evals = {run.run_id: self._judge_run(run, selections[run.run_id], cache, now) for run in judged}

        for run in judged:
            if run.priority:
                continue
            ev = evals[run.run_id]
            for n in run.nodes:
                flagged = bool(ev.node_findings.get(n)) or bool(ev.group_findings)
                self.samples[(self.node_class(n), run.probe)][n] = (run.at, flagged)
                for cause in self.causes:
                    cause.note(self, n, run.probe, [*ev.node_findings.get(n, ()), *ev.group_findings],
                               own=bool(ev.node_findings.get(n)), members=run.nodes)
        update = self.update_causes(touched, now, out)
        touched |= update.touched
        changed = update.rejudge
        if changed:
            cache.clear()
            for run in judged:
                if any((self.node_class(n), run.probe) in changed for n in run.nodes):
                    evals[run.run_id] = self._judge_run(run, selections[run.run_id], cache, now)

        for run in judged:
            self._record(run, evals[run.run_id], out)
        self._answer_by_node(judged, out)
        for source in self.sources:
            source.after_runs(self, judged, now, out)

        attributions: dict[str, Attribution] = {}
        suspects: dict[str, dict[str, list[GroupRecord]]] = {}
        for probe in sorted({p for _, p in touched} | {e.probe for e in out.fleet_events}):
            attributions[probe] = self._localise(probe, now)
            suspects[probe] = attributions[probe].suspects()
            for record in self.flagged_groups[probe]:
                touched.update((m, probe) for m in record.members)
            for cause in self.causes:
                cause.localise(self, probe, now, out)
        for event in out.fleet_events:
            touched.update(key for key in self.verdicts if key[1] == event.probe
                           and self.node_class(key[0]) == event.node_class)

        touched |= self.held
        erring = self._error_shares({(self.node_class(n), p) for n, p in touched
                                     if self.error_streak.get((n, p), 0) >= self.settings.confirm.error_streak})
        for name, probe in sorted(touched):
            self._conclude(name, probe, attributions.get(probe), suspects.get(probe, {}), now, out,
                           erring.get((self.node_class(name), probe), 1.0))
        self._request(attributions, now, out)
        out.flag_rates = {k: (v[0], v[1]) for k, v in self.flag_rates.items() if rates_before.get(k) != (v[0], v[1])}
        out.error_streaks = {k: self.error_streak.get(k, 0) for k in sorted(seen)}
        return out

    def _seen(self, run: RunInput) -> bool:
        """Judged before (a batch of ingested runs judged again after a crash): judged once only."""
        return any(mk.run_id == run.run_id for n in run.nodes for mk in self.marks.get((n, run.probe), ())) or \
            any(self.status.get((n, run.probe), _NO_STATUS).run_id == run.run_id for n in run.nodes)

    def in_event(self, cls: str, probe: str, key: SeriesKey | None = None) -> bool:
        return any(c.since(cls, probe, key) is not None for c in self.causes)

    def update_causes(self, touched: set[tuple[str, str]], now: float, out: JudgeOutput) -> Update:
        """Re-test every cause on the round's (node, probe) pairs, the most specific first: a broader one
        tests what they leave unexplained (and the pairs they touched)."""
        total = Update()
        keys = set(touched)
        for cause in reversed(self.causes):
            update = cause.update(self, keys, now, out)
            keys |= update.touched
            total.touched |= update.touched
            total.rejudge |= update.rejudge
        return total

    def holding(self, node: str, probe: str, *, ranks: range | None = None) -> FleetEvent | None:
        """The first live event, in rank order (among the causes of ``ranks``), that holds the node's values
        of the probe."""
        cls = self.node_class(node)
        for cause in self.causes:
            if ranks is None or cause.rank in ranks:
                event = cause.holding(node, probe, cls)
                if event is not None:
                    return event
        return None

    def explained(self, node: str, probe: str, *, above: int) -> bool:
        """Whether a cause ranked above ``above`` explains the node's latest flag on the probe."""
        return any(c.rank > above and c.explains(node, probe) for c in self.causes)

    def set_verdict(self, verdict: Verdict, out: JudgeOutput) -> None:
        """The node's verdict on the probe now; in ``out`` when it says something new."""
        key = (verdict.node, verdict.probe)
        old = self.verdicts.get(key)
        if old is None or (old.outcome, old.reason_code, old.reason) != (verdict.outcome, verdict.reason_code,
                                                                          verdict.reason):
            out.verdicts.append(verdict)
        self.verdicts[key] = verdict

    def ask(self, req: Request, out: JudgeOutput) -> None:
        """A re-probe request, unless one of its nodes is drained or already has one pending on the probe."""
        if any(n in self.drained or (n, req.probe) in self.pending for n in req.nodes):
            return
        for n in req.nodes:
            self.pending[(n, req.probe)] = req
        out.requests.append(req)

    def _answer_by_node(self, judged: Sequence[RunInput], out: JudgeOutput) -> None:
        """A judged run of a node answers its pending re-probes of by-node evidence (``by_node_probes``)."""
        if not self.pending:
            return
        for run in judged:
            for n in run.nodes:
                for pseudo in self._by_node - {run.probe}:
                    pending = self.pending.get((n, pseudo))
                    if pending is not None and pending.requested_at <= run.at:
                        del self.pending[(n, pseudo)]
                        out.satisfied.append((n, pseudo))

    def _ingest(self, run: RunInput) -> list[Selected]:
        if run.outcome is Outcome.FAIL:
            return []
        selected = []
        for m, direction in select(run, self.settings.series):
            key = key_of(run.probe, m)
            fkey = key.without("gpu")
            selected.append(Selected(m, direction, key, fkey))
            for node in (m.node,) if m.node else run.nodes:
                st = self.state(node, key)
                st.last_value, st.last_at, st.last_run_id = m.value, run.at, run.run_id
                self.pools[(self.node_class(node), fkey)][(node, key)] = st
        if selected and len(run.nodes) > 1:
            for node in run.nodes:
                self.pool_members[(node, run.probe)] = run.nodes
        elif selected:
            self.pool_members.pop((run.nodes[0], run.probe), None)
        return selected

    def _restart_baselines_on_image_change(self, runs: Sequence[RunInput], out: JudgeOutput) -> None:
        """A node whose probe now runs in another container image than its previous judged run starts
        that probe's baselines again (the history of one software stack says nothing about another;
        a change of image is no node fault): its accepted windows are emptied before the run is
        judged, and the run's mark says so. One pass over the series, only when an image changed."""
        changed: set[tuple[str, str]] = set()
        for run in runs:  # in time order
            if run.image is None:
                continue
            for n in run.nodes:
                old = self.images.get((n, run.probe))
                if old is not None and old != run.image:
                    changed.add((n, run.probe))
                    self.image_notes[(n, run.run_id)] = f"image changed from {old} to {run.image}: baseline restarted"
                self.images[(n, run.probe)] = run.image
        if not changed:
            return
        for (node, key), st in self.series.items():
            if (node, key.probe) in changed and (st.accepted_count or st.baseline is not None):
                st.accepted = ()
                st.baseline = st.spread = None
                out.series.append(st.copy())

    def state(self, node: str, key: SeriesKey) -> SeriesState:
        st = self.series.get((node, key))
        if st is None:
            st = self.series[(node, key)] = SeriesState(node, key)
        return st

    def fleet(self, cls: str, fkey: SeriesKey, now: float, cache: FleetCache) -> FleetStats | None:
        """The class's fleet statistics of a series (its GPUs pooled) over the fleet window; during a
        class-wide event, since the event began. Values a cause leaves out (``Cause.leaves_out``: a named
        switch's, those of the nodes it holds on the probe, and of runs with one of them) are left out:
        the peers a node is compared with are the class's healthy fabric, not a failing leaf's pairs,
        which in a small class are half of its values and would hide every bad one (the leaf's finding
        then ends while the leaf fails)."""
        if (cls, fkey) in cache:
            return cache[(cls, fkey)]
        cutoff = now - self.settings.fleet.window_s
        probe = fkey.probe
        since: Cause | None = None
        leaving: list[tuple[Cause, Callable[[str], bool]]] = []
        for cause in self.causes:
            start = cause.since(cls, probe, fkey)
            if start is not None and since is None:
                since, cutoff = cause, max(cutoff, start)
            out = cause.leaves_out(probe)
            if out is not None:
                leaving.append((cause, out))
        values: list[float] = []
        nodes: set[str] = set()
        left: set[str] = set()
        for (node, _), st in self.pools.get((cls, fkey), {}).items():
            value = st.last_value
            if st.last_at < cutoff or value is None:
                continue
            if leaving:
                members = self.pool_members.get((node, probe), (node,))
                by = next((c.label for c, out in leaving if any(out(m) for m in members)), None)
                if by is not None:
                    left.add(by)
                    continue
            values.append(value)
            nodes.add(node)
        peers = f"the {cls} class" + (f" since its {since.label} began" if since is not None else "")
        if left:
            peers += " outside the " + " and ".join(sorted(left))
        stats = fleet_stats(values, nodes=len(nodes), min_nodes=self.settings.fleet.min_nodes, peers=peers)
        cache[(cls, fkey)] = stats
        return stats

    def _judge_run(self, run: RunInput, selected: Sequence[Selected], cache: FleetCache, now: float) -> RunFindings:
        """The run-based sources' findings (``healthd.judge.sources``): a failed run's checks and hard
        fault, the transport check, the measurements against floor, baseline and fleet."""
        ev = RunFindings()
        for source in self.sources:
            source.judge_run(self, run, selected, cache, now, ev)
        return ev

    def class_noise(self, cls: str, fkey: SeriesKey) -> float | None:
        """The class's typical relative run-to-run noise of a series (GPUs pooled), from its nodes'
        own histories (``baseline.min_samples`` passing results or more, at least 3); ``None`` before any.
        As of the first call in an evaluation: only the series whose history changed since are looked at
        again (a batch's, not the fleet's)."""
        if self._noise_stale:
            self._noise_stale = False
            self._update_noise()
        return self._class_noise.get((cls, fkey))

    def _noise_part(self, node: str, key: SeriesKey, st: SeriesState) -> tuple[tuple[str, SeriesKey], float] | None:
        count = st.accepted_count
        if count < max(self.settings.baseline.min_samples, 3):
            return None
        spread, baseline = st.spread, st.baseline
        if spread is None or not baseline:
            return None
        fkey = self._fkeys.get(key)
        if fkey is None:
            fkey = self._fkeys[key] = key.without("gpu")
        return (self.node_class(node), fkey), unbiased(abs(spread / baseline), count)

    def _update_noise(self) -> None:
        """Bring ``_class_noise`` up to date with the series in ``_noise_dirty`` (every series when ``None``)."""
        parts, values, dirty = self._noise_of, self._noise_values, self._noise_dirty
        changed: set[tuple[str, SeriesKey]] = set()
        if dirty is None:
            parts.clear()
            values.clear()
            self._class_noise.clear()
            for (node, key), st in self.series.items():
                part = self._noise_part(node, key, st)
                if part is not None:
                    parts[(node, key)] = part
                    values.setdefault(part[0], []).append(part[1])
                    changed.add(part[0])
            for spreads in values.values():
                spreads.sort()
        else:
            for where in dirty:
                old = parts.pop(where, None)
                if old is not None:
                    spreads = values[old[0]]
                    del spreads[bisect_left(spreads, old[1])]
                    changed.add(old[0])
                state = self.series.get(where)
                part = None if state is None else self._noise_part(where[0], where[1], state)
                if part is not None:
                    parts[where] = part
                    insort(values.setdefault(part[0], []), part[1])
                    changed.add(part[0])
        for group in changed:
            spreads = values.get(group, [])
            typical_noise = typical(spreads) if spreads else None
            if typical_noise is None:
                values.pop(group, None)
                self._class_noise.pop(group, None)
            else:
                self._class_noise[group] = typical_noise
        self._noise_dirty = set()

    # -- causes -------------------------------------------------------------------------------
    def _suppressed(self, node: str, probe: str, f: Finding, at: float) -> bool:
        """Whether a cause holds the finding (one it can explain, made since its event began)."""
        cls = self.node_class(node)
        for cause in self.causes:
            event = cause.holding(node, probe, cls)
            if event is not None and not cause.resists(f, event) and at >= event.started_at:
                return True
        return False

    # -- recording ----------------------------------------------------------------------------
    def _record(self, run: RunInput, ev: RunFindings, out: JudgeOutput) -> None:
        probe = run.probe
        suspects = tuple(n for n in run.nodes if self._under_suspicion(n, probe, run.at))
        kept_group = [f for f in ev.group_findings if not any(self._suppressed(n, probe, f, run.at) for n in run.nodes)]
        regular_suspects = ev.ends if len(ev.ends) == 2 else tuple(run.nodes)
        group_suppressed = bool(ev.group_findings) and not kept_group
        for n in run.nodes:
            raw = ev.node_findings.get(n, [])
            kept = [f for f in raw if not self._suppressed(n, probe, f, run.at)]
            top = worst(kept)
            if top is not None:
                code, sev, text = top.code, top.severity, top.detail
                more = len({f.key for f in kept}) - 1
                if more > 0:
                    text += f" (and {more} more series)"
            elif raw or group_suppressed:
                event = next((e for e in (self.holding(m, probe) for m in (n, *run.nodes)) if e), None)
                code, sev = ReasonCode.FLEET_EVENT, Severity.NONE
                text = (event.text if event is not None else "fleet event") + (f": {worst(raw).detail}"  # type: ignore[union-attr]
                                                                               if raw else "")
            else:
                code, sev, text = ReasonCode.OK, Severity.NONE, PASS_TEXT
            note = self.image_notes.pop((n, run.run_id), None)
            if note is not None:
                text = f"{text}; {note}"
            mark = Mark(run.run_id, n, probe, run.at, sev, code, text, not run.priority,
                        event_proof=any(f.event_proof for f in kept), findings=tuple(kept),
                        raw_flagged=bool(raw) or bool(ev.group_findings),
                        shortfalls=tuple(ev.shortfalls.get(n, ())))
            if mark.regular:
                rate = self.flag_rates[(self.node_class(n), probe, False)]
                rate[0] += mark.flagged
                rate[1] += 1
            self._add_mark(mark)
            out.marks.append(mark)
            self.status[(n, probe)] = _Status("judged", run.at, run.run_id, "")
            self.error_streak.pop((n, probe), None)
            pending = self.pending.get((n, probe))
            if pending is not None and pending.requested_at <= run.at:
                rest = self._other_side(pending, n, run)
                if rest is not None:
                    self.pending[(n, probe)] = rest
                else:
                    del self.pending[(n, probe)]
                    out.satisfied.append((n, probe))
        if len(run.nodes) > 1 and (ev.group_findings or any(g for *_, g in ev.values)):
            top = worst(kept_group)
            if top is not None:
                code, sev, text = top.code, top.severity, top.detail
            elif group_suppressed:
                code, sev, text = ReasonCode.FLEET_EVENT, Severity.NONE, "fleet event"
            else:
                code, sev, text = ReasonCode.OK, Severity.NONE, PASS_TEXT
            record = GroupRecord(run.run_id, probe, run.at, tuple(run.nodes), sev, code, text,
                                 suspects if run.priority and suspects else regular_suspects,
                                 event_proof=any(f.event_proof for f in kept_group), findings=tuple(kept_group))
            self._add_group(record, suppressed=group_suppressed)
            out.groups.append(record)
            if not run.priority:
                rate = self.flag_rates[(self.node_class(run.nodes[0]), probe, True)]
                rate[0] += record.flagged
                rate[1] += 1
        flagged_keys = {(n, f.key) for n, fs in ev.node_findings.items() for f in fs
                        if not self._suppressed(n, probe, f, run.at)}
        flagged_keys |= {(n, f.key) for f in kept_group for n in run.nodes}
        window = self.settings.baseline.window
        oldest = run.at - self.settings.baseline.max_age_s
        for node, key, value, _ in ev.values:
            st = self.state(node, key)
            if (node, key) not in flagged_keys:
                history = [(a, v) for a, v in st.accepted if a >= oldest][-(window - 1):] if window > 1 else []
                history.append((run.at, value))
                st.accepted = history
                base = baseline_of([v for _, v in history], min_samples=self.settings.baseline.min_samples)
                st.baseline, st.spread = (base.median, base.spread) if base else (None, None)
                if self._noise_dirty is not None:
                    self._noise_dirty.add((node, key))
            out.series.append(st.copy())

    def _under_suspicion(self, node: str, probe: str, at: float) -> bool:
        """In a re-probe, a member under suspicion (a pending request, or a verdict other than a pass)
        is a suspect; the others are the known-good partners the planner added."""
        pending = self.pending.get((node, probe))
        if pending is not None and pending.requested_at <= at:
            return True
        verdict = self.verdicts.get((node, probe))
        return verdict is not None and verdict.outcome is not Outcome.PASS

    def _add_mark(self, mark: Mark) -> None:
        marks = self.marks.setdefault((mark.node, mark.probe), [])
        marks.append(mark)
        keep = max(self.settings.confirm.m, 1) + EXTRA_RETESTS
        if len(marks) > keep:
            del marks[: len(marks) - keep]

    def _add_group(self, record: GroupRecord, *, suppressed: bool = False) -> None:
        keep = max(self.settings.confirm.m, 1) + EXTRA_RETESTS
        for member in record.members:
            hist = self.group_history.setdefault((member, record.probe), [])
            hist.append(record)
            if len(hist) > keep:
                del hist[: len(hist) - keep]
            if not record.flagged and not suppressed:
                last = self.last_group_pass[record.probe]
                last[member] = max(last.get(member, float("-inf")), record.at)
        if record.flagged:
            self.flagged_groups[record.probe].append(record)
        for cause in self.causes:
            cause.note_group(record)

    # -- localisation, verdicts, requests -------------------------------------------------------
    def _localise(self, probe: str, now: float) -> Attribution:
        cutoff = now - self.settings.confirm.window_s
        records = [r for r in self.flagged_groups.get(probe, []) if r.at >= cutoff]
        self.flagged_groups[probe] = records
        last_pass = self.last_group_pass.get(probe, {})
        live = [r for r in records if not self.set_aside(r)
                and not any(c.claims_group(self, r, cutoff) for c in self.causes)]
        return attribute(live, last_pass)

    def set_aside(self, r: GroupRecord) -> bool:
        """A bad group result no node need explain: from before a member's reset, or one a cause sets
        aside (a switch finding holding a member, a fleet event of the class)."""
        if any(self.resets.get(m, float("-inf")) > r.at for m in r.members):
            return True
        return any(c.sets_aside(self, r) for c in self.causes)

    def own_finding(self, node: str, probe: str, cutoff: float) -> bool:
        """Whether the node's own figures of ``probe`` were flagged in one of its recent runs (since ``cutoff``)."""
        return any(mk.flagged and mk.at >= cutoff for mk in self.marks.get((node, probe), ()))

    def _recent_marks(self, node: str, probe: str, now: float) -> list[Mark]:
        """The node's marks in the confirmation window, after its last reset, with findings a live cause
        explains taken out (a fleet event, a switch finding: they may predate the event's declaration), and
        the chance findings of values measured during an event that has ended (``_after_event``)."""
        cutoff = max(now - self.settings.confirm.window_s, self.resets.get(node, float("-inf")))
        marks = [mk for mk in self.marks.get((node, probe), []) if mk.at >= cutoff]
        cls = self.node_class(node)
        for cause in self.causes:
            if any(cause.ended_over(cls, probe, mk.at) for mk in marks):
                if marks[-1].flagged and cause.ended_over(cls, probe, marks[-1].at):
                    self._after_events.add((node, probe))
                marks = [_after_event(mk) if cause.ended_over(cls, probe, mk.at) else mk for mk in marks]
        for cause in self.causes:
            event = cause.holding(node, probe, cls)
            if event is not None:
                marks = [replace(self._under_event(mk, event, cause), shortfalls=()) if mk.at >= event.started_at
                         else mk for mk in marks]
        return marks

    @staticmethod
    def _under_event(mark: Mark, event: FleetEvent, cause: Cause) -> Mark:
        if mark.at < event.started_at or not mark.flagged:
            return mark
        kept = tuple(f for f in mark.findings if cause.resists(f, event))
        if len(kept) == len(mark.findings):
            return mark
        top = worst(kept)
        if top is None:
            return replace(mark, severity=Severity.NONE, code=ReasonCode.FLEET_EVENT,
                           text=f"{event.text}: {mark.text}", findings=())
        return replace(mark, severity=top.severity, code=top.code, text=top.detail, findings=kept)

    def retests(self, cls: str, probe: str, *, group: bool, node: str | None = None,
                cold: bool = True) -> tuple[int, int]:
        """(n, m): how many of the last m results must repeat a finding. ``confirm.n`` of ``confirm.m``,
        raised while the class's regular results are flagged by chance so often (outlier runs) that
        n of m chance flags would exceed ``false_drains_per_1000_node_days`` (``noise.retests_for``); at a
        cold start, from the rate's upper bound once the class flagged other nodes than ``node``
        (``rounds.cold_retests``; not with ``cold=False``: a hard fault or a failed check is no chance
        value)."""
        c, s = self.settings.confirm, self.settings
        flagged, judged = self.flag_rates.get((cls, probe, group), (0, 0))
        own = flagged if not cold else 0
        if node is not None and cold:
            regular = {mk.run_id: mk for mk in self.marks.get((node, probe), ()) if mk.regular}
            if group:
                own = sum(1 for r in self.group_history.get((node, probe), ()) if r.flagged and r.run_id in regular)
            else:
                own = sum(1 for mk in regular.values() if mk.flagged)
        need = max(retests_for(flagged, judged, s.false_drains_per_1000_node_days, s.runs_per_node_day, c.n, c.m,
                               extra=EXTRA_RETESTS),
                   cold_retests(flagged - own, judged, s.false_drains_per_1000_node_days, s.runs_per_node_day, c.n,
                                c.m, extra=EXTRA_RETESTS, min_sample=MIN_RATE_SAMPLE,
                                first=cold and self.flag_rates.get((cls, probe, False), (0, 0))[1]
                                < s.baseline.min_samples * self._size(cls)))
        return need, c.m + need - c.n

    def _size(self, cls: str) -> int:
        """The nodes of a class (counted once per evaluation)."""
        if self._sizes is None:
            sizes: dict[str, int] = defaultdict(int)
            for name in self.classes.values():
                sizes[name] += 1
            self._sizes = dict(sizes)
        return self._sizes.get(cls, 1)

    def _event_hold(self, node: str, probe: str, findings: Sequence[Finding], run_ids: Sequence[str],
                    now: float) -> Hold | None:
        """A new recommendation waits while the event rule has not seen its window (``rounds.event_hold``),
        or the switch rule its leaf (``rounds.leaf_hold``); one already made, or one an event (a switch)
        would not explain (event-proof, switch-proof findings), does not wait for it."""
        old = self.verdicts.get((node, probe))
        if old is not None and old.evidence.get("stage") == CONFIRMED:
            return None
        ids = set(run_ids)
        times = [mk.at for mk in self.marks.get((node, probe), ()) if mk.run_id in ids]
        times += [r.at for r in self.group_history.get((node, probe), ()) if r.run_id in ids]
        if not times:
            return None
        partners = {m for r in self.group_history.get((node, probe), ()) if r.run_id in ids for m in r.members}
        for cause in self.causes:
            hold = cause.hold(self, node, probe, findings, min(times), partners, now)
            if hold is not None:
                return hold
        return None

    def _error_shares(self, keys: set[tuple[str, str]]) -> dict[tuple[str, str], float]:
        """(class, probe) → the share of the class's nodes whose latest run of the probe is an error."""
        if not keys:
            return {}
        counts: dict[tuple[str, str], list[int]] = {k: [0, 0] for k in keys}
        for (node, probe), st in self.status.items():
            c = counts.get((self.node_class(node), probe))
            if c is not None:
                c[0] += st.kind == "error"
                c[1] += 1
        return {k: errors / total for k, (errors, total) in counts.items() if total}

    def _conclude(self, node: str, probe: str, attribution: Attribution | None,
                  suspects: Mapping[str, list[GroupRecord]], now: float, out: JudgeOutput,
                  class_errors: float = 1.0) -> None:
        c = self.settings.confirm
        marks = confirmable(self._recent_marks(node, probe, now))
        status = self.status.get((node, probe))
        if not marks and status is None:
            return
        out.evaluated.add((node, probe))
        latest = marks[-1] if marks else None
        cls = self.node_class(node)
        hard = any(_no_chance(f) for mk in marks for f in mk.findings)
        need, window = self.retests(cls, probe, group=False, node=node, cold=not hard)
        fail_n, seen, fail_keys = repeated(marks, window, Severity.FAIL)
        bad_n, _, bad_keys = repeated(marks, window, Severity.DEGRADED)
        blamed = attribution.blamed.get(node) if attribution else None
        blame_n, blame_seen, blame_need = 0, 0, c.n
        if blamed:
            cutoff = max(now - c.window_s, self.resets.get(node, float("-inf")))
            history = [r for r in self.group_history.get((node, probe), []) if r.at >= cutoff]
            blame_need, blame_window = self.retests(cls, probe, group=True, node=node,
                                                    cold=not any(_no_chance(f) for r in blamed for f in r.findings))
            blame_n, blame_seen = blame_confirmed(node, history, self.last_group_pass.get(probe, {}), n=blame_need,
                                                  m=blame_window)
        at = max(latest.at if latest else 0.0, status.at if status else 0.0)

        verdict: Verdict
        recommend = False
        evidence: dict[str, object] = {}
        node_sev = Severity.FAIL if fail_n >= need else Severity.DEGRADED if bad_n >= need else Severity.NONE
        recent = marks[-window:]
        series = max((len(mk.shortfalls) for mk in recent), default=1)
        by_mean = mean_confirmed(recent, k_for(self.settings.false_drains_per_1000_node_days,
                                               self.settings.runs_per_node_day, max(series, 1), 1, 1),
                                 fraction=self.drift_fraction)
        mean_sev = max((f.severity for mk in recent for f in mk.findings if f.key in by_mean), default=Severity.NONE)
        if mean_sev > node_sev:
            node_sev = mean_sev
        blame_sev = max_severity(blamed) if blamed and blame_n >= blame_need else Severity.NONE
        if node_sev or blame_sev:
            if node_sev >= blame_sev:
                counts = fail_keys if node_sev is Severity.FAIL else bad_keys
                sure = {key for key, n in counts.items() if n >= need} | set(by_mean)
                flagged = [mk for mk in marks[-window:] if mk.severity >= node_sev
                           and (not mk.findings or any(f.key in sure for f in mk.findings))]
                top = worst(f for mk in flagged for f in mk.findings if f.key in sure) or None
                code = top.code if top else flagged[-1].code
                text = (top.detail if top else flagged[-1].text) + \
                    f"; confirmed in {len(flagged)} of the last {min(seen, window)} runs"
                run_ids = tuple(mk.run_id for mk in flagged)
                outcome = Outcome.FAIL if node_sev is Severity.FAIL else Outcome.DEGRADED
                findings = [f for mk in flagged for f in mk.findings if f.key in sure]
            else:
                assert blamed is not None
                partners = sorted({m for r in blamed for m in r.members if m != node})
                top = worst(f for r in blamed for f in r.findings)
                code = top.code if top is not None and top.code in HARD_FAULTS else ReasonCode.LOCALISED
                text = (f"multi-node results are bad with this node ({blame_n} of its last {blame_seen}, with "
                        f"{', '.join(partners)}) and good without it: {top.detail if top else blamed[-1].text}")
                run_ids = tuple(r.run_id for r in blamed)
                outcome = Outcome.FAIL if blame_sev is Severity.FAIL else Outcome.DEGRADED
                findings = [f for r in blamed for f in r.findings]
                evidence["partners"] = partners
            evidence.update(self._evidence(node, findings, run_ids, f"{max(len(run_ids), blame_n)}/{window}"))
            if by_mean and node_sev >= blame_sev:
                evidence["retest_mean_z"] = max(by_mean.values())
            evidence["stage"] = CONFIRMED
            hold = self._event_hold(node, probe, findings, run_ids, now)
            if hold is not None:
                text, evidence["stage"], evidence["held_since"] = f"{text}; {hold.text}", HELD, hold.since
            verdict = Verdict(node, probe, outcome, text, code.value, run_ids, _flat(evidence, top), at)
            recommend = hold is None
        elif status is not None and status.kind != "judged" and (latest is None or status.at >= latest.at):
            code = ReasonCode.PROBE_ERROR if status.kind == "error" else ReasonCode.MEASUREMENT_MISSING
            text = status.text
            streak = self.error_streak.get((node, probe), 0)
            if code is ReasonCode.PROBE_ERROR and streak >= c.error_streak and class_errors <= c.error_class_share:
                code = ReasonCode.REPEATED_ERRORS
                text = (f"the probe errored in its last {streak} runs on this node while its class passes "
                        f"({class_errors:.0%} of the class erring): {status.text}")
            verdict = Verdict(node, probe, Outcome.ERROR, text, code.value, (status.run_id,), {}, status.at)
        elif latest is not None and latest.flagged:
            top = worst(latest.findings)
            text = latest.text + f"; seen in {bad_n} of the last {min(seen, window)} runs, re-probe requested"
            verdict = Verdict(node, probe, Outcome.DEGRADED, text, latest.code.value, (latest.run_id,),
                              _flat(self._evidence(node, list(latest.findings), (latest.run_id,),
                                                   f"{bad_n}/{need}"), top), at)
        elif blamed:
            top = worst(f for r in blamed for f in r.findings)
            text = (f"multi-node results are bad with this node ({blame_n} so far) and good without it: "
                    f"{top.detail if top else blamed[-1].text}; re-probe with known-good partners requested")
            verdict = Verdict(node, probe, Outcome.DEGRADED, text, ReasonCode.LOCALISED.value,
                              tuple(r.run_id for r in blamed), _flat({}, top), at)
        elif node in suspects:
            records = suspects[node]
            others = sorted({m for r in records for m in r.members if m != node})
            text = (f"in a bad multi-node result with {', '.join(others)}: {records[-1].text}; "
                    "re-pairing with known-good partners requested")
            verdict = Verdict(node, probe, Outcome.DEGRADED, text, ReasonCode.GROUP_SUSPECT.value,
                              tuple(r.run_id for r in records), _flat({}, worst(records[-1].findings)), at)
        elif latest is not None and latest.code is ReasonCode.FLEET_EVENT:
            verdict = Verdict(node, probe, Outcome.DEGRADED, latest.text, ReasonCode.FLEET_EVENT.value,
                              (latest.run_id,), {}, at)
        else:
            text = (latest.text if latest is not None and latest.code is ReasonCode.OK
                    and latest.text.startswith(PASS_TEXT) else PASS_TEXT)  # with an image change's note
            verdict = Verdict(node, probe, Outcome.PASS, text, ReasonCode.OK.value,
                              (latest.run_id,) if latest else (), {}, at)
        if verdict.evidence.get("stage") == HELD:
            self.held.add((node, probe))
        else:
            self.held.discard((node, probe))
        if verdict.outcome is Outcome.PASS and bad_n and _may_confirm(marks[-window:], bad_n, need, window):
            self._unsettled.add((node, probe))
        self.set_verdict(verdict, out)
        if recommend:
            out.recommendations.append(RecommendationCandidate(
                node, probe, verdict.outcome, verdict.reason_code, verdict.reason,
                {"run_ids": list(verdict.run_ids), **evidence}, at))

    def _evidence(self, node: str, findings: Sequence[Finding], run_ids: Sequence[str],
                  confirmed: str) -> dict[str, object]:
        out: dict[str, object] = {"confirmed": confirmed, "run_ids": list(run_ids),
                                  "findings": [f.evidence() for f in findings][:8]}
        top = worst(findings)
        if top is not None:
            st = self.series.get((node, top.key))
            if st is not None:
                if st.floor is not None:
                    out["floor"] = st.floor
                if st.baseline is not None:
                    out["baseline"] = st.baseline
        return out

    def _request(self, attributions: Mapping[str, Attribution], now: float, out: JudgeOutput) -> None:
        c = self.settings.confirm

        def ask(kind: Literal["reprobe", "localise", "bisect"], probe: str, nodes: tuple[str, ...], why: str) -> None:
            if any(n in self.drained or (n, probe) in self.pending for n in nodes):
                return
            req = Request(kind, probe, nodes, now, why)
            for n in nodes:
                self.pending[(n, probe)] = req
            out.requests.append(req)

        for (node, probe) in sorted(out.evaluated):
            v = self.verdicts.get((node, probe))
            if v is None or v.outcome is not Outcome.DEGRADED:
                continue
            if v.reason_code in (ReasonCode.GROUP_SUSPECT.value, ReasonCode.FLEET_EVENT.value) or \
                    v.evidence.get("stage") == HELD:
                continue
            if (node, probe) in {(r.node, r.probe) for r in out.recommendations}:
                continue
            kind: Literal["reprobe", "localise"] = "localise" if v.reason_code == ReasonCode.LOCALISED.value \
                else "reprobe"
            ask(kind, probe, (node,), v.reason)
        for node, probe in sorted(self._unsettled):
            ask("reprobe", probe, (node,), "an earlier finding is neither confirmed nor cleared yet")
        for node, probe in sorted(self._after_events):
            ask("reprobe", probe, (node,), "flagged during a fleet event that has ended: measured again first")
        for probe, attribution in sorted(attributions.items()):
            for record, cands in attribution.unresolved:
                if record.at < now - c.window_s:
                    continue
                if len(record.members) <= 2 or len(cands) <= 2:
                    for cand in cands:
                        ask("localise", probe, (cand,), f"localise a bad {probe} result ({record.run_id})")
                else:
                    for half in split(cands):
                        if half:
                            ask("bisect", probe, half, f"bisect a bad {probe} result ({record.run_id})")

    def _expire(self, now: float, out: JudgeOutput) -> None:
        timeout = self.settings.confirm.request_timeout_s
        for key, req in list(self.pending.items()):
            if req.requested_at + timeout < now:
                del self.pending[key]
                out.satisfied.append(key)

    def _apply_resets(self, resets: Mapping[str, float]) -> set[tuple[str, str]]:
        touched: set[tuple[str, str]] = set()
        for node, at in resets.items():
            if at > self.resets.get(node, float("-inf")):
                self.resets[node] = at
                touched.update(k for k in self.verdicts if k[0] == node)
        return touched

    # -- re-probes for the planner ----------------------------------------------------------------
    def requests(self, now: float, probes: Mapping[str, ProbeSettings]) -> list[PriorityRequest]:
        """Pending re-probes as planner requests, oldest first, each multi-node one with known-good
        partners of the same class (nodes whose latest verdict for the probe is a pass)."""
        with self._lock:
            return self._requests(now, probes)

    def _requests(self, now: float, probes: Mapping[str, ProbeSettings]) -> list[PriorityRequest]:
        timeout = self.settings.confirm.request_timeout_s
        groups: dict[tuple[str, tuple[str, ...]], Request] = {}
        for req in self.pending.values():
            if req.requested_at + timeout >= now:
                groups.setdefault((req.probe, req.nodes), req)
        busy = {n for n, _ in self.pending}
        out: list[PriorityRequest] = []
        pools: dict[str, dict[str, tuple[str, ...]]] = {}
        for (probe, nodes), req in sorted(groups.items(), key=lambda item: (item[1].requested_at, item[0])):
            if probe in self._by_node:
                out.extend(PriorityRequest(name, nodes, (), 1, reason=f"{req.kind}: {probe}: {req.reason}"[:200])
                           for name, ps in sorted(probes.items()) if ps.enabled and ps.nodes_per_job == 1)
                continue
            settings = probes.get(probe)
            if settings is None or not settings.enabled:
                continue
            size = max(settings.nodes_per_job, len(nodes))
            partners: tuple[str, ...] = ()
            if size > len(nodes):
                cls = self.node_class(nodes[0])
                if probe not in pools:
                    pools[probe] = self._partner_pools(probe, busy)
                pool = pools[probe].get(cls, ())
                k = self.settings.confirm.partners + size - len(nodes) - 1
                split_by_leaf = self._by_leaf(nodes, pool, k) if req.kind in ("reprobe", "localise") else None
                if split_by_leaf is not None:
                    for where, chosen in split_by_leaf:
                        if req.side and where != req.side:
                            continue
                        out.append(PriorityRequest(probe, nodes, chosen, size,
                                                   reason=f"{req.kind} ({where}): {req.reason}"[:200]))
                    continue
                partners = pick_partners(nodes[0], pool, k)
            out.append(PriorityRequest(probe, nodes, partners, size, reason=f"{req.kind}: {req.reason}"[:200]))
        return out

    def _other_side(self, pending: Request, node: str, run: RunInput) -> Request | None:
        """The half of a re-probe split by leaf (``_by_leaf``) still to run after ``run`` ran one side;
        ``None``: the request is answered."""
        topology = self._topology
        if topology is None or pending.side or pending.nodes != (node,) or len(run.nodes) < 2 \
                or pending.kind not in ("reprobe", "localise"):
            return None
        partners = [p for p in run.nodes if p != node]
        same = [topology.same_leaf(node, p) for p in partners]
        if all(same):
            return replace(pending, side="other leaf", requested_at=run.at)
        if not any(same):
            return replace(pending, side="same leaf", requested_at=run.at)
        return None

    def _by_leaf(self, nodes: tuple[str, ...], pool: tuple[str, ...], k: int
                 ) -> tuple[tuple[str, tuple[str, ...]], ...] | None:
        """With a topology, a suspect node's multi-node re-probe twice: with partners under its own leaf and
        with partners under other leaves, so that a node fault (both fail) is told from a fault of its leaf's
        uplink (only the cross-leaf one fails). ``None``: no topology, several suspects, or no partner on one
        side (the one plain request then)."""
        topology = self._topology
        if topology is None or len(nodes) != 1 or nodes[0] not in topology.leaf_of:
            return None
        node = nodes[0]
        same = tuple(p for p in pool if topology.same_leaf(node, p))
        other = tuple(p for p in pool if p in topology.leaf_of and not topology.same_leaf(node, p))
        if not same or not other:
            return None
        return (("same leaf", pick_partners(node, same, k)), ("other leaf", pick_partners(node, other, k)))

    def partners(self, node: str, probe: str, k: int, *, exclude: Iterable[str] = ()) -> tuple[str, ...]:
        """Up to ``k`` known-good partners for ``node``: same class, latest verdict for ``probe`` a
        pass, no pending re-probe, not drained."""
        with self._lock:
            return self._partners(node, probe, k, exclude)

    def _partners(self, node: str, probe: str, k: int, exclude: Iterable[str]) -> tuple[str, ...]:
        busy = {n for n, _ in self.pending} | set(exclude)
        return pick_partners(node, self._partner_pools(probe, busy).get(self.node_class(node), ()), k)

    def _partner_pools(self, probe: str, busy: set[str]) -> dict[str, tuple[str, ...]]:
        """Per class, sorted: the nodes whose latest verdict for ``probe`` is a pass, not ``busy``, not drained."""
        pools: dict[str, list[str]] = {}
        for (n, p), v in self.verdicts.items():
            if p == probe and v.outcome is Outcome.PASS and n not in busy and n not in self.drained:
                pools.setdefault(self.node_class(n), []).append(n)
        return {cls: tuple(sorted(names)) for cls, names in pools.items()}

    def priority_requests(self, own_drains: Mapping[str, Sequence[str]], probes: Mapping[str, ProbeSettings],
                          last_attempts: Mapping[tuple[str, str], float], now: float) -> list[PriorityRequest]:
        """Everything the planner should run before the regular schedule: pending confirmation and
        localisation re-probes, rechecks of healthd's own drains (``own_drains``: node → probes), and
        rechecks of nodes with a confirmed finding."""
        with self._lock:
            keys = self._confirmed()
            confirmed: dict[str, tuple[str, ...]] = {}
            for node, probe in sorted(keys):
                if node not in own_drains:
                    confirmed[node] = (*confirmed.get(node, ()), probe)
            return [
                *self._requests(now, probes),
                *self._recheck_requests(own_drains, probes, last_attempts, now, True, keys),
                *self._recheck_requests(confirmed, probes, last_attempts, now, False, keys),
            ]

    def recheck_requests(self, rechecks: Mapping[str, Sequence[str]], probes: Mapping[str, ProbeSettings],
                         last_attempts: Mapping[tuple[str, str], float], now: float, *,
                         drained: bool = True) -> list[PriorityRequest]:
        """Re-probes of ``rechecks`` (node → probes): healthd's own drains (``drained``: the node may be
        idle and drained; once per probe interval) or nodes in service with a confirmed finding (never a
        drained node: it may be someone else's; once per ``confirm.recheck_interval_s``, so a repair
        clears the finding, its alert and recommendation within minutes). Multi-node ones with
        known-good partners."""
        with self._lock:
            return self._recheck_requests(rechecks, probes, last_attempts, now, drained)

    def _recheck_requests(self, rechecks: Mapping[str, Sequence[str]], probes: Mapping[str, ProbeSettings],
                          last_attempts: Mapping[tuple[str, str], float], now: float,
                          drained: bool, confirmed: set[tuple[str, str]] | None = None) -> list[PriorityRequest]:
        out: list[PriorityRequest] = []
        confirmed = self._confirmed() if confirmed is None else confirmed
        busy = {n for n, _ in self.pending} | set(rechecks)
        pools: dict[str, dict[str, tuple[str, ...]]] = {}
        for node, wanted in sorted(rechecks.items()):
            for probe in sorted(set(wanted)):
                settings = probes.get(probe)
                if settings is None or not settings.enabled:
                    continue
                interval = settings.interval_s
                if not drained and (node, probe) in confirmed and self.settings.confirm.recheck_interval_s > 0:
                    interval = min(interval, self.settings.confirm.recheck_interval_s)
                if now - last_attempts.get((node, probe), float("-inf")) < interval:
                    continue
                size = settings.nodes_per_job
                partners: tuple[str, ...] = ()
                if size > 1:
                    if probe not in pools:
                        pools[probe] = self._partner_pools(probe, busy)
                    partners = pick_partners(node, pools[probe].get(self.node_class(node), ()),
                                             self.settings.confirm.partners + size - 2)
                out.append(PriorityRequest(probe, (node,), partners, size, allow_drained=drained,
                                           reason="recheck of a healthd drain" if drained
                                           else "recheck of a confirmed finding"))
        return out

    def confirmed_findings(self) -> dict[str, tuple[str, ...]]:
        """Nodes with a confirmed finding (node → its probes): what ``recheck_requests`` re-probes every
        ``confirm.recheck_interval_s`` so that a repaired node clears within minutes."""
        with self._lock:
            out: dict[str, tuple[str, ...]] = {}
            for node, probe in sorted(self._confirmed()):
                out[node] = (*out.get(node, ()), probe)
            return out

    def _confirmed(self) -> set[tuple[str, str]]:
        return {key for key, v in self.verdicts.items()
                if v.outcome in (Outcome.DEGRADED, Outcome.FAIL) and v.evidence.get("stage") == CONFIRMED}

    def active_events(self) -> list[FleetEvent]:
        with self._lock:
            return sorted((e for c in self.causes for e in c.fleet_events()), key=lambda e: (e.node_class, e.probe))

    # -- documents other than runs ---------------------------------------------------------------
    def observe(self, document: object, nodes: Sequence[Node] = (), *, now: float) -> JudgeOutput:
        """Judge a document other than a run (a poll of the site's Prometheus, ``healthd.passive.source``; an
        operator's declared events): the registered source or cause it belongs to takes it. Thread-safe."""
        with self._lock:
            out = JudgeOutput(at=now)
            self._sizes = None
            self._note_classes(nodes)
            if nodes:
                self.drained = {n.name for n in nodes if n.drained}
            if not any(source.observe(self, document, now, out) for source in self.sources):
                any(cause.observe(self, document, now, out) for cause in self.causes)
            return out

    # -- persistence --------------------------------------------------------------------------
    def restore(self, state: JudgeState, nodes: Sequence[Node], *, now: float) -> None:
        """Rebuild the state from what the store kept (``Store.load_judgement``; a daemon restart). The
        state's series are taken over, not copied (a fleet has hundreds of thousands): do not reuse them."""
        with self._lock:
            for node in nodes:
                self.classes[node.name] = class_of(node)
            self._noise_dirty = None
            self._noise_stale = True
            self.drained = {n.name for n in nodes if n.drained}
            pooled: dict[SeriesKey, SeriesKey] = {}
            for st in state.series:
                where = (st.node, st.key)
                self.series[where] = st
                if st.last_value is not None:
                    fkey = pooled.get(st.key)
                    if fkey is None:
                        fkey = pooled[st.key] = st.key.without("gpu")
                    self.pools[(self.node_class(st.node), fkey)][where] = st
            for mark in sorted(state.marks, key=lambda m: (m.at, m.run_id)):
                self._add_mark(mark)
                self.status[(mark.node, mark.probe)] = _Status("judged", mark.at, mark.run_id, "")
                if mark.regular:
                    self.samples[(self.node_class(mark.node), mark.probe)][mark.node] = (mark.at, mark.raw_flagged)
            for record in sorted(state.groups, key=lambda g: (g.at, g.run_id)):
                self._add_group(record, suppressed=record.code is ReasonCode.FLEET_EVENT)
            for source in self.sources:
                source.restore(self, state)
            for cause in self.causes:
                cause.restore(self, state)
            for name, req in state.pending:
                self.pending[(name, req.probe)] = req
            for verdict in state.verdicts:
                self.verdicts[(verdict.node, verdict.probe)] = verdict
                if verdict.evidence.get("stage") == HELD:
                    self.held.add((verdict.node, verdict.probe))
            for name, at in state.resets:
                self.resets[name] = max(self.resets.get(name, float("-inf")), at)
            for cls, probe, group, flagged, judged in state.flag_rates:
                self.flag_rates[(cls, probe, group)] = [flagged, judged]
            for name, probe, streak in state.error_streaks:
                if streak > 0:
                    self.error_streak[(name, probe)] = streak


def _no_chance(f: Finding) -> bool:
    """A hard fault or a failed check: not a value that noise or a heavy tail makes (the cold-start rule
    of ``rounds.cold_retests`` does not apply)."""
    return f.code in HARD_FAULTS or f.code in (ReasonCode.CHECK_FAILED, ReasonCode.GPUS_MISSING)


def _after_event(mark: Mark) -> Mark:
    """A mark measured during an event that has ended: its figures were taken under the event (and compared
    with the class as it was then), so they confirm nothing now; the node is probed again first. A hard
    fault or a failed check stays."""
    kept = tuple(f for f in mark.findings if _no_chance(f))
    if len(kept) == len(mark.findings):
        return replace(mark, shortfalls=()) if mark.shortfalls else mark
    top = worst(kept)
    if top is None:
        return replace(mark, severity=Severity.NONE, code=ReasonCode.FLEET_EVENT, findings=(), shortfalls=(),
                       text=f"measured during a fleet event that has ended: {mark.text}")
    return replace(mark, severity=top.severity, code=top.code, text=top.detail, findings=kept, shortfalls=())


def _may_confirm(last: Sequence[Mark], flagged: int, need: int, window: int) -> bool:
    """Whether ``window - len(last[first flagged:])`` more runs could still bring ``flagged`` to ``need``."""
    first = next((i for i, mk in enumerate(last) if mk.severity >= Severity.DEGRADED), len(last))
    return flagged + window - (len(last) - first) >= need


def _flat(evidence: Mapping[str, object], top: Finding | None) -> dict[str, float | str]:
    """Verdict evidence: numbers and short strings only (the metric and API show it)."""
    out: dict[str, float | str] = {}
    if top is not None:
        out.update(top.evidence())
    for key in ("confirmed", "floor", "baseline", "stage", "held_since"):
        value = evidence.get(key)
        if isinstance(value, int | float | str):
            out[key] = value
    partners = evidence.get("partners")
    if isinstance(partners, list):
        out["partners"] = ",".join(str(p) for p in partners)
    return out
