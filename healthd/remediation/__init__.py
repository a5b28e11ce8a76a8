"""Remediation: recommendations, drains with safety limits, undrains, and their audit.

Modes (``[remediation] mode``):

- ``observe``: judge and export only; no recommendation is kept.
- ``recommend`` (default): confirmed findings become recommendations (node, reason code, text,
  evidence, since), exported as metrics, by ``/api/v1/recommendations`` and ``healthd recommend``.
- ``enforce``: recommendations are also acted on with ``scontrol`` drains, within these rules:

  * ownership: a drain reason is ``healthd: <code> <short evidence>``; a node drained (or with
    a reason) set by anyone else is never touched; only healthd's own drains are undrained;
  * circuit breaker: a drain that would make healthd's automatic drains in ``breaker_window_s``
    more than ``breaker_class_share`` of the class (at least ``breaker_class_min_nodes``) or more
    than ``breaker_max_nodes`` overall opens the breaker: no automatic action until it closes
    (after ``breaker_cooldown_s``, or ``healthd breaker --reset``), and an alert metric;
  * a cap of ``max_actions_per_hour`` automatic drains (the rest wait, still recommended);
  * only fresh evidence is acted on (``max_evidence_age_s``), so closing the breaker does not
    replay stale findings;
  * a node healthd drained ``repeat_max_drains`` times within ``repeat_window_s`` is left to
    humans: no automatic drain or undrain, the recommendation is marked escalated;
  * optional undrain of its own drains after ``undrain_after_passes`` consecutive passes.

Every action and refusal goes to the ``remediation_audit`` table and to the log.

Layout: ``decide`` is the functional core (pure: a snapshot in, a ``Plan`` of backend calls and store
writes out); ``apply`` makes the backend calls and writes the plan in one transaction; ``Remediator``
here reads the snapshot (one store call), decides, and applies (one store call).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any, Literal

from healthd.config import RemediationSettings
from healthd.errors import BackendError, InvalidNodeName, PolicyRefused
from healthd.judge.model import JudgeOutput
from healthd.model import Node, validate_node_name
from healthd.node_class import class_of
from healthd.remediation.adopt import ADOPT_SLACK_S, BoundaryFailure, DrainTakeover, adoptions
from healthd.remediation.apply import DrainCapability, RemediationRecords, carry_out, log
from healthd.remediation.decide import (
    ACTOR,
    MAX_REASON,
    Action,
    CallResults,
    Plan,
    decide,
    drain_by_hand,
    drain_reason,
    drains_since,
    needs_nodes,
    pass_streak,
    refuse_by_hand,
    reset_breaker,
    undrain_by_hand,
)
from healthd.remediation.repair import plan_text
from healthd.store import Store
from healthd.store.remediation import BREAKER_KEY
from healthd.store.rows import (
    AuditEntry,
    BreakerState,
    OpenDrain,
    RemediationChanges,
    RemediationSnapshot,
    RemediationWrite,
)

__all__ = [
    "ACTOR",
    "BREAKER_KEY",
    "MAX_REASON",
    "Action",
    "BreakerState",
    "DrainCapability",
    "Remediator",
    "action_counts",
    "drain_reason",
    "pass_streak",
    "recommendations_document",
]

ADOPT_RETRY_S = 5.0
"""How often a failed boundary check whose drain is not there yet is looked for again."""
NODE_CACHE_S = 30.0
"""The cluster's node list is read at most this often by ``apply`` (the backend re-checks a node's
drain state itself when asked to drain it)."""


class Remediator:
    """Turns judge output into recommendations and, in ``enforce`` mode, drains and undrains.
    Each call reads the store once and writes it once."""

    def __init__(
        self, store: RemediationRecords, cluster: DrainCapability, settings: RemediationSettings, *,
        clock: Callable[[], float] = time.time, full_check: Sequence[str] = (),
        snapshot_hook: Callable[[RemediationSnapshot, float], RemediationSnapshot] | None = None,
    ) -> None:
        """``full_check``: the probes a repaired node must pass (with those it was drained for) before it
        returns to service (``healthd.remediation.repair``). ``snapshot_hook(snap, since)``: the snapshot each
        decision reads, amended (``[ha]``: the drains other instances made since ``since`` count in the caps)."""
        self.snapshot_hook = snapshot_hook
        self.store = store
        self.full_check = tuple(full_check)
        self.cluster = cluster
        self.settings = settings
        self.clock = clock
        self._nodes: tuple[float, dict[str, Node]] | None = None
        self._boundary: list[BoundaryFailure] = []
        self._boundary_done: dict[str, float] = {}
        """Run ids of failures already taken over or refused, with their end (forgotten after the slack)."""
        self._boundary_tried = 0.0

    def _cluster_nodes(self, now: float) -> dict[str, Node]:
        if self._nodes is None or now - self._nodes[0] >= NODE_CACHE_S or now < self._nodes[0]:
            self._nodes = (now, {n.name: n for n in self.cluster.list_nodes()})
        return self._nodes[1]

    # -- the daemon's path ----------------------------------------------------------------------
    def apply(self, output: JudgeOutput) -> list[Action]:
        """Keep recommendations in step with ``output`` and, in ``enforce`` mode, act on them."""
        return self._tick(output, self.clock(), self.settings)

    def repair_tick(self) -> list[Action]:
        """Move repairs on when nothing was judged (a reboot takes ticks with no run collected): with
        ``repair`` set in ``enforce`` mode, a tick over no new judgement; else nothing."""
        if self.settings.repair == "none" or self.settings.mode != "enforce":
            return []
        return self.apply(JudgeOutput(at=self.clock()))

    def enforce(self, now: float, actions: list[Action]) -> None:
        """Drain nodes with fresh active recommendations, undrain own drains that pass again."""
        actions += self._tick(JudgeOutput(at=now), now, self.settings.model_copy(update={"mode": "enforce"}))

    def _tick(self, output: JudgeOutput, now: float, settings: RemediationSettings) -> list[Action]:
        snap = self.store.remediation_snapshot(
            drains_since=drains_since(settings, now),
            marks=settings.mode == "enforce" and settings.undrain_after_passes > 0)
        if self.snapshot_hook is not None:
            snap = self.snapshot_hook(snap, drains_since(settings, now))
        nodes = None
        if {m.node for m in output.marks} & {d.node for d in snap.open_drains}:
            self._nodes = None  # a recheck of an own drain: the backend lifted and restored it meanwhile
        if any(r.ended_at is None for r in snap.repairs):
            self._nodes = None  # a repair under way: its node's state is read at every tick
        if needs_nodes(snap, output, settings, now):
            try:
                nodes = self._cluster_nodes(now)
            except BackendError as exc:
                log.warning("remediation_cannot_list_nodes", error=str(exc))
        plan = self._carry_out(
            lambda results: decide(snap, output, settings, now=now, nodes=nodes, results=results,
                                   full_check=self.full_check), now)
        return plan.actions

    def _carry_out(self, decide_: Callable[[CallResults], Plan], at: float) -> Plan:
        plan, results = carry_out(self.store, self.cluster, decide_, at=at,
                                  repair_timeout_s=self.settings.repair_timeout_s)
        if any(r.result == "done" for r in results.values()):
            self._nodes = None
        return plan

    # -- drains Slurm made for healthd's boundary check ----------------------------------------------
    def adopt_boundary_drains(self, failures: Sequence[BoundaryFailure]) -> list[Action]:
        """Take over the drains slurmctld made for ``failures`` (``healthd.remediation.adopt``): the node's
        reason becomes healthd's and the drain is recorded as healthd's own (lifted by ``healthd undrain``
        or by hand in Slurm). Every mode: the drain exists already; healthd only explains and owns it."""
        if not isinstance(self.cluster, DrainTakeover):
            return []
        now = self.clock()
        # slurmctld may drain the node after the document is collected: each failure is tried again
        # (every ADOPT_RETRY_S) until its drain is taken over, refused, or ADOPT_SLACK_S old
        self._boundary_done = {r: at for r, at in self._boundary_done.items() if now - at <= ADOPT_SLACK_S}
        self._boundary = [f for f in (*self._boundary, *failures)
                          if now - f.finished_at <= ADOPT_SLACK_S and f.run_id not in self._boundary_done]
        if not self._boundary or (not failures and now - self._boundary_tried < ADOPT_RETRY_S):
            return []
        self._boundary_tried = now
        try:
            nodes = {n.name: n for n in self.cluster.list_nodes()}
        except BackendError as exc:
            log.warning("remediation_cannot_list_nodes", error=str(exc))
            return []
        own = {d.node for d in self.store.drains(open_only=True)}
        writes: list[RemediationWrite] = []
        for a in adoptions(self._boundary, nodes, own, self.settings.reason_prefix, max_reason=MAX_REASON):
            self._boundary_done[a.run_id] = next(f.finished_at for f in self._boundary if f.run_id == a.run_id)
            detail = {"slurm_reason": a.slurm_reason, "run_id": a.run_id, "context": a.context}
            try:
                self.cluster.take_over_drain(a.node, a.slurm_reason, a.reason)
            except PolicyRefused as exc:
                writes.append(AuditEntry("drain", a.node, "refused", f"not taken over: {exc}", ACTOR, detail))
                continue
            except (BackendError, ValueError) as exc:
                writes.append(AuditEntry("drain", a.node, "failed", f"not taken over: {exc}", ACTOR, detail))
                continue
            cls = class_of(nodes[a.node])
            writes.append(OpenDrain(a.node, cls, a.reason, ACTOR, automatic=True, probes=()))
            writes.append(AuditEntry("drain", a.node, "done", a.reason, ACTOR,
                                     {**detail, "taken_over": True}))
        if writes:
            self.store.apply_remediation(RemediationChanges(now, tuple(writes)))
            self._nodes = None
            for w in writes:
                if isinstance(w, AuditEntry):
                    (log.info if w.result == "done" else log.warning)(
                        "remediation_boundary_drain", node=w.node, result=w.result, reason=w.reason, **w.detail)
        return [Action(w.action, w.node, w.result, w.reason) for w in writes if isinstance(w, AuditEntry)]

    # -- the breaker ----------------------------------------------------------------------------
    def breaker(self) -> BreakerState:
        return self.store.breaker_state()

    def reset_breaker(self, *, actor: str) -> Action:
        now = self.clock()
        state = self.store.breaker_state()
        return self._carry_out(lambda _: reset_breaker(state, actor=actor, now=now), now).actions[-1]

    # -- rechecks of own drains ------------------------------------------------------------------
    def recheck_nodes(self) -> dict[str, tuple[str, ...]]:
        """healthd's own automatic drains (node → the probes it was drained for), to re-probe when
        ``recheck_drained`` is set (``Judge.recheck_requests`` turns them into planner requests)."""
        if not self.settings.recheck_drained or self.settings.mode != "enforce":
            return {}
        rebooting = {node for node, state in self.repairs_open().items() if state == "rebooting"}
        return {d.node: d.probes for d in self.store.drains(open_only=True)
                if d.automatic and d.probes and d.node not in rebooting}

    def repairs_open(self) -> dict[str, str]:
        """Node → state of the repairs under way (``rebooting``, ``validating``)."""
        if self.settings.repair == "none":
            return {}
        return {r.node: r.state for r in self.store.repairs(since=float("inf"), open_too=True)}

    def validating_since(self) -> dict[str, float]:
        """Node → when its full check after a repair began: its probes are due at once, whatever their
        interval (the planner's last attempts before then do not count)."""
        if self.settings.repair == "none":
            return {}
        return {r.node: r.validating_at for r in self.store.repairs(since=float("inf"), open_too=True)
                if r.state == "validating" and r.validating_at is not None}

    # -- operators ------------------------------------------------------------------------------
    def drain(self, node: str, text: str, *, actor: str) -> Action:
        """``healthd drain NODE``: same ownership rules, no breaker or cap (a human decided)."""
        return self._by_hand("drain", node, actor, lambda nodes, results: drain_by_hand(
            node, text, actor=actor, nodes=nodes, settings=self.settings, results=results))

    def undrain(self, node: str, *, actor: str) -> Action:
        """``healthd undrain NODE``: only a node healthd drained (its reason starts with the prefix)."""
        return self._by_hand("undrain", node, actor, lambda nodes, results: undrain_by_hand(
            node, actor=actor, nodes=nodes, settings=self.settings, results=results))

    def _by_hand(self, action: Literal["drain", "undrain"], node: str, actor: str,
                 decide_: Callable[[dict[str, Node], CallResults], Plan]) -> Action:
        try:
            validate_node_name(node)
        except InvalidNodeName as exc:
            why = str(exc)
            return self._carry_out(lambda _: refuse_by_hand(action, None, why, actor=actor), self.clock()).actions[-1]
        known = {n.name: n for n in self.cluster.list_nodes()}
        return self._carry_out(lambda results: decide_(known, results), self.clock()).actions[-1]


# -- read side: API, CLI, metrics ------------------------------------------------------------------
def recommendations_document(store: Store, settings: RemediationSettings) -> dict[str, Any]:
    """The ``/api/v1/recommendations`` document: active recommendations, fleet events, switch findings (one
    recommendation per switch: inspect it; its nodes' drains are held), link findings (one per link: inspect
    the path between its two nodes; neither is drained), breaker."""
    raw = store.remediation_state(BREAKER_KEY)
    breaker = raw if isinstance(raw, dict) else {"open": False}
    return {
        "mode": settings.mode,
        "recommendations": [
            {"node": r.node, "probe": r.probe, "outcome": r.outcome, "reason_code": r.reason_code, "text": r.text,
             "evidence": r.evidence, "since": r.since, "updated_at": r.updated_at, "escalated": r.escalated,
             "refused": r.last_refusal or None, "repair": repair_text(settings, r.node, r.reason_code)}
            for r in store.recommendations()
        ],
        "repairs": [
            {"node": r.node, "kind": r.kind, "reason_code": r.reason_code, "state": r.state, "started_at": r.started_at,
             "full_check": list(r.probes), "reason": r.reason}
            for r in store.repairs(since=float("inf"), open_too=True)
        ],
        "fleet_events": [
            {"node_class": e["node_class"], "probe": e["probe"], "series": e["series_key"],
             "scope": e["scope"] or "*", "started_at": e["started_at"], "text": e["text"]}
            for e in store.fleet_events(active_only=True)
        ],
        "switch_findings": [
            {"switch": e["switch"], "level": e["level"], "probe": e["probe"], "started_at": e["started_at"],
             "nodes": e["nodes"], "held": e["held"], "text": e["text"],
             "action": f"inspect switch {e['switch']} and its links; its nodes' {e['probe']} findings are held"
                       " (not drained) while it is named"}
            for e in store.switch_findings(active_only=True)
        ],
        "link_findings": [
            {"probe": f.probe, "a": f.a, "b": f.b, "started_at": f.started_at, "series": f.series, "layer": f.layer,
             "value": f.value, "reference": f.reference, "link": f.link, "run_ids": list(f.run_ids), "text": f.text,
             "action": f.action}
            for f in store.link_findings(active_only=True)
        ],
        "breaker": breaker,
        "drained_by_healthd": [
            {"node": d.node, "reason": d.reason, "since": d.drained_at, "automatic": d.automatic}
            for d in store.drains(open_only=True)
        ],
    }


def repair_text(settings: RemediationSettings, node: str, reason_code: str) -> str | None:
    """What healthd does (``enforce``) or would do (``recommend``: a dry run) to repair ``node`` for a
    finding of ``reason_code``; ``None`` when no repair applies."""
    if settings.repair == "none" or reason_code not in settings.repair_on or settings.mode == "observe":
        return None
    text = plan_text(settings.repair, settings.repair_command, node)
    return text if settings.mode == "enforce" else f"would {text} (recommend mode: nothing is done)"


def action_counts(actions: Sequence[Action]) -> Counter[tuple[str, str]]:
    return Counter((a.action, a.result) for a in actions)
