"""InfiniBand ports from node_exporter's ``infiniband`` collector, read through the site's Prometheus (pure).

node_exporter exports per ``device`` (``mlx5_0``) and ``port`` (``1``) the HCA's port counters as
``node_infiniband_<counter>_total`` and the link as ``node_infiniband_rate_bytes_per_second``,
``node_infiniband_state_id`` (4: active) and ``node_infiniband_physical_state_id`` (5: link up); the node is
named only by Prometheus's ``instance`` (``host:port``, ``healthd.passive.names``). A ``FabricTracker`` keeps
the previous value of each port counter and is given each poll's answers (``FabricAnswers``):

- **Increases, robust to resets and exporter restarts.** An increase is the new value minus the reference.
  A value below the reference is a reset (the counters cleared, the HCA reset): no increase, the new value
  is the reference. A port whose series are absent while its node answered (the default query asks only
  for counters above 0: ``> 0``) is at 0: the reference becomes 0, so the next rise counts. A node that did
  not answer (node_exporter restarting, scrape failed) keeps its references: nothing is invented, nothing
  is lost.
- **Saturation is unknown, not healthy.** The IB port counters stop at their width: 16 bits (65535) for
  symbol errors and receive errors, 8 bits (255) for link-downed and link-error-recovery. A counter at its
  saturation value says nothing about new errors: the port is reported ``saturated`` (its state unknown)
  until the counter is cleared, and no increase is made of it.
- **Missing is unavailable, not healthy.** A counter some node's node_exporter does not export (an older
  release; a counter the driver lacks) is listed per node as ``unavailable``.
- **A boot is not a flap.** A node whose ``node_boot_time_seconds`` changed since the last poll (it booted,
  healthd's reboot included) resets its references and makes no event of its ``link_downed`` in that poll.

The same tracker computes the increases between the node check's documents at job boundaries (``probes.links``
reads sysfs: ``boundary_answers`` makes one document the answers of one poll of its node), so resets,
saturation and boots are treated once, the same way, whichever path the counters came by.

The links: each active port's rate (``rate_bytes_per_second`` and its physical state) is a reading; whether
a rate is below the class's is the judge's to say (``healthd.judge.sources.fabric``), since only it knows
classes.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from healthd.passive.names import Located

PREFIX = "node_infiniband_"

COUNTERS: dict[str, tuple[str, float, str]] = {
    "link_downed": ("ib_link_down", 255.0, "link down events (flaps)"),
    "symbol_error": ("ib_symbol_errors", 65535.0, "symbol errors"),
    "port_errors_received": ("ib_rcv_errors", 65535.0, "receive errors"),
    "port_receive_remote_physical_errors": ("ib_rcv_remote_physical_errors", 65535.0,
                                            "received packets marked bad by the remote (EBP)"),
    "link_error_recovery": ("ib_link_error_recovery", 255.0, "link error recoveries"),
}
"""The port counters judged (node_exporter's name without ``node_infiniband_`` and ``_total``): the code of
their signal, the value at which the 8- or 16-bit PMA counter saturates, and their words."""

COUNTER_OF_CODE = {code: counter for counter, (code, _, _) in COUNTERS.items()}

SYSFS_COUNTERS: dict[str, str] = {
    "link_downed": "link_downed", "symbol_error": "symbol_error", "port_rcv_errors": "port_errors_received",
    "port_rcv_remote_physical_errors": "port_receive_remote_physical_errors",
    "link_error_recovery": "link_error_recovery",
}
"""The kernel's counter name (``/sys/class/infiniband/*/ports/*/counters/``) → node_exporter's, for those judged
(node_exporter's ``infiniband`` collector renames two)."""

PHYSICAL_STATES = {1.0: "Sleep", 2.0: "Polling", 3.0: "Disabled", 4.0: "PortConfigurationTraining", 5.0: "LinkUp",
                   6.0: "LinkErrorRecovery", 7.0: "Phy Test"}
PORT_STATES = {1.0: "DOWN", 2.0: "INIT", 3.0: "ARMED", 4.0: "ACTIVE", 5.0: "ACTIVE_DEFER"}

STATE_ACTIVE = 4.0
"""``state_id`` 4: the port is active (1 down, 2 init, 3 armed)."""
PHYS_LINK_UP = 5.0
"""``physical_state_id`` 5: link up (2 polling, 3 disabled, 6 link error recovery)."""

PortKey = tuple[str, str, str]
"""(node, device, port)."""


def counter_of(metric: str) -> str | None:
    """``node_infiniband_symbol_error_total`` → ``symbol_error``; a metric healthd does not judge: None."""
    name = metric.removeprefix(PREFIX).removesuffix("_total")
    return name if metric.startswith(PREFIX) and name in COUNTERS else None


@dataclass(frozen=True, slots=True)
class PortSignal:
    """A port counter that increased between two polls (an event of its port)."""

    node: str
    device: str
    port: str
    counter: str
    code: str
    at: float
    increase: float
    value: float

    @property
    def detail(self) -> str:
        words = COUNTERS[self.counter][2]
        return (f"{self.increase:g} {words} on {self.device} port {self.port} "
                f"({self.value - self.increase:g} → {self.value:g})")


@dataclass(frozen=True, slots=True)
class PortLink:
    """An active port's link as its node reports it now."""

    node: str
    device: str
    port: str
    rate: float
    """``rate_bytes_per_second`` (NDR 4x: 50e9)."""
    physical_state: float | None = None


@dataclass(frozen=True, slots=True)
class FabricAnswers:
    """One poll's answers of the fabric queries, placed on known nodes (``healthd.passive.names.locate``).
    ``None``: that query failed (its part unknown this poll)."""

    counters: Sequence[Located] | None
    """``node_infiniband_<counter>_total`` series above 0 (``__name__``, ``device``, ``port``)."""
    present: Sequence[Located] | None
    """One series per node and counter it exports (label ``counter``: ``link_downed``, ...)."""
    links: Sequence[Located] | None
    """``rate_bytes_per_second`` of the active ports (``device``, ``port``)."""
    physical: Sequence[Located] | None = None
    """``physical_state_id`` of the same ports (optional)."""
    boot: Sequence[Located] | None = None
    """``node_boot_time_seconds`` per node."""


@dataclass(frozen=True, slots=True)
class FabricPoll:
    """What one poll says of the InfiniBand ports."""

    signals: tuple[PortSignal, ...] = ()
    links: tuple[PortLink, ...] = ()
    covered: frozenset[str] = frozenset()
    """Nodes whose node_exporter exports InfiniBand series (a port's absence there means 0)."""
    saturated: tuple[tuple[str, str, str, str], ...] = ()
    """(node, device, port, counter) at its saturation value: unknown, not healthy."""
    unavailable: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    """Node → the judged counters its node_exporter does not export (covered nodes only)."""
    booted: frozenset[str] = frozenset()
    """Nodes that booted since the previous poll (their link-downed rise is no flap)."""
    failed: tuple[str, ...] = ()
    """The parts whose query failed in this poll (``counters``, ``present``, ``links``)."""


@dataclass
class FabricTracker:
    """The references of every port counter and each node's boot time, between polls."""

    _refs: dict[str, dict[tuple[str, str, str], float]] = field(default_factory=dict)
    """Node → (device, port, counter) → the reference (per node: a boundary document touches its node's only)."""
    _boot: dict[str, float] = field(default_factory=dict)
    _covered_before: frozenset[str] = frozenset()
    """Nodes covered at the previous poll: a counter first seen above 0 on one of them rose from 0."""

    def forget(self, nodes: Collection[str]) -> None:
        gone = set(nodes)
        for node in gone & set(self._refs):
            del self._refs[node]
        for node in gone & set(self._boot):
            del self._boot[node]

    def observe(self, answers: FabricAnswers, at: float) -> FabricPoll:
        failed = tuple(name for name, part in (("counters", answers.counters), ("present", answers.present),
                                                ("links", answers.links)) if part is None)
        present: dict[str, set[str]] = {}
        for s in answers.present or ():
            present.setdefault(s.node, set()).add(s.labels.get("counter", ""))
        covered = frozenset(present) | frozenset(s.node for s in answers.links or ())
        booted = self._boots(answers.boot or ())
        signals: list[PortSignal] = []
        saturated: list[tuple[str, str, str, str]] = []
        if answers.counters is not None:
            seen: set[tuple[str, str, str, str]] = set()
            for s in answers.counters:
                counter = counter_of(s.labels.get("__name__", ""))
                device, port = s.labels.get("device", ""), s.labels.get("port", "")
                if counter is None or not device:
                    continue
                key = (s.node, device, port, counter)
                seen.add(key)
                code, saturation, _ = COUNTERS[counter]
                if s.value >= saturation:
                    saturated.append(key)
                    self._refs.setdefault(s.node, {})[key[1:]] = s.value
                    continue
                refs = self._refs.setdefault(s.node, {})
                before = refs.get(key[1:])
                refs[key[1:]] = s.value
                if s.node in booted or (before is None and s.node not in self._covered_before):
                    continue
                base = 0.0 if before is None else before
                if s.value > base and base < saturation:
                    signals.append(PortSignal(s.node, device, port, counter, code, at, s.value - base, s.value))
            if answers.present is not None:
                for node in covered & set(self._refs):
                    refs = self._refs[node]
                    for ref in refs:
                        if (node, *ref) not in seen:
                            refs[ref] = 0.0  # absent from the "> 0" answer while its node answered: at 0
        self._covered_before = covered if answers.present is not None else self._covered_before | covered
        unavailable = {node: tuple(c for c in COUNTERS if c not in have)
                       for node, have in present.items() if any(c not in have for c in COUNTERS)}
        physical = {(s.node, s.labels.get("device", ""), s.labels.get("port", "")): s.value
                    for s in answers.physical or ()}
        links = tuple(sorted(
            (PortLink(s.node, s.labels.get("device", ""), s.labels.get("port", ""), s.value,
                      physical.get((s.node, s.labels.get("device", ""), s.labels.get("port", ""))))
             for s in answers.links or () if s.labels.get("device")),
            key=lambda p: (p.node, p.device, p.port)))
        return FabricPoll(tuple(signals), links, covered, tuple(sorted(saturated)), unavailable, booted, failed)

    def _boots(self, boot: Iterable[Located]) -> frozenset[str]:
        booted: set[str] = set()
        for s in boot:
            before = self._boot.get(s.node)
            self._boot[s.node] = s.value
            if before is not None and abs(s.value - before) > 1.0:
                booted.add(s.node)
        return frozenset(booted)


Reading = tuple[str, float, Mapping[str, str]]
"""A boundary document's measurement: (name, value, labels)."""


@dataclass(frozen=True, slots=True)
class BoundaryPorts:
    """The InfiniBand part of one boundary document (``probes.links``) of one node."""

    answers: FabricAnswers
    """As one poll's answers of that node: ``FabricTracker.observe`` computes its increases."""
    down: tuple[PortLink, ...]
    """Ports not active (``state`` other than 4), with rate 0 and their physical state."""
    states: Mapping[tuple[str, str], float]
    """(device, port) → its ``state``."""


def boundary_ports(node: str, readings: Iterable[Reading]) -> BoundaryPorts | None:
    """The ``ib_port_*`` and ``boot_time_seconds`` measurements of one boundary document; ``None`` when it read no
    InfiniBand port (an older check, a node without HCAs)."""
    counters: list[Located] = []
    present: set[str] = set()
    state: dict[tuple[str, str], float] = {}
    phys: dict[tuple[str, str], float] = {}
    rate: dict[tuple[str, str], float] = {}
    boot: list[Located] = []
    for name, value, labels in readings:
        where = (labels.get("device", ""), labels.get("port", ""))
        if name == "boot_time_seconds":
            boot.append(Located(node, None, None, {}, value))
        elif not where[0]:
            continue
        elif name == "ib_port_counter" and (counter := SYSFS_COUNTERS.get(labels.get("counter", ""))):
            present.add(counter)
            counters.append(Located(node, None, None, {"__name__": f"{PREFIX}{counter}_total", "device": where[0],
                                                       "port": where[1]}, value))
        elif name == "ib_port_state":
            state[where] = value
        elif name == "ib_port_phys_state":
            phys[where] = value
        elif name == "ib_port_rate_bytes_per_second":
            rate[where] = value
    if not counters and not state:
        return None
    labels_of = {w: {"device": w[0], "port": w[1]} for w in state}
    active = [w for w in sorted(state) if state[w] == STATE_ACTIVE]
    answers = FabricAnswers(
        counters, [Located(node, None, None, {"counter": c}, 1.0) for c in sorted(present)],
        [Located(node, None, None, labels_of[w], rate[w]) for w in active if w in rate],
        [Located(node, None, None, labels_of[w], phys[w]) for w in active if w in phys], boot)
    down = tuple(PortLink(node, w[0], w[1], 0.0, phys.get(w)) for w in sorted(state) if state[w] != STATE_ACTIVE)
    return BoundaryPorts(answers, down, state)
