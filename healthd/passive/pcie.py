"""Each GPU's PCIe link from dcgm-exporter's link fields (pure).

``DCGM_FI_DEV_PCIE_LINK_WIDTH`` / ``DCGM_FI_DEV_PCIE_MAX_LINK_WIDTH`` and ``DCGM_FI_DEV_PCIE_LINK_GEN`` /
``DCGM_FI_DEV_PCIE_MAX_LINK_GEN`` (DCGM fields 238/236 and 237/235; NVML's current and maximum link width and
generation, the maximum being what the device and the slot allow together). A width below the maximum is a
link trained down (a riser, a dirty connector, a failing retimer) whatever the load; a generation below the
maximum means it only under load, since the link drops its generation at idle to save power.
"""

from __future__ import annotations

from collections.abc import Sequence
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

    @property
    def key(self) -> tuple[str, str]:
        return self.node, self.gpu_uuid or self.gpu or ""

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
