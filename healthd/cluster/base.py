"""The seam between healthd and a cluster: the ``ClusterBackend`` protocol.

Implementations: ``local`` (this machine as a one-node cluster) and ``slurm`` (the Slurm CLI,
or pyslurm). Contract for every implementation:

- Every method either does what it says or raises ``BackendError`` (``SlurmError`` for Slurm).
  A backend error is infrastructure trouble: callers record it as ``error``, never as a node
  failure.
- ``submit`` does not wait for the probe to run; ``poll`` answers for all given jobs with one
  query to the cluster, never one per job.
- ``drain``/``undrain`` only act on nodes whose reason carries healthd's prefix or that have no
  drain; ownership checks live in ``healthd.remediation`` and are repeated here defensively.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Protocol, runtime_checkable

from healthd.model import JobStatus, Node, ProbeJob


@runtime_checkable
class ClusterBackend(Protocol):
    name: str

    def list_nodes(self) -> list[Node]:
        """All nodes with state, flags, partitions, GPUs, features and drain reason."""
        ...

    def submit(self, job: ProbeJob, result_path: Path) -> str:
        """Start ``job``; the probe writes its ``ProbeResult`` JSON to ``result_path``. Returns a job id."""
        ...

    def poll(self, job_ids: Sequence[str]) -> dict[str, JobStatus]:
        """Status of each job id known to the backend (ids it no longer knows are left out)."""
        ...

    def adopt(self) -> list[JobStatus]:
        """Jobs of healthd still known to the cluster (after a daemon restart)."""
        ...

    def cancel(self, job_ids: Sequence[str]) -> None:
        """Cancel the given jobs; unknown ids are ignored."""
        ...

    def drain(self, node: str, reason: str) -> None:
        """Drain ``node`` with ``reason`` (already prefixed with healthd's prefix)."""
        ...

    def undrain(self, node: str) -> None:
        """Undo a healthd drain of ``node``."""
        ...

    def close(self) -> None:
        """Stop whatever the backend runs itself (local subprocesses); Slurm jobs stay."""
        ...
