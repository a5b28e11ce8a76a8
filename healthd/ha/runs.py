"""The run registry: a new leader collects the runs an earlier leader submitted.

Each instance keeps its own store, so the runs a leader submitted are in its store only. ``FencedBackend``
puts each submitted run in ``healthd_runs`` as soon as the backend names its job; the leader, at each plan
and collect tick, takes the open runs it does not have into its own store (the collector then polls their
jobs and reads their result files from the shared results directory, as for its own) and marks those its
store has finished as closed. The runs it took count against the planner's in-flight cap like its own.

``sync_runs`` does the I/O through narrow Protocols.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from healthd.ha.lease import SharedRun
from healthd.logging import get_logger
from healthd.model import RunKind
from healthd.store.rows import RunRow

log = get_logger("healthd.ha")


class Registry(Protocol):
    def open_runs(self) -> list[SharedRun]: ...

    def close_runs(self, run_ids: Sequence[str]) -> None: ...


class Runs(Protocol):
    def run(self, run_id: str) -> RunRow | None: ...

    def add_run(self, *, run_id: str, probe: str, nodes: Sequence[str], backend: str, job_id: str | None,
                submitted_at: float, result_path: str | None, source: str = "probe",
                kind: RunKind = RunKind.PROBE) -> None: ...


def sync_runs(registry: Registry, store: Runs, backend: str) -> tuple[list[str], list[str]]:
    """Take the registry's open runs this store lacks as submitted runs; close in the registry those this
    store has finished. Returns (run ids taken, run ids closed)."""
    taken: list[str] = []
    closed: list[str] = []
    for r in registry.open_runs():
        local = store.run(r.run_id)
        if local is None:
            kind = RunKind(r.kind) if r.kind in {k.value for k in RunKind} else RunKind.PROBE
            store.add_run(run_id=r.run_id, probe=r.probe, nodes=r.nodes, backend=backend, job_id=r.job_id,
                          submitted_at=r.submitted_at, result_path=r.result_path, kind=kind)
            taken.append(r.run_id)
            log.info("ha_run_taken_over", run_id=r.run_id, probe=r.probe, job_id=r.job_id, nodes=list(r.nodes))
        elif local.state == "finished":
            closed.append(r.run_id)
    registry.close_runs(closed)
    return taken, closed
