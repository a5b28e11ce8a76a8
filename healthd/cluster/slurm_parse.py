"""Pure parsers for the output of Slurm's commands: text in, ``Node``/``JobStatus`` out, no I/O.

Two families:

- JSON: :func:`load_json` reads the document, takes the Slurm release from its ``meta`` block
  (``meta.Slurm.version`` with integers on 22.05, ``meta.slurm.version`` with strings on 24.11+) and
  raises ``SlurmError`` when Slurm filled ``errors`` (22.05 exits 0 with an ``errors`` array and
  empty lists when slurmctld is down; 24.11+ exits 1 with no JSON at all, which reads as a
  ``ParseError``). The per-release normalisers in ``NODE_NORMALISERS``/``JOB_NORMALISERS`` turn the
  release's shapes into healthd's types; a release with no normaliser of its own gets the closest
  known one and a logged warning. Known: 22.05 (``sinfo --json`` one entry per node, ``squeue
  --json``: states as strings, numbers as integers, ``exit_code`` a raw wait status) and 24.11/26.05
  with the ``v0.0.42`` data parser (``scontrol --json show node``, ``squeue --json``: states as
  lists of words, numbers as ``{"set", "infinite", "number"}`` objects, ``exit_code`` an object).
- Text (the fallback when JSON is missing or unreadable): ``sinfo -O``/``squeue -O`` with the
  fields of ``slurm_argv``, ``scontrol -o show node``, ``sbatch --parsable``, ``--version``. These
  read alike on 22.05, 24.11 and 26.05, except ``squeue -O exit_code``: a raw wait status (``768``)
  on 22.05, ``exit:signal`` (``3:0``, ``0:15``) on 24.11+; both are read.

Node flags are compared as sets (their order differs between releases). A node's reason (and who set
it, when) is reported only while it applies, that is for a drained, down or failing node: 24.11
keeps the last reason after ``State=UNDRAIN`` or a return to service, 22.05 and 26.05 clear it.

Unreadable input raises ``ParseError`` saying what was expected and where. Times in text output are
the controller host's local time without a zone: pass ``tz`` when that is not this host's zone.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, tzinfo
from typing import Any, TypeVar

import hostlist

from healthd.cluster.slurm_argv import SINFO_TEXT_FIELDS, SQUEUE_TEXT_FIELDS, Release
from healthd.errors import ParseError, SlurmError
from healthd.logging import get_logger
from healthd.model import JobState, JobStatus, Node

__all__ = [
    "JOB_NORMALISERS",
    "NODE_NORMALISERS",
    "JsonDoc",
    "Release",
    "closest_release",
    "exit_status",
    "expand_nodes",
    "job_state",
    "job_state_words",
    "load_json",
    "node_state_words",
    "parse_gres",
    "parse_sbatch_parsable",
    "parse_scontrol_json",
    "parse_scontrol_nodes",
    "parse_sinfo_json",
    "parse_sinfo_text",
    "parse_slurm_time",
    "parse_squeue_json",
    "parse_squeue_text",
    "parse_version",
    "split_state",
]

log = get_logger(__name__)

_T = TypeVar("_T")

_JOB_STATES: dict[str, JobState] = {
    "PENDING": JobState.PENDING,
    "CONFIGURING": JobState.PENDING,
    "REQUEUED": JobState.PENDING,
    "REQUEUE_HOLD": JobState.PENDING,
    "REQUEUE_FED": JobState.PENDING,
    "RESV_DEL_HOLD": JobState.PENDING,
    "SPECIAL_EXIT": JobState.PENDING,
    "RUNNING": JobState.RUNNING,
    "COMPLETING": JobState.RUNNING,
    "SUSPENDED": JobState.RUNNING,
    "STOPPED": JobState.RUNNING,
    "SIGNALING": JobState.RUNNING,
    "STAGE_OUT": JobState.RUNNING,
    "RESIZING": JobState.RUNNING,
    "COMPLETED": JobState.COMPLETED,
    "FAILED": JobState.FAILED,
    "NODE_FAIL": JobState.FAILED,
    "OUT_OF_MEMORY": JobState.FAILED,
    "BOOT_FAIL": JobState.FAILED,
    "CANCELLED": JobState.CANCELLED,
    "PREEMPTED": JobState.PREEMPTED,
    "DEADLINE": JobState.CANCELLED,
    "REVOKED": JobState.CANCELLED,
    "TIMEOUT": JobState.TIMEOUT,
}

# A job's state flags that Slurm's own job_state_string() reports instead of the base state, in its
# order of precedence: a list such as ["COMPLETED", "COMPLETING"] (24.11+) reads as 22.05's string.
_JOB_FLAG_PRECEDENCE = (
    "COMPLETING",
    "STAGE_OUT",
    "CONFIGURING",
    "RESIZING",
    "REQUEUED",
    "REQUEUE_FED",
    "REQUEUE_HOLD",
    "SPECIAL_EXIT",
    "STOPPED",
    "REVOKED",
    "RESV_DEL_HOLD",
    "SIGNALING",
)
# Node base states (NODE_STATE_BASE); every other word of a node's state is a flag.
_NODE_BASE_STATES = frozenset({"IDLE", "DOWN", "ALLOCATED", "ERROR", "MIXED", "FUTURE", "UNKNOWN"})
# A node's reason applies while it is drained, down or failing (see the module docstring).
_REASON_STATES = frozenset({"down", "drained", "draining", "fail", "failing"})
_REASON_FLAGS = frozenset({"DRAIN", "FAIL"})

# Older one-letter state suffixes (``sinfo %T``/``StateLong``) and the flag each stands for.
_STATE_SUFFIXES = {
    "*": "NOT_RESPONDING",
    "~": "POWERED_DOWN",
    "#": "POWERING_UP",
    "%": "POWERING_DOWN",
    "!": "POWER_DOWN",
    "@": "REBOOT_REQUESTED",
    "^": "REBOOT_ISSUED",
    "-": "PLANNED",
    "$": "MAINTENANCE",
}
_NO_VALUE = {"", "n/a", "none", "unknown", "(null)"}


# --- small pieces shared by both families -------------------------------------------------------


def job_state(name: str) -> JobState:
    """Map a Slurm job state (``RUNNING``, ``CANCELLED by 0``, ``cancelled``) to ``JobState``.

    States healthd does not know map to ``JobState.UNKNOWN`` (never to a finished state).
    """
    word = name.strip().split(" ", 1)[0].upper() if name.strip() else ""
    return _JOB_STATES.get(word, JobState.UNKNOWN)


def job_state_words(words: Sequence[str]) -> JobState:
    """Map a job state list (24.11+: ``["RUNNING"]``, ``["COMPLETED", "COMPLETING"]``) to ``JobState``.

    The words are read as Slurm's own ``job_state_string()`` reads the state bits: a flag such as
    COMPLETING or CONFIGURING wins over the base state, so the result is that of 22.05's string.
    """
    upper = {w.strip().upper() for w in words}
    for flag in _JOB_FLAG_PRECEDENCE:
        if flag in upper:
            return job_state(flag)
    states = {job_state(w) for w in upper} - {JobState.UNKNOWN}
    return states.pop() if len(states) == 1 else JobState.UNKNOWN


def node_state_words(words: Sequence[str]) -> tuple[str, frozenset[str]]:
    """Base state (lower case) and flags (upper case) of a state list (24.11+: ``["IDLE", "DRAIN"]``).

    The base state is whichever word is one (IDLE, MIXED, DOWN...), wherever it stands in the list.
    """
    upper = [w.strip().upper() for w in words if w.strip()]
    bases = [w for w in upper if w in _NODE_BASE_STATES]
    if len(bases) != 1:
        raise ParseError(f"node state {list(words)!r}: expected exactly one base state such as IDLE or MIXED")
    return bases[0].lower(), frozenset(w for w in upper if w != bases[0])


def _reason_applies(state: str, flags: frozenset[str]) -> bool:
    return state in _REASON_STATES or bool(flags & _REASON_FLAGS)


def _node(
    *,
    name: str,
    state: str,
    flags: frozenset[str],
    partitions: tuple[str, ...],
    gres: str,
    features: tuple[str, ...],
    reason: str | None,
    reason_user: str | None,
    reason_time: float | None,
    cpus: int | None,
) -> Node:
    """The one place a ``Node`` is made from any output: the reason is kept only while it applies."""
    gpus, gpu_type = parse_gres(gres)
    keep = _reason_applies(state, flags)
    return Node(
        name=name,
        state=state,
        flags=flags,
        partitions=partitions,
        gpus=gpus,
        gpu_type=gpu_type,
        features=features,
        reason=(reason or None) if keep else None,
        reason_user=(reason_user or None) if keep else None,
        reason_time=reason_time if keep else None,
        cpus=cpus,
    )


def exit_status(raw: int) -> int | None:
    """The process exit status from Slurm's raw wait status (``exit_code`` of squeue).

    ``exit 3`` is stored as 768 and gives 3; death by signal N (low 7 bits) gives ``128 + N``,
    as a shell reports it. Values that are not a wait status (NO_VAL, negative) give ``None``.
    """
    if raw < 0 or raw > 0xFFFF:
        return None
    signal = raw & 0x7F
    return 128 + signal if signal else (raw >> 8) & 0xFF


def exit_status_text(text: str) -> int | None:
    """The exit status from ``squeue -O exit_code``: ``768`` (22.05, a raw wait status) or ``3:0`` /
    ``0:15`` (24.11+, exit code and signal; a signal gives ``128 + N``)."""
    value = text.strip()
    if ":" in value:
        code, _, signal = value.partition(":")
        code_n, signal_n = _int(code, "exit_code"), _int(signal, "exit_code signal")
        if code_n < 0 or signal_n < 0:
            return None
        return 128 + signal_n if signal_n else code_n
    return exit_status(_int(value, "exit_code"))


def parse_gres(gres: str) -> tuple[int, str | None]:
    """GPU count and type from a node's GRES (``gpu:tgpu:2``, ``gpu:a100:8(S:0-1),nic:2``, ``gpu:4``).

    Several GPU types on one node give their sorted names joined by ``,``. ``(null)``, ``N/A`` and
    the empty string mean no GRES.
    """
    text = gres.strip()
    if text.lower() in _NO_VALUE:
        return 0, None
    count = 0
    types: set[str] = set()
    for entry in split_top_level(text):
        spec = entry.split("(", 1)[0].strip()
        if not spec:
            continue
        parts = spec.split(":")
        if parts[0] != "gpu":
            continue
        gpu_type: str | None = None
        n = 1
        if len(parts) == 2:
            if parts[1].isdigit():
                n = int(parts[1])
            else:
                gpu_type = parts[1]
        elif len(parts) >= 3:
            gpu_type = ":".join(parts[1:-1])
            if not parts[-1].isdigit():
                raise ParseError(f"GRES {gres!r}: expected a count after {':'.join(parts[:-1])!r}")
            n = int(parts[-1])
        count += n
        if gpu_type:
            types.add(gpu_type)
    return count, ",".join(sorted(types)) if types else None


def split_top_level(text: str, brackets: str = "()") -> list[str]:
    """``text`` split at the commas outside ``brackets`` (``"()"`` for GRES, ``"[]"`` for hostlists)."""
    opening, closing = brackets[0], brackets[1]
    out, depth, start = [], 0, 0
    for i, c in enumerate(text):
        if c == opening:
            depth += 1
        elif c == closing:
            depth = max(0, depth - 1)
        elif c == "," and depth == 0:
            out.append(text[start:i])
            start = i + 1
    out.append(text[start:])
    return out


def split_state(text: str) -> tuple[str, frozenset[str]]:
    """Base state (lower case) and flags (upper case) of ``idle+drain``, ``DOWN+NOT_RESPONDING``, ``idle*``."""
    words = [w for w in text.strip().split("+") if w]
    if not words:
        raise ParseError(f"node state {text!r}: expected a state such as 'idle' or 'idle+drain'")
    base = words[0]
    flags = {w.upper() for w in words[1:]}
    while base and base[-1] in _STATE_SUFFIXES:
        flags.add(_STATE_SUFFIXES[base[-1]])
        base = base[:-1]
    base = base.lower()
    if base in {"drained", "draining", "drain"}:
        flags.add("DRAIN")
    if not re.fullmatch(r"[a-z_]+", base):
        raise ParseError(f"node state {text!r}: expected a lower-case word before any '+'")
    return base, frozenset(flags)


def parse_slurm_time(text: str, tz: tzinfo | None = None) -> float | None:
    """Unix seconds of a Slurm text time (``2026-11-22T03:14:53``, local time of the controller).

    ``N/A``, ``NONE``, ``Unknown`` and the empty string give ``None``. ``tz`` is the zone the time
    is in; ``None`` means this host's local zone.
    """
    value = text.strip()
    if value.lower() in _NO_VALUE:
        return None
    try:
        moment = datetime.strptime(value, "%Y-%m-%dT%H:%M:%S")
    except ValueError:
        raise ParseError(f"time {text!r}: expected YYYY-MM-DDTHH:MM:SS, N/A or Unknown") from None
    return (moment.replace(tzinfo=tz) if tz is not None else moment.astimezone()).timestamp()


def expand_nodes(expr: str) -> tuple[str, ...]:
    """``node[01-03,07]`` → ``("node01", "node02", "node03", "node07")``; empty or ``(null)`` → ()."""
    value = expr.strip()
    if value.lower() in _NO_VALUE:
        return ()
    try:
        return tuple(hostlist.expand_hostlist(value))
    except hostlist.BadHostlist as exc:
        raise ParseError(f"node list {expr!r}: {exc}") from None


def parse_config_value(text: str, key: str) -> str | None:
    """The value of ``key`` in ``scontrol show config``'s ``Key = value`` lines; ``None`` when the key is
    missing or its value is ``(null)`` (not set).

    >>> parse_config_value("RebootProgram           = /sbin/reboot\\nResumeTimeout = 60 sec", "RebootProgram")
    '/sbin/reboot'
    """
    for line in text.splitlines():
        name, sep, value = line.partition("=")
        if sep and name.strip() == key:
            value = value.strip()
            return None if value in ("", "(null)") else value
    return None


def parse_version(text: str) -> tuple[int, int, int]:
    """``slurm 22.05.8`` / ``slurm-wlm 22.05.8`` (``--version`` of any command) → ``(22, 5, 8)``."""
    match = re.search(r"\bslurm(?:-wlm)?\s+(\d+)\.(\d+)\.(\d+)", text)
    if not match:
        first = text.strip().splitlines()[0] if text.strip() else ""
        raise ParseError(f"version: expected 'slurm X.Y.Z' on line 1, got {first!r}")
    major, minor, micro = (int(g) for g in match.groups())
    return major, minor, micro


def parse_sbatch_parsable(text: str) -> str:
    """The job id printed by ``sbatch --parsable`` (``123`` or ``123;cluster``)."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if not lines:
        raise ParseError("sbatch --parsable: expected a job id on line 1, got no output")
    job_id = lines[-1].split(";", 1)[0]
    if not job_id.isdigit():
        raise ParseError(f"sbatch --parsable: expected a job id on line {len(lines)}, got {lines[-1]!r}")
    return job_id


