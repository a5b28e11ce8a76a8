"""Findings of a failed run: its failed checks, a hard fault the collector attributed, the NCCL
transport check (pure).

A failed check is a ``fail`` finding on the node (or GPU) it names; the probes' own count of the GPUs
a node shows (``env.gpu_count``) is ``gpus_missing``. A hard fault (``healthd.judge.hardfault``: GPUs
missing, a hang, a crash, a CUDA or NCCL error) is a ``fail`` finding on the nodes it names, or on the
group; it is not event-proof: many nodes of a class failing the same way at once is a fleet event.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from healthd.judge.hardfault import HardFault, parse_reason
from healthd.judge.model import CheckInput, Finding, ReasonCode, RunInput, SeriesKey, Severity
from healthd.judge.sources.seam import BaseSource, Context, FleetCache, RunFindings, Selected
from healthd.model import Outcome

GPU_COUNT_CHECK = "env.gpu_count"
"""The probes' own check of the GPUs a node shows (``probes.env.gpu_count_checks``): ``gpus_missing``."""


def failed_run(run: RunInput, ev: RunFindings) -> None:
    """A ``fail`` run: its hard fault when the collector attributed one, else each failed check."""
    fault = parse_reason(run.reason) if not run.failed_checks else None
    if fault is not None:
        hard_fault(run, fault, ev)
        return
    checks = list(run.failed_checks) or [CheckInput(name="probe", detail=run.reason or "the probe failed")]
    for c in checks:
        labels = {"gpu": str(c.gpu)} if c.gpu is not None else {}
        if labels and c.gpu_uuid:
            labels["gpu_uuid"] = c.gpu_uuid
        key = SeriesKey.of(run.probe, f"check:{c.name}", labels)
        where = f"gpu {c.gpu}{f' ({c.gpu_uuid})' if c.gpu_uuid else ''} " if c.gpu is not None else ""
        missing = c.name == GPU_COUNT_CHECK
        f = Finding(ReasonCode.GPUS_MISSING if missing else ReasonCode.CHECK_FAILED, Severity.FAIL, key, 0.0,
                    1.0, 1.0, f"{where}check {c.name} failed: {c.detail}".strip(), event_proof=not missing,
                    switch_proof=True)
        ev.place(run.nodes, c.node, f)


def hard_fault(run: RunInput, fault: HardFault, ev: RunFindings) -> None:
    key = SeriesKey.of(run.probe, f"fault:{fault.code.value}", {})
    f = Finding(fault.code, Severity.FAIL, key, 0.0, 1.0, 1.0, f"{fault.code.value}: {fault.detail}",
                switch_proof=fault.code in (ReasonCode.GPUS_MISSING, ReasonCode.CUDA_ERROR))
    named = [n for n in fault.nodes if n in run.nodes]
    for node in named:
        ev.node_findings.setdefault(node, []).append(f)
    if not named:
        ev.place(run.nodes, None, f)


def transport(run: RunInput, ev: RunFindings) -> None:
    """The daemon-side transport check (``parsers.nccl_transport``) found NCCL on the wrong network:
    on the nodes it names (``... (on node2, node3)``), else on every node of the run."""
    if not (run.outcome is Outcome.DEGRADED and run.reason.startswith("nccl_transport:")):
        return
    named = re.search(r"\(on ([^)]*)\)\s*$", run.reason)
    nodes = [n.strip() for n in named.group(1).split(",")] if named else list(run.nodes)
    key = SeriesKey.of(run.probe, "check:nccl_transport", {})
    for node in (n for n in nodes if n in run.nodes):
        ev.node_findings.setdefault(node, []).append(
            Finding(ReasonCode.NCCL_TRANSPORT, Severity.DEGRADED, key, 0.0, 1.0, 1.0, run.reason,
                    switch_proof=True))


class Checks(BaseSource):
    """A failed run's checks and hard fault; the transport check of any other run."""

    name = "checks"

    def judge_run(self, ctx: Context, run: RunInput, selected: Sequence[Selected], cache: FleetCache,
                  now: float, ev: RunFindings) -> None:
        if run.outcome is Outcome.FAIL:
            failed_run(run, ev)
        else:
            transport(run, ev)
