"""Which probe runs on which idle nodes next: a pure function of nodes, history and settings.

The state it plans from (when each node was last probed) comes from the store, so a daemon
restart does not cause a wave of probes. Jitter is derived from a hash of (node, probe),
not from a random generator: the plan is reproducible and spreads nodes over the interval.
"""

from __future__ import annotations

import functools
import hashlib
import re
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from healthd.config import ProbeSettings, SweepSettings
from healthd.model import BundledRun, Node, ProbeJob, RunKind
from probes.catalogue import CATALOGUE, CHECK_COMMAND, CHECK_COMMON_OPTIONS, CHECK_PROBES, ProbeName

BLOCKING_FLAGS = frozenset(
    {
        "DRAIN", "DRAINING", "DRAINED", "DOWN", "NOT_RESPONDING", "MAINTENANCE", "RESERVED",
        "POWERED_DOWN", "POWERING_DOWN", "POWERING_UP", "POWER_DOWN", "REBOOT_REQUESTED",
        "REBOOT_ISSUED", "COMPLETING", "FAIL", "INVALID", "INVALID_REG", "PLANNED", "FUTURE",
        "CLOUD", "UNKNOWN", "PERFCTRS", "BLOCKED",
    }
)


@dataclass(frozen=True)
class PlanLimits:
    max_jobs_in_flight: int = 8
    max_idle_share: float = 1.0
    partitions: frozenset[str] = frozenset()
    exclude: frozenset[str] = frozenset()
    own_reservation: str | None = None


def why_not_probeable(node: Node, limits: PlanLimits) -> str | None:
    """``None`` if the node may be probed now, else a short reason why not."""
    if node.name in limits.exclude:
        return "excluded by config"
    if limits.partitions and not limits.partitions.intersection(node.partitions):
        return "not in a probed partition"
    if node.state != "idle":
        return f"state {node.state}"
    blocking = node.flags & BLOCKING_FLAGS
    if blocking == {"RESERVED"} and limits.own_reservation is not None:
        blocking = frozenset()
    if blocking:
        return "flags " + ",".join(sorted(blocking))
    return None


WHOLE_GPU_PROBES = frozenset(name.value for name in CATALOGUE if name is not ProbeName.ENV)
"""Probes that use whole GPUs (a GEMM across a GPU, NCCL over the node's GPUs, ...): meaningless on a
MIG-enabled GPU, whose instances are slices (DCGM's diagnostic refuses them too)."""
_MIG_PROFILE = re.compile(r"(?:^|[_:-])(\d+g\.\d+gb)(?:$|[_:-])", re.IGNORECASE)


def mig_skip(node: Node) -> str | None:
    """Why whole-GPU probes are skipped on ``node``, or ``None``: its GRES are MIG instances (Slurm's GPU
    type is a MIG profile, ``1g.10gb`` or with ``AutoDetect=nvml`` ``nvidia_a100_1g.10gb``), or it has the
    node feature ``mig``. Context, not a fault: no finding is made of it."""
    match = _MIG_PROFILE.search(node.gpu_type or "")
    if match:
        return f"mig_enabled: the node's GPUs are MIG instances ({match.group(1)}); whole-GPU probes do not apply"
    if any(f.lower() == "mig" for f in node.features):
        return "mig_enabled: the node has the feature mig; whole-GPU probes do not apply"
    return None


@functools.lru_cache(maxsize=1 << 17)
def jitter(node: str, probe: str, span_s: float, salt: str = "") -> float:
    """The node's delay after its interval, in ``[0, span_s)``; the same every round unless ``salt``
    changes (multi-node probes salt it with the last attempt, so that partners rotate)."""
    if span_s <= 0:
        return 0.0
    digest = hashlib.blake2b(f"{node}\0{probe}{salt and chr(0) + salt}".encode(), digest_size=8).digest()
    return span_s * int.from_bytes(digest, "big") / 2**64


_id_source: Callable[[], uuid.UUID] = uuid.uuid4


def use_id_source(source: Callable[[], uuid.UUID]) -> Callable[[], uuid.UUID]:
    """Draw run ids from ``source`` from now on (the simulator seeds them: the judge orders a tick's runs by
    time and run id); returns the source it replaces."""
    global _id_source
    previous, _id_source = _id_source, source
    return previous


def new_run_id() -> str:
    return _id_source().hex[:16]


PRIORITY_RUN_PREFIX = "rp"
"""Run ids of re-probes start with this, so that they stand out in ``squeue``; code reads the run's
``kind`` (``RunKind.REPROBE``), never its id."""


