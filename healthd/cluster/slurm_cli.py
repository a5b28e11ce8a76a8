"""The Slurm command-line client: ``SlurmClient`` (the contract) and ``SlurmCli`` (sinfo, squeue,
sbatch, scancel, scontrol).

``SlurmCli`` is three layers: the argv builders of ``slurm_argv`` (pure), the parsers of
``slurm_parse`` (pure), and one private method, ``_run``, that runs a command through
``healthd.process.run`` with a timeout and turns every failure into ``SlurmError``/``SlurmTimeout``.
It prefers JSON where the installed Slurm has it (since 21.08), asked for as the release's
``JsonDialect`` says (22.05: ``sinfo --json``, ``squeue --json``; 24.11 and 26.05: ``scontrol
--json=v0.0.42 show node``, ``squeue --json=v0.0.42 --all --states=all``); a release healthd does
not know is asked as the closest known one, with a logged warning. It falls back to the ``-O``
text formats (alike in all three releases) when JSON is missing or unreadable.

Ownership of drain reasons (only touch nodes healthd drained) is not checked here: that is the
caller's policy (``healthd.remediation`` and the backend); :meth:`SlurmClient.node` re-reads one
node's reason right before acting.
"""

from __future__ import annotations

import os
import re
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import tzinfo
from pathlib import Path
from typing import Literal, Protocol, TypeVar, runtime_checkable

from healthd.cluster import slurm_argv as argv
from healthd.cluster import slurm_parse as parse
from healthd.errors import CommandTimeout, HealthdError, ParseError, SlurmError, SlurmTimeout
from healthd.logging import get_logger
from healthd.model import JobStatus, Node
from healthd.parsers.topology import NO_TOPOLOGY_MESSAGE, parse_show_topology
from healthd.process import Completed, run
from healthd.topology import Topology

__all__ = ["CommandObserver", "OutputMode", "SlurmCli", "SlurmClient", "SlurmCommands"]

log = get_logger(__name__)
_T = TypeVar("_T")

OutputMode = Literal["auto", "json", "text"]
CommandName = Literal["sinfo", "squeue", "sbatch", "scancel", "scontrol"]
Query = Literal["nodes", "jobs"]
CommandObserver = Callable[[str, float, bool], None]
"""Called after every command with (command name, seconds, succeeded): for metrics."""

_JSON_SINCE = (21, 8, 0)
# A --json answer saying this Slurm cannot give that JSON at all (22.05's scontrol; a data parser
# that a future release dropped), as opposed to a failing command (24.11+: controller down).
_JSON_REFUSED = re.compile(r"unrecognized option|unknown option|invalid option|data_parser", re.IGNORECASE)
_SCANCEL_HARMLESS = ("invalid job id", "already completing or completed", "job has already finished")


class _JsonUnusable(ParseError):
    """A ``--json`` answer that gave no usable JSON. ``for_good``: this Slurm cannot give it (exit 0
    with unreadable output, or the option or data parser refused), so use text from now on; else
    the command failed this once (24.11+ exits 1 with no JSON while slurmctld is down)."""

    def __init__(self, message: str, *, for_good: bool) -> None:
        super().__init__(message)
        self.for_good = for_good


