"""Switch correlation (pure): nodes under one switch flagged together beyond chance.

A leaf switch (or a block, or a rack's power) that degrades makes every node under it fail at once;
judged node by node that is N drains. Here the nodes' latest regular results of one probe (the
same sample the fleet-event rule reads: each node's latest ``(at, flagged)`` within
``fleet.event_window_s``) are grouped by switch, and each switch is tested against chance:

- the chance rate of a node is its class's flag rate on the probe among the class's nodes *outside*
  the switch (so the switch's own failures do not raise the bar it is tested against), never below
  ``switch.rate_floor`` (a clean class does not turn one bad node into a switch); a class whose nodes
  under the switch outnumber its nodes outside is left out of that switch's test (a class-wide
  change is the fleet event's to name), and so is a class with no node outside left to compare
  with once the switches named already are left out (its rate is unknown, not zero: a class under
  two spines, both low in a class event, named the second at ``p = 1`` after the first);
- the class's rate outside is also taken over its nodes measured since the median time of the switch's
  flagged results, and the higher of the two is the chance rate; with fewer than ``CONTEMPORARY_MIN``
  such nodes the class waits out of the test (for a switch to start: a named one keeps its test).
  Nodes are often probed in name order, and names follow the cabling: when a whole round moves
  together (a loaded host, a busy fabric), the first nodes flagged are one spine's, beyond chance
  against the class's earlier results and not against the class measured at the same time. A
  failing leaf is named once the class outside has been measured since it failed (a tick or two
  later);
- ``p``: the binomial tail ``P(X >= k)`` of ``k`` flagged among the ``n`` probed nodes at the mean
  chance rate (for nodes of several classes an upper bound of the exact Poisson-binomial tail,
  Hoeffding 1956); multiplied by the number of switches tested (Bonferroni), so that the false
  finding rate does not grow with the fabric;
- beyond chance: ``k >= switch.min_nodes`` and ``p x tested < switch.p_value``; an active finding
  lasts while ``k >= 2`` and ``p x tested < switch.end_p_value`` (hysteresis), or while half its
  probed nodes (two at least) are still flagged: a class-wide event that raises the chance rate
  does not end it and let its nodes drain. Once its test fails, it ends only when each node it found
  flagged has been measured again since it was last named (``seen_again``): one result back in a noisy
  class's spread does not end a failing leaf.

Nested levels: a parent switch is named, and its children are not, when at least two of its
children are beyond chance and so is the parent's own test, or when the parent is beyond chance on
its own nodes with those of its beyond-chance children left out (a fault spread thinly over its
leaves). Otherwise each child beyond chance is named on its own: no finding starts without its own
test beyond chance (a class cabled under its own spines, in a class-wide event, has leaves that
cross the bar one by one as the event's results come in, while the spine's own test, against the
class outside it, is at ``p = 1``).

*Ambiguity*: when a class's nodes are exactly those of a set of switches (a class cabled under its
own switches), a class-wide change and a fault of those switches cannot be told apart from where
the flags are; ``ambiguity`` says so, for the class event's text to name both ("class h200x8, the
same nodes as spine5-7"). A switch finding itself never holds a whole class: a class whose nodes
under a switch outnumber those outside is left out of the switch's test.

Every probe is tested, single-node ones too (GEMM failing together under one leaf is a rack's power
or cooling, still not N broken nodes).
"""

from __future__ import annotations

import bisect
import math
import re
import statistics
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from healthd.config import SwitchSettings
from healthd.judge.model import Finding, FleetEvent
from healthd.topology import Topology

Sample = tuple[float, bool]
"""A node's latest regular result of the probe: (when, flagged)."""


