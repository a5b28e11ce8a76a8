"""The versioned probe result document, shared by the probes and the daemon.

Every probe prints (or writes with ``--output``) exactly one ``ProbeResult`` as JSON. The
daemon reads it with ``healthd.parsers.healthd_json``. This module imports nothing but
pydantic so both sides can use it: compute nodes without healthd's daemon dependencies and
an admin node without torch.

Contract
--------
- ``outcome`` is the probe's *sanity* verdict only: ``pass`` (it ran and every check held),
  ``fail`` (it ran and found the node at fault: wrong data, GPUs missing), ``error`` (it could
  not run: crash, timeout, a rank died, bad options; never the node's fault), ``skipped``.
  ``degraded`` is never set by a probe; performance is judged by the daemon.
- Measurements carry a metric ``name`` that already ends in its base unit
  (``busbw_bytes_per_second``, ``flop_per_second``, ``seconds``...) and a small set of
  bounded labels (``LABEL_KEYS``). Node-level measurements name their ``node``; one that
  describes a multi-node group (a pair all_reduce) leaves ``node`` empty and lists the
  group in ``ProbeResult.nodes``.
- ``per_rank`` holds one value per rank where the metric is an aggregate over ranks, so a
  slow rank stays visible without becoming a label.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

SCHEMA_VERSION = 1

LABEL_KEYS = frozenset(
    {"gpu", "collective", "size_bytes", "dtype", "placement", "scope", "quantile", "rail", "nodes", "direction", "peer",
     "device", "port", "counter"}
)
"""Label keys a measurement may carry; all have small, bounded value sets."""


NOT_RUN = "not run: "
"""How the reason of a check's probe that never ran starts (``python -m probes check``): the evidence
it quotes (another probe's hang, the node's missing GPUs) belongs to the run it happened in and is
counted there once, never again on this one."""


class Outcome(StrEnum):
    PASS = "pass"
    DEGRADED = "degraded"
    FAIL = "fail"
    ERROR = "error"
    SKIPPED = "skipped"


Finite = Annotated[float, Field(allow_inf_nan=False)]
"""A number SQLite and the judge can hold: NaN and the infinities are refused."""


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Measurement(_Frozen):
    name: str = Field(pattern=r"^[a-z][a-z0-9_]*$")
    value: Finite
    labels: dict[str, str] = Field(default_factory=dict)
    node: str | None = None
    per_rank: list[Finite] | None = None

    @field_validator("labels")
    @classmethod
    def _bounded_labels(cls, labels: dict[str, str]) -> dict[str, str]:
        if labels.keys() <= LABEL_KEYS:
            return labels
        unknown = set(labels) - LABEL_KEYS
        if unknown:
            raise ValueError(f"unknown label keys {sorted(unknown)}; allowed: {sorted(LABEL_KEYS)}")
        return labels


class Check(_Frozen):
    """A sanity check (correctness, device count...). ``ok=False`` makes the node at fault."""

    name: str
    ok: bool
    detail: str = ""
    node: str | None = None
    gpu: int | None = None
    """The GPU's index on the node (``nvidia-smi`` order), not the rank's CUDA ordinal."""
    rank: int | None = None
    gpu_uuid: str | None = None
    """The GPU's UUID, from the environment record of the rank that used it."""

    def where(self) -> str:
        """``node=n1 gpu=3 uuid=GPU-…``: the parts the check names."""
        parts = (self.node and f"node={self.node}", self.gpu is not None and f"gpu={self.gpu}",
                 self.gpu_uuid and f"uuid={self.gpu_uuid}")
        return " ".join(x for x in parts if x)


class DeviceInfo(_Frozen):
    index: int
    name: str
    uuid: str | None = None
    memory_bytes: int | None = None
    pci_bus_id: str | None = None


class RankInfo(_Frozen):
    rank: int
    local_rank: int
    group_rank: int | None = None
    world_size: int
    local_world_size: int
    hostname: str
    node: str
    device: str
    devices: list[DeviceInfo] = Field(default_factory=list)


class Environment(_Frozen):
    """What the probe ran on and with; the equivalent of nccl-tests' header and device lines."""

    launcher: Literal["standalone", "torchrun", "srun"]
    backend: str
    device_type: Literal["cuda", "cpu"]
    python: str
    torch: str | None = None
    cuda: str | None = None
    nccl: str | None = None
    driver: str | None = None
    container_image: str | None = None
    ranks: list[RankInfo] = Field(default_factory=list)


ContainerKind = Literal["pyxis", "apptainer", "oci", "podman"]


class ContainerStart(_Frozen):
    """How the probe's container started: ``setup_seconds`` from the batch script's launch of the
    step to the probe's own start (image import or mount, the runtime, the interpreter), which the
    probe's ``--timeout`` counts (``started_at`` is then the launch)."""

    kind: ContainerKind
    setup_seconds: Finite = Field(ge=0)


class ProbeResult(_Frozen):
    schema_version: Literal[1] = 1
    probe: str
    run_id: str | None = None
    outcome: Outcome
    reason: str = ""
    started_at: Finite
    finished_at: Finite
    startup_seconds: Finite | None = None
    measure_seconds: Finite | None = None
    container: ContainerStart | None = None
    """Set by a container launcher's run, on the first document of the job only (a check's later
    parts share its start-up)."""
    nodes: list[str] = Field(default_factory=list)
    environment: Environment | None = None
    params: dict[str, Any] = Field(default_factory=dict)
    measurements: list[Measurement] = Field(default_factory=list)
    checks: list[Check] = Field(default_factory=list)

    @field_validator("outcome")
    @classmethod
    def _probes_do_not_judge(cls, outcome: Outcome) -> Outcome:
        if outcome is Outcome.DEGRADED:
            raise ValueError("a probe never reports 'degraded'; performance is judged by the daemon")
        return outcome

    def to_json(self) -> str:
        return self.model_dump_json()
