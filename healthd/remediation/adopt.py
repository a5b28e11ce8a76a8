"""Slurm's drains that healthd's boundary check caused, taken over as healthd's own (pure).

A prolog or epilog node check that finds the node certainly broken exits non-zero; slurmd reports
it and slurmctld drains the node with its own words (``Epilog error``, ``Prolog error``). That
drain is healthd's doing: healthd explains it (the reason becomes ``healthd: boundary <context>
<what failed> run <id>``), records it as its own automatic drain and may lift it when the node
passes again, like any drain it made.

Only a drain that is certainly the check's is taken: the node is drained with exactly Slurm's
reason for that context, healthd has no open drain of it, a boundary document of that context on
that node failed, and Slurm's reason was set within ``slack_s`` of the document's end (when Slurm
says when). Anything else (a reason an operator wrote, an epilog of another tool, a drain long
before or after) is left alone.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from healthd.model import Node

SLURM_REASONS: Mapping[str, frozenset[str]] = {
    "epilog": frozenset({"Epilog error"}),
    "prolog": frozenset({"Prolog error"}),
}
"""The reasons slurmctld gives a node it drains for a failed epilog or prolog (every supported release).
``HealthCheckProgram``'s exit status drains nothing: no reason to take over."""

ADOPT_SLACK_S = 300.0


@runtime_checkable
class DrainTakeover(Protocol):
    """A backend that can give a drain Slurm made a new reason (the Slurm backend)."""

    def list_nodes(self) -> list[Node]: ...

    def take_over_drain(self, node: str, slurm_reason: str, reason: str) -> None:
        """:raises PolicyRefused: the node's reason is no longer ``slurm_reason``."""
        ...


@dataclass(frozen=True)
class BoundaryFailure:
    """A boundary run of one node that failed (the check exited non-zero)."""

    node: str
    run_id: str
    context: str
    reason: str
    finished_at: float


@dataclass(frozen=True)
class Adoption:
    node: str
    slurm_reason: str
    reason: str
    """healthd's reason, which replaces Slurm's."""
    run_id: str
    context: str


def adoptions(failures: Sequence[BoundaryFailure], nodes: Mapping[str, Node], own_drained: Collection[str],
              prefix: str, *, slack_s: float = ADOPT_SLACK_S, max_reason: int = 160) -> list[Adoption]:
    """The drains of ``nodes`` that ``failures`` caused and healthd does not own yet (newest failure
    per node)."""
    newest: dict[str, BoundaryFailure] = {}
    for f in failures:
        if f.context in SLURM_REASONS and (f.node not in newest or f.finished_at > newest[f.node].finished_at):
            newest[f.node] = f
    out: list[Adoption] = []
    for name, f in sorted(newest.items()):
        node = nodes.get(name)
        if node is None or not node.drained or name in own_drained or node.owned_by(prefix):
            continue
        if (node.reason or "").strip() not in SLURM_REASONS[f.context]:
            continue
        if node.reason_time is not None and abs(node.reason_time - f.finished_at) > slack_s:
            continue
        out.append(Adoption(name, str(node.reason), boundary_reason(prefix, f, max_reason), f.run_id, f.context))
    return out


def boundary_reason(prefix: str, f: BoundaryFailure, max_reason: int = 160) -> str:
    """``healthd: boundary epilog env.gpu_count: 0 GPU(s) visible, 1 expected run boundary-node2-...``"""
    what = " ".join(f.reason.split())
    tail = f" run {f.run_id}"
    head = f"{prefix} boundary {f.context} "
    room = max_reason - len(head) - len(tail)
    if len(what) > room:
        what = what[: max(0, room - 2)] + ".."
    return head + what + tail
