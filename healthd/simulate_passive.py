"""Passive signals in ``healthd simulate``: a simulated site Prometheus holding dcgm-exporter's series for the
scenario's nodes, answered through the real passive source (``healthd.passive.source``: the query-answer
parser, the host-name mapping and the signal tracker) and judged by the real judge.

``[[passive]]`` in a scenario (docs/judgement.md, "Simulation"):

- ``xid``: the GPU logs XID ``xid`` at the round's first tick (the last-XID gauge takes its value; with
  ``repeat_rounds``, again every that many rounds);
- ``stale_xid``: the gauge holds ``xid`` from before healthd's first poll (last week's XID: must change
  nothing);
- ``throttle``: the GPU's clock-event bitmask has ``bits`` (default HW thermal) while active;
- ``row_remap_failure``: ``DCGM_FI_DEV_ROW_REMAP_FAILURE`` is 1 while active;
- ``ecc_dbe``: the double-bit ECC counter increases at the round's first tick;
- ``exporter_missing``: the node has no series at all while active.

Each applies to ``nodes``, or to the first ``share`` of ``node_class``'s nodes. A signal on a node without a
scenario fault of its own is spurious as far as the probes go: draining that node counts as a false drain.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterable, Sequence
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

DCGM = {
    "xid": "DCGM_FI_DEV_XID_ERRORS",
    "throttle": "DCGM_FI_DEV_CLOCKS_EVENT_REASONS",
    "row_remap_failure": "DCGM_FI_DEV_ROW_REMAP_FAILURE",
    "ecc_dbe": "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
}
"""The dcgm-exporter fields the simulated site exports (the others are unavailable, as at many sites)."""
HW_THERMAL = 0x40


class PassiveSpec(BaseModel):
    """A passive signal of the simulated site (see the module's docstring)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["xid", "stale_xid", "throttle", "row_remap_failure", "ecc_dbe", "exporter_missing"]
    nodes: list[str] = Field(default_factory=list)
    node_class: str | None = None
    share: float = Field(default=1.0, gt=0, le=1)
    gpu: int = Field(default=0, ge=0)
    xid: int = Field(default=79, ge=1)
    bits: int = Field(default=HW_THERMAL, ge=1)
    repeat_rounds: int = Field(default=0, ge=0)
    from_round: int = Field(default=1, ge=1)
    until_round: int = Field(default=0, ge=0)

    @model_validator(mode="after")
    def _where(self) -> PassiveSpec:
        if not self.nodes and self.node_class is None:
            raise ValueError("a passive signal needs nodes or node_class")
        return self

    def active(self, rnd: int) -> bool:
        return self.from_round <= rnd and (self.until_round == 0 or rnd <= self.until_round)

    def fires(self, rnd: int) -> bool:
        """An event (xid, ecc_dbe) happens in this round."""
        if not self.active(rnd):
            return False
        return rnd == self.from_round or bool(self.repeat_rounds and (rnd - self.from_round) % self.repeat_rounds == 0)

    def describe(self) -> str:
        what = {"xid": f"xid {self.xid}", "stale_xid": f"stale xid {self.xid}", "throttle": f"throttle {self.bits:#x}"}
        where = ",".join(self.nodes) if self.nodes else f"{self.share:.0%} of {self.node_class}"
        return f"{what.get(self.kind, self.kind)} gpu {self.gpu} on {where}"


def targets(spec: PassiveSpec, classes: dict[str, list[str]]) -> list[str]:
    if spec.nodes:
        return list(spec.nodes)
    names = sorted(classes.get(spec.node_class or "", []))
    return names[:max(1, round(spec.share * len(names)))]


class SimPrometheus:
    """The site's Prometheus as healthd's passive source queries it (``QueryClient``): dcgm-exporter's
    series of every GPU of the scenario's nodes, as an instant-query answer."""

    def __init__(self, gpus: dict[str, int], specs: Sequence[PassiveSpec], classes: dict[str, list[str]]) -> None:
        self.gpus = gpus
        self.specs = [(s, targets(s, classes)) for s in specs]
        self.values: dict[tuple[str, int, str], float] = {}
        self.missing: set[str] = set()
        for s, nodes in self.specs:
            if s.kind == "stale_xid":
                for n in nodes:
                    self.values[(n, s.gpu, DCGM["xid"])] = float(s.xid)

    def round_start(self, rnd: int) -> None:
        """The round's events and levels: what changes at its first tick."""
        self.missing = set()
        for s, nodes in self.specs:
            for n in nodes:
                key = (n, s.gpu)
                if s.kind == "xid" and s.fires(rnd):
                    self.values[(*key, DCGM["xid"])] = float(s.xid)
                elif s.kind == "ecc_dbe" and s.fires(rnd):
                    self.values[(*key, DCGM["ecc_dbe"])] = self.values.get((*key, DCGM["ecc_dbe"]), 0.0) + 1
                elif s.kind == "throttle":
                    self.values[(*key, DCGM["throttle"])] = float(s.bits) if s.active(rnd) else 0.0
                elif s.kind == "row_remap_failure":
                    self.values[(*key, DCGM["row_remap_failure"])] = 1.0 if s.active(rnd) else 0.0
                elif s.kind == "exporter_missing" and s.active(rnd):
                    self.missing.add(n)

    def query(self, promql: str) -> bytes:
        names = set(re.findall(r"\bDCGM_[A-Z0-9_]+\b", promql)) & set(DCGM.values())
        result = []
        for name in sorted(names):
            for node, count in self.gpus.items():
                if node in self.missing:
                    continue
                for gpu in range(count):
                    value = self.values.get((node, gpu, name), 0.0)
                    result.append({"metric": {"__name__": name, "gpu": str(gpu), "UUID": sim_uuid(node, gpu),
                                              "device": f"nvidia{gpu}", "modelName": "NVIDIA H100 80GB HBM3",
                                              "Hostname": node, "DCGM_FI_DRIVER_VERSION": "580.95.05"},
                                   "value": [0, repr(value)]})
        return json.dumps({"status": "success", "data": {"resultType": "vector", "result": result}}).encode()

    def spurious(self, node: str, rnd: int) -> bool:
        """Whether a fault-class passive signal was put on ``node`` by the scenario up to ``rnd``."""
        return any(node in nodes and s.kind in ("xid", "row_remap_failure", "ecc_dbe") and s.from_round <= rnd
                   for s, nodes in self.specs)


def sim_uuid(node: str, gpu: int) -> str:
    """The simulated GPU's UUID: the same the simulated probes report (``SimCluster._environment``)."""
    return f"GPU-{uuid.uuid5(uuid.NAMESPACE_URL, f'{node}/{gpu}')}"


def nodes_of(specs: Iterable[PassiveSpec]) -> set[str]:
    return {n for s in specs for n in s.nodes}
