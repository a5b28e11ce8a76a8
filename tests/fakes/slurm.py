"""``FakeSlurmClient``: a stateful stand-in for a Slurm controller behind the ``SlurmClient`` protocol.

In the manner of submitit's Slurm double: the fake keeps nodes and jobs in memory and the test
drives time (``start``, ``finish``, ``purge``); every ``SlurmClient`` method changes or reads that
state the way the Slurm commands do:

- ``submit`` reads the batch script the backend wrote (its ``#SBATCH`` lines, then the command
  line's ``extra_args``, which win as with ``sbatch``): job name, node list, partition. The job is
  ``pending`` until the test starts it.
- ``drain`` sets the DRAIN flag and the reason (with who and when), replacing an earlier reason;
  ``undrain`` clears the flag and, unless the node is DOWN, the reason.
- ``reserve``/``set_reservation_nodes``/``delete_reservation`` keep reservations; a job starts
  (``start_all``) only on undrained idle nodes, and on a reserved node only when it was submitted
  with that ``--reservation``; a reservation with an unfinished job is "in use" and not deleted.
- ``outage`` set: every call raises ``SlurmError`` (controller unreachable) or ``SlurmTimeout``.

Operators' own actions (a drain with their reason, a user's job) go through ``admin_drain`` and
``occupy``, which are not recorded as healthd's commands.
"""

from __future__ import annotations

import shlex
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

from healthd.cluster.slurm import SlurmBackend
from healthd.cluster.slurm_parse import Reservation, expand_nodes
from healthd.errors import SlurmError, SlurmTimeout
from healthd.jobs import LaunchSettings
from healthd.model import JobState, JobStatus, Node, validate_node_name
from healthd.parsers.topology import parse_show_topology
from healthd.topology import Topology

Outage = Literal["down", "timeout"]
CONTROLLER_DOWN = "Unable to contact slurm controller (connect failure)"


@dataclass
class FakeJob:
    job_id: str
    name: str
    nodes: tuple[str, ...]
    script: Path
    partition: str | None = None
    reservation: str | None = None
    result_path: Path | None = None
    """The probe's ``--output`` in the script's command line (where the probe writes its result)."""
    state: JobState = JobState.PENDING
    exit_code: int | None = None
    reason: str = ""
    started_at: float | None = None
    finished_at: float | None = None

    def status(self) -> JobStatus:
        return JobStatus(self.job_id, self.state, exit_code=self.exit_code, reason=self.reason,
                         started_at=self.started_at, finished_at=self.finished_at, nodes=self.nodes, name=self.name)


def gpu_node(name: str, *, gpus: int = 8, gpu_type: str = "h100", partitions: tuple[str, ...] = ("gpu",)) -> Node:
    return Node(name=name, state="idle", partitions=partitions, gpus=gpus, gpu_type=gpu_type, cpus=64)


def fake_backend(fake: FakeSlurmClient, results_dir: Path, *, reason_prefix: str = "healthd:") -> SlurmBackend:
    """The real Slurm backend over ``fake``, writing its batch scripts to ``results_dir``."""
    return SlurmBackend(fake, LaunchSettings(python="python3", results_dir=results_dir), reason_prefix=reason_prefix)


