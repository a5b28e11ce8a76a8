"""The passive source's typed output: what one poll of the site's Prometheus says, per node and GPU.

``healthd.passive.source`` produces a ``PassivePoll`` per tick; the judge
(``healthd.judge.sources.passive``) turns its signals into findings. Nothing here does I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Literal

from healthd.passive.fabric import FabricPoll
from healthd.passive.pcie import PcieLink

SignalName = Literal[
    "xid",
    "row_remap_failure",
    "row_remap_pending",
    "uncorrectable_remapped_rows",
    "ecc_dbe",
    "pcie_replay",
    "nvlink_errors",
    "throttle",
    "health",
]
"""The signals healthd reads (each one a query overridable in ``[passive.queries]``)."""

SIGNALS: tuple[SignalName, ...] = (
    "xid", "row_remap_failure", "row_remap_pending", "uncorrectable_remapped_rows", "ecc_dbe",
    "pcie_replay", "nvlink_errors", "throttle", "health",
)


class Strength(StrEnum):
    """What a firing signal means for its node."""

    FAULT = "fault"
    """Hard: a ``fail`` finding, confirmed by a re-probe failing or the signal repeating."""
    HINT = "hint"
    """Soft: raises the node's priority for a probe and annotates its verdict; never drains."""
    IGNORED = "ignored"
    """An application's error (XID 13, 31, 43, 45): never counted against the node (kept for display)."""


@dataclass(frozen=True, slots=True)
class PassiveSignal:
    """One signal firing on one node (and GPU) in one poll.

    Events (an XID value that changed, a counter that increased) fire in the poll that sees the change;
    levels (a row-remap failure, a pending remap, a health status of warn/fail, throttling) fire in every
    poll while they hold. A value present before healthd's first poll is a baseline, never an event (the
    XID gauge keeps the last XID forever: dcgm-exporter#500).
    """

    node: str
    signal: SignalName
    code: str
    """The reason code: ``xid_79``, ``row_remap_failure``, ``ecc_dbe``, ``throttle_thermal``, ..."""
    strength: Strength
    at: float
    value: float
    kind: Literal["event", "level"]
    gpu: str | None = None
    gpu_uuid: str | None = None
    detail: str = ""
    """For people: ``xid 79 (GPU has fallen off the bus) on gpu 3 (GPU-…)``."""


@dataclass(frozen=True, slots=True)
class PassivePoll:
    """One poll of every signal's query."""

    at: float
    up: bool
    """False: Prometheus did not answer (or answered garbage) for every query: nothing is known."""
    signals: tuple[PassiveSignal, ...] = ()
    covered: frozenset[str] = frozenset()
    """Nodes with at least one series of any signal: the sample a fleet-wide passive event is judged on."""
    unavailable: tuple[SignalName, ...] = ()
    """Signals the site does not export (no series at all): shown as unavailable, never as healthy."""
    errors: tuple[str, ...] = ()
    """One line per query that failed (timeout, HTTP error, bad JSON, too large, non-numeric values)."""
    unknown_series: int = 0
    """Series naming a host that maps to no known node: counted and ignored."""
    failed: tuple[SignalName, ...] = field(default=())
    """Signals whose query failed in this poll (their state is unknown, not healthy)."""
    busy: Mapping[tuple[str, str], tuple[bool, str]] | None = None
    """(node, GPU UUID or index) → busy, and its words (``[passive.activity]``; ``None``: off or its query
    failed: every GPU's activity unknown). Read by ``healthd.judge.sources.throttle``."""
    pcie: tuple[PcieLink, ...] | None = None
    """Each GPU's PCIe link (``[passive.pcie]``; ``None``: off or its query failed). Read by
    ``healthd.judge.sources.pcie``."""
    fabric: FabricPoll | None = None
    """The InfiniBand ports (``[passive.fabric]``; ``None``: off), judged by ``healthd.judge.sources.fabric``."""
