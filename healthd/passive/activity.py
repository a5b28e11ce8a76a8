"""Whether each GPU is busy, from dcgm-exporter's utilisation series (pure).

A clock-event reason matters only while the GPU works: an idle GPU's power brake slows nothing. Busy means
``DCGM_FI_PROF_GR_ENGINE_ACTIVE`` ≥ ``ENGINE_BUSY`` (the profiling field, a ratio 0-1), or, for a GPU
without it (profiling off: DCGM's profiling module not loaded, or the field not in the exporter's CSV),
``DCGM_FI_DEV_GPU_UTIL`` ≥ ``UTIL_BUSY`` (percent). The default query asks for both with ``or``: a GPU
with the profiling field answers with it.
"""

from __future__ import annotations

from collections.abc import Sequence

from healthd.passive.names import Located

ENGINE_ACTIVE = "DCGM_FI_PROF_GR_ENGINE_ACTIVE"
GPU_UTIL = "DCGM_FI_DEV_GPU_UTIL"
ENGINE_BUSY = 0.5
UTIL_BUSY = 50.0

GpuKey = tuple[str, str]
"""(node, the GPU's UUID, else its index)."""


def busy(samples: Sequence[Located]) -> dict[GpuKey, tuple[bool, str]]:
    """Per GPU: busy or not, and the words (``graphics engine active 0.93``, ``utilisation 12%``). The
    profiling field wins where a GPU has both; a series of another name, or a value that is no number, is
    left out (the GPU's activity unknown)."""
    out: dict[GpuKey, tuple[bool, str]] = {}
    profiled: set[GpuKey] = set()
    for s in samples:
        key = (s.node, s.gpu_key)
        name = s.labels.get("__name__", "")
        if s.value != s.value:
            continue
        if name == ENGINE_ACTIVE:
            out[key] = (s.value >= ENGINE_BUSY, f"graphics engine active {s.value:.2f}")
            profiled.add(key)
        elif name == GPU_UTIL and key not in profiled:
            out[key] = (s.value >= UTIL_BUSY, f"utilisation {s.value:g}%")
    return out