# --- JSON ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class JsonDoc:
    """A Slurm JSON document whose ``errors`` were empty, with the release that wrote it."""

    version: tuple[int, int, int]
    data: Mapping[str, Any]

    @property
    def release(self) -> Release:
        return self.version[0], self.version[1]


def load_json(text: str, command: str) -> JsonDoc:
    """Read a ``--json`` document of ``command`` (``sinfo``, ``squeue``).

    :raises ParseError: not JSON, or no readable ``meta`` version (the caller may fall back to text).
    :raises SlurmError: Slurm reported ``errors`` (controller down, permission denied...).
    """
    if not text.strip():
        raise ParseError(f"{command} --json: expected JSON, got no output")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ParseError(f"{command} --json: expected JSON, {exc.msg} at line {exc.lineno}") from None
    if not isinstance(data, dict):
        raise ParseError(f"{command} --json: expected a JSON object, got {type(data).__name__}")
    version = _meta_version(data, command)
    errors = data.get("errors") or []
    if not isinstance(errors, list):
        raise ParseError(f"{command} --json: expected 'errors' to be a list")
    if errors:
        raise SlurmError(f"{command} --json reported: {'; '.join(_error_text(e) for e in errors)}")
    return JsonDoc(version, data)


def _meta_version(data: Mapping[str, Any], command: str) -> tuple[int, int, int]:
    meta = data.get("meta")
    slurm = None
    if isinstance(meta, dict):
        slurm = meta.get("Slurm") or meta.get("slurm")
    version = slurm.get("version") if isinstance(slurm, dict) else None
    try:
        if not isinstance(version, dict):
            raise TypeError
        return int(version["major"]), int(version["minor"]), int(version["micro"])
    except (KeyError, TypeError, ValueError):
        raise ParseError(f"{command} --json: expected meta.Slurm.version.{{major,minor,micro}}") from None


