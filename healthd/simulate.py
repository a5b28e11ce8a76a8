"""``healthd simulate``: a synthetic fleet through the real planner, collector, store, judge and
remediation, to see what a set of thresholds finds, recommends and drains.

Nothing is mocked but the cluster: ``SimCluster`` implements the ``ClusterBackend`` protocol in
memory (node states, jobs, drains) and its "probes" write real ``ProbeResult`` files whose values
follow the scenario (nominal values, noise, injected faults, fleet-wide events). Each simulated
tick does what the daemon does: discover, collect (``Collector``), judge (``judge_collected``),
remediate (``Remediator.apply``), plan (``planning.plan`` with the judge's re-probe requests) and
launch. The store is a real SQLite file in a temporary directory.

The scenario format is documented in ``docs/judgement.md``; ``bench/scenarios/`` has examples.
"""

from __future__ import annotations

import json
import random
import re
import tempfile
import time
import tomllib
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from healthd import planning
from healthd.cluster.base import BackendTraits
from healthd.collector import Collected, Collector
from healthd.config import Settings
from healthd.errors import BackendError, ConfigError, PolicyRefused, TopologyError
from healthd.judge.engine import Judge
from healthd.judge.model import JudgeOutput
from healthd.judge.persist import judge_collected, judge_passive_poll
from healthd.judge.sources.fabric import PROBE as FABRIC_PROBE
from healthd.judge.sources.fabric import rail_key
from healthd.model import JobState, JobStatus, Node, Outcome, ProbeJob, validate_node_name
from healthd.passive.source import PassiveSource
from healthd.planning import PlanLimits, plan
from healthd.remediation import Action, Remediator
from healthd.simulate_passive import PassiveSpec, SimPrometheus, nodes_of
from healthd.store import Store
from healthd.topology import SwitchRecord, Topology, build_topology
from probes.result import Check, DeviceInfo, Environment, Measurement, ProbeResult, RankInfo

PASSIVE_PROBES = frozenset({"passive", "fabric", "throttle", "pcie"})
"""The pseudo-probes of the passive sources (the site's Prometheus): a fault they name counts as found."""
SIM_EPOCH = 1_700_000_000.0


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SeriesSpec(_Model):
    """One measurement a simulated probe reports, with its healthy value."""

    probe: str
    name: str
    per: Literal["gpu", "node", "group"] = "node"
    """``gpu``: one value per GPU (label ``gpu``); ``node``: one per node; ``group``: one per
    multi-node job (no node: the measurement describes the group)."""
    labels: dict[str, str] = Field(default_factory=dict)
    value: float = Field(gt=0)
    noise: float | None = Field(default=None, ge=0)
    """Relative standard deviation; default: the class's ``noise``."""


class ClassSpec(_Model):
    name: str = Field(pattern=r"^[A-Za-z0-9._-]+$")
    count: int = Field(ge=1)
    prefix: str = Field(default="node", pattern=r"^[A-Za-z][A-Za-z0-9-]*$")
    gpus: int = Field(default=8, ge=0)
    gpu_type: str = "gpu"
    partitions: list[str] = Field(default_factory=lambda: ["gpu"])
    noise: float = Field(default=0.02, ge=0)
    """Run-to-run noise: the relative standard deviation of every value."""
    spread: float = Field(default=0.0, ge=0)
    """Healthy nodes and GPUs differ: persistent per-node and per-GPU offsets (relative standard
    deviation), drawn once per node, GPU and series."""
    outlier_rate: float = Field(default=0.0, ge=0, le=1)
    """Heavy-tailed noise: the share of (run, node) results that are far off for no hardware reason..."""
    outlier_factor: float = Field(default=0.75, gt=0)
    """...by this factor (every value of that node in that run)..."""
    outlier_factor_max: float | None = Field(default=None, gt=0)
    """...or, when set, by a factor drawn uniformly between ``outlier_factor`` and this (0.6 and 0.7:
    30-40% low)."""
    series: list[SeriesSpec] = Field(default_factory=list)


class FaultSpec(_Model):
    """A fault injected on a node (or GPU, or link) from ``from_round`` to ``until_round``."""

    kind: Literal["node", "gpu", "link", "check", "error", "hang", "crash", "gpus_missing", "drift"]
    """``node``: node- and GPU-level values of the node scale by ``factor``; ``gpu``: one GPU's
    values; ``link``: every multi-node value of a job the node is in (with ``peer`` set: only jobs
    with both); ``check``: the probe fails its sanity check on the node; ``error``: the probe
    cannot run on the node (an infrastructure error, never the node's fault) with ``rate``;
    ``hang`` / ``crash``: a rank on the node hangs (the job runs to its timeout) or dies in the
    measurement phase, with ``rate``; ``gpus_missing``: the node shows ``visible_gpus`` GPUs (every
    probe fails to start there); ``drift``: like ``node`` with a factor of ``per_round`` compounding
    every round from ``from_round``."""
    node: str
    probe: str = "*"
    """The probe it affects (``*``: every probe; ``gpus_missing`` always hits every probe)."""
    name: str = "*"
    factor: float = Field(default=1.0, gt=0)
    gpu: int | None = Field(default=None, ge=0)
    peer: str | None = None
    rate: float = Field(default=1.0, gt=0, le=1)
    visible_gpus: int = Field(default=0, ge=0)
    """``gpus_missing``: the GPUs the node still shows."""
    per_round: float = Field(default=0.98, gt=0)
    """``drift``: the factor applied once more every round."""
    from_round: int = Field(default=1, ge=1)
    until_round: int = Field(default=0, ge=0)
    """Last round of the fault (0: to the end)."""

    @model_validator(mode="after")
    def _check(self) -> FaultSpec:
        if self.kind == "gpu" and self.gpu is None:
            raise ValueError("a gpu fault needs gpu = <index>")
        return self

    def active(self, rnd: int) -> bool:
        return self.from_round <= rnd and (self.until_round == 0 or rnd <= self.until_round)

    def hits(self, probe: str) -> bool:
        return self.kind == "gpus_missing" or fnmatchcase(probe, self.probe)

    def scale(self, rnd: int) -> float:
        """The factor on the node's values in round ``rnd`` (``node`` and ``drift``)."""
        if self.kind == "drift":
            return float(self.per_round ** (rnd - self.from_round + 1))
        return self.factor

    @property
    def hard(self) -> bool:
        return self.kind in HARD_KINDS

    @property
    def path(self) -> bool:
        """A ``link`` fault with a ``peer``: the path between the two nodes, found as a link finding
        (``healthd.judge.links``), never a node's fault."""
        return self.kind == "link" and self.peer is not None

    def describe(self) -> str:
        scale = f" x{self.factor:g}" if self.kind in ("node", "gpu", "link") else ""
        if self.kind == "drift":
            scale = f" x{self.per_round:g}/round"
        elif self.kind == "gpus_missing":
            return f"gpus_missing ({self.visible_gpus} visible)"
        name = "" if self.name == "*" else f" {self.name.replace('_bytes_per_second', '').replace('_per_second', '')}"
        return f"{self.kind} {self.probe}{name}{scale}"


HARD_KINDS = frozenset({"hang", "crash", "gpus_missing"})
FOUND_KINDS = frozenset({"node", "gpu", "link", "check", "drift"}) | HARD_KINDS
"""Fault kinds the judge must find (``error`` must never lead to a drain)."""


