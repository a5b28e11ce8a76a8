"""The argv of every Slurm command healthd runs: pure functions, no I/O.

Each builder takes the command's own argv prefix (``["sinfo"]``, ``["/opt/slurm/bin/sinfo"]`` or a
wrapper such as ``["sudo", "-n", "scontrol"]``) and returns the full argv list. Node names and job
ids are validated here, before they can reach an argv: a bad node name raises ``InvalidNodeName``,
any other bad argument (a caller's bug, not a cluster problem) ``ValueError``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from healthd.model import validate_node_name

__all__ = [
    "DATA_PARSER",
    "JSON_DIALECTS",
    "RESERVATION_PREFIX",
    "SINFO_TEXT_FIELDS",
    "SQUEUE_TEXT_FIELDS",
    "JsonDialect",
    "Release",
    "drain_argv",
    "reboot_argv",
    "reservation_create_argv",
    "reservation_delete_argv",
    "reservation_show_argv",
    "reservation_update_argv",
    "resume_argv",
    "sbatch_argv",
    "scancel_argv",
    "scontrol_node_argv",
    "scontrol_nodes_json_argv",
    "scontrol_topology_argv",
    "show_config_argv",
    "sinfo_json_argv",
    "sinfo_text_argv",
    "squeue_json_argv",
    "squeue_text_argv",
    "undrain_argv",
    "validate_job_id",
    "validate_reservation_name",
    "version_argv",
]

SINFO_TEXT_FIELDS: tuple[str, ...] = (
    "NodeList",
    "StateComplete",
    "Partition",
    "Gres",
    "Features",
    "CPUs",
    "User",
    "TimeStamp",
    "Reason",
)
"""``sinfo -O`` fields of the text fallback, ``|``-separated; ``Reason`` (free text) is last."""

SQUEUE_TEXT_FIELDS: tuple[str, ...] = (
    "JobID",
    "State",
    "exit_code",
    "Reason",
    "StartTime",
    "EndTime",
    "NodeList",
    "Name",
)
"""``squeue -O`` fields of the text fallback, ``|``-separated; ``Name`` (free text) is last."""

Release = tuple[int, int]
"""A Slurm major release as (year, month): 22.05 is ``(22, 5)``."""

DATA_PARSER = "v0.0.42"
"""The JSON data parser pinned on 24.11+: 24.11 has v0.0.40-42, 26.05 v0.0.42-45; with it both
print the same shapes."""


@dataclass(frozen=True)
class JsonDialect:
    """How one Slurm release is asked for JSON (healthd knows these releases; others get the closest).

    :param nodes_command: ``sinfo`` (22.05: ``sinfo --json`` has one entry per node) or ``scontrol``
        (24.11+: ``sinfo --json`` groups nodes by partition and state; per-node data is
        ``scontrol --json show node``, which 22.05 does not have).
    :param data_parser: the ``--json=<parser>`` to pin, or ``None`` for bare ``--json`` (22.05 takes no
        argument).
    :param squeue_filters: ``squeue --json`` honours ``--all --states=all`` (24.11+, which otherwise
        hides finished jobs); 22.05 ignores every filter in JSON mode and lists all jobs anyway.
    """

    release: Release
    nodes_command: Literal["sinfo", "scontrol"]
    data_parser: str | None
    squeue_filters: bool


JSON_DIALECTS: dict[Release, JsonDialect] = {
    (22, 5): JsonDialect((22, 5), "sinfo", None, squeue_filters=False),
    (24, 11): JsonDialect((24, 11), "scontrol", DATA_PARSER, squeue_filters=True),
    (26, 5): JsonDialect((26, 5), "scontrol", DATA_PARSER, squeue_filters=True),
}
"""The JSON dialect of each Slurm release healthd was tested against (22.05.8, 24.11.5, 26.05.5)."""

RESERVATION_PREFIX = "healthd"
"""Every reservation healthd creates, changes or deletes has a name starting with this; no other."""

_DATA_PARSER = re.compile(r"^v[0-9]+\.[0-9]+\.[0-9]+$")
_JOB_ID = re.compile(r"^[0-9]{1,12}(?:_[0-9]{1,9})?(?:\+[0-9]{1,4})?$")


def _format(fields: Sequence[str]) -> str:
    """``type:|`` gives an unpadded, untruncated field followed by ``|``; the last field gets no suffix."""
    return ",".join([f"{f}:|" for f in fields[:-1]] + [f"{fields[-1]}:"])


def validate_job_id(job_id: str) -> str:
    """Return ``job_id`` if it looks like a Slurm job id (``123``, ``123_4``, ``123+1``), else raise."""
    if not isinstance(job_id, str) or not _JOB_ID.match(job_id):
        raise ValueError(f"{job_id!r} is not a Slurm job id")
    return job_id


def version_argv(sinfo: Sequence[str]) -> list[str]:
    return [*sinfo, "--version"]


def _json_option(data_parser: str | None) -> str:
    if data_parser is None:
        return "--json"
    if not _DATA_PARSER.match(data_parser):
        raise ValueError(f"{data_parser!r} is not a Slurm data parser version such as 'v0.0.42'")
    return f"--json={data_parser}"


def sinfo_json_argv(sinfo: Sequence[str], data_parser: str | None = None) -> list[str]:
    """All nodes as JSON (22.05: JSON mode ignores every filter, so none is given; 24.11+: groups of
    nodes by partition and state, see ``scontrol_nodes_json_argv``)."""
    return [*sinfo, _json_option(data_parser)]


def scontrol_nodes_json_argv(
    scontrol: Sequence[str], node: str | None = None, data_parser: str | None = DATA_PARSER
) -> list[str]:
    """Every node (or only ``node``) as JSON, one entry per node (24.11+; 22.05 has no ``--json``)."""
    return [
        *scontrol,
        _json_option(data_parser),
        "show",
        "node",
        *([validate_node_name(node)] if node is not None else []),
    ]


def sinfo_text_argv(sinfo: Sequence[str]) -> list[str]:
    """One line per node and partition, hidden partitions included, no header."""
    return [*sinfo, "--noheader", "--all", "--Node", "--Format", _format(SINFO_TEXT_FIELDS)]


def squeue_json_argv(squeue: Sequence[str], data_parser: str | None = None, *, filters: bool = False) -> list[str]:
    """All jobs as JSON, finished ones still in memory (``MinJobAge``) included.

    ``filters``: ask for every state and hidden partitions (``--all --states=all``): 24.11+ needs it
    to list finished jobs; 22.05 ignores filters in JSON mode, so its argv stays bare.
    """
    return [*squeue, _json_option(data_parser), *(["--all", "--states=all"] if filters else [])]


def squeue_text_argv(squeue: Sequence[str]) -> list[str]:
    """All jobs in every state (finished ones still in memory), hidden partitions included."""
    return [*squeue, "--noheader", "--all", "--states=all", "--Format", _format(SQUEUE_TEXT_FIELDS)]


def sbatch_argv(sbatch: Sequence[str], script: Path, extra_args: Sequence[str] = ()) -> list[str]:
    """``sbatch --parsable [extra_args] script``; ``extra_args`` are sbatch options and their values."""
    if isinstance(extra_args, str) or not all(isinstance(a, str) for a in extra_args):
        raise TypeError("extra_args must be a sequence of strings")
    return [*sbatch, "--parsable", *extra_args, str(script)]


def scancel_argv(scancel: Sequence[str], job_ids: Sequence[str]) -> list[str]:
    if isinstance(job_ids, str):
        raise TypeError("job_ids must be a sequence of job ids, not one string")
    if not job_ids:
        raise ValueError("scancel needs at least one job id")
    return [*scancel, *(validate_job_id(j) for j in job_ids)]


def _reason(reason: str) -> str:
    text = reason.strip()
    if not text:
        raise ValueError("a drain reason must not be empty")
    if not text.isprintable():
        raise ValueError(f"a drain reason must be one line of printable characters: {reason!r}")
    return text


def drain_argv(scontrol: Sequence[str], node: str, reason: str) -> list[str]:
    """DRAIN lets running jobs finish; the node then stays DRAINED until undrained."""
    return [*scontrol, "update", f"NodeName={validate_node_name(node)}", "State=DRAIN", f"Reason={_reason(reason)}"]


def undrain_argv(scontrol: Sequence[str], node: str) -> list[str]:
    """UNDRAIN clears the drain and leaves the base state alone (a DOWN node stays DOWN)."""
    return [*scontrol, "update", f"NodeName={validate_node_name(node)}", "State=UNDRAIN"]


def reboot_argv(scontrol: Sequence[str], node: str, reason: str) -> list[str]:
    """``scontrol reboot ASAP nextstate=DOWN reason=<reason> <node>``: Slurm drains the node, reboots it through
    its ``RebootProgram`` once idle, and brings it back DOWN (22.05 clears the DRAIN flag on the way; a cluster
    with ``ReturnToService=2`` even returns it to service by itself), so healthd keeps the node in its recheck
    reservation across the reboot."""
    return [*scontrol, "reboot", "ASAP", "nextstate=DOWN", f"reason={_reason(reason)}", validate_node_name(node)]


def resume_argv(scontrol: Sequence[str], node: str) -> list[str]:
    """RESUME: a DOWN node (back from a reboot) becomes usable again; a drain is cleared too."""
    return [*scontrol, "update", f"NodeName={validate_node_name(node)}", "State=RESUME"]


def show_config_argv(scontrol: Sequence[str]) -> list[str]:
    """``scontrol show config``: ``Key = value`` lines (``RebootProgram = (null)`` when there is none)."""
    return [*scontrol, "show", "config"]


def scontrol_node_argv(scontrol: Sequence[str], node: str | None = None) -> list[str]:
    """One line per node (``-o``); all nodes, or only ``node``."""
    return [*scontrol, "--oneliner", "show", "node", *([validate_node_name(node)] if node is not None else [])]


_TOPOLOGY_NAME = re.compile(r"^[A-Za-z0-9._-]{1,200}$")


def scontrol_topology_argv(scontrol: Sequence[str], name: str | None = None) -> list[str]:
    """``scontrol show topology`` (text on every release; no JSON): the cluster default topology, or
    (25.05+, topology.yaml) the one named ``name``. A name with ``=`` would be read as a filter."""
    if name is not None and (not isinstance(name, str) or not _TOPOLOGY_NAME.match(name)):
        raise ValueError(f"{name!r} is not a topology name (letters, digits, '._-')")
    return [*scontrol, "show", "topology", *([name] if name is not None else [])]


_RESERVATION = re.compile(r"^[A-Za-z0-9._-]{1,100}$")
_USER = re.compile(r"^[a-z_][a-z0-9_.-]{0,31}\$?$")


def validate_reservation_name(name: str) -> str:
    """``name`` if it is a reservation healthd may manage (it starts with ``RESERVATION_PREFIX``), else raise."""
    if not isinstance(name, str) or not _RESERVATION.match(name) or not name.startswith(RESERVATION_PREFIX):
        raise ValueError(f"{name!r} is not a reservation name of healthd's (letters, digits, '._-', "
                         f"starting with {RESERVATION_PREFIX!r})")
    return name


def _node_list(nodes: Sequence[str]) -> str:
    if isinstance(nodes, str) or not nodes:
        raise ValueError("a reservation needs a sequence of at least one node")
    return ",".join(validate_node_name(n) for n in sorted(set(nodes)))


def reservation_show_argv(scontrol: Sequence[str], name: str) -> list[str]:
    return [*scontrol, "--oneliner", "show", "reservation", validate_reservation_name(name)]


def reservation_create_argv(scontrol: Sequence[str], name: str, user: str, nodes: Sequence[str]) -> list[str]:
    """A reservation of ``nodes`` for ``user`` only, from now on with no end: no other user's job starts
    on them while they are in it. ``IGNORE_JOBS``: a job still ending there does not refuse it."""
    if not isinstance(user, str) or not _USER.match(user):
        raise ValueError(f"{user!r} is not a user name")
    return [*scontrol, "create", "reservation", f"ReservationName={validate_reservation_name(name)}",
            f"Users={user}", f"Nodes={_node_list(nodes)}", "StartTime=now", "Duration=infinite", "Flags=IGNORE_JOBS"]


def reservation_update_argv(scontrol: Sequence[str], name: str, nodes: Sequence[str]) -> list[str]:
    """Set the reservation's nodes to exactly ``nodes``."""
    return [*scontrol, "update", f"ReservationName={validate_reservation_name(name)}", f"Nodes={_node_list(nodes)}"]


def reservation_delete_argv(scontrol: Sequence[str], name: str) -> list[str]:
    return [*scontrol, "delete", f"ReservationName={validate_reservation_name(name)}"]