def _error_text(error: object) -> str:
    if not isinstance(error, dict):
        return str(error)
    parts = [str(error[k]) for k in ("description", "error", "source") if error.get(k)]
    code = error.get("error_number", error.get("errno", error.get("error_code")))
    return " / ".join(parts or ["unspecified"]) + (f" (errno {code})" if code is not None else "")


class _Fields:
    """Typed access to one JSON object, with its path in every ``ParseError``."""

    def __init__(self, obj: object, path: str) -> None:
        if not isinstance(obj, dict):
            raise ParseError(f"{path}: expected an object, got {type(obj).__name__}")
        self.obj: dict[str, Any] = obj
        self.path = path

    def get(self, key: str, kind: type[_T]) -> _T:
        if key not in self.obj:
            raise ParseError(f"{self.path}.{key}: missing")
        value = self.obj[key]
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise ParseError(f"{self.path}.{key}: expected {kind.__name__}, got {type(value).__name__}")
        return value

    def optional(self, key: str, kind: type[_T]) -> _T | None:
        return None if self.obj.get(key) is None else self.get(key, kind)

    def strings(self, key: str) -> list[str]:
        values = self.get(key, list)
        if not all(isinstance(v, str) for v in values):
            raise ParseError(f"{self.path}.{key}: expected a list of strings")
        return values

    def number(self, key: str) -> int | None:
        """A 24.11+ number object ``{"set": true, "infinite": false, "number": N}``: ``N``, or ``None``
        when it is not set or infinite ("no limit")."""
        obj = _Fields(self.get(key, dict), f"{self.path}.{key}")
        if not obj.get("set", bool) or obj.get("infinite", bool):
            return None
        return obj.get("number", int)


