"""The GPU's clock, power and clock-event (throttle) reasons read through NVML while a probe measures.

A GEMM figure is only as good as the state the GPU was in: under sustained load an H100 sits at
its power limit and its SM clock drops from ~1,965 to ~1,330 MHz (NVML reason ``sw_power_cap``);
a failing fan, a hot inlet or a power-supply fault show as ``sw_thermal_slowdown``,
``hw_thermal_slowdown``, ``hw_slowdown`` or ``hw_power_brake_slowdown``. :class:`Sampler` reads
them in a background thread during a timed window (one read when the window opens and one when it
closes, at least) and :meth:`Sampler.stop` sums them up as a :class:`Summary`.

NVML comes from the ``pynvml`` module (the ``nvidia-ml-py`` package). It is optional: without it,
or when ``nvmlInit`` fails, or the rank's GPU has no NVML handle, :func:`open_gpu` returns
``None`` and the reason, which the probe puts in its ``params`` (nothing is measured then).
The GPU is looked up by its UUID, else its PCI bus id, else its index on the node (NVML's
order is the node's, ``nvidia-smi``'s), never by the rank's CUDA ordinal.

Units as NVML gives them: SM clock in MHz (``nvmlDeviceGetClockInfo(handle, NVML_CLOCK_SM)``),
power and the enforced power limit in milliwatts; the summary is in base units (Hz, W).
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

REASON_BITS: tuple[tuple[str, int], ...] = (
    ("gpu_idle", 0x1),
    ("applications_clocks_setting", 0x2),
    ("sw_power_cap", 0x4),
    ("hw_slowdown", 0x8),
    ("sync_boost", 0x10),
    ("sw_thermal_slowdown", 0x20),
    ("hw_thermal_slowdown", 0x40),
    ("hw_power_brake_slowdown", 0x80),
    ("display_clock_setting", 0x100),
)
"""NVML's ``nvmlClocksEventReason*`` bits (the same values as the older ``nvmlClocksThrottleReason*``)."""
THROTTLE_REASONS = ("hw_slowdown", "sw_thermal_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown")
"""The reasons that are not a healthy GPU at work: a hardware slowdown, a thermal one (either), the
power brake. ``sw_power_cap`` is not one: a GPU at full load sits at its power limit by design."""
THROTTLE_MASK = sum(bit for name, bit in REASON_BITS if name in THROTTLE_REASONS)
NVML_CLOCK_SM = 1
DEFAULT_INTERVAL_S = 0.02


def decode_reasons(mask: int) -> list[str]:
    """The names of the reason bits set in ``mask``, in NVML's bit order.

    >>> decode_reasons(0x4 | 0x40)
    ['sw_power_cap', 'hw_thermal_slowdown']
    """
    return [name for name, bit in REASON_BITS if mask & bit]


@dataclass(frozen=True)
class Sample:
    sm_clock_mhz: int | None
    power_mw: int | None
    power_limit_mw: int | None
    reasons: int | None


@dataclass(frozen=True)
class Summary:
    """One window's readings, in base units; ``None`` where NVML gave no value."""

    samples: int
    sm_clock_hertz: float | None
    power_watts: float | None
    power_limit_watts: float | None
    reasons: tuple[str, ...]
    """Every reason seen active in at least one sample, in NVML's bit order."""
    throttle_ratio: float | None
    """Share of the samples with a :data:`THROTTLE_REASONS` reason active."""

    @classmethod
    def of(cls, samples: Sequence[Sample]) -> Summary:
        def avg(values: list[int]) -> float | None:
            return sum(values) / len(values) if values else None

        clock = avg([s.sm_clock_mhz for s in samples if s.sm_clock_mhz is not None])
        power = avg([s.power_mw for s in samples if s.power_mw is not None])
        limit = avg([s.power_limit_mw for s in samples if s.power_limit_mw is not None])
        masks = [s.reasons for s in samples if s.reasons is not None]
        seen = 0
        for m in masks:
            seen |= m
        return cls(
            samples=len(samples),
            sm_clock_hertz=None if clock is None else clock * 1e6,
            power_watts=None if power is None else power / 1e3,
            power_limit_watts=None if limit is None else limit / 1e3,
            reasons=tuple(decode_reasons(seen)),
            throttle_ratio=(sum(1 for m in masks if m & THROTTLE_MASK) / len(masks)) if masks else None,
        )


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


