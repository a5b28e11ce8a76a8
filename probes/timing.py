"""Clocks, deadlines and small statistics shared by the probes (no torch import)."""

from __future__ import annotations

import math
import os
import time
from collections.abc import Sequence
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
