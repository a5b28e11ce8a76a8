"""NVML telemetry of the gemm probe, against a FAKE pynvml (no NVML here), and the gemm steady state on CPU."""

from __future__ import annotations

import random
import sys
import time
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest

from probes import gemm, telemetry
from probes.telemetry import REASON_BITS, THROTTLE_REASONS, Sample, Sampler, Summary, decode_reasons, open_gpu
from tests.probes import fake_pynvml
from tests.probes.fake_pynvml import FakeGpu

UUID0, UUID1 = "GPU-0061a31b-0dc7-4f7c-6398-aa4b02af5cfc", "GPU-7f3e9d2a-1111-2222-3333-444455556666"
PCI0, PCI1 = "00000000:00:06.0", "00000000:00:07.0"
CAPPED = fake_pynvml.nvmlClocksEventReasonSwPowerCap
THERMAL = fake_pynvml.nvmlClocksEventReasonHwThermalSlowdown


@pytest.fixture
def nvml(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    fake_pynvml.reset([FakeGpu(UUID0, PCI0), FakeGpu(UUID1, PCI1)])
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml)
    return fake_pynvml


def test_reason_bits_are_nvmls() -> None:
    """Every name decodes NVML's own constant (nvidia-ml-py's ``nvmlClocksEventReason*``)."""
    camel = {name: "nvmlClocksEventReason" + "".join(w.title() for w in name.split("_")) for name, _ in REASON_BITS}
    camel["sw_power_cap"] = "nvmlClocksEventReasonSwPowerCap"
    camel["hw_slowdown"] = "nvmlClocksEventReasonHwSlowdown"
    for name, bit in REASON_BITS:
        assert getattr(fake_pynvml, camel[name]) == bit, name
    assert decode_reasons(0) == []
    assert decode_reasons(0x1FF) == [name for name, _ in REASON_BITS]
    assert set(THROTTLE_REASONS) <= {name for name, _ in REASON_BITS}


def test_gpu_found_by_uuid_then_pci_then_index(nvml: ModuleType) -> None:
    fake_pynvml.GPUS[1].sm_mhz = (1330,)
    by_uuid, why = open_gpu(UUID1, PCI0, 0)
    assert by_uuid is not None and by_uuid.found_by == "uuid" and why == ""
    assert by_uuid.sample().sm_clock_mhz == 1330  # the UUID wins over a PCI id and index of another GPU
    by_pci, _ = open_gpu(None, PCI1.lower(), 0)
    assert by_pci is not None and by_pci.found_by == "pci_bus_id" and by_pci.sample().sm_clock_mhz == 1330
    by_index, _ = open_gpu("GPU-unknown", None, 1)
    assert by_index is not None and by_index.found_by == "index" and by_index.sample().sm_clock_mhz == 1330
    none, why = open_gpu("GPU-unknown", None, 7)
    assert none is None and "uuid: NVMLError" in why and "index: NVMLError" in why


def test_without_pynvml_or_nvml_nothing_is_read(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import raises ImportError
    got, why = open_gpu(UUID0, PCI0, 0)
    assert got is None and "pynvml (nvidia-ml-py) is not installed" in why
    fake_pynvml.reset([FakeGpu(UUID0, PCI0)], init_error=9)  # NVML_ERROR_DRIVER_NOT_LOADED
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml)
    got, why = open_gpu(UUID0, PCI0, 0)
    assert got is None and why.startswith("nvmlInit failed (NVMLError")


def test_window_of_a_power_capped_then_throttled_gpu(nvml: ModuleType) -> None:
    """Readings in NVML's units (MHz, mW) come out in base units (Hz, W); the reasons by name."""
    gpu = fake_pynvml.GPUS[0]
    gpu.sm_mhz, gpu.power_mw = (1965, 1330, 1330, 1330), (450_000, 699_000, 700_000, 701_000)
    gpu.reasons = (0, CAPPED, CAPPED | THERMAL, CAPPED | THERMAL)
    tel, _ = open_gpu(UUID0, None, None)
    assert tel is not None
    sampler = tel.window(interval_s=0.001).start()
    time.sleep(0.02)
    summary = sampler.stop()
    n = summary.samples
    assert n >= 4
    assert summary.sm_clock_hertz == pytest.approx((1965 + 1330 * (n - 1)) / n * 1e6)
    assert summary.power_watts == pytest.approx((450 + 699 + 700 + 701 * (n - 3)) / n)
    assert summary.power_limit_watts == 700.0
    assert summary.reasons == ("sw_power_cap", "hw_thermal_slowdown")
    assert summary.throttle_ratio == pytest.approx((n - 2) / n)  # sw_power_cap alone is not a throttle


def test_short_window_has_two_samples_and_unsupported_power_is_absent(nvml: ModuleType) -> None:
    fake_pynvml.GPUS[0].supports_power = False
    tel, _ = open_gpu(UUID0, None, None)
    assert tel is not None
    summary = tel.window(interval_s=10.0).start().stop()
    assert summary.samples == 2 and summary.power_watts is None and summary.power_limit_watts is None
    assert summary.sm_clock_hertz == 1.98e9 and summary.throttle_ratio == 0.0 and summary.reasons == ()


