"""Reboot and validate (``[remediation] repair``): what a repair's step makes of a node (pure).

A node healthd drained itself for a confirmed finding of a ``repair_on`` kind is repaired once per
``repeat_window_s``, in this order (each step a tick of ``decide``, each audited as ``repair``):

1. **start**: the node goes into healthd's recheck reservation (so whatever Slurm does with it next, no
   user's job starts there), then ``scontrol reboot ASAP nextstate=DOWN reason="<prefix> repair reboot
   ..."`` (``repair = "reboot"``, Slurm's ``RebootProgram``) or the site's ``repair_command`` (it returns
   once the node is back). Refused while the breaker is open; counted in the hourly cap.
2. **back**: Slurm shows the reboot over (no ``REBOOT_*`` flag). 22.05, 24.11 and 26.05 clear the DRAIN
   flag on the way and bring the node back DOWN with ``<reason> : reboot issued : reboot complete``; with
   ``ReturnToService=2`` it is IDLE seconds later (24.11 keeps the reason then, 22.05 and 26.05 clear it).
   healthd resumes it if DOWN, drains it again with ``<prefix> repair validating ...`` (the drain's checks
   are now the full check, counted from here) and takes it out of the reservation: the drain keeps users'
   jobs off from now on.
3. **full check**: the recheck of healthd's own drains runs every probe of it in the reservation; one pass
   of each returns the node to service (its own drain only); a failure drains it with ``<prefix> repair
   failed ...`` and no checks: left to humans, not repaired again within ``repeat_window_s``.

A node whose reason someone else set meanwhile is never touched: the repair ends as failed, healthd takes
the node out of its reservation only. A repair not over within ``repair_timeout_s`` fails.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from healthd.model import Node
from healthd.store.rows import JudgedMark, RepairKind

Phase = Literal["rebooting", "back", "taken", "waiting"]

FAIL_SEVERITY = 2


def phase(node: Node | None, kind: RepairKind, prefix: str) -> Phase:
    """Where a node under repair is: still ``rebooting``, ``back`` (ready for its full check), ``taken``
    (someone else's reason is on it now) or ``waiting`` (not known, or not answering)."""
    if node is None or "NOT_RESPONDING" in node.flags:
        return "waiting"
    if any(f.startswith("REBOOT") for f in node.flags):
        return "rebooting"
    if node.reason and not node.owned_by(prefix):
        return "taken"
    if node.state == "down" or not node.drained:
        return "back"  # DOWN, or IDLE after ReturnToService=2 (22.05 clears the reason, 24.11 keeps it)
    if kind == "command":
        return "back"  # the command returned with the node back, still drained by healthd
    return "waiting"


def failed_check(marks: Sequence[JudgedMark], probes: Sequence[str]) -> JudgedMark | None:
    """The first failing result of the full check among ``marks`` ((at, probe, severity, code))."""
    return next((m for m in marks if m[1] in probes and m[2] >= FAIL_SEVERITY), None)


def repair_argv(template: Sequence[str], node: str) -> tuple[str, ...]:
    """``repair_command`` for ``node``: ``{node}`` replaced in each argument (no shell)."""
    return tuple(a.replace("{node}", node) for a in template)


def start_reason(prefix: str, kind: RepairKind, code: str) -> str:
    return f"{prefix} repair {kind} {code}"


def validating_reason(prefix: str, kind: RepairKind, code: str) -> str:
    return f"{prefix} repair validating {code} after {kind}"


def failed_reason(prefix: str, kind: RepairKind, code: str, why: str) -> str:
    return f"{prefix} repair failed {code} after {kind}: {why}"


def plan_text(kind: Literal["none", "reboot", "command"], command: Sequence[str], node: str) -> str:
    """What a repair of ``node`` would do (a recommendation's ``repair`` field, in recommend mode too)."""
    if kind == "reboot":
        return (f"drain {node}, reboot it through Slurm (scontrol reboot ASAP nextstate=DOWN) in healthd's recheck "
                "reservation, then run the full check: a pass returns it to service, a failure keeps it drained")
    if kind == "command":
        return (f"drain {node}, run {' '.join(repair_argv(command, node))} in healthd's recheck reservation, then "
                "run the full check: a pass returns it to service, a failure keeps it drained")
    return ""
