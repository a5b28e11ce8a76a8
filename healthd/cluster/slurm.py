"""The Slurm backend: probe runs are ordinary batch jobs on idle nodes.

Everything Slurm-specific in how commands are called and read lives in the ``SlurmClient``
(``slurm_cli``); this module turns probe jobs into batch scripts (``healthd.jobs``), finds its
own jobs again by name prefix, derives node classes, and guards drains: it never drains a node
that is already drained for a reason it did not set, and only undrains its own drains.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from healthd.cluster.slurm_cli import SlurmCli, SlurmClient
from healthd.config import NodeClassRule, Settings
from healthd.errors import PolicyRefused, SlurmError
from healthd.jobs import LaunchSettings, render_batch_script
from healthd.logging import get_logger
from healthd.model import JobStatus, Node, ProbeJob, validate_node_name

log = get_logger(__name__)


def node_class(node: Node, rules: Sequence[NodeClassRule]) -> str:
    """The hardware class of ``node`` (pure): the first matching rule, else ``<gpu type>x<count>``
    (``gpux8`` when the type is unknown), else ``cpu``."""
    for rule in rules:
        if rule.gpu_type is not None and rule.gpu_type != node.gpu_type:
            continue
        if rule.gpus is not None and rule.gpus != node.gpus:
            continue
        if rule.partition is not None and rule.partition not in node.partitions:
            continue
        if not set(rule.features) <= set(node.features):
            continue
        return rule.name
    if node.gpus:
        return f"{node.gpu_type or 'gpu'}x{node.gpus}"
    return "cpu"


def owned_by_healthd(node: Node, prefix: str) -> bool:
    return bool(node.reason) and str(node.reason).startswith(prefix)


class SlurmBackend:
    name = "slurm"

    def __init__(
        self,
        client: SlurmClient,
        launch: LaunchSettings,
        *,
        reason_prefix: str = "healthd:",
        node_classes: Sequence[NodeClassRule] = (),
        ranks_per_node: int | None = None,
    ) -> None:
        self.client = client
        self.launch = launch
        self.reason_prefix = reason_prefix
        self.node_classes = tuple(node_classes)
        self.ranks_per_node = ranks_per_node
        self._gpus: dict[str, int] = {}

    @classmethod
    def from_settings(cls, settings: Settings) -> SlurmBackend:
        s = settings.slurm
        client = SlurmCli(bin_dir=s.bin_dir, timeout_s=s.command_timeout_s)
        launch = LaunchSettings(
            python=s.python,
            results_dir=settings.results_dir,
            job_name_prefix=s.job_name_prefix,
            partition=s.partition,
            qos=s.qos,
            account=s.account,
            reservation=s.reservation,
            extra_sbatch_args=tuple(s.extra_sbatch_args),
            pending_timeout_s=s.pending_timeout_s,
        )
        return cls(client, launch, reason_prefix=settings.remediation.reason_prefix, node_classes=s.node_classes)

    def list_nodes(self) -> list[Node]:
        nodes = [replace(n, node_class=node_class(n, self.node_classes)) for n in self.client.nodes()]
        self._gpus = {n.name: n.gpus for n in nodes}
        return nodes

    def submit(self, job: ProbeJob, result_path: Path) -> str:
        if result_path != self.launch.results_dir / f"{job.run_id}.json":
            raise SlurmError(f"result path {result_path} is not in the shared results directory")
        gpus = min((self._gpus.get(n, 0) for n in job.nodes), default=0)
        ranks = job.ranks_per_node or self.ranks_per_node or max(gpus, 1)
        script = render_batch_script(job, self.launch, ranks_per_node=ranks, gpus_per_node=gpus)
        path = self.launch.results_dir / f"{job.run_id}.sbatch"
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(script)
        except OSError as exc:
            raise SlurmError(f"cannot write the batch script {path}: {exc}") from None
        return self.client.submit(path)

    def _ours(self) -> list[JobStatus]:
        return [
            j
            for j in self.client.jobs(self.launch.job_name_prefix)
            if j.name and j.name.startswith(self.launch.job_name_prefix)
        ]

    def poll(self, job_ids: Sequence[str]) -> dict[str, JobStatus]:
        wanted = set(job_ids)
        return {j.job_id: j for j in self._ours() if j.job_id in wanted}

    def adopt(self) -> list[JobStatus]:
        return self._ours()

    def cancel(self, job_ids: Sequence[str]) -> None:
        if job_ids:
            self.client.cancel(list(job_ids))

    def _node(self, name: str) -> Node:
        return self.client.node(validate_node_name(name))

    def drain(self, node: str, reason: str) -> None:
        if not reason.startswith(self.reason_prefix):
            raise PolicyRefused(f"drain reason must start with {self.reason_prefix!r}")
        current = self._node(node)
        if (current.drained or current.reason) and not owned_by_healthd(current, self.reason_prefix):
            raise PolicyRefused(f"{node} is already drained by someone else (reason: {current.reason!r})")
        self.client.drain(node, reason)

    def undrain(self, node: str) -> None:
        current = self._node(node)
        if not current.drained:
            raise PolicyRefused(f"{node} is not drained")
        if not owned_by_healthd(current, self.reason_prefix):
            raise PolicyRefused(f"{node} was drained by someone else (reason: {current.reason!r}); not undraining")
        self.client.undrain(node)

    def close(self) -> None:
        pass