def test_older_nvml_throttle_reasons_call(monkeypatch: pytest.MonkeyPatch) -> None:
    """Drivers before 535 name it ``nvmlDeviceGetCurrentClocksThrottleReasons``."""
    old = ModuleType("pynvml")
    for name in dir(fake_pynvml):
        if not name.startswith("__") and name != "nvmlDeviceGetCurrentClocksEventReasons":
            setattr(old, name, getattr(fake_pynvml, name))
    old.nvmlDeviceGetCurrentClocksThrottleReasons = fake_pynvml.nvmlDeviceGetCurrentClocksEventReasons  # type: ignore[attr-defined]
    fake_pynvml.reset([FakeGpu(UUID0, PCI0, reasons=(fake_pynvml.nvmlClocksEventReasonHwSlowdown,))])
    monkeypatch.setitem(sys.modules, "pynvml", old)
    tel, _ = open_gpu(UUID0, None, None)
    assert tel is not None
    summary = tel.window().start().stop()
    assert summary.reasons == ("hw_slowdown",) and summary.throttle_ratio == 1.0


def test_summary_of_nothing() -> None:
    s = Summary.of([Sample(None, None, None, None)])
    assert (s.samples, s.sm_clock_hertz, s.power_watts, s.throttle_ratio, s.reasons) == (1, None, None, None, ())
    assert Sampler(lambda: Sample(1000, None, None, None)).start().stop().sm_clock_hertz == 1e9


def _cpu_ctx() -> Any:
    import torch

    return SimpleNamespace(device=torch.device("cpu"), device_type="cpu", rank=0, faults=frozenset(),
                           mark=lambda _: None, sync=lambda: None, barrier=lambda: None)


def test_gemm_window_carries_the_gpus_telemetry(nvml: ModuleType) -> None:
    """The timed window of a dtype is sampled (the fake stands for the GPU; the matmuls run on CPU)."""
    fake_pynvml.GPUS[0].sm_mhz = (1330,)
    fake_pynvml.GPUS[0].reasons = (CAPPED,)
    tel, _ = open_gpu(UUID0, None, None)
    rec = gemm._gemm(_cpu_ctx(), "fp32", 64, warmup=1, iters=3, warmup_seconds=0.02, telemetry=tel)
    assert rec.ok and rec.iters == 3 and rec.warmup_seconds >= 0.02
    assert rec.telemetry is not None and rec.telemetry.samples >= 2 and rec.telemetry.reasons == ("sw_power_cap",)
    ms = {m.name: m for m in gemm.telemetry_measurements("n1", 3, "fp32", rec.telemetry)}
    assert ms["sm_clock_hertz"].value == 1.33e9 and ms["power_limit_watts"].value == 700.0
    assert ms["throttle_ratio"].value == 0.0 and ms["power_watts"].labels == {"gpu": "3", "dtype": "fp32"}
    assert all(m.node == "n1" for m in ms.values())
    assert gemm.telemetry_measurements("n1", 3, "fp32", None) == []


def test_settle_waits_for_a_steady_time_and_stops_at_the_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    """A step that is fast at first (a burst) and slower later: warm-up lasts until it is steady. The
    clock is the test's (each step advances it), so the machine's load cannot make it flaky."""
    clock = [0.0]
    monkeypatch.setattr(gemm.time, "perf_counter", lambda: clock[0])
    calls: list[int] = []

    def step(i: int) -> None:
        calls.append(i)
        clock[0] += 0.0005 if len(calls) < 40 else 0.002

    settled = gemm.settle(_cpu_ctx(), step, 0.05)
    assert settled.stable and settled.seconds >= 0.05 and len(calls) > 40
    assert settled.per_call == pytest.approx(0.002, rel=0.01)
    rng = random.Random(1)

    def noisy(_: int) -> None:
        clock[0] += rng.uniform(0.001, 0.003)

    never = gemm.settle(_cpu_ctx(), noisy, 0.02)
    assert not never.stable and never.seconds == pytest.approx(gemm.WARMUP_CAP_FACTOR * 0.02, abs=0.005)
    assert gemm.settle(_cpu_ctx(), step, 0.0) == gemm.Settled(0.0, None, False, 0)


def test_dtype_order_rotates_by_run_id() -> None:
    dtypes = list(gemm.DTYPES)
    firsts = {gemm.dtype_order(dtypes, f"run-{i}", 0)[0] for i in range(50)}
    assert firsts == set(dtypes)
    for i in range(5):
        order = gemm.dtype_order(dtypes, f"run-{i}", 0)
        assert sorted(order) == sorted(dtypes) and order == gemm.dtype_order(dtypes, f"run-{i}", 3)
    assert gemm.dtype_order(dtypes, None, 2)[0] == "bf16"
    assert telemetry.THROTTLE_MASK == 0x8 | 0x20 | 0x40 | 0x80


def test_older_bindings_that_take_bytes_only(nvml: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    """Before nvidia-ml-py converted str to bytes, ``c_char_p(str)`` raised TypeError."""
    original = fake_pynvml.nvmlDeviceGetHandleByUUID

    def bytes_only(uuid: str | bytes) -> Any:
        if isinstance(uuid, str):
            raise TypeError("bytes or integer address expected instead of str instance")
        return original(uuid)

    monkeypatch.setattr(fake_pynvml, "nvmlDeviceGetHandleByUUID", bytes_only)
    tel, _ = open_gpu(UUID1, None, None)
    assert tel is not None and tel.found_by == "uuid" and tel.handle.gpu.uuid == UUID1
