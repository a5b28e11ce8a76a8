"""Ingesting other tools' output (nccl-tests, param, DDP benchmark, Horovod, dcgmi) as stored runs.

I/O-free: ``prepare`` takes a file's bytes, the tool, an optional node and a time and returns
the runs to store, each with a stable run id; ``healthd ingest`` (``healthd.commands.ingest``)
reads the files and writes the store.

Rules
-----
- One file gives one run per node set (``healthd.parsers.expand.merge_results``): a log of
  five nccl-tests binaries on one host is one run whose outcome is the worst binary's.
- Node attribution: the hosts named by the output's device listing (nccl-tests), else the
  ``node`` given (``--node``), else ``IngestError`` ("no node in the output; give --node").
- Unreadable output (``ParseError``) is not a crash: it becomes an ``error`` run on the given
  node with the parser's message as its reason (``readable`` is ``False``); without a node it
  is an ``IngestError``. A ``pass`` without a single measurement or check is an ``error``,
  as the collector treats one from a probe.
- Run id: ``ingest-<tool>-<node>-<16 hex>``, the hex from the tool, the node list and the
  SHA-256 of the file's bytes, so the same file on the same node is the same run whenever,
  and however often, it is ingested.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from datetime import datetime

from healthd.errors import HealthdError, InvalidNodeName, ParseError
from healthd.model import validate_node_name
from healthd.parsers.expand import merge_results
from healthd.parsers.tools import TOOLS, decode_output, results_from_text
from probes.result import Outcome, ProbeResult

__all__ = [
    "MAX_FILE_BYTES",
    "IngestError",
    "Prepared",
    "content_digest",
    "parse_results",
    "parse_time",
    "prepare",
    "run_id_for",
]

MAX_FILE_BYTES = 64 * 1024 * 1024
"""Larger files are not parsed (a log this size is not one tool run); they become an error run."""
SOURCE = "ingest"


class IngestError(HealthdError):
    """A file whose output cannot be stored: no node to attribute it to, or a host that is not a node name."""


@dataclass(frozen=True, slots=True)
class Prepared:
    """One run to store: ``result`` (its ``run_id`` set), the nodes it is filed under."""

    result: ProbeResult
    nodes: tuple[str, ...]
    run_id: str
    readable: bool = True
    """``False`` when the output could not be parsed and ``result`` is the error run recording that."""


def parse_time(text: str) -> float:
    """Unix seconds from ``1714564800``/``1714564800.5`` or ISO 8601 (``2024-05-01T12:00:00Z``,
    ``2024-05-01 14:00:00+02:00``); ISO times without an offset are in the local time zone.
    ``ValueError`` otherwise."""
    raw = text.strip()
    try:
        value = float(raw)
    except ValueError:
        try:
            value = datetime.fromisoformat(raw).timestamp()
        except ValueError:
            raise ValueError(f"{text!r} is neither unix seconds nor an ISO 8601 time") from None
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{text!r} is not a time after 1970")
    return value


def content_digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def run_id_for(tool: str, nodes: tuple[str, ...], digest: str) -> str:
    """The stable run id of ``tool``'s output with SHA-256 ``digest`` filed under ``nodes``."""
    h = hashlib.sha256(f"{tool}\n{','.join(nodes)}\n{digest}".encode()).hexdigest()[:16]
    if not nodes:
        where = "nonode"
    elif len(nodes) == 1:
        where = nodes[0]
    else:
        where = f"{nodes[0]}+{len(nodes) - 1}"
    return f"{SOURCE}-{tool}-{where}-{h}"


def parse_results(text: str, *, tool: str, node: str | None, at: float) -> list[ProbeResult]:
    """``tool``'s output as results, one per node set, at time ``at``; ``node`` is used where the
    output names no host. ``ParseError`` for unreadable output, ``ValueError`` for an unknown tool."""
    results = results_from_text(tool, text, node=node, at=at)
    if not results:
        raise ParseError(f"no {tool} results in the output")
    return merge_results(results)


def _no_measurements(result: ProbeResult) -> ProbeResult:
    if result.outcome is Outcome.PASS and not result.measurements and not result.checks:
        return result.model_copy(update={"outcome": Outcome.ERROR, "reason": "the output has no measurements"})
    return result


def prepare(data: bytes, *, tool: str, node: str | None, at: float, name: str) -> list[Prepared]:
    """The runs to store for one file's bytes ``data`` (``name`` is used in messages only).

    ``node`` must already be a valid node name (``validate_node_name``). Raises
    ``IngestError`` (naming the file) when a run would have no node or the output names a
    host that is not a node name; ``ValueError`` for an unknown tool.
    """
    if tool not in TOOLS:
        raise ValueError(f"unknown tool {tool!r}; known tools: {', '.join(sorted(TOOLS))}")
    digest = content_digest(data)
    probe = TOOLS[tool].probe
    problem = ""
    results: list[ProbeResult] = []
    if len(data) > MAX_FILE_BYTES:
        problem = f"the file is larger than the {MAX_FILE_BYTES // (1024 * 1024)} MiB ingest reads"
    else:
        try:
            results = parse_results(decode_output(data), tool=tool, node=node, at=at)
        except ParseError as exc:
            problem = f"unreadable {tool} output: {exc}"
    if problem:
        if node is None:
            raise IngestError(f"{name}: {problem}; no node in the output; give --node")
        error = ProbeResult(
            probe=probe,
            outcome=Outcome.ERROR,
            reason=problem,
            started_at=at,
            finished_at=at,
            nodes=[node],
            params={"tool": tool, "file": name},
        )
        run_id = run_id_for(tool, (node,), digest)
        return [Prepared(error.model_copy(update={"run_id": run_id}), (node,), run_id, readable=False)]
    prepared: list[Prepared] = []
    for result in results:
        nodes = tuple(result.nodes)
        if not nodes:
            raise IngestError(f"{name}: no node in the output; give --node")
        for host in nodes:
            try:
                validate_node_name(host)
            except InvalidNodeName as exc:
                raise IngestError(f"{name}: the output names host {host!r}, which is not a node name ({exc})") from None
        run_id = run_id_for(tool, nodes, digest)
        final = _no_measurements(result).model_copy(update={"run_id": run_id})
        prepared.append(Prepared(final, nodes, run_id))
    return prepared