@dataclass(frozen=True)
class SwitchCheck:
    """A switch whose nodes are flagged together beyond chance on one probe."""

    switch: str
    level: int
    probe: str
    flagged: tuple[str, ...]
    """The flagged nodes under it, in name order."""
    sampled: int
    """Its nodes with a result in the sample (and a class it could be tested against)."""
    expected: float
    """Flagged nodes expected by chance (``sampled`` x the mean chance rate)."""
    p_value: float
    """Bonferroni-corrected: the binomial tail times the switches tested."""
    started_at: float
    """The earliest flagged result under it (the onset)."""
    deficit: float | None
    """The median relative shortfall of the flagged nodes' worst findings (0.38: 38% below), if known."""
    children: tuple[str, ...] = ()
    """For a parent named in place of its children: the leaves beyond chance under it."""
    spread: bool = False
    """A parent beyond chance with its beyond-chance children left out (a fault over all its nodes)."""

    @property
    def held(self) -> tuple[str, ...]:
        """The switches whose nodes' findings on the probe it holds: the leaves beyond chance, or
        itself when it was named for a fault spread over its nodes."""
        return (self.switch,) if self.spread or not self.children else self.children

    def text(self) -> str:
        names = ", ".join(self.flagged[:12]) + (f" and {len(self.flagged) - 12} more" if len(self.flagged) > 12 else "")
        how = f", median {self.deficit:.0%} below" if self.deficit is not None else ""
        below = f"; leaves {', '.join(self.children)} all beyond chance" if self.children else ""
        return (f"switch {self.switch} (level {self.level}): {self.probe} flagged on {len(self.flagged)} of the "
                f"{self.sampled} nodes probed under it ({names}{how}), {self.expected:.1f} expected by chance "
                f"(p = {self.p_value:.1g}){below}")


def binomial_tail(k: int, n: int, p: float) -> float:
    """``P(X >= k)`` for ``X ~ Binomial(n, p)``, summed in log space (exact to float precision)."""
    if k <= 0:
        return 1.0
    if k > n:
        return 0.0
    if p <= 0:
        return 0.0
    if p >= 1:
        return 1.0
    lp, lq = math.log(p), math.log1p(-p)
    log_c = math.lgamma(n + 1)
    total = 0.0
    for i in range(k, n + 1):
        term = math.exp(log_c - math.lgamma(i + 1) - math.lgamma(n - i + 1) + i * lp + (n - i) * lq)
        total += term
        if i > n * p and term < total * 1e-17:
            break
    return min(1.0, total)


Result = tuple[int, int, float, float]
"""(flagged, probed, expected by chance, uncorrected tail probability) of one switch's test."""


CONTEMPORARY_MIN = 6
"""A class's flag rate outside a switch is also taken over its nodes measured since the median time of the
switch's flagged results (at least this many, else the class is left out of the test until they are)."""


class _Timeline:
    """Each class's samples in time order, to count those measured since a time (pure helper)."""

    def __init__(self, samples: Mapping[str, Sample], classes: Mapping[str, str]) -> None:
        self._samples = samples
        self._classes = classes
        by_class: dict[str, list[tuple[float, bool]]] = {}
        for node, (at, flagged) in samples.items():
            by_class.setdefault(classes.get(node, ""), []).append((at, flagged))
        self._times: dict[str, list[float]] = {}
        self._flags: dict[str, list[int]] = {}
        for cls, rows in by_class.items():
            rows.sort()
            self._times[cls] = [at for at, _ in rows]
            acc = [0]
            for _, flagged in rows:
                acc.append(acc[-1] + flagged)
            self._flags[cls] = acc

    def since(self, cls: str, at: float, leave_out: Iterable[str]) -> tuple[int, int] | None:
        """(sampled, flagged) among ``cls``'s nodes measured at ``at`` or later, ``leave_out`` left out."""
        times = self._times.get(cls)
        if times is None:
            return None
        i = bisect.bisect_left(times, at)
        sampled, flagged = len(times) - i, self._flags[cls][-1] - self._flags[cls][i]
        for node in leave_out:
            s = self._samples.get(node)
            if s is not None and s[0] >= at and self._classes.get(node, "") == cls:
                sampled -= 1
                flagged -= s[1]
        return sampled, flagged