def _list(data: Mapping[str, Any], key: str, command: str) -> list[Any]:
    value = data.get(key)
    if not isinstance(value, list):
        raise ParseError(f"{command} --json: expected a '{key}' list")
    return value


def _features(text: str) -> tuple[str, ...]:
    return () if text.strip().lower() in _NO_VALUE else tuple(f for f in text.split(",") if f)


def _nodes_v22_05(doc: JsonDoc) -> list[Node]:
    """``sinfo --json`` of 22.05: one entry per node, ``state`` a word and ``state_flags`` a list."""
    nodes = []
    for i, raw in enumerate(_list(doc.data, "nodes", "sinfo")):
        f = _Fields(raw, f"nodes[{i}]")
        changed = f.get("reason_changed_at", int)
        nodes.append(
            _node(
                name=f.get("name", str),
                state=f.get("state", str).lower(),
                flags=frozenset(s.upper() for s in f.strings("state_flags")),
                partitions=tuple(sorted(f.strings("partitions"))),
                gres=f.get("gres", str),
                features=_features(f.get("features", str)),
                reason=f.get("reason", str),
                reason_user=f.optional("reason_set_by_user", str),
                reason_time=float(changed) if changed > 0 else None,
                cpus=f.get("cpus", int),
            )
        )
    return nodes


