"""Remediation's decisions: pure functions from what is known (a ``RemediationSnapshot``, the judge's
output, the cluster's nodes, the settings, ``now``) to a ``Plan``: the backend calls to make and the
store writes (recommendations, refusal notes, drains, breaker state, audit entries with their reasons).

A backend call may fail or be refused; the decisions after it depend on that (a drain that did not
happen counts towards neither the hourly cap nor the breaker). So a decision takes the results of the
calls made so far: a call without a result is assumed done, and ``apply.carry_out`` decides again
whenever a call did not succeed.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

from healthd.config import RemediationSettings
from healthd.judge.hardfault import HARD_FAULTS
from healthd.judge.model import JudgeOutput, ReasonCode
from healthd.judge.sources.passive import PROBE as PASSIVE
from healthd.model import Node, Outcome
from healthd.node_class import class_of
from healthd.remediation import repair as rp
from healthd.store.rows import (
    AuditAction,
    AuditEntry,
    AuditResult,
    BreakerState,
    CloseDrain,
    CloseRecommendations,
    DrainRow,
    JudgedMark,
    NoteRecommendation,
    OpenDrain,
    OpenRepair,
    RecommendationRow,
    RemediationSnapshot,
    RemediationWrite,
    RepairRow,
    ReviseDrain,
    SetBreaker,
    SetRepair,
    UpsertRecommendation,
)
from healthd.units import human

ACTOR = "healthd"
MAX_REASON = 160
HOUR_S = 3600.0

RecKey = tuple[str, str]


@dataclass(frozen=True)
class Action:
    action: AuditAction
    node: str | None
    result: AuditResult
    reason: str


@dataclass(frozen=True)
class BackendCall:
    """``drain``/``undrain``; a repair's ``reboot`` (``reason``), ``repair_command`` (``argv``), ``back`` (resume
    a node back from its repair and drain it with ``reason``) and ``release`` (out of healthd's reservation)."""

    verb: Literal["drain", "undrain", "reboot", "repair_command", "back", "release"]
    node: str
    reason: str = ""
    argv: tuple[str, ...] = ()


@dataclass(frozen=True)
class CallResult:
    result: Literal["done", "refused", "failed"]
    message: str = ""


DONE = CallResult("done")
CallResults = Mapping[BackendCall, CallResult]


@dataclass(frozen=True)
class Plan:
    """Backend calls in order, then the store's writes in order (applied in one transaction)."""

    calls: tuple[BackendCall, ...] = ()
    writes: tuple[RemediationWrite, ...] = ()

    @property
    def actions(self) -> list[Action]:
        """The audited actions and refusals, in order."""
        return [Action(w.action, w.node, w.result, w.reason) for w in self.writes if isinstance(w, AuditEntry)]


class _Builder:
    def __init__(self, results: CallResults) -> None:
        self.results = results
        self.calls: list[BackendCall] = []
        self.writes: list[RemediationWrite] = []

    def write(self, w: RemediationWrite) -> None:
        self.writes.append(w)

    def audit(self, action: AuditAction, node: str | None, result: AuditResult, reason: str, *, actor: str = ACTOR,
              detail: dict[str, Any] | None = None) -> None:
        self.writes.append(AuditEntry(action, node, result, reason, actor, detail or {}))

    def call(self, call: BackendCall) -> CallResult:
        self.calls.append(call)
        return self.results.get(call, DONE)

    def last_audit(self, node: str) -> AuditEntry | None:
        return next((w for w in reversed(self.writes) if isinstance(w, AuditEntry) and w.node == node), None)

    def plan(self) -> Plan:
        return Plan(tuple(self.calls), tuple(self.writes))


HARD_FAULT_CODES = frozenset(c.value for c in HARD_FAULTS)


def drain_reason(prefix: str, rec: RecommendationRow) -> str:
    """``healthd: below_floor gemm gpu 3 flop_per_second{dtype=bf16} 343.8 TFLOP/s<525 TFLOP/s run 0042..``; a
    passive finding: ``healthd: xid 79 gpu 3 (GPU-…) (passive: xid)``."""
    summary = rec.evidence.get("summary")
    if rec.probe == PASSIVE and isinstance(summary, str) and summary:
        return one_line_reason(f"{prefix} {summary} (passive: {rec.evidence.get('signal', rec.reason_code)})")
    parts = [prefix, rec.reason_code, rec.probe]
    findings = rec.evidence.get("findings")
    top = findings[0] if isinstance(findings, list) and findings and isinstance(findings[0], dict) else None
    if top is not None and rec.reason_code not in HARD_FAULT_CODES:
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
    return one_line_reason(" ".join(parts))


def one_line_reason(text: str) -> str:
    """What may reach ``scontrol update Reason=``: printable characters only (a newline, tab or other
    control character becomes a space), at most ``MAX_REASON`` of them."""
    return "".join(c if c.isprintable() else " " for c in text).strip()[:MAX_REASON]


def pass_streak(marks: Sequence[JudgedMark], probe: str) -> int:
    """Consecutive passing results of ``probe`` at the end of ``marks`` ((at, probe, severity, code))."""
    streak = 0
    for _, mark_probe, severity, code in reversed(marks):
        if mark_probe != probe:
            continue
        if severity != 0 or code == ReasonCode.FLEET_EVENT.value:
            break
        streak += 1
    return streak


def drains_since(settings: RemediationSettings, now: float) -> float:
    """How far back a tick's snapshot reads healthd's drains (the breaker's and the repeat window)."""
    return now - max(settings.breaker_window_s, settings.repeat_window_s)


# -- the daemon's tick ---------------------------------------------------------------------------------
def decide(snap: RemediationSnapshot, output: JudgeOutput, settings: RemediationSettings, *, now: float,
           nodes: Mapping[str, Node] | None, results: CallResults | None = None,
           full_check: Sequence[str] = ()) -> Plan:
    """Keep recommendations in step with ``output`` and, in ``enforce`` mode, drain and undrain.
    ``nodes``: the cluster's nodes (``None``: not known, so no drain or undrain is decided)."""
    b = _Builder(results or {})
    if settings.mode == "observe":
        for rec in snap.recommendations:
            b.write(CloseRecommendations(rec.node, rec.probe, "withdrawn", "remediation mode is observe"))
        return b.plan()
    active = _sync(b, snap, output, settings, now)
    if settings.mode == "enforce" and nodes is not None and _enforcing(snap, active, settings, now):
        _Enforcement(b, snap, settings, nodes, now, full_check).run(_fresh(active, settings, now), active)
    return b.plan()


def needs_nodes(snap: RemediationSnapshot, output: JudgeOutput, settings: RemediationSettings, now: float) -> bool:
    """Whether ``decide`` would look at the cluster's nodes (there is something to drain or undrain)."""
    if settings.mode != "enforce":
        return False
    return _enforcing(snap, _sync(_Builder({}), snap, output, settings, now), settings, now)


def _sync(b: _Builder, snap: RemediationSnapshot, output: JudgeOutput, settings: RemediationSettings,
          now: float) -> dict[RecKey, RecommendationRow]:
    """Recommend the candidates of ``output``, clear or withdraw what it no longer confirms; the active
    recommendations as they are afterwards."""
    active = {(r.node, r.probe): r for r in snap.recommendations}
    next_id = max((r.id for r in snap.recommendations), default=0) + 1
    act_on = set(settings.act_on)
    wanted = {(c.node, c.probe): c for c in output.recommendations if c.outcome.value in act_on}
    for (node, probe), cand in sorted(wanted.items()):
        b.write(UpsertRecommendation(node, probe, cand.outcome.value, str(cand.reason_code), cand.text,
                                     dict(cand.evidence)))
        old = active.get((node, probe))
        base = old or RecommendationRow(next_id, node, probe, "", "", "", {}, since=now, updated_at=now,
                                        state="active", closed_at=None, close_reason="", escalated=False,
                                        last_refusal="")
        active[(node, probe)] = replace(base, outcome=cand.outcome.value, reason_code=str(cand.reason_code),
                                        text=cand.text, evidence=dict(cand.evidence), updated_at=now)
        if old is not None:
            continue
        next_id += 1
        b.audit("recommend", node, "info", f"{cand.reason_code!s}: {cand.text}",
                detail={"probe": probe, "outcome": cand.outcome.value})
    verdicts = {(v.node, v.probe): v for v in output.verdicts}
    for key in sorted(output.evaluated):
        if key in wanted or key not in active:
            continue
        node, probe = key
        verdict = verdicts.get(key)
        if verdict is not None and verdict.reason_code == ReasonCode.FLEET_EVENT.value:
            b.write(CloseRecommendations(node, probe, "withdrawn", verdict.reason))
            b.audit("withdraw", node, "info", f"{probe}: explained by a fleet event")
        elif verdict is None or verdict.outcome is not Outcome.ERROR:
            why = f"{probe}: no longer confirmed" + (f" ({verdict.outcome.value})" if verdict else "")
            b.write(CloseRecommendations(node, probe, "cleared", why))
            b.audit("clear", node, "info", why)
        else:
            continue
        del active[key]
    return active


def _fresh(active: Mapping[RecKey, RecommendationRow], settings: RemediationSettings,
           now: float) -> list[RecommendationRow]:
    """Active recommendations with evidence fresh enough to act on."""
    return [r for r in active.values()
            if r.updated_at >= now - settings.max_evidence_age_s and r.outcome in settings.act_on]


def _own_open(snap: RemediationSnapshot) -> list[DrainRow]:
    return [d for d in snap.open_drains if d.automatic]


def _enforcing(snap: RemediationSnapshot, active: Mapping[RecKey, RecommendationRow],
               settings: RemediationSettings, now: float) -> bool:
    undrain_due = settings.undrain_after_passes > 0 and bool(_own_open(snap))
    repairing = settings.repair != "none" and (bool(_own_open(snap)) or any(r.ended_at is None for r in snap.repairs))
    return undrain_due or repairing or bool(_fresh(active, settings, now))


class _Enforcement:
    """One tick's drains and undrains; tracks what this tick changed (breaker, drains, notes)."""

    def __init__(self, b: _Builder, snap: RemediationSnapshot, settings: RemediationSettings,
                 nodes: Mapping[str, Node], now: float, full_check: Sequence[str] = ()) -> None:
        self.b, self.snap, self.s, self.nodes, self.now = b, snap, settings, nodes, now
        self.breaker = snap.breaker
        self.drains = list(snap.recent_drains)
        self.full_check = tuple(full_check)
        self.open_repairs = {r.node: r for r in snap.repairs if r.ended_at is None}
        self.started_repairs: list[float] = [r.started_at for r in snap.repairs]

    def run(self, fresh: Sequence[RecommendationRow], active: Mapping[RecKey, RecommendationRow]) -> None:
        s, now = self.s, self.now
        breaker = self.breaker
        if breaker.open and s.breaker_cooldown_s > 0 and breaker.opened_at is not None \
                and now - breaker.opened_at >= s.breaker_cooldown_s:
            self._set_breaker(BreakerState(False, breaker.opened_at, breaker.reason, now))
            self.b.audit("breaker_close", None, "done", f"cool-down of {s.breaker_cooldown_s:g} s over")
        drained_by_us = {d.node for d in self.snap.open_drains}
        per_node: dict[str, RecommendationRow] = {}
        probes: dict[str, set[str]] = {}
        for rec in sorted(fresh, key=lambda r: (r.since, r.id)):
            if rec.node in drained_by_us:
                continue
            probes.setdefault(rec.node, set()).add(rec.probe)
            best = per_node.get(rec.node)
            if best is None or (rec.outcome == Outcome.FAIL.value and best.outcome != Outcome.FAIL.value):
                per_node[rec.node] = rec
        for rec in per_node.values():
            self._drain(rec, sorted(probes[rec.node]))
        if s.undrain_after_passes > 0:
            for drain in _own_open(self.snap):
                self._undrain(drain)
        if s.repair != "none":
            self._repairs(active)

    def _set_breaker(self, state: BreakerState) -> None:
        self.breaker = state
        self.b.write(SetBreaker(state))

    def _automatic_since(self, since: float, node: str | None = None) -> list[DrainRow]:
        return [d for d in self.drains if d.automatic and d.drained_at >= since and node in (None, d.node)]

    def _refuse(self, rec: RecommendationRow, why: str, *, escalated: bool = False) -> None:
        """A refused drain, noted on its recommendation; said once, not at every tick."""
        if rec.last_refusal == why and rec.escalated == escalated:
            return
        self.b.write(NoteRecommendation(rec.node, rec.probe, why, escalated))
        self.b.audit("drain", rec.node, "refused", why, detail={"probe": rec.probe, "reason_code": rec.reason_code})

    def _drain(self, rec: RecommendationRow, probes: Sequence[str]) -> None:
        s, now = self.s, self.now
        node = self.nodes.get(rec.node)
        if node is None:
            self._refuse(rec, "the cluster does not know this node")
            return
        if node.drained or node.reason:
            if not node.owned_by(s.reason_prefix):
                self._refuse(rec, f"drained or marked by someone else (reason: {node.reason!r}); not touching it")
            return
        if len(self._automatic_since(now - s.repeat_window_s, rec.node)) >= s.repeat_max_drains:
            self._refuse(rec, f"drained {s.repeat_max_drains} times within {s.repeat_window_s:g} s: left to humans",
                         escalated=True)
            return
        if self.breaker.open:
            self._refuse(rec, "circuit breaker open: no automatic drains")
            return
        recent = self._automatic_since(now - s.breaker_window_s)
        if self._actions_last_hour() >= s.max_actions_per_hour:
            self._refuse(rec, f"hourly cap of {s.max_actions_per_hour} automatic drains reached; waiting")
            return
        cls = class_of(node)
        class_size = sum(1 for n in self.nodes.values() if class_of(n) == cls)
        allowance = max(s.breaker_class_min_nodes, math.floor(s.breaker_class_share * class_size))
        in_class = sum(1 for d in recent if d.node_class == cls)
        if in_class + 1 > allowance or len(recent) + 1 > s.breaker_max_nodes:
            why = (f"draining {rec.node} would make {in_class + 1} automatic drains in class {cls} "
                   f"(allowed {allowance} of {class_size}) or {len(recent) + 1} overall (allowed "
                   f"{s.breaker_max_nodes}) within {s.breaker_window_s:g} s")
            self._set_breaker(BreakerState(True, now, why))
            self.b.audit("breaker_open", rec.node, "done", why)
            self._refuse(rec, "circuit breaker open: no automatic drains")
            return
        reason = drain_reason(s.reason_prefix, rec)
        result = self.b.call(BackendCall("drain", rec.node, reason))
        if result.result == "refused":
            self._refuse(rec, f"backend refused: {result.message}")
            return
        if result.result == "failed":
            self.b.audit("drain", rec.node, "failed", result.message, detail={"reason": reason})
            return
        drain = OpenDrain(rec.node, cls, reason, ACTOR, automatic=True, probes=tuple(probes))
        self.b.write(drain)
        self.drains.append(DrainRow(drain.node, cls, reason, ACTOR, True, now, None, None, drain.probes))
        self.b.write(NoteRecommendation(rec.node, rec.probe, "", escalated=False))
        self.b.audit("drain", rec.node, "done", reason,
                     detail={"probe": rec.probe, "since": rec.since, "evidence": rec.evidence})

    def _actions_last_hour(self) -> int:
        """healthd's automatic drains and repairs started within the last hour (the hourly cap)."""
        since = self.now - HOUR_S
        return (sum(1 for d in self._automatic_since(since))
                + sum(1 for at in self.started_repairs if at >= since))

    def _undrain(self, drain: DrainRow) -> None:
        """Undrain when every probe the node was drained for passed ``undrain_after_passes`` times in a row
        (once, for the full check of a repair)."""
        s, now, name = self.s, self.now, drain.node
        if not drain.probes:
            return
        repair = self.open_repairs.get(name)
        if repair is not None and repair.state != "validating":
            return
        marks = self.snap.marks.get((name, drain.drained_at), ())
        streak = min(pass_streak(marks, probe) for probe in drain.probes)
        if streak < (1 if repair is not None else s.undrain_after_passes):
            return
        history = [d for d in self.drains if d.node == name and d.drained_at >= now - s.repeat_window_s]
        if sum(1 for d in history if d.automatic) >= s.repeat_max_drains:
            self._note_once(name, f"passes again, but drained {len(history)} times within "
                                  f"{s.repeat_window_s:g} s: left to humans")
            return
        node = self.nodes.get(name)
        if node is None or not node.drained or not node.owned_by(s.reason_prefix):
            self._note_once(name, "passes again, but is no longer drained by healthd; not touching it")
            return
        result = self.b.call(BackendCall("undrain", name))
        if result.result != "done":
            self.b.audit("undrain", name, "failed", result.message)
            return
        self.b.write(CloseDrain(name, by=ACTOR))
        self.b.write(CloseRecommendations(name, None, "cleared", f"{streak} consecutive passes"))
        self.b.audit("undrain", name, "done", f"{streak} consecutive passes since the drain")
        if repair is not None:
            why = f"passed the full check ({', '.join(drain.probes)}) after the {repair.kind}: back in service"
            self.b.write(SetRepair(name, "passed", why))
            self.b.audit("repair", name, "done", why, detail={"kind": repair.kind, "started_at": repair.started_at,
                                                               "in_service_after_s": round(now - repair.started_at, 1)})
            del self.open_repairs[name]

    # -- repairs (healthd.remediation.repair) -----------------------------------------------------------
    def _repairs(self, active: Mapping[RecKey, RecommendationRow]) -> None:
        for repair in list(self.open_repairs.values()):
            self._repair_step(repair)
        codes: dict[str, RecommendationRow] = {}
        for rec in sorted(active.values(), key=lambda r: (r.since, r.id)):
            if rec.reason_code in self.s.repair_on:
                codes.setdefault(rec.node, rec)
        for drain in _own_open(self.snap):
            qualifying = codes.get(drain.node)
            if qualifying is not None and drain.node not in self.open_repairs and drain.probes:
                self._start_repair(drain, qualifying)

    def _repair_note(self, node: str, result: AuditResult, why: str, **detail: Any) -> None:
        """A repair's refusal or wait, unless it is the node's newest audit entry already."""
        last = self.b.last_audit(node) or self.snap.last_audit.get(node)
        if last is not None and last.action == "repair" and last.reason == why:
            return
        self.b.audit("repair", node, result, why, detail=detail)

    def _start_repair(self, drain: DrainRow, rec: RecommendationRow) -> None:
        s, now, name = self.s, self.now, drain.node
        kind: Literal["reboot", "command"] = "reboot" if s.repair == "reboot" else "command"
        earlier = [r for r in self.snap.repairs if r.node == name and r.started_at >= now - s.repeat_window_s]
        if earlier:
            return  # one repair per node and repeat window: a failed one is left to humans
        node = self.nodes.get(name)
        if node is None or not node.drained or not node.owned_by(s.reason_prefix):
            return  # healthd's drain is not (or not yet, after a recheck) on the node: nothing of healthd's to repair
        if self.breaker.open:
            self._repair_note(name, "refused", "circuit breaker open: no automatic repairs")
            return
        if self._actions_last_hour() >= s.max_actions_per_hour:
            self._repair_note(name, "refused", f"hourly cap of {s.max_actions_per_hour} automatic actions reached;"
                                               " waiting")
            return
        probes = tuple(sorted({*(p for p in drain.probes if p != PASSIVE), *self.full_check}))
        if not probes:
            self._repair_note(name, "refused", "no probe to validate the node with after a repair")
            return
        reason = rp.start_reason(s.reason_prefix, kind, rec.reason_code)
        if kind == "reboot":
            call = BackendCall("reboot", name, reason)
        else:
            call = BackendCall("repair_command", name, reason, rp.repair_argv(s.repair_command, name))
        result = self.b.call(call)
        if result.result != "done":
            self._repair_note(name, result.result, f"{kind} not started: {result.message}")
            return
        self.b.write(OpenRepair(name, kind, rec.reason_code, probes, reason))
        self.b.audit("repair", name, "done", reason, detail={"kind": kind, "probe": rec.probe,
                                                             "reason_code": rec.reason_code, "full_check": probes,
                                                             "argv": list(call.argv)})
        self.open_repairs[name] = RepairRow(0, name, kind, rec.reason_code, probes, "rebooting", now, None, None,
                                            reason)
        self.started_repairs.append(now)

    def _repair_step(self, repair: RepairRow) -> None:
        s, now, name = self.s, self.now, repair.node
        node = self.nodes.get(name)
        where = rp.phase(node, repair.kind, s.reason_prefix)
        if where == "taken":
            assert node is not None
            self._end_repair(repair, f"someone else's reason is on the node now ({node.reason!r}); not touching it",
                             drain=False)
            return
        if now - repair.started_at > s.repair_timeout_s:
            step = "its reboot" if repair.state == "rebooting" else "its full check"
            self._end_repair(repair, f"{step} not over within {s.repair_timeout_s:g} s")
            return
        if repair.state == "rebooting":
            if where != "back":
                return
            reason = rp.validating_reason(s.reason_prefix, repair.kind, repair.reason_code)
            result = self.b.call(BackendCall("back", name, reason))
            if result.result != "done":
                self._repair_note(name, "failed", f"back from the {repair.kind}, not resumed: {result.message}")
                return
            self.b.write(ReviseDrain(name, reason, repair.probes))
            why = f"back from the {repair.kind}; full check: {', '.join(repair.probes)}"
            self.b.write(SetRepair(name, "validating", reason))
            self.b.audit("repair", name, "info", why, detail={"kind": repair.kind,
                                                              "back_after_s": round(now - repair.started_at, 1)})
            return
        drain = next((d for d in _own_open(self.snap) if d.node == name), None)
        marks = self.snap.marks.get((name, drain.drained_at), ()) if drain is not None else ()
        bad = rp.failed_check(marks, repair.probes)
        if bad is not None:
            self._end_repair(repair, f"{bad[1]} {bad[3]} in the full check")

    def _end_repair(self, repair: RepairRow, why: str, *, drain: bool = True) -> None:
        """The repair failed: drained with ``repair failed`` and no checks (left to humans), out of the
        reservation; ``drain=False``: the node is someone else's now, only the reservation is left."""
        s, name = self.s, repair.node
        reason = one_line_reason(rp.failed_reason(s.reason_prefix, repair.kind, repair.reason_code, why))[:MAX_REASON]
        if drain:
            result = self.b.call(BackendCall("drain", name, reason))
            if result.result != "done":
                self._repair_note(name, "failed", f"repair failed ({why}), but not drained: {result.message}")
                return
            self.b.write(ReviseDrain(name, reason, ()))
        self.b.call(BackendCall("release", name))
        self.b.write(SetRepair(name, "failed", reason if drain else why))
        self.b.audit("repair", name, "failed", reason if drain else why, detail={"kind": repair.kind})
        del self.open_repairs[name]

    def _note_once(self, node: str, why: str) -> None:
        """A refused undrain, unless it is the node's newest audit entry already."""
        last = self.b.last_audit(node) or self.snap.last_audit.get(node)
        if last is not None and last.action == "undrain" and last.reason == why:
            return
        self.b.audit("undrain", node, "refused", why)


# -- operators -----------------------------------------------------------------------------------------
def refuse_by_hand(action: Literal["drain", "undrain"], node: str | None, why: str, *, actor: str) -> Plan:
    b = _Builder({})
    b.audit(action, node, "refused", why, actor=actor)
    return b.plan()


def drain_by_hand(name: str, text: str, *, actor: str, nodes: Mapping[str, Node], settings: RemediationSettings,
                  results: CallResults | None = None) -> Plan:
    """``healthd drain NODE``: the ownership rules, no breaker or cap (a human decided)."""
    current = nodes.get(name)
    if current is None:
        return refuse_by_hand("drain", name, "the cluster does not know this node", actor=actor)
    if current.drained or current.reason:
        why = ("already drained by healthd" if current.owned_by(settings.reason_prefix)
               else f"drained or marked by someone else (reason: {current.reason!r}); not touching it")
        return refuse_by_hand("drain", name, why, actor=actor)
    reason = one_line_reason(f"{settings.reason_prefix} {ReasonCode.MANUAL.value} {text}")
    b = _Builder(results or {})
    result = b.call(BackendCall("drain", name, reason))
    if result.result != "done":
        b.audit("drain", name, result.result, result.message, actor=actor)
        return b.plan()
    b.write(OpenDrain(name, class_of(current), reason, actor, automatic=False))
    b.audit("drain", name, "done", reason, actor=actor)
    return b.plan()


def undrain_by_hand(name: str, *, actor: str, nodes: Mapping[str, Node], settings: RemediationSettings,
                    results: CallResults | None = None) -> Plan:
    """``healthd undrain NODE``: only a node healthd drained (its reason starts with the prefix)."""
    current = nodes.get(name)
    if current is None:
        return refuse_by_hand("undrain", name, "the cluster does not know this node", actor=actor)
    if not current.drained:
        return refuse_by_hand("undrain", name, "the node is not drained", actor=actor)
    if not current.owned_by(settings.reason_prefix):
        return refuse_by_hand("undrain", name, f"drained by someone else (reason: {current.reason!r}); not undraining",
                              actor=actor)
    b = _Builder(results or {})
    result = b.call(BackendCall("undrain", name))
    if result.result != "done":
        b.audit("undrain", name, result.result, result.message, actor=actor)
        return b.plan()
    unrecorded = OpenDrain(name, class_of(current), current.reason or "", "unknown", automatic=False)
    b.write(CloseDrain(name, by=actor, unrecorded=unrecorded))
    b.write(CloseRecommendations(name, None, "dismissed", f"undrained by {actor}"))
    b.audit("undrain", name, "done", f"was: {current.reason}", actor=actor)
    return b.plan()


def reset_breaker(state: BreakerState, *, actor: str, now: float) -> Plan:
    b = _Builder({})
    if not state.open:
        b.audit("breaker_close", None, "refused", "the breaker is not open", actor=actor)
    else:
        b.write(SetBreaker(BreakerState(False, state.opened_at, state.reason, now)))
        b.audit("breaker_close", None, "done", "closed by hand", actor=actor)
    return b.plan()