def new_priority_run_id() -> str:
    return PRIORITY_RUN_PREFIX + _id_source().hex[:14]


@dataclass(frozen=True)
class PriorityRequest:
    """A probe wanted soon on given nodes, before any regular one.

    ``nodes`` must all be in the job; for a multi-node probe the job is filled up to ``size``
    nodes (default: the probe's ``nodes_per_job``) with the first available of ``partners``
    (known-good nodes, best first). ``allow_drained``: the nodes may be idle and drained (healthd
    rechecking its own drains); partners never may.
    """

    probe: str
    nodes: tuple[str, ...]
    partners: tuple[str, ...] = ()
    size: int = 0
    allow_drained: bool = False
    reason: str = ""


DRAIN_FLAGS = frozenset({"DRAIN", "DRAINING", "DRAINED"})


def _probeable_drained(node: Node, limits: PlanLimits) -> bool:
    if node.state not in ("idle", "drained", "draining"):
        return False
    relaxed = Node(node.name, "idle", node.flags - DRAIN_FLAGS, node.partitions)
    return why_not_probeable(relaxed, limits) is None


def plan(
    nodes: Sequence[Node],
    *,
    probes: Mapping[str, ProbeSettings],
    last_attempts: Mapping[tuple[str, str], float],
    busy_nodes: Iterable[str],
    in_flight: int,
    now: float,
    limits: PlanLimits,
    make_run_id: Callable[[], str] = new_run_id,
    priority: Sequence[PriorityRequest] = (),
    make_priority_run_id: Callable[[], str] = new_priority_run_id,
    pending_nodes: Iterable[str] = (),
    combine: bool = False,
    last_partners: Mapping[tuple[str, str], frozenset[str]] = {},
    rotate: bool = False,
) -> list[ProbeJob]:
    """Probe jobs to submit now.

    - only probeable nodes (``why_not_probeable``) that no healthd job holds (``busy_nodes``);
    - per probe, nodes whose last attempt is older than the interval plus their jitter,
      the longest-waiting first (never probed counts as oldest);
    - at most one new job per node per plan, at most ``max_jobs_in_flight`` jobs in flight,
      at most ``max_idle_share`` of the idle nodes taken: the share is of the probeable nodes plus
      those healthd holds, less the ``pending_nodes`` (of healthd jobs that have not started) that
      are no longer probeable: a user took them, they are not idle, and their pending probe (cancelled
      after ``pending_timeout_s``) must not keep the other idle nodes waiting;
    - multi-node probes (``nodes_per_job > 1``) group due nodes of the same node class; with
      ``rotate`` (``[scheduler] rotate_partners``) they rotate partners: their jitter is drawn anew
      each round (salted with the last attempt), nodes due at the same time are taken in an order
      shuffled by their due time (:func:`_tie_break`), a node does not join a group holding one of
      its partners of its last run of the probe (``last_partners``) while another group can take
      it, and a group left holding last partners trades a node with a planned job where that clears
      both (:func:`_trade`), else runs as it is: a node never waits for want of a new partner. A node
      always tested with the same partner could never be told from it, and one partner on a failing
      switch would flag it every round (without: nodes due together are grouped in due order, by
      name);
    - ``priority`` requests come first, in order, within the same caps; a request whose nodes
      are not all free now, or whose job cannot be filled with free partners, waits;
    - a whole-GPU probe (``WHOLE_GPU_PROBES``) due on a MIG-enabled node (``mig_skip``) is a job with
      ``skip`` set (after the others; it takes no node and no slot): the collector records it as
      ``skipped`` with the reason, and it is due again after its interval;
    - ``combine`` (``[scheduler] combine_probes``): a single-node probe that can run in a check
      (``ProbeSpec.check``) takes along, in one job (``python -m probes check``, ``ProbeJob.bundle``),
      the other such probes of its node whose interval has passed (their jitter is not waited for),
      with the same ``ranks_per_node`` and launcher; each keeps its own run.
    """
    busy = set(busy_nodes)
    probeable = [n for n in nodes if why_not_probeable(n, limits) is None]
    candidates = [n for n in probeable if n.name not in busy]
    pending = set(pending_nodes)
    lost = {n.name for n in nodes if n.name in pending and why_not_probeable(n, limits) is not None}
    held = len((busy & {n.name for n in nodes}) - lost)
    share_cap = max(1, int((len(probeable) + held) * limits.max_idle_share)) if probeable else 0
    node_budget = max(0, share_cap - held)
    job_budget = max(0, limits.max_jobs_in_flight - in_flight)

    due: list[tuple[float, str, Node]] = []
    for probe, settings in sorted(probes.items()):
        if not settings.enabled:
            continue
        for node in candidates:
            last = last_attempts.get((node.name, probe))
            if last is None:
                due.append((float("-inf"), probe, node))
                continue
            salt = repr(last) if rotate and settings.nodes_per_job > 1 else ""
            ready_at = last + settings.interval_s + jitter(node.name, probe, settings.jitter_s, salt)
            if ready_at <= now:
                due.append((ready_at, probe, node))
    due.sort(key=lambda item: (item[0], item[1], _tie_break(item[2].name, item[1], item[0], probes[item[1]], rotate)))
    if not rotate:
        last_partners = {}
    mates = _interval_due(candidates, probes, last_attempts, now) if combine else {}

    jobs: list[ProbeJob] = []
    skips: list[ProbeJob] = []
    taken: set[str] = set()
    mig = {n.name: why for n in candidates if (why := mig_skip(n)) is not None}
    if mig:
        for _, probe, node in [d for d in due if d[1] in WHOLE_GPU_PROBES and d[2].name in mig]:
            skips.append(ProbeJob(make_run_id(), probe, (node.name,), kind=RunKind.PROBE, skip=mig[node.name]))
        due = [d for d in due if not (d[1] in WHOLE_GPU_PROBES and d[2].name in mig)]
        mates = {n: [p for p in ps if not (p in WHOLE_GPU_PROBES and n in mig)] for n, ps in mates.items()}
    if priority:
        by_name = {n.name: n for n in nodes}
        free = {n.name for n in candidates}
        for request in priority:
            wanted_settings = probes.get(request.probe)
            if wanted_settings is None or not wanted_settings.enabled or len(jobs) >= job_budget:
                continue
            wanted = _priority_group(request, wanted_settings, by_name, free, taken, busy, limits)
            if wanted is None or len(taken) + len(wanted) > node_budget:
                continue
            jobs.append(_job(request.probe, tuple(by_name[n] for n in wanted), wanted_settings,
                             make_priority_run_id, RunKind.REPROBE))
            taken.update(wanted)
    waiting: dict[tuple[str, str | None], list[list[Node]]] = {}
    formed: dict[tuple[str, str | None], list[tuple[int, list[Node]]]] = {}

    def clash(probe: str, group: Sequence[Node]) -> bool:
        return any(b.name in last_partners.get((a.name, probe), ()) for a in group for b in group if a is not b)

    def launch(key: tuple[str, str | None], group: list[Node]) -> None:
        formed.setdefault(key, []).append((len(jobs), list(group)))
        jobs.append(_job(key[0], tuple(group), probes[key[0]], make_run_id))
        taken.update(n.name for n in group)
        for groups in waiting.values():
            groups[:] = [kept for kept in ([n for n in g if n.name not in taken] for g in groups) if kept]

    for _, probe, node in due:
        if len(jobs) >= job_budget or len(taken) >= node_budget:
            break
        if node.name in taken:
            continue
        settings = probes[probe]
        size = settings.nodes_per_job
        if size == 1:
            along = [p for p in mates.get(node.name, ()) if p != probe and _same_launch(probes[p], settings)]
            if probe in CHECK_PROBES and _checkable(settings) and along:
                jobs.append(_check_job((probe, *along), node, probes, make_run_id))
            else:
                jobs.append(_job(probe, (node,), settings, make_run_id))
            taken.add(node.name)
            continue
        key = (probe, node.node_class)
        groups = waiting.setdefault(key, [])
        group = next((g for g in groups if len(g) < size and not clash(probe, [*g, node])), None)
        if group is None:
            group = []
            groups.append(group)
        group.append(node)
        if len(group) == size and len(taken) + size <= node_budget:
            launch(key, group)
    for key, groups in waiting.items():
        size = probes[key[0]].nodes_per_job
        pool = [n for g in groups if len(g) < size for n in g]
        while len(pool) >= size and len(jobs) < job_budget and len(taken) + size <= node_budget:
            group, pool = pool[:size], pool[size:]
            if clash(key[0], group):
                group = _trade(key[0], group, formed.get(key, []), jobs, clash)
            launch(key, group)
    return jobs + skips