def _nodes_v0_0_42(doc: JsonDoc) -> list[Node]:
    """``scontrol --json=v0.0.42 show node`` of 24.11/26.05: one entry per node, ``state`` a list."""
    if "nodes" not in doc.data and "sinfo" in doc.data:
        raise ParseError(
            f"sinfo --json of Slurm {_release_text(doc.release)} groups nodes by partition and state "
            "('sinfo' list): per-node data comes from scontrol --json show node"
        )
    nodes = []
    for i, raw in enumerate(_list(doc.data, "nodes", "scontrol")):
        f = _Fields(raw, f"nodes[{i}]")
        words = f.strings("state")
        try:
            state, flags = node_state_words(words)
        except ParseError as exc:
            raise ParseError(f"nodes[{i}].state: {exc}") from None
        changed = f.number("reason_changed_at")
        nodes.append(
            _node(
                name=f.get("name", str),
                state=state,
                flags=flags,
                partitions=tuple(sorted(f.strings("partitions"))),
                gres=f.get("gres", str),
                features=tuple(f.strings("features")),
                reason=f.get("reason", str),
                reason_user=f.optional("reason_set_by_user", str),
                reason_time=float(changed) if changed else None,
                cpus=f.get("cpus", int),
            )
        )
    return nodes


def _job_times(
    state: JobState, nodes: tuple[str, ...], start: float | None, end: float | None
) -> tuple[float | None, float | None]:
    """A pending job's start is a forecast and a running job's end a limit: neither is reported."""
    started = start if nodes and state is not JobState.PENDING else None
    finished = end if state.finished else None
    return started, finished


