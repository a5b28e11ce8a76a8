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
- What the daemon does differently per backend comes from :meth:`ClusterBackend.traits`, never
  from ``name`` (a label value only).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import ParamSpec, Protocol, TypeVar, runtime_checkable

from healthd.config import Settings
from healthd.errors import BackendError
from healthd.model import JobStatus, Node, ProbeJob
from healthd.topology import Topology

_P = ParamSpec("_P")
_T = TypeVar("_T")


@dataclass(frozen=True)
class BackendTraits:
    """What a backend imposes on the daemon around it.

    :param max_jobs_in_flight: probe jobs the planner may have submitted and unfinished at once.
    :param max_idle_share: share of the idle nodes the planner may take at once.
    :param partitions: only nodes in these partitions are probed (empty: all).
    :param controller: the backend talks to a controller whose reachability is exported as
        ``healthd_slurm_up`` (1 after a call that worked, 0 after a ``BackendError``).
    :param probes_in_daemon: probes run inside the daemon and die with it (:meth:`ClusterBackend.close`
        cancels them), so one more collect on stop records how they ended.
    :param runs_jobs_on_drained: a re-probe (``RunKind.REPROBE``) of one of healthd's own drains runs
        (the local backend runs anything; Slurm lifts the drain inside healthd's recheck reservation),
        so healthd's own drains can be probed on demand.
    """

    max_jobs_in_flight: int
    max_idle_share: float = 1.0
    partitions: frozenset[str] = frozenset()
    controller: bool = False
    probes_in_daemon: bool = False
    runs_jobs_on_drained: bool = False


@runtime_checkable
class ClusterBackend(Protocol):
    name: str
    """A label value (metrics, stored runs, logs); behaviour comes from :meth:`traits`."""

    def traits(self, settings: Settings) -> BackendTraits:
        """This backend's limits and capabilities under ``settings`` (pure; asked again after a reload)."""
        ...

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

    def forget(self, job_ids: Sequence[str]) -> None:
        """The collector has closed these jobs: drop what is cached about them (a no-op where nothing is)."""
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


@runtime_checkable
class TopologySource(Protocol):
    """A backend that can tell the cluster's network topology (Slurm's topology plugin). A backend
    without this method has none of its own (``[topology] file`` may still give one)."""

    def topology(self, name: str | None = None) -> Topology | None:
        """The topology (``name``: one of several, Slurm 25.05+), or ``None`` when the cluster has none.

        :raises TopologyError: the cluster's answer is no usable topology.
        :raises BackendError: the cluster did not answer.
        """
        ...


class ObservedBackend:
    """``backend`` with the outcome of every call that reaches the cluster reported to ``observe``:
    ``False`` when it raised ``BackendError``, ``True`` when it returned. Other errors (a refused
    drain, a bad config) say nothing about the cluster and are not reported."""

    def __init__(self, backend: ClusterBackend, observe: Callable[[bool], None]) -> None:
        self.backend = backend
        self.observe = observe
        self.name = backend.name

    def _call(self, fn: Callable[_P, _T], *args: _P.args, **kwargs: _P.kwargs) -> _T:
        try:
            result = fn(*args, **kwargs)
        except BackendError:
            self.observe(False)
            raise
        self.observe(True)
        return result

    def traits(self, settings: Settings) -> BackendTraits:
        return self.backend.traits(settings)

    def list_nodes(self) -> list[Node]:
        return self._call(self.backend.list_nodes)

    def submit(self, job: ProbeJob, result_path: Path) -> str:
        return self._call(self.backend.submit, job, result_path)

    def poll(self, job_ids: Sequence[str]) -> dict[str, JobStatus]:
        return self._call(self.backend.poll, job_ids)

    def adopt(self) -> list[JobStatus]:
        return self._call(self.backend.adopt)

    def forget(self, job_ids: Sequence[str]) -> None:
        self.backend.forget(job_ids)

    def cancel(self, job_ids: Sequence[str]) -> None:
        self._call(self.backend.cancel, job_ids)

    def drain(self, node: str, reason: str) -> None:
        self._call(self.backend.drain, node, reason)

    def undrain(self, node: str) -> None:
        self._call(self.backend.undrain, node)

    def topology(self, name: str | None = None) -> Topology | None:
        if not isinstance(self.backend, TopologySource):
            return None
        return self._call(self.backend.topology, name)

    def close(self) -> None:
        self.backend.close()
