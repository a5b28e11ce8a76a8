"""What the node must have, as the daemon says it: ``--expect-gpus N`` and ``--expect-gpu-uuids``.

A node of a GPU class whose GPUs are gone must never pass as a CPU run. When the daemon expects
GPUs (``--expect-gpus`` > 0), a probe does not fall back to the CPU:

- standalone (the local backend, a one-task srun step), :func:`preflight` counts the GPUs this
  process can use before any rank starts and, when there are fewer than expected, the launcher
  writes a ``fail`` document at once: one failed ``env.gpu_count`` check naming the node and the
  missing GPUs (by UUID when the daemon passed the ones it saw before), and no measurement;
- under srun or torchrun every rank checks its own node the same way (:func:`shortfall`) and a
  rank that finds too few GPUs fails with the same words (``0 GPU(s) visible, 8 expected``),
  which the daemon reads as ``gpus_missing`` on that rank's node.

The GPUs a process can use are the node's listing (``nvidia-smi -L``, else NVML) narrowed by
``CUDA_VISIBLE_DEVICES``; where neither tool answers, torch's count (importing torch costs a
second or two, so it is the last resort). The pure parts (:func:`visible_of`, :func:`missing`,
:func:`shortfall_text`) take their inputs as arguments.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from probes.gpus import NodeGpu, node_gpus
from probes.result import Check, Measurement, Outcome, ProbeResult

GPU_COUNT_CHECK = "env.gpu_count"


def parse_uuid_list(text: str) -> tuple[str, ...]:
    """``--expect-gpu-uuids``: comma-separated GPU UUIDs (``GPU-…``), empty entries dropped."""
    uuids = tuple(u.strip() for u in text.split(",") if u.strip())
    for u in uuids:
        if not u.startswith(("GPU-", "MIG-")):
            raise ValueError(f"not a GPU UUID: {u!r} (expected GPU-…)")
    return uuids


def visible_of(listing: Sequence[NodeGpu], environ: Mapping[str, str]) -> list[NodeGpu] | None:
    """The node's GPUs this process may use: ``listing`` narrowed by ``CUDA_VISIBLE_DEVICES``
    (indices or UUID prefixes; ``""``, ``-1`` and ``NoDevFiles`` hide every GPU). ``None`` when
    the listing is empty and ``CUDA_VISIBLE_DEVICES`` does not hide everything: the count is
    unknown here (no ``nvidia-smi``, no NVML), not zero.
    """
    cvd = environ.get("CUDA_VISIBLE_DEVICES")
    if cvd is None:
        return list(listing) if listing else None
    entries = [e.strip() for e in cvd.split(",") if e.strip()]
    if not entries or entries[0] in ("-1", "NoDevFiles"):
        return []
    if not listing:
        return None
    out: list[NodeGpu] = []
    for entry in entries:
        if entry.isdigit():
            match = next((g for g in listing if g.index == int(entry)), None)
        else:
            match = next((g for g in listing if g.uuid == entry or g.uuid.startswith(entry)), None)
        if match is None:
            break  # CUDA stops at the first entry it cannot use
        if match not in out:
            out.append(match)
    return out


def missing(expected_uuids: Sequence[str], visible_uuids: Sequence[str]) -> list[str]:
    """The expected UUIDs not among the visible ones, in the expected order."""
    seen = set(visible_uuids)
    return [u for u in expected_uuids if u not in seen]


def shortfall_text(have: int, want: int, missing_uuids: Sequence[str] = ()) -> str:
    """``0 GPU(s) visible, 1 expected; missing GPU-…`` (the words the daemon reads as ``gpus_missing``)."""
    text = f"{have} GPU(s) visible, {want} expected"
    if missing_uuids:
        text += "; missing " + ", ".join(missing_uuids)
    return text


@dataclass(frozen=True)
class Seen:
    count: int
    uuids: tuple[str, ...]
    how: str
    """Where the count came from: ``nvidia-smi/NVML``, ``torch``."""


def _torch_count() -> int:
    import torch

    return int(torch.cuda.device_count()) if torch.cuda.is_available() else 0


def seen_gpus(environ: Mapping[str, str], *, listing: Callable[[], list[NodeGpu]] = node_gpus,
              torch_count: Callable[[], int] = _torch_count) -> Seen:
    """The GPUs this process may use (see the module docstring for the order of sources)."""
    visible = visible_of(listing(), environ)
    if visible is not None:
        return Seen(len(visible), tuple(g.uuid for g in visible), "nvidia-smi/NVML")
    return Seen(torch_count(), (), "torch")


def assess(want: int, expected_uuids: Sequence[str], environ: Mapping[str, str],
           see: Callable[[Mapping[str, str]], Seen] = seen_gpus) -> tuple[Seen | None, str | None]:
    """What this process sees, and the reason (:func:`shortfall_text`) when it is fewer than ``want``
    GPUs (``None``: enough, or nothing expected; then nothing is counted)."""
    if want <= 0:
        return None, None
    seen = see(environ)
    if seen.count >= want:
        return seen, None
    gone = missing(expected_uuids, seen.uuids) if seen.uuids or seen.count == 0 else []
    return seen, shortfall_text(seen.count, want, gone)


def missing_gpus_result(
    probe: str, *, run_id: str | None, node: str, want: int, expected_uuids: Sequence[str], environ: Mapping[str, str],
    started_at: float, params: dict[str, object], see: Callable[[Mapping[str, str]], Seen] = seen_gpus,
) -> ProbeResult | None:
    """The ``fail`` document of a probe whose node shows fewer GPUs than expected (no rank is started,
    nothing is measured), or ``None`` when the GPUs are there."""
    seen, detail = assess(want, expected_uuids, environ, see)
    if seen is None or detail is None:
        return None
    gone = missing(expected_uuids, seen.uuids) if seen.uuids or seen.count == 0 else []
    measurements = [Measurement(name="visible_gpus", value=float(seen.count), node=node)] if probe == "env" else []
    return ProbeResult(
        probe=probe,
        run_id=run_id,
        outcome=Outcome.FAIL,
        reason=f"{GPU_COUNT_CHECK}: {detail}",
        started_at=started_at,
        finished_at=time.time(),
        nodes=[node],
        params={**params, "expect_gpus": want, "expected_gpus_per_node": {node: want},
                "gpus_seen_by": seen.how, "missing_gpu_uuids": gone},
        measurements=measurements,
        checks=[Check(name=GPU_COUNT_CHECK, ok=False, detail=detail, node=node,
                      gpu_uuid=gone[0] if len(gone) == 1 else None)],
    )