def _trade(probe: str, group: list[Node], planned: Sequence[tuple[int, list[Node]]], jobs: list[ProbeJob],
           clash: Callable[[str, Sequence[Node]], bool]) -> list[Node]:
    """``group`` (last partners in it) with one node traded for one of a job already planned for its probe
    and class, where neither then holds last partners (that job is rewritten); unchanged when no trade
    does."""
    for index, other in planned:
        for i, mine in enumerate(group):
            for j, theirs in enumerate(other):
                new = [*group[:i], theirs, *group[i + 1:]]
                swapped = [*other[:j], mine, *other[j + 1:]]
                if not clash(probe, new) and not clash(probe, swapped):
                    other[:] = swapped
                    jobs[index] = replace(jobs[index], nodes=tuple(n.name for n in swapped),
                                          expect_gpus=expected_gpus(swapped))
                    return new
    return group


def _tie_break(node: str, probe: str, ready_at: float, settings: ProbeSettings, rotate: bool) -> str:
    """The order of nodes due at the same time: by name for single-node probes and nodes never probed,
    shuffled by the due time for multi-node ones (the nodes of one job fall due together, and by name
    they would be paired again every round)."""
    if not rotate or settings.nodes_per_job == 1 or ready_at == float("-inf"):
        return node
    return hashlib.blake2b(f"{node}\0{probe}\0{ready_at!r}".encode(), digest_size=8).hexdigest()