def switch_checks(
    topology: Topology, probe: str, samples: Mapping[str, Sample], classes: Mapping[str, str],
    settings: SwitchSettings, *, active: frozenset[str] = frozenset(),
    deficits: Mapping[str, float] | None = None, partners: Mapping[str, Sequence[str]] | None = None,
) -> list[SwitchCheck]:
    """The switches to name for ``probe``: ``samples`` is node → its latest regular result in the
    window, ``classes`` node → class, ``active`` the switches named now (held to the looser
    ``end_p_value``), ``deficits`` node → relative shortfall of its flagged result (evidence only),
    ``partners`` node → the other members of the multi-node result that alone flagged it.

    One observation is not counted twice: a node flagged only by a pair result with a node under the
    switch tested is left out of the class's rate outside it. Leaves are named worst first; the nodes
    a named leaf explains (its own, and those flagged only by results with them) are left out of the
    tests that follow, so that several failing leaves do not raise each other's bar."""
    deficits = deficits or {}
    by_partner: dict[str, list[str]] = {}
    for node, others in (partners or {}).items():
        if samples.get(node, (0.0, False))[1]:
            for m in others:
                by_partner.setdefault(m, []).append(node)

    def counts(nodes: Iterable[str]) -> tuple[Counter[str], Counter[str]]:
        sampled: Counter[str] = Counter()
        flagged: Counter[str] = Counter()
        for n in nodes:
            s = samples.get(n)
            if s is not None:
                cls = classes.get(n, "")
                sampled[cls] += 1
                flagged[cls] += s[1]
        return sampled, flagged

    def explained_by(nodes: Iterable[str]) -> set[str]:
        out: set[str] = set()
        for n in nodes:
            out.add(n)
            out.update(by_partner.get(n, ()))
        return out

    total_s, total_f = counts(samples)
    timeline = _Timeline(samples, classes)
    need_since = max(settings.min_nodes, CONTEMPORARY_MIN)

    def test(name: str, excluded: set[str]) -> Result | None:
        under = topology.nodes_under(name)
        all_s, all_f = counts(under)
        in_s, in_f = counts(n for n in under if n not in excluded)
        skip = (excluded | explained_by(under)) - under
        skip_s, skip_f = counts(skip)
        times = [samples[n][0] for n in under if n not in excluded and samples.get(n, (0.0, False))[1]]
        onset = statistics.median_low(times) if times else None
        k = n = 0
        expected = 0.0
        for cls, count in in_s.items():
            if total_s[cls] - all_s[cls] < all_s[cls]:
                continue
            outside = total_s[cls] - all_s[cls] - skip_s[cls]
            if outside <= 0:
                continue
            rate = (total_f[cls] - all_f[cls] - skip_f[cls]) / outside
            if onset is not None and name not in active:
                since = timeline.since(cls, onset, under | skip)
                if since is None or since[0] < need_since:
                    continue
                rate = max(rate, since[1] / since[0])
            n += count
            k += in_f[cls]
            expected += count * max(settings.rate_floor, rate)
        if n == 0:
            return None
        return k, n, expected, binomial_tail(k, n, expected / n)

    raw = {name: test(name, set()) for name in topology.switches}
    tested = max(1, sum(1 for r in raw.values() if r is not None and r[1] >= settings.min_nodes))

    def beyond(name: str, r: Result | None) -> bool:
        if r is None:
            return False
        k, n, _, p = r
        if name in active:
            return k >= 2 and (p * tested < settings.end_p_value or 2 * k >= n)
        return k >= settings.min_nodes and p * tested < settings.p_value

    def check(name: str, r: Result, children: tuple[str, ...] = (), spread: bool = False) -> SwitchCheck:
        sw = topology.switches[name]
        flagged = tuple(sorted(n for n in sw.nodes if samples.get(n, (0.0, False))[1]))
        onset = min((samples[n][0] for n in flagged), default=0.0)
        shortfalls = [deficits[n] for n in flagged if n in deficits]
        return SwitchCheck(name, sw.level, probe, flagged, r[1], r[2], min(1.0, r[3] * tested), onset,
                           statistics.median(shortfalls) if shortfalls else None, children, spread)

    named: dict[str, SwitchCheck] = {}
    excluded: set[str] = set()
    remaining = {name for name, sw in topology.switches.items() if not sw.children}
    results = {name: raw[name] for name in remaining}
    while True:
        worst = min(((r[3], name, r) for name, r in results.items() if r is not None and beyond(name, r)),
                    default=None)
        if worst is None:
            break
        _, name, result = worst
        named[name] = check(name, result)
        remaining.discard(name)
        excluded |= explained_by(topology.nodes_under(name))
        results = {n: test(n, excluded) for n in remaining}

    for name in sorted((s for s, sw in topology.switches.items() if sw.children),
                       key=lambda s: (topology.switches[s].level, s)):
        sw = topology.switches[name]
        under = [c for c in sw.children if c in named]
        r = raw[name]
        spread = False
        if r is not None and len(under) < 2:
            own = test(name, excluded)
            spread = beyond(name, own)
            r = own if spread else r
        if (len(under) >= 2 and beyond(name, r)) or spread:
            assert r is not None
            children = tuple(sorted({leaf for c in under for leaf in (named[c].children or (c,))}))
            for c in under:
                del named[c]
            named[name] = check(name, r, children, spread)
            excluded |= explained_by(sw.nodes)
    return sorted(named.values(), key=lambda c: (c.level, c.switch))


