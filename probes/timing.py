"""Clocks, deadlines and small statistics shared by the probes (no torch import)."""

from __future__ import annotations

import math
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

T0_ENV = "HEALTHD_PROBE_T0"
"""Set by the standalone launcher for its ranks: the unix time the launcher process started."""


def process_start_time(pid: int | None = None) -> float:
    """Unix time at which process ``pid`` (default: this one) was started, to ~10 ms.

    ``/proc/<pid>/stat`` gives the start in clock ticks since boot; the age of the process is
    the boot-time clock now minus that, so the start is "now" minus the age. Falls back to
    "now" where /proc is unavailable.
    """
    try:
        with open(f"/proc/{pid or os.getpid()}/stat", encoding="ascii") as f:
            stat = f.read()
        # The command name (field 2) may contain spaces: fields start after its closing ')'.
        fields = stat[stat.rindex(")") + 2 :].split()
        started = int(fields[19]) / os.sysconf("SC_CLK_TCK")
        age = time.clock_gettime(time.CLOCK_BOOTTIME) - started
        return time.time() - max(0.0, age)
    except (OSError, ValueError, IndexError, AttributeError):
        return time.time()


LAUNCH_T0_ENV = "HEALTHD_LAUNCH_T0"
"""Set by healthd's batch script for a container launcher: the unix time just before ``srun`` starts
the containerised step (``date +%s.%N``)."""
CONTAINER_KIND_ENV = "HEALTHD_CONTAINER_KIND"
"""Set beside :data:`LAUNCH_T0_ENV`: the launcher kind (``pyxis``, ``apptainer``, ``oci``, ``podman``)."""


def launch_t0(environ: Mapping[str, str] | None = None) -> float | None:
    """:data:`LAUNCH_T0_ENV` as a number; ``None`` when unset or not a finite number."""
    raw = (os.environ if environ is None else environ).get(LAUNCH_T0_ENV)
    try:
        value = float(raw) if raw else None
    except ValueError:
        return None
    return value if value is not None and math.isfinite(value) else None


def container_setup_seconds(t0: float, environ: Mapping[str, str] | None = None) -> float | None:
    """Seconds from the batch script's launch of a containerised step to ``t0`` (this probe's own
    start): the container's start-up (image import or mount, runtime, the interpreter); ``None``
    outside a container launcher. A launch "after" ``t0`` (clocks of two nodes) counts 0."""
    launched = launch_t0(environ)
    return None if launched is None else max(0.0, t0 - launched)


def budget_t0(t0: float, environ: Mapping[str, str] | None = None) -> float:
    """Where the probe's ``--timeout`` counts from: the container launch when there was one (the
    budget counts the container's start-up), else ``t0``."""
    setup = container_setup_seconds(t0, environ)
    return t0 - setup if setup is not None else t0


def probe_t0(environ: dict[str, str] | None = None) -> float:
    """The probe's time origin: the standalone launcher's start, else this process's start."""
    env = os.environ if environ is None else environ
    raw = env.get(T0_ENV)
    if raw:
        try:
            return float(raw)
        except ValueError:
            pass
    return process_start_time()


@dataclass(frozen=True)
class Deadline:
    """An absolute unix-time deadline."""

    at: float

    def remaining(self, now: float | None = None) -> float:
        return self.at - (time.time() if now is None else now)

    def expired(self) -> bool:
        return self.remaining() <= 0


def rank_margin_seconds(timeout_s: float) -> float:
    """How long before the whole-probe deadline a rank gives up and reports, so that the
    launcher (which kills at the deadline) still receives the rank's error document."""
    return min(10.0, max(0.15 * timeout_s, min(3.0, timeout_s / 3)))


def quantile(values: Sequence[float], q: float) -> float:
    """Linear-interpolation quantile (numpy's default ``linear`` method), ``0 <= q <= 1``."""
    if not values:
        raise ValueError("quantile of an empty sequence")
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"quantile {q} outside [0, 1]")
    ordered = sorted(values)
    pos = q * (len(ordered) - 1)
    lo = math.floor(pos)
    hi = math.ceil(pos)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def median(values: Sequence[float]) -> float:
    return quantile(values, 0.5)


def mean(values: Sequence[float]) -> float:
    if not values:
        raise ValueError("mean of an empty sequence")
    return math.fsum(values) / len(values)
