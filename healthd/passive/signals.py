"""Samples to ``PassiveSignal``s: what each dcgm-exporter series means, and what changed since the last poll.

Pure: a ``SignalTracker`` keeps the previous values in memory and is given each poll's samples per signal.

- **Events** fire once, in the poll that sees the change: an XID gauge whose value changed to a non-zero
  XID (``DCGM_FI_DEV_XID_ERRORS`` keeps the LAST XID forever, dcgm-exporter#500: its bare value means
  nothing), or, where the GPU has ``DCGM_EXP_XID_ERRORS_COUNT{xid}`` series, an increase of one (the
  count is windowed: a series that left the window and comes back counts from 0); a counter that increased
  (ECC double-bit, uncorrectable remapped rows, PCIe replays, NVLink errors). A counter that went down was
  reset: no event, the new value is the reference.
- **Levels** fire in every poll while they hold: ``DCGM_FI_DEV_ROW_REMAP_FAILURE`` > 0,
  ``DCGM_FI_DEV_ROW_REMAP_PENDING`` > 0, a clock-event bitmask with the HW slowdown, thermal or power-brake
  bits, a DCGM health status of warn (10) or fail (20).
- A value present at healthd's first sight of a series is a baseline, never an event.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field

from healthd.passive.model import PassiveSignal, SignalName, Strength
from healthd.passive.names import Located

XID_NAMES: dict[int, str] = {
    13: "Graphics Engine Exception", 31: "GPU memory page fault", 43: "GPU stopped processing",
    45: "Preemptive cleanup, due to previous errors", 48: "Double Bit ECC Error",
    62: "Internal micro-controller halt", 63: "ECC page retirement or row remapping recording event",
    64: "ECC page retirement or row remapper recording failure", 74: "NVLINK Error",
    79: "GPU has fallen off the bus", 92: "High single-bit ECC error rate", 94: "Contained ECC error",
    95: "Uncontained ECC error", 109: "Context Switch Timeout Error", 119: "GSP RPC Timeout",
    120: "GSP Error", 140: "Unrecovered ECC Error", 154: "GPU Recovery Action Changed",
}
"""Names of common XIDs, as dcgm-exporter's ``xid_errors.go`` spells them (it also puts them in the
gauge's ``err_msg`` label, preferred when present)."""

CLOCK_EVENTS: dict[int, str] = {
    0x1: "gpu_idle", 0x2: "clocks_setting", 0x4: "power_cap", 0x8: "hw_slowdown", 0x10: "sync_boost",
    0x20: "sw_thermal", 0x40: "hw_thermal", 0x80: "hw_power_brake", 0x100: "display_clocks",
}
"""DCGM's clock event (throttle) reason bits (``dcgm_fields.h`` ``DCGM_CLOCKS_EVENT_REASON_*``; NVML's
``nvmlClocksEventReason*``), named as dcgm-exporter's ``clock_events_collector.go`` names them."""

THROTTLE_CODES: tuple[tuple[int, str], ...] = (
    (0x80, "throttle_power_brake"), (0x40 | 0x20, "throttle_thermal"), (0x8, "throttle_hw_slowdown"),
)
"""The bits that are a hint, most specific first (HW slowdown is set with HW thermal and power brake):
the code of a GPU's throttle signal is the first that matches. Power cap, idle, sync boost and the
clock settings are normal operation."""

HEALTH_WARN, HEALTH_FAIL = 10.0, 20.0
"""``DCGM_HEALTH_RESULT_WARN`` and ``_FAIL`` (go-dcgm ``const.go``)."""

NVLINK_CODES: dict[str, str] = {
    "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL": "nvlink_crc_flit",
    "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL": "nvlink_crc_data",
    "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL": "nvlink_replay",
    "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL": "nvlink_recovery",
}

COUNTERS: dict[SignalName, tuple[Strength, str]] = {
    "ecc_dbe": (Strength.FAULT, "double-bit ECC errors"),
    "uncorrectable_remapped_rows": (Strength.HINT, "rows remapped for uncorrectable errors (reset pending)"),
    "pcie_replay": (Strength.HINT, "PCIe replays"),
    "nvlink_errors": (Strength.HINT, "NVLink errors"),
}
"""Counters whose increase is an event."""


@dataclass(frozen=True, slots=True)
class XidPolicy:
    """``[passive.xid]``: fault XIDs, the application's (ignored) and contained ones; every other: a hint."""

    fault: frozenset[int] = frozenset({48, 62, 64, 74, 79, 95, 109, 119, 120, 140})
    application: frozenset[int] = frozenset({13, 31, 43, 45})
    contained: frozenset[int] = frozenset({94})

    def strength(self, xid: int) -> Strength:
        if xid in self.fault:
            return Strength.FAULT
        if xid in self.application:
            return Strength.IGNORED
        return Strength.HINT