def _interval_due(candidates: Sequence[Node], probes: Mapping[str, ProbeSettings],
                  last_attempts: Mapping[tuple[str, str], float], now: float) -> dict[str, list[str]]:
    """Per node, the single-node probes that can run in a check and whose interval has passed there."""
    out: dict[str, list[str]] = {}
    names = [p for p in CHECK_PROBES if p in probes and probes[p].enabled and _checkable(probes[p])]
    for node in candidates:
        for probe in names:
            last = last_attempts.get((node.name, probe))
            if last is None or last + probes[probe].interval_s <= now:
                out.setdefault(node.name, []).append(probe)
    return out


def _checkable(settings: ProbeSettings) -> bool:
    """A single-node probe whose ``args`` are its own options only (a check takes the common ones once)."""
    return settings.nodes_per_job == 1 and not any(a.split("=", 1)[0] in CHECK_COMMON_OPTIONS for a in settings.args)


def _same_launch(a: ProbeSettings, b: ProbeSettings) -> bool:
    """Whether two probes may share one rank session: the same ranks and the same launcher."""
    return a.ranks_per_node == b.ranks_per_node and a.launcher == b.launcher


def _check_job(names: Sequence[str], node: Node, probes: Mapping[str, ProbeSettings],
               make_run_id: Callable[[], str]) -> ProbeJob:
    """One job running ``names`` on ``node`` after one start-up, in catalogue order, each its own run."""
    ordered = sorted(names, key=CHECK_PROBES.index)
    runs = tuple(BundledRun(make_run_id(), p, tuple(probes[p].args), probes[p].timeout_s) for p in ordered)
    first = probes[ordered[0]]
    return ProbeJob(
        run_id=runs[0].run_id,
        probe=CHECK_COMMAND,
        nodes=(node.name,),
        timeout_s=sum(r.timeout_s for r in runs),
        ranks_per_node=first.ranks_per_node,
        expect_gpus=expected_gpus((node,)),
        expect_gpu_uuids=node.gpu_uuids if expected_gpus((node,)) else (),
        bundle=runs,
    )


def _priority_group(
    request: PriorityRequest, settings: ProbeSettings, by_name: Mapping[str, Node], free: set[str],
    taken: set[str], busy: set[str], limits: PlanLimits,
) -> list[str] | None:
    size = request.size or max(settings.nodes_per_job, len(request.nodes))
    group: list[str] = []
    for name in request.nodes:
        node = by_name.get(name)
        if node is None or name in taken or name in busy or name in group:
            return None
        if name not in free and not (request.allow_drained and _probeable_drained(node, limits)):
            return None
        group.append(name)
    for name in request.partners:
        if len(group) >= size:
            break
        if name in free and name not in taken and name not in group:
            group.append(name)
    return group if len(group) >= size else None


def _job(probe: str, nodes: tuple[Node, ...], settings: ProbeSettings, make_run_id: Callable[[], str],
         kind: RunKind = RunKind.PROBE) -> ProbeJob:
    return ProbeJob(
        run_id=make_run_id(),
        probe=probe,
        nodes=tuple(n.name for n in nodes),
        args=tuple(settings.args),
        timeout_s=settings.timeout_s,
        ranks_per_node=settings.ranks_per_node,
        kind=kind,
        expect_gpus=expected_gpus(nodes),
        expect_gpu_uuids=nodes[0].gpu_uuids if len(nodes) == 1 and expected_gpus(nodes) else (),
    )