@dataclass
class GpuTelemetry:
    """One GPU's NVML handle and the calls that read it (each may be unsupported: ``None``)."""

    nvml: Any
    handle: Any
    found_by: str
    """How the handle was found: ``uuid``, ``pci_bus_id`` or ``index``."""
    _reasons: Callable[[Any], int] | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        self._reasons = getattr(self.nvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or getattr(
            self.nvml, "nvmlDeviceGetCurrentClocksThrottleReasons", None
        )

    def _read(self, call: Callable[[], Any]) -> int | None:
        try:
            return int(call())
        except Exception:  # NVMLError_NotSupported and the like: that figure is absent
            return None

    def sample(self) -> Sample:
        nvml, h = self.nvml, self.handle
        reasons = self._reasons
        return Sample(
            sm_clock_mhz=self._read(lambda: nvml.nvmlDeviceGetClockInfo(h, getattr(nvml, "NVML_CLOCK_SM",
                                                                                    NVML_CLOCK_SM))),
            power_mw=self._read(lambda: nvml.nvmlDeviceGetPowerUsage(h)),
            power_limit_mw=self._read(lambda: nvml.nvmlDeviceGetEnforcedPowerLimit(h)),
            reasons=None if reasons is None else self._read(lambda: reasons(h)),
        )

    def window(self, interval_s: float = DEFAULT_INTERVAL_S) -> Sampler:
        return Sampler(self.sample, interval_s)


def load_nvml() -> tuple[Any | None, str]:
    """The initialised ``pynvml`` module, or ``None`` and why not."""
    try:
        nvml = importlib.import_module("pynvml")
    except ImportError:
        return None, "pynvml (nvidia-ml-py) is not installed: no clock, power or throttle readings"
    try:
        nvml.nvmlInit()
    except Exception as exc:
        return None, f"nvmlInit failed ({type(exc).__name__}: {str(exc)[:120]}): no clock, power or throttle readings"
    return nvml, ""


def open_gpu(uuid: str | None, pci_bus_id: str | None, index: int | None) -> tuple[GpuTelemetry | None, str]:
    """This GPU's telemetry (by UUID, else PCI bus id, else node index), or ``None`` and why not."""
    nvml, why = load_nvml()
    if nvml is None:
        return None, why

    def by_text(call: Callable[[Any], Any], text: str) -> Any:
        try:
            return call(text)
        except TypeError:  # older nvidia-ml-py (no str-to-bytes conversion) takes bytes only
            return call(text.encode())

    tries: list[tuple[str, Callable[[], Any]]] = []
    if uuid:
        tries.append(("uuid", lambda: by_text(nvml.nvmlDeviceGetHandleByUUID, uuid)))
    if pci_bus_id:
        tries.append(("pci_bus_id", lambda: by_text(nvml.nvmlDeviceGetHandleByPciBusId, pci_bus_id)))
    if index is not None:
        tries.append(("index", lambda: nvml.nvmlDeviceGetHandleByIndex(index)))
    errors = []
    for how, get in tries:
        try:
            return GpuTelemetry(nvml, get(), how), ""
        except Exception as exc:
            errors.append(f"{how}: {type(exc).__name__}")
    return None, "NVML has no handle for this GPU (" + (", ".join(errors) or "nothing to look it up by") + ")"


class Sampler:
    """Reads ``read()`` every ``interval_s`` in a daemon thread between :meth:`start` and :meth:`stop`,
    and once at each end, so even a window shorter than the interval has two samples."""

    def __init__(self, read: Callable[[], Sample], interval_s: float = DEFAULT_INTERVAL_S) -> None:
        self._read = read
        self._interval = interval_s
        self._samples: list[Sample] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def _add(self) -> None:
        sample = self._read()
        with self._lock:
            self._samples.append(sample)

    def _loop(self) -> None:
        while not self._stop.wait(self._interval):
            self._add()

    def start(self) -> Sampler:
        self._add()
        self._thread = threading.Thread(target=self._loop, name="healthd-telemetry", daemon=True)
        self._thread.start()
        return self

    def samples(self) -> list[Sample]:
        """The readings so far (all of them after :meth:`stop`)."""
        with self._lock:
            return list(self._samples)

    def stop(self) -> Summary:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=max(1.0, 5 * self._interval))
        self._add()
        with self._lock:
            return Summary.of(list(self._samples))