def _jobs_v22_05(doc: JsonDoc, name_prefix: str) -> list[JobStatus]:
    jobs = []
    for i, raw in enumerate(_list(doc.data, "jobs", "squeue")):
        f = _Fields(raw, f"jobs[{i}]")
        name = f.get("name", str)
        if not name.startswith(name_prefix):
            continue
        state = job_state(f.get("job_state", str))
        nodes = expand_nodes(f.get("nodes", str))
        start, end = f.get("start_time", int), f.get("end_time", int)
        started, finished = _job_times(
            state, nodes, float(start) if start > 0 else None, float(end) if end > 0 else None
        )
        jobs.append(_job_status(f, state, nodes, name, exit_status(f.get("exit_code", int)), started, finished))
    return jobs


def _job_status(f: _Fields, state: JobState, nodes: tuple[str, ...], name: str, exit_code: int | None,
                started: float | None, finished: float | None) -> JobStatus:
    """One job of any JSON layout, once its release-specific fields are read."""
    reason = f.get("state_reason", str)
    return JobStatus(
        job_id=str(f.get("job_id", int)),
        state=state,
        exit_code=exit_code if state.finished and nodes else None,
        reason="" if reason == "None" else reason,
        started_at=started,
        finished_at=finished,
        nodes=nodes,
        name=name,
    )


def _exit_v0_0_42(f: _Fields) -> int | None:
    """``exit_code`` of 24.11+: ``{"status": [...], "return_code": N, "signal": {"id": N, "name"}}``;
    death by signal N gives ``128 + N`` as with 22.05's raw status."""
    signal = _Fields(f.get("signal", dict), f"{f.path}.signal").number("id")
    if signal:
        return 128 + signal
    return f.number("return_code")


def _jobs_v0_0_42(doc: JsonDoc, name_prefix: str) -> list[JobStatus]:
    """``squeue --json=v0.0.42 --states=all`` of 24.11/26.05: ``job_state`` a list, times as objects."""
    jobs = []
    for i, raw in enumerate(_list(doc.data, "jobs", "squeue")):
        f = _Fields(raw, f"jobs[{i}]")
        name = f.get("name", str)
        if not name.startswith(name_prefix):
            continue
        state = job_state_words(f.strings("job_state"))
        nodes = expand_nodes(f.get("nodes", str))
        start, end = f.number("start_time"), f.number("end_time")
        started, finished = _job_times(state, nodes, float(start) if start else None, float(end) if end else None)
        exit_code = _exit_v0_0_42(_Fields(f.get("exit_code", dict), f"jobs[{i}].exit_code"))
        jobs.append(_job_status(f, state, nodes, name, exit_code, started, finished))
    return jobs


NodeNormaliser = Callable[[JsonDoc], list[Node]]
JobNormaliser = Callable[[JsonDoc, str], list[JobStatus]]

NODE_NORMALISERS: dict[Release, NodeNormaliser] = {
    (22, 5): _nodes_v22_05,
    (24, 11): _nodes_v0_0_42,
    (26, 5): _nodes_v0_0_42,
}
"""Node list readers by Slurm release: 22.05 reads ``sinfo --json``, 24.11+ ``scontrol --json show node``."""

JOB_NORMALISERS: dict[Release, JobNormaliser] = {
    (22, 5): _jobs_v22_05,
    (24, 11): _jobs_v0_0_42,
    (26, 5): _jobs_v0_0_42,
}
"""``squeue --json`` readers by Slurm release."""

_warned: set[tuple[str, Release]] = set()


def closest_release(release: Release, known: Iterable[Release]) -> Release:
    """``release`` itself if known, else the newest known one before it, else the oldest known."""
    ordered = sorted(known)
    if not ordered:
        raise ValueError("no known releases")
    if release in ordered:
        return release
    older = [r for r in ordered if r < release]
    return older[-1] if older else ordered[0]


def _release_text(release: Release) -> str:
    return f"{release[0]}.{release[1]:02d}"


