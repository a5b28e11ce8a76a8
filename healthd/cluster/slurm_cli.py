"""The Slurm command-line client: ``SlurmClient`` (the contract) and ``SlurmCli`` (sinfo, squeue,
sbatch, scancel, scontrol).

``SlurmCli`` is three layers: the argv builders of ``slurm_argv`` (pure), the parsers of
``slurm_parse`` (pure), and one private method, ``_run``, that runs a command through
``healthd.process.run`` with a timeout and turns every failure into ``SlurmError``/``SlurmTimeout``.
It prefers ``--json`` where the installed Slurm has it (sinfo and squeue since 21.08) and falls
back to the ``-O`` text formats when JSON is missing or unreadable.

Ownership of drain reasons (only touch nodes healthd drained) is not checked here: that is the
caller's policy (``healthd.remediation`` and the backend); :meth:`SlurmClient.node` re-reads one
node's reason right before acting.
"""

from __future__ import annotations

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
from healthd.process import Completed, run

__all__ = ["CommandObserver", "OutputMode", "SlurmCli", "SlurmClient", "SlurmCommands"]

log = get_logger(__name__)
_T = TypeVar("_T")

OutputMode = Literal["auto", "json", "text"]
CommandName = Literal["sinfo", "squeue", "sbatch", "scancel", "scontrol"]
CommandObserver = Callable[[str, float, bool], None]
"""Called after every command with (command name, seconds, succeeded): for metrics."""

_JSON_SINCE = (21, 8, 0)
_SCANCEL_HARMLESS = ("invalid job id", "already completing or completed", "job has already finished")


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
        self._json: dict[str, bool] = {}

    # --- the one runner -----------------------------------------------------------------------

    def _run(
        self,
        name: CommandName,
        args: Sequence[str],
        read: Callable[[Completed], _T],
        *,
        check: bool = True,
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
                done = run(args, timeout=self.timeout_s, env=self._env)
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

    def _use_json(self, name: CommandName) -> bool:
        if self.output != "auto":
            return self.output == "json"
        with self._lock:
            known = self._json.get(name)
        if known is None:
            known = self.version() >= _JSON_SINCE
            with self._lock:
                self._json.setdefault(name, known)
        return known

    def _read_json(self, name: CommandName, parser: Callable[[str], _T]) -> Callable[[Completed], _T]:
        """Reader of a ``--json`` answer: in ``json`` mode every failure is a ``SlurmError``."""

        def read(done: Completed) -> _T:
            try:
                return parser(done.stdout)
            except ParseError as exc:
                if self.output != "json":
                    raise
                detail = f" (exit {done.returncode}: {_tail(done.stderr or done.stdout)})" if done.returncode else ""
                raise SlurmError(f"{name} --json: {exc}{detail}") from exc

        return read

    def _fell_back(self, name: CommandName, exc: ParseError | None) -> None:
        """The text command answered where JSON was unreadable: use text from now on."""
        if exc is None:
            return
        log.warning("slurm_json_unreadable", command=name, error=str(exc), fallback="text")
        with self._lock:
            self._json[name] = False

    def nodes(self) -> list[Node]:
        json_error = None
        if self._use_json("sinfo"):
            try:
                return self._run(
                    "sinfo",
                    argv.sinfo_json_argv(self.commands.sinfo),
                    self._read_json("sinfo", parse.parse_sinfo_json),
                    check=False,
                )
            except ParseError as exc:
                json_error = exc
        nodes = self._run(
            "sinfo",
            argv.sinfo_text_argv(self.commands.sinfo),
            lambda done: _text(parse.parse_sinfo_text, done.stdout, self._tz),
        )
        self._fell_back("sinfo", json_error)
        return nodes

    def node(self, name: str) -> Node:
        found = self._run(
            "scontrol",
            argv.scontrol_node_argv(self.commands.scontrol, name),
            lambda done: _text(parse.parse_scontrol_nodes, done.stdout, self._tz),
        )
        if len(found) != 1 or found[0].name != name:
            raise SlurmError(f"scontrol show node {name}: expected that one node, got {len(found)} lines")
        return found[0]

    def jobs(self, name_prefix: str) -> list[JobStatus]:
        if not name_prefix:
            raise ValueError("name_prefix must not be empty (it keeps healthd away from other jobs)")
        json_error = None
        if self._use_json("squeue"):
            try:
                return self._run(
                    "squeue",
                    argv.squeue_json_argv(self.commands.squeue),
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
        self._fell_back("squeue", json_error)
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


def _nothing(done: Completed) -> None:
    return None


def _scancel_result(done: Completed) -> None:
    """Unknown and already finished jobs are not errors (22.05 is silent about them anyway)."""
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
