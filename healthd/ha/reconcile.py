"""A new leader's reconciliation of the drains an earlier leader made.

Each instance keeps its own store, so a new leader has no drain row for a node the old leader drained: it
would never undrain it after the node passes again. At its first tick as leader it looks at Slurm's drains
that carry healthd's prefix with an older epoch tag (``healthd: [e41] …``), checks each against the action
journal (a drain of that node recorded under that epoch), and records the confirmed ones as its own open
drains (so the recheck and the undrain after passes apply). A tagged drain the journal does not confirm is
left alone and logged: healthd does not own what it cannot show it made.

An untagged drain with healthd's prefix (``healthd: …`` without ``[eN]``) was made before ``[ha]`` was turned
on, by a single instance whose rule was the prefix alone: it is inherited on that rule (logged
``ha_drain_untagged_inherited``), as healthd's manual drain when its reason says so (``healthd: manual …``:
lifted only by ``healthd undrain``), else as an automatic one. The probe a drain was made for is read back
from its reason (``healthd: [e41] below_floor gemm …``): the undrain after passes needs it; a reason that
names none of ``probes`` gives a drain left to ``healthd undrain``.

``inherited`` is pure; ``reconcile`` does the I/O through narrow Protocols.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from healthd.ha.fence import EPOCH_TAG, reason_epoch
from healthd.judge.model import ReasonCode
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
    epoch: int | None
    """The reason's epoch tag; ``None``: untagged (from before ``[ha]``)."""


def inherited(nodes: Sequence[Node], own_open: set[str], prefix: str, epoch: int) -> list[Inherited]:
    """healthd's drains (by prefix) not among ``own_open``, untagged or tagged with an epoch older than ``epoch``."""
    out = []
    for n in nodes:
        if not n.drained or not n.owned_by(prefix) or n.name in own_open:
            continue
        tag = reason_epoch(str(n.reason), prefix)
        if tag is None or tag < epoch:
            out.append(Inherited(n, tag))
    return out


def reason_words(reason: str, prefix: str) -> list[str]:
    """The words of a healthd reason after its prefix and epoch tag (``["below_floor", "gemm", …]``)."""
    return EPOCH_TAG.sub("", reason[len(prefix):], count=1).split() if reason.startswith(prefix) else []


def drained_for(reason: str, prefix: str, probes: Collection[str]) -> tuple[str, ...]:
    """The probe a healthd drain reason names (``healthd: <code> <probe> …``), if it is one of ``probes``."""
    words = reason_words(reason, prefix)
    return (words[1],) if len(words) > 1 and words[1] in probes else ()


class Journal(Protocol):
    def drains(self, nodes: Sequence[str], verbs: Sequence[str]) -> Mapping[str, set[int]]: ...


class Nodes(Protocol):
    def list_nodes(self) -> list[Node]: ...


class Drains(Protocol):
    def drains(self, *, node: str | None = None, since: float = 0.0, open_only: bool = False) -> list[DrainRow]: ...

    def apply_remediation(self, changes: RemediationChanges) -> None: ...


def reconcile(journal: Journal, cluster: Nodes, store: Drains, prefix: str, epoch: int, now: float,
              probes: Collection[str] = ()) -> list[str]:
    """Record the earlier leaders' confirmed drains, and the untagged ones, as this instance's own; the nodes
    recorded. ``probes``: the probe names a reason may name (the drain's recheck)."""
    own = {d.node for d in store.drains(open_only=True)}
    found = inherited(cluster.list_nodes(), own, prefix, epoch)
    if not found:
        return []
    tagged = [f.node.name for f in found if f.epoch is not None]
    recorded = journal.drains(tagged, DRAIN_VERBS) if tagged else {}
    writes: list[OpenDrain | AuditEntry] = []
    for f in found:
        name, reason = f.node.name, str(f.node.reason)
        if f.epoch is None:
            manual = reason_words(reason, prefix)[:1] == [ReasonCode.MANUAL.value]
            writes.append(OpenDrain(name, class_of(f.node), reason, ACTOR, automatic=not manual,
                                    probes=() if manual else drained_for(reason, prefix, probes)))
            writes.append(AuditEntry("drain", name, "done", reason, ACTOR, {"inherited_untagged": True}))
            log.warning("ha_drain_untagged_inherited", node=name, reason=reason, manual=manual,
                        why="healthd's prefix without an epoch: made before [ha] was turned on")
            continue
        if f.epoch not in recorded.get(name, set()):
            log.warning("ha_drain_not_in_journal", node=name, reason=reason, epoch=f.epoch,
                        why="a healthd reason with an epoch the journal has no drain of this node under: left alone")
            continue
        writes.append(OpenDrain(name, class_of(f.node), reason, ACTOR, automatic=True,
                                probes=drained_for(reason, prefix, probes)))
        writes.append(AuditEntry("drain", name, "done", reason, ACTOR, {"inherited_from_epoch": f.epoch}))
        log.info("ha_drain_inherited", node=name, reason=reason, epoch=f.epoch)
    if writes:
        store.apply_remediation(RemediationChanges(now, tuple(writes)))
    return [w.node for w in writes if isinstance(w, OpenDrain)]
