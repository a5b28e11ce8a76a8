"""Settings: a TOML file plus ``HEALTHD_...`` environment overrides, validated with pydantic.

Where the file comes from, first match wins: ``--config PATH``, ``$HEALTHD_CONFIG``, the service's
config (``/etc/healthd/healthd.toml``, or ``$HEALTHD_SERVICE_CONFIG``) if it exists, else built-in
defaults only. With the service's config, ``state_dir`` defaults to the service's
(``/var/lib/healthd``, systemd's ``StateDirectory=``) whoever runs the command, so the CLI and the
service share one store (``healthd.service_store``). Environment
variables override file values key by key: ``HEALTHD_HTTP__PORT=9555`` sets ``[http] port``.
Every model forbids unknown keys, so a typo is an error, reported by ``load_settings`` as a
``ConfigError`` naming the file, the key and the problem.

The documented reference for every key is ``healthd.example.toml`` at the top of the repo.
"""

from __future__ import annotations

import os
import re
import socket
import sys
import tomllib
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from healthd.errors import ConfigError
from healthd.jobs import DEFAULT_NICE, MAX_NICE, Launcher, launcher_problems
from healthd.model import validate_node_name
from probes.catalogue import PROBE_NAMES

DEFAULT_CONFIG_PATH = Path("/etc/healthd/healthd.toml")
SERVICE_STATE_DIR = Path("/var/lib/healthd")
"""The service's ``state_dir`` unless its config sets one: the unit's ``StateDirectory=healthd``
(``$HEALTHD_SERVICE_STATE_DIR`` for tests and unusual installs, see ``service_state_dir``)."""

MIN_SECONDS = 0.01
MAX_SECONDS = 366 * 86400.0
"""Every duration in the config lies within these (a year: longer ones overflow timers and sbatch's ``--time``)."""
MAX_COUNT = 1_000_000
"""The largest count or cap any setting takes (nodes, ranks, actions, samples)."""

PositiveSeconds = Annotated[float, Field(ge=MIN_SECONDS, le=MAX_SECONDS)]
Count = Annotated[int, Field(ge=1, le=MAX_COUNT)]
SlurmName = Annotated[str, Field(pattern=r"^[A-Za-z0-9._-]+$", max_length=200)]
"""A Slurm partition, QoS, account or reservation name: what sbatch takes as one word."""
SlurmNames = Annotated[str, Field(pattern=r"^[A-Za-z0-9._-]+(,[A-Za-z0-9._-]+)*$", max_length=1000)]
"""One or more Slurm names separated by commas (``--partition``, ``--reservation``)."""
SbatchArg = Annotated[str, Field(pattern=r"^-[^\s'\"\\]*$", max_length=1000)]
"""An sbatch option, ``--opt`` or ``--opt=value``: one word, no quotes or backslashes."""
HostlistWord = Annotated[str, Field(pattern=r"^[^\s'\"\\]+$", max_length=10_000)]


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


def default_state_dir() -> Path:
    """``$STATE_DIRECTORY`` (set by systemd's ``StateDirectory=``), else the XDG state dir."""
    if os.environ.get("STATE_DIRECTORY"):
        return Path(os.environ["STATE_DIRECTORY"].split(":")[0])
    xdg = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(xdg) / "healthd"


def service_config_path() -> Path:
    """The service's config file: ``$HEALTHD_SERVICE_CONFIG`` (tests, unusual installs), else
    ``DEFAULT_CONFIG_PATH``, where the unit reads it."""
    return Path(os.environ.get("HEALTHD_SERVICE_CONFIG") or DEFAULT_CONFIG_PATH)


def service_state_dir() -> Path:
    """``$HEALTHD_SERVICE_STATE_DIR``, else ``SERVICE_STATE_DIR``."""
    return Path(os.environ.get("HEALTHD_SERVICE_STATE_DIR") or SERVICE_STATE_DIR)


def is_service_config(path: Path | None) -> bool:
    """Whether ``path`` is the service's config file (the same file, however it is named)."""
    if path is None:
        return False
    try:
        return path.samefile(service_config_path())
    except OSError:
        return False


class ServiceSettings(_Section):
    user: str | None = Field(default=None, pattern=r"^[A-Za-z0-9._][A-Za-z0-9._-]{0,31}$")
    """The user the service runs as (the unit's ``User=``). Default: the owner of the store's directory.
    ``check-config`` checks the results directory's owner against it; CLI commands that write the
    store run as it (root switches to it) or refuse."""


class HttpSettings(_Section):
    host: str = "0.0.0.0"
    port: int = Field(default=9469, ge=0, le=65535)
    web_config_file: Path | None = None
    """TLS and basic auth, in Prometheus exporter-toolkit's web config format (``healthd.webconfig``)."""
    workers: int = Field(default=8, ge=1, le=256)
    request_timeout_s: float = Field(default=10.0, ge=0.1, le=300)
    """An idle connection is closed, and a socket read or write gives up, after this long."""
    max_connections: int = Field(default=4096, ge=16, le=1_000_000)


class MetricsSettings(_Section):
    detail: Literal["summary", "full"] = "summary"
    """``summary``: a bounded set of series per node (docs/metrics.md gives the count); ``full``: every
    measurement (each size, collective, placement, dtype) with its baseline and floor, and every run timing."""


class StoreSettings(_Section):
    path: Path | None = None
    """SQLite file; default ``<state_dir>/healthd.sqlite``."""
    retention_days: float = Field(default=90.0, ge=MIN_SECONDS / 86400, le=3660)
    detail_days: float = Field(default=7.0, ge=MIN_SECONDS / 86400, le=3660)
    """Every measured value is kept this long; older ones are folded into per-node daily summaries
    (count, min, mean, max) by housekeeping. Runs, verdicts and summaries stay ``retention_days``."""


class SchedulerSettings(_Section):
    discover_interval_s: PositiveSeconds = 60.0
    plan_interval_s: PositiveSeconds = 30.0
    collect_interval_s: PositiveSeconds = 5.0
    housekeeping_interval_s: PositiveSeconds = 3600.0
    misfire_grace_s: PositiveSeconds = 30.0
    heartbeat_stale_s: PositiveSeconds = 120.0
    """``/healthz`` answers 503 (and the systemd watchdog is not fed) when no tick ran for this long."""
    combine_probes: bool = True
    """Single-node probes due on a node together run in one job (``python -m probes check``, one
    start-up), each with its own run (``healthd.planning.plan``'s ``combine``)."""
    rotate_partners: bool = False
    """Regular runs of multi-node probes change partners from round to round (``healthd.planning.plan``'s
    ``rotate``): a node is told from its partners, and one bad node taints a different partner each time,
    but in a small class a failing leaf then taints a partner per node (bench/RESULTS.md: a fleet event
    before the switch finding on the 16-node test cluster). Off: a node keeps its partners while the same
    nodes fall due together, and the path between two partners is measured every round, no other."""


