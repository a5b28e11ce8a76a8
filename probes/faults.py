"""Test-only fault injection: ``HEALTHD_PROBE_FAULT=<kind>:<rank>[,<kind>:<rank>...]``; ``<kind>@<node>``
hits the first rank (local rank 0) on that node, so one job-wide setting faults one node of a
multi-node job, whatever its rank order (as a TaskProlog delivering it to that node would).

Kinds:

- ``corrupt:<rank>``: the rank damages its own result data after the measured operation and
  before validation (nccl: a few elements of the received buffer; gemm: one output element;
  ddp: one parameter), so the probe must report wrong data and outcome ``fail``.
- ``hang:<rank>``: the rank stops (sleeps) when the measurement phase starts, as a stuck GPU
  or collective would; the probe must end within ``--timeout`` naming the rank.
- ``crash:<rank>``: the rank exits abruptly (``os._exit``, no cleanup, no report) when the
  measurement phase starts.
- ``slow_link:<rank>``: the ``pipeline`` probe delays each timed send of that rank to its ``next``
  neighbour in the ring (``probes.pipeline.SLOW_LINK_DELAY_S``), as a slow link would: that one link
  (one direction) must be named the slowest, the others not. ``corrupt`` in the ``pipeline`` probe
  perturbs the rank's stage output in the gradient-checked step by the same relative size at every stage
  position (``probes.pipeline.CORRUPT_RELATIVE``; ``HEALTHD_PROBE_CORRUPT_RELATIVE`` sets another, for
  ``bench/pipeline_corrupt.py``).
- ``slow:<rank>``: the ``nccl`` probe's rank waits, before each timed collective of a group that spans
  several nodes, ``SLOW_FACTOR`` times that collective's own duration (the median of its warmup ops,
  one untimed op when there is no warmup; a node's own groups are not slowed; several slowed ranks of
  one group wait at once, so the drop is the same), as a degraded NIC, link or leaf switch
  would make it: the busbw of every multi-node job including that rank drops to ``1 / (1 +
  SLOW_FACTOR)`` (a tenth: -90%, a link fallen to a tenth of its speed; beyond the run-to-run spread
  of gloo pairs on a shared CPU host) whatever its partners; the data stays right (outcome ``pass``,
  a low figure for the judge).
- ``raise:<rank>``: the probe body raises ``RuntimeError`` on that rank when the measurement
  phase starts (as a bug in a probe would): the probe's outcome is ``error``.

``HEALTHD_PROBE_FAULT_PROBES=<probe>[,<probe>...]`` limits the faults to those probes' parts of a
``python -m probes check`` (unset: every probe of the check is faulted).

This exists so tests can exercise the failure paths with real processes. It is never set
by the daemon.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Literal, get_args

FAULT_ENV = "HEALTHD_PROBE_FAULT"
FAULT_PROBES_ENV = "HEALTHD_PROBE_FAULT_PROBES"
CRASH_EXIT_CODE = 86
SLOW_FACTOR = 9.0
"""``slow``: the wait before each timed collective, in units of that collective's own duration."""

FaultKind = Literal["corrupt", "hang", "crash", "raise", "slow_link", "slow"]


@dataclass(frozen=True)
class Fault:
    kind: FaultKind
    rank: int | None
    node: str | None = None


def parse_faults(spec: str | None) -> tuple[Fault, ...]:
    """Parse the fault specification; raises ``ValueError`` on anything malformed."""
    if not spec or not spec.strip():
        return ()
    faults: list[Fault] = []
    for item in spec.split(","):
        if "@" in item:
            kind, _, node = item.strip().partition("@")
            if kind not in get_args(FaultKind) or not node:
                raise ValueError(f"{FAULT_ENV}: expected '<kind>@<node>' with kind in {get_args(FaultKind)}, "
                                 f"got {item!r}")
            faults.append(Fault(kind=kind, rank=None, node=node))  # type: ignore[arg-type]
            continue
        kind, sep, rank = item.strip().partition(":")
        if not sep or kind not in get_args(FaultKind) or not rank.isdigit():
            raise ValueError(f"{FAULT_ENV}: expected '<kind>:<rank>' with kind in {get_args(FaultKind)}, got {item!r}")
        faults.append(Fault(kind=kind, rank=int(rank)))  # type: ignore[arg-type]
    return tuple(faults)


def active_faults(rank: int, environ: dict[str, str] | None = None, *, node: str | None = None,
                  local_rank: int = 0) -> frozenset[FaultKind]:
    """The fault kinds injected into ``rank`` (the ``local_rank`` of its ``node``)."""
    env = os.environ if environ is None else environ
    return frozenset(f.kind for f in parse_faults(env.get(FAULT_ENV))
                     if f.rank == rank or (f.node is not None and f.node == node and local_rank == 0))


def faults_apply_to(probe: str, environ: dict[str, str] | None = None) -> bool:
    """Whether the injected faults hit ``probe``'s part of a check (``HEALTHD_PROBE_FAULT_PROBES``)."""
    env = os.environ if environ is None else environ
    names = [n.strip() for n in env.get(FAULT_PROBES_ENV, "").split(",") if n.strip()]
    return not names or probe in names
