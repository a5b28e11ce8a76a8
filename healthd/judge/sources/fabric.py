"""The InfiniBand ports as a source of the judge (pure): port errors, flaps and degraded links.

Reads the ``fabric`` part of a poll of the site's Prometheus (``healthd.passive.fabric``: node_exporter's
``infiniband`` collector, increases robust to resets, saturation, exporter restarts and boots). Its verdicts
are kept under the pseudo-probe ``fabric``; its codes are ``ib_link_down`` (a flap), ``ib_symbol_errors``,
``ib_rcv_errors``, ``ib_rcv_remote_physical_errors``, ``ib_link_error_recovery`` and ``ib_link_degraded``.

What each says, against ``[remediation] act_on`` (which acts on ``degraded`` by default):

- **port errors or a flap alone are a hint**: a ``pass`` verdict naming the port; never a recommendation.
  A port's counter only says the link had trouble; a node whose jobs run at full speed is not drained for it.
- **port errors or a flap with the node's inter-node bandwidth low in the same window** (a flagged
  multi-node result of the node, or a flagged finding of its own on a ``busbw`` series of a ``scope`` other
  than ``node``, within ``[judge.passive] window_s`` of the port's signal) are one ``degraded`` finding naming
  the port (``device``, ``port``), recommended: the port explains the slow runs. Low results a cause holds
  (a switch finding over the node's leaf, a class event) are the cause's: port errors on many nodes of one
  failing leaf stay hints, and the switch cause names the leaf.
- **a degraded link** (an active port whose rate is below its class's: the most common rate among the
  class's active ports in the poll) is ``degraded`` at once: a link trained at a lower rate is a cable or
  transceiver fault whatever the load.
- a counter at its saturation value is unknown: an ``error`` verdict (could not check; never drains) while
  the node has nothing else.

The node check at job boundaries reads the same ports from sysfs (``probes.links``) and reports absolute values;
each boundary document is read here like one poll of its node (``Fabric.boundary``, from ``after_runs``): the
increases since the node's previous document by the same ``FabricTracker`` (resets, saturation and boots
alike), its active ports' rates against the class's (from each node's latest document), and a port down now
that was active at an earlier check (``ib_link_degraded``: node_exporter's query sees active ports only). Its
findings are the same tracks, codes and verdicts as the Prometheus path's.

Each signal is followed as a ``PortTrack`` through the window (an event track ends when the window passed
without it; a degraded-link track when a poll covering the node shows the port at its class's rate again).
The source reads the poll and lets the passive source have it too (``observe`` answers ``False``).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Literal

from healthd.judge.model import FleetEvent, JudgeOutput, JudgeState, RecommendationCandidate, RunInput, SeriesKey
from healthd.judge.sources.boundary import PROBE as BOUNDARY_PROBE
from healthd.judge.sources.seam import BaseSource, Context, FleetCache, RunFindings, Selected
from healthd.model import Outcome, Verdict
from healthd.passive.fabric import (
    COUNTER_OF_CODE,
    PHYSICAL_STATES,
    FabricPoll,
    FabricTracker,
    PortLink,
    boundary_ports,
)
from healthd.passive.model import PassivePoll, Strength

__all__ = ["DEGRADED_LINK", "PROBE", "Fabric", "PortTrack", "busbw_low", "class_rates", "rail_key", "rail_switch"]

PROBE = "fabric"
"""The pseudo-probe of the InfiniBand ports' verdicts and recommendations."""
DEGRADED_LINK = "ib_link_degraded"
SATURATED = "ib_counter_saturated"
SIGNAL = "infiniband"

PortStage = Literal["hint", "confirmed"]