class EventSpec(_Model):
    """A fleet-wide change: every value of the class matching probe and name scales by ``factor``."""

    node_class: str
    probe: str
    name: str = "*"
    labels: dict[str, str] = Field(default_factory=dict)
    """Only the series with these labels (``{ scope = "group" }``: the inter-node fabric, not a node's
    own NVLink); default every series of the name."""
    per: Literal["gpu", "node", "group"] | None = None
    """Only the series reported this way (``gpu``: the per-GPU series alone); default every one."""
    factor: float = Field(gt=0)
    from_round: int = Field(ge=1)
    until_round: int = Field(default=0, ge=0)

    def active(self, rnd: int) -> bool:
        return self.from_round <= rnd and (self.until_round == 0 or rnd <= self.until_round)

    def hits(self, series: SeriesSpec) -> bool:
        return (fnmatchcase(series.name, self.name) and (self.per is None or series.per == self.per)
                and all(series.labels.get(k) == v for k, v in self.labels.items()))


class ShiftSpec(_Model):
    """A common-mode shift: in each round it hits (a share ``rate`` of its rounds, drawn per round from
    the seed), every value of the matching classes and probes measured in that round scales by one
    factor drawn uniformly between ``factor_min`` and ``factor_max`` (a loaded host, a busy fabric: the
    whole round moves together, no node more than another)."""

    node_class: str = "*"
    probe: str = "*"
    factor_min: float = Field(gt=0)
    factor_max: float = Field(gt=0)
    rate: float = Field(default=1.0, ge=0, le=1)
    from_round: int = Field(default=1, ge=1)
    until_round: int = Field(default=0, ge=0)

    @model_validator(mode="after")
    def _check(self) -> ShiftSpec:
        if self.factor_max < self.factor_min:
            raise ValueError("factor_max is below factor_min")
        return self

    def factor(self, seed: int, index: int, rnd: int) -> float:
        """The shift's factor in round ``rnd`` (1.0 when it does not hit that round); the same for every
        class and probe it matches, and independent of the scenario's other random draws."""
        if not (self.from_round <= rnd and (self.until_round == 0 or rnd <= self.until_round)):
            return 1.0
        rng = random.Random(f"{seed}:shift:{index}:{rnd}")
        if rng.random() >= self.rate:
            return 1.0
        return rng.uniform(self.factor_min, self.factor_max)


class SwitchSpec(_Model):
    """A switch of the simulated fabric (``topology/tree``): its nodes (a leaf) or its child switches."""

    name: str = Field(pattern=r"^[A-Za-z0-9._-]+$")
    nodes: list[str] = Field(default_factory=list)
    switches: list[str] = Field(default_factory=list)


class FabricSpec(_Model):
    """A generated fabric: the scenario's nodes in name order, ``leaf_size`` per leaf ``leaf<j>``, and
    ``leaves_per_spine`` leaves per spine ``spine<k>`` (0: leaves only)."""

    leaf_size: int = Field(ge=1)
    leaves_per_spine: int = Field(default=0, ge=0)
    by_class: bool = False
    """Each class cabled under its own leaves and spines: a class's first node starts a new leaf, and
    its first leaf a new spine (a class bought and cabled as one block)."""


class SwitchFaultSpec(_Model):
    """A fault on a switch from ``from_round`` to ``until_round``."""

    kind: Literal["switch", "uplink", "rack"]
    """``switch``: every multi-node value of a job with a node under the switch scales by ``factor``;
    ``uplink``: only of jobs spanning nodes under it and nodes outside (cross-leaf pairs);
    ``rack``: the node- and GPU-level values of every node under it (power or cooling)."""
    switch: str
    probe: str = "nccl"
    name: str = "*"
    factor: float = Field(default=0.6, gt=0)
    from_round: int = Field(default=1, ge=1)
    until_round: int = Field(default=0, ge=0)

    def active(self, rnd: int) -> bool:
        return self.from_round <= rnd and (self.until_round == 0 or rnd <= self.until_round)

    def describe(self) -> str:
        return f"{self.kind} {self.switch} {self.probe} x{self.factor:g}"


class UserSpec(_Model):
    """Users taking nodes (``allocated``) from ``from_round`` to ``until_round``."""

    nodes: list[str] = Field(default_factory=list)
    count: int = Field(default=0, ge=0)
    """Random nodes taken in addition (never a node with an injected fault)."""
    from_round: int = Field(default=1, ge=1)
    until_round: int = Field(default=0, ge=0)


class AdminDrainSpec(_Model):
    """An administrator drains a node for their own reason (healthd must never touch it)."""

    node: str
    reason: str = "maintenance (admin)"
    from_round: int = Field(default=1, ge=1)


class Scenario(_Model):
    name: str = "scenario"
    description: str = ""
    seed: int = 1
    rounds: int = Field(default=10, ge=1)
    round_s: float = Field(default=900.0, gt=0)
    tick_s: float = Field(default=60.0, gt=0)
    probe_seconds: dict[str, float] = Field(default_factory=lambda: {"gemm": 45.0, "nccl": 75.0, "ddp": 90.0})
    healthd: dict[str, Any] = Field(default_factory=dict)
    """healthd settings, the same keys as ``healthd.toml`` (probes, judge, remediation, slurm limits)."""
    classes: list[ClassSpec] = Field(min_length=1)
    faults: list[FaultSpec] = Field(default_factory=list)
    events: list[EventSpec] = Field(default_factory=list)
    shifts: list[ShiftSpec] = Field(default_factory=list)
    """Round-wide common-mode shifts (``ShiftSpec``)."""
    users: list[UserSpec] = Field(default_factory=list)
    admin_drains: list[AdminDrainSpec] = Field(default_factory=list)
    switches: list[SwitchSpec] = Field(default_factory=list)
    """The fabric (``topology/tree``), switch by switch; or ``fabric``, generated."""
    fabric: FabricSpec | None = None
    switch_faults: list[SwitchFaultSpec] = Field(default_factory=list)
    use_topology: bool = True
    """Give the judge the fabric (``Judge.set_topology``); false: judged as without a topology plugin."""
    passive: list[PassiveSpec] = Field(default_factory=list)
    """Passive signals of the site's dcgm-exporter (``healthd.simulate_passive``), polled every tick."""

    def node_names(self) -> list[str]:
        return [f"{c.prefix}{i:0{len(str(c.count - 1))}d}" for c in self.classes for i in range(c.count)]

    def topology(self) -> Topology | None:
        """The scenario's fabric (``switches`` or ``fabric``), or ``None``."""
        records = [SwitchRecord(s.name, tuple(s.nodes), tuple(s.switches)) for s in self.switches]
        if self.fabric is not None:
            f = self.fabric
            blocks = [self.node_names()] if not f.by_class else [
                [f"{c.prefix}{i:0{len(str(c.count - 1))}d}" for i in range(c.count)] for c in self.classes]
            leaves: list[str] = []
            spines: list[tuple[str, ...]] = []
            for names in blocks:
                first = len(leaves)
                for j in range(0, len(names), f.leaf_size):
                    leaves.append(f"leaf{len(leaves)}")
                    records.append(SwitchRecord(leaves[-1], tuple(names[j:j + f.leaf_size])))
                if f.leaves_per_spine:
                    spines += [tuple(leaves[k:k + f.leaves_per_spine])
                               for k in range(first, len(leaves), f.leaves_per_spine)]
            records += [SwitchRecord(f"spine{k}", switches=below) for k, below in enumerate(spines)]
        return build_topology(records, "tree", source="scenario") if records else None

    @model_validator(mode="after")
    def _check(self) -> Scenario:
        if self.tick_s > self.round_s:
            raise ValueError("tick_s is longer than round_s")
        names = set(self.node_names())
        for where, node in ([("faults", f.node) for f in self.faults]
                            + [("faults.peer", f.peer) for f in self.faults if f.peer]
                            + [("users", n) for u in self.users for n in u.nodes]
                            + [("admin_drains", d.node) for d in self.admin_drains]):
            if node not in names:
                raise ValueError(f"{where}: no node {node!r} in the scenario's classes")
        classes = {c.name for c in self.classes}
        for e in self.events:
            if e.node_class not in classes:
                raise ValueError(f"events: no class {e.node_class!r}")
        try:
            topology = self.topology()
        except TopologyError as exc:
            raise ValueError(f"switches: {exc}") from None
        if topology is not None:
            unknown = sorted(set(topology.leaf_of) - names)
            if unknown:
                raise ValueError(f"switches: no node {unknown[0]!r} in the scenario's classes")
        for f in self.switch_faults:
            if topology is None or f.switch not in topology.switches:
                raise ValueError(f"switch_faults: no switch {f.switch!r} in the scenario's fabric")
        for node in sorted(nodes_of(self.passive) - names):
            raise ValueError(f"passive: no node {node!r} in the scenario's classes")
        for p in self.passive:
            if p.node_class is not None and p.node_class not in classes:
                raise ValueError(f"passive: no class {p.node_class!r}")
        return self