TransportName = Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9 _./-]*$")]
"""An NCCL network as NCCL names it or its family: ``IB``, ``OFI``, ``Socket``, ``UCX``..."""


class LauncherSettings(_Section):
    """``launcher`` of a probe or node class: where the probe's Python runs (docs/containers.md).

    ``bare``: a Python on the node (``python``, default ``slurm.python``); ``pyxis``: in the image
    through ``srun --container-image`` (Enroot); ``apptainer``: ``apptainer exec IMAGE``
    (``runtime = "singularity"`` for Singularity); ``oci``: Slurm's ``srun --container=BUNDLE``
    (``oci.conf``); ``podman``: ``podman run IMAGE`` per task. Slurm backend only.
    """

    kind: Literal["bare", "pyxis", "apptainer", "oci", "podman"] = "bare"
    image: str | None = None
    """pyxis: a squashfs path or enroot URI (``nvcr.io#nvidia/pytorch:24.05-py3``); apptainer: a SIF path or
    URI; oci: an OCI bundle directory (``healthd image build``); podman: an image name in the node's store."""
    mounts: list[str] = Field(default_factory=list)
    """``SRC:DST[:FLAGS]`` bind mounts; the results directory is always mounted at its own path."""
    args: list[str] = Field(default_factory=list)
    """Extra runtime options, ``--opt`` or ``--opt=value``: srun's (pyxis) or ``apptainer exec``'s."""
    python: str | None = None
    """The Python that runs ``-m probes`` (containers: default ``python3`` in the image)."""
    runtime: str | None = None
    """apptainer, podman: the runtime command (default ``apptainer``, ``podman``)."""
    devices: list[str] = Field(default_factory=list)
    """podman: host devices to add (``/dev/infiniband``); GPUs come through CDI (``nvidia.com/gpu=all``)."""
    probes_from: Literal["daemon", "image"] = "daemon"
    """``daemon``: mount this daemon's ``probes`` package read-only; ``image``: the image has it."""

    @model_validator(mode="after")
    def _carryable(self) -> LauncherSettings:
        problems = launcher_problems(Launcher(kind=self.kind, image=self.image, mounts=tuple(self.mounts),
                                              args=tuple(self.args), python=self.python, runtime=self.runtime,
                                              devices=tuple(self.devices)))
        if self.kind == "oci" and self.probes_from == "daemon":
            problems.append('an oci launcher cannot mount the daemon\'s probes package (its bundle carries the '
                            'mounts): set probes_from = "image"')
        if problems:
            raise ValueError("; ".join(problems))
        return self


class ProbeSettings(_Section):
    enabled: bool = True
    interval_s: PositiveSeconds = 3600.0
    jitter_s: float = Field(default=0.0, ge=0, le=MAX_SECONDS)
    timeout_s: PositiveSeconds = 300.0
    args: list[str] = Field(default_factory=list)
    """Extra options for ``python -m probes <name>``, e.g. ``["--sizes", "8K,64M,1G"]``."""
    nodes_per_job: Count = 1
    ranks_per_node: int | None = Field(default=None, ge=1, le=4096)
    """Tasks per node under Slurm (default: the node's GPU count, or 1); local ranks locally."""
    launcher: LauncherSettings | None = None
    """Launch environment for this probe (default bare); a node class's launcher overrides it."""
    expected_transport: list[TransportName] = Field(default_factory=list)
    """nccl: the NCCL networks allowed (e.g. ``["IB", "OFI"]``); another one makes the run ``degraded``."""


PROBE_DEFAULTS: dict[str, dict[str, Any]] = {
    "gemm": {"interval_s": 900.0, "jitter_s": 60.0, "timeout_s": 180.0},
    "nccl": {"interval_s": 900.0, "jitter_s": 60.0, "timeout_s": 180.0},
    "pipeline": {"interval_s": 21600.0, "jitter_s": 600.0, "timeout_s": 300.0, "nodes_per_job": 2},
}
"""The one source of per-probe defaults (over ``ProbeSettings``'s own): what a partial
``[probes.<name>]`` table keeps for the keys it leaves out."""

DEFAULT_PROBES: tuple[str, ...] = ("gemm", "nccl")
"""The probes that run when no ``[probes]`` table is given (the others, ``pipeline`` included, run only
where the config has their table)."""


def _default_probes() -> dict[str, ProbeSettings]:
    return {name: ProbeSettings(**PROBE_DEFAULTS[name]) for name in DEFAULT_PROBES}


class LocalSettings(_Section):
    node_name: str = Field(default_factory=lambda: socket.gethostname().split(".")[0])
    python: Path = Field(default_factory=lambda: Path(sys.executable))
    """The Python that runs ``-m probes`` (needs torch: ``healthd[probes]``; checked at start)."""
    ranks: int | None = Field(default=None, ge=1, le=4096)
    """Local ranks for distributed probes (``--nproc``); default: every GPU of the machine (the probes'
    launcher counts them, honouring ``CUDA_VISIBLE_DEVICES``), 2 on a machine without GPUs."""
    max_concurrent: int = Field(default=1, ge=1, le=4096)
    node_class: str | None = Field(default=None, pattern=r"^[A-Za-z0-9._-]+$")
    """This machine's class (floors, peaks, fleet); default: ``<gpu type>x<count>`` from its GPUs as
    NVML or ``nvidia-smi`` lists them (``nvidia_h100_80gb_hbm3x1``), ``cpu`` without GPUs."""
    gpus: int | None = Field(default=None, ge=0, le=4096)
    """GPUs every probe must find here (``--expect-gpus``); default: the most this daemon has seen
    (discovered at start, or any later discovery). A GPU that falls off the bus is then ``gpus_missing``."""

    @field_validator("node_name")
    @classmethod
    def _valid_node(cls, value: str) -> str:
        try:
            return validate_node_name(value)
        except Exception as exc:  # InvalidNodeName; pydantic wants ValueError
            raise ValueError(str(exc)) from exc


class NodeClassRule(_Section):
    """``[[slurm.node_classes]]``: nodes matching every given field belong to class ``name``."""

    name: str = Field(pattern=r"^[A-Za-z0-9._-]+$")
    gpu_type: str | None = None
    gpus: int | None = Field(default=None, ge=0, le=4096)
    partition: str | None = None
    features: list[str] = Field(default_factory=list)
    launcher: LauncherSettings | None = None
    """Launch environment for every probe on this class (overrides the probe's launcher)."""
    expected_transport: list[TransportName] | None = None
    """NCCL networks allowed on this class (overrides ``probes.nccl.expected_transport``)."""
    expect_gpus: int | None = Field(default=None, ge=0, le=4096)
    """GPUs a probe must find on these nodes (default: the GRES count); 0: the GRES are not CUDA
    devices, the probes run on the CPU."""
    nvswitch: bool = False
    """An NVSwitch system (HGX/DGX H100, H200, B200...): the node check reads each GPU's fabric state at job
    boundaries, and a Fabric Manager that is not ``Completed``/``Success`` is a ``fail`` (``fabric_manager``)."""