@dataclass(frozen=True, slots=True)
class PortTrack:
    """One signal (code) of one port, followed through the window. Shaped like the passive source's tracks
    where ``healthd_node_passive_signal`` reads them (``gpu`` and ``gpu_uuid`` empty, ``device`` and ``port``
    set)."""

    node: str
    device: str
    port: str
    code: str
    kind: Literal["event", "level"]
    detail: str
    first_at: float
    last_at: float
    seen: int = 1
    total: float = 0.0
    """Events: the counter's increase summed over the track; a degraded link: its rate."""
    corroborated: str = ""
    """What made it a finding: the low inter-node result (``run … at …``), or the rate for a degraded link."""
    rail: str = ""
    """On a multi-rail fabric, the rail switch whose signal this is (``leaf3:mlx5_2/1``): several nodes of one
    leaf show signals on this rail at once. Never a finding of the node."""

    gpu = None
    gpu_uuid = None
    signal = SIGNAL

    @property
    def strength(self) -> Strength:
        return Strength.FAULT if self.stage() == "confirmed" else Strength.HINT

    @property
    def key(self) -> tuple[str, str, str, str]:
        return self.node, self.code, self.device, self.port

    @property
    def summary(self) -> str:
        return f"{self.code.replace('_', ' ')} {self.device} port {self.port}"

    def stage(self) -> PortStage:
        return "confirmed" if not self.rail and (self.code == DEGRADED_LINK or self.corroborated) else "hint"


def class_rates(rates: Iterable[tuple[str, float]]) -> dict[str, float]:
    """Class → its ports' usual rate: the most common one (ties: the higher). A port below it is degraded."""
    counts: dict[str, Counter[float]] = defaultdict(Counter)
    for cls, rate in rates:
        counts[cls][rate] += 1
    return {cls: max(c.items(), key=lambda kv: (kv[1], kv[0]))[0] for cls, c in counts.items()}


def busbw_low(ctx: Context, node: str, since: float, probes: Iterable[str], *,
              port: tuple[str, str] | None = None,
              used: Mapping[str, Mapping[str, frozenset[tuple[str, str]]]] | None = None) -> str:
    """The node's inter-node bandwidth flagged since ``since`` on one of ``probes``: a flagged multi-node
    result it was in, or a flagged finding of its own on a ``busbw`` series whose ``scope`` is not ``node``;
    its words, or ``""``. ``port`` (device, port) with ``used`` (run id → node → the ports NCCL used there,
    ``RunInput.nics``): a run whose NCCL did not use that port on the node is not explained by it (a run whose
    ports are not known still is)."""
    def through(run_id: str) -> bool:
        nics = (used or {}).get(run_id, {}).get(node)
        return port is None or nics is None or port in nics

    found: list[tuple[float, str]] = []
    for probe in probes:
        if ctx.holding(node, probe) is not None:
            continue  # a cause (a switch, a class event) explains the node's low results: not its port's
        found += [(r.at, f"{probe} run {r.run_id} with {len(r.members)} nodes flagged ({r.code.value})")
                  for r in ctx.group_history.get((node, probe), ())
                  if r.flagged and r.at >= since and (not r.findings or any("busbw" in f.key.name for f in r.findings))
                  and through(r.run_id)]
        found += [(m.at, f"{probe} run {m.run_id}: inter-node busbw flagged ({m.code.value})")
                  for m in ctx.marks.get((node, probe), ())
                  if m.at >= since and m.raw_flagged and any(_inter_node_busbw(f.key) for f in m.findings)
                  and through(m.run_id)]
    best = max(found, default=None)
    return best[1] if best is not None else ""


def rail_switch(key: tuple[str, str, str]) -> str:
    """A rail's switch as its finding names it: ``leaf3:mlx5_2/1`` (the leaf of the topology, the rail's port)."""
    leaf, device, port = key
    return f"{leaf}:{device}/{port}"


def rail_key(switch: str) -> tuple[str, str, str] | None:
    """``leaf3:mlx5_2/1`` → ``("leaf3", "mlx5_2", "1")``; another switch's name: None."""
    leaf, sep, rest = switch.rpartition(":")
    device, sep2, port = rest.rpartition("/")
    return (leaf, device, port) if sep and sep2 and leaf and device and port else None


def _inter_node_busbw(key: SeriesKey) -> bool:
    return "busbw" in key.name and dict(key.labels).get("scope", "group") != "node"


