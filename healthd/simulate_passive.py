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
- ``busy``: with ``throttle``, the GPU is busy (``DCGM_FI_DEV_GPU_UTIL`` 90) while active: a power brake or
  hardware slowdown held ``[judge.passive] throttle_sustain_s`` is then a finding (``throttle_*``).

node_exporter's ``infiniband`` collector (``healthd.passive.fabric``; every node has ``hcas`` single-port
HCAs ``mlx5_<i>`` at NDR, some with old link-down counts from past boots):

- ``ib_flap``: ``link_downed`` of ``device`` rises at the round's first tick (``repeat_rounds`` as for XIDs);
- ``ib_errors``: ``symbol_error`` of ``device`` rises by ``count`` every active round;
- ``ib_reset``: every counter of the node cleared at ``from_round``;
- ``ib_saturated``: ``symbol_error`` of ``device`` at 65535 while active;
- ``node_exporter_restart``: the node's node_exporter answers nothing while active;
- ``reboot``: the node boots at ``from_round`` (boot time changes, counters cleared, ``link_downed`` 1);
- ``ib_slow_link``: ``device``'s rate is half its class's while active.

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
    "util": "DCGM_FI_DEV_GPU_UTIL",
}
"""The dcgm-exporter fields the simulated site exports (the others are unavailable, as at many sites)."""
HW_THERMAL = 0x40


class PassiveSpec(BaseModel):
    """A passive signal of the simulated site (see the module's docstring)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["xid", "stale_xid", "throttle", "row_remap_failure", "ecc_dbe", "exporter_missing", "ib_flap",
                  "ib_errors", "ib_reset", "ib_saturated", "node_exporter_restart", "reboot", "ib_slow_link"]
    nodes: list[str] = Field(default_factory=list)
    node_class: str | None = None
    share: float = Field(default=1.0, gt=0, le=1)
    gpu: int = Field(default=0, ge=0)
    xid: int = Field(default=79, ge=1)
    bits: int = Field(default=HW_THERMAL, ge=1)
    repeat_rounds: int = Field(default=0, ge=0)
    from_round: int = Field(default=1, ge=1)
    until_round: int = Field(default=0, ge=0)
    busy: bool = False
    device: str = "mlx5_0"
    count: int = Field(default=50, ge=1)

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
        if self.kind in ("ib_reset", "node_exporter_restart", "reboot"):
            return f"{self.kind} on {where}"
        if self.kind.startswith("ib_"):
            return f"{self.kind} {self.device} on {where}"
        return f"{what.get(self.kind, self.kind)}{' busy' if self.busy else ''} gpu {self.gpu} on {where}"


def targets(spec: PassiveSpec, classes: dict[str, list[str]]) -> list[str]:
    if spec.nodes:
        return list(spec.nodes)
    names = sorted(classes.get(spec.node_class or "", []))
    return names[:max(1, round(spec.share * len(names)))]


class SimPrometheus:
    """The site's Prometheus as healthd's passive source queries it (``QueryClient``): dcgm-exporter's
    series of every GPU of the scenario's nodes, as an instant-query answer."""

    def __init__(self, gpus: dict[str, int], specs: Sequence[PassiveSpec], classes: dict[str, list[str]], *,
                 hcas: int = 4) -> None:
        self.gpus = gpus
        self.specs = [(s, targets(s, classes)) for s in specs]
        self.values: dict[tuple[str, int, str], float] = {}
        self.missing: set[str] = set()
        self.hcas = hcas
        self.ib = IbSite(sorted(gpus), hcas)
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
                if s.kind == "throttle" and s.busy:
                    self.values[(*key, DCGM["util"])] = 90.0 if s.active(rnd) else 0.0
                self.ib.round_start(s, n, rnd)

    def query(self, promql: str) -> bytes:
        if "node_infiniband_" in promql or "node_boot_time_seconds" in promql:
            return _answer(self.ib.query(promql))
        names = set(re.findall(r"\bDCGM_[A-Z0-9_]+\b", promql)) & set(DCGM.values())
        result: list[dict[str, object]] = []
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
        return _answer(result)

    def spurious(self, node: str, rnd: int) -> bool:
        """Whether a fault-class passive signal was put on ``node`` by the scenario up to ``rnd``."""
        return any(node in nodes and s.kind in ("xid", "row_remap_failure", "ecc_dbe") and s.from_round <= rnd
                   for s, nodes in self.specs)


