"""Every side effect on the cluster fenced by the action journal: ``FencedBackend`` wraps the daemon's backend.

The backend is the one door through which healthd changes the cluster: probe submissions (with the Slurm
backend's lift of its own drains in the recheck reservation), cancels (the collector's recovery included),
the restore of lifted drains when a run is forgotten, drains, undrains, the rewrite of adopted boundary-drain
reasons, reboots and repairs. Each of those calls is first recorded by ``Lease.record``; no row, no call:
``PolicyRefused`` (remediation records the action as refused; the collector's tick logs it). Reading calls
(``list_nodes``, ``poll``, ``adopt``, ``topology``) pass straight through, so a standby keeps its view. A
submitted job's runs go to the run registry (``Lease.register_runs``) as soon as the backend names the job.

A drain reason gets the epoch after the configured prefix (``healthd: [e42] …``): it still starts with the
prefix, so ownership (``Node.owned_by``), adopted boundary drains and ``repair failed`` reasons hold.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

from healthd.cluster.base import BackendTraits, ClusterBackend
from healthd.config import Settings
from healthd.errors import HaError, PolicyRefused
from healthd.ha.lease import SharedRun
from healthd.logging import get_logger
from healthd.model import JobStatus, Node, ProbeJob

log = get_logger("healthd.ha")

EPOCH_TAG = re.compile(r"^ ?\[e[0-9]+\]")
"""The epoch tag right after the prefix (``healthd: [e42] …``)."""

_FENCED_EXTRAS = frozenset({"start_reboot", "run_repair_command", "back_from_repair", "release_repair",
                            "take_over_drain"})
"""Backend methods beyond ``ClusterBackend`` that change the cluster (``RepairCapability``, ``DrainTakeover``)."""
_REASON_ARG = {"start_reboot": 1, "back_from_repair": 1, "take_over_drain": 2}
"""Where each of those takes the reason healthd writes (positional index)."""


class Recorder(Protocol):
    def record(self, verb: str, nodes: tuple[str, ...] = (), probe: str = "", detail: str = "") -> int | None: ...

    def register_runs(self, runs: Sequence[SharedRun]) -> None: ...


def tag_reason(reason: str, prefix: str, epoch: int) -> str:
    """``reason`` with ``[e<epoch>]`` after ``prefix`` (any tag already there replaced); a reason that does not
    start with ``prefix`` is returned as it is (the backend refuses it)."""
    if not reason.startswith(prefix):
        return reason
    rest = EPOCH_TAG.sub("", reason[len(prefix):], count=1)
    return f"{prefix} [e{epoch}]{rest if rest.startswith(' ') else ' ' + rest}".rstrip()


def reason_epoch(reason: str, prefix: str) -> int | None:
    """The epoch tag of a healthd drain reason, ``None`` when it has none."""
    if not reason.startswith(prefix):
        return None
    m = EPOCH_TAG.match(reason[len(prefix):])
    return int(m.group(0).strip(" []e")) if m else None


class FencedBackend:
    """``backend`` with each call that changes the cluster recorded in the journal first (module docstring)."""

    def __init__(self, backend: ClusterBackend, recorder: Recorder, reason_prefix: str) -> None:
        self.backend = backend
        self.recorder = recorder
        self.prefix = reason_prefix
        self.name = backend.name

    def _fence(self, verb: str, nodes: Sequence[str], probe: str = "", detail: str = "") -> int:
        epoch = self.recorder.record(verb, tuple(nodes), probe, detail)
        if epoch is None:
            raise PolicyRefused(f"not the leader: {verb} {','.join(nodes)} not taken (standby, or the lease is lost)")
        return epoch

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.backend, name)
        if name not in _FENCED_EXTRAS:
            return attr
        index = _REASON_ARG.get(name)

        def fenced(node: str, *args: Any) -> Any:
            epoch = self._fence(name, (node,), detail=" ".join(str(a) for a in args))
            if index is not None:
                args = tuple(tag_reason(a, self.prefix, epoch) if i == index - 1 else a for i, a in enumerate(args))
            return attr(node, *args)

        return fenced

    def traits(self, settings: Settings) -> BackendTraits:
        return self.backend.traits(settings)

    def list_nodes(self) -> list[Node]:
        return self.backend.list_nodes()

    def submit(self, job: ProbeJob, result_path: Path) -> str:
        probes = ",".join(dict.fromkeys(r.probe for r in job.runs))
        self._fence("submit", job.nodes, probes, " ".join(r.run_id for r in job.runs))
        job_id = self.backend.submit(job, result_path)
        at = time.time()
        try:  # the run registry: a new leader collects these runs (healthd.ha.runs)
            self.recorder.register_runs([SharedRun(r.run_id, r.probe, job.nodes, job.kind.value, job_id,
                                                   str(result_path.with_name(f"{r.run_id}.json")), at)
                                         for r in job.runs])
        except HaError as exc:
            log.warning("ha_run_not_registered", job_id=job_id, run_ids=[r.run_id for r in job.runs], error=str(exc))
        return job_id

    def poll(self, job_ids: Sequence[str]) -> dict[str, JobStatus]:
        return self.backend.poll(job_ids)

    def adopt(self) -> list[JobStatus]:
        return self.backend.adopt()

    def forget(self, job_ids: Sequence[str]) -> None:
        """Closing runs may restore drains lifted for them (Slurm): fenced. Refused, nothing is done (logged):
        the drains stay lifted inside healthd's recheck reservation, where no user job runs."""
        if job_ids and self.recorder.record("forget", (), "", ",".join(job_ids)) is None:
            log.warning("ha_refused", verb="forget", job_ids=list(job_ids), why="not the leader")
            return
        self.backend.forget(job_ids)

    def cancel(self, job_ids: Sequence[str]) -> None:
        """Fenced; refused, the jobs are left running (logged), as after a cancel that failed."""
        if self.recorder.record("cancel", (), "", ",".join(job_ids)) is None:
            log.warning("ha_refused", verb="cancel", job_ids=list(job_ids), why="not the leader")
            return
        self.backend.cancel(job_ids)

    def drain(self, node: str, reason: str) -> None:
        epoch = self._fence("drain", (node,), detail=reason)
        self.backend.drain(node, tag_reason(reason, self.prefix, epoch))

    def undrain(self, node: str) -> None:
        self._fence("undrain", (node,))
        self.backend.undrain(node)

    def close(self) -> None:
        self.backend.close()


def fenced(backend: ClusterBackend, recorder: Recorder | None, reason_prefix: str,
           wrap: Callable[[ClusterBackend, Recorder, str], ClusterBackend] | None = None) -> ClusterBackend:
    """``backend`` fenced by ``recorder``, or ``backend`` itself without one (``[ha] mode = "off"``)."""
    if recorder is None:
        return backend
    return (wrap or FencedBackend)(backend, recorder, reason_prefix)
