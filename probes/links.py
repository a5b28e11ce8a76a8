"""The node's links as sysfs shows them, read by the node check at job boundaries (``probes.boundary``): each
InfiniBand port's error counters, state and rate, and the PCIe link of each GPU and HCA. Plain file reads (no
tool, no subprocess), a few milliseconds; absolute values only: the daemon computes increases between
documents and judges them (``healthd.passive.fabric``, ``healthd.judge.sources.fabric``, ``.pcie``).

Layouts (the kernel's ``Documentation/ABI/stable/sysfs-class-infiniband`` and ``sysfs-bus-pci``):

- ``/sys/class/infiniband/<device>/ports/<port>/counters/<counter>``: the PMA port counters, one decimal
  number each (``N/A (no PMA)`` where the device has none): ``symbol_error`` (16 bits),
  ``link_error_recovery`` and ``link_downed`` (8 bits), ``port_rcv_errors``,
  ``port_rcv_remote_physical_errors`` and ``port_xmit_discards`` (16 bits);
- ``…/ports/<port>/state`` (``4: ACTIVE``), ``phys_state`` (``5: LinkUp``), ``rate`` (``400 Gb/sec (4X NDR)``),
  ``link_layer`` (``InfiniBand`` or ``Ethernet``); ``/sys/class/infiniband/<device>/device``: a link to the
  HCA's PCI device;
- ``/sys/bus/pci/devices/<address>/current_link_width`` (``16``), ``max_link_width``, ``current_link_speed``
  (``32.0 GT/s PCIe``; older kernels ``8 GT/s``, ``Unknown`` when the link is down) and ``max_link_speed``;
  ``vendor`` (``0x10de``: NVIDIA) and ``class`` (``0x030200``: a 3D controller, a data-centre GPU).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

IB_COUNTERS = ("link_downed", "symbol_error", "port_rcv_errors", "port_rcv_remote_physical_errors",
               "link_error_recovery", "port_xmit_discards")
"""The port counters read (the kernel's names): errors and flaps, not traffic."""
MAX_PORTS = 64
"""Ports read at most (a node has 1 to 18 HCAs, 1 or 2 ports each): a bound on the document and the time."""
MAX_PCI = 64
NVIDIA = "0x10de"
GPU_CLASSES = ("0x0302", "0x0300")
"""PCI class prefixes of NVIDIA's GPUs (3D controller, VGA); NVSwitches (``0x0680``) are not read."""

_NUMBER = re.compile(r"^\s*(\d+)\s*$")
_STATE = re.compile(r"^\s*(\d+)\s*:")
_RATE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*Gb/sec")
_SPEED = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*GT/s")


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="ascii", errors="replace")
    except OSError:
        return None


def parse_counter(text: str | None) -> float | None:
    """A counter file's value (``None``: unreadable or ``N/A (no PMA)``)."""
    m = _NUMBER.match(text or "")
    return float(m.group(1)) if m else None


def parse_state(text: str | None) -> int | None:
    """``4: ACTIVE`` → 4; ``5: LinkUp`` → 5."""
    m = _STATE.match(text or "")
    return int(m.group(1)) if m else None


def parse_rate(text: str | None) -> float | None:
    """``400 Gb/sec (4X NDR)`` → bytes per second (50e9), as node_exporter's ``rate_bytes_per_second``."""
    m = _RATE.match(text or "")
    return float(m.group(1)) * 1e9 / 8 if m else None


def parse_link_speed(text: str | None) -> float | None:
    """``32.0 GT/s PCIe`` (or ``8 GT/s``) → 32.0; ``Unknown`` → None."""
    m = _SPEED.match(text or "")
    return float(m.group(1)) if m else None


@dataclass(frozen=True)
class IbPort:
    device: str
    port: str
    state: int | None
    phys_state: int | None
    rate: float | None
    """Bytes per second (``None``: unreadable)."""
    link_layer: str
    pci: str | None
    counters: dict[str, float] = field(default_factory=dict)
    """Of ``IB_COUNTERS``, those the port has (a counter the device lacks, or ``N/A``, is absent)."""
    rate_text: str = ""


def read_ib_ports(sys_root: Path) -> list[IbPort]:
    """Every port of every InfiniBand device (``[]``: none, or no ``/sys/class/infiniband``)."""
    base = sys_root / "class" / "infiniband"
    try:
        devices = sorted(os.listdir(base))
    except OSError:
        return []
    out: list[IbPort] = []
    for device in devices:
        try:
            ports = sorted(os.listdir(base / device / "ports"), key=lambda p: (len(p), p))
        except OSError:
            continue
        pci = pci_address(base / device / "device")
        for port in ports:
            if len(out) >= MAX_PORTS:
                return out
            d = base / device / "ports" / port
            counters = {c: v for c in IB_COUNTERS if (v := parse_counter(_read(d / "counters" / c))) is not None}
            rate_text = (_read(d / "rate") or "").strip()
            out.append(IbPort(device, port, parse_state(_read(d / "state")), parse_state(_read(d / "phys_state")),
                              parse_rate(rate_text), (_read(d / "link_layer") or "").strip(), pci, counters,
                              rate_text))
    return out


def pci_address(link: Path) -> str | None:
    """The PCI address a sysfs ``device`` link points at (``0000:1a:00.0``)."""
    try:
        name = os.path.basename(os.path.realpath(link))
    except OSError:
        return None
    return name if re.fullmatch(r"[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]", name) else None


@dataclass(frozen=True)
class PcieLink:
    pci: str
    kind: str
    """``gpu`` or ``hca``."""
    name: str
    """The GPU's index (PCI bus order, as ``nvidia-smi`` numbers them) or the HCA's device (``mlx5_0``)."""
    width: float | None
    max_width: float | None
    speed: float | None
    """GT/s (a generation: 2.5, 5, 8, 16, 32, 64)."""
    max_speed: float | None


def read_pcie(sys_root: Path, hcas: dict[str, str]) -> list[PcieLink]:
    """The PCIe link of each NVIDIA GPU and of each HCA of ``hcas`` (PCI address → device name)."""
    base = sys_root / "bus" / "pci" / "devices"
    try:
        addresses = sorted(os.listdir(base))
    except OSError:
        return []
    gpus = [a for a in addresses if (_read(base / a / "vendor") or "").strip() == NVIDIA
            and (_read(base / a / "class") or "").strip().startswith(GPU_CLASSES)]
    chosen = [(a, "gpu", str(i)) for i, a in enumerate(gpus)] + [(a, "hca", hcas[a]) for a in addresses if a in hcas]
    out: list[PcieLink] = []
    for address, kind, name in chosen[:MAX_PCI]:
        d = base / address
        out.append(PcieLink(address, kind, name, parse_counter(_read(d / "current_link_width")),
                            parse_counter(_read(d / "max_link_width")),
                            parse_link_speed(_read(d / "current_link_speed")),
                            parse_link_speed(_read(d / "max_link_speed"))))
    return out


def boot_time(proc_root: Path) -> float | None:
    """``btime`` of ``/proc/stat``: when the node booted (a node that booted since the last document: its
    counters restarted and its links came up, no flap)."""
    for line in (_read(proc_root / "stat") or "").splitlines():
        if line.startswith("btime "):
            m = _NUMBER.match(line[6:])
            return float(m.group(1)) if m else None
    return None
