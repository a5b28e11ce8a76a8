"""Remediation's one I/O step: the backend calls a plan asks for, then its writes in one store transaction."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from healthd.errors import BackendError, PolicyRefused
from healthd.logging import get_logger
from healthd.model import Node
from healthd.remediation.decide import DONE, BackendCall, CallResult, CallResults, Plan
from healthd.store.rows import AuditEntry, BreakerState, DrainRow, RemediationChanges, RemediationSnapshot

log = get_logger("healthd.remediation")


class DrainCapability(Protocol):
    """The part of ``ClusterBackend`` remediation uses."""

    name: str

    def list_nodes(self) -> list[Node]: ...

    def drain(self, node: str, reason: str) -> None: ...

    def undrain(self, node: str) -> None: ...


class RemediationRecords(Protocol):
    """The part of the store remediation uses."""

    def remediation_snapshot(self, *, drains_since: float, marks: bool) -> RemediationSnapshot: ...

    def apply_remediation(self, changes: RemediationChanges) -> None: ...

    def breaker_state(self) -> BreakerState: ...

    def drains(self, *, node: str | None = None, since: float = 0.0, open_only: bool = False) -> list[DrainRow]: ...


def call_backend(cluster: DrainCapability, call: BackendCall) -> CallResult:
    try:
        if call.verb == "drain":
            cluster.drain(call.node, call.reason)
        else:
            cluster.undrain(call.node)
    except PolicyRefused as exc:
        return CallResult("refused", str(exc))
    except BackendError as exc:
        return CallResult("failed", str(exc))
    except ValueError as exc:  # an argument the Slurm argv builders refuse: never a crashed tick
        return CallResult("refused", str(exc))
    return DONE


def carry_out(store: RemediationRecords, cluster: DrainCapability, decide: Callable[[CallResults], Plan], *,
              at: float) -> tuple[Plan, dict[BackendCall, CallResult]]:
    """Make the backend calls of ``decide``'s plan in order, deciding again after one that did not succeed,
    then write the final plan in one transaction; the plan and the calls' results."""
    results: dict[BackendCall, CallResult] = {}
    plan = decide(results)
    while (call := next((c for c in plan.calls if c not in results), None)) is not None:
        results[call] = call_backend(cluster, call)
        if results[call] != DONE:
            plan = decide(results)
    if plan.writes:
        store.apply_remediation(RemediationChanges(at, plan.writes))
    for w in plan.writes:
        if isinstance(w, AuditEntry):
            logger = log.warning if w.result in ("refused", "failed") else log.info
            if w.action == "breaker_open":
                logger = log.error
            logger("remediation_" + w.action, node=w.node, result=w.result, reason=w.reason, actor=w.actor)
    return plan, results