class Fabric(BaseSource):
    """The port tracks followed, (node, code, device, port) → track, and their verdicts under ``PROBE``."""

    name = "fabric"
    by_node_probes = frozenset({PROBE})

    def __init__(self) -> None:
        self.tracks: dict[tuple[str, str, str, str], PortTrack] = {}
        self.saturated: dict[str, tuple[tuple[str, str, str], ...]] = {}
        self.tracker = FabricTracker()
        """The references of the boundary documents' counters (the Prometheus path keeps its own)."""
        self.boundary_links: dict[str, tuple[PortLink, ...]] = {}
        """Node → its active ports at its latest boundary document."""
        self.class_rates: dict[str, Counter[float]] = {}
        """Class → how many active ports of its nodes' latest boundary documents have each rate (the most common
        one, ties: the higher, is the class's: ``class_rates``'s rule, kept up to date per document)."""
        self.active_seen: set[tuple[str, str, str]] = set()
        """(node, device, port) seen active at a boundary document: down later, it is a degraded link."""
        self.nics: dict[str, tuple[float, Mapping[str, frozenset[tuple[str, str]]]]] = {}
        """Run id → (when, node → the InfiniBand ports its NCCL used there), for the window."""
        self.rails: dict[tuple[str, str, str], FleetEvent] = {}
        """(leaf, device, port) → the live switch finding of a rail (multi-rail fabrics)."""

    def judge_run(self, ctx: Context, run: RunInput, selected: Sequence[Selected], cache: FleetCache,
                  now: float, ev: RunFindings) -> None:
        """Keeps which ports each run's NCCL used (``RunInput.nics``): a port fault explains only those runs."""
        if run.nics:
            self.nics[run.run_id] = (run.at, run.nics)

    def signals(self) -> list[PortTrack]:
        """The port tracks followed now (``healthd_node_passive_signal`` with ``device`` and ``port``)."""
        return sorted(self.tracks.values(), key=lambda t: t.key)

    def observe(self, ctx: Context, document: object, now: float, out: JudgeOutput) -> bool:
        """The ``fabric`` part of a poll; ``False`` always: the poll is the passive source's too."""
        if not isinstance(document, PassivePoll) or document.fabric is None:
            return False
        fabric = document.fabric
        known = set(ctx.classes)
        window = ctx.settings.passive.window_s
        touched = self._events(fabric, known, window)
        touched |= self._links(ctx, fabric, known, now)
        touched |= self._saturation(fabric, known)
        touched |= self._expire(now, window)
        self._conclude_nodes(ctx, touched, now, out)
        return False

    def after_runs(self, ctx: Context, judged: Sequence[RunInput], now: float, out: JudgeOutput) -> None:
        """The round's boundary documents are read like polls of their node (``boundary``); a round's runs may
        show the node's inter-node bandwidth low: its port hints become findings."""
        touched: set[str] = set()
        for run in judged:
            if run.probe == BOUNDARY_PROBE and len(run.nodes) == 1:
                touched |= self.boundary(ctx, run)
        followed = {t.node for t in self.tracks.values()}
        nodes = {n for run in judged for n in run.nodes if n in followed}
        window = ctx.settings.passive.window_s
        for run_id in [r for r, (at, _) in self.nics.items() if now - at > 2 * window]:
            del self.nics[run_id]
        self._conclude_nodes(ctx, nodes | touched | self._expire(now, window), now, out)

    def boundary(self, ctx: Context, run: RunInput) -> set[str]:
        """One boundary document's InfiniBand ports (``healthd.passive.fabric.boundary_ports``): its counters'
        increases since the node's previous document (the same ``FabricTracker`` rules as the Prometheus
        path: resets, saturation, boots), its ports' rates against the class's (the latest document of each
        node of the class), and a port down now that was active at an earlier check; the nodes touched."""
        node = run.nodes[0]
        known = set(ctx.classes)
        if known and node not in known:
            return set()
        ports = boundary_ports(node, ((m.name, m.value, m.labels) for m in run.measurements
                                      if m.node in (None, node)))
        if ports is None:
            return set()
        poll = self.tracker.observe(ports.answers, run.at)
        cls = ctx.node_class(node)
        counts = self.class_rates.setdefault(cls, Counter())
        counts.subtract(p.rate for p in self.boundary_links.get(node, ()))
        counts.update(p.rate for p in poll.links)
        self.boundary_links[node] = poll.links
        self.active_seen |= {(node, p.device, p.port) for p in poll.links}
        down = [p for p in ports.down if (node, p.device, p.port) in self.active_seen]
        live = [(n, rate) for rate, n in counts.items() if n > 0]
        usual = {cls: max(live)[1]} if live else {}
        touched = self._events(poll, known, ctx.settings.passive.window_s)
        touched |= self._links(ctx, poll, known, run.at, usual=usual, down=down)
        return touched | self._saturation(poll, known, nodes={node})

    def _events(self, fabric: FabricPoll, known: set[str], window: float) -> set[str]:
        touched: set[str] = set()
        for sig in fabric.signals:
            if known and sig.node not in known:
                continue
            key = (sig.node, sig.code, sig.device, sig.port)
            old = self.tracks.get(key)
            if old is None or sig.at - old.last_at > window:
                self.tracks[key] = PortTrack(sig.node, sig.device, sig.port, sig.code, "event", sig.detail, sig.at,
                                             sig.at, 1, sig.increase)
            elif sig.at > old.last_at:
                self.tracks[key] = replace(old, last_at=sig.at, seen=old.seen + 1, total=old.total + sig.increase,
                                           detail=sig.detail)
            touched.add(sig.node)
        return touched

    def _links(self, ctx: Context, fabric: FabricPoll, known: set[str], now: float, *,
               usual: Mapping[str, float] | None = None, down: Sequence[PortLink] = ()) -> set[str]:
        """Degraded-link tracks of the poll's active ports below their class's rate (``usual``: class → rate,
        default the poll's own most common rate per class) and of ``down`` ports (a boundary document's: down
        now, active at an earlier check). A track of a covered node not low any more ends; one of a down port
        only where the poll sees down ports (``usual`` given: a boundary document), since node_exporter's query
        reads active ports only."""
        if "links" in fabric.failed:
            return set()
        links = [p for p in fabric.links if not known or p.node in known]
        sees_down = usual is not None
        if usual is None:
            usual = class_rates((ctx.node_class(p.node), p.rate) for p in links)
        low: dict[tuple[str, str, str, str], tuple[PortLink, str, str]] = {}
        for p in links:
            rate = usual.get(ctx.node_class(p.node), p.rate)
            if p.rate < rate:
                low[(p.node, DEGRADED_LINK, p.device, p.port)] = (
                    p, f"{p.device} port {p.port} trained at {p.rate * 8 / 1e9:g} Gb/s, below its class's "
                       f"{rate * 8 / 1e9:g} Gb/s", f"rate {p.rate:g} B/s < {rate:g} B/s")
        for p in down:
            if not known or p.node in known:
                phys = PHYSICAL_STATES.get(p.physical_state or 0.0, f"{p.physical_state or 0:g}")
                low[(p.node, DEGRADED_LINK, p.device, p.port)] = (
                    p, f"{p.device} port {p.port} is down (physical state {phys}), active at an earlier check",
                    "port down")
        touched: set[str] = set()
        for key, (p, detail, why) in low.items():
            old = self.tracks.get(key)
            if old is None:
                self.tracks[key] = PortTrack(p.node, p.device, p.port, DEGRADED_LINK, "level", detail, now, now, 1,
                                             p.rate, why)
                touched.add(p.node)
            else:
                self.tracks[key] = replace(old, last_at=now, seen=old.seen + 1, detail=detail, total=p.rate)
                touched |= {p.node} if old.total != p.rate else set()
        for key, t in list(self.tracks.items()):
            if t.code == DEGRADED_LINK and key not in low and t.node in fabric.covered and (t.total > 0 or sees_down):
                del self.tracks[key]
                touched.add(t.node)
        return touched

    def _saturation(self, fabric: FabricPoll, known: set[str], nodes: Collection[str] | None = None) -> set[str]:
        """The saturated counters of the poll's nodes (``nodes``: only these, a boundary document's node)."""
        if "counters" in fabric.failed:
            return set()
        now: dict[str, tuple[tuple[str, str, str], ...]] = defaultdict(tuple)
        for node, device, port, counter in fabric.saturated:
            if not known or node in known:
                now[node] += ((device, port, counter),)
        scope = set(now) | set(self.saturated) if nodes is None else set(nodes)
        changed = {n for n in scope if now.get(n) != self.saturated.get(n)}
        for n in scope:
            if now.get(n):
                self.saturated[n] = now[n]
            else:
                self.saturated.pop(n, None)
        return changed

    def _expire(self, now: float, window: float) -> set[str]:
        gone = [k for k, t in self.tracks.items() if t.kind == "event" and now - t.last_at > window]
        for k in gone:
            del self.tracks[k]
        return {k[0] for k in gone}

    def _conclude_nodes(self, ctx: Context, nodes: set[str], now: float, out: JudgeOutput) -> None:
        by_node: dict[str, list[PortTrack]] = defaultdict(list)
        for t in self.tracks.values():
            by_node[t.node].append(t)
        window = ctx.settings.passive.window_s
        probes = {p for (_, p) in ctx.group_history} if any(t.kind == "event" for t in self.tracks.values()) \
            else set()
        nodes = nodes | self._rails(ctx, now, out)
        used = {run_id: nics for run_id, (_, nics) in self.nics.items()}
        for node in sorted(nodes):
            tracks = [self.tracks[t.key] for t in by_node.get(node, [])]
            for t in tracks:
                if t.kind == "event" and not t.corroborated and not t.rail:
                    low = busbw_low(ctx, node, t.first_at - window, probes, port=(t.device, t.port), used=used)
                    if low:
                        self.tracks[t.key] = replace(t, corroborated=low)
            self._conclude(ctx, node, [self.tracks[t.key] for t in tracks], now, out)

    def _rails(self, ctx: Context, now: float, out: JudgeOutput) -> set[str]:
        """On a multi-rail fabric (``[judge.passive] multi_rail``, with a topology): the port tracks of
        ``[judge.switch] min_nodes`` or more nodes of one leaf on one rail (the same device and port) are that
        rail's switch's: their tracks name it (a hint, never a finding of the node) and one switch finding names
        the rail (``leaf3:mlx5_2/1``, pseudo-probe ``fabric``) while it lasts. The nodes whose tracks changed."""
        topology = ctx.topology
        groups: dict[tuple[str, str, str], set[str]] = defaultdict(set)
        if ctx.settings.passive.multi_rail and topology is not None:
            for t in self.tracks.values():
                leaf = topology.leaf_of.get(t.node)
                if leaf is not None:
                    groups[(leaf, t.device, t.port)].add(t.node)
        live = {k: v for k, v in groups.items() if len(v) >= ctx.settings.switch.min_nodes}
        touched: set[str] = set()
        for key in sorted(set(self.rails) - set(live)):
            gone = self.rails.pop(key)
            out.switch_findings.append(replace(gone, ended_at=now, text=f"{gone.text} (ended)"))
            touched |= set(gone.nodes)
        for key, members in sorted(live.items()):
            leaf, device, port = key
            under = topology.nodes_under(leaf) if topology is not None and leaf in topology.switches \
                else frozenset(members)
            old = self.rails.get(key)
            if old is None or set(old.nodes) != members:
                names = ", ".join(sorted(members)[:8]) + (", ..." if len(members) > 8 else "")
                codes = tuple(sorted({t.code for t in self.tracks.values() if (t.node, t.device, t.port) in
                                      {(n, device, port) for n in members}}))
                event = FleetEvent(
                    ctx.node_class(min(members)), PROBE, old.started_at if old else now, None, len(members),
                    len(under), codes,
                    f"rail {device}/{port} of {leaf}: InfiniBand port signals ({', '.join(codes)}) on {len(members)} "
                    f"of its {len(under)} nodes at once ({names}): that rail's leaf switch or its cabling, not the "
                    "nodes", rail_switch(key), 0, tuple(sorted(members)), (leaf,), PROBE)
                self.rails[key] = event
                if old is None:
                    out.switch_findings.append(event)
                touched |= members ^ set(old.nodes if old else ())
        for k, t in list(self.tracks.items()):
            leaf = topology.leaf_of.get(t.node) if topology is not None else None
            rail = rail_switch((leaf, t.device, t.port)) if leaf is not None and (leaf, t.device, t.port) in live \
                else ""
            if rail != t.rail:
                self.tracks[k] = replace(t, rail=rail, corroborated="" if rail else t.corroborated)
                touched.add(t.node)
        return touched

    def _conclude(self, ctx: Context, node: str, tracks: list[PortTrack], now: float, out: JudgeOutput) -> None:
        old = ctx.verdicts.get((node, PROBE))
        if not tracks and node not in self.saturated and old is None:
            return
        live = sorted(tracks, key=lambda t: (t.stage() == "confirmed", t.code == DEGRADED_LINK, t.last_at),
                      reverse=True)
        top = live[0] if live else None
        more = f" (and {len(live) - 1} more port signal{'s' if len(live) > 2 else ''})" if len(live) > 1 else ""
        recommend = False
        if top is not None and top.stage() == "confirmed":
            outcome, code = Outcome.DEGRADED, top.code
            why = "" if top.code == DEGRADED_LINK else f", with the node's inter-node bandwidth low: {top.corroborated}"
            text = f"{top.detail}{why}{more}"
            recommend = True
        elif top is not None and top.rail:
            outcome, code = Outcome.PASS, top.code
            text = (f"port hint: {top.detail}{more}; the switch's: rail {top.rail} shows port signals on several "
                    "of its nodes at once (a switch finding names it)")
        elif top is not None:
            outcome, code = Outcome.PASS, top.code
            text = (f"port hint: {top.detail}{more}; the node's inter-node bandwidth is not low in the window "
                    "(port errors alone never drain)")
        elif node in self.saturated:
            dev, port, counter = self.saturated[node][0]
            outcome, code = Outcome.ERROR, SATURATED
            text = f"{counter} of {dev} port {port} is at its saturation value: new errors cannot be seen (unknown)"
        else:
            outcome, code, text = Outcome.PASS, "ok", "no InfiniBand port signal in the window"
        ev = evidence(top)
        at = top.last_at if top is not None else now
        verdict = Verdict(node, PROBE, outcome, text, code, (), ev, at)
        out.evaluated.add((node, PROBE))
        ctx.set_verdict(verdict, out)
        if recommend and top is not None:
            out.recommendations.append(RecommendationCandidate(node, PROBE, outcome, code, text,
                                                               {"run_ids": [], "summary": top.summary, **ev}, at))

    def restore(self, ctx: Context, state: JudgeState) -> None:
        for verdict in state.verdicts:
            if verdict.probe == PROBE and verdict.evidence:
                track = restore(verdict.node, verdict.reason_code, verdict.evidence)
                if track is not None:
                    self.tracks[track.key] = track
                    if track.code == DEGRADED_LINK:
                        self.active_seen.add((track.node, track.device, track.port))
        for event in state.events:
            if event.cause == PROBE and event.active and (key := rail_key(event.switch)) is not None:
                self.rails[key] = event


