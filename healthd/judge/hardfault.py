"""Hard faults: a probe that did not finish, sorted into "the node broke" and "could not check" (pure).

A probe that ends without a verdict of its own (``error``) says why in its result document: rank 0
writes ``probes.liveness.diagnose``'s lines (``rank 3 (node n2) was stuck in phase 'nccl.all_reduce'
while rank 0 reached 'probe.end'``, ``... died without reporting an error, in phase ...``, ``...
failed in phase ...: <error>``) or the launch error (``8 ranks on this node but 7 GPUs visible``).
``classify`` turns such a text into a ``HardFault`` when the evidence points at nodes of the run:

- ``gpus_missing``: the probe started on the node and found fewer GPUs than it needs;
- ``hang``: a rank stuck in the measurement phase while others went on (every rank stuck in the
  same phase is no evidence: a probe too slow for its timeout on a loaded node looks just so);
- ``crash``: a rank that died without a word in the measurement phase;
- ``cuda_error`` / ``nccl_error``: a CUDA or NCCL error on the node's ranks (not a peer's failure
  reported remotely, nor NCCL refusing how it was used: ``ncclInvalidUsage``/``ncclInvalidArgument``,
  ``Duplicate GPU detected : rank 1 and rank 0 both on CUDA device 1000`` when two ranks share a
  GPU: a configuration error, which the run reports as ``error``).

When every node of a multi-node run is named, the group is suspect (localisation finds the node).
Anything else (submit refused, no result file, launcher or image missing, a rank that never
joined, a rank lost in start-up, a plain timeout) is not the node's: ``classify`` returns ``None``
and the run stays ``error``. The collector writes the fault into the run's reason
(``HardFault.reason``: ``hang on n2: ...``), which is stored, so the judge and replays read it back
with ``parse_reason``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from healthd.judge.model import ReasonCode

HARD_FAULTS = (ReasonCode.GPUS_MISSING, ReasonCode.HANG, ReasonCode.CRASH, ReasonCode.CUDA_ERROR,
               ReasonCode.NCCL_ERROR, ReasonCode.FABRIC_MANAGER)
"""Faults no noise makes (confirmed without the cold-start rule). ``fabric_manager`` is the node check's
(``healthd.judge.sources.boundary``), never a probe run's reason."""
START_UP_PHASES = frozenset({"start-up", "'init'", "'environment'"})
"""Phases before the probe's measurement (``probes.runner``): a failure there is not attributed to
the node by a hang or a crash (the launcher, the store or the image may be at fault)."""

_WHO = r"rank (?P<rank>\d+) \(node (?P<node>[^)\s]+)\)"
_STUCK = re.compile(_WHO + r" was stuck in phase (?P<phase>'[^']*'|start-up)")
_DIED = re.compile(_WHO + r" died without reporting an error, in phase (?P<phase>'[^']*'|start-up)")
_FAILED = re.compile(_WHO + r" failed in phase (?P<phase>'[^']*'|start-up): (?P<error>.*)")
_GPUS = re.compile(r"\d+ ranks on this node but \d+ GPUs visible|no CUDA device is visible"
                   r"|\d+ GPU\(s\) visible, \d+ expected", re.IGNORECASE)
_CUDA = re.compile(r"CUDA error|cudaError|CUBLAS_STATUS|CUDNN_STATUS|illegal memory access|uncorrectable ECC"
                   r"|\bXid\b|CUDA driver|device-side assert", re.IGNORECASE)
_NCCL = re.compile(r"NCCL error|nccl(Internal|System|UnhandledCuda)Error|NCCL WARN", re.IGNORECASE)
_NCCL_USAGE = re.compile(r"Duplicate GPU detected|ncclInvalid(Usage|Argument)|NCCL error[^;]*invalid (usage|argument)",
                         re.IGNORECASE)
"""NCCL refusing how it is called (its ``ncclInvalidUsage`` and ``ncclInvalidArgument``; torch words them
``NCCL error in: ..., invalid usage``), e.g. two ranks on one GPU: the setup's mistake, not the node's."""
_REMOTE = re.compile(r"ncclRemoteError|remote process|peer|Connection reset|closed by", re.IGNORECASE)
_REASON = re.compile(r"^(?P<code>[a-z_]+)(?: on (?P<nodes>[^\s:]+))?: (?P<detail>.*)$", re.DOTALL)


@dataclass(frozen=True)
class HardFault:
    code: ReasonCode
    nodes: tuple[str, ...]
    """The nodes the evidence points at; empty: the run's nodes as a group (to be localised)."""
    detail: str

    def reason(self) -> str:
        """The run's stored reason: ``hang on n2: <detail>`` (``hang: <detail>`` for a group)."""
        where = f" on {','.join(self.nodes)}" if self.nodes else ""
        return f"{self.code.value}{where}: {self.detail}"


def parse_reason(reason: str) -> HardFault | None:
    """The hard fault a ``fail`` run's reason was written from (``HardFault.reason``), else ``None``.

    >>> parse_reason("hang on n2,n3: rank 3 (node n2) was stuck")
    HardFault(code=<ReasonCode.HANG: 'hang'>, nodes=('n2', 'n3'), detail='rank 3 (node n2) was stuck')
    """
    match = _REASON.match(reason)
    if match is None or match["code"] not in {c.value for c in HARD_FAULTS}:
        return None
    nodes = tuple(n for n in (match["nodes"] or "").split(",") if n)
    return HardFault(ReasonCode(match["code"]), nodes, match["detail"])


def classify(text: str, nodes: Sequence[str]) -> HardFault | None:
    """The hard fault ``text`` (an ``error`` result's reason, or a failed job's output) shows on the
    run's ``nodes``, or ``None`` when it shows none (the run stays ``error``)."""
    members = set(nodes)
    found: dict[ReasonCode, list[str]] = {}
    group: ReasonCode | None = None
    for line in (part.strip() for part in text.split("; ")):
        code, node = _line(line)
        if code is None:
            continue
        if node is None:
            if len(members) == 1:
                node = next(iter(members))
            else:
                group = group or code
                continue
        if node in members:
            found.setdefault(code, []).append(node)
    if found:
        code = min(found, key=HARD_FAULTS.index)
        culprits = tuple(dict.fromkeys(found[code]))
        if len(members) > 1 and set(culprits) == members:
            return HardFault(code, (), text)
        return HardFault(code, culprits, text)
    if group is not None:
        return HardFault(group, () if len(members) > 1 else tuple(members), text)
    return None


def _start_up(match: re.Match[str] | None) -> bool:
    return match is not None and match["phase"] in START_UP_PHASES


def _line(line: str) -> tuple[ReasonCode | None, str | None]:
    """The hard fault one diagnosis line names, and its node (``None``: not named)."""
    if _GPUS.search(line):
        m = re.search(_WHO, line)
        return ReasonCode.GPUS_MISSING, m["node"] if m else None
    if (m := _STUCK.search(line)) is not None:
        return (None, None) if _start_up(m) else (ReasonCode.HANG, m["node"])
    if (m := _DIED.search(line)) is not None:
        return (None, None) if _start_up(m) else (ReasonCode.CRASH, m["node"])
    failed = _FAILED.search(line)
    error = failed["error"] if failed else line
    node = failed["node"] if failed else None
    if _NCCL_USAGE.search(line):
        return None, None
    if _REMOTE.search(error):
        return None, None
    if _CUDA.search(error):
        return ReasonCode.CUDA_ERROR, node
    if _NCCL.search(error):
        return ReasonCode.NCCL_ERROR, node
    return None, None