def expected_gpus(nodes: Sequence[Node]) -> int | None:
    """``--expect-gpus`` for a job on ``nodes``: the fewest GPUs any of them must show (its class's
    expectation, ``Node.required_gpus``); ``None`` for CPU nodes (the probe's own default)."""
    want = min((n.required_gpus for n in nodes), default=0)
    return want if want > 0 else None


SWEEP_RUN_PREFIX = "sw"


def sweep_run_id(size: int) -> str:
    """Run ids of scaling-sweep runs carry the ``sw`` prefix and the node count (``sw4-<hex>``) for
    ``squeue``; code reads the run's ``kind`` (``RunKind.SWEEP``)."""
    return f"{SWEEP_RUN_PREFIX}{size}-{new_run_id()}"


def sweep_sizes(max_nodes: int) -> list[int]:
    """2, 4, 8, ... up to ``max_nodes``."""
    sizes, n = [], 2
    while n <= max_nodes:
        sizes.append(n)
        n *= 2
    return sizes


def plan_sweep(
    nodes: Sequence[Node],
    *,
    settings: SweepSettings,
    last_sweeps: Mapping[tuple[str, int], float],
    busy_nodes: Iterable[str],
    sweeping_classes: Iterable[str],
    now: float,
    limits: PlanLimits,
) -> list[ProbeJob]:
    """The next scaling-sweep job per node class (pure).

    A sweep measures the collective over 2, 4, 8, ... idle nodes of one class, one size at a
    time: per class, the smallest size not measured within ``interval_s`` that fits in the idle
    nodes now (at most ``max_share`` of the class's probeable nodes, at most ``max_nodes``),
    and nothing while a sweep job of that class is in flight. A size that does not fit is
    skipped this time; nodes are never held waiting for more to free up.
    """
    if not settings.enabled:
        return []
    busy = set(busy_nodes)
    in_flight = set(sweeping_classes)
    by_class: dict[str, list[Node]] = {}
    for node in nodes:
        if why_not_probeable(node, limits) is None:
            by_class.setdefault(node.node_class or "", []).append(node)
    jobs = []
    for cls, members in sorted(by_class.items()):
        if cls in in_flight:
            continue
        free = sorted(n.name for n in members if n.name not in busy)
        cap = min(settings.max_nodes, int(len(members) * settings.max_share), len(free))
        for size in sweep_sizes(settings.max_nodes):
            if now - last_sweeps.get((cls, size), float("-inf")) < settings.interval_s:
                continue
            if size <= cap:
                chosen = sorted((n for n in members if n.name not in busy), key=lambda n: n.name)[:size]
                jobs.append(ProbeJob(run_id=sweep_run_id(size), probe=settings.probe,
                                     nodes=tuple(n.name for n in chosen), args=tuple(settings.args),
                                     timeout_s=settings.timeout_s, ranks_per_node=settings.ranks_per_node,
                                     kind=RunKind.SWEEP, expect_gpus=expected_gpus(chosen)))
            break
    return jobs


DAY_S = 86400.0


@dataclass(frozen=True)
class ProbeBudget:
    """GPU-seconds probing may take in a rolling 24 h window and what is committed of it.

    ``committed_gpu_s``: runs finished in the window plus the estimate of the runs in flight.
    ``limit_gpu_s`` ``None``: no limit.
    """

    limit_gpu_s: float | None
    committed_gpu_s: float

    @property
    def left_gpu_s(self) -> float | None:
        return None if self.limit_gpu_s is None else max(0.0, self.limit_gpu_s - self.committed_gpu_s)


def budget_limit_gpu_s(max_gpu_hours_per_day: float | None, max_share: float | None, cluster_gpus: int) -> float | None:
    """The 24 h limit in GPU-seconds: the lower of the absolute one and ``max_share`` of the cluster's
    GPU-seconds in a day; ``None`` when neither is set."""
    limits = []
    if max_gpu_hours_per_day is not None:
        limits.append(max_gpu_hours_per_day * 3600.0)
    if max_share is not None:
        limits.append(max_share * cluster_gpus * DAY_S)
    return min(limits) if limits else None


