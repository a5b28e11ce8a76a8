"""A FAKE sysfs tree of an 8-GPU, 8-HCA node (InfiniBand cannot run here), written with the kernel's layouts and
file formats: ``class/infiniband/<dev>/ports/<n>/{state,phys_state,rate,link_layer,counters/*}`` (the PMA
counters of ``drivers/infiniband/core/sysfs.c``; ``N/A (no PMA)`` where a device has none),
``class/infiniband/<dev>/device`` a link to its PCI device, and
``bus/pci/devices/<address>/{vendor,class,current_link_width,max_link_width,current_link_speed,max_link_speed}``
(``32.0 GT/s PCIe``). The PCI addresses and device names follow a DGX H100's (``lspci``, ``ibstat``): GPUs
at ``1b``, ``43``, ``52``, ``61``, ``9d``, ``c3``, ``d1``, ``df``; ConnectX-7 compute HCAs ``mlx5_0``,
``mlx5_3``..``mlx5_6``, ``mlx5_9``..``mlx5_11``. A test changes a port or a link and writes the tree again."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

GPU_PCI = ["0000:1b:00.0", "0000:43:00.0", "0000:52:00.0", "0000:61:00.0", "0000:9d:00.0", "0000:c3:00.0",
           "0000:d1:00.0", "0000:df:00.0"]
HCAS = ["mlx5_0", "mlx5_3", "mlx5_4", "mlx5_5", "mlx5_6", "mlx5_9", "mlx5_10", "mlx5_11"]
HCA_PCI = ["0000:18:00.0", "0000:40:00.0", "0000:4f:00.0", "0000:5e:00.0", "0000:9a:00.0", "0000:c0:00.0",
           "0000:ce:00.0", "0000:dc:00.0"]
NVSWITCH_PCI = ["0000:05:00.0", "0000:06:00.0"]
STATES = {1: "DOWN", 2: "INIT", 3: "ARMED", 4: "ACTIVE"}
PHYS = {2: "Polling", 3: "Disabled", 5: "LinkUp", 6: "LinkErrorRecovery"}
COUNTER_NAMES = ("symbol_error", "link_error_recovery", "link_downed", "port_rcv_errors",
                 "port_rcv_remote_physical_errors", "port_rcv_switch_relay_errors", "port_xmit_discards",
                 "port_xmit_constraint_errors", "port_rcv_constraint_errors", "local_link_integrity_errors",
                 "excessive_buffer_overrun_errors", "VL15_dropped", "port_xmit_data", "port_rcv_data",
                 "port_xmit_packets", "port_rcv_packets", "port_xmit_wait", "unicast_xmit_packets",
                 "unicast_rcv_packets", "multicast_xmit_packets", "multicast_rcv_packets")


@dataclass
class Port:
    state: int = 4
    phys: int = 5
    rate: str = "400 Gb/sec (4X NDR)"
    counters: dict[str, int] = field(default_factory=dict)
    pma: bool = True


@dataclass
class Link:
    width: int = 16
    max_width: int = 16
    speed: str = "32.0 GT/s PCIe"
    max_speed: str = "32.0 GT/s PCIe"


@dataclass
class Node:
    ports: dict[str, Port] = field(default_factory=lambda: {h: Port() for h in HCAS})
    gpus: list[Link] = field(default_factory=lambda: [Link(speed="2.5 GT/s PCIe") for _ in GPU_PCI])
    """Idle GPUs: their links dropped to gen 1 to save power (the width stays)."""
    hcas: list[Link] = field(default_factory=lambda: [Link() for _ in HCAS])
    btime: int = 1_764_300_000


def write(root: Path, node: Node, written: dict[Path, str] | None = None) -> Path:
    """``node`` as ``root/sys`` and ``root/proc/stat``; ``root/sys`` returned (a rewrite replaces the values;
    ``written``: the texts written before, kept up to date, so that a rewrite writes only what changed)."""
    done: dict[Path, str] = {} if written is None else written

    def put(path: Path, text: str) -> None:
        if done.get(path) != text:
            path.write_text(text)
            done[path] = text

    sys_root = root / "sys"
    pci = sys_root / "bus" / "pci" / "devices"
    for address, link, vendor, cls in (
            [(a, g, "0x10de", "0x030200") for a, g in zip(GPU_PCI, node.gpus, strict=True)]
            + [(a, h, "0x15b3", "0x020700") for a, h in zip(HCA_PCI, node.hcas, strict=True)]
            + [(a, Link(width=2, max_width=2, speed="16.0 GT/s PCIe", max_speed="16.0 GT/s PCIe"), "0x10de",
                "0x068000") for a in NVSWITCH_PCI]):
        d = pci / address
        d.mkdir(parents=True, exist_ok=True)
        for name, text in (("vendor", vendor), ("class", cls), ("current_link_width", str(link.width)),
                           ("max_link_width", str(link.max_width)), ("current_link_speed", link.speed),
                           ("max_link_speed", link.max_speed)):
            put(d / name, text + "\n")
    for hca, address in zip(HCAS, HCA_PCI, strict=True):
        d = sys_root / "class" / "infiniband" / hca
        (d / "ports").mkdir(parents=True, exist_ok=True)
        if not (d / "device").is_symlink():
            os.symlink(os.path.relpath(pci / address, d), d / "device")
        port = node.ports[hca]
        p = d / "ports" / "1"
        (p / "counters").mkdir(parents=True, exist_ok=True)
        put(p / "state", f"{port.state}: {STATES[port.state]}\n")
        put(p / "phys_state", f"{port.phys}: {PHYS[port.phys]}\n")
        put(p / "rate", port.rate + "\n")
        put(p / "link_layer", "InfiniBand\n")
        for name in COUNTER_NAMES:
            put(p / "counters" / name, f"{port.counters.get(name, 0)}\n" if port.pma else "N/A (no PMA)\n")
    (root / "proc").mkdir(exist_ok=True)
    put(root / "proc" / "stat",
        "cpu  10132153 290696 3084719 46828483 16683 0 25195 0 0 0\nintr 199292 0 0\nctxt 3346468\n"
        f"btime {node.btime}\nprocesses 26442\nprocs_running 1\nprocs_blocked 0\n")
    return sys_root
