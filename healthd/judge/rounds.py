"""A round's findings judged together (pure): the event barrier and the cold-start evidence rule.

*The event barrier.* Results of one class arrive spread over a round. A node's finding can be
confirmed by its re-probes (which run first) before the class's regular results of the same window
are in, and so before the fleet-event rule (``fleet.check_event``) could see that the whole class is
low: the node would be drained for an event. So a new recommendation whose finding an event would
explain (not ``event_proof``) is *held* until the event rule has seen the window: until the class
has at least as many regular results since the finding's first flagged result (from other nodes) as
the event rule's newest-results window holds (``fleet.event_recent``, or ``event_recent_fraction``
of the class's sample if more). It is then released unless an event is forming: as long as the
share of those fresh results that is flagged is at least half the event rule's
``event_recent_share`` (the same hysteresis an active event ends with), it stays held; if the event
is declared, the finding is the event's. A finding is held at most ``fleet.event_window_s`` after
it began (the event rule has then seen its whole window).

*The leaf barrier.* The same race per switch: with a topology, a node's finding can be localised
(its re-probes, with a partner under its leaf and one under another, both bad) before its leafmates'
regular results of the window are in, and so before the switch rule (``healthd.judge.switches``)
could name a failing leaf: its first node would be drained for its switch (seen on the real Slurm
test cluster when a round of pair jobs took longer than a localisation). So a new recommendation
whose finding a switch would explain (not ``switch_proof``) also waits, for at most
``fleet.event_window_s``, until as many of its leaf's other nodes have a regular result since the
finding began as the switch rule needs beside it (``switch.min_nodes`` - 1, or all of the leaf's
nodes sampled in the window if fewer), and, while any of those fresh results is flagged, until every
node of the leaf sampled in the window has one: by then the switch rule has named the leaf (the
finding is the switch's) or has not (the node's own fault: released). An independent fault under a
healthy leaf waits for two of its leafmates' regular results: the same round, on a fleet whose
round covers the leaf.

*Cold start.* How many retests confirm a finding follows the class's chance flag rate
(``noise.retests_for``). Before the judge has counted ``noise.MIN_RATE_SAMPLE`` regular results of
a class, the rate is not known; taking ``confirm.n`` then (as a quiet fleet would need) lets a
heavy-tailed fleet's chance flags be confirmed by chance in its first rounds. So, until then, the
rate used is the upper confidence bound of what was counted (``rate_bound``): few results, a wide
bound, more retests (up to ``confirm.n + EXTRA_RETESTS``); a cold start needs at least the evidence a
warm fleet with that rate would.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from statistics import NormalDist

from healthd.config import FleetSettings

HELD = "held"
"""``stage`` in a verdict's evidence: its finding is confirmed but its recommendation waits for the
event rule (never a recommendation, never a drain, until released)."""
RATE_CONFIDENCE = 0.95
"""One-sided confidence of the chance flag rate's upper bound at a cold start."""


def rate_bound(flagged: int, judged: int, confidence: float = RATE_CONFIDENCE) -> float:
    """The Wilson upper bound of a rate seen ``flagged`` times in ``judged`` trials (1.0 for none).

    >>> rate_bound(0, 0), round(rate_bound(0, 100), 4), round(rate_bound(10, 1000), 4)
    (1.0, 0.0263, 0.0167)
    """
    if judged <= 0:
        return 1.0
    z = NormalDist().inv_cdf(confidence)
    p = flagged / judged
    z2 = z * z
    centre = p + z2 / (2 * judged)
    margin = z * math.sqrt(p * (1 - p) / judged + z2 / (4 * judged * judged))
    return min(1.0, (centre + margin) / (1 + z2 / judged))


def cold_retests(flagged: int, judged: int, target_per_1000_node_days: float, runs_per_node_day: float, n: int,
                 m: int, *, extra: int, min_sample: int, first: bool = False) -> int:
    """Retests needed while fewer than ``min_sample`` results of the class were counted and it has
    flagged other nodes' results (``flagged``: a class that flags by chance) or is in its first rounds
    (``first``: fewer results than its nodes need for a baseline: nothing is known of its noise yet):
    those a warm fleet flagging at the rate's upper bound would need (``n`` to ``n + extra``); ``n``
    from ``min_sample`` on (the measured rate decides then), or after the first rounds while no other
    node was flagged.

    >>> cold_retests(1, 40, 0.1, 48.0, 2, 3, extra=2, min_sample=1000)
    4
    >>> cold_retests(0, 40, 0.1, 48.0, 2, 3, extra=2, min_sample=1000)
    2
    >>> cold_retests(0, 40, 0.1, 48.0, 2, 3, extra=2, min_sample=1000, first=True)
    4
    >>> cold_retests(0, 1000, 0.1, 48.0, 2, 3, extra=2, min_sample=1000)
    2
    """
    if judged >= min_sample or (flagged <= 0 and not first):
        return n
    rate = rate_bound(flagged, judged)
    limit = target_per_1000_node_days / 1000.0
    for need in range(n, n + extra + 1):
        if runs_per_node_day * math.comb(m + need - n, need) * rate ** need <= limit:
            return need
    return n + extra


