"""The Slurm backend: probe runs are ordinary batch jobs on idle nodes.

Everything Slurm-specific in how commands are called and read lives in the ``SlurmClient``
(``slurm_cli``); this module turns probe jobs into batch scripts (``healthd.jobs``), finds its
own jobs again by name prefix, derives node classes, and guards drains: it never drains a node
that is already drained for a reason it did not set, and only undrains its own drains.

Rechecks of healthd's own drains (``remediation.recheck_drained``): Slurm starts no job on a drained
node, reservation or not. So a re-probe of a node that healthd drained first puts the job's nodes into
healthd's own reservation (``slurm.recheck_reservation``: for healthd's user alone, so no other job can
start there), then lifts the drain and submits the probe with ``--reservation``. When the collector
has closed the job (``forget``) the node is drained again with its old reason and leaves the
reservation (deleted once empty); remediation then undrains it after ``undrain_after_passes``. What was
lifted is written to ``<run_id>.lift.json`` in the results directory first, so a restarted daemon
restores it (``adopt``). Nodes drained by anyone else and reservations of other names are never touched.

Per job it picks the launch environment and, for the ``nccl`` probe, the expected NCCL network
(``--expect-transport``, judged by the daemon after parsing): a node class's setting overrides
the probe's (:class:`LaunchChoices`).
"""

from __future__ import annotations

import json
import os
import pwd
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import probes
from healthd.cluster.base import BackendTraits
from healthd.cluster.slurm_cli import SlurmCli, SlurmClient
from healthd.config import LauncherSettings, NodeClassRule, Settings
from healthd.errors import BackendError, CommandTimeout, HealthdError, PolicyRefused, SlurmError
from healthd.image import recorded_digest
from healthd.jobs import Launcher, LaunchSettings, render_batch_script, run_id_from_job_name
from healthd.logging import get_logger
from healthd.model import JobStatus, Node, ProbeJob, RunKind, validate_node_name
from healthd.node_class import classed
from healthd.process import run as run_command
from healthd.topology import Topology
from probes.catalogue import probe_spec

log = get_logger(__name__)


EXPECT_TRANSPORT_OPTION = "--expect-transport"


def probes_package_dir() -> Path:
    """This daemon's ``probes`` package: what a container launcher mounts unless the image has it."""
    return Path(probes.__file__).resolve().parent


def launcher_from_settings(settings: LauncherSettings, probes_dir: Path) -> Launcher:
    container = settings.kind != "bare"
    return Launcher(
        kind=settings.kind,
        image=settings.image,
        mounts=tuple(settings.mounts),
        args=tuple(settings.args),
        python=settings.python,
        runtime=settings.runtime,
        probes_dir=probes_dir if container and settings.probes_from == "daemon" else None,
        devices=tuple(settings.devices),
        image_digest=recorded_digest(settings.image) if settings.image else None,
    )


@dataclass(frozen=True)
class LaunchChoices:
    """Launchers and NCCL transport expectations by probe and by node class (class wins)."""

    probe_launchers: Mapping[str, Launcher] = field(default_factory=dict)
    class_launchers: Mapping[str, Launcher] = field(default_factory=dict)
    probe_transport: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    class_transport: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    @classmethod
    def from_settings(cls, settings: Settings, probes_dir: Path | None = None) -> LaunchChoices:
        where = probes_dir or probes_package_dir()
        rules = settings.slurm.node_classes
        return cls(
            probe_launchers={name: launcher_from_settings(p.launcher, where)
                             for name, p in settings.probes.items() if p.launcher is not None},
            class_launchers={r.name: launcher_from_settings(r.launcher, where)
                             for r in reversed(rules) if r.launcher is not None},
            probe_transport={name: tuple(p.expected_transport)
                             for name, p in settings.probes.items() if p.expected_transport},
            class_transport={r.name: tuple(r.expected_transport)
                             for r in reversed(rules) if r.expected_transport is not None},
        )

    def launcher(self, probe: str, node_class: str | None) -> Launcher | None:
        if node_class is not None and node_class in self.class_launchers:
            return self.class_launchers[node_class]
        return self.probe_launchers.get(probe)

    def expected_transport(self, probe: str, node_class: str | None) -> tuple[str, ...]:
        if (spec := probe_spec(probe)) is None or not spec.expect_transport:
            return ()
        if node_class is not None and node_class in self.class_transport:
            return self.class_transport[node_class]
        return self.probe_transport.get(probe, ())