class SlurmSettings(_Section):
    bin_dir: Path | None = None
    """Directory of sinfo/squeue/sbatch/scancel/scontrol; default: found on PATH."""
    command_timeout_s: PositiveSeconds = 30.0
    job_name_prefix: str = Field(default="healthd.", pattern=r"^[A-Za-z0-9._-]+$")
    partitions: list[SlurmName] = Field(default_factory=list)
    """Only probe nodes in these partitions (empty: all)."""
    exclude_nodes: list[HostlistWord] = Field(default_factory=list)
    partition: SlurmNames | None = None
    qos: SlurmName | None = None
    account: SlurmName | None = None
    reservation: SlurmNames | None = None
    recheck_reservation: str = Field(default="healthd_recheck", pattern=r"^healthd[A-Za-z0-9._-]{0,93}$")
    """healthd's own reservation (created, extended and deleted by healthd only) that holds a node it drained
    while ``remediation.recheck_drained`` re-probes it; the name starts with ``healthd``."""
    extra_sbatch_args: list[SbatchArg] = Field(default_factory=list)
    results_dir: Path | None = None
    """Directory shared between compute nodes and this host; default ``<state_dir>/results``."""
    python: str = Field(default_factory=lambda: sys.executable)
    """The Python on compute nodes that runs ``-m probes``."""
    pending_timeout_s: PositiveSeconds = 60.0
    """A probe not started after this has lost its node to a user: cancelled, recorded ``skipped``.
    Of the order of one plan interval: a pending probe may hold a node ahead of later user jobs."""
    nice: int = Field(default=DEFAULT_NICE, ge=0, le=MAX_NICE)
    """``sbatch --nice``: probes rank below every user job (see ``healthd.jobs.DEFAULT_NICE``)."""
    max_concurrent_jobs: Count = 8
    max_idle_share: float = Field(default=0.25, gt=0, le=1)
    node_classes: list[NodeClassRule] = Field(default_factory=list)
    """First match wins; a node matching none is ``<gpu type>x<gpu count>`` (or ``cpu``)."""


Fraction = Annotated[float, Field(ge=0, lt=1)]


class SeriesSelector(_Section):
    """``[[judge.series]]``: which measurements are judged.

    A measurement matches when its probe and name match (``name`` may be an ``fnmatch`` pattern)
    and every label given here matches (values are ``fnmatch`` patterns too). ``sizes = "largest"``
    keeps, per run and per other labels, only the largest ``size_bytes`` (small messages are
    latency-bound and noisy); ``min_size_bytes`` drops smaller ones. ``required``: a run that
    passed without any matching measurement is an ``error`` (fail closed), never a ``pass``.
    """

    probe: str
    name: str
    labels: dict[str, str] = Field(default_factory=dict)
    sizes: Literal["all", "largest"] = "all"
    min_size_bytes: int = Field(default=0, ge=0, le=1 << 62)
    direction: Literal["auto", "higher", "lower"] = "auto"
    """``auto``: names ending in ``_seconds`` are better lower, everything else higher."""
    required: bool = False


def _default_series() -> list[SeriesSelector]:
    return [
        SeriesSelector(probe="gemm", name="flop_per_second", required=True),
        SeriesSelector(probe="gemm", name="memory_bandwidth_bytes_per_second"),
        SeriesSelector(probe="nccl", name="busbw_bytes_per_second", sizes="largest", required=True),
        SeriesSelector(probe="ddp", name="throughput_samples_per_second", required=True),
        SeriesSelector(probe="ddp", name="scaling_efficiency_ratio"),
        SeriesSelector(probe="ddp", name="model_flop_per_second"),
        SeriesSelector(probe="compute", name="mlp_flop_per_second", required=True),
        SeriesSelector(probe="compute", name="embedding_bag_bytes_per_second"),
        SeriesSelector(probe="pipeline", name="throughput_samples_per_second", required=True),
        SeriesSelector(probe="pipeline", name="link_min_busbw_bytes_per_second"),
        SeriesSelector(probe="pipeline", name="link_min_ratio"),
        SeriesSelector(probe="pipeline", name="stage_skew_ratio"),
        SeriesSelector(probe="pipeline", name="p2p_bandwidth_bytes_per_second"),
    ]


class FloorRule(_Section):
    """``[[judge.floors]]``: the lowest acceptable value of a series on a node class (the highest,
    for ``*_seconds``). Checked before the packaged table; the first matching rule wins."""

    node_class: list[str] = Field(min_length=1)
    """``fnmatch`` patterns, case-insensitive, e.g. ``["*h100*x8"]``."""
    probe: str
    name: str
    labels: dict[str, str] = Field(default_factory=dict)
    min_size_bytes: int = Field(default=0, ge=0, le=1 << 62)
    value: float = Field(gt=0, le=1e30)
    source: str = ""


class BaselineSettings(_Section):
    window: int = Field(default=10, ge=1, le=10_000)
    """Passing results kept per node and series; the baseline is their median."""
    min_samples: int = Field(default=3, ge=1, le=10_000)
    drift_fraction: Fraction = 0.10
    """``degraded`` when a result is this fraction worse than the node's own baseline..."""
    spread_k: float = Field(default=4.0, ge=0, le=1000)
    """...or, for a noisy series, this many robust standard deviations of its history, if larger."""
    max_age_s: PositiveSeconds = 30 * 86400.0


class FleetSettings(_Section):
    min_nodes: int = Field(default=5, ge=2, le=MAX_COUNT)
    """Fewer nodes of a class with a recent result: no fleet comparison."""
    z_threshold: float = Field(default=3.5, gt=0, le=1000)
    """Robust z-score (median / MAD) below which a result is an outlier..."""
    min_deviation: Fraction = 0.10
    """...provided it is also at least this fraction worse than the class median."""
    window_s: PositiveSeconds = 86400.0
    event_window_s: PositiveSeconds = 3600.0
    """Fleet events: among each node's latest regular result in this window..."""
    event_share: float = Field(default=0.2, gt=0, le=1)
    """...this share flagged at once is a fleet event, not that many broken nodes..."""
    event_recent: int = Field(default=12, ge=1, le=10_000)
    event_recent_fraction: float = Field(default=0.05, ge=0, le=1)
    event_recent_share: float = Field(default=0.5, gt=0, le=1)
    """...as is this share of the newest results (``event_recent``, or ``event_recent_fraction`` of the
    sample if more: a change seen as it starts)..."""
    event_recent_min_share: float = Field(default=0.05, ge=0, le=1)
    """...provided this share of the whole sample is flagged too (the nodes re-probed most often are the
    flagged ones: in a large class they alone fill the newest results)."""
    event_min_nodes: Count = 3