def exact_cover(topology: Topology, nodes: Iterable[str]) -> tuple[str, ...] | None:
    """The fewest switches whose nodes together are exactly ``nodes`` (each the highest one wholly inside
    them), in name order; ``None`` when no set of switches has exactly those nodes (a node under no switch,
    or a switch holding some of them and others).

    >>> from healthd.topology import SwitchRecord, build_topology
    >>> t = build_topology([SwitchRecord("l0", ("a", "b")), SwitchRecord("l1", ("c",)),
    ...                     SwitchRecord("l2", ("d",)), SwitchRecord("s0", switches=("l0", "l1"))], "tree")
    >>> exact_cover(t, {"a", "b", "c"}), exact_cover(t, {"a", "b", "d"}), exact_cover(t, {"a"})
    (('s0',), ('l0', 'l2'), None)
    """
    want = frozenset(nodes)
    if not want or any(n not in topology.leaf_of for n in want):
        return None
    picked: list[str] = []
    covered: set[str] = set()
    for name, _ in sorted(topology.switches.items(), key=lambda kv: (-kv[1].level, kv[0])):
        under = topology.nodes_under(name)
        if under and under <= want and not under & covered:
            picked.append(name)
            covered |= under
    return tuple(sorted(picked)) if covered == want else None


def compact_names(names: Sequence[str]) -> str:
    """Switch names with one prefix and consecutive numbers written as a range.

    >>> compact_names(["spine5", "spine6", "spine7"]), compact_names(["leaf2", "leaf4", "spine1"])
    ('spine5-7', 'leaf2, leaf4, spine1')
    """
    parts = [re.fullmatch(r"(.*?)(\d+)", n) for n in names]
    if len(names) > 2 and all(parts):
        prefixes = {m.group(1) for m in parts if m}
        numbers = sorted(int(m.group(2)) for m in parts if m)
        if len(prefixes) == 1 and numbers == list(range(numbers[0], numbers[0] + len(numbers))):
            return f"{prefixes.pop()}{numbers[0]}-{numbers[-1]}"
    return ", ".join(names)


@dataclass(frozen=True)
class Ambiguity:
    """A class whose nodes are exactly those of a set of switches: a change of the class and a fault of
    the switches flag the same nodes (where the flags are cannot tell them apart)."""

    node_class: str
    switches: tuple[str, ...]

    @property
    def text(self) -> str:
        return f"class {self.node_class}, the same nodes as {compact_names(self.switches)}"


