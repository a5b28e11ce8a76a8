"""Remediation's one I/O step: the backend calls a plan asks for, then its writes in one store transaction."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, runtime_checkable

from healthd.errors import BackendError, PolicyRefused
from healthd.logging import get_logger
from healthd.model import Node
from healthd.remediation.decide import DONE, BackendCall, CallResult, CallResults, Plan
from healthd.store.rows import AuditEntry, BreakerState, DrainRow, RemediationChanges, RemediationSnapshot, RepairRow

log = get_logger("healthd.remediation")


class DrainCapability(Protocol):
    """The part of ``ClusterBackend`` remediation uses."""

    name: str

    def list_nodes(self) -> list[Node]: ...

    def drain(self, node: str, reason: str) -> None: ...

    def undrain(self, node: str) -> None: ...


@runtime_checkable
class RepairCapability(Protocol):
    """A backend that can repair a node it drained (the Slurm backend): ``healthd.remediation.repair``."""

    def start_reboot(self, node: str, reason: str) -> None:
        """Hold ``node`` in healthd's recheck reservation, then reboot it through Slurm with ``reason``."""
        ...

    def run_repair_command(self, node: str, argv: tuple[str, ...], timeout_s: float) -> None:
        """Hold ``node`` in the reservation, then run the site's repair command (exit 0: the node is back)."""
        ...

    def back_from_repair(self, node: str, reason: str) -> None:
        """Resume ``node`` if DOWN, drain it with ``reason`` and take it out of the reservation."""
        ...

    def release_repair(self, node: str) -> None:
        """Take ``node`` out of healthd's reservation."""
        ...


class RemediationRecords(Protocol):
    """The part of the store remediation uses."""

    def remediation_snapshot(self, *, drains_since: float, marks: bool) -> RemediationSnapshot: ...

    def apply_remediation(self, changes: RemediationChanges) -> None: ...

    def breaker_state(self) -> BreakerState: ...

    def drains(self, *, node: str | None = None, since: float = 0.0, open_only: bool = False) -> list[DrainRow]: ...

    def repairs(self, *, node: str | None = None, since: float = 0.0, open_too: bool = False) -> list[RepairRow]: ...


def call_backend(cluster: DrainCapability, call: BackendCall, repair_timeout_s: float = 1800.0) -> CallResult:
    try:
        if call.verb == "drain":
            cluster.drain(call.node, call.reason)
        elif call.verb == "undrain":
            cluster.undrain(call.node)
        elif not isinstance(cluster, RepairCapability):
            return CallResult("refused", f"the {cluster.name} backend cannot repair nodes")
        elif call.verb == "reboot":
            cluster.start_reboot(call.node, call.reason)
        elif call.verb == "repair_command":
            cluster.run_repair_command(call.node, call.argv, repair_timeout_s)
        elif call.verb == "back":
            cluster.back_from_repair(call.node, call.reason)
        else:
            cluster.release_repair(call.node)
    except PolicyRefused as exc:
        return CallResult("refused", str(exc))
    except BackendError as exc:
        return CallResult("failed", str(exc))
    except ValueError as exc:  # an argument the Slurm argv builders refuse: never a crashed tick
        return CallResult("refused", str(exc))
    return DONE


def carry_out(store: RemediationRecords, cluster: DrainCapability, decide: Callable[[CallResults], Plan], *,
              at: float, repair_timeout_s: float = 1800.0) -> tuple[Plan, dict[BackendCall, CallResult]]:
    """Make the backend calls of ``decide``'s plan in order, deciding again after one that did not succeed,
    then write the final plan in one transaction; the plan and the calls' results."""
    results: dict[BackendCall, CallResult] = {}
    plan = decide(results)
    while (call := next((c for c in plan.calls if c not in results), None)) is not None:
        results[call] = call_backend(cluster, call, repair_timeout_s)
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