class SwitchSettings(_Section):
    """``[judge.switch]``: nodes under one switch flagged together beyond chance (``healthd.judge.switches``;
    on only while the judge has a topology)."""

    p_value: float = Field(default=1e-4, gt=0, lt=1)
    """A switch is named when its flagged nodes are this unlikely by chance (binomial tail at the class's
    flag rate, times the switches tested)..."""
    end_p_value: float = Field(default=0.01, gt=0, lt=1)
    """...and stays named while they are less likely than this (hysteresis)."""
    min_nodes: int = Field(default=3, ge=2, le=MAX_COUNT)
    """Never fewer flagged nodes under the switch than this."""
    rate_floor: Fraction = 0.02
    """The chance flag rate is never taken below this (a clean class does not make two bad nodes a switch)."""

    @model_validator(mode="after")
    def _ordered(self) -> SwitchSettings:
        if self.end_p_value < self.p_value:
            raise ValueError("judge.switch.end_p_value must not be below p_value")
        return self


class ConfirmSettings(_Section):
    n: int = Field(default=2, ge=1, le=1000)
    m: int = Field(default=3, ge=1, le=1000)
    """A finding counts when it is seen in ``n`` of the node's last ``m`` judged results."""
    window_s: PositiveSeconds = 86400.0
    request_timeout_s: PositiveSeconds = 1800.0
    """A confirmation or localisation re-probe not run by then is given up (asked again if needed)."""
    partners: int = Field(default=8, ge=1, le=1000)
    """Known-good partners offered to the planner per re-probe of a multi-node probe."""
    recheck_interval_s: float = Field(default=120.0, ge=0, le=366 * 86400)
    """A node with a confirmed finding is re-probed (while idle) this often, instead of at its probe's
    interval, so that a repair is seen within minutes and the finding, its alert and recommendation
    clear; 0: only at the probe's interval."""
    error_streak: int = Field(default=3, ge=1, le=1000)
    """A node whose probe errored this many times in a row while at most ``error_class_share`` of its
    class errs gets an ``error`` verdict with reason ``repeated_errors`` (a finding; never a drain)."""
    error_class_share: Fraction = 0.2

    @model_validator(mode="after")
    def _n_le_m(self) -> ConfirmSettings:
        if self.n > self.m:
            raise ValueError(f"confirm.n ({self.n}) is larger than confirm.m ({self.m})")
        return self


class PassiveJudgeSettings(_Section):
    window_s: PositiveSeconds = 3600.0
    """How long a passive signal is followed: a fault-class signal repeating within it is confirmed; one a
    passing probe answered and that did not repeat is suspect until it ends; a confirmed one ends once the
    window has passed without it and a probe passed since (``healthd.judge.sources.passive``)."""
    throttle_sustain_s: PositiveSeconds = 300.0
    """A power brake or hardware slowdown held this long on a busy GPU (``[passive.activity]``) is a ``degraded``
    finding on that GPU (``healthd.judge.sources.throttle``); on an idle GPU it stays a hint."""
    multi_rail: bool = False
    """A rail-optimised fabric: each HCA port (``device``, ``port``: the same names on every node) of the nodes
    under one leaf of the topology (a rail group, a scalable unit) is cabled to a leaf switch of its own, one per
    rail. Port signals on ``[judge.switch] min_nodes`` or more nodes of one leaf on the same rail are that rail's
    switch's (a switch finding naming the rail; none of them drains); on different rails they stay each node's
    own (``healthd.judge.sources.fabric``). Needs a topology."""


class JudgeSettings(_Section):
    series: list[SeriesSelector] = Field(default_factory=_default_series)
    floors: list[FloorRule] = Field(default_factory=list)
    default_floors: bool = True
    """Also use the packaged floor table (``healthd/judge/floors.toml``)."""
    noise_band: Fraction = 0.03
    """Expected run-to-run spread; no deviation smaller than twice this is ever flagged."""
    false_drains_per_1000_node_days: float = Field(default=0.1, gt=0, le=1000)
    """The false drains healthd may make, on average, per 1,000 node-days: each threshold is at least
    k x the series' noise, k derived from this and the number of tests (``healthd.judge.noise``)."""
    runs_per_node_day: float = Field(default=48.0, gt=0, le=100000)
    """Judged runs of one probe per node and day (about 86400 / the probes' ``interval_s``, plus re-probes)."""
    baseline: BaselineSettings = BaselineSettings()
    fleet: FleetSettings = FleetSettings()
    switch: SwitchSettings = SwitchSettings()
    confirm: ConfirmSettings = ConfirmSettings()
    passive: PassiveJudgeSettings = PassiveJudgeSettings()

    @field_validator("series")
    @classmethod
    def _known_series_probes(cls, series: list[SeriesSelector]) -> list[SeriesSelector]:
        unknown = sorted({s.probe for s in series} - set(PROBE_NAMES))
        if unknown:
            raise ValueError(f"unknown probe(s) {unknown} in judge.series; known: {list(PROBE_NAMES)}")
        return series


_ACT_ON_DEFAULT: list[Literal["fail", "degraded"]] = ["fail", "degraded"]


class SweepSettings(_Section):
    """``[sweep]``: the periodic scaling sweep (busbw over 2, 4, 8, ... idle nodes of one class)."""

    enabled: bool = False
    probe: Literal["nccl"] = "nccl"
    interval_s: PositiveSeconds = 86400.0
    """Each node count is measured again after this long."""
    max_nodes: int = Field(default=16, ge=2, le=MAX_COUNT)
    max_share: float = Field(default=0.5, gt=0, le=1)
    """At most this share of a class's probeable nodes is taken by one sweep job."""
    timeout_s: PositiveSeconds = 600.0
    args: list[str] = Field(default_factory=lambda: ["--collectives", "all_reduce", "--scope", "group"])
    ranks_per_node: int | None = Field(default=None, ge=1, le=4096)


_REPAIR_ON_DEFAULT = ("gpus_missing", "hang", "crash", "cuda_error", "xid_79")
"""Hard faults a reboot often clears (a GPU off the bus, a hung or crashed driver), and XID 79 (fell off the bus)."""
_FINDING_KIND = re.compile(r"^[a-z][a-z0-9_]{0,63}$")
_NOT_REPAIRABLE = frozenset({"ok", "fleet_event", "group_suspect", "repeated_errors", "probe_error",
                             "measurement_missing", "manual"})
