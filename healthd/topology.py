"""The cluster's network topology (pure): switches or blocks and the nodes under them.

What Slurm's topology plugins describe (``scontrol show topology``; topology.conf / topology.yaml),
reduced to what healthd judges with: which nodes share a leaf switch (or a block), and which
switches sit above it. Built by :func:`build_topology` from parsed records; parsers
(``healthd/parsers/topology.py``) and the readers that fetch the text live elsewhere.

A tree: every node sits under exactly one leaf switch (level 0 in Slurm's numbering); a switch
names its child switches; a spine's nodes are the union of its children's. A block topology
(``topology/block``): every block is a leaf of its own, without parents. Invalid input (a node
under two leaves, a loop, a child switch nobody defines, a switch without nodes or children) is a
:class:`~healthd.errors.TopologyError` naming the cause; the daemon then goes on without topology.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from healthd.errors import TopologyError

TopologyKind = Literal["tree", "block"]


@dataclass(frozen=True)
class SwitchRecord:
    """One parsed line: ``SwitchName=s1 Level=0 Nodes=n[1-4] Switches=...`` or ``BlockName=b1 Nodes=...``.

    ``nodes`` and ``switches`` are expanded names (hostlists already expanded by the parser)."""

    name: str
    nodes: tuple[str, ...] = ()
    switches: tuple[str, ...] = ()
    level: int | None = None
    link_speed: int | None = None


@dataclass(frozen=True)
class Switch:
    name: str
    level: int
    """0 for a leaf (or a block); a parent's level is one more than its highest child's."""
    nodes: frozenset[str]
    """Every node under this switch, directly or through its children."""
    children: tuple[str, ...] = ()
    parent: str | None = None


@dataclass(frozen=True)
class Topology:
    kind: TopologyKind
    switches: Mapping[str, Switch]
    leaf_of: Mapping[str, str] = field(repr=False)
    """Each node's leaf switch (or block)."""
    source: str = ""
    """Where it came from, for the log and ``/healthz``: ``scontrol show topology``, a file's path."""

    def path(self, node: str) -> tuple[str, ...]:
        """The switches from the node's leaf up to the root (empty for a node outside the topology)."""
        out: list[str] = []
        name = self.leaf_of.get(node)
        while name is not None:
            out.append(name)
            name = self.switches[name].parent
        return tuple(out)

    def nodes_under(self, switch: str) -> frozenset[str]:
        return self.switches[switch].nodes

    def leaves(self) -> list[Switch]:
        return [s for s in self.switches.values() if s.level == 0]

    def same_leaf(self, a: str, b: str) -> bool:
        leaf = self.leaf_of.get(a)
        return leaf is not None and leaf == self.leaf_of.get(b)

    def restricted(self, nodes: Iterable[str]) -> Topology:
        """The same switches, counting only ``nodes`` (the cluster's current node list)."""
        keep = frozenset(nodes)
        switches = {name: Switch(s.name, s.level, s.nodes & keep, s.children, s.parent)
                     for name, s in self.switches.items()}
        return Topology(self.kind, switches, {n: leaf for n, leaf in self.leaf_of.items() if n in keep}, self.source)


def build_topology(records: Sequence[SwitchRecord], kind: TopologyKind, *, source: str = "") -> Topology:
    """A :class:`Topology` from parsed records.

    :raises TopologyError: a node under two leaves, a switch defined twice, a child nobody defines,
        a switch under two parents, a loop, a switch with neither nodes nor children, no records.
    """
    if not records:
        raise TopologyError(f"{source or 'topology'}: no switches or blocks")
    by_name: dict[str, SwitchRecord] = {}
    for r in records:
        if r.name in by_name:
            raise TopologyError(f"{source or 'topology'}: {r.name!r} defined twice")
        if kind == "block" and r.switches:
            raise TopologyError(f"{source or 'topology'}: block {r.name!r} names switches")
        if not r.nodes and not r.switches:
            raise TopologyError(f"{source or 'topology'}: {r.name!r} has neither nodes nor switches")
        by_name[r.name] = r
    parent: dict[str, str] = {}
    for r in records:
        for child in r.switches:
            if child not in by_name:
                raise TopologyError(f"{source or 'topology'}: {r.name!r} names switch {child!r}, which is not defined")
            if child in parent:
                raise TopologyError(f"{source or 'topology'}: switch {child!r} is under both "
                                    f"{parent[child]!r} and {r.name!r}")
            parent[child] = r.name
    leaf_of: dict[str, str] = {}
    for r in records:
        for node in r.nodes:
            if node in leaf_of and leaf_of[node] != r.name:
                raise TopologyError(f"{source or 'topology'}: node {node!r} is under both "
                                    f"{leaf_of[node]!r} and {r.name!r}")
            leaf_of[node] = r.name

    levels: dict[str, int] = {}
    nodes: dict[str, frozenset[str]] = {}

    def visit(name: str, trail: tuple[str, ...]) -> None:
        if name in levels:
            return
        if name in trail:
            raise TopologyError(f"{source or 'topology'}: a loop through {' -> '.join((*trail, name))}")
        r = by_name[name]
        for child in r.switches:
            visit(child, (*trail, name))
        levels[name] = max((levels[c] + 1 for c in r.switches), default=0)
        nodes[name] = frozenset(r.nodes).union(*(nodes[c] for c in r.switches))

    for name in by_name:
        visit(name, ())
    switches = {name: Switch(name, levels[name], nodes[name], r.switches, parent.get(name))
                for name, r in by_name.items()}
    return Topology(kind, switches, leaf_of, source)


def describe(topology: Topology | None) -> str:
    """One line for the log and ``/healthz``."""
    if topology is None:
        return "no topology: switch correlation off (findings are judged per node and per class)"
    leaves = topology.leaves()
    return (f"topology/{topology.kind} from {topology.source or 'config'}: {len(topology.switches)} "
            f"{'blocks' if topology.kind == 'block' else 'switches'}, {len(leaves)} leaves, "
            f"{len(topology.leaf_of)} nodes")


def nodes_by_leaf(topology: Topology, nodes: Iterable[str]) -> Mapping[str, tuple[str, ...]]:
    """``nodes`` grouped by their leaf (nodes outside the topology left out), in name order."""
    out: dict[str, list[str]] = {}
    for node in sorted(nodes):
        leaf = topology.leaf_of.get(node)
        if leaf is not None:
            out.setdefault(leaf, []).append(node)
    return {leaf: tuple(ns) for leaf, ns in out.items()}
