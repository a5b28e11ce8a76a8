"""The node check at job boundaries as a source: the collector stores each boundary document as a run of
the pseudo-probe ``boundary`` (its failed checks are ``checks``' findings); no planner runs it, so a re-probe
asked for it runs the node's single-node probes, and any judged run of the node answers it.

The check reports absolute values; what the daemon judges of them here:

- **Fabric Manager** (``fabric_state`` and ``fabric_status`` per GPU, read only on a node whose class is marked
  ``nvswitch = true``): a GPU whose fabric state is not completed (3) or whose status is not success (0) is a
  ``fail`` finding ``fabric_manager`` on that GPU (event- and switch-proof: the node's own state; without
  the fabric its GPUs cannot talk over NVLink).

- **NVSwitch errors** (SXid lines in the kernel log): a fatal one on an NVSwitch system is the check's own
  failed ``boundary.sxid`` (``checks``' ``check_failed``, a ``fail``; the check exits 1); a non-fatal one
  (``nvswitch_sxid_nonfatal``, the count since the node's previous check) is a hint: the node's probes are asked
  for once (``after_runs``), nothing else.

Its InfiniBand ports and PCIe links (``ib_port_*``, ``pcie_link_*``) are the ``fabric`` and ``pcie`` sources' to
judge (``healthd.judge.sources.fabric``, ``.pcie``), with the same codes as the Prometheus path's.
"""

from __future__ import annotations

from collections.abc import Sequence

from healthd.judge.model import Finding, JudgeOutput, ReasonCode, Request, RunInput, SeriesKey, Severity
from healthd.judge.sources.seam import BaseSource, Context, FleetCache, RunFindings, Selected

PROBE = "boundary"
"""The pseudo-probe of boundary checks (``healthd.coverage.BOUNDARY_PROBE``)."""
FABRIC_COMPLETED = 3.0
"""``NVML_GPU_FABRIC_STATE_COMPLETED``."""
FABRIC_STATES = {0.0: "not supported", 1.0: "not started", 2.0: "in progress", 3.0: "completed"}
SXID_HINT = "nvswitch_sxid_nonfatal"


def fabric_findings(run: RunInput, ev: RunFindings) -> None:
    """A ``fabric_manager`` finding per GPU whose fabric is not completed with success."""
    state: dict[tuple[str | None, str], float] = {}
    status: dict[tuple[str | None, str], float] = {}
    for m in run.measurements:
        if m.name in ("fabric_state", "fabric_status"):
            where = (m.node, m.labels.get("gpu", ""))
            (state if m.name == "fabric_state" else status)[where] = m.value
    for where in sorted(state, key=lambda w: (w[0] or "", w[1])):
        st, code = state[where], status.get(where, 0.0)
        if st == FABRIC_COMPLETED and code == 0.0:
            continue
        node, gpu = where
        uuid = run.gpu_uuids.get((node or (run.nodes[0] if run.nodes else ""), gpu))
        name = f"gpu {gpu}" + (f" ({uuid})" if uuid else "")
        detail = (f"{name}: fabric {FABRIC_STATES.get(st, f'state {st:g}')}, status {code:g} "
                  "(Fabric Manager not Completed/Success on an NVSwitch system)")
        key = SeriesKey.of(PROBE, "fabric_state", {"gpu": gpu} if gpu else {})
        f = Finding(ReasonCode.FABRIC_MANAGER, Severity.FAIL, key, st, FABRIC_COMPLETED, FABRIC_COMPLETED, detail,
                    event_proof=True, gpu_uuid=uuid, switch_proof=True)
        ev.place(run.nodes, node, f)


class Boundary(BaseSource):
    name = "boundary"
    by_node_probes = frozenset({PROBE})

    def judge_run(self, ctx: Context, run: RunInput, selected: Sequence[Selected], cache: FleetCache,
                  now: float, ev: RunFindings) -> None:
        if run.probe == PROBE:
            fabric_findings(run, ev)

    def after_runs(self, ctx: Context, judged: Sequence[RunInput], now: float, out: JudgeOutput) -> None:
        """A boundary document with non-fatal SXids asks once for a probe of its node (a hint: an NVSwitch error
        that costs the node anything shows in its NCCL figures)."""
        for run in judged:
            if run.probe != PROBE or len(run.nodes) != 1:
                continue
            count = sum(m.value for m in run.measurements if m.name == SXID_HINT)
            if count > 0:
                ctx.ask(Request("reprobe", PROBE, run.nodes, now,
                                f"hint: {count:g} non-fatal NVSwitch error(s) (SXid) at the node check {run.run_id}"),
                        out)