def ambiguity(topology: Topology | None, classes: Mapping[str, str], *, node_class: str | None = None,
              switches: Sequence[str] = ()) -> Ambiguity | None:
    """Whether a class event on ``node_class`` (or, without it, a finding on ``switches``) could as well
    be the other: the class's nodes (``classes``: node → class, every node the judge knows) are exactly
    the nodes of a set of switches (for ``switches``: of those switches). ``None`` when not, or without a
    topology. Pure."""
    if topology is None:
        return None
    members = frozenset(n for n, c in classes.items() if c == node_class) if node_class is not None else None
    if members is None:
        if not switches or any(sw not in topology.switches for sw in switches):
            return None
        under = frozenset(n for sw in switches for n in topology.nodes_under(sw))
        found = {classes.get(n) for n in under}
        single = found.pop() if len(found) == 1 else None
        if single is None:
            return None
        node_class = single
        members = frozenset(n for n, c in classes.items() if c == single)
        if members != under:
            return None
    cover = exact_cover(topology, members)
    return Ambiguity(node_class, cover) if cover is not None and node_class is not None else None


def shortfall(findings: Sequence[Finding]) -> float | None:
    """The largest relative distance of ``findings`` from their references (evidence: how far below)."""
    out = [abs(f.value - f.reference) / abs(f.reference) for f in findings if f.reference]
    return max(out, default=None)


def seen_again(event: FleetEvent, samples: Mapping[str, Sample], since: float) -> bool:
    """Whether a live switch finding last named at ``since`` whose test no longer holds it may end: each node
    it found flagged that still has a result in the window has a newer one (measured again since). One result
    back in the class's spread (a noisy round; a pair at a third of the median where healthy pairs spread
    3-10x) does not end a leaf that still fails: its values would rejoin the class's statistics and hide every
    other bad one."""
    return all(samples[n][0] > since for n in event.nodes if n in samples)