def _answer(result: list[dict[str, object]]) -> bytes:
    return json.dumps({"status": "success", "data": {"resultType": "vector", "result": result}}).encode()


IB_COUNTERS = ("link_downed", "symbol_error", "port_errors_received", "port_receive_remote_physical_errors",
               "link_error_recovery")
NDR = 50e9


class IbSite:
    """node_exporter's InfiniBand series of every node, answering the default ``[passive.fabric]`` queries
    as Prometheus would (the ``> 0`` filter, ``count without``, the active ports' rates)."""

    def __init__(self, nodes: Sequence[str], hcas: int) -> None:
        self.nodes = list(nodes)
        self.devices = [f"mlx5_{i}" for i in range(hcas)]
        self.counters: dict[tuple[str, str, str], float] = {}
        for i, n in enumerate(self.nodes):
            if i % 5 == 0:  # link-down counts from past boots and maintenance: a baseline, not a flap
                self.counters[(n, self.devices[0], "link_downed")] = float(1 + i % 3)
        self.boot: dict[str, float] = {n: 1_700_000_000.0 for n in self.nodes}
        self.rate: dict[tuple[str, str], float] = {}
        self.down: set[str] = set()

    def round_start(self, s: PassiveSpec, node: str, rnd: int) -> None:
        key = (node, s.device)
        if s.kind == "ib_flap" and s.fires(rnd):
            self._add(node, s.device, "link_downed", 1.0, 255.0)
        elif s.kind == "ib_errors" and s.active(rnd):
            self._add(node, s.device, "symbol_error", float(s.count), 65535.0)
        elif s.kind == "ib_reset" and rnd == s.from_round:
            for k in [k for k in self.counters if k[0] == node]:
                del self.counters[k]
        elif s.kind == "ib_saturated" and s.active(rnd):
            self.counters[(node, s.device, "symbol_error")] = 65535.0
        elif s.kind == "node_exporter_restart":
            (self.down.add if s.active(rnd) else self.down.discard)(node)
        elif s.kind == "reboot" and rnd == s.from_round:
            self.boot[node] += 1e6 + rnd
            for k in [k for k in self.counters if k[0] == node]:
                del self.counters[k]
            for d in self.devices:
                self.counters[(node, d, "link_downed")] = 1.0
        elif s.kind == "ib_slow_link":
            if s.active(rnd):
                self.rate[key] = NDR / 2
            else:
                self.rate.pop(key, None)

    def _add(self, node: str, device: str, counter: str, by: float, width: float) -> None:
        key = (node, device, counter)
        self.counters[key] = min(self.counters.get(key, 0.0) + by, width)

    def query(self, promql: str) -> list[dict[str, object]]:
        up = [n for n in self.nodes if n not in self.down]
        out: list[dict[str, object]] = []

        def series(labels: dict[str, str], value: float) -> None:
            out.append({"metric": labels, "value": [0, repr(value)]})

        if "node_boot_time_seconds" in promql:
            for n in up:
                series({"__name__": "node_boot_time_seconds", "instance": f"{n}:9100", "job": "node"}, self.boot[n])
        elif "count without" in promql:
            for n in up:
                for c in IB_COUNTERS:
                    series({"counter": c, "instance": f"{n}:9100", "job": "node"}, float(len(self.devices)))
        elif "rate_bytes_per_second" in promql or "physical_state_id" in promql:
            rate = "rate_bytes_per_second" in promql
            for n in up:
                for d in self.devices:
                    name = "node_infiniband_rate_bytes_per_second" if rate else "node_infiniband_physical_state_id"
                    series({"__name__": name, "device": d, "port": "1", "instance": f"{n}:9100", "job": "node"},
                           self.rate.get((n, d), NDR) if rate else 5.0)
        else:
            down = set(self.down)
            for (n, d, c), v in sorted(self.counters.items()):
                if n not in down and v > 0:
                    series({"__name__": f"node_infiniband_{c}_total", "device": d, "port": "1",
                            "instance": f"{n}:9100", "job": "node"}, v)
        return out


def sim_uuid(node: str, gpu: int) -> str:
    """The simulated GPU's UUID: the same the simulated probes report (``SimCluster._environment``)."""
    return f"GPU-{uuid.uuid5(uuid.NAMESPACE_URL, f'{node}/{gpu}')}"


def nodes_of(specs: Iterable[PassiveSpec]) -> set[str]:
    return {n for s in specs for n in s.nodes}