@runtime_checkable
class SlurmClient(Protocol):
    """What healthd asks of Slurm. Every method either does what it says or raises ``SlurmError``.

    ``SlurmTimeout`` (a ``SlurmError``) means the command did not answer in time and was killed.
    A ``SlurmError`` is infrastructure trouble: the caller records "could not check", never "node
    bad", and never drains because of it. Arguments that can never be valid (a malformed node name,
    an empty drain reason) raise ``InvalidNodeName``/``ValueError`` before any command runs.
    """

    def version(self) -> tuple[int, int, int]:
        """The Slurm release of the client commands, e.g. ``(22, 5, 8)``."""
        ...

    def nodes(self) -> list[Node]:
        """Every node the controller knows, with base state, flags, partitions, GPUs, features,
        drain reason (and who set it, when) and CPUs; in the controller's order."""
        ...

    def node(self, name: str) -> Node:
        """One node, read fresh (re-check its state and reason right before draining or undraining)."""
        ...

    def jobs(self, name_prefix: str) -> list[JobStatus]:
        """All jobs whose name starts with ``name_prefix`` (not empty), with ONE query.

        Includes pending, running and finished jobs still held by the controller (``MinJobAge``,
        300 s by default), so a finished job's state and exit code are seen; a job missing from the
        answer is gone from the controller's memory, not necessarily failed.
        """
        ...

    def submit(self, script: Path, *, extra_args: Sequence[str] = ()) -> str:
        """``sbatch --parsable [extra_args] script``; returns the job id. Does not wait for the job.

        After ``SlurmTimeout`` the job may or may not exist: look for it with :meth:`jobs` by name.
        """
        ...

    def cancel(self, job_ids: Sequence[str]) -> None:
        """Cancel the jobs; ids the controller no longer knows, or already finished, are ignored."""
        ...

    def drain(self, node: str, reason: str) -> None:
        """``State=DRAIN Reason=<reason>``: running jobs finish, no new job starts on ``node``."""
        ...

    def undrain(self, node: str) -> None:
        """``State=UNDRAIN``: clear a drain, leave the base state (a DOWN node stays DOWN)."""
        ...

    def reboot(self, node: str, reason: str) -> None:
        """``scontrol reboot ASAP nextstate=DOWN reason=<reason> <node>`` (``slurm_argv.reboot_argv``)."""
        ...

    def resume(self, node: str) -> None:
        """``State=RESUME``: a DOWN node (back from a reboot) becomes usable; a drain is cleared too."""
        ...

    def reboot_program(self) -> str | None:
        """slurm.conf's ``RebootProgram`` (``scontrol show config``); ``None`` when there is none."""
        ...

    def reservation(self, name: str) -> parse.Reservation | None:
        """The reservation ``name`` (one of healthd's: the name starts with ``healthd``), or ``None``."""
        ...

    def reserve(self, name: str, user: str, nodes: Sequence[str]) -> None:
        """Create the reservation ``name`` of ``nodes`` for ``user`` alone, active now, with no end."""
        ...

    def set_reservation_nodes(self, name: str, nodes: Sequence[str]) -> None:
        """The reservation ``name`` holds exactly ``nodes`` from now on (at least one)."""
        ...

    def delete_reservation(self, name: str) -> None:
        ...

    def topology(self, name: str | None = None) -> Topology | None:
        """``scontrol show topology [name]``; ``None`` when Slurm has none (no topology plugin)."""
        ...


@dataclass(frozen=True)
class SlurmCommands:
    """The argv prefix of each command: a path, or a wrapper (``("sudo", "-n", "scontrol")``)."""

    sinfo: tuple[str, ...] = ("sinfo",)
    squeue: tuple[str, ...] = ("squeue",)
    sbatch: tuple[str, ...] = ("sbatch",)
    scancel: tuple[str, ...] = ("scancel",)
    scontrol: tuple[str, ...] = ("scontrol",)

    @classmethod
    def in_dir(cls, bin_dir: Path) -> SlurmCommands:
        """Every command from ``bin_dir`` (``/opt/slurm/bin``)."""
        return cls(*((str(bin_dir / name),) for name in ("sinfo", "squeue", "sbatch", "scancel", "scontrol")))


