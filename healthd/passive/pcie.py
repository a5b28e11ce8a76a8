"""Each GPU's PCIe link from dcgm-exporter's link fields (pure).

``DCGM_FI_DEV_PCIE_LINK_WIDTH`` / ``DCGM_FI_DEV_PCIE_MAX_LINK_WIDTH`` and ``DCGM_FI_DEV_PCIE_LINK_GEN`` /
``DCGM_FI_DEV_PCIE_MAX_LINK_GEN`` (DCGM fields 238/236 and 237/235; NVML's current and maximum link width and
generation, the maximum being what the device and the slot allow together). A width below the maximum is a
link trained down (a riser, a dirty connector, a failing retimer) whatever the load; a generation below the
maximum means it only under load, since the link drops its generation at idle to save power.

The node check at job boundaries reads the same links from sysfs for the GPUs and the HCAs (``probes.links``:
``pcie_link_width``, ``pcie_link_max_width``, ``pcie_link_speed_gts``, ``pcie_link_max_speed_gts``);
``boundary_links`` makes them ``PcieLink``s (the speed as its generation). At a job boundary the GPUs are idle.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from healthd.passive.names import Located

FIELDS = {"DCGM_FI_DEV_PCIE_LINK_WIDTH": "width", "DCGM_FI_DEV_PCIE_MAX_LINK_WIDTH": "max_width",
          "DCGM_FI_DEV_PCIE_LINK_GEN": "gen", "DCGM_FI_DEV_PCIE_MAX_LINK_GEN": "max_gen"}


@dataclass(frozen=True, slots=True)
class PcieLink:
    node: str
    gpu: str | None
    gpu_uuid: str | None
    width: float | None = None
    max_width: float | None = None
    gen: float | None = None
    max_gen: float | None = None
    device: str | None = None
    """An HCA's device name (``mlx5_0``; boundary documents only), for a link that is not a GPU's."""

    @property
    def key(self) -> tuple[str, str]:
        return self.node, self.gpu_uuid or self.gpu or self.device or ""

    @property
    def where(self) -> str:
        """``gpu 3 (GPU-…)`` or ``HCA mlx5_0``."""
        if self.device and self.gpu is None:
            return f"HCA {self.device}"
        return f"gpu {self.gpu if self.gpu is not None else '?'}" + (f" ({self.gpu_uuid})" if self.gpu_uuid else "")

    @property
    def narrow(self) -> bool:
        """Trained below its maximum width (both known, the maximum above 0)."""
        return self.width is not None and self.max_width is not None and 0 < self.width < self.max_width

    @property
    def slow(self) -> bool:
        """Below its maximum generation (both known): a fault only while the GPU is busy."""
        return self.gen is not None and self.max_gen is not None and 0 < self.gen < self.max_gen


def links(samples: Sequence[Located]) -> tuple[PcieLink, ...]:
    """One ``PcieLink`` per GPU from the four fields' series (a field missing: ``None``)."""
    out: dict[tuple[str, str], dict[str, float]] = {}
    where: dict[tuple[str, str], Located] = {}
    for s in samples:
        field = FIELDS.get(s.labels.get("__name__", ""))
        if field is None or s.value != s.value:
            continue
        key = (s.node, s.gpu_key)
        out.setdefault(key, {})[field] = s.value
        where.setdefault(key, s)
    return tuple(PcieLink(where[k].node, where[k].gpu, where[k].gpu_uuid, v.get("width"), v.get("max_width"),
                          v.get("gen"), v.get("max_gen")) for k, v in sorted(out.items()))


GEN_OF_GTS = {2.5: 1.0, 5.0: 2.0, 8.0: 3.0, 16.0: 4.0, 32.0: 5.0, 64.0: 6.0}
"""A link speed (GT/s, as sysfs shows it) → its PCIe generation."""
BOUNDARY_FIELDS = {"pcie_link_width": "width", "pcie_link_max_width": "max_width", "pcie_link_speed_gts": "gen",
                   "pcie_link_max_speed_gts": "max_gen"}


def boundary_links(node: str, readings: Iterable[tuple[str, float, Mapping[str, str]]],
                   uuids: Mapping[str, str]) -> tuple[PcieLink, ...]:
    """One boundary document's ``pcie_link_*`` measurements as a ``PcieLink`` per GPU (``gpu`` label; its UUID from
    ``uuids``, GPU index → UUID) and per HCA (``device`` label)."""
    out: dict[tuple[str, str], dict[str, float]] = {}
    for name, value, labels in readings:
        field = BOUNDARY_FIELDS.get(name)
        if field is None or value != value:
            continue
        who = ("gpu", labels["gpu"]) if labels.get("gpu") else ("device", labels.get("device", ""))
        if not who[1]:
            continue
        out.setdefault(who, {})[field] = GEN_OF_GTS.get(value, value) if field in ("gen", "max_gen") else value
    return tuple(PcieLink(node, name if kind == "gpu" else None, uuids.get(name) if kind == "gpu" else None,
                          v.get("width"), v.get("max_width"), v.get("gen"), v.get("max_gen"),
                          name if kind == "device" else None)
                 for (kind, name), v in sorted(out.items()))