"""Reason codes that never drain a node (a fleet event, a suspect group, could-not-check, an operator's drain)."""


class RemediationSettings(_Section):
    mode: Literal["observe", "recommend", "enforce"] = "recommend"
    reason_prefix: str = Field(default="healthd:", pattern=r"^[A-Za-z0-9._/-]{1,32}:$")
    """Starts every drain reason healthd writes, and marks the drains it owns (``NHC:`` is NHC's)."""
    act_on: list[Literal["fail", "degraded"]] = Field(default_factory=lambda: _ACT_ON_DEFAULT.copy())
    """Confirmed outcomes that are recommended for a drain (and drained in ``enforce``)."""
    max_actions_per_hour: int = Field(default=10, ge=0, le=MAX_COUNT)
    breaker_window_s: PositiveSeconds = 21600.0
    breaker_class_share: float = Field(default=0.10, gt=0, le=1)
    breaker_class_min_nodes: Count = 3
    breaker_max_nodes: Count = 50
    breaker_cooldown_s: float = Field(default=21600.0, ge=0, le=MAX_SECONDS)
    """An open breaker closes by itself after this long (0: only ``healthd breaker --reset``)."""
    max_evidence_age_s: PositiveSeconds = 3600.0
    """Only act on recommendations whose evidence is this fresh (no replay of stale findings)."""
    undrain_after_passes: int = Field(default=0, ge=0, le=10_000)
    """Undrain healthd's own drains after this many consecutive passes (0: never)."""
    recheck_drained: bool = False
    """Re-probe healthd's own drains (so ``undrain_after_passes`` can happen): on Slurm each recheck lifts the
    drain for its probe while the node sits in ``slurm.recheck_reservation``, then drains it again."""
    repeat_window_s: PositiveSeconds = 7 * 86400.0
    repeat_max_drains: int = Field(default=2, ge=1, le=10_000)
    """A node drained this often within ``repeat_window_s`` is left to humans: recommend only."""
    repair: Literal["none", "reboot", "command"] = "none"
    """What healthd does to a node it drained for a confirmed finding of a ``repair_on`` kind
    (``healthd.remediation.repair``): ``reboot`` through Slurm (``scontrol reboot ASAP nextstate=DOWN``,
    needs slurm.conf's ``RebootProgram``), ``command`` (``repair_command``, e.g. a BMC power cycle), then
    the full check in the recheck reservation: a pass returns it to service, a failure leaves it drained
    with ``repair failed`` and no second repair within ``repeat_window_s``."""
    repair_on: list[str] = Field(default_factory=lambda: list(_REPAIR_ON_DEFAULT), max_length=64)
    """The finding kinds (a recommendation's reason code: ``gpus_missing``, ``hang``, ``crash``,
    ``cuda_error``, ``nccl_error``, ``check_failed``, a passive signal's ``xid_79``...) that qualify."""
    repair_command: list[str] = Field(default_factory=list, max_length=64)
    """``repair = "command"``: the argv run (no shell) for a node, ``{node}`` replaced by its name; it must
    return once the node is back (exit 0) or fail (non-zero); killed after ``repair_timeout_s``."""
    repair_timeout_s: PositiveSeconds = 1800.0
    """A repair whose reboot (or command) and full check are not over this long after it started is failed."""

    @field_validator("repair_on")
    @classmethod
    def _repair_kinds(cls, kinds: list[str]) -> list[str]:
        for kind in kinds:
            if not _FINDING_KIND.match(kind):
                raise ValueError(f"repair_on: {kind!r} is not a finding kind (lower case, digits and '_')")
            if kind in _NOT_REPAIRABLE:
                raise ValueError(f"repair_on: {kind!r} never drains a node, so it never leads to a repair")
        return kinds

    @model_validator(mode="after")
    def _repair_needs(self) -> RemediationSettings:
        if self.repair == "none":
            return self
        if self.repair == "command":
            if not self.repair_command:
                raise ValueError("repair = 'command' needs repair_command (an argv list with '{node}')")
            if not any("{node}" in a for a in self.repair_command):
                raise ValueError("repair_command must name the node: put '{node}' in one of its arguments")
        if not self.repair_on:
            raise ValueError(f"repair = {self.repair!r} needs repair_on (the finding kinds to repair)")
        if self.mode == "enforce" and (not self.recheck_drained or self.undrain_after_passes < 1):
            raise ValueError(f"repair = {self.repair!r} validates the node before it returns: it needs "
                             "recheck_drained = true and undrain_after_passes >= 1")
        return self


class BudgetSettings(_Section):
    """``[budget]``: GPU-hours probing may take in a rolling 24 h window (both unset: no limit).

    The planner stops submitting regular probes (and scaling sweeps) once the GPU-seconds of the runs
    finished in the last 24 h plus the estimate of those in flight reach the limit. Re-probes that
    confirm a suspected fault and on-demand probes (``healthd probe NAME --node N``) count against
    the budget but are never held back by it: they may exceed it.
    """

    max_gpu_hours_per_day: float | None = Field(default=None, gt=0, le=1e9)
    max_share: float | None = Field(default=None, gt=0, le=1)
    """Share of the cluster's GPU-hours (every known node's GPUs times 24 h); with both set the lower wins."""


class NodeCheckSettings(_Section):
    """The node check at job boundaries (``probes.boundary``, run by Slurm on compute nodes: it reads this
    section of the same healthd.toml where the file is there, else its options)."""

    prolog_budget_s: float = Field(default=5.0, gt=0, le=600)
    """The prolog's whole budget from the process's start (Slurm warns of a hung prolog past MessageTimeout)."""
    epilog_budget_s: float = Field(default=30.0, gt=0, le=600)
    health_budget_s: float = Field(default=45.0, gt=0, le=55)
    """``HealthCheckProgram`` is killed by slurmd at 60 s."""
    gemm: bool = True
    """Run the short GEMM (epilog and health) when time is left."""
    health_interval_s: int = Field(default=300, ge=0)
    """``HealthCheckInterval=`` that ``healthd install-files`` prints (0: no HealthCheckProgram lines)."""


class TopologySettings(_Section):
    """``[topology]``: where the network topology (switches or blocks and their nodes) comes from.

    ``auto``: Slurm's (``scontrol show topology``) when its topology plugin has one, else ``file``
    when given, else none; ``slurm``: Slurm's only; ``file``: ``file`` only; ``none``: no topology
    (findings are judged per node and per class, as before).
    """

    source: Literal["auto", "slurm", "file", "none"] = "auto"
    file: Path | None = None
    """A topology.conf (``SwitchName=``/``BlockName=`` lines) or, named ``*.yaml``/``*.yml``, a
    topology.yaml (Slurm 25.05+) for sites whose Slurm runs no topology plugin."""
    name: str | None = Field(default=None, pattern=r"^[A-Za-z0-9._-]+$", max_length=200)
    """Which named topology of a topology.yaml (25.05+: ``scontrol show topology <name>`` and the
    file's); unset: the cluster default."""
    refresh_interval_s: PositiveSeconds = 3600.0
    """How often it is read again (it rarely changes; a reread that fails keeps the previous one)."""

    @model_validator(mode="after")
    def _file_given(self) -> TopologySettings:
        if self.source == "file" and self.file is None:
            raise ValueError("topology.source = 'file' needs topology.file")
        return self


