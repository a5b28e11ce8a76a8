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
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from healthd.config import RemediationSettings
from healthd.errors import BackendError, InvalidNodeName, PolicyRefused
from healthd.judge.model import JudgeOutput, ReasonCode
from healthd.logging import get_logger
from healthd.model import Node, Outcome, validate_node_name
from healthd.node_class import class_of
from healthd.store import Store
from healthd.store.rows import RecommendationRow
from healthd.units import human

log = get_logger(__name__)

ACTOR = "healthd"
BREAKER_KEY = "breaker"
MAX_REASON = 160
NODE_CACHE_S = 30.0
"""The cluster's node list is read at most this often by ``enforce`` (the backend re-checks a node's
drain state itself when asked to drain it)."""

ActionName = Literal["recommend", "clear", "withdraw", "drain", "undrain", "breaker_open", "breaker_close"]
Result = Literal["done", "refused", "failed", "info"]


class DrainCapability(Protocol):
    """The part of ``ClusterBackend`` remediation uses."""

    name: str

    def list_nodes(self) -> list[Node]: ...

    def drain(self, node: str, reason: str) -> None: ...

    def undrain(self, node: str) -> None: ...


@dataclass(frozen=True)
class Action:
    action: ActionName
    node: str | None
    result: Result
    reason: str


@dataclass(frozen=True)
class BreakerState:
    open: bool
    opened_at: float | None = None
    reason: str = ""
    closed_at: float | None = None


def drain_reason(prefix: str, rec: RecommendationRow) -> str:
    """``healthd: below_floor gemm gpu 3 flop_per_second{dtype=bf16} 343.8 TFLOP/s<525 TFLOP/s run 0042..``"""
    parts = [prefix, rec.reason_code, rec.probe]
    findings = rec.evidence.get("findings")
    top = findings[0] if isinstance(findings, list) and findings and isinstance(findings[0], dict) else None
    if top is not None:
        series = str(top.get("series", ""))
        name = series.split("{")[0].split(" ")[-1]
        value, threshold = top.get("value"), top.get("threshold")
        if isinstance(value, int | float) and isinstance(threshold, int | float):
            parts.append(f"{series} {human(name, float(value))}<{human(name, float(threshold))}"
                         if rec.reason_code != ReasonCode.CHECK_FAILED.value else series)
    elif rec.reason_code == ReasonCode.LOCALISED.value:
        parts.append("multi-node results bad with this node")
    run_ids = rec.evidence.get("run_ids")
    if isinstance(run_ids, list) and run_ids:
        parts.append(f"run {run_ids[-1]}")
    return " ".join(parts)[:MAX_REASON]


