"""The argv of every Slurm command healthd runs: pure functions, no I/O.

Each builder takes the command's own argv prefix (``["sinfo"]``, ``["/opt/slurm/bin/sinfo"]`` or a
wrapper such as ``["sudo", "-n", "scontrol"]``) and returns the full argv list. Node names and job
ids are validated here, before they can reach an argv: a bad node name raises ``InvalidNodeName``,
any other bad argument (a caller's bug, not a cluster problem) ``ValueError``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

from healthd.model import validate_node_name

__all__ = [
    "SINFO_TEXT_FIELDS",
    "SQUEUE_TEXT_FIELDS",
    "drain_argv",
    "sbatch_argv",
    "scancel_argv",
    "scontrol_node_argv",
    "sinfo_json_argv",
    "sinfo_text_argv",
    "squeue_json_argv",
    "squeue_text_argv",
    "undrain_argv",
    "validate_job_id",
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


def sinfo_json_argv(sinfo: Sequence[str]) -> list[str]:
    """All nodes as JSON (22.05: JSON mode ignores every filter, so none is given)."""
    return [*sinfo, "--json"]


def sinfo_text_argv(sinfo: Sequence[str]) -> list[str]:
    """One line per node and partition, hidden partitions included, no header."""
    return [*sinfo, "--noheader", "--all", "--Node", "--Format", _format(SINFO_TEXT_FIELDS)]


def squeue_json_argv(squeue: Sequence[str]) -> list[str]:
    """All jobs as JSON, finished ones still in memory (``MinJobAge``) included."""
    return [*squeue, "--json"]


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
    if any(c in text for c in "\n\r\0"):
        raise ValueError(f"a drain reason must be one line: {reason!r}")
    return text


def drain_argv(scontrol: Sequence[str], node: str, reason: str) -> list[str]:
    """DRAIN lets running jobs finish; the node then stays DRAINED until undrained."""
    return [*scontrol, "update", f"NodeName={validate_node_name(node)}", "State=DRAIN", f"Reason={_reason(reason)}"]


def undrain_argv(scontrol: Sequence[str], node: str) -> list[str]:
    """UNDRAIN clears the drain and leaves the base state alone (a DOWN node stays DOWN)."""
    return [*scontrol, "update", f"NodeName={validate_node_name(node)}", "State=UNDRAIN"]


def scontrol_node_argv(scontrol: Sequence[str], node: str | None = None) -> list[str]:
    """One line per node (``-o``); all nodes, or only ``node``."""
    return [*scontrol, "--oneliner", "show", "node", *([validate_node_name(node)] if node is not None else [])]
