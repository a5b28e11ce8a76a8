"""Switches as a cause: nodes under one switch (a leaf, its uplink, a spine) flagged together beyond
chance are one switch finding (``healthd.judge.switches``), their nodes held, not drained.

Ranked after the class event (``RANK_SPINE``: spines and leaves, the nesting decided by
``switches.switch_checks``). A switch touches only what crosses the fabric: it never claims a by-node
pseudo-probe (passive signals, boundary checks), nor a switch-proof finding (a failed check, a missing
GPU); and a *fabric* finding (one whose flagged nodes were flagged on figures that cross the fabric: a
group's busbw, a link between nodes) never claims a node's own figures (its intra-node ``scope=node``
busbw, a GPU's GEMM): a node fault under a failing leaf or uplink is found while the switch's finding
lasts. A finding on node-level figures (a rack's power or cooling: every node's GEMM low) holds them.
While a finding lasts, the values of the nodes it holds (and of runs with one of them) leave the class's
statistics. A new recommendation waits while the leaf's other nodes have not been seen
(``rounds.leaf_hold``).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence

from healthd.judge.model import Finding, FleetEvent, GroupRecord, JudgeOutput, JudgeState
from healthd.judge.rounds import Hold, leaf_hold
from healthd.judge.sources.seam import RANK_SPINE, BaseCause, Context, Sample, Update
from healthd.judge.switches import SwitchFindings
from healthd.topology import Topology


def node_local(f: Finding) -> bool:
    """A figure of the node itself, which no fabric touches: intra-node (``scope=node``) or a GPU's own."""
    labels = f.key.label_dict
    return labels.get("scope") == "node" or "gpu" in labels


class Switches(BaseCause):
    """The switch findings (``switches.SwitchFindings``), driven by the judge's rounds."""

    name = "switch"
    rank = RANK_SPINE
    label = "switch findings"

    def __init__(self) -> None:
        self.findings = SwitchFindings()
        self.crossing: dict[tuple[str, str], bool] = {}
        """(node, probe) → whether its latest flagged regular result was flagged on a figure crossing the fabric."""
        self.fabric: set[tuple[str, str]] = set()
        """(switch, probe) of the live findings whose nodes were flagged on the fabric's figures."""

    def set_topology(self, topology: Topology | None, now: float) -> None:
        self.findings.set_topology(topology, now)

    def note(self, ctx: Context, node: str, probe: str, findings: Sequence[Finding], *, own: bool,
             members: Sequence[str]) -> None:
        self.findings.note(node, probe, findings, own=own, members=members)
        if findings:
            self.crossing[(node, probe)] = len(members) > 1 and any(not node_local(f) for f in findings)
        else:
            self.crossing.pop((node, probe), None)

    def update(self, ctx: Context, touched: set[tuple[str, str]], now: float, out: JudgeOutput) -> Update:
        sw = self.findings
        if sw.idle:
            return Update()
        probes = {p for _, p in touched} - ctx.by_node_probes
        cutoff = now - ctx.settings.fleet.event_window_s
        samples: dict[str, dict[str, Sample]] = defaultdict(dict)
        for (_, probe), sample in ctx.samples.items():
            if probe in probes:
                samples[probe].update((n, s) for n, s in sample.items() if s[0] >= cutoff and not (
                    s[1] and (n, probe) not in sw.held and sw.explains(n, probe)))
        changes, moved = sw.update(probes, samples, ctx.classes, ctx.settings.switch, now)
        changes = [self._backdated(ctx, e) for e in changes]
        out.switch_findings.extend(changes)
        self.fabric = {(e.switch, e.probe) for e in sw.active.values()
                       if any(self.crossing.get((n, e.probe)) for n in e.nodes)}
        keys = {e.probe for e in changes}
        return Update(touched={(n, p) for n, p in ctx.verdicts if p in keys and n in moved})

    def _backdated(self, ctx: Context, event: FleetEvent) -> FleetEvent:
        """A switch finding named while findings of nodes it holds wait for it (``rounds.leaf_hold``,
        ``rounds.event_hold``) starts when the first of them began: they are the switch's."""
        if event.ended_at is not None or not event.switch:
            return event
        starts = [float(ctx.verdicts[(n, p)].evidence.get("held_since") or event.started_at)
                  for n, p in ctx.held
                  if p == event.probe and (n, p) in ctx.verdicts and self.findings.holding(n, p) is event]
        earliest = min(starts, default=event.started_at)
        return self.findings.backdate(event, earliest) if earliest < event.started_at else event

    def holding(self, node: str, probe: str, cls: str) -> FleetEvent | None:
        return self.findings.held.get((node, probe)) if self.findings.held else None

    def explains(self, node: str, probe: str) -> bool:
        return bool(self.findings.held) and self.findings.explains(node, probe)

    def resists(self, f: Finding, event: FleetEvent | None = None) -> bool:
        return f.switch_proof or (event is not None and (event.switch, event.probe) in self.fabric and node_local(f))

    def leaves_out(self, probe: str) -> Callable[[str], bool] | None:
        held = self.findings.held
        if not held:
            return None
        return lambda node: (node, probe) in held

    def sets_aside(self, ctx: Context, record: GroupRecord) -> bool:
        held = self.findings.held
        if not held:
            return False
        events = (held.get((m, record.probe)) for m in record.members)
        return any(h is not None and record.at >= h.started_at for h in events)

    def hold(self, ctx: Context, node: str, probe: str, findings: Sequence[Finding], since: float,
             partners: set[str], now: float) -> Hold | None:
        """``rounds.leaf_hold`` for the node's leaf (none without a topology, or for a node under none)."""
        held = self.findings.held.get((node, probe))
        if findings and all(self.resists(f, held) for f in findings):
            return None
        topology = self.findings.topology
        leaf = topology.leaf_of.get(node) if topology is not None else None
        if topology is None or leaf is None:
            return None
        cutoff = now - ctx.settings.fleet.event_window_s
        mates = []
        for mate in sorted(topology.nodes_under(leaf) - partners - {node}):
            sample = ctx.samples.get((ctx.node_class(mate), probe), {}).get(mate)
            if sample is not None and sample[0] >= cutoff:
                mates.append((mate, sample[0], sample[1] and not self.findings.explains(mate, probe)))
        return leaf_hold(mates, since, now, min_nodes=ctx.settings.switch.min_nodes,
                         window_s=ctx.settings.fleet.event_window_s, switch=leaf)

    def restore(self, ctx: Context, state: JudgeState) -> None:
        self.findings.restore(e for e in state.events if e.switch and not e.cause)