def evidence(t: PortTrack | None) -> dict[str, float | str]:
    """A verdict's flat evidence: enough to rebuild its top track after a restart (``restore``)."""
    if t is None:
        return {}
    out: dict[str, float | str] = {
        "source": PROBE, "signal": SIGNAL, "device": t.device, "port": t.port, "kind": t.kind,
        "summary": t.summary, "first_at": t.first_at, "last_at": t.last_at, "seen": float(t.seen),
        "total": t.total, "detail": t.detail[:300], "stage": t.stage(),
    }
    if t.code in COUNTER_OF_CODE:
        out["counter"] = COUNTER_OF_CODE[t.code]
    if t.corroborated:
        out["corroborated"] = t.corroborated[:300]
    if t.rail:
        out["rail"] = t.rail
    return out


def restore(node: str, code: str, ev: Mapping[str, float | str]) -> PortTrack | None:
    try:
        return PortTrack(node, str(ev["device"]), str(ev["port"]), code,
                         "level" if ev.get("kind") == "level" else "event", str(ev.get("detail", code)),
                         float(ev["first_at"]), float(ev["last_at"]), int(float(ev.get("seen", 1))),
                         float(ev.get("total", 0.0)), str(ev.get("corroborated", "")), str(ev.get("rail", "")))
    except (KeyError, ValueError, TypeError):
        return None