class FakeSlurmClient:
    """Implements ``healthd.cluster.slurm_cli.SlurmClient`` in memory (see the module docstring)."""

    def __init__(self, nodes: Iterable[Node] = (), *, clock: Callable[[], float] = time.time,
                 user: str = "slurm", release: tuple[int, int, int] = (24, 11, 1)) -> None:
        self.node_map: dict[str, Node] = {n.name: n for n in nodes}
        self.jobs_by_id: dict[str, FakeJob] = {}
        self.clock = clock
        self.user = user
        self.release = release
        self.outage: Outage | None = None
        self.reservations: dict[str, Reservation] = {}
        self.commands: list[tuple[str, ...]] = []
        """healthd's commands that changed something, in order: ``("sbatch", job_id)``,
        ``("scancel", *ids)``, ``("drain", node, reason)``, ``("undrain", node)``, ``("reserve", name, *nodes)``,
        ``("reservation_nodes", name, *nodes)``, ``("delete_reservation", name)``, ``("reboot", node, reason)``,
        ``("resume", node)``."""
        self._next_id = 1000
        self.topology_text = ""
        """``scontrol show topology``'s stdout (see ``topology``)."""
        self.named_topologies: dict[str, str] = {}
        self.reboot_program_path: str | None = "/usr/sbin/reboot"
        """slurm.conf's ``RebootProgram`` (``None``: not set, ``reboot`` fails as scontrol does)."""

    # --- the test drives the cluster ----------------------------------------------------------

    def add_nodes(self, *nodes: Node) -> None:
        self.node_map.update((n.name, n) for n in nodes)

    def admin_drain(self, node: str, reason: str, *, user: str = "admin") -> None:
        """An operator drains ``node`` with ``reason`` (not one of healthd's commands)."""
        self._set_drain(node, reason, user)

    def occupy(self, node: str, busy: bool = True) -> None:
        """A user's job takes ``node`` (or leaves it)."""
        self._set_state(node, "allocated" if busy else "idle")

    def start(self, job_id: str) -> None:
        """``pending`` → ``running``; its nodes are allocated."""
        job = self.jobs_by_id[job_id]
        if job.state is not JobState.PENDING:
            raise AssertionError(f"job {job_id} is {job.state.value}, not pending")
        job.state, job.started_at = JobState.RUNNING, self.clock()
        for name in job.nodes:
            self._set_state(name, "allocated")

    def start_all(self) -> list[FakeJob]:
        """Start every pending job whose nodes are free; returns the jobs started."""
        started = []
        for job in list(self.jobs_by_id.values()):
            if job.state is JobState.PENDING and all(self._may_start(job, n) for n in job.nodes):
                self.start(job.job_id)
                started.append(job)
        return started

    def finish(self, job_id: str, state: JobState = JobState.COMPLETED, *, exit_code: int = 0,
               reason: str = "") -> None:
        """A running job ends in ``state``; its nodes are idle again (still drained if they were)."""
        job = self.jobs_by_id[job_id]
        if job.state is not JobState.RUNNING:
            raise AssertionError(f"job {job_id} is {job.state.value}, not running")
        self._end(job, state, exit_code, reason)

    def purge(self) -> None:
        """Finished jobs leave the controller's memory (``MinJobAge`` passed)."""
        self.jobs_by_id = {k: j for k, j in self.jobs_by_id.items() if not j.state.finished}

    def submitted(self) -> list[str]:
        return [c[1] for c in self.commands if c[0] == "sbatch"]

    def drains(self) -> list[tuple[str, str]]:
        return [(c[1], c[2]) for c in self.commands if c[0] == "drain"]

    def undrains(self) -> list[str]:
        return [c[1] for c in self.commands if c[0] == "undrain"]

    # --- SlurmClient --------------------------------------------------------------------------

    def version(self) -> tuple[int, int, int]:
        self._reachable("sinfo")
        return self.release

    def nodes(self) -> list[Node]:
        self._reachable("sinfo")
        return list(self.node_map.values())

    def node(self, name: str) -> Node:
        self._reachable("scontrol")
        validate_node_name(name)
        if name not in self.node_map:
            raise SlurmError(f"scontrol exited 1: Node {name} not found")
        return self.node_map[name]

    def jobs(self, name_prefix: str) -> list[JobStatus]:
        if not name_prefix:
            raise ValueError("name_prefix must not be empty")
        self._reachable("squeue")
        return [j.status() for j in self.jobs_by_id.values() if j.name.startswith(name_prefix)]

    def submit(self, script: Path, *, extra_args: Sequence[str] = ()) -> str:
        self._reachable("sbatch")
        text = script.read_text()
        options = _options([line.removeprefix("#SBATCH ").strip() for line in text.splitlines()
                            if line.startswith("#SBATCH ")] + list(extra_args))
        nodes = expand_nodes(options.get("nodelist", ""))
        unknown = [n for n in nodes if n not in self.node_map]
        if not nodes or unknown:
            raise SlurmError("sbatch exited 1: sbatch: error: Batch job submission failed: "
                             "Invalid node name specified")
        self._next_id += 1
        job = FakeJob(str(self._next_id), options.get("job-name", script.name), nodes, script,
                      partition=options.get("partition"), reservation=options.get("reservation"),
                      result_path=_probe_output(text))
        self.jobs_by_id[job.job_id] = job
        self.commands.append(("sbatch", job.job_id))
        return job.job_id

    def cancel(self, job_ids: Sequence[str]) -> None:
        self._reachable("scancel")
        self.commands.append(("scancel", *job_ids))
        for job_id in job_ids:
            job = self.jobs_by_id.get(job_id)
            if job is not None and not job.state.finished:
                self._end(job, JobState.CANCELLED, None, "cancelled")

    def drain(self, node: str, reason: str) -> None:
        self._reachable("scontrol")
        if not reason:
            raise ValueError("a drain needs a reason")
        self._known(node)
        self.commands.append(("drain", node, reason))
        self._set_drain(node, reason, self.user)

    def undrain(self, node: str) -> None:
        self._reachable("scontrol")
        current = self._known(node)
        self.commands.append(("undrain", node))
        keep_reason = current.state == "down"
        self.node_map[node] = replace(current, flags=current.flags - {"DRAIN"},
                                      reason=current.reason if keep_reason else None,
                                      reason_user=current.reason_user if keep_reason else None,
                                      reason_time=current.reason_time if keep_reason else None)

    def reboot(self, node: str, reason: str) -> None:
        """As 22.05 does (seen on the lab cluster): the node is drained with ``reason`` and flagged
        ``REBOOT_REQUESTED`` until the test calls ``finish_reboot``."""
        self._reachable("scontrol")
        if not reason:
            raise ValueError("a reboot needs a reason")
        if self.reboot_program_path is None:
            raise SlurmError("scontrol exited 1: RebootProgram isn't defined")
        self._known(node)
        self.commands.append(("reboot", node, reason))
        self._set_drain(node, reason, self.user)
        self.node_map[node] = replace(self.node_map[node], flags=self.node_map[node].flags | {"REBOOT_REQUESTED"})

    def finish_reboot(self, node: str, *, return_to_service: bool = False) -> None:
        """The node's slurmd registers after its reboot: DOWN, the DRAIN flag cleared, the reason ending in
        ``: reboot complete`` (22.05 and 24.11, ``nextstate=DOWN``); with ``return_to_service``
        (``ReturnToService=2``) it is IDLE, as the lab cluster's node is seconds later: without a reason on
        22.05, still with it on 24.11 (the fake's ``release``)."""
        current = self._known(node)
        flags = frozenset(f for f in current.flags if f != "DRAIN" and not f.startswith("REBOOT"))
        reason = f"{current.reason} : reboot issued : reboot complete"
        if return_to_service and self.release[:2] < (24, 11):
            self.node_map[node] = replace(current, state="idle", flags=flags, reason=None, reason_user=None,
                                          reason_time=None)
        else:
            self.node_map[node] = replace(current, state="idle" if return_to_service else "down", flags=flags,
                                          reason=reason)

    def resume(self, node: str) -> None:
        self._reachable("scontrol")
        current = self._known(node)
        self.commands.append(("resume", node))
        self.node_map[node] = replace(current, state="idle" if current.state == "down" else current.state,
                                      flags=current.flags - {"DRAIN"}, reason=None, reason_user=None,
                                      reason_time=None)

    def reboot_program(self) -> str | None:
        self._reachable("scontrol")
        return self.reboot_program_path

    def reservation(self, name: str) -> Reservation | None:
        self._reachable("scontrol")
        return self.reservations.get(name)

    def reserve(self, name: str, user: str, nodes: Sequence[str]) -> None:
        self._reachable("scontrol")
        if name in self.reservations:
            raise SlurmError("scontrol exited 1: Error creating the reservation: Reservation request overlaps")
        for n in nodes:
            self._known(n)
        self.commands.append(("reserve", name, *sorted(nodes)))
        self.reservations[name] = Reservation(name, tuple(sorted(nodes)), (user,))

    def set_reservation_nodes(self, name: str, nodes: Sequence[str]) -> None:
        self._reachable("scontrol")
        if name not in self.reservations or not nodes:
            raise SlurmError(f"scontrol exited 1: Error updating the reservation {name}")
        self.commands.append(("reservation_nodes", name, *sorted(nodes)))
        self.reservations[name] = replace(self.reservations[name], nodes=tuple(sorted(nodes)))

    def topology(self, name: str | None = None) -> Topology | None:
        """What ``scontrol show topology`` would print, parsed: ``topology_text`` (set by the test;
        empty: no topology plugin) or, for ``name``, ``named_topologies[name]``."""
        self._reachable("scontrol")
        if name is not None:
            if name not in self.named_topologies:
                raise SlurmError(f"scontrol exited 1: slurm_load_topo error: topology {name} not found")
            return parse_show_topology(self.named_topologies[name], source=f"scontrol show topology {name}")
        return parse_show_topology(self.topology_text)

    def delete_reservation(self, name: str) -> None:
        self._reachable("scontrol")
        if any(j.reservation == name and not j.state.finished for j in self.jobs_by_id.values()):
            raise SlurmError(f"scontrol exited 1: delete_reservation ReservationName={name}: "
                             "Requested reservation is in use")
        if self.reservations.pop(name, None) is None:
            raise SlurmError(f"scontrol exited 1: Reservation {name} not found")
        self.commands.append(("delete_reservation", name))

    # --- inside -------------------------------------------------------------------------------

    def _may_start(self, job: FakeJob, node: str) -> bool:
        current = self.node_map[node]
        held = {r.name for r in self.reservations.values() if node in r.nodes}
        return current.state == "idle" and not current.drained and (job.reservation in held if held or
                                                                     job.reservation else True)

    def _reachable(self, command: str) -> None:
        if self.outage == "timeout":
            raise SlurmTimeout(f"{command} did not answer within 30 s")
        if self.outage == "down":
            raise SlurmError(f"{command} exited 1: {command}: error: {CONTROLLER_DOWN}")

    def _known(self, node: str) -> Node:
        validate_node_name(node)
        if node not in self.node_map:
            raise SlurmError("scontrol exited 1: slurm_update error: Invalid node name specified")
        return self.node_map[node]

    def _set_drain(self, node: str, reason: str, user: str) -> None:
        current = self._known(node)
        self.node_map[node] = replace(current, flags=current.flags | {"DRAIN"}, reason=reason, reason_user=user,
                                      reason_time=self.clock())

    def _set_state(self, node: str, state: str) -> None:
        self.node_map[node] = replace(self._known(node), state=state)

    def _end(self, job: FakeJob, state: JobState, exit_code: int | None, reason: str) -> None:
        ran = job.state is JobState.RUNNING
        job.state, job.exit_code, job.reason, job.finished_at = state, exit_code, reason, self.clock()
        if ran:
            for name in job.nodes:
                self._set_state(name, "idle")


def _options(args: Sequence[str]) -> dict[str, str]:
    """``--key=value`` options, later ones winning; flags without a value map to ``""``."""
    options: dict[str, str] = {}
    for arg in args:
        key, _, value = arg.removeprefix("--").partition("=")
        options[key] = value
    return options


def _probe_output(script: str) -> Path | None:
    """The ``--output`` the script passes to ``python -m probes`` (the result document)."""
    for line in script.splitlines():
        if line.startswith("exec "):
            argv = shlex.split(line)
            if "probes" in argv and "--output" in argv[argv.index("probes"):]:
                tail = argv[argv.index("probes"):]
                return Path(tail[tail.index("--output") + 1])
    return None