def _pick(table: Mapping[Release, _T], doc: JsonDoc, command: str) -> _T:
    chosen = closest_release(doc.release, table)
    if chosen != doc.release and (command, doc.release) not in _warned:
        _warned.add((command, doc.release))
        log.warning(
            "slurm_json_release_unknown",
            command=command,
            release=_release_text(doc.release),
            parser=_release_text(chosen),
        )
    return table[chosen]


def parse_sinfo_json(text: str) -> list[Node]:
    """Every node of ``sinfo --json`` (22.05; 24.11+ groups nodes and raises ``ParseError``).

    Raises ``ParseError`` or, when Slurm reported errors, ``SlurmError``.
    """
    doc = load_json(text, "sinfo")
    return _pick(NODE_NORMALISERS, doc, "sinfo")(doc)


def parse_scontrol_json(text: str) -> list[Node]:
    """Every node of ``scontrol --json show node [NAME]`` (24.11+), in the controller's order.

    An unknown NAME gives an empty list (24.11+ exits 0 with a "No nodes to dump" warning).
    Raises ``ParseError`` or, when Slurm reported errors, ``SlurmError``.
    """
    doc = load_json(text, "scontrol")
    return _pick(NODE_NORMALISERS, doc, "scontrol")(doc)


def parse_squeue_json(text: str, name_prefix: str) -> list[JobStatus]:
    """Jobs of ``squeue --json`` whose name starts with ``name_prefix``, in the order Slurm lists them."""
    doc = load_json(text, "squeue")
    return _pick(JOB_NORMALISERS, doc, "squeue")(doc, name_prefix)


# --- text ---------------------------------------------------------------------------------------


def _rows(text: str, fields: Sequence[str], command: str) -> Iterable[tuple[int, list[str]]]:
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        values = line.split("|", len(fields) - 1)
        if len(values) != len(fields):
            raise ParseError(
                f"{command} line {number}: expected {len(fields)} '|'-separated fields "
                f"({', '.join(fields)}), got {len(values)}"
            )
        yield number, values


def _int(value: str, what: str) -> int:
    try:
        return int(value.strip())
    except ValueError:
        raise ParseError(f"{what}: expected an integer, got {value!r}") from None


def _in_line(number: int, command: str, fn: Callable[[], _T]) -> _T:
    try:
        return fn()
    except ParseError as exc:
        raise ParseError(f"{command} line {number}: {exc}") from None


def parse_sinfo_text(text: str, tz: tzinfo | None = None) -> list[Node]:
    """Nodes from ``sinfo -N -O`` with ``SINFO_TEXT_FIELDS`` (one line per node and partition).

    Nodes keep the order of their first line; partitions are merged and sorted. sinfo lists only
    nodes that belong to a partition.
    """
    merged: dict[str, Node] = {}
    parts: dict[str, set[str]] = {}
    for number, values in _rows(text, SINFO_TEXT_FIELDS, "sinfo"):
        row = dict(zip(SINFO_TEXT_FIELDS, values, strict=True))
        name = row["NodeList"].strip()
        parts.setdefault(name, set()).add(row["Partition"].strip().rstrip("*"))
        if name in merged:
            continue

        def node(row: dict[str, str] = row, name: str = name) -> Node:
            state, flags = split_state(row["StateComplete"])
            reason = row["Reason"].strip()
            user = row["User"].strip()
            return _node(
                name=name,
                state=state,
                flags=flags,
                partitions=(),
                gres=row["Gres"],
                features=_features(row["Features"]),
                reason=None if reason.lower() in _NO_VALUE else reason,
                reason_user=None if user.lower() in _NO_VALUE else user,
                reason_time=parse_slurm_time(row["TimeStamp"], tz),
                cpus=_int(row["CPUs"], "CPUs"),
            )

        merged[name] = _in_line(number, "sinfo", node)
    return [_with_partitions(n, parts[n.name]) for n in merged.values()]


def _with_partitions(node: Node, partitions: set[str]) -> Node:
    return replace(node, partitions=tuple(sorted(p for p in partitions if p)))


