"""The node check's ``links`` step (``probes.links``): InfiniBand ports and PCIe links read from a FAKE sysfs tree in
the kernel's layouts (tests/fakes/sysfs.py), reported as absolute values within the prolog's budget."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

import probes.boundary as b
from probes import links
from tests.fakes import sysfs
from tests.probes.test_boundary import make_fake_smi, setup


def test_the_kernels_formats_are_read() -> None:
    assert links.parse_rate("400 Gb/sec (4X NDR)\n") == 50e9
    assert links.parse_rate("2.5 Gb/sec (1X SDR)") == 2.5e9 / 8
    assert links.parse_rate("garbage") is None
    assert links.parse_state("4: ACTIVE\n") == 4 and links.parse_state("5: LinkUp") == 5
    assert links.parse_counter("65535\n") == 65535.0 and links.parse_counter("N/A (no PMA)\n") is None
    assert links.parse_link_speed("32.0 GT/s PCIe\n") == 32.0 and links.parse_link_speed("8 GT/s") == 8.0
    assert links.parse_link_speed("Unknown") is None


def test_ports_and_links_are_read_from_sysfs(tmp_path: Path) -> None:
    node = sysfs.Node()
    node.ports["mlx5_4"] = sysfs.Port(rate="200 Gb/sec (4X HDR)", counters={"symbol_error": 12, "link_downed": 2,
                                                                            "port_xmit_data": 123456789})
    node.ports["mlx5_9"] = sysfs.Port(state=1, phys=2, rate="10 Gb/sec (4X SDR)")
    node.gpus[2] = sysfs.Link(width=8, speed="2.5 GT/s PCIe")
    node.hcas[1] = sysfs.Link(width=8)
    root = sysfs.write(tmp_path, node)
    ports = links.read_ib_ports(root)
    assert [p.device for p in ports] == sorted(sysfs.HCAS)
    p4 = next(p for p in ports if p.device == "mlx5_4")
    assert (p4.port, p4.state, p4.phys_state, p4.rate, p4.pci) == ("1", 4, 5, 25e9, "0000:4f:00.0")
    assert p4.counters == {"link_downed": 2.0, "symbol_error": 12.0, "port_rcv_errors": 0.0,
                           "port_rcv_remote_physical_errors": 0.0, "link_error_recovery": 0.0,
                           "port_xmit_discards": 0.0}  # traffic counters are not read
    pcie = links.read_pcie(root, {p.pci: p.device for p in ports if p.pci})
    assert [(d.kind, d.name) for d in pcie][:8] == [("gpu", str(i)) for i in range(8)]  # NVSwitches left out
    assert {d.name for d in pcie if d.kind == "hca"} == set(sysfs.HCAS)
    gpu2 = next(d for d in pcie if d.kind == "gpu" and d.name == "2")
    assert (gpu2.pci, gpu2.width, gpu2.max_width, gpu2.speed, gpu2.max_speed) == ("0000:52:00.0", 8, 16, 2.5, 32.0)
    assert next(d for d in pcie if d.name == "mlx5_3").width == 8
    assert links.boot_time(tmp_path / "proc") == 1_764_300_000.0


def test_a_prolog_reports_absolute_values_within_its_budget(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    node = sysfs.Node()
    node.ports["mlx5_0"] = sysfs.Port(counters={"link_downed": 3, "port_rcv_errors": 7})
    node.ports["mlx5_11"] = sysfs.Port(pma=False)
    root = sysfs.write(tmp_path / "node", node)
    monkeypatch.setenv("PATH", f"{make_fake_smi(tmp_path)}:/usr/bin:/bin")
    budget = b.Budget(b.DEFAULT_BUDGET_S["prolog"])
    f = b.run_checks(setup(tmp_path, context="prolog", sys_root=root, proc_root=tmp_path / "node" / "proc"), budget)
    assert "links" not in f.errors and "links" not in f.skipped and not b.broken(f)
    counters = {(m.labels["device"], m.labels["counter"]): m.value for m in f.measurements
                if m.name == "ib_port_counter"}
    assert counters[("mlx5_0", "link_downed")] == 3.0 and counters[("mlx5_0", "port_rcv_errors")] == 7.0
    assert not [k for k in counters if k[0] == "mlx5_11"]  # no PMA: no counter, not a zero
    rates = {m.labels["device"]: m.value for m in f.measurements if m.name == "ib_port_rate_bytes_per_second"}
    assert rates == dict.fromkeys(sysfs.HCAS, 50e9)
    widths = {m.labels.get("gpu") or m.labels["device"]: m.value for m in f.measurements if m.name == "pcie_link_width"}
    assert len(widths) == 16 and set(widths.values()) == {16.0}
    assert [m.value for m in f.measurements if m.name == "boot_time_seconds"] == [1_764_300_000.0]
    assert f.info["ib_ports"]["mlx5_0/1"] == "state 4, phys 5, 400 Gb/sec (4X NDR), InfiniBand"
    assert budget.elapsed() < b.DEFAULT_BUDGET_S["prolog"]


def test_a_node_without_infiniband_skips_with_the_reason(tmp_path: Path) -> None:
    f = b.Findings()
    started = time.monotonic()
    b.check_links(setup(tmp_path, sys_root=tmp_path / "nosys"), b.Budget(5.0), f, None)
    assert f.skipped["links.infiniband"].startswith("no InfiniBand device")
    assert f.skipped["links.pcie"].startswith("no NVIDIA GPU or HCA")
    assert f.measurements == [] and time.monotonic() - started < 1.0