class SlurmCli:
    """``SlurmClient`` over the Slurm commands.

    :param commands: argv prefix per command (default: found on ``PATH``).
    :param bin_dir: or: take every command from this directory (not with ``commands``).
    :param timeout_s: limit of each command; past it the command's process group is killed.
    :param output: ``json``, ``text``, or ``auto`` (JSON when the release has it, text after the
        first unreadable JSON answer).
    :param env: environment of the commands (default: this process's; ``SLURM_CONF`` matters).
    :param tz: zone of the times in text output (default: this host's local zone).
    :param observer: called after every command, for metrics.
    :param release: the Slurm release (``(24, 11)``) whose JSON dialect to speak; default: the
        release of ``sinfo --version``, asked once.
    """

    def __init__(
        self,
        commands: SlurmCommands | None = None,
        *,
        bin_dir: Path | None = None,
        timeout_s: float = 30.0,
        output: OutputMode = "auto",
        env: Mapping[str, str] | None = None,
        tz: tzinfo | None = None,
        observer: CommandObserver | None = None,
        release: argv.Release | None = None,
    ) -> None:
        if timeout_s <= 0:
            raise ValueError("timeout_s must be positive")
        if commands is not None and bin_dir is not None:
            raise ValueError("give commands or bin_dir, not both")
        self.commands = commands or (SlurmCommands.in_dir(bin_dir) if bin_dir else SlurmCommands())
        self.timeout_s = timeout_s
        self.output: OutputMode = output
        self._env = env
        self._tz = tz
        self._observer = observer
        self._lock = threading.Lock()
        self._version: tuple[int, int, int] | None = None
        self._release = release
        self._dialect: argv.JsonDialect | None = None
        self._json: dict[Query, bool] = {}

    # --- the one runner -----------------------------------------------------------------------

    def _run(
        self,
        name: CommandName,
        args: Sequence[str],
        read: Callable[[Completed], _T],
        *,
        check: bool = True,
        env: Mapping[str, str] | None = None,
    ) -> _T:
        """Run ``args`` (a full argv from ``slurm_argv``) with the timeout and ``read`` its result.

        The observer hears of every run; it succeeded when ``read`` returned.

        :raises SlurmTimeout: no answer within ``timeout_s``.
        :raises SlurmError: the command could not start, (``check``) exited non-zero, or ``read``
            raised it. A ``ParseError`` from ``read`` passes through (the JSON-to-text fallback).
        """
        ok = False
        started = time.monotonic()
        try:
            try:
                done = run(args, timeout=self.timeout_s, env=env if env is not None else self._env)
            except CommandTimeout as exc:
                raise SlurmTimeout(f"{name} did not answer within {self.timeout_s:g} s") from exc
            except HealthdError as exc:
                raise SlurmError(f"{name}: {exc}") from exc
            if check and done.returncode != 0:
                raise SlurmError(f"{name} exited {done.returncode}: {_tail(done.stderr or done.stdout)}")
            result = read(done)
            ok = True
            return result
        finally:
            if self._observer is not None:
                self._observer(name, time.monotonic() - started, ok)

    # --- queries --------------------------------------------------------------------------------

    def version(self) -> tuple[int, int, int]:
        if self._version is None:
            self._version = self._run(
                "sinfo", argv.version_argv(self.commands.sinfo), lambda done: _text(parse.parse_version, done.stdout)
            )
        return self._version

    def dialect(self) -> argv.JsonDialect:
        """How this cluster's Slurm is asked for JSON: its release's, or the closest known release's."""
        if self._dialect is None:
            release = self._release or self.version()[:2]
            chosen = parse.closest_release(release, argv.JSON_DIALECTS)
            if chosen != release:
                log.warning(
                    "slurm_release_unknown",
                    release=f"{release[0]}.{release[1]:02d}",
                    dialect=f"{chosen[0]}.{chosen[1]:02d}",
                )
            self._dialect = argv.JSON_DIALECTS[chosen]
        return self._dialect

    def _use_json(self, query: Query) -> bool:
        if self.output != "auto":
            return self.output == "json"
        with self._lock:
            known = self._json.get(query)
        if known is None:
            known = (self._release or self.version()[:2]) >= _JSON_SINCE[:2]
            with self._lock:
                self._json.setdefault(query, known)
        return known

    def _read_json(self, name: CommandName, parser: Callable[[str], _T]) -> Callable[[Completed], _T]:
        """Reader of a ``--json`` answer: in ``json`` mode every failure is a ``SlurmError``."""

        def read(done: Completed) -> _T:
            try:
                return parser(done.stdout)
            except ParseError as exc:
                if self.output != "json":
                    refused = done.returncode == 0 or bool(_JSON_REFUSED.search(done.stderr + done.stdout))
                    raise _JsonUnusable(str(exc), for_good=refused) from exc
                detail = f" (exit {done.returncode}: {_tail(done.stderr or done.stdout)})" if done.returncode else ""
                what = str(exc) if str(exc).startswith(f"{name} --json") else f"{name} --json: {exc}"
                raise SlurmError(f"{what}{detail}") from exc

        return read

    def _fell_back(self, query: Query, name: CommandName, exc: ParseError | None) -> None:
        """The text command answered where JSON was unusable: use text from now on, unless the JSON
        command only failed this once (then JSON is tried again next time)."""
        if exc is None:
            return
        if isinstance(exc, _JsonUnusable) and not exc.for_good:
            log.info("slurm_json_failed", command=name, error=str(exc), fallback="text this once")
            return
        log.warning("slurm_json_unreadable", command=name, error=str(exc), fallback="text")
        with self._lock:
            self._json[query] = False

    def _scontrol_json(self, node: str | None) -> list[Node]:
        """``scontrol --json show node [NODE]`` (24.11+): every node, or only ``node``."""
        return self._run(
            "scontrol",
            argv.scontrol_nodes_json_argv(self.commands.scontrol, node, self.dialect().data_parser),
            self._read_json("scontrol", parse.parse_scontrol_json),
            check=False,
        )

    def _nodes_json(self) -> list[Node]:
        """Every node as JSON, with the command of the release's dialect."""
        dialect = self.dialect()
        if dialect.nodes_command == "scontrol":
            return self._scontrol_json(None)
        return self._run(
            "sinfo",
            argv.sinfo_json_argv(self.commands.sinfo, dialect.data_parser),
            self._read_json("sinfo", parse.parse_sinfo_json),
            check=False,
        )

    def nodes(self) -> list[Node]:
        json_error = None
        if self._use_json("nodes"):
            try:
                return self._nodes_json()
            except ParseError as exc:
                json_error = exc
        nodes = self._run(
            "sinfo",
            argv.sinfo_text_argv(self.commands.sinfo),
            lambda done: _text(parse.parse_sinfo_text, done.stdout, self._tz),
        )
        if json_error is not None:
            self._fell_back("nodes", self.dialect().nodes_command, json_error)
        return nodes

    def node(self, name: str) -> Node:
        """One node: ``scontrol --json show node NAME`` where the release has it (24.11+), else (and
        after unreadable JSON) ``scontrol -o show node NAME``."""
        found: list[Node] | None = None
        json_error = None
        if self._use_json("nodes") and self.dialect().nodes_command == "scontrol":
            try:
                found = self._scontrol_json(name)
            except ParseError as exc:
                json_error = exc
        if found is None:
            found = self._run(
                "scontrol",
                argv.scontrol_node_argv(self.commands.scontrol, name),
                lambda done: _text(parse.parse_scontrol_nodes, done.stdout, self._tz),
            )
            self._fell_back("nodes", "scontrol", json_error)
        if len(found) != 1 or found[0].name != name:
            raise SlurmError(f"scontrol show node {name}: expected that one node, got {len(found)}")
        return found[0]

    def jobs(self, name_prefix: str) -> list[JobStatus]:
        if not name_prefix:
            raise ValueError("name_prefix must not be empty (it keeps healthd away from other jobs)")
        json_error = None
        if self._use_json("jobs"):
            dialect = self.dialect()
            try:
                return self._run(
                    "squeue",
                    argv.squeue_json_argv(self.commands.squeue, dialect.data_parser, filters=dialect.squeue_filters),
                    self._read_json("squeue", lambda text: parse.parse_squeue_json(text, name_prefix)),
                    check=False,
                )
            except ParseError as exc:
                json_error = exc
        jobs = self._run(
            "squeue",
            argv.squeue_text_argv(self.commands.squeue),
            lambda done: _text(parse.parse_squeue_text, done.stdout, name_prefix, self._tz),
        )
        self._fell_back("jobs", "squeue", json_error)
        return jobs

    # --- actions --------------------------------------------------------------------------------

    def submit(self, script: Path, *, extra_args: Sequence[str] = ()) -> str:
        return self._run(
            "sbatch",
            argv.sbatch_argv(self.commands.sbatch, script, extra_args),
            lambda done: _text(parse.parse_sbatch_parsable, done.stdout),
        )

    def cancel(self, job_ids: Sequence[str]) -> None:
        if job_ids:
            self._run("scancel", argv.scancel_argv(self.commands.scancel, job_ids), _scancel_result, check=False)

    def drain(self, node: str, reason: str) -> None:
        self._run("scontrol", argv.drain_argv(self.commands.scontrol, node, reason), _nothing)

    def undrain(self, node: str) -> None:
        self._run("scontrol", argv.undrain_argv(self.commands.scontrol, node), _nothing)

    def reboot(self, node: str, reason: str) -> None:
        self._run("scontrol", argv.reboot_argv(self.commands.scontrol, node, reason), _nothing)

    def resume(self, node: str) -> None:
        self._run("scontrol", argv.resume_argv(self.commands.scontrol, node), _nothing)

    def reboot_program(self) -> str | None:
        return self._run("scontrol", argv.show_config_argv(self.commands.scontrol),
                         lambda done: parse.parse_config_value(done.stdout, "RebootProgram"))

    def reservation(self, name: str) -> parse.Reservation | None:
        def read(done: Completed) -> parse.Reservation | None:
            if done.returncode != 0:
                if parse.RESERVATION_NOT_FOUND.search(done.stderr + done.stdout):
                    return None
                raise SlurmError(f"scontrol exited {done.returncode}: {_tail(done.stderr or done.stdout)}")
            return _text(parse.parse_reservation, done.stdout)

        return self._run("scontrol", argv.reservation_show_argv(self.commands.scontrol, name), read, check=False)

    def reserve(self, name: str, user: str, nodes: Sequence[str]) -> None:
        self._run("scontrol", argv.reservation_create_argv(self.commands.scontrol, name, user, nodes), _nothing)

    def set_reservation_nodes(self, name: str, nodes: Sequence[str]) -> None:
        self._run("scontrol", argv.reservation_update_argv(self.commands.scontrol, name, nodes), _nothing)

    def delete_reservation(self, name: str) -> None:
        self._run("scontrol", argv.reservation_delete_argv(self.commands.scontrol, name), _nothing)

    def topology(self, name: str | None = None) -> Topology | None:
        """The topology of ``scontrol show topology [name]``; ``None`` when Slurm has none.

        :raises TopologyError: an answer that is no usable topology (``healthd.parsers.topology``).
        :raises SlurmError: scontrol failed; with ``name``, the name is unknown or Slurm is older than
            25.05 (before it, ``scontrol show topology NAME`` shows the switch of that name).
        """
        if name is not None and self.version()[:2] < (25, 5):
            raise SlurmError(f"topology name {name!r}: Slurm {'.'.join(map(str, self.version()))} has no named "
                             "topologies (25.05+, topology.yaml)")
        base = self._env if self._env is not None else os.environ
        # SLURM_TOPO_LEN truncates every line to its length: never for healthd's reading.
        env = {k: v for k, v in base.items() if k != "SLURM_TOPO_LEN"} if "SLURM_TOPO_LEN" in base else None
        source = "scontrol show topology" + (f" {name}" if name else "")

        def read(done: Completed) -> Topology | None:
            # scontrol exits 0 after slurm_perror ("slurm_load_topo error: Unable to contact slurm
            # controller", 26.05 "...: Requested topology configuration is not available"): only
            # "No topology information available" is an answer without output.
            if not done.stdout.strip() and done.stderr.strip() and NO_TOPOLOGY_MESSAGE not in done.stderr:
                raise SlurmError(f"{source}: {_tail(done.stderr)}")
            return parse_show_topology(done.stdout, source=source)

        return self._run("scontrol", argv.scontrol_topology_argv(self.commands.scontrol, name), read, env=env)


def _nothing(done: Completed) -> None:
    return None


def _scancel_result(done: Completed) -> None:
    """Unknown and already finished jobs are not errors (22.05, 24.11 and 26.05 are silent about them)."""
    if done.returncode == 0:
        return
    errors = [line for line in done.stderr.splitlines() if line.strip()]
    if errors and all(any(h in line.lower() for h in _SCANCEL_HARMLESS) for line in errors):
        return
    raise SlurmError(f"scancel exited {done.returncode}: {_tail(done.stderr or done.stdout)}")


def _text(parser: Callable[..., _T], *args: object) -> _T:
    """A text parser's result; unreadable text is a ``SlurmError`` (there is no other fallback)."""
    try:
        return parser(*args)
    except ParseError as exc:
        raise SlurmError(f"unreadable Slurm output: {exc}") from exc


def _tail(text: str, lines: int = 3) -> str:
    kept = [line.strip() for line in text.strip().splitlines() if line.strip()][-lines:]
    return " | ".join(kept) if kept else "(no output)"