class Remediator:
    """Turns judge output into recommendations and, in ``enforce`` mode, drains and undrains."""

    def __init__(
        self, store: Store, cluster: DrainCapability, settings: RemediationSettings, *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.cluster = cluster
        self.settings = settings
        self.clock = clock
        self._nodes: tuple[float, dict[str, Node]] | None = None

    def _cluster_nodes(self, now: float) -> dict[str, Node]:
        if self._nodes is None or now - self._nodes[0] >= NODE_CACHE_S or now < self._nodes[0]:
            self._nodes = (now, {n.name: n for n in self.cluster.list_nodes()})
        return self._nodes[1]

    # -- audit ----------------------------------------------------------------------------------
    def _audit(self, actions: list[Action], action: ActionName, node: str | None, result: Result, reason: str,
               *, actor: str = ACTOR, detail: dict[str, Any] | None = None) -> Action:
        now = self.clock()
        self.store.add_audit(at=now, actor=actor, action=action, node=node, result=result, reason=reason,
                             detail=detail)
        logger = log.warning if result in ("refused", "failed") else log.info
        if action == "breaker_open":
            logger = log.error
        logger("remediation_" + action, node=node, result=result, reason=reason, actor=actor)
        done = Action(action, node, result, reason)
        actions.append(done)
        return done

    # -- the daemon's path ----------------------------------------------------------------------
    def apply(self, output: JudgeOutput) -> list[Action]:
        """Keep recommendations in step with ``output`` and, in ``enforce`` mode, act on them."""
        actions: list[Action] = []
        now = self.clock()
        if self.settings.mode == "observe":
            for rec in self.store.recommendations():
                self.store.close_recommendations(node=rec.node, probe=rec.probe, state="withdrawn",
                                                 reason="remediation mode is observe", at=now)
            return actions
        self._sync(output, now, actions)
        if self.settings.mode == "enforce":
            self.enforce(now, actions)
        return actions

    def _sync(self, output: JudgeOutput, now: float, actions: list[Action]) -> None:
        active = {(r.node, r.probe): r for r in self.store.recommendations()}
        act_on = set(self.settings.act_on)
        wanted = {(c.node, c.probe): c for c in output.recommendations if c.outcome.value in act_on}
        for (node, probe), cand in sorted(wanted.items()):
            new = self.store.upsert_recommendation(
                node=node, probe=probe, outcome=cand.outcome.value, reason_code=cand.reason_code.value,
                text=cand.text, evidence=dict(cand.evidence), at=now)
            if new:
                self._audit(actions, "recommend", node, "info", f"{cand.reason_code.value}: {cand.text}",
                            detail={"probe": probe, "outcome": cand.outcome.value})
        verdicts = {(v.node, v.probe): v for v in output.verdicts}
        for key in sorted(output.evaluated):
            if key in wanted or key not in active:
                continue
            node, probe = key
            verdict = verdicts.get(key)
            if verdict is not None and verdict.reason_code == ReasonCode.FLEET_EVENT.value:
                self.store.close_recommendations(node=node, probe=probe, state="withdrawn", reason=verdict.reason,
                                                 at=now)
                self._audit(actions, "withdraw", node, "info", f"{probe}: explained by a fleet event")
            elif verdict is None or verdict.outcome is not Outcome.ERROR:
                why = f"{probe}: no longer confirmed" + (f" ({verdict.outcome.value})" if verdict else "")
                self.store.close_recommendations(node=node, probe=probe, state="cleared", reason=why, at=now)
                self._audit(actions, "clear", node, "info", why)

    # -- enforcement ----------------------------------------------------------------------------
    def breaker(self) -> BreakerState:
        raw = self.store.remediation_state(BREAKER_KEY)
        if not isinstance(raw, dict):
            return BreakerState(False)
        return BreakerState(bool(raw.get("open")), raw.get("opened_at"), str(raw.get("reason", "")),
                            raw.get("closed_at"))

    def _set_breaker(self, state: BreakerState) -> None:
        self.store.set_remediation_state(BREAKER_KEY, {"open": state.open, "opened_at": state.opened_at,
                                                       "reason": state.reason, "closed_at": state.closed_at})

    def reset_breaker(self, *, actor: str) -> Action:
        actions: list[Action] = []
        state = self.breaker()
        if not state.open:
            return self._audit(actions, "breaker_close", None, "refused", "the breaker is not open", actor=actor)
        self._set_breaker(BreakerState(False, state.opened_at, state.reason, self.clock()))
        return self._audit(actions, "breaker_close", None, "done", "closed by hand", actor=actor)

    def enforce(self, now: float, actions: list[Action]) -> None:
        """Drain nodes with fresh active recommendations, undrain own drains that pass again."""
        fresh = [r for r in self.store.recommendations()
                 if r.updated_at >= now - self.settings.max_evidence_age_s and r.outcome in self.settings.act_on]
        own_open = [d for d in self.store.drains(open_only=True) if d.automatic]
        undrain_due = self.settings.undrain_after_passes > 0 and bool(own_open)
        if not fresh and not undrain_due:
            return
        try:
            nodes = self._cluster_nodes(now)
        except BackendError as exc:
            log.warning("remediation_cannot_list_nodes", error=str(exc))
            return
        breaker = self.breaker()
        if breaker.open and self.settings.breaker_cooldown_s > 0 and breaker.opened_at is not None \
                and now - breaker.opened_at >= self.settings.breaker_cooldown_s:
            breaker = BreakerState(False, breaker.opened_at, breaker.reason, now)
            self._set_breaker(breaker)
            self._audit(actions, "breaker_close", None, "done",
                        f"cool-down of {self.settings.breaker_cooldown_s:g} s over")
        per_node: dict[str, RecommendationRow] = {}
        probes: dict[str, set[str]] = {}
        drained_by_us = {d.node for d in self.store.drains(open_only=True)}
        for rec in sorted(fresh, key=lambda r: (r.since, r.id)):
            if rec.node in drained_by_us:
                continue
            probes.setdefault(rec.node, set()).add(rec.probe)
            best = per_node.get(rec.node)
            if best is None or (rec.outcome == Outcome.FAIL.value and best.outcome != Outcome.FAIL.value):
                per_node[rec.node] = rec
        for rec in per_node.values():
            self._drain_one(rec, sorted(probes[rec.node]), nodes, now, actions)
        if undrain_due:
            for drain in own_open:
                self._maybe_undrain(drain.node, drain.drained_at, drain.probes, nodes, now, actions)

    def _refuse(self, rec: RecommendationRow, why: str, actions: list[Action], *, escalated: bool = False) -> None:
        if rec.last_refusal == why and rec.escalated == escalated:
            return
        self.store.note_recommendation(rec.id, refusal=why, escalated=escalated)
        self._audit(actions, "drain", rec.node, "refused", why, detail={"probe": rec.probe,
                                                                        "reason_code": rec.reason_code})

    def _drain_one(self, rec: RecommendationRow, probes: Sequence[str], nodes: Mapping[str, Node], now: float,
                   actions: list[Action]) -> None:
        s = self.settings
        node = nodes.get(rec.node)
        if node is None:
            self._refuse(rec, "the cluster does not know this node", actions)
            return
        if node.drained or node.reason:
            if node.owned_by(s.reason_prefix):
                return
            self._refuse(rec, f"drained or marked by someone else (reason: {node.reason!r}); not touching it", actions)
            return
        history = self.store.drains(node=rec.node, since=now - s.repeat_window_s)
        if sum(1 for d in history if d.automatic) >= s.repeat_max_drains:
            self._refuse(rec, f"drained {s.repeat_max_drains} times within {s.repeat_window_s:g} s: left to humans",
                         actions, escalated=True)
            return
        if self.breaker().open:
            self._refuse(rec, "circuit breaker open: no automatic drains", actions)
            return
        recent = [d for d in self.store.drains(since=now - s.breaker_window_s) if d.automatic]
        if sum(1 for d in recent if d.drained_at >= now - 3600) >= s.max_actions_per_hour:
            self._refuse(rec, f"hourly cap of {s.max_actions_per_hour} automatic drains reached; waiting", actions)
            return
        cls = class_of(node)
        class_size = sum(1 for n in nodes.values() if class_of(n) == cls)
        allowance = max(s.breaker_class_min_nodes, math.floor(s.breaker_class_share * class_size))
        in_class = sum(1 for d in recent if d.node_class == cls)
        if in_class + 1 > allowance or len(recent) + 1 > s.breaker_max_nodes:
            why = (f"draining {rec.node} would make {in_class + 1} automatic drains in class {cls} "
                   f"(allowed {allowance} of {class_size}) or {len(recent) + 1} overall (allowed "
                   f"{s.breaker_max_nodes}) within {s.breaker_window_s:g} s")
            self._set_breaker(BreakerState(True, now, why))
            self._audit(actions, "breaker_open", rec.node, "done", why)
            self._refuse(rec, "circuit breaker open: no automatic drains", actions)
            return
        reason = drain_reason(s.reason_prefix, rec)
        try:
            self.cluster.drain(rec.node, reason)
        except PolicyRefused as exc:
            self._refuse(rec, f"backend refused: {exc}", actions)
            return
        except BackendError as exc:
            self._audit(actions, "drain", rec.node, "failed", str(exc), detail={"reason": reason})
            return
        self._nodes = None
        self.store.add_drain(node=rec.node, node_class=cls, reason=reason, actor=ACTOR, automatic=True, at=now,
                             probes=probes)
        self.store.note_recommendation(rec.id, refusal="", escalated=False)
        self._audit(actions, "drain", rec.node, "done", reason, detail={"probe": rec.probe, "since": rec.since,
                                                                        "evidence": rec.evidence})

    def _maybe_undrain(self, name: str, drained_at: float, probes: Sequence[str], nodes: Mapping[str, Node],
                       now: float, actions: list[Action]) -> None:
        """Undrain when every probe the node was drained for passed ``undrain_after_passes`` times in a row."""
        s = self.settings
        if not probes:
            return
        marks = sorted(self.store.marks_since(name, drained_at) + self.store.group_marks_since(name, drained_at))
        streak = min(pass_streak(marks, probe) for probe in probes)
        if streak < s.undrain_after_passes:
            return
        history = self.store.drains(node=name, since=now - s.repeat_window_s)
        if sum(1 for d in history if d.automatic) >= s.repeat_max_drains:
            self._note_once(actions, name, f"passes again, but drained {len(history)} times within "
                                           f"{s.repeat_window_s:g} s: left to humans")
            return
        node = nodes.get(name)
        if node is None or not node.drained or not node.owned_by(s.reason_prefix):
            self._note_once(actions, name, "passes again, but is no longer drained by healthd; not touching it")
            return
        try:
            self.cluster.undrain(name)
        except (PolicyRefused, BackendError) as exc:
            self._audit(actions, "undrain", name, "failed", str(exc))
            return
        self._nodes = None
        self.store.close_drain(name, at=now, by=ACTOR)
        self.store.close_recommendations(node=name, probe=None, state="cleared",
                                         reason=f"{streak} consecutive passes", at=now)
        self._audit(actions, "undrain", name, "done", f"{streak} consecutive passes since the drain")

    def _note_once(self, actions: list[Action], node: str, why: str) -> None:
        last = self.store.audit(limit=1, node=node)
        if last and last[0].action == "undrain" and last[0].reason == why:
            return
        self._audit(actions, "undrain", node, "refused", why)

    # -- rechecks of own drains ------------------------------------------------------------------
    def recheck_nodes(self) -> dict[str, tuple[str, ...]]:
        """healthd's own automatic drains (node → the probes it was drained for), to re-probe when
        ``recheck_drained`` is set (``Judge.recheck_requests`` turns them into planner requests)."""
        if not self.settings.recheck_drained or self.settings.mode != "enforce":
            return {}
        return {d.node: d.probes for d in self.store.drains(open_only=True) if d.automatic and d.probes}

    # -- operators ------------------------------------------------------------------------------
    def drain(self, node: str, text: str, *, actor: str) -> Action:
        """``healthd drain NODE``: same ownership rules, no breaker or cap (a human decided)."""
        actions: list[Action] = []
        try:
            validate_node_name(node)
        except InvalidNodeName as exc:
            return self._audit(actions, "drain", None, "refused", str(exc), actor=actor)
        known = {n.name: n for n in self.cluster.list_nodes()}
        current = known.get(node)
        if current is None:
            return self._audit(actions, "drain", node, "refused", "the cluster does not know this node", actor=actor)
        if current.drained or current.reason:
            why = ("already drained by healthd" if current.owned_by(self.settings.reason_prefix)
                   else f"drained or marked by someone else (reason: {current.reason!r}); not touching it")
            return self._audit(actions, "drain", node, "refused", why, actor=actor)
        reason = f"{self.settings.reason_prefix} {ReasonCode.MANUAL.value} {text}".strip()[:MAX_REASON]
        try:
            self.cluster.drain(node, reason)
        except PolicyRefused as exc:
            return self._audit(actions, "drain", node, "refused", str(exc), actor=actor)
        except BackendError as exc:
            return self._audit(actions, "drain", node, "failed", str(exc), actor=actor)
        self.store.add_drain(node=node, node_class=class_of(current), reason=reason, actor=actor,
                             automatic=False, at=self.clock())
        return self._audit(actions, "drain", node, "done", reason, actor=actor)

    def undrain(self, node: str, *, actor: str) -> Action:
        """``healthd undrain NODE``: only a node healthd drained (its reason starts with the prefix)."""
        actions: list[Action] = []
        try:
            validate_node_name(node)
        except InvalidNodeName as exc:
            return self._audit(actions, "undrain", None, "refused", str(exc), actor=actor)
        current = {n.name: n for n in self.cluster.list_nodes()}.get(node)
        if current is None:
            return self._audit(actions, "undrain", node, "refused", "the cluster does not know this node",
                               actor=actor)
        if not current.drained:
            return self._audit(actions, "undrain", node, "refused", "the node is not drained", actor=actor)
        if not current.owned_by(self.settings.reason_prefix):
            return self._audit(actions, "undrain", node, "refused",
                               f"drained by someone else (reason: {current.reason!r}); not undraining", actor=actor)
        try:
            self.cluster.undrain(node)
        except PolicyRefused as exc:
            return self._audit(actions, "undrain", node, "refused", str(exc), actor=actor)
        except BackendError as exc:
            return self._audit(actions, "undrain", node, "failed", str(exc), actor=actor)
        now = self.clock()
        if not self.store.close_drain(node, at=now, by=actor):
            self.store.add_drain(node=node, node_class=class_of(current), reason=current.reason or "",
                                 actor="unknown", automatic=False, at=now)
            self.store.close_drain(node, at=now, by=actor)
        self.store.close_recommendations(node=node, probe=None, state="dismissed", reason=f"undrained by {actor}",
                                         at=now)
        return self._audit(actions, "undrain", node, "done", f"was: {current.reason}", actor=actor)


# -- read side: API, CLI, metrics ------------------------------------------------------------------
def recommendations_document(store: Store, settings: RemediationSettings) -> dict[str, Any]:
    """The ``/api/v1/recommendations`` document: active recommendations, fleet events, breaker."""
    raw = store.remediation_state(BREAKER_KEY)
    breaker = raw if isinstance(raw, dict) else {"open": False}
    return {
        "mode": settings.mode,
        "recommendations": [
            {"node": r.node, "probe": r.probe, "outcome": r.outcome, "reason_code": r.reason_code, "text": r.text,
             "evidence": r.evidence, "since": r.since, "updated_at": r.updated_at, "escalated": r.escalated,
             "refused": r.last_refusal or None}
            for r in store.recommendations()
        ],
        "fleet_events": [
            {"node_class": e["node_class"], "probe": e["probe"], "started_at": e["started_at"], "text": e["text"]}
            for e in store.fleet_events(active_only=True)
        ],
        "breaker": breaker,
        "drained_by_healthd": [
            {"node": d.node, "reason": d.reason, "since": d.drained_at, "automatic": d.automatic}
            for d in store.drains(open_only=True)
        ],
    }


def pass_streak(marks: Sequence[tuple[float, str, int, str]], probe: str) -> int:
    """Consecutive passing results of ``probe`` at the end of ``marks`` ((at, probe, severity, code))."""
    streak = 0
    for _, mark_probe, severity, code in reversed(marks):
        if mark_probe != probe:
            continue
        if severity != 0 or code == ReasonCode.FLEET_EVENT.value:
            break
        streak += 1
    return streak


def action_counts(actions: Sequence[Action]) -> Counter[tuple[str, str]]:
    return Counter((a.action, a.result) for a in actions)
