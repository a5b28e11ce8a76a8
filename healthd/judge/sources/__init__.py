"""The judge's evidence sources and causes, and their public registry.

``healthd.judge.engine.Judge`` keeps the state (series, marks, pools, verdicts) and the one confirmation
and conclusion stage; it names no source and no cause. It builds one of each registered here when it is
made, and calls them through the two seams of ``seam``:

- **sources** (``seam.Source``) turn evidence into typed ``Finding``s:

  - ``checks``: a failed run (its failed checks, a hard fault the collector attributed, ``hardfault``) and
    the NCCL transport check → ``check_failed``, ``gpus_missing``, ``hang``, ``crash``, ``cuda_error``,
    ``nccl_error``, ``nccl_transport``;
  - ``measurements``: a run's judged measurements (``series.select``) → below the class's floor, off the
    node's own baseline, outliers of the class's fleet and of the node's own GPUs;
  - ``passive``: a poll of the site's Prometheus (dcgm-exporter: XIDs, row remaps, ECC, throttling,
    health) → ``xid_79``, ``row_remap_failure``, ``ecc_dbe``, ... (hard faults confirmed by a re-probe or
    a repeat; hints never drain);
  - ``fabric``: the InfiniBand ports of the same poll (node_exporter's ``infiniband`` collector) →
    ``ib_link_down``, ``ib_symbol_errors``, ``ib_rcv_errors``, ... (a hint alone; ``degraded`` with the
    node's inter-node bandwidth low in the window) and ``ib_link_degraded`` (``degraded``);
  - ``throttle``: a power brake or hardware slowdown of the same poll held ``throttle_sustain_s`` on a busy
    GPU → ``throttle_power_brake`` / ``throttle_hw_slowdown``, ``degraded`` on that GPU.
  - ``pcie``: each GPU's PCIe link in the same poll → ``pcie_downtrained`` (a width below the maximum, or
    the generation while busy), ``degraded`` on that GPU.
    ``fabric``, ``throttle`` and ``pcie`` read the poll and answer ``False``, so they are registered before
    ``passive``, which takes it;
  - ``boundary``: the node check at job boundaries (its runs are judged like any; a re-probe asked for it
    runs the node's probes); ``fabric`` and ``pcie`` also read its InfiniBand ports and PCIe links, each
    boundary document like one poll of its node.

- **causes** (``seam.Cause``) claim the flagged values they can physically explain, asked in rank order
  (class event < spine < leaf < link < node < GPU):

  - ``events``: a class-wide fleet event (``fleet.check_event``);
  - ``declared``: a class-wide event an operator declared (``healthd event start``), by intent;
  - ``switch``: a switch's nodes flagged together beyond chance (``healthd.judge.switches``);
  - ``link``: the path between two nodes (``healthd.judge.links``).

Adding one is adding a module with a ``BaseSource`` or ``BaseCause`` subclass and registering its factory
here (or, for a test or a site's plug-in, with ``register_source`` / ``register_cause`` before the judge is
made).
"""

from __future__ import annotations

from healthd.judge.sources import (
    boundary,
    checks,
    declared,
    events,
    fabric,
    link,
    measurements,
    passive,
    pcie,
    switch,
    throttle,
)
from healthd.judge.sources.seam import (
    BaseCause,
    BaseSource,
    Cause,
    CauseFactory,
    Context,
    RunFindings,
    Source,
    SourceFactory,
)

__all__ = ["BaseCause", "BaseSource", "Cause", "Context", "RunFindings", "Source", "causes", "register_cause",
           "register_source", "sources", "unregister"]

_SOURCES: list[SourceFactory] = []
_CAUSES: list[CauseFactory] = []


def register_source(factory: SourceFactory) -> None:
    """A source every judge made from now on has (``factory()`` once per judge: its state is its own)."""
    if factory not in _SOURCES:
        _SOURCES.append(factory)


def register_cause(factory: CauseFactory) -> None:
    """A cause every judge made from now on has (``factory()`` once per judge)."""
    if factory not in _CAUSES:
        _CAUSES.append(factory)


def unregister(factory: SourceFactory | CauseFactory) -> None:
    """Forget a source or cause registered earlier (judges made before keep theirs)."""
    for registry in (_SOURCES, _CAUSES):
        if factory in registry:
            registry.remove(factory)  # type: ignore[arg-type]


def sources() -> list[Source]:
    """A new instance of each registered source, in registration order (the order runs are judged in)."""
    return [factory() for factory in _SOURCES]


def causes() -> list[Cause]:
    """A new instance of each registered cause, in rank order (the order they are asked in)."""
    return sorted((factory() for factory in _CAUSES), key=lambda c: c.rank)


for _source in (checks.Checks, measurements.Measurements, fabric.Fabric, throttle.Throttle, pcie.Pcie,
                passive.Passive, boundary.Boundary):
    register_source(_source)
for _cause in (events.ClassEvents, declared.Declared, switch.Switches, link.Links):
    register_cause(_cause)