@dataclass(frozen=True, slots=True)
class Observed:
    signals: tuple[PassiveSignal, ...]
    bad_values: int = 0
    """Samples whose value cannot be what the signal holds (a bitmask that is no integer): dropped."""


def _where(s: Located) -> str:
    if s.gpu is None and s.gpu_uuid is None:
        return f"on {s.node}"
    if s.gpu_uuid is None:
        return f"on gpu {s.gpu}"
    return f"on gpu {s.gpu if s.gpu is not None else '?'} ({s.gpu_uuid})"


def _is_count_series(s: Located) -> bool:
    """A ``DCGM_EXP_XID_ERRORS_COUNT`` series (by name, or by the labels only it has)."""
    name = s.labels.get("__name__", "")
    return name.endswith("XID_ERRORS_COUNT") or "xid" in s.labels or "window_size_in_ms" in s.labels


def _xid_of(raw: str | float) -> int | None:
    try:
        value = float(raw)
    except ValueError:
        return None
    return int(value) if value.is_integer() and 0 <= value < 1 << 31 else None


@dataclass
class SignalTracker:
    """The previous values, per signal and series; ``observe`` one signal's samples of one poll."""

    xid_policy: XidPolicy = field(default_factory=XidPolicy)
    _gauge: dict[tuple[str, str], frozenset[int]] = field(default_factory=dict)
    """XID gauge per (node, GPU): the values last seen."""
    _counts: dict[tuple[str, str], dict[int, float]] = field(default_factory=dict)
    """XID count series per (node, GPU): count per XID in the window last seen."""
    _counters: dict[tuple[SignalName, str, str, str], float] = field(default_factory=dict)

    def observe(self, signal: SignalName, samples: Sequence[Located], at: float) -> Observed:
        if signal == "xid":
            return self._xid(samples, at)
        if signal in COUNTERS:
            return Observed(tuple(self._counter(signal, samples, at)))
        if signal == "row_remap_failure":
            return Observed(tuple(self._level(signal, samples, at, Strength.FAULT, "row_remap_failure",
                                              "row remapping failed")))
        if signal == "row_remap_pending":
            return Observed(tuple(self._level(signal, samples, at, Strength.HINT, "row_remap_pending",
                                              "row remapping pending (a GPU reset applies it)")))
        if signal == "throttle":
            return self._throttle(samples, at)
        if signal == "health":
            return Observed(tuple(self._health(samples, at)))
        raise ValueError(f"unknown passive signal {signal!r}")

    def forget(self, nodes: Collection[str]) -> None:
        """Drop the state of nodes healthd no longer knows (keeps the state bounded by the fleet)."""
        gone = set(nodes)
        for table in (self._gauge, self._counts):
            for key in [k for k in table if k[0] in gone]:
                del table[key]
        for ckey in [k for k in self._counters if k[1] in gone]:
            del self._counters[ckey]

    # -- XID ----------------------------------------------------------------------------------
    def _xid_signal(self, s: Located, xid: int, at: float, value: float, how: str) -> PassiveSignal:
        name = s.labels.get("err_msg") or XID_NAMES.get(xid, "")
        if name in ("", "Unknown Error", "Unknown"):
            name = XID_NAMES.get(xid, "")
        text = f"xid {xid}" + (f" ({name})" if name else "") + f" {_where(s)}" + (f": {how}" if how else "")
        return PassiveSignal(node=s.node, signal="xid", code=f"xid_{xid}", strength=self.xid_policy.strength(xid),
                             at=at, value=value, kind="event", gpu=s.gpu, gpu_uuid=s.gpu_uuid, detail=text)

    def _xid(self, samples: Sequence[Located], at: float) -> Observed:
        out: list[PassiveSignal] = []
        bad = 0
        gauges: dict[tuple[str, str], list[Located]] = {}
        counts: dict[tuple[str, str], list[Located]] = {}
        for s in samples:
            (counts if _is_count_series(s) else gauges).setdefault((s.node, s.gpu_key), []).append(s)
        for key, series in counts.items():
            previous = self._counts.get(key)
            now: dict[int, float] = {}
            where: dict[int, Located] = {}
            for s in series:
                if "xid" not in s.labels:
                    continue  # the zero-valued series of a GPU without XIDs in the window
                xid = _xid_of(s.labels["xid"])
                if xid is None:
                    bad += 1
                    continue
                now[xid] = max(now.get(xid, 0.0), s.value)
                where.setdefault(xid, s)
            if previous is not None:
                for xid, count in sorted(now.items()):
                    before = previous.get(xid, 0.0)
                    if count > before:
                        out.append(self._xid_signal(where[xid], xid, at, count - before,
                                                    f"{count - before:g} more in the exporter's window"))
            self._counts[key] = now
        for key, series in gauges.items():
            values: set[int] = set()
            for s in series:
                xid = _xid_of(s.value)
                if xid is None:
                    bad += 1
                    continue
                values.add(xid)
            previous_values = self._gauge.get(key)
            self._gauge[key] = frozenset(values)
            if previous_values is None or key in counts:
                continue  # a baseline; or the count series speak for this GPU
            for xid in sorted(values - previous_values - {0}):
                s = next(x for x in series if _xid_of(x.value) == xid)
                out.append(self._xid_signal(s, xid, at, float(xid), ""))
        return Observed(tuple(out), bad)

    # -- counters and levels ------------------------------------------------------------------
    def _counter(self, signal: SignalName, samples: Sequence[Located], at: float) -> list[PassiveSignal]:
        strength, what = COUNTERS[signal]
        out: list[PassiveSignal] = []
        for s in samples:
            name = s.labels.get("__name__", "")
            key = (signal, s.node, s.gpu_key, name)
            before = self._counters.get(key)
            self._counters[key] = s.value
            if before is None or s.value <= before:
                continue
            code = NVLINK_CODES.get(name, "nvlink_errors") if signal == "nvlink_errors" else signal
            label = what if signal != "nvlink_errors" else f"{what} ({code.removeprefix('nvlink_')})"
            out.append(PassiveSignal(
                node=s.node, signal=signal, code=code, strength=strength, at=at, value=s.value - before,
                kind="event", gpu=s.gpu, gpu_uuid=s.gpu_uuid,
                detail=f"{s.value - before:g} {label} {_where(s)} ({before:g} → {s.value:g})"))
        return out

    @staticmethod
    def _level(signal: SignalName, samples: Sequence[Located], at: float, strength: Strength, code: str,
               text: str) -> list[PassiveSignal]:
        out: dict[tuple[str, str], PassiveSignal] = {}
        for s in samples:
            if s.value > 0 and (s.node, s.gpu_key) not in out:
                out[(s.node, s.gpu_key)] = PassiveSignal(
                    node=s.node, signal=signal, code=code, strength=strength, at=at, value=s.value,
                    kind="level", gpu=s.gpu, gpu_uuid=s.gpu_uuid, detail=f"{text} {_where(s)}")
        return list(out.values())

    @staticmethod
    def _throttle(samples: Sequence[Located], at: float) -> Observed:
        masks: dict[tuple[str, str], tuple[Located, int]] = {}
        bad = 0
        for s in samples:
            if not s.value.is_integer() or not 0 <= s.value < 1 << 32:
                bad += 1
                continue
            key = (s.node, s.gpu_key)
            mask = int(s.value) | (masks[key][1] if key in masks else 0)
            masks[key] = (masks[key][0] if key in masks else s, mask)
        out: list[PassiveSignal] = []
        for s, mask in masks.values():
            code = next((c for bits, c in THROTTLE_CODES if mask & bits), None)
            if code is None:
                continue
            reasons = ", ".join(name for bit, name in sorted(CLOCK_EVENTS.items()) if mask & bit)
            out.append(PassiveSignal(node=s.node, signal="throttle", code=code, strength=Strength.HINT, at=at,
                                     value=float(mask), kind="level", gpu=s.gpu, gpu_uuid=s.gpu_uuid,
                                     detail=f"clock event reasons 0x{mask:x} ({reasons}) {_where(s)}"))
        return Observed(tuple(out), bad)

    @staticmethod
    def _health(samples: Sequence[Located], at: float) -> list[PassiveSignal]:
        worst: dict[tuple[str, str], list[Located]] = {}
        for s in samples:
            if s.value >= HEALTH_WARN:
                worst.setdefault((s.node, s.gpu_key), []).append(s)
        out: list[PassiveSignal] = []
        for series in worst.values():
            top = max(x.value for x in series)
            fail = top >= HEALTH_FAIL
            which = ", ".join(sorted({f"{x.labels.get('health_watch', '?')} "
                                      f"{'fail' if x.value >= HEALTH_FAIL else 'warn'}"
                                      + (f" ({x.labels['health_error_code']})" if x.labels.get("health_error_code")
                                         else "") for x in series}))
            s = series[0]
            out.append(PassiveSignal(node=s.node, signal="health", code="health_fail" if fail else "health_warn",
                                     strength=Strength.FAULT if fail else Strength.HINT, at=at, value=top,
                                     kind="level", gpu=s.gpu, gpu_uuid=s.gpu_uuid,
                                     detail=f"DCGM health {which} {_where(s)}"))
        return out