@dataclass(frozen=True)
class Hold:
    """Why a recommendation waits: ``text`` for the verdict."""

    fresh: int
    flagged: int
    need: int
    forming: bool
    switch: str = ""
    """The leaf whose switch rule it waits for (``leaf_hold``); empty: the class's event rule."""
    since: float = 0.0
    """When the held finding began: a switch named while it waits is dated back to it (its finding is
    the switch's, not the node's)."""

    @property
    def text(self) -> str:
        if self.switch and self.forming:
            return (f"held: {self.switch} may be failing ({self.flagged} of its other nodes' {self.fresh} results "
                    "since this finding began are flagged)")
        if self.switch:
            return (f"held until the switch rule has seen {self.switch} ({self.fresh} of {self.need} results of its "
                    "other nodes since this finding began)")
        if self.forming:
            return (f"held: the class may show a fleet event forming ({self.flagged} of its {self.fresh} results "
                    "since this finding began are flagged)")
        return (f"held until the fleet-event rule has seen this window ({self.fresh} of {self.need} results of the "
                "class since this finding began)")


def fresh_results(samples: Iterable[tuple[str, float, bool]], since: float, node: str) -> tuple[int, int]:
    """(results, flagged) among the class's latest regular results ``(node, at, flagged)`` taken at or
    after ``since``, the node's own left out."""
    fresh = flagged = 0
    for name, at, bad in samples:
        if name != node and at >= since:
            fresh += 1
            flagged += bad
    return fresh, flagged


def event_hold(samples: Iterable[tuple[str, float, bool]], since: float, node: str, now: float,
               settings: FleetSettings) -> Hold | None:
    """Whether a new recommendation for ``node`` (its finding began at ``since``) waits for the event
    rule (module docstring); ``samples``: each node of the class's latest regular ``(node, at,
    flagged)`` within the event window.

    >>> from healthd.config import FleetSettings
    >>> s = FleetSettings()
    >>> quiet = [(f"n{i}", 100.0 + i, i == 19) for i in range(20)]
    >>> event_hold(quiet, 115.0, "x", 200.0, s).text
    'held until the fleet-event rule has seen this window (5 of 12 results of the class since this finding began)'
    >>> event_hold([(n, at, False) for n, at, _ in quiet], 115.0, "x", 200.0, s) is None
    True
    >>> event_hold(quiet, 100.0, "x", 200.0, s) is None
    True
    >>> event_hold([(n, at, i % 2 == 0) for i, (n, at, _) in enumerate(quiet)], 100.0, "x", 200.0, s).forming
    True
    >>> event_hold(quiet, 115.0, "x", 115.0 + s.event_window_s, s) is None
    True
    """
    if now - since >= settings.event_window_s:
        return None
    rows = list(samples)
    fresh, flagged = fresh_results(rows, since, node)
    if not flagged:
        return None
    need = min(max(settings.event_recent, math.ceil(settings.event_recent_fraction * len(rows))),
               sum(1 for name, _, _ in rows if name != node))
    if fresh < need:
        return Hold(fresh, flagged, need, False, since=since)
    if flagged >= max(settings.event_min_nodes, settings.event_recent_share / 2 * fresh):
        return Hold(fresh, flagged, need, True, since=since)
    return None


def leaf_hold(leafmates: Iterable[tuple[str, float, bool]], since: float, now: float, *, min_nodes: int,
              window_s: float, switch: str) -> Hold | None:
    """Whether a new recommendation waits for the switch rule to see its leaf (module docstring);
    ``leafmates``: the latest regular ``(node, at, flagged)`` within the window of the leaf's other nodes
    (the node and its partners in the finding's runs left out).

    >>> mates = [("b", 90.0, False), ("c", 95.0, False), ("d", 80.0, False)]
    >>> leaf_hold(mates, 100.0, 110.0, min_nodes=3, window_s=3600, switch="leaf1").text
    'held until the switch rule has seen leaf1 (0 of 2 results of its other nodes since this finding began)'
    >>> leaf_hold([("b", 101.0, False), ("c", 102.0, False), ("d", 80.0, False)], 100.0, 110.0, min_nodes=3,
    ...           window_s=3600, switch="leaf1") is None
    True
    >>> leaf_hold([("b", 101.0, True), ("c", 102.0, False), ("d", 80.0, False)], 100.0, 110.0, min_nodes=3,
    ...           window_s=3600, switch="leaf1").forming
    True
    >>> leaf_hold(mates, 100.0, 100.0 + 3600, min_nodes=3, window_s=3600, switch="leaf1") is None
    True
    >>> leaf_hold([], 100.0, 110.0, min_nodes=3, window_s=3600, switch="leaf1") is None
    True
    """
    if now - since >= window_s:
        return None
    rows = list(leafmates)
    fresh = [bad for _, at, bad in rows if at >= since]
    flagged = sum(fresh)
    need = min(min_nodes - 1, len(rows))
    if len(fresh) < need:
        return Hold(len(fresh), flagged, need, False, switch, since)
    if flagged and len(fresh) < len(rows):
        return Hold(len(fresh), flagged, len(rows), True, switch, since)
    return None