class SwitchFindings:
    """The judge's switch findings: which are active, which nodes' findings they hold, and the
    evidence. Not thread-safe on its own (the judge's lock covers it)."""

    def __init__(self) -> None:
        self.topology: Topology | None = None
        self.active: dict[tuple[str, str], FleetEvent] = {}
        """(switch, probe) → its active finding."""
        self.held: dict[tuple[str, str], FleetEvent] = {}
        """(node, probe) → the active finding holding the node's findings on the probe."""
        self.deficits: dict[tuple[str, str], float] = {}
        """(node, probe) → the relative shortfall of its latest flagged regular result (evidence only)."""
        self.group_flags: dict[tuple[str, str], tuple[str, ...]] = {}
        """(node, probe) → the other members of its latest regular result, when only that multi-node result
        flagged it (a partner of a node under a failing switch is flagged by it, not by itself)."""
        self._ended: list[FleetEvent] = []
        self.named_at: dict[tuple[str, str], float] = {}
        """(switch, probe) of a live finding → the last update whose test named it (``update``)."""

    def set_topology(self, topology: Topology | None, now: float) -> None:
        """A new topology (or none): findings on switches it no longer has end at the next update."""
        self.topology = topology
        for key, event in list(self.active.items()):
            if topology is None or key[0] not in topology.switches:
                self._ended.append(self._end(key, event, now, "the topology no longer has this switch"))
        self._index()

    def restore(self, events: Iterable[FleetEvent]) -> None:
        for e in events:
            if e.switch and e.active:
                self.active[(e.switch, e.probe)] = e
        self._index()

    def note(self, node: str, probe: str, findings: Sequence[Finding], *, own: bool = True,
             members: Sequence[str] = ()) -> None:
        """A regular result of ``node``: its findings (``own``: some are the node's own, not only the
        group's), and the run's ``members``."""
        if findings and not own and len(members) > 1:
            self.group_flags[(node, probe)] = tuple(m for m in members if m != node)
        else:
            self.group_flags.pop((node, probe), None)
        gap = shortfall(findings)
        if gap is None:
            self.deficits.pop((node, probe), None)
        else:
            self.deficits[(node, probe)] = gap

    @property
    def idle(self) -> bool:
        """No topology and nothing left to end: today's judgement exactly."""
        return self.topology is None and not self.active and not self._ended

    def holding(self, node: str, probe: str) -> FleetEvent | None:
        return self.held.get((node, probe))

    def explains(self, node: str, probe: str) -> bool:
        """Whether an active finding explains the node's latest flag: it holds the node, or the node was
        flagged only by a multi-node result with a node it holds."""
        members = self.group_flags.get((node, probe), ())
        return (node, probe) in self.held or any((m, probe) in self.held for m in members)

    def update(self, probes: Iterable[str], samples: Mapping[str, Mapping[str, Sample]],
               classes: Mapping[str, str], settings: SwitchSettings, now: float) -> tuple[list[FleetEvent], set[str]]:
        """Re-test ``probes`` (``samples``: probe → node → its latest regular result in the window).
        Returns the findings that started, changed or ended, and the nodes whose hold changed."""
        changes, moved = self._ended, set[str]()
        self._ended = []
        for e in changes:
            moved |= self._nodes(e)
        topo = self.topology
        if topo is None:
            self._index()
            return changes, moved
        for probe in sorted(set(probes)):
            current = {sw for sw, p in self.active if p == probe}
            checks = switch_checks(topo, probe, samples.get(probe, {}), classes, settings, active=frozenset(current),
                                   deficits={n: d for (n, p), d in self.deficits.items() if p == probe},
                                   partners={n: m for (n, p), m in self.group_flags.items() if p == probe})
            named = {c.switch: c for c in checks}
            for sw in sorted(current - set(named)):
                event = self.active[(sw, probe)]
                if not seen_again(event, samples.get(probe, {}), self.named_at.get((sw, probe), event.started_at)):
                    continue
                moved |= self._nodes(event)
                changes.append(self._end((sw, probe), event, now, "over"))
            for sw in named:
                self.named_at[(sw, probe)] = now
            for sw, c in sorted(named.items()):
                old = self.active.get((sw, probe))
                cls = ",".join(sorted({classes.get(n, "") for n in c.flagged}))
                event = FleetEvent(cls, probe, old.started_at if old else c.started_at, None, len(c.flagged),
                                   c.sampled, (), c.text(), sw, c.level, c.flagged, c.held)
                if old is None or (old.nodes, old.held) != (event.nodes, event.held):
                    moved |= self._nodes(event) | (self._nodes(old) if old else set())
                    self.active[(sw, probe)] = event
                    changes.append(event)
        self._index()
        return changes, moved

    def backdate(self, event: FleetEvent, at: float) -> FleetEvent:
        """``event`` (active) starting at ``at`` instead: findings of its nodes from then on are its."""
        key = (event.switch, event.probe)
        if self.active.get(key) is not event:
            return event
        self.active[key] = moved = replace(event, started_at=at)
        self._index()
        return moved

    def _end(self, key: tuple[str, str], event: FleetEvent, now: float, why: str) -> FleetEvent:
        del self.active[key]
        self.named_at.pop(key, None)
        return replace(event, ended_at=now, text=f"{event.text}; {why}")

    def _nodes(self, event: FleetEvent) -> set[str]:
        """The nodes ``event`` holds (or its flagged ones, without a topology)."""
        topo = self.topology
        if topo is None:
            return set(event.nodes)
        return {n for sw in event.held if sw in topo.switches for n in topo.nodes_under(sw)}

    def _index(self) -> None:
        self.held = {}
        if self.topology is None:
            return
        for (_, probe), event in sorted(self.active.items(), key=lambda kv: kv[1].level):
            for node in self._nodes(event):
                self.held[(node, probe)] = event