def choose_launch(
    job: ProbeJob, launch: LaunchSettings, choices: LaunchChoices, node_class: str | None
) -> tuple[ProbeJob, LaunchSettings]:
    """``job`` with its NCCL transport expectation added (unless its args already give one), and
    ``launch`` with the launcher of its probe and node class (pure)."""
    launcher = choices.launcher(job.bundle[0].probe if job.bundle else job.probe, node_class)
    if launcher is not None:
        launch = replace(launch, launcher=launcher)
    expected = choices.expected_transport(job.probe, node_class)
    if expected and EXPECT_TRANSPORT_OPTION not in job.args:
        job = replace(job, args=(*job.args, EXPECT_TRANSPORT_OPTION, ",".join(expected)))
    if job.bundle:
        job = replace(job, bundle=tuple(
            replace(r, args=(*r.args, EXPECT_TRANSPORT_OPTION, ",".join(want)))
            if (want := choices.expected_transport(r.probe, node_class)) and EXPECT_TRANSPORT_OPTION not in r.args
            else r
            for r in job.bundle))
    return job, launch


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
        choices: LaunchChoices | None = None,
        recheck_reservation: str = "healthd_recheck",
        user: str | None = None,
    ) -> None:
        self.client = client
        self.recheck_reservation = recheck_reservation
        self.user = user or pwd.getpwuid(os.geteuid()).pw_name
        self._lifted: dict[str, str] = {}
        """Job id → run id of the rechecks whose drains are lifted."""
        self._closed: set[str] = set()
        """Of those, the jobs the collector closed whose drains are not restored yet."""
        self.launch = launch
        self.reason_prefix = reason_prefix
        self.node_classes = tuple(node_classes)
        self.ranks_per_node = ranks_per_node
        self.choices = choices or LaunchChoices()
        self._gpus: dict[str, int] = {}
        self._classes: dict[str, str] = {}

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
            nice=s.nice,
        )
        return cls(client, launch, reason_prefix=settings.remediation.reason_prefix, node_classes=s.node_classes,
                   choices=LaunchChoices.from_settings(settings), recheck_reservation=s.recheck_reservation)

    def traits(self, settings: Settings) -> BackendTraits:
        s = settings.slurm
        return BackendTraits(max_jobs_in_flight=s.max_concurrent_jobs, max_idle_share=s.max_idle_share,
                             partitions=frozenset(s.partitions), controller=True,
                             runs_jobs_on_drained=True)

    def list_nodes(self) -> list[Node]:
        nodes = [classed(n, self.node_classes) for n in self.client.nodes()]
        self._gpus = {n.name: n.gpus for n in nodes}
        self._classes = {n.name: n.node_class for n in nodes if n.node_class}
        return nodes

    def job_class(self, job: ProbeJob) -> str | None:
        """The node class of ``job``'s nodes when they share one (as known at the last discovery)."""
        classes = {self._classes.get(n) for n in job.nodes}
        return classes.pop() if len(classes) == 1 else None

    def submit(self, job: ProbeJob, result_path: Path) -> str:
        if result_path != self.launch.results_dir / f"{job.run_id}.json":
            raise SlurmError(f"result path {result_path} is not in the shared results directory")
        gpus = min((self._gpus.get(n, 0) for n in job.nodes), default=0)
        ranks = job.ranks_per_node or self.ranks_per_node or max(gpus, 1)
        job, launch = choose_launch(job, self.launch, self.choices, self.job_class(job))
        lifted = self._lift_own_drains(job) if job.kind is RunKind.REPROBE else False
        if lifted:
            launch = replace(launch, reservation=self.recheck_reservation)
        script = render_batch_script(job, launch, ranks_per_node=ranks, gpus_per_node=gpus)
        path = self.launch.results_dir / f"{job.run_id}.sbatch"
        try:
            _write(path, script, "the batch script")
            job_id = self.client.submit(path)
        except BackendError:
            if lifted:
                self._restore(job.run_id)
            raise
        if lifted:
            self._lifted[job_id] = job.run_id
        return job_id

    # -- rechecks of own drains -------------------------------------------------------------------
    def _lift_path(self, run_id: str) -> Path:
        return self.launch.results_dir / f"{run_id}.lift.json"

    def _lift_own_drains(self, job: ProbeJob) -> bool:
        """Put ``job``'s nodes in the recheck reservation and lift healthd's own drains among them;
        whether there were any (then the job must run in the reservation)."""
        current = [self._node(n) for n in job.nodes]
        own = {n.name: n.reason for n in current if n.drained and n.owned_by(self.reason_prefix)}
        if not own:
            return False
        if busy := [n.name for n in current if n.state not in ("idle", "drained")]:
            raise SlurmError(f"not rechecking: {', '.join(busy)} still running jobs")
        _write(self._lift_path(job.run_id), json.dumps({"nodes": list(job.nodes), "reasons": own}), "the lift record")
        try:
            self._reserve(job.nodes)
            for name in own:
                self.client.undrain(name)
        except (BackendError, PolicyRefused):
            self._restore(job.run_id)
            raise
        log.info("recheck_drain_lifted", nodes=sorted(own), reservation=self.recheck_reservation, run_id=job.run_id)
        return True

    def _reserve(self, nodes: Sequence[str]) -> None:
        name = self.recheck_reservation
        held = self.client.reservation(name)
        if held is None:
            self.client.reserve(name, self.user, nodes)
            return
        if held.users != (self.user,):
            raise PolicyRefused(f"reservation {name} is for {','.join(held.users) or 'nobody'}, not {self.user}: "
                                "not healthd's, not touching it")
        if not set(nodes) <= set(held.nodes):
            self.client.set_reservation_nodes(name, sorted(set(held.nodes) | set(nodes)))

    def _release(self, nodes: Sequence[str]) -> None:
        name = self.recheck_reservation
        held = self.client.reservation(name)
        if held is None or held.users != (self.user,):
            return
        rest = sorted(set(held.nodes) - set(nodes))
        if rest:
            if rest != sorted(held.nodes):
                self.client.set_reservation_nodes(name, rest)
        else:
            self.client.delete_reservation(name)

    def _restore(self, run_id: str) -> None:
        """Drain again (with its old reason) each node a recheck lifted, unless someone drained it since,
        then take the job's nodes out of the reservation, and forget the lift."""
        path = self._lift_path(run_id)
        try:
            lift = json.loads(path.read_text())
            nodes, reasons = [str(n) for n in lift["nodes"]], {str(k): str(v) for k, v in lift["reasons"].items()}
        except FileNotFoundError:
            return
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise SlurmError(f"unreadable lift record {path}: {exc}") from None
        for name, reason in sorted(reasons.items()):
            current = self._node(name)
            if not current.drained and not current.reason:
                self.client.drain(name, reason)
        self._release(nodes)
        path.unlink(missing_ok=True)
        log.info("recheck_drain_restored", nodes=sorted(reasons), run_id=run_id)

    def _restore_quietly(self, run_id: str) -> bool:
        try:
            self._restore(run_id)
        except (BackendError, ValueError) as exc:
            log.warning("recheck_restore_failed", run_id=run_id, error=str(exc))
            return False
        return True

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
        """healthd's jobs; rechecks whose job is gone (the daemon stopped meanwhile) are restored now."""
        jobs = self._ours()
        live = {run_id_from_job_name(self.launch.job_name_prefix, j.name or ""): j.job_id
                for j in jobs if not j.state.finished}
        for path in sorted(self.launch.results_dir.glob("*.lift.json")):
            run_id = path.name.removesuffix(".lift.json")
            if run_id in live:
                self._lifted[live[run_id]] = run_id
            else:
                self._restore_quietly(run_id)
        return jobs

    def forget(self, job_ids: Sequence[str]) -> None:
        """Restore the drains lifted for these (closed) jobs; one that cannot be restored now is tried again
        at the next ``forget``."""
        self._closed |= {j for j in job_ids if j in self._lifted}
        for job_id in sorted(self._closed):
            if self._restore_quietly(self._lifted[job_id]):
                self._closed.discard(job_id)
                del self._lifted[job_id]

    def cancel(self, job_ids: Sequence[str]) -> None:
        if job_ids:
            self.client.cancel(list(job_ids))

    def _node(self, name: str) -> Node:
        return self.client.node(validate_node_name(name))

    def drain(self, node: str, reason: str) -> None:
        if not reason.startswith(self.reason_prefix):
            raise PolicyRefused(f"drain reason must start with {self.reason_prefix!r}")
        current = self._node(node)
        if (current.drained or current.reason) and not current.owned_by(self.reason_prefix):
            raise PolicyRefused(f"{node} is already drained by someone else (reason: {current.reason!r})")
        self.client.drain(node, reason)

    def take_over_drain(self, node: str, slurm_reason: str, reason: str) -> None:
        """Give healthd's ``reason`` to a drain slurmctld made with ``slurm_reason`` (a failed epilog or
        prolog of healthd's check); refused when the node's reason is anything else by now."""
        if not reason.startswith(self.reason_prefix):
            raise PolicyRefused(f"drain reason must start with {self.reason_prefix!r}")
        current = self._node(node)
        if not current.drained or (current.reason or "").strip() != slurm_reason:
            raise PolicyRefused(f"{node} is no longer drained with {slurm_reason!r} (reason: {current.reason!r})")
        self.client.drain(node, reason)

    def undrain(self, node: str) -> None:
        current = self._node(node)
        if not current.drained:
            raise PolicyRefused(f"{node} is not drained")
        if not current.owned_by(self.reason_prefix):
            raise PolicyRefused(f"{node} was drained by someone else (reason: {current.reason!r}); not undraining")
        self.client.undrain(node)

    # -- repairs (healthd.remediation.repair) ---------------------------------------------------------
    def _own_drained(self, node: str) -> Node:
        current = self._node(node)
        if not current.drained or not current.owned_by(self.reason_prefix):
            raise PolicyRefused(f"{node} is not drained by healthd (reason: {current.reason!r}); not repairing it")
        return current

    def start_reboot(self, node: str, reason: str) -> None:
        """Hold ``node`` (drained by healthd) in the recheck reservation, then ``scontrol reboot ASAP
        nextstate=DOWN reason=<reason>``: whatever state Slurm brings it back in (22.05: DOWN without the
        drain; ``ReturnToService=2``: IDLE), no other user's job starts on it before its full check."""
        if not reason.startswith(self.reason_prefix):
            raise PolicyRefused(f"a repair reason must start with {self.reason_prefix!r}")
        self._own_drained(node)
        self._reserve([node])
        try:
            self.client.reboot(node, reason)
        except BackendError:
            self._release([node])
            raise
        log.info("repair_reboot_requested", node=node, reason=reason, reservation=self.recheck_reservation)

    def run_repair_command(self, node: str, argv: tuple[str, ...], timeout_s: float) -> None:
        """Hold ``node`` (drained by healthd) in the recheck reservation, then run the site's ``argv`` (no
        shell) until it exits: 0 means the node is back."""
        self._own_drained(node)
        self._reserve([node])
        try:
            done = run_command(list(argv), timeout=timeout_s)
        except CommandTimeout:
            raise SlurmError(f"repair command {argv[0]} did not end within {timeout_s:g} s") from None
        except HealthdError as exc:
            raise SlurmError(f"repair command {argv[0]}: {exc}") from None
        if done.returncode != 0:
            tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["(no output)"]
            raise SlurmError(f"repair command {argv[0]} exited {done.returncode}: {tail[0][:200]}")
        log.info("repair_command_done", node=node, argv=list(argv))

    def back_from_repair(self, node: str, reason: str) -> None:
        """``node`` is back from its repair (DOWN, or IDLE after Slurm's ``ReturnToService``): resume it if
        DOWN and drain it with ``reason`` for its full check, then take it out of the reservation (the drain
        keeps users' jobs off now; each recheck puts it back in while it lifts the drain)."""
        if not reason.startswith(self.reason_prefix):
            raise PolicyRefused(f"a drain reason must start with {self.reason_prefix!r}")
        current = self._node(node)
        if current.reason and not current.owned_by(self.reason_prefix):
            raise PolicyRefused(f"{node} has someone else's reason now ({current.reason!r}); not touching it")
        held = self.client.reservation(self.recheck_reservation)
        if held is None or node not in held.nodes:
            self._reserve([node])
        if current.state == "down":
            self.client.resume(node)
        self.client.drain(node, reason)
        self._release([node])
        log.info("repair_back", node=node, reason=reason)

    def release_repair(self, node: str) -> None:
        self._release([validate_node_name(node)])

    def reboot_program(self) -> str | None:
        """slurm.conf's ``RebootProgram`` (``None``: not set; ``repair = "reboot"`` cannot work)."""
        return self.client.reboot_program()

    def topology(self, name: str | None = None) -> Topology | None:
        """``scontrol show topology [name]`` (``TopologySource``)."""
        return self.client.topology(name)

    def close(self) -> None:
        pass


def _write(path: Path, text: str, what: str) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    except OSError as exc:
        raise SlurmError(f"cannot write {what} {path}: {exc}") from None