DEFAULT_PASSIVE_QUERIES: dict[str, str] = {
    "xid": "DCGM_FI_DEV_XID_ERRORS or DCGM_EXP_XID_ERRORS_COUNT",
    "row_remap_failure": "DCGM_FI_DEV_ROW_REMAP_FAILURE",
    "row_remap_pending": "DCGM_FI_DEV_ROW_REMAP_PENDING",
    "uncorrectable_remapped_rows": "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
    "ecc_dbe": "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
    "pcie_replay": "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
    "nvlink_errors": (
        '{__name__=~"DCGM_FI_DEV_NVLINK_(CRC_FLIT|CRC_DATA|REPLAY|RECOVERY)_ERROR_COUNT_TOTAL"}'
    ),
    "throttle": "DCGM_FI_DEV_CLOCKS_EVENT_REASONS or DCGM_FI_DEV_CLOCK_THROTTLE_REASONS",
    "health": "DCGM_EXP_GPU_HEALTH_STATUS",
}
"""dcgm-exporter's names (``etc/default-counters.csv``; the remap-pending and clock-event fields are DCGM
fields a site adds to its CSV). ``healthd.passive.signals`` reads each answer."""

PromQL = Annotated[str, Field(min_length=1, max_length=10_000)]


class PassiveQueries(_Section):
    """``[passive.queries]``: the PromQL instant query of each signal (healthd.passive.signals reads its
    answer: the labels ``gpu``, ``UUID``/``uuid``/``gpu_uuid`` and a host label on every series)."""

    xid: PromQL = DEFAULT_PASSIVE_QUERIES["xid"]
    row_remap_failure: PromQL = DEFAULT_PASSIVE_QUERIES["row_remap_failure"]
    row_remap_pending: PromQL = DEFAULT_PASSIVE_QUERIES["row_remap_pending"]
    uncorrectable_remapped_rows: PromQL = DEFAULT_PASSIVE_QUERIES["uncorrectable_remapped_rows"]
    ecc_dbe: PromQL = DEFAULT_PASSIVE_QUERIES["ecc_dbe"]
    pcie_replay: PromQL = DEFAULT_PASSIVE_QUERIES["pcie_replay"]
    nvlink_errors: PromQL = DEFAULT_PASSIVE_QUERIES["nvlink_errors"]
    throttle: PromQL = DEFAULT_PASSIVE_QUERIES["throttle"]
    health: PromQL = DEFAULT_PASSIVE_QUERIES["health"]


class PassiveActivity(_Section):
    """``[passive.activity]``: whether each GPU is busy (``healthd.passive.activity``): a power brake or a
    hardware slowdown is a finding only when held on a busy GPU (``[judge.passive] throttle_sustain_s``)."""

    enabled: bool = True
    query: PromQL = "DCGM_FI_PROF_GR_ENGINE_ACTIVE or DCGM_FI_DEV_GPU_UTIL"
    """Per GPU, the profiling field where exported, else the utilisation (the labels of the passive signals)."""


class PassivePcie(_Section):
    """``[passive.pcie]``: each GPU's PCIe link (``healthd.passive.pcie``): a width below the maximum is
    ``pcie_downtrained``, a generation below it too while the GPU is busy (``[passive.activity]``)."""

    enabled: bool = True
    query: PromQL = '{__name__=~"DCGM_FI_DEV_PCIE_(MAX_)?LINK_(WIDTH|GEN)"}'
    """The current and maximum link width and generation per GPU (DCGM fields a site adds to its CSV)."""


IB_COUNTERS_RE = "link_downed|symbol_error|port_errors_received|port_receive_remote_physical_errors|link_error_recovery"


class PassiveFabric(_Section):
    """``[passive.fabric]``: InfiniBand ports from node_exporter's ``infiniband`` collector, read through the
    same Prometheus (``healthd.passive.fabric``; docs/passive.md). Each query's series need ``device``,
    ``port`` and a host label (node_exporter: ``instance``)."""

    enabled: bool = True
    counters: PromQL = f'{{__name__=~"node_infiniband_({IB_COUNTERS_RE})_total"}} > 0'
    """The port error counters above 0 (a healthy fleet's ports are at 0: the answer stays small)."""
    present: PromQL = (f'count without (device, port) (label_replace({{__name__=~"node_infiniband_({IB_COUNTERS_RE})'
                       '_total"}, "counter", "$1", "__name__", "node_infiniband_(.+)_total"))')
    """One series per node and counter it exports (label ``counter``): what is missing is unavailable."""
    links: PromQL = "node_infiniband_rate_bytes_per_second and node_infiniband_state_id == 4"
    """The rate of every active port."""
    physical: PromQL = "node_infiniband_physical_state_id and node_infiniband_state_id == 4"
    boot: PromQL = "node_boot_time_seconds"
    """A node whose boot time changed booted: its link-downed rise is no flap."""


Xid = Annotated[int, Field(ge=0, le=100_000)]


class XidClasses(_Section):
    """``[passive.xid]``: what an XID means for its node. Defaults from NVIDIA's XID catalog
    (docs.nvidia.com/deploy/xid-errors, its "Resolution Bucket (Immediate Action)": RESET_GPU, RESTART_BM,
    WORKFLOW_XID_48 and the NVLink workflow are faults; RESTART_APP and IGNORE are the application's), as
    NVSentinel, the Kubernetes device plugin and GCM read it. Any other XID is a hint."""

    fault: list[Xid] = Field(default_factory=lambda: [48, 62, 64, 74, 79, 95, 109, 119, 120, 140])
    """A fault of the GPU or node: a ``fail`` finding (confirmed by a re-probe or a repeat)."""
    application: list[Xid] = Field(default_factory=lambda: [13, 31, 43, 45])
    """The application's error: never counted against the node (kept for display)."""
    contained: list[Xid] = Field(default_factory=lambda: [94])
    """A contained ECC error (the application was stopped, the GPU goes on): a hint."""

    @model_validator(mode="after")
    def _disjoint(self) -> XidClasses:
        lists = {"fault": set(self.fault), "application": set(self.application), "contained": set(self.contained)}
        names = list(lists)
        for i, a in enumerate(names):
            for b in names[i + 1:]:
                both = sorted(lists[a] & lists[b])
                if both:
                    raise ValueError(f"XID(s) {both} in both passive.xid.{a} and passive.xid.{b}")
        return self


