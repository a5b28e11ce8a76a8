"""A new leader's reconciliation of the drains an earlier leader made.

Each instance keeps its own store, so a new leader has no drain row for a node the old leader drained: it
would never undrain it after the node passes again. At its first tick as leader it looks at Slurm's drains
that carry healthd's prefix with an older epoch tag (``healthd: [e41] …``), checks each against the action
journal (a drain of that node recorded under that epoch), and records the confirmed ones as its own open
drains (so the recheck and the undrain after passes apply, and they count against its caps). A tagged drain
the journal does not confirm is left alone and logged: healthd does not own what it cannot show it made.

``inherited`` is pure; ``reconcile`` does the I/O through narrow Protocols.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from healthd.ha.fence import reason_epoch
from healthd.logging import get_logger
from healthd.model import Node
from healthd.node_class import class_of
from healthd.store.rows import AuditEntry, DrainRow, OpenDrain, RemediationChanges

log = get_logger("healthd.ha")

ACTOR = "healthd-ha"
DRAIN_VERBS = ("drain", "take_over_drain", "back_from_repair", "start_reboot")
"""Journal verbs that leave healthd's drain reason on a node."""


@dataclass(frozen=True)
class Inherited:
    node: Node
    epoch: int


def inherited(nodes: Sequence[Node], own_open: set[str], prefix: str, epoch: int) -> list[Inherited]:
    """healthd's drains (by prefix) tagged with an epoch older than ``epoch`` and not among ``own_open``."""
    out = []
    for n in nodes:
        if not n.drained or not n.owned_by(prefix) or n.name in own_open:
            continue
        tag = reason_epoch(str(n.reason), prefix)
        if tag is not None and tag < epoch:
            out.append(Inherited(n, tag))
    return out


class Journal(Protocol):
    def drains(self, nodes: Sequence[str], verbs: Sequence[str]) -> Mapping[str, set[int]]: ...


class Nodes(Protocol):
    def list_nodes(self) -> list[Node]: ...


class Drains(Protocol):
    def drains(self, *, node: str | None = None, since: float = 0.0, open_only: bool = False) -> list[DrainRow]: ...

    def apply_remediation(self, changes: RemediationChanges) -> None: ...


def reconcile(journal: Journal, cluster: Nodes, store: Drains, prefix: str, epoch: int, now: float) -> list[str]:
    """Record the earlier leaders' confirmed drains as this instance's own; the nodes recorded."""
    own = {d.node for d in store.drains(open_only=True)}
    found = inherited(cluster.list_nodes(), own, prefix, epoch)
    if not found:
        return []
    recorded = journal.drains([f.node.name for f in found], DRAIN_VERBS)
    writes: list[OpenDrain | AuditEntry] = []
    for f in found:
        name, reason = f.node.name, str(f.node.reason)
        if f.epoch not in recorded.get(name, set()):
            log.warning("ha_drain_not_in_journal", node=name, reason=reason, epoch=f.epoch,
                        why="a healthd reason with an epoch the journal has no drain of this node under: left alone")
            continue
        writes.append(OpenDrain(name, class_of(f.node), reason, ACTOR, automatic=True, probes=()))
        writes.append(AuditEntry("drain", name, "done", reason, ACTOR, {"inherited_from_epoch": f.epoch}))
        log.info("ha_drain_inherited", node=name, reason=reason, epoch=f.epoch)
    if writes:
        store.apply_remediation(RemediationChanges(now, tuple(writes)))
    return [w.node for w in writes if isinstance(w, OpenDrain)]