def load_scenario(path: Path) -> Scenario:
    try:
        with path.open("rb") as fh:
            data = tomllib.load(fh)
    except FileNotFoundError:
        raise ConfigError(f"{path}: scenario file not found") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    try:
        return Scenario(**data)
    except ValidationError as exc:
        lines = [f"{path}: {exc.error_count()} invalid scenario setting(s)"]
        lines += [f"  {'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()]
        raise ConfigError("\n".join(lines)) from None


def scale_noise(scenario: Scenario, factor: float) -> Scenario:
    """``scenario`` with every class's ``noise`` multiplied by ``factor`` (``--noise``, for a sweep)."""
    if factor < 0:
        raise ConfigError("--noise must not be negative")
    classes = [c.model_copy(update={"noise": c.noise * factor}) for c in scenario.classes]
    return scenario.model_copy(update={"classes": classes})


def scenario_settings(scenario: Scenario, state_dir: Path) -> Settings:
    data = dict(scenario.healthd)
    data["state_dir"] = str(state_dir)
    data.setdefault("backend", "local")
    try:
        return Settings(**data)
    except ValidationError as exc:
        raise ConfigError(f"scenario [healthd] settings: {exc}") from None


# -- the simulated cluster ---------------------------------------------------------------------
@dataclass
class _SimNode:
    name: str
    spec: ClassSpec
    drain_reason: str | None = None
    user: bool = False


@dataclass
class _SimJob:
    job: ProbeJob
    path: Path
    start: float
    end: float
    result_written: bool = False
    fault: str | None = None
    """The reason of the error document a hard fault makes the probe write (decided at submit)."""


class SimCluster:
    """An in-memory cluster implementing ``ClusterBackend``: idle/allocated/drained nodes, jobs
    that finish after the probe's simulated duration and write a ``ProbeResult`` file."""

    name = "sim"

    def __init__(self, scenario: Scenario, *, reason_prefix: str = "healthd:") -> None:
        self.scenario = scenario
        self.reason_prefix = reason_prefix
        self.rng = random.Random(scenario.seed)
        self.now = SIM_EPOCH
        self.round = 1
        self.nodes: dict[str, _SimNode] = {}
        for spec in scenario.classes:
            width = len(str(spec.count - 1))
            for i in range(spec.count):
                name = f"{spec.prefix}{i:0{width}d}"
                self.nodes[name] = _SimNode(name, spec)
        self.jobs: dict[str, _SimJob] = {}
        self._devices: dict[str, list[DeviceInfo]] = {}
        self.running: dict[str, str] = {}
        self._next = 0
        self.drain_log: list[tuple[float, str, str]] = []
        self.undrain_log: list[tuple[float, str]] = []
        self.topology = scenario.topology()
        self._faults_at: dict[tuple[int, str], list[FaultSpec]] = {}
        """The faults active in a round on a probe (``_write_result``)."""

    # ClusterBackend
    def traits(self, settings: Settings) -> BackendTraits:
        return BackendTraits(max_jobs_in_flight=settings.slurm.max_concurrent_jobs,
                             max_idle_share=settings.slurm.max_idle_share)

    def list_nodes(self) -> list[Node]:
        out = []
        for n in self.nodes.values():
            state = "allocated" if n.name in self.running or n.user else "idle"
            flags = frozenset({"DRAIN"}) if n.drain_reason is not None else frozenset()
            out.append(Node(name=n.name, state=state, flags=flags, partitions=tuple(n.spec.partitions),
                            gpus=n.spec.gpus, gpu_type=n.spec.gpu_type, reason=n.drain_reason,
                            node_class=n.spec.name))
        return out

    def submit(self, job: ProbeJob, result_path: Path) -> str:
        for name in job.nodes:
            node = self.nodes.get(name)
            if node is None:
                raise BackendError(f"no node {name!r} in the simulated cluster")
            if name in self.running or node.user:
                raise BackendError(f"{name} is busy")
        self._next += 1
        job_id = f"sim{self._next}"
        duration = self.scenario.probe_seconds.get(job.probe, 60.0)
        fault, hung = self._hard_fault(job)
        self.jobs[job_id] = _SimJob(job, result_path, self.now, self.now + (job.timeout_s if hung else duration),
                                    fault=fault)
        for name in job.nodes:
            self.running[name] = job_id
        return job_id

    def poll(self, job_ids: Sequence[str]) -> dict[str, JobStatus]:
        out: dict[str, JobStatus] = {}
        for job_id in job_ids:
            sim = self.jobs.get(job_id)
            if sim is None:
                continue
            if self.now < sim.end:
                out[job_id] = JobStatus(job_id, JobState.RUNNING, started_at=sim.start, nodes=sim.job.nodes)
                continue
            self._end(job_id, sim)
            out[job_id] = JobStatus(job_id, JobState.COMPLETED, exit_code=0, started_at=sim.start,
                                    finished_at=sim.end, nodes=sim.job.nodes)
        return out

    def end_due(self, job_ids: Sequence[str]) -> None:
        """End the jobs of ``job_ids`` (in that order) whose time is up: their probes write their result files
        and free their nodes, as they do on their nodes while the daemon waits, so a ``poll`` after this only
        reports them (``Simulation`` calls it before it times the collect tick). ``poll`` ends the jobs it finds
        still running past their time the same way."""
        for job_id in job_ids:
            sim = self.jobs.get(job_id)
            if sim is not None and self.now >= sim.end:
                self._end(job_id, sim)

    def _end(self, job_id: str, sim: _SimJob) -> None:
        if sim.result_written:
            return
        self._write_result(sim)
        sim.result_written = True
        for name in sim.job.nodes:
            if self.running.get(name) == job_id:
                del self.running[name]

    def forget(self, job_ids: Sequence[str]) -> None:
        for job_id in job_ids:
            self.jobs.pop(job_id, None)

    def adopt(self) -> list[JobStatus]:
        return []

    def cancel(self, job_ids: Sequence[str]) -> None:
        for job_id in job_ids:
            sim = self.jobs.pop(job_id, None)
            if sim is not None:
                for name in sim.job.nodes:
                    self.running.pop(name, None)

    def drain(self, node: str, reason: str) -> None:
        validate_node_name(node)
        n = self.nodes.get(node)
        if n is None:
            raise BackendError(f"no node {node!r}")
        if n.drain_reason is not None and not n.drain_reason.startswith(self.reason_prefix):
            raise PolicyRefused(f"{node} is already drained by someone else")
        n.drain_reason = reason
        self.drain_log.append((self.now, node, reason))

    def undrain(self, node: str) -> None:
        n = self.nodes.get(node)
        if n is None or n.drain_reason is None:
            raise PolicyRefused(f"{node} is not drained")
        if not n.drain_reason.startswith(self.reason_prefix):
            raise PolicyRefused(f"{node} was drained by someone else")
        n.drain_reason = None
        self.undrain_log.append((self.now, node))

    def close(self) -> None:
        pass

    # the simulated probes
    def _hard_fault(self, job: ProbeJob) -> tuple[str | None, bool]:
        """The error document's reason a hard fault gives ``job`` (as ``probes.liveness.diagnose``
        words it), and whether the job hangs to its timeout."""
        for f in self.scenario.faults:
            if not (f.hard and f.active(self.round) and f.hits(job.probe) and f.node in job.nodes):
                continue
            gpus = self.nodes[f.node].spec.gpus or 1
            rank = job.nodes.index(f.node) * gpus + gpus - 1
            if f.kind == "gpus_missing":
                return (f"rank {rank} (node {f.node}) failed in phase start-up: LaunchError: {gpus} ranks on this "
                        f"node but {f.visible_gpus} GPUs visible to rank {rank}: use one GPU per rank"), False
            if self.rng.random() >= f.rate:
                continue
            if f.kind == "crash":
                return f"rank {rank} (node {f.node}) died without reporting an error, in phase 'probe.start'", False
            return (f"rank {rank} (node {f.node}) was stuck in phase 'probe.start' while rank 0 reached "
                    f"'{job.probe}.measure'"), True
        return None, False

    def _switch_factors(self, job: ProbeJob, rnd: int) -> tuple[Callable[[str], float], Callable[[str, str], float]]:
        """The scenario's switch faults on ``job``: (measurement name → factor of its multi-node values,
        (node, measurement name) → factor of the node's own values)."""
        faults = [f for f in self.scenario.switch_faults if f.active(rnd) and fnmatchcase(job.probe, f.probe)]
        topo = self.topology
        if not faults or topo is None:
            return (lambda name: 1.0), (lambda node, name: 1.0)

        def group(name: str) -> float:
            factor = 1.0
            for f in faults:
                under = topo.nodes_under(f.switch)
                inside = sum(1 for n in job.nodes if n in under)
                hit = (f.kind == "switch" and inside > 0) or (f.kind == "uplink" and 0 < inside < len(job.nodes))
                if hit and fnmatchcase(name, f.name):
                    factor *= f.factor
            return factor

        def rack(node: str, name: str) -> float:
            factor = 1.0
            for f in faults:
                if f.kind == "rack" and node in topo.nodes_under(f.switch) and fnmatchcase(name, f.name):
                    factor *= f.factor
            return factor

        return group, rack

    def _offset(self, node: str, gpu: int | None, series: int, spread: float) -> float:
        """A persistent offset of a node (``gpu`` None) or of one of its GPUs, for one series."""
        if spread <= 0:
            return 1.0
        return max(0.05, random.Random(f"{self.scenario.seed}:{node}:{gpu}:{series}").gauss(1.0, spread))

    def _error(self, sim: _SimJob, reason: str) -> None:
        result = ProbeResult(probe=sim.job.probe, run_id=sim.job.run_id, outcome=Outcome.ERROR, reason=reason,
                             started_at=sim.start, finished_at=sim.end, nodes=list(sim.job.nodes))
        sim.path.parent.mkdir(parents=True, exist_ok=True)
        sim.path.write_text(result.to_json())

    def _write_result(self, sim: _SimJob) -> None:
        job, rnd = sim.job, self.round
        faults = self._faults_at.get((rnd, job.probe))
        if faults is None:
            faults = self._faults_at[rnd, job.probe] = [f for f in self.scenario.faults
                                                        if f.active(rnd) and f.hits(job.probe)]
        for f in faults:
            if f.kind == "error" and f.node in job.nodes and self.rng.random() < f.rate:
                self._error(sim, "simulated infrastructure error: NCCL communicator init timed out")
                return
        if sim.fault is not None:
            self._error(sim, sim.fault)
            return
        members = [self.nodes[n] for n in job.nodes]
        spec = members[0].spec
        group_factor, rack = self._switch_factors(job, rnd)
        events = [e for e in self.scenario.events if e.active(rnd) and e.probe == job.probe
                  and e.node_class == spec.name]
        shift = 1.0
        for i, sh in enumerate(self.scenario.shifts):
            if fnmatchcase(spec.name, sh.node_class) and fnmatchcase(job.probe, sh.probe):
                shift *= sh.factor(self.scenario.seed, i, rnd)
        measurements: list[Measurement] = []
        off = {m.name: self._outlier(spec) if self.rng.random() < spec.outlier_rate else 1.0 for m in members}
        for index, s in enumerate(spec.series):
            if s.probe != job.probe:
                continue
            noise = spec.noise if s.noise is None else s.noise
            base = s.value * shift
            for e in events:
                if e.hits(s):
                    base *= e.factor
            if s.per == "group":
                if len(members) < 2:
                    continue
                factor = group_factor(s.name)
                for f in faults:
                    if f.kind == "link" and f.node in job.nodes and (f.peer is None or f.peer in job.nodes) \
                            and fnmatchcase(s.name, f.name):
                        factor *= f.factor
                labels = {**s.labels, "nodes": str(len(members))}
                factor *= min(off.values()) * min(self._offset(m.name, None, index, spec.spread) for m in members)
                measurements.append(Measurement.model_construct(
                    name=s.name, value=base * factor * self._noise(noise), labels=labels, node=None, per_rank=None))
                continue
            for m in members:
                node_factor = off[m.name] * self._offset(m.name, None, index, spec.spread) * rack(m.name, s.name)
                for f in faults:
                    if f.kind in ("node", "drift") and f.node == m.name and fnmatchcase(s.name, f.name):
                        node_factor *= f.scale(rnd)
                if s.per == "node":
                    measurements.append(Measurement.model_construct(
                        name=s.name, value=base * node_factor * self._noise(noise), labels=dict(s.labels),
                        node=m.name, per_rank=None))
                    continue
                for gpu in range(m.spec.gpus):
                    factor = node_factor * self._offset(m.name, gpu, index, spec.spread)
                    for f in faults:
                        if f.kind == "gpu" and f.node == m.name and f.gpu == gpu and fnmatchcase(s.name, f.name):
                            factor *= f.factor
                    measurements.append(Measurement.model_construct(
                        name=s.name, value=base * factor * self._noise(noise), labels={**s.labels, "gpu": str(gpu)},
                        node=m.name, per_rank=None))
        checks = [Check(name=f"{job.probe}.sanity", ok=True, detail="ok", node=n) for n in job.nodes]
        outcome, reason = Outcome.PASS, ""
        for f in faults:
            if f.kind == "check" and f.node in job.nodes and self.rng.random() < f.rate:
                checks.append(Check(name=f"{job.probe}.wrong_data", ok=False, node=f.node,
                                    detail="simulated: 1024 wrong elements"))
                outcome, reason = Outcome.FAIL, f"wrong data on {f.node}"
        result = ProbeResult(probe=job.probe, run_id=job.run_id, outcome=outcome, reason=reason,
                             started_at=sim.start, finished_at=sim.end, nodes=list(job.nodes),
                             measurements=measurements, checks=checks, environment=self._environment(members))
        sim.path.parent.mkdir(parents=True, exist_ok=True)
        sim.path.write_text(result.to_json())

    def _environment(self, members: Sequence[_SimNode]) -> Environment | None:
        """What a GPU node's probe reports it ran on: one rank per node listing the node's GPUs (stable UUIDs)."""
        if not all(m.spec.gpus for m in members):
            return None
        ranks = []
        for rank, m in enumerate(members):
            devices = self._devices.get(m.name)
            if devices is None:
                devices = self._devices[m.name] = [
                    DeviceInfo(index=gpu, name=m.spec.gpu_type,
                               uuid=f"GPU-{uuid.uuid5(uuid.NAMESPACE_URL, f'{m.name}/{gpu}')}")
                    for gpu in range(m.spec.gpus)]
            ranks.append(RankInfo(rank=rank, local_rank=0, world_size=len(members), local_world_size=1,
                                  hostname=m.name, node=m.name, device="cuda:0", devices=devices))
        return Environment(launcher="srun", backend="nccl", device_type="cuda", python="3", ranks=ranks)

    def _outlier(self, spec: ClassSpec) -> float:
        if spec.outlier_factor_max is None:
            return spec.outlier_factor
        return self.rng.uniform(spec.outlier_factor, spec.outlier_factor_max)

    def _noise(self, sd: float) -> float:
        return max(0.01, self.rng.gauss(1.0, sd)) if sd > 0 else 1.0


# -- the run -----------------------------------------------------------------------------------
@dataclass
class FaultOutcome:
    fault: FaultSpec
    found_round: int | None = None
    named_right: bool | None = None
    drained_round: int | None = None
    detail: str = ""
    measured_round: int | None = None
    """A path fault: the first round a job held both its nodes while it was active (partners rotate:
    a path between two nodes is only seen in the rounds that pair them)."""

    @property
    def rounds_to_find(self) -> int | None:
        return None if self.found_round is None else self.found_round - self.fault.from_round + 1


@dataclass
class SwitchFaultOutcome:
    fault: SwitchFaultSpec
    named_round: int | None = None
    """The first round a switch finding named the faulty switch (or a switch above it)."""
    named_as: str = ""
    node_drains: int = 0
    """Drains of nodes under the switch (without a node fault of their own) while the fault lasted."""

    @property
    def rounds_to_name(self) -> int | None:
        return None if self.named_round is None else self.named_round - self.fault.from_round + 1


@dataclass
class RoundLine:
    round: int
    runs: Counter[str] = field(default_factory=Counter)
    recommended: list[str] = field(default_factory=list)
    drained: list[str] = field(default_factory=list)
    undrained: list[str] = field(default_factory=list)
    refused: Counter[str] = field(default_factory=Counter)
    events: list[str] = field(default_factory=list)
    requests: int = 0


@dataclass
class SimReport:
    scenario: Scenario
    rounds: list[RoundLine]
    faults: list[FaultOutcome]
    false_recommendations: list[tuple[int, str, str]]
    false_drains: list[tuple[int, str, str]]
    fleet_events: list[tuple[int, str, str, str]]
    event_drains: int
    foreign_touched: list[str]
    elapsed_s: float
    jobs: int
    switch_faults: list[SwitchFaultOutcome] = field(default_factory=list)
    switch_findings: list[tuple[int, str, int, str, str]] = field(default_factory=list)
    """(round, switch, level, probe, text) of every switch finding started."""
    false_switch_findings: list[tuple[int, str, str]] = field(default_factory=list)
    """(round, switch, probe) of findings naming a switch no switch fault explains."""
    passive_recommendations: list[tuple[int, str, str]] = field(default_factory=list)
    """(round, node, reason code) of every recommendation from a passive signal."""
    link_findings: list[tuple[int, str, str, str]] = field(default_factory=list)
    """(round, a, b, probe) of every link finding started."""
    false_link_findings: list[tuple[int, str, str, str]] = field(default_factory=list)
    """(round, a, b, probe) of link findings naming no path fault."""
    false_fleet_events: list[tuple[int, str, str]] = field(default_factory=list)
    """(round, class, probe) of class events started where no scenario event of the class and probe is on."""
    chance_switch_findings: list[tuple[int, str, str, float]] = field(default_factory=list)
    """(round, switch, probe, p) of switch findings that started without their own test beyond chance: the
    corrected ``p`` their text states (to one significant digit) is above ``[judge.switch] p_value``."""
    event_false_drains: int = 0
    """Drains of nodes without a fault of their own, of an event's class, while the event is on."""

    @property
    def ok(self) -> bool:
        return (all(f.found_round is not None for f in self.faults if f.fault.kind in FOUND_KINDS
                    and not (f.fault.path and f.measured_round is None))
                and not self.false_drains)

    def to_dict(self) -> dict[str, Any]:
        return {
            "scenario": self.scenario.name, "elapsed_s": round(self.elapsed_s, 2), "jobs": self.jobs,
            "faults": [{"fault": f.fault.describe(), "node": f.fault.node, "gpu": f.fault.gpu,
                        "injected_round": f.fault.from_round, "found_round": f.found_round,
                        "rounds_to_find": f.rounds_to_find, "named_right": f.named_right,
                        "measured_round": f.measured_round, "drained_round": f.drained_round} for f in self.faults],
            "false_recommendations": [{"round": r, "node": n, "why": w} for r, n, w in self.false_recommendations],
            "false_drains": [{"round": r, "node": n, "reason": w} for r, n, w in self.false_drains],
            "fleet_events": [{"round": r, "node_class": c, "probe": p, "text": t}
                             for r, c, p, t in self.fleet_events],
            "drains_during_fleet_events": self.event_drains,
            "false_drains_during_fleet_events": self.event_false_drains,
            "false_fleet_events": [{"round": r, "node_class": c, "probe": p} for r, c, p in self.false_fleet_events],
            "chance_switch_findings": [{"round": r, "switch": sw, "probe": pr, "p": p}
                                       for r, sw, pr, p in self.chance_switch_findings],
            "switch_faults": [{"fault": f.fault.describe(), "switch": f.fault.switch,
                               "injected_round": f.fault.from_round, "named_round": f.named_round,
                               "rounds_to_name": f.rounds_to_name, "named_as": f.named_as,
                               "node_drains": f.node_drains} for f in self.switch_faults],
            "switch_findings": [{"round": r, "switch": sw, "level": lv, "probe": p, "text": t}
                                for r, sw, lv, p, t in self.switch_findings],
            "false_switch_findings": [{"round": r, "switch": sw, "probe": p}
                                      for r, sw, p in self.false_switch_findings],
            "link_findings": [{"round": r, "a": a, "b": b, "probe": p} for r, a, b, p in self.link_findings],
            "false_link_findings": [{"round": r, "a": a, "b": b, "probe": p}
                                    for r, a, b, p in self.false_link_findings],
            "passive_recommendations": [{"round": r, "node": n, "reason_code": c}
                                        for r, n, c in self.passive_recommendations],
            "foreign_drains_touched": self.foreign_touched,
            "rounds": [{"round": r.round, "runs": dict(r.runs), "recommended": r.recommended, "drained": r.drained,
                        "undrained": r.undrained, "refused": dict(r.refused), "events": r.events,
                        "requests": r.requests} for r in self.rounds],
        }


@dataclass
class TickTimings:
    """Wall seconds of each simulated tick's phases (``bench/scale.py`` reads them)."""

    collect: list[float] = field(default_factory=list)
    judge: list[tuple[float, int]] = field(default_factory=list)
    """(seconds, results judged) per tick that collected something."""
    plan: list[float] = field(default_factory=list)


class Simulation:
    def __init__(self, scenario: Scenario, workdir: Path, *, echo: bool = True) -> None:
        self.scenario = scenario
        self.timings = TickTimings()
        self.on_round: Callable[[int], None] | None = None
        self.settings = scenario_settings(scenario, workdir / "state")
        self.cluster = SimCluster(scenario, reason_prefix=self.settings.remediation.reason_prefix)
        self.store = Store(workdir / "sim.sqlite")
        self.collector = Collector(self.store, self.cluster, workdir / "results",
                                   pending_timeout_s=self.settings.slurm.pending_timeout_s,
                                   clock=lambda: self.cluster.now)
        self.judge = Judge(self.settings.judge)
        if scenario.use_topology:
            self.judge.set_topology(self.cluster.topology)
        self.remediator = Remediator(self.store, self.cluster, self.settings.remediation,
                                     clock=lambda: self.cluster.now)
        traits = self.cluster.traits(self.settings)
        self.limits = PlanLimits(max_jobs_in_flight=traits.max_jobs_in_flight, max_idle_share=traits.max_idle_share)
        self.echo = echo
        self.nodes: list[Node] = self.cluster.list_nodes()
        self.outcomes = [FaultOutcome(f) for f in scenario.faults]
        self.false_recs: list[tuple[int, str, str]] = []
        self.false_drains: list[tuple[int, str, str]] = []
        self.fleet_events: list[tuple[int, str, str, str]] = []
        self.false_fleet_events: list[tuple[int, str, str]] = []
        self.event_drains = 0
        self.event_false_drains = 0
        self.chance_switch_findings: list[tuple[int, str, str, float]] = []
        self._class_of = {name: n.spec.name for name, n in self.cluster.nodes.items()}
        self.switch_outcomes = [SwitchFaultOutcome(f) for f in scenario.switch_faults]
        self.switch_findings: list[tuple[int, str, int, str, str]] = []
        self.false_switch_findings: list[tuple[int, str, str]] = []
        self._named_now: set[tuple[str, str]] = set()
        self.link_findings: list[tuple[int, str, str, str]] = []
        self.false_link_findings: list[tuple[int, str, str, str]] = []
        self._links_now: set[tuple[str, str, str]] = set()
        self.passive_recs: list[tuple[int, str, str]] = []
        self.prometheus: SimPrometheus | None = None
        self.passive: PassiveSource | None = None
        if scenario.passive:
            gpus = {n.name: n.gpus for n in self.nodes}
            classes: dict[str, list[str]] = {}
            for n in self.nodes:
                classes.setdefault(n.node_class or "", []).append(n.name)
            self.prometheus = SimPrometheus(gpus, scenario.passive, classes)
            self.passive = PassiveSource(self.settings.passive, client=self.prometheus)
        self.jobs = 0
        self.admin = {d.node: d for d in scenario.admin_drains}
        rng = random.Random(scenario.seed + 1)
        faulted = {f.node for f in scenario.faults} | {f.peer for f in scenario.faults if f.peer}
        self.user_sets: list[tuple[UserSpec, set[str]]] = []
        spare = sorted(n for n in self.cluster.nodes if n not in faulted and n not in self.admin)
        for u in scenario.users:
            picked = set(u.nodes) | set(rng.sample(spare, min(u.count, len(spare))))
            self.user_sets.append((u, picked))

    def _faulty(self, node: str, rnd: int) -> bool:
        """A fault of the node itself (not a path between two nodes: a ``link`` fault with a ``peer``)."""
        return any(f.node == node and f.kind != "error" and not f.path and f.from_round <= rnd
                   and (f.until_round == 0 or rnd <= f.until_round + 1) for f in self.scenario.faults)

    def run(self) -> SimReport:
        started = time.perf_counter()
        s = self.scenario
        lines: list[RoundLine] = []
        for rnd in range(1, s.rounds + 1):
            line = self.play_round(rnd)
            lines.append(line)
            if self.on_round is not None:
                self.on_round(rnd)
            if self.echo:
                print(format_round(line), flush=True)
        return SimReport(s, lines, self.outcomes, self.false_recs, self.false_drains, self.fleet_events,
                         self.event_drains, self._foreign_touched(), time.perf_counter() - started, self.jobs,
                         self.switch_outcomes, self.switch_findings, self.false_switch_findings, self.passive_recs,
                         self.link_findings, self.false_link_findings, self.false_fleet_events,
                         self.chance_switch_findings, self.event_false_drains)

    def play_round(self, rnd: int) -> RoundLine:
        """Every tick of round ``rnd`` (``run`` plays them all; a benchmark plays them one by one)."""
        s = self.scenario
        self.cluster.round = rnd
        line = RoundLine(rnd)
        self._round_start(rnd)
        for k in range(max(1, round(s.round_s / s.tick_s))):
            self.cluster.now = SIM_EPOCH + (rnd - 1) * s.round_s + k * s.tick_s
            self._tick(rnd, line)
        return line

    def _round_start(self, rnd: int) -> None:
        for u, picked in self.user_sets:
            active = u.from_round <= rnd and (u.until_round == 0 or rnd <= u.until_round)
            for name in picked:
                self.cluster.nodes[name].user = active
        for d in self.scenario.admin_drains:
            if d.from_round == rnd:
                self.cluster.nodes[d.node].drain_reason = d.reason
        if self.prometheus is not None:
            self.prometheus.round_start(rnd)

    def _tick(self, rnd: int, line: RoundLine) -> None:
        now = self.cluster.now
        # the probes' result files are written on their nodes, not by the daemon: not in the collect tick's time
        self.cluster.end_due(list(dict.fromkeys(r.job_id for r in self.store.unfinished_runs() if r.job_id)))
        clock = time.perf_counter()
        done = self.collector.collect()
        self.timings.collect.append(time.perf_counter() - clock)
        for c in done:
            line.runs[c.outcome.value] += 1
        if done:
            clock = time.perf_counter()
            out = judge_collected(self.judge, self.store, done, now=now, nodes=self.nodes)
            self.timings.judge.append((time.perf_counter() - clock, len(done)))
            actions = self.remediator.apply(out)
            self._account(rnd, line, out, actions, done)
        self.nodes = self.cluster.list_nodes()
        self.store.upsert_nodes(self.nodes, now)
        if self.passive is not None:
            poll = self.passive.poll([n.name for n in self.nodes], now)
            out = judge_passive_poll(self.judge, self.store, poll, now=now, nodes=self.nodes)
            self._account(rnd, line, out, self.remediator.apply(out), [])
        probes = self.settings.probes
        clock = time.perf_counter()
        runs = self.store.unfinished_runs()
        attempts = self.store.last_attempts()
        requests = self.judge.priority_requests(self.remediator.recheck_nodes(), probes, attempts, now)
        line.requests += len(requests)
        jobs = plan(self.nodes, probes=probes, last_attempts=attempts,
                    busy_nodes={n for r in runs for n in r.nodes}, in_flight=len(runs), now=now,
                    limits=self.limits, priority=requests, rotate=self.settings.scheduler.rotate_partners,
                    last_partners=self.store.last_partners() if self.settings.scheduler.rotate_partners else {})
        self.timings.plan.append(time.perf_counter() - clock)
        for job in jobs:
            self.collector.launch(job)
            for fo in self.outcomes:
                f = fo.fault
                if f.path and fo.measured_round is None and f.active(rnd) and f.hits(job.probe) \
                        and {f.node, f.peer} <= set(job.nodes):
                    fo.measured_round = rnd
        self.jobs += len(jobs)

    def _account(self, rnd: int, line: RoundLine, out: JudgeOutput, actions: Sequence[Action],
                 done: Sequence[Collected]) -> None:
        in_event = any(e.active(rnd) for e in self.scenario.events)
        for e in out.fleet_events:
            text = f"{'started' if e.active else 'ended'}: {e.text}"
            line.events.append(text)
            if e.active:
                self.fleet_events.append((rnd, e.node_class, e.probe, e.text))
                if not any(ev.node_class == e.node_class and ev.probe == e.probe and ev.from_round <= rnd
                           and (ev.until_round == 0 or rnd <= ev.until_round + 1) for ev in self.scenario.events):
                    self.false_fleet_events.append((rnd, e.node_class, e.probe))
        self._account_switches(rnd, line, out, actions)
        self._account_links(rnd, line, out)
        for c in out.recommendations:
            if c.probe in PASSIVE_PROBES and (rnd, c.node, str(c.reason_code)) not in self.passive_recs:
                self.passive_recs.append((rnd, c.node, str(c.reason_code)))
        for a in actions:
            if a.action == "recommend":
                line.recommended.append(a.node or "?")
                if a.node and not self._faulty(a.node, rnd):
                    self.false_recs.append((rnd, a.node, a.reason))
            elif a.action == "drain" and a.result == "done":
                line.drained.append(a.node or "?")
                if in_event:
                    self.event_drains += 1
                if a.node and not self._faulty(a.node, rnd):
                    self.false_drains.append((rnd, a.node, a.reason))
                    if any(e.active(rnd) and e.node_class == self._class_of.get(a.node) for e in self.scenario.events):
                        self.event_false_drains += 1
            elif a.action == "undrain" and a.result == "done":
                line.undrained.append(a.node or "?")
            elif a.result == "refused":
                line.refused[a.reason.split(":")[0][:40]] += 1
        if any(f.found_round is None or f.drained_round is None for f in self.outcomes):
            active = self.store.recommendations()
            drained = {name for name, n in self.cluster.nodes.items()
                       if n.drain_reason and n.drain_reason.startswith(self.settings.remediation.reason_prefix)}
            for fo in self.outcomes:
                if not fo.fault.active(rnd) or fo.fault.kind == "error" or fo.fault.path:
                    continue
                recs = sorted((r for r in active if r.node == fo.fault.node and (fo.fault.hits(r.probe)
                                                                                    or r.probe in PASSIVE_PROBES)),
                              key=lambda r: r.probe in PASSIVE_PROBES)
                if fo.found_round is None and recs:
                    fo.found_round = rnd
                    fo.named_right, fo.detail = self._named_right(fo.fault, recs, active)
                if fo.drained_round is None and fo.fault.node in drained:
                    fo.drained_round = rnd

    def _account_links(self, rnd: int, line: RoundLine, out: JudgeOutput) -> None:
        """Link findings started or ended: a path fault (``link`` with ``peer``) is found when one names its
        two nodes; one naming no path fault is false."""
        for f in out.link_findings:
            key = (f.probe, f.a, f.b)
            if not f.active:
                self._links_now.discard(key)
                line.events.append(f"link finding ended: {f.a} <-> {f.b} {f.probe}")
                continue
            if key in self._links_now:
                continue
            self._links_now.add(key)
            line.events.append(f"link finding: {f.text}")
            self.link_findings.append((rnd, f.a, f.b, f.probe))
            explained = False
            for fo in self.outcomes:
                fault = fo.fault
                if fault.path and {fault.node, fault.peer} == {f.a, f.b} and fault.hits(f.probe) \
                        and fault.from_round <= rnd and (fault.until_round == 0 or rnd <= fault.until_round + 1):
                    explained = True
                    if fo.found_round is None:
                        fo.found_round, fo.named_right, fo.detail = rnd, True, f"link {f.a} <-> {f.b}"
            if not explained:
                self.false_link_findings.append((rnd, f.a, f.b, f.probe))

    def _account_switches(self, rnd: int, line: RoundLine, out: JudgeOutput, actions: Sequence[Action]) -> None:
        topo = self.cluster.topology
        for e in out.switch_findings:
            if not e.active:
                self._named_now.discard((e.switch, e.probe))
                line.events.append(f"switch finding ended: {e.switch} {e.probe}")
                continue
            if (e.switch, e.probe) in self._named_now:
                continue
            self._named_now.add((e.switch, e.probe))
            line.events.append(f"switch finding: {e.text}")
            self.switch_findings.append((rnd, e.switch, e.level, e.probe, e.text))
            p = finding_p(e.text)
            if p is not None and p > self.settings.judge.switch.p_value:
                self.chance_switch_findings.append((rnd, e.switch, e.probe, p))
            rail = rail_key(e.switch) if e.cause == FABRIC_PROBE else None
            name = rail[0] if rail is not None else e.switch
            under = topo.nodes_under(name) if topo is not None and name in topo.switches else frozenset()
            explained = False
            for so in self.switch_outcomes:
                f = so.fault
                if not f.active(rnd) or not (fnmatchcase(e.probe, f.probe) or rail is not None) or topo is None:
                    continue  # a rail's finding (port signals) names the switch whatever probe the fault slows
                if f.switch == name or f.switch in e.held or topo.nodes_under(f.switch) >= under or \
                        under >= topo.nodes_under(f.switch):
                    explained = True
                    if so.named_round is None:
                        so.named_round, so.named_as = rnd, e.switch
            if not explained:
                self.false_switch_findings.append((rnd, e.switch, e.probe))
        if topo is None:
            return
        for a in actions:
            if a.action != "drain" or a.result != "done" or not a.node or self._faulty(a.node, rnd):
                continue
            for so in self.switch_outcomes:
                if so.fault.active(rnd) and a.node in topo.nodes_under(so.fault.switch):
                    so.node_drains += 1

    @staticmethod
    def _named_right(fault: FaultSpec, recs: Sequence[Any], active: Sequence[Any]) -> tuple[bool, str]:
        rec = recs[0]
        if rec.probe in PASSIVE_PROBES:
            return True, f"{rec.probe} {rec.reason_code} {rec.evidence.get('summary', '')}".strip()
        if fault.kind == "gpu":
            gpus = {str(f.get("gpu")) for f in rec.evidence.get("findings", []) if isinstance(f, dict)}
            return gpus == {str(fault.gpu)}, f"gpu {','.join(sorted(gpus)) or '?'}"
        if fault.hard:
            return rec.reason_code == fault.kind, rec.reason_code
        if fault.kind == "link":
            others = sorted({r.node for r in active if r.probe == fault.probe and r.reason_code == "localised"
                             and r.node != fault.node})
            return rec.reason_code == "localised" and not others, rec.reason_code + (
                f"; also blamed {','.join(others)}" if others else "")
        return True, rec.reason_code

    def _foreign_touched(self) -> list[str]:
        touched = []
        for name, d in self.admin.items():
            node = self.cluster.nodes[name]
            if node.drain_reason != d.reason:
                touched.append(name)
        return touched


_P_TEXT = re.compile(r"\(p = ([0-9.eE+-]+)\)")


def finding_p(text: str) -> float | None:
    """The corrected ``p`` a switch finding's text states (``healthd.judge.switches.SwitchCheck.text``).

    >>> finding_p("switch spine1 (level 1): nccl flagged on 35 of the 65 nodes probed under it (...), 47.4 "
    ...           "expected by chance (p = 1)")
    1.0
    >>> finding_p("... 0.4 expected by chance (p = 3e-09); leaves leaf2, leaf3 all beyond chance")
    3e-09
    """
    found = _P_TEXT.search(text)
    return float(found.group(1)) if found else None


def format_round(line: RoundLine) -> str:
    def names(xs: Sequence[str], limit: int = 8) -> str:
        shown = ",".join(xs[:limit])
        return shown + (f",+{len(xs) - limit}" if len(xs) > limit else "")

    runs = " ".join(f"{k} {v}" for k, v in sorted(line.runs.items()))
    parts = [f"round {line.round:>3}: runs {sum(line.runs.values())} ({runs}); re-probes asked {line.requests}"]
    if line.recommended:
        parts.append(f"recommended {len(line.recommended)}: {names(line.recommended)}")
    if line.drained:
        parts.append(f"drained {len(line.drained)}: {names(line.drained)}")
    if line.undrained:
        parts.append(f"undrained {len(line.undrained)}: {names(line.undrained)}")
    if line.refused:
        parts.append("refused " + ", ".join(f"{k} x{v}" for k, v in line.refused.most_common(3)))
    parts += [e if e.startswith(("switch", "link")) else f"fleet event {e}" for e in line.events]
    return "\n    ".join(parts)


def format_report(report: SimReport) -> str:
    header = f"{'fault':<28} {'where':<16} {'injected':>8} {'found':>6} {'rounds':>6} {'drained':>8}  named"
    lines = [f"scenario {report.scenario.name}: {report.scenario.rounds} rounds of {report.scenario.round_s:g} s, "
             f"{sum(c.count for c in report.scenario.classes)} nodes, {report.jobs} probe jobs", "", header,
             "-" * len(header)]
    for f in report.faults:
        where = f.fault.node + (f" gpu {f.fault.gpu}" if f.fault.gpu is not None else "")
        found = str(f.found_round) if f.found_round is not None else "-"
        rounds = str(f.rounds_to_find) if f.rounds_to_find is not None else "-"
        drained = str(f.drained_round) if f.drained_round is not None else "-"
        named = "-" if f.named_right is None else ("yes" if f.named_right else "NO") + f" ({f.detail})"
        if f.fault.kind == "error":
            named = "(infrastructure: must never be drained)"
        lines.append(f"{f.fault.describe():<28} {where:<16} {f.fault.from_round:>8} {found:>6} {rounds:>6} "
                     f"{drained:>8}  {named}")
    for e in report.scenario.events:
        raised = [fe for fe in report.fleet_events if fe[1] == e.node_class and fe[2] == e.probe]
        lines.append(f"{'fleet event ' + e.probe + ' x' + format(e.factor, 'g'):<28} {e.node_class:<16} "
                     f"{e.from_round:>8} {raised[0][0] if raised else '-':>6} {'-':>6} {'-':>8}  "
                     f"{len(raised)} fleet verdict(s), {report.event_drains} drain(s) during the event")
    for so in report.switch_faults:
        named = str(so.named_round) if so.named_round is not None else "-"
        rounds = str(so.rounds_to_name) if so.rounds_to_name is not None else "-"
        lines.append(f"{so.fault.describe():<28} {so.fault.switch:<16} {so.fault.from_round:>8} {named:>6} {rounds:>6} "
                     f"{'-':>8}  named as {so.named_as or '-'}; {so.node_drains} node drain(s) under it")
    node_faults = [f for f in report.faults if f.fault.kind != "error"]
    found_faults = [f for f in node_faults if f.found_round is not None]
    fast = [f for f in found_faults if (f.rounds_to_find or 99) <= 2]
    named_right = [f for f in found_faults if f.named_right]
    lines += [
        "",
        f"faults injected {len(node_faults)}, found {len(found_faults)} (within 2 rounds {len(fast)}), named right "
        f"{len(named_right)}; false recommendations {len(report.false_recommendations)}; false drains "
        f"{len(report.false_drains)}; fleet events raised {len(report.fleet_events)}; foreign drains touched "
        f"{len(report.foreign_touched)}",
    ]
    if report.scenario.events or report.false_fleet_events:
        lines.append(f"class events raised where no event is on {len(report.false_fleet_events)}; healthy nodes "
                     f"drained during events {report.event_false_drains}")
    if report.scenario.switches or report.scenario.fabric is not None:
        named_switches = [so for so in report.switch_faults if so.named_round is not None]
        lines.append(f"switch faults {len(report.switch_faults)}, named {len(named_switches)}; switch findings "
                     f"{len(report.switch_findings)}, false {len(report.false_switch_findings)}; node drains under "
                     f"faulty switches {sum(so.node_drains for so in report.switch_faults)}"
                     + ("" if report.scenario.use_topology else " (judged without the topology)"))
        for r, sw, p in report.false_switch_findings[:10]:
            lines.append(f"  false switch finding, round {r}: {sw} {p}")
        for r, sw, probe, p_value in report.chance_switch_findings[:10]:
            lines.append(f"  switch finding not beyond chance, round {r}: {sw} {probe} (p = {p_value:.2g})")
    paths = [f for f in report.faults if f.fault.path]
    if paths or report.link_findings:
        lines.append(f"path faults {len(paths)}, measured {sum(f.measured_round is not None for f in paths)}, "
                     f"named as a link {sum(f.found_round is not None for f in paths)}; "
                     f"link findings {len(report.link_findings)}, false {len(report.false_link_findings)}")
        for r, a, b, p in report.false_link_findings[:10]:
            lines.append(f"  false link finding, round {r}: {a} <-> {b} {p}")
    if report.scenario.passive:
        lines.append(f"passive signals {len(report.scenario.passive)} ("
                     + "; ".join(p.describe() for p in report.scenario.passive[:6]) + "); passive recommendations "
                     f"{len(report.passive_recommendations)}: "
                     + (", ".join(f"{n} {c} (round {r})" for r, n, c in report.passive_recommendations[:10]) or "none"))
    for r, n, why in report.false_recommendations[:10]:
        lines.append(f"  false recommendation, round {r}: {n}: {why}")
    for r, n, why in report.false_drains[:10]:
        lines.append(f"  false drain, round {r}: {n}: {why}")
    lines.append(f"simulated in {report.elapsed_s:.1f} s")
    return "\n".join(lines)


def simulate(scenario: Scenario, *, echo: bool = True, workdir: Path | None = None) -> SimReport:
    """Run ``scenario`` (in a temporary directory unless ``workdir`` is given) and return its report."""
    if workdir is not None:
        return _run(Simulation(scenario, workdir, echo=echo))
    scratch = Path("/dev/shm")
    with tempfile.TemporaryDirectory(prefix="healthd-sim-", dir=scratch if scratch.is_dir() else None) as tmp:
        return _run(Simulation(scenario, Path(tmp), echo=echo))


def _seeded_ids(seed: int) -> Callable[[], uuid.UUID]:
    """Run ids drawn from the scenario's seed: the judge orders a tick's runs by (time, run id), so random
    ids made two runs of one seed differ; seeded, a seed's figures repeat."""
    rng = random.Random(f"{seed}:run-ids")
    return lambda: uuid.UUID(int=rng.getrandbits(128), version=4)


def _run(sim: Simulation) -> SimReport:
    real = planning.use_id_source(_seeded_ids(sim.scenario.seed))
    try:
        return sim.run()
    finally:
        planning.use_id_source(real)
        sim.store.close()


def report_json(report: SimReport) -> str:
    return json.dumps(report.to_dict(), indent=1, sort_keys=True)