def run_cost_gpu_s(probe: str, nodes: Iterable[str], gpus: Mapping[str, int], duration_s: Mapping[str, float],
                   default_s: float) -> float:
    """Estimated GPU-seconds of a run: its probe's expected wall time (``duration_s``, else
    ``default_s``) times the GPUs of its nodes."""
    return duration_s.get(probe, default_s) * sum(gpus.get(n, 0) for n in nodes)


def within_budget(
    jobs: Sequence[ProbeJob], *, budget: ProbeBudget, gpus: Mapping[str, int], duration_s: Mapping[str, float],
) -> list[ProbeJob]:
    """The jobs of a plan that fit in the budget, in plan order (pure).

    Re-probes (``RunKind.REPROBE``) are always kept and their cost counted: confirming a suspected
    fault is worth more than the budget. Regular probes and sweeps are kept while their estimated
    cost (``run_cost_gpu_s``: ``duration_s`` per probe from recent runs, else the job's timeout)
    fits in what is left; the first that does not fit ends the plan, so that a cheap probe never
    overtakes a node that has waited longer.
    """
    left = budget.left_gpu_s
    if left is None:
        return list(jobs)
    kept: list[ProbeJob] = []
    blocked = False
    for job in jobs:
        cost = sum(run_cost_gpu_s(r.probe, job.nodes, gpus, duration_s, r.timeout_s) for r in job.runs)
        if job.kind is RunKind.REPROBE:
            kept.append(job)
            left -= cost
            continue
        if blocked or cost > left:
            blocked = True
            continue
        kept.append(job)
        left -= cost
    return kept


def why_refused(node: Node | None, *, reason_prefix: str, limits: PlanLimits, held_by_healthd: bool = False,
                jobs_on_drained: bool = True) -> str | None:
    """Why an on-demand probe of ``node`` is refused, ``None`` if it may run (now or once healthd's own
    probe on it, ``held_by_healthd``, has finished).

    Refused: a node the cluster does not know, one drained by someone else (healthd's own drains,
    whose reason starts with ``reason_prefix``, may be probed where the backend runs jobs on drained
    nodes, ``jobs_on_drained``; plain Slurm does not), one a job runs on, one down or otherwise
    blocked, excluded by config or outside the probed partitions.
    """
    if node is None:
        return "not a node of the cluster"
    if node.drained and not node.owned_by(reason_prefix):
        return f"drained by someone else (reason: {node.reason or 'none given'})"
    if node.drained and not jobs_on_drained:
        return (f"drained by healthd ({node.reason}), and this cluster starts no job on a drained node: "
                f"`healthd undrain {node.name}` first, or run `healthd probe NAME` on the node and `healthd ingest`")
    if held_by_healthd:
        return None
    if node.state in ("allocated", "mixed", "draining", "completing") or "COMPLETING" in node.flags:
        return f"busy: {node.state}, a job runs on it"
    relaxed = Node(node.name, "idle" if node.state == "drained" else node.state, node.flags - DRAIN_FLAGS,
                   node.partitions)
    why = why_not_probeable(relaxed, limits)
    return None if why is None else f"not probeable: {why}"


def plan_requests(
    nodes: Sequence[Node], requests: Sequence[PriorityRequest], *, probes: Mapping[str, ProbeSettings],
    busy_nodes: Iterable[str], limits: PlanLimits, make_run_id: Callable[[], str] = new_run_id,
) -> list[ProbeJob | None]:
    """One job per on-demand request, in order (``None``: it waits: its nodes, or partners enough for
    a multi-node probe, are not free now). Not held by the in-flight cap, the idle share or the probe
    budget: an admin asked for these nodes (the runs count in all three once submitted). A job on one
    of healthd's own drains is a re-probe (``RunKind.REPROBE``): the recheck of that drain, which the
    backend runs on the drained node (on Slurm through healthd's recheck reservation)."""
    by_name = {n.name: n for n in nodes}
    busy = set(busy_nodes)
    free = {n.name for n in nodes if n.name not in busy and why_not_probeable(n, limits) is None}
    taken: set[str] = set()
    out: list[ProbeJob | None] = []
    for request in requests:
        settings = probes.get(request.probe, ProbeSettings())
        group = _priority_group(request, settings, by_name, free, taken, busy, limits)
        if group is None:
            out.append(None)
            continue
        if any(by_name[n].drained for n in group):
            out.append(_job(request.probe, tuple(by_name[n] for n in group), settings, new_priority_run_id,
                            RunKind.REPROBE))
        else:
            out.append(_job(request.probe, tuple(by_name[n] for n in group), settings, make_run_id))
        taken.update(group)
    return out