LabelName = Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$", max_length=200)]


class PassiveTls(_Section):
    """``[passive.tls]``: as Prometheus's own ``tls_config``."""

    ca_file: Path | None = None
    """CA bundle that signs the server's certificate (default: the system's)."""
    cert_file: Path | None = None
    """Client certificate (mutual TLS), with ``key_file``."""
    key_file: Path | None = None
    insecure_skip_verify: bool = False

    @model_validator(mode="after")
    def _pair(self) -> PassiveTls:
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("passive.tls.cert_file and passive.tls.key_file go together")
        return self


class PassiveSettings(_Section):
    """``[passive]``: passive signals from the site's Prometheus (dcgm-exporter's series): off unless
    ``prometheus_url`` is set (``healthd.passive.source``)."""

    prometheus_url: str | None = Field(default=None, max_length=2000)
    """The Prometheus (or compatible) base URL, e.g. ``https://prometheus.example:9090`` or with a path
    prefix; healthd asks ``<url>/api/v1/query``."""
    interval_s: PositiveSeconds = 60.0
    timeout_s: PositiveSeconds = 10.0
    """Each query's limit (also sent to Prometheus as its ``timeout``)."""
    max_response_bytes: int = Field(default=32 * 1024 * 1024, ge=1024, le=1 << 34)
    """A longer answer is an error of its query (counted once), not read further."""
    max_series: Count = 100_000
    """A query answering more series is an error (counted once)."""
    host_labels: list[LabelName] = Field(default_factory=lambda: ["Hostname", "hostname", "instance"],
                                         min_length=1)
    """The first of these labels a series has names its host (``instance``: without its port)."""
    node_regex: str | None = Field(default=None, max_length=1000)
    """Where host names differ from Slurm's: a host matching this (whole) becomes ``node_replacement``
    (e.g. ``'^([^.]+)\\..*$'`` with ``'\\1'``: FQDN to short name); a host that does not match is kept."""
    node_replacement: str = Field(default="\\1", max_length=1000)
    username: str | None = Field(default=None, max_length=1000)
    """Basic auth, with ``password_file`` (read at each poll)."""
    password_file: Path | None = None
    bearer_token_file: Path | None = None
    """``Authorization: Bearer <the file's content>`` (read at each poll); not with basic auth."""
    tls: PassiveTls = PassiveTls()
    queries: PassiveQueries = PassiveQueries()
    xid: XidClasses = XidClasses()
    fabric: PassiveFabric = PassiveFabric()
    activity: PassiveActivity = PassiveActivity()
    pcie: PassivePcie = PassivePcie()

    @field_validator("prometheus_url")
    @classmethod
    def _url(cls, value: str | None) -> str | None:
        if value is None:
            return None
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https"):
            raise ValueError(f"passive.prometheus_url needs the scheme http:// or https:// (got {value!r})")
        if not parts.hostname:
            raise ValueError(f"passive.prometheus_url has no host (got {value!r})")
        if parts.query or parts.fragment:
            raise ValueError("passive.prometheus_url takes no query or fragment")
        return value.rstrip("/")

    @model_validator(mode="after")
    def _check(self) -> PassiveSettings:
        if self.node_regex is not None:
            try:
                pattern = re.compile(self.node_regex)
            except re.error as exc:
                raise ValueError(f"passive.node_regex is not a regular expression: {exc}") from None
            for number, name in re.findall(r"\\(?:(\d+)|g<(\w+)>)", self.node_replacement):
                if (number and int(number) > pattern.groups) or (name and not name.isdigit()
                                                                  and name not in pattern.groupindex) or (
                        name.isdigit() and int(name) > pattern.groups):
                    ref = number or name
                    raise ValueError(f"passive.node_replacement refers to group {ref}, which "
                                     f"passive.node_regex {self.node_regex!r} does not have")
        if self.bearer_token_file is not None and (self.username is not None or self.password_file is not None):
            raise ValueError("passive: basic auth (username, password_file) and bearer_token_file exclude each other")
        if (self.username is None) != (self.password_file is None):
            raise ValueError("passive.username and passive.password_file go together")
        if self.timeout_s > self.interval_s:
            raise ValueError(f"passive.timeout_s ({self.timeout_s}) is longer than passive.interval_s "
                             f"({self.interval_s})")
        return self

    @property
    def enabled(self) -> bool:
        return self.prometheus_url is not None


class LoggingSettings(_Section):
    level: Literal["debug", "info", "warning", "error"] = "info"
    format: Literal["auto", "json", "console"] = "auto"


_HA_URL = re.compile(r"^mysql://[A-Za-z0-9._-]{1,80}@(?:[A-Za-z0-9.-]{1,253}|\[[0-9A-Fa-f:]{2,39}\])"
                     r"(?::[0-9]{1,5})?/[A-Za-z0-9_]{1,64}$")


def _host_name() -> str:
    return socket.gethostname().split(".")[0] or "healthd"


class HaSettings(_Section):
    """Two admin nodes, active/standby, on the site's MariaDB (``healthd.ha``, docs/ha.md)."""

    mode: Literal["off", "mariadb"] = "off"
    """``off``: one instance, no database (today's behaviour); ``mariadb``: lead only while holding the lease."""
    url: str | None = Field(default=None, max_length=600)
    """``mysql://USER@HOST:PORT/DATABASE`` (no password here: ``password_file``)."""
    password_file: Path | None = None
    """The database user's password (one line); readable by the service's user only (mode 0600 or 0400)."""
    instance_id: str = Field(default_factory=_host_name, pattern=r"^[A-Za-z0-9._-]{1,128}$")
    """This instance's name in the lease and the action journal (default: the host name)."""
    lease_ttl_s: float = Field(default=45.0, ge=1.0, le=600.0)
    """The lease's length, on the database's clock: a standby takes over at most ``lease_ttl_s +
    renew_interval_s`` after the leader's last renewal (50 s with the defaults)."""
    renew_interval_s: float = Field(default=5.0, gt=0.0, le=300.0)
    fence_margin_s: float = Field(default=30.0, ge=0.0, le=300.0)
    """An action is recorded (and taken) only while the lease has at least this long left on the database's
    clock: at least the time a Slurm call may take after its journal row (``slurm.command_timeout_s``)."""
    timeout_s: float = Field(default=5.0, ge=0.1, le=60.0)
    """Connect, read and write timeout of every database call."""

    @field_validator("url")
    @classmethod
    def _url(cls, url: str | None) -> str | None:
        if url is not None and not _HA_URL.match(url):
            if re.match(r"^mysql://[^@/]*:[^@/]*@", url):
                raise ValueError("ha.url must not carry the password: put it in ha.password_file")
            raise ValueError(f"ha.url {url!r} is not mysql://USER@HOST:PORT/DATABASE")
        return url

    @model_validator(mode="after")
    def _check(self) -> HaSettings:
        if self.mode == "off":
            return self
        if self.url is None:
            raise ValueError("ha.mode = 'mariadb' needs ha.url (mysql://USER@HOST:PORT/DATABASE)")
        if self.password_file is None:
            raise ValueError("ha.mode = 'mariadb' needs ha.password_file (the database user's password)")
        if 2 * self.renew_interval_s > self.lease_ttl_s:
            raise ValueError(f"ha.renew_interval_s ({self.renew_interval_s:g}) must be at most half of "
                             f"ha.lease_ttl_s ({self.lease_ttl_s:g})")
        if self.fence_margin_s + self.renew_interval_s >= self.lease_ttl_s:
            both = self.fence_margin_s + self.renew_interval_s
            raise ValueError(f"ha.fence_margin_s + ha.renew_interval_s ({both:g})"
                             f" must be below ha.lease_ttl_s ({self.lease_ttl_s:g}): the leader's own actions "
                             "would be refused before it renews")
        return self


