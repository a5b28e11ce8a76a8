"""A FAKE ``pynvml`` (nvidia-ml-py) for machines without NVML: inject it with
``monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml)`` after :func:`reset`.

Names, argument order, return types and constant values follow nvidia-ml-py's ``pynvml.py``
(2025): handles are opaque objects; ``nvmlDeviceGetClockInfo(handle, NVML_CLOCK_SM)`` returns
MHz as an ``int``; ``nvmlDeviceGetPowerUsage`` and ``nvmlDeviceGetEnforcedPowerLimit`` return
milliwatts as ``int``; ``nvmlDeviceGetCurrentClocksEventReasons`` returns the reason bitmask;
lookups of an unknown device raise ``NVMLError`` with ``NVML_ERROR_NOT_FOUND``; every call
before ``nvmlInit`` raises ``NVML_ERROR_UNINITIALIZED``. Each reading call returns the GPU's
next scripted value (the last one repeats), so a test can script a clock falling under load.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from dataclasses import dataclass, field

NVML_CLOCK_GRAPHICS = 0
NVML_CLOCK_SM = 1
NVML_CLOCK_MEM = 2
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NOT_FOUND = 6

nvmlClocksEventReasonGpuIdle = 0x0000000000000001
nvmlClocksEventReasonApplicationsClocksSetting = 0x0000000000000002
nvmlClocksEventReasonSwPowerCap = 0x0000000000000004
nvmlClocksEventReasonHwSlowdown = 0x0000000000000008
nvmlClocksEventReasonSyncBoost = 0x0000000000000010
nvmlClocksEventReasonSwThermalSlowdown = 0x0000000000000020
nvmlClocksEventReasonHwThermalSlowdown = 0x0000000000000040
nvmlClocksEventReasonHwPowerBrakeSlowdown = 0x0000000000000080
nvmlClocksEventReasonDisplayClockSetting = 0x0000000000000100
nvmlClocksEventReasonNone = 0

NVML_GPU_FABRIC_STATE_NOT_SUPPORTED = 0
NVML_GPU_FABRIC_STATE_NOT_STARTED = 1
NVML_GPU_FABRIC_STATE_IN_PROGRESS = 2
NVML_GPU_FABRIC_STATE_COMPLETED = 3
NVML_GPU_FABRIC_UUID_LEN = 16


class c_nvmlGpuFabricInfo_t(ctypes.Structure):
    """``nvmlGpuFabricInfo_t`` as nvidia-ml-py declares it: the caller passes ``byref`` of one."""

    _fields_ = [("clusterUuid", ctypes.c_char * NVML_GPU_FABRIC_UUID_LEN), ("status", ctypes.c_uint),
                ("cliqueId", ctypes.c_uint32), ("state", ctypes.c_uint8)]


class NVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        return {1: "Uninitialized", 3: "Not Supported", 6: "Not Found"}.get(self.value, f"NVML error {self.value}")


@dataclass
class FakeGpu:
    uuid: str
    pci_bus_id: str
    sm_mhz: Sequence[int] = (1980,)
    power_mw: Sequence[int] = (120_000,)
    limit_mw: int = 700_000
    reasons: Sequence[int] = (0,)
    supports_power: bool = True
    fabric_state: int = NVML_GPU_FABRIC_STATE_COMPLETED
    fabric_status: int = 0
    """The NVML return code of the GPU's fabric registration (0: success)."""
    supports_fabric: bool = True
    reads: dict[str, int] = field(default_factory=dict)

    def next(self, what: str, values: Sequence[int]) -> int:
        i = self.reads.get(what, 0)
        self.reads[what] = i + 1
        return int(values[min(i, len(values) - 1)])


@dataclass(frozen=True)
class _Handle:
    """nvidia-ml-py returns a ctypes pointer: opaque to the caller."""

    gpu: FakeGpu


GPUS: list[FakeGpu] = []
_state = {"initialised": False, "init_error": 0}


def reset(gpus: Sequence[FakeGpu], init_error: int = 0) -> None:
    """The node's GPUs in NVML order; ``init_error``: the NVML error ``nvmlInit`` raises (0: none)."""
    GPUS[:] = list(gpus)
    _state.update(initialised=False, init_error=init_error)


def _check() -> None:
    if not _state["initialised"]:
        raise NVMLError(NVML_ERROR_UNINITIALIZED)


def nvmlInit() -> None:
    if _state["init_error"]:
        raise NVMLError(int(_state["init_error"]))
    _state["initialised"] = True


def nvmlShutdown() -> None:
    _check()
    _state["initialised"] = False


def nvmlDeviceGetCount() -> int:
    _check()
    return len(GPUS)


def nvmlDeviceGetHandleByIndex(index: int) -> _Handle:
    _check()
    if not 0 <= index < len(GPUS):
        raise NVMLError(NVML_ERROR_NOT_FOUND)
    return _Handle(GPUS[index])


def nvmlDeviceGetHandleByUUID(uuid: str | bytes) -> _Handle:
    _check()
    text = uuid.decode() if isinstance(uuid, bytes) else uuid
    for g in GPUS:
        if g.uuid == text:
            return _Handle(g)
    raise NVMLError(NVML_ERROR_NOT_FOUND)


def nvmlDeviceGetHandleByPciBusId(pciBusId: str | bytes) -> _Handle:
    _check()
    text = (pciBusId.decode() if isinstance(pciBusId, bytes) else pciBusId).upper()
    for g in GPUS:
        if g.pci_bus_id.upper() == text:
            return _Handle(g)
    raise NVMLError(NVML_ERROR_NOT_FOUND)


def nvmlDeviceGetUUID(handle: _Handle) -> str:
    _check()
    return handle.gpu.uuid


def nvmlDeviceGetClockInfo(handle: _Handle, type: int) -> int:
    _check()
    if type != NVML_CLOCK_SM:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    return handle.gpu.next("sm", handle.gpu.sm_mhz)


def nvmlDeviceGetPowerUsage(handle: _Handle) -> int:
    _check()
    if not handle.gpu.supports_power:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    return handle.gpu.next("power", handle.gpu.power_mw)


def nvmlDeviceGetEnforcedPowerLimit(handle: _Handle) -> int:
    _check()
    if not handle.gpu.supports_power:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    return handle.gpu.limit_mw


def nvmlDeviceGetCurrentClocksEventReasons(handle: _Handle) -> int:
    _check()
    return handle.gpu.next("reasons", handle.gpu.reasons)


def nvmlDeviceGetGpuFabricInfo(handle: _Handle, gpuFabricInfo: object) -> int:
    """Fills the ``c_nvmlGpuFabricInfo_t`` behind ``byref(...)`` (as the real one does through ctypes)."""
    _check()
    if not handle.gpu.supports_fabric:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    info = gpuFabricInfo._obj  # type: ignore[attr-defined]
    assert isinstance(info, c_nvmlGpuFabricInfo_t), "nvidia-ml-py passes byref(c_nvmlGpuFabricInfo_t())"
    info.state = handle.gpu.fabric_state
    info.status = handle.gpu.fabric_status
    info.cliqueId = 1
    return 0
