"""The breaker window and the hourly cap across a failover: drains other instances journalled count too.

Remediation counts healthd's recent automatic drains (the breaker's window, the per-node repeat window and
the hourly cap) from its own store. With ``[ha]`` each instance has its own store, so a new leader would start
with an empty window: a second quota of drains. ``with_journal_drains`` replaces, in the snapshot remediation
decides from, the drains this instance inherited at a takeover (``healthd.ha.reconcile``: recorded at the
takeover, not when they were made) by the drains the other instances journalled, at the time they were
journalled. A journalled drain counts as automatic (the journal does not say; a drain by hand counted too
only makes the caps stricter). Pure.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from healthd.ha.lease import JournalDrain
from healthd.ha.reconcile import ACTOR
from healthd.store.rows import DrainRow, RemediationSnapshot


def with_journal_drains(snap: RemediationSnapshot, journal: Sequence[JournalDrain],
                        node_class: Mapping[str, str]) -> RemediationSnapshot:
    """``snap`` with its recent drains from its own store (those inherited left out) and from ``journal``,
    oldest first; ``node_class``: each node's class (the breaker counts per class)."""
    own = [d for d in snap.recent_drains if d.actor != ACTOR]
    others = [DrainRow(j.node, node_class.get(j.node, ""), j.reason, ACTOR, True, j.at, None, None)
              for j in journal]
    return replace(snap, recent_drains=tuple(sorted([*own, *others], key=lambda d: d.drained_at)))