class Settings(BaseSettings):
    """All of healthd's settings. Build it with ``load_settings``, not directly."""

    model_config = SettingsConfigDict(
        env_prefix="HEALTHD_",
        env_nested_delimiter="__",
        extra="forbid",
        frozen=True,
        allow_inf_nan=False,
    )

    backend: Literal["auto", "local", "slurm"] = "auto"
    state_dir: Path = Field(default_factory=default_state_dir)
    service: ServiceSettings = ServiceSettings()
    http: HttpSettings = HttpSettings()
    metrics: MetricsSettings = MetricsSettings()
    store: StoreSettings = StoreSettings()
    scheduler: SchedulerSettings = SchedulerSettings()
    probes: dict[str, ProbeSettings] = Field(default_factory=_default_probes)
    local: LocalSettings = Field(default_factory=LocalSettings)
    slurm: SlurmSettings = Field(default_factory=SlurmSettings)
    sweep: SweepSettings = SweepSettings()
    remediation: RemediationSettings = RemediationSettings()
    budget: BudgetSettings = BudgetSettings()
    judge: JudgeSettings = JudgeSettings()
    node_check: NodeCheckSettings = NodeCheckSettings()
    topology: TopologySettings = TopologySettings()
    passive: PassiveSettings = PassiveSettings()
    logging: LoggingSettings = LoggingSettings()
    ha: HaSettings = Field(default_factory=HaSettings)

    @field_validator("probes", mode="before")
    @classmethod
    def _probe_defaults(cls, probes: Any) -> Any:
        if not isinstance(probes, dict):
            return probes
        return {name: {**PROBE_DEFAULTS.get(name, {}), **table} if isinstance(table, dict) else table
                for name, table in probes.items()}

    @field_validator("probes")
    @classmethod
    def _known_probes(cls, probes: dict[str, ProbeSettings]) -> dict[str, ProbeSettings]:
        unknown = sorted(set(probes) - set(PROBE_NAMES))
        if unknown:
            raise ValueError(f"unknown probe(s) {unknown}; known: {list(PROBE_NAMES)}")
        return probes

    @model_validator(mode="after")
    def _check(self) -> Settings:
        if self.store.retention_days * 86400 < max(
            (p.interval_s for p in self.probes.values()), default=0
        ):
            raise ValueError("store.retention_days is shorter than the longest probe interval")
        if self.ha.mode != "off" and self.ha.fence_margin_s < self.slurm.command_timeout_s:
            raise ValueError(f"ha.fence_margin_s ({self.ha.fence_margin_s:g}) must be at least "
                             f"slurm.command_timeout_s ({self.slurm.command_timeout_s:g}): a Slurm call must end "
                             "before the lease it was recorded under can run out")
        return self

    @property
    def store_path(self) -> Path:
        return self.store.path or self.state_dir / "healthd.sqlite"

    @property
    def results_dir(self) -> Path:
        return self.slurm.results_dir or self.state_dir / "results"

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # File values arrive through init kwargs; environment overrides them key by key.
        return (env_settings, init_settings)


def resolve_config_path(explicit: str | Path | None) -> Path | None:
    if explicit:
        return Path(explicit)
    if os.environ.get("HEALTHD_CONFIG"):
        return Path(os.environ["HEALTHD_CONFIG"])
    if service_config_path().exists():
        return service_config_path()
    return None


def _format_errors(source: str, err: ValidationError) -> str:
    lines = [f"{source}: {err.error_count()} invalid setting(s)"]
    for item in err.errors():
        key = ".".join(str(part) for part in item["loc"]) or "(top level)"
        value = item.get("input")
        shown = "" if isinstance(value, dict) else f" (got {value!r})"
        lines.append(f"  {key}: {item['msg']}{shown}")
    return "\n".join(lines)


def load_settings(path: str | Path | None = None) -> tuple[Settings, Path | None]:
    """Read, merge and validate the settings. Returns them with the file actually used.

    :raises ConfigError: unreadable file, TOML syntax error, unknown key, wrong type or value.
    """
    config_path = resolve_config_path(path)
    data: dict[str, Any] = {}
    source = "built-in defaults + HEALTHD_* environment"
    if config_path is not None:
        source = f"{config_path} (+ HEALTHD_* environment)"
        try:
            with config_path.open("rb") as fh:
                data = tomllib.load(fh)
        except FileNotFoundError:
            raise ConfigError(f"{config_path}: config file not found") from None
        except PermissionError:
            raise ConfigError(f"{config_path}: config file not readable (permission denied)") from None
        except IsADirectoryError:
            raise ConfigError(f"{config_path}: is a directory, not a config file") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{config_path}: not valid TOML: {exc}") from None
        except UnicodeDecodeError as exc:
            raise ConfigError(f"{config_path}: not valid TOML: not UTF-8 at byte {exc.start}") from None
        except RecursionError:
            raise ConfigError(f"{config_path}: not valid TOML: nested too deeply") from None
        except OSError as exc:
            raise ConfigError(f"{config_path}: cannot read the config file: {exc.strerror or exc}") from None
    if (is_service_config(config_path) and "state_dir" not in data
            and not os.environ.get("STATE_DIRECTORY") and not os.environ.get("HEALTHD_STATE_DIR")):
        data["state_dir"] = service_state_dir()
    try:
        settings = Settings(**data)
    except ValidationError as exc:
        raise ConfigError(_format_errors(source, exc)) from None
    except RecursionError:
        raise ConfigError(f"{source}: a value is nested too deeply") from None
    return settings, config_path