def parse_squeue_text(text: str, name_prefix: str, tz: tzinfo | None = None) -> list[JobStatus]:
    """Jobs from ``squeue -O`` with ``SQUEUE_TEXT_FIELDS`` whose name starts with ``name_prefix``."""
    jobs = []
    for number, values in _rows(text, SQUEUE_TEXT_FIELDS, "squeue"):
        row = dict(zip(SQUEUE_TEXT_FIELDS, values, strict=True))
        if not row["Name"].startswith(name_prefix):
            continue

        def job(row: dict[str, str] = row) -> JobStatus:
            state = job_state(row["State"])
            nodes = expand_nodes(row["NodeList"])
            started, finished = _job_times(
                state, nodes, parse_slurm_time(row["StartTime"], tz), parse_slurm_time(row["EndTime"], tz)
            )
            reason = row["Reason"].strip()
            job_id = row["JobID"].strip()
            if not re.fullmatch(r"[0-9]+(?:_[0-9]+|_\[[0-9,%-]+\])?(?:\+[0-9]+)?", job_id):
                raise ParseError(f"JobID: expected a job id, got {job_id!r}")
            exit_code = exit_status_text(row["exit_code"])
            return JobStatus(
                job_id=job_id,
                state=state,
                exit_code=exit_code if state.finished and nodes else None,
                reason="" if reason == "None" else reason,
                started_at=started,
                finished_at=finished,
                nodes=nodes,
                name=row["Name"],
            )

        jobs.append(_in_line(number, "squeue", job))
    return jobs


_REASON_STAMPED = re.compile(r" Reason=(?P<text>.*?) \[(?P<user>[^@\]]*)@(?P<time>[0-9T:-]+)\]")
_REASON_BARE = re.compile(r" Reason=(?P<text>.*?)(?= Comment=| Extra=| ReservationName=|$)")
_PAIR = re.compile(r"(?:^|\s)([A-Za-z_]+)=(.*?)(?=\s+[A-Za-z_]+=|\s*$)")


def parse_scontrol_nodes(text: str, tz: tzinfo | None = None) -> list[Node]:
    """Nodes from ``scontrol -o show node`` (one line per node).

    ``Reason=`` is free text: it runs to the ``[user@time]`` that scontrol appends, after which
    other fields may follow (24.11+: ``ReservationName=``); without that stamp, to a following
    ``Comment=``/``Extra=``/``ReservationName=`` or to the end of the line.
    """
    nodes = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue

        def node(line: str = line) -> Node:
            reason_match = _REASON_STAMPED.search(line) or _REASON_BARE.search(line)
            rest = line[: reason_match.start()] + line[reason_match.end() :] if reason_match else line
            pairs = {k: v.strip() for k, v in _PAIR.findall(rest)}
            for key in ("NodeName", "State", "CPUTot"):
                if key not in pairs:
                    raise ParseError(f"expected {key}=")
            state, flags = split_state(pairs["State"])
            reason = reason_match.group("text").strip() if reason_match else ""
            groups = reason_match.groupdict() if reason_match else {}
            user, when = groups.get("user"), groups.get("time")
            return _node(
                name=pairs["NodeName"],
                state=state,
                flags=flags,
                partitions=tuple(sorted(_features(pairs.get("Partitions", "")))),
                gres=pairs.get("Gres", ""),
                features=_features(pairs.get("AvailableFeatures", "")),
                reason=reason or None,
                reason_user=user or None,
                reason_time=parse_slurm_time(when, tz) if when else None,
                cpus=_int(pairs["CPUTot"], "CPUTot"),
            )

        nodes.append(_in_line(number, "scontrol", node))
    return nodes


@dataclass(frozen=True)
class Reservation:
    """One reservation as ``scontrol -o show reservation NAME`` prints it (the fields healthd reads)."""

    name: str
    nodes: tuple[str, ...]
    users: tuple[str, ...]


RESERVATION_NOT_FOUND = re.compile(r"Reservation \S+ not found|Invalid reservation name", re.IGNORECASE)


def parse_reservation(text: str) -> Reservation:
    """The reservation of ``scontrol -o show reservation NAME`` (one line; 22.05, 24.11 and 26.05 alike)."""
    lines = [line for line in text.splitlines() if line.strip()]
    if len(lines) != 1:
        raise ParseError(f"scontrol show reservation: expected one line, got {len(lines)}")
    pairs = {k: v.strip() for k, v in _PAIR.findall(lines[0])}
    if "ReservationName" not in pairs or "Nodes" not in pairs:
        raise ParseError("scontrol show reservation: expected ReservationName= and Nodes=")
    users = pairs.get("Users", "(null)")
    return Reservation(
        name=pairs["ReservationName"],
        nodes=expand_nodes(pairs["Nodes"]),
        users=() if users == "(null)" else tuple(u for u in users.split(",") if u),
    )
