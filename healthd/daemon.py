"""Wiring: store, backend, collector, scheduler jobs, HTTP server, signals and sd_notify.

Scheduler jobs (APScheduler 3, in-memory job store, rebuilt from the settings at start):
``discover`` (node states from the backend), ``plan`` (planner → launches), ``collect``
(finished runs → store → verdicts), ``housekeeping`` (retention), ``topology`` (the network
topology, ``[topology]``: read at start and every ``refresh_interval_s``; handed to the judge) and, with
``[passive] prometheus_url`` set, ``passive`` (one poll of the site's Prometheus, handed to the judge). A job
that raises is logged once with its context, counted, and the next tick runs as usual.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from types import FrameType
from typing import Any, TypeVar

from apscheduler.events import EVENT_JOB_MAX_INSTANCES, EVENT_JOB_MISSED, JobExecutionEvent
from apscheduler.executors.pool import ThreadPoolExecutor
from apscheduler.schedulers.background import BackgroundScheduler
from prometheus_client import CollectorRegistry

from healthd.boundary import write_expectations
from healthd.cluster import ClusterBackend, make_backend
from healthd.cluster.base import BackendTraits, ObservedBackend
from healthd.cluster.topology import check_nodes, read_topology
from healthd.collector import (
    Collected,
    Collector,
    boundary_failures,
    collect_boundary,
    prune_boundary_files,
    results_dir_problem,
)
from healthd.config import PassiveSettings, Settings, load_settings
from healthd.coverage import CoverageCollector, CoverageInputs
from healthd.errors import BackendError, ConfigError, HealthdError, SlurmError, StoreError
from healthd.ha import LeaderCollector, LeaderOnly
from healthd.ha.caps import with_journal_drains
from healthd.ha.fence import FencedBackend
from healthd.ha.lease import Lease
from healthd.ha.reconcile import reconcile
from healthd.ha.runs import sync_runs
from healthd.http import HttpApp, HttpServer
from healthd.judge.persist import (
    judge_declared,
    judge_ingested,
    judge_passive_poll,
    judge_runs,
    load_judge,
    run_from_collected,
)
from healthd.judge.sources.fabric import Fabric
from healthd.judge.sources.passive import Passive
from healthd.logging import get_logger, setup_logging
from healthd.metrics import DaemonMetrics, Exposition, PassiveMetrics, PassiveSignalCollector
from healthd.model import Node, ProbeJob, RunKind
from healthd.node_check_watch import JobEndCollector, JobEndWatch
from healthd.node_class import class_of
from healthd.passive.model import PassivePoll
from healthd.passive.source import PassiveSource
from healthd.planning import (
    DAY_S,
    PlanLimits,
    PriorityRequest,
    ProbeBudget,
    budget_limit_gpu_s,
    plan,
    plan_requests,
    plan_sweep,
    run_cost_gpu_s,
    why_not_probeable,
    why_refused,
    within_budget,
)
from healthd.remediation import Remediator, recommendations_document
from healthd.sdnotify import Notifier
from healthd.store import Store
from healthd.store.rows import RemediationSnapshot, RunRow
from healthd.topology import Topology, describe
from healthd.webconfig import BasicAuth, WebConfig, load_web_config
from probes.catalogue import probe_spec

log = get_logger(__name__)
_Output = TypeVar("_Output")

STOP_DEADLINE_S = 8.0
ON_DEMAND_WAIT_S = 600.0
"""An on-demand probe request whose node is not free (healthd's own probe on it, no partner) this long expires."""
FAILING_TICKS = 3
"""Consecutive failures of one tick after which ``/healthz`` answers 503."""
COVERAGE_MAX_AGE_S = 60.0
"""How often the coverage and budget figures are read again from the store's run history (after a tick)."""
JOB_END_SLACK_S = 60.0
"""Beyond the epilog's budget and two collections: how much later a job end's node check document may still
arrive before the end counts as missed (``healthd.node_check_watch``)."""


class Daemon:
    def __init__(self, settings: Settings, config_path: Path | None, *, backend: ClusterBackend | None = None) -> None:
        self.settings = settings
        self.config_path = config_path
        self.started_monotonic = time.monotonic()
        self._heartbeat = 0.0
        self._failing: dict[str, tuple[int, str]] = {}
        self._stop = threading.Event()
        self._reload = threading.Event()
        self.notifier = Notifier()
        if problem := results_dir_problem(settings.results_dir):
            raise ConfigError(problem)
        web = load_web_config(settings.http.web_config_file) if settings.http.web_config_file else WebConfig()
        try:
            settings.results_dir.mkdir(mode=0o750, parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreError(f"cannot create the results directory {settings.results_dir}: {exc}") from None
        self.store = Store(settings.store_path)
        self.backend = backend or make_backend(settings)
        self.lease: Lease | None = Lease(settings.ha) if settings.ha.mode == "mariadb" else None
        """``[ha]``: this instance's side of the lease; ``None`` when HA is off (it always leads)."""
        if self.lease is not None:
            self.backend = FencedBackend(self.backend, self.lease, settings.remediation.reason_prefix)
        self._reconciled_epoch: int | None = None
        self.backend_up = True
        self._backend_down_since: float | None = None
        self.registry = CollectorRegistry()
        self.metrics = DaemonMetrics(self.registry)
        self.registry.register(LeaderCollector(self.lease))
        self.metrics.backend_up.labels(self.backend.name).set(1)
        self.metrics.slurm_up.set(0)
        self.observed = ObservedBackend(self.backend, self._backend_call_ok)
        self.exposition = Exposition(self.store, lambda: self.backend.name, settings.metrics.detail)
        self.coverage = CoverageCollector(self._coverage_inputs, max_age_s=COVERAGE_MAX_AGE_S)
        self.registry.register(LeaderOnly(self.coverage, self.leading))
        self.judge = load_judge(self.store, settings.judge, now=time.time())
        self._judge_stale = False
        self.registry.register(LeaderOnly(PassiveSignalCollector(
            lambda: [*self.judge.view(Passive, Passive.signals), *self.judge.view(Fabric, Fabric.signals)]),
            self.leading))
        self.job_ends = JobEndWatch(grace_s=settings.node_check.epilog_budget_s
                                    + 2 * settings.scheduler.collect_interval_s + JOB_END_SLACK_S)
        self.registry.register(LeaderOnly(JobEndCollector(self.job_ends), self.leading))
        self.topology: Topology | None = None
        self._topology_read = False
        """Whether a topology read has succeeded yet (until then ``/healthz`` says none was read)."""
        self._topology_error: str | None = None
        """The last read's error, logged once until a read works or the error changes."""
        self._expectations: dict[str, str] = {}
        """The expectation files (``healthd.boundary``) this daemon wrote, by node."""
        self.passive: PassiveSource | None = PassiveSource(settings.passive) if settings.passive.enabled else None
        self.passive_metrics = PassiveMetrics(self.registry) if self.passive is not None else None
        self.passive_poll: PassivePoll | None = None
        """The last poll of the site's Prometheus (``/healthz`` says whether it answered)."""
        self.remediator = Remediator(self.store, self.backend, settings.remediation,
                                     full_check=sorted(n for n, p in settings.probes.items() if p.enabled),
                                     snapshot_hook=self._shared_caps if self.lease is not None else None)
        self.collector = Collector(
            self.store, self.observed, settings.results_dir,
            pending_timeout_s=settings.slurm.pending_timeout_s,
            on_error=lambda kind: self.metrics.errors.labels(kind).inc(),
        )
        routes = {"/api/v1/recommendations": lambda: recommendations_document(self.store, self.settings.remediation)}
        self.http = HttpServer(
            HttpApp(self.registry, self.store, self.healthy, routes, auth=BasicAuth(web.users) if web.users else None,
                    exposition=self.exposition, refresh_on_scrape=False, topology=lambda: self.topology,
                    store_part=self.leading,
                    passive=lambda: [*self.judge.view(Passive, Passive.signals),
                                     *self.judge.view(Fabric, Fabric.signals)]),
            settings.http.host, settings.http.port, tls=web.tls.context() if web.tls else None,
            workers=settings.http.workers, request_timeout_s=settings.http.request_timeout_s,
            max_connections=settings.http.max_connections,
        )
        self.scheduler = BackgroundScheduler(
            executors={"default": ThreadPoolExecutor(max_workers=4)},
            job_defaults={"coalesce": True, "max_instances": 1,
                          "misfire_grace_time": int(settings.scheduler.misfire_grace_s)},
            timezone="UTC",
        )
        self.scheduler.add_listener(self._on_missed, EVENT_JOB_MISSED | EVENT_JOB_MAX_INSTANCES)

    # -- health -----------------------------------------------------------------------------
    def _coverage_inputs(self) -> CoverageInputs:
        now, s = time.time(), self.settings
        return CoverageInputs(
            now=now, nodes=tuple(self.store.nodes()),
            enabled_probes=tuple(name for name, p in s.probes.items() if p.enabled),
            between_gpus=tuple(name for name, p in s.probes.items() if p.nodes_per_job == 1
                               and (spec := probe_spec(name)) is not None and spec.between_gpus),
            last_judged=self.store.last_judged(), spent_gpu_s=self.store.gpu_seconds_since(now - DAY_S),
            max_gpu_hours_per_day=s.budget.max_gpu_hours_per_day, max_share=s.budget.max_share,
        )

    def alive(self) -> tuple[bool, str]:
        """Whether the scheduler ticks (systemd's watchdog): a restart would help only when it does not."""
        if not self.scheduler.running:
            return False, "scheduler not running"
        age = time.monotonic() - self._heartbeat
        if age > self.settings.scheduler.heartbeat_stale_s:
            return False, f"scheduler has not ticked for {age:.0f} s"
        return True, f"ok: last tick {age:.1f} s ago"

    def healthy(self) -> tuple[bool, str]:
        """``/healthz``: alive, and no tick failing ``FAILING_TICKS`` times in a row for a cause of healthd's
        own (a backend that does not answer is reported, not counted: it is not healthd's fault). The
        text ends with the topology in use (:meth:`topology_text`)."""
        ok, text = self._health()
        ha = f"; {self.lease.describe()}" if self.lease is not None else ""
        return ok, f"{text}; {self.topology_text()}; {self.passive_text()}{ha}"

    def _health(self) -> tuple[bool, str]:
        ok, text = self.alive()
        if not ok:
            return ok, text
        failing = [(name, n, error) for name, (n, error) in sorted(self._failing.items()) if n >= FAILING_TICKS]
        if failing:
            return False, "; ".join(f"tick {name} failed {n} times in a row: {error}" for name, n, error in failing)
        if self._backend_down_since is not None:
            what = "slurm controller" if self.traits.controller else f"backend {self.backend.name}"
            text += (f"; {what} not answering for {time.time() - self._backend_down_since:.0f} s: nothing is"
                     " planned or submitted until it answers")
        return True, text

    def topology_text(self) -> str:
        """What ``/healthz`` says of the topology: :func:`healthd.topology.describe`, and why the last
        read failed while it does."""
        if self.settings.topology.source != "none" and not self._topology_read and self._topology_error is None:
            text = "topology not read yet"
        else:
            text = describe(self.topology)
        if self._topology_error is not None:
            text += f" (the last read failed, {'the previous one kept' if self.topology else 'none in use'}: "
            text += f"{self._topology_error})"
        return text

    def passive_text(self) -> str:
        """What ``/healthz`` says of the passive source: off, not polled yet, up (with the signals the site
        does not export) or down with the error; never a reason for 503 (a site's Prometheus is not healthd)."""
        poll = self.passive_poll
        if self.passive is None:
            return "passive signals: off"
        if poll is None:
            return "passive signals: not polled yet"
        if not poll.up:
            return f"passive signals down: {poll.errors[0] if poll.errors else 'no answer'}"
        text = f"passive signals up: {len(poll.covered)} nodes covered"
        if poll.unavailable:
            text += f", unavailable: {', '.join(poll.unavailable)}"
        if poll.errors:
            text += f"; {len(poll.errors)} query error(s), first: {poll.errors[0]}"
        return text

    def _on_missed(self, event: JobExecutionEvent) -> None:
        self.metrics.missed.labels(event.job_id).inc()
        log.warning("scheduler_tick_missed", job=event.job_id)

    # -- ticks ------------------------------------------------------------------------------
    def _tick(self, name: str, fn: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            self.metrics.ticks.labels(name).inc()
            try:
                fn()
                self._failing.pop(name, None)
            except Exception as exc:
                if not isinstance(exc, BackendError):
                    count = self._failing.get(name, (0, ""))[0] + 1
                    self._failing[name] = (count, f"{type(exc).__name__}: {exc}"[:500])
                self.metrics.tick_errors.labels(name).inc()
                kind = "tick"
                if isinstance(exc, BackendError | StoreError):
                    kind = "backend" if isinstance(exc, BackendError) else "store"
                self.metrics.errors.labels(kind).inc()
                if isinstance(exc, HealthdError):
                    log.error("tick_failed", job=name, error=str(exc), error_type=type(exc).__name__)
                else:
                    log.exception("tick_crashed", job=name)
            finally:
                self._heartbeat = time.monotonic()
                self.metrics.last_tick.labels(name).set(time.time())
                self._refresh_metrics()

        run.__name__ = f"tick_{name}"
        return run

    @property
    def traits(self) -> BackendTraits:
        return self.backend.traits(self.settings)

    def _backend_call_ok(self, ok: bool) -> None:
        """Every call of discover, plan and collect to the backend ends here (``ObservedBackend``)."""
        if ok != self.backend_up:
            if ok:
                log.warning("backend_back", backend=self.backend.name)
            else:
                log.error("backend_down", backend=self.backend.name)
        self._backend_down_since = None if ok else (self._backend_down_since or time.time())
        self.backend_up = ok
        self.metrics.backend_up.labels(self.backend.name).set(1 if ok else 0)
        if self.traits.controller:
            self.metrics.slurm_up.set(1 if ok else 0)

    def discover(self) -> None:
        nodes = self.observed.list_nodes()
        now = time.time()
        self.store.upsert_nodes(nodes, now)
        try:
            if self.leading():  # the shared results directory has one writer ([ha]: the leader)
                write_expectations(self.settings.results_dir, nodes, self._expectations,
                                   nvswitch={r.name for r in self.settings.slurm.node_classes if r.nvswitch})
            else:
                self._expectations.clear()  # written afresh once this instance leads
        except OSError as exc:
            log.warning("node_expectation_not_written", error=str(exc))
        if ended := self.job_ends.see(nodes, now):
            documents = {r.node: r.last_run_at for r in self.store.last_runs(ended) if r.probe == "boundary"}
            for node in self.job_ends.settle(documents, now):
                log.warning("node_check_missed", node=node, why="a job ended on it and no node check document "
                            "followed: see journalctl -t healthd-node-check on the node")

    def plan_and_launch(self) -> None:
        """Plan from the node states read now and submit; nothing while the backend is down.

        The nodes are read by this tick (one query), never taken from an earlier discovery: a user's
        job that started since is seen, so the window between the read and sbatch is one query long.
        A probe that still pends has lost its node to a user (the collector cancels it after
        ``pending_timeout_s``): it keeps its nodes out of the plan but no longer counts against
        the in-flight cap, so it never holds up probes of other idle nodes; nor does it count in the
        idle share once its node is no longer idle (``plan``'s ``pending_nodes``).
        """
        if not self.backend_up:
            log.info("plan_skipped", why="the backend is down")
            return
        if not self.leading():
            return
        self._sync_runs()
        s = self.settings
        known = self.observed.list_nodes()
        now = time.time()
        self.store.upsert_nodes(known, now)
        runs = self.store.unfinished_runs()
        in_flight = jobs_in_flight(runs, now, s.scheduler.plan_interval_s)
        limits = plan_limits(self.traits, s)
        if self._launch_requests(known, runs, limits, now):
            runs = self.store.unfinished_runs()
            in_flight = jobs_in_flight(runs, now, s.scheduler.plan_interval_s)
        last_attempts = self._last_attempts(now)
        validating = self.remediator.validating_since()  # a repaired node's full check is due at once
        priority = self.judge.priority_requests(
            self.remediator.recheck_nodes(), s.probes,
            {k: at for k, at in last_attempts.items() if at >= validating.get(k[0], float("-inf"))}, now)
        jobs = plan(
            known,
            probes=s.probes,
            last_attempts=last_attempts,
            busy_nodes={n for r in runs for n in r.nodes},
            in_flight=in_flight,
            now=now,
            limits=limits,
            priority=priority,
            pending_nodes={n for r in runs if r.state == "submitted" for n in r.nodes},
            combine=s.scheduler.combine_probes,
            last_partners=self.store.last_partners() if s.scheduler.rotate_partners else {},
            rotate=s.scheduler.rotate_partners,
        )
        if in_flight + len(jobs) < limits.max_jobs_in_flight:
            jobs += plan_sweep(
                known,
                settings=s.sweep,
                last_sweeps=self.store.last_sweeps(),
                busy_nodes={n for r in runs for n in r.nodes} | {n for j in jobs for n in j.nodes},
                sweeping_classes=self.store.sweeping_classes(),
                now=now,
                limits=limits,
            )[: limits.max_jobs_in_flight - in_flight - len(jobs)]
        for job in self._with_known_uuids(self._within_budget(jobs, known, runs, now)):
            self.collector.launch(job)

    def leading(self) -> bool:
        """Whether this instance may act: always without ``[ha]``, else while it holds the lease."""
        return self.lease is None or self.lease.leading()

    def renew_lease(self) -> None:
        """``[ha]``: take or renew the lease (every ``renew_interval_s``)."""
        if self.lease is not None:
            self.lease.renew()

    def _reconcile_ha(self) -> None:
        """``[ha]``: once per term, the earlier leaders' drains confirmed by the journal become this
        instance's own (``healthd.ha.reconcile``); tried again at the next tick after an error."""
        lease = self.lease
        if lease is None or lease.epoch is None or self._reconciled_epoch == lease.epoch:
            return
        try:
            reconcile(lease, self.observed, self.store, self.settings.remediation.reason_prefix, lease.epoch,
                      time.time(), probes=[n for n, p in self.settings.probes.items() if p.enabled])
        except HealthdError as exc:
            log.warning("ha_reconcile_failed", error=str(exc))
            return
        self._reconciled_epoch = lease.epoch

    def _shared_caps(self, snap: RemediationSnapshot, since: float) -> RemediationSnapshot:
        """``[ha]``: the drains the other instances journalled since ``since`` count in the breaker window and
        the hourly cap (``healthd.ha.caps``). The journal unread: the snapshot as it is (a drain is then refused
        by the fence, which needs the same database)."""
        assert self.lease is not None
        try:
            journal = self.lease.journal_drains(max(0.0, time.time() - since))
        except HealthdError as exc:
            log.warning("ha_journal_unread", error=str(exc))
            return snap
        classes = {n.name: class_of(n) for n in self.store.nodes(names=sorted({j.node for j in journal}))}
        return with_journal_drains(snap, journal, classes)

    def _sync_runs(self) -> None:
        """``[ha]``: the run registry (``healthd.ha.runs``): the runs an earlier leader submitted become this
        leader's to collect; those collected are closed there. A database error is logged, tried next tick."""
        if self.lease is None:
            return
        try:
            sync_runs(self.lease, self.store, self.backend.name)
        except HealthdError as exc:
            log.warning("ha_runs_not_synced", error=str(exc))

    def _last_attempts(self, now: float) -> dict[tuple[str, str], float]:
        """The store's last attempt per (node, probe); with ``[ha]``, joined with the submissions every
        instance journalled, so a new leader goes on with the old leader's schedule (no probe wave)."""
        attempts = self.store.last_attempts()
        if self.lease is None:
            return attempts
        horizon = max((p.interval_s for p in self.settings.probes.values()), default=DAY_S)
        try:
            journalled = self.lease.launches(horizon)
        except HealthdError as exc:
            log.warning("ha_launches_unread", error=str(exc))
            return attempts
        for key, at in journalled.items():
            attempts[key] = max(at, attempts.get(key, at))
        return attempts

    def _with_known_uuids(self, jobs: list[ProbeJob]) -> list[ProbeJob]:
        """Single-node jobs that expect GPUs, with the UUIDs the store's inventory has for the node
        (``--expect-gpu-uuids``: a missing GPU is named by the UUID it had). One store read per tick."""
        wanted = {j.nodes[0] for j in jobs if j.expect_gpus and len(j.nodes) == 1 and not j.expect_gpu_uuids}
        if not wanted:
            return jobs
        seen = self.store.gpu_inventory(wanted)
        out = []
        for job in jobs:
            uuids = tuple(g.uuid for g in seen.get(job.nodes[0], ()) if g.uuid) if job.nodes[0] in wanted else ()
            out.append(replace(job, expect_gpu_uuids=uuids) if uuids else job)
        return out

    def _launch_requests(self, known: list[Node], runs: list[RunRow], limits: PlanLimits, now: float) -> int:
        """Settle the pending on-demand probe requests (``healthd probe NAME --node N``): refuse those
        ``why_refused`` refuses, launch those whose node is free, let the others wait (``seen_at``) up to
        ``ON_DEMAND_WAIT_S``. Returns the number launched."""
        pending = self.store.probe_requests()
        if not pending:
            return 0
        by_name = {n.name: n for n in known}
        held = {n for r in runs for n in r.nodes}
        waiting = []
        for r in pending:
            why = why_refused(by_name.get(r.node), reason_prefix=self.settings.remediation.reason_prefix,
                              limits=limits, held_by_healthd=r.node in held,
                              jobs_on_drained=self.traits.runs_jobs_on_drained)
            if why is not None:
                self.store.settle_probe_request(r.id, "refused", at=now, detail=why)
                log.info("probe_request_refused", node=r.node, probe=r.probe, why=why)
            elif now - r.requested_at > ON_DEMAND_WAIT_S:
                self.store.settle_probe_request(r.id, "expired", at=now,
                                                detail=f"the node was not free within {ON_DEMAND_WAIT_S:.0f} s")
            else:
                waiting.append(r)
        self.store.see_probe_requests([r.id for r in waiting], now)
        partners = tuple(sorted(n.name for n in known if n.name not in held and why_not_probeable(n, limits) is None))
        jobs = plan_requests(known, [PriorityRequest(r.probe, (r.node,), partners=partners, allow_drained=True)
                                     for r in waiting], probes=self.settings.probes, busy_nodes=held, limits=limits)
        launched = 0
        known_uuids = iter(self._with_known_uuids([j for j in jobs if j is not None]))
        jobs = [next(known_uuids) if j is not None else None for j in jobs]
        for r, job in zip(waiting, jobs, strict=True):
            if job is not None:
                self.collector.launch(job)
                self.store.settle_probe_request(r.id, "launched", at=now, run_id=job.run_id)
                log.info("probe_request_launched", node=r.node, probe=r.probe, run_id=job.run_id, by=r.requested_by)
                launched += 1
        return launched

    def _within_budget(self, jobs: list[ProbeJob], known: list[Node], runs: list[RunRow], now: float) -> list[ProbeJob]:
        """The planned jobs the probe budget (``[budget]``) leaves: see ``planning.within_budget``."""
        b, probes = self.settings.budget, self.settings.probes
        gpus = {n.name: n.gpus for n in known}
        limit = budget_limit_gpu_s(b.max_gpu_hours_per_day, b.max_share, sum(gpus.values()))
        if limit is None:
            return jobs
        durations = self.store.mean_durations(now - DAY_S)
        in_flight = sum(run_cost_gpu_s(r.probe, r.nodes, gpus, durations,
                                       probes[r.probe].timeout_s if r.probe in probes else 0.0) for r in runs)
        budget = ProbeBudget(limit, self.store.gpu_seconds_since(now - DAY_S) + in_flight)
        kept = within_budget(jobs, budget=budget, gpus=gpus, duration_s=durations)
        if len(kept) < len(jobs):
            log.info("plan_over_budget", held=len(jobs) - len(kept), limit_gpu_s=limit,
                     committed_gpu_s=round(budget.committed_gpu_s))
        return kept

    def collect(self) -> None:
        declared = self._saving_judgement(lambda: judge_declared(self.judge, self.store, now=time.time()))
        for e in declared.fleet_events:
            log.warning("declared_event_started" if e.active else "declared_event_ended", node_class=e.node_class,
                        text=e.text)
        boundary: list[Collected] = []
        if self.leading():
            self._sync_runs()
        if self.leading():  # it moves the documents in the shared results directory: the leader's to do
            boundary = collect_boundary(self.collector,
                                        known=lambda names: {n.name for n in self.store.nodes(names=names)})
        collected = self.collector.collect()
        self._observe_container_setup(collected)
        self._judge(collected + boundary)
        if self.leading():
            self._reconcile_ha()
            self.remediator.repair_tick()
            self.remediator.adopt_boundary_drains(boundary_failures(boundary))
        ingested = self._saving_judgement(lambda: judge_ingested(self.judge, self.store, now=time.time()))
        if ingested is not None:
            self.remediator.apply(ingested)

    def _observe_container_setup(self, done: Sequence[Collected]) -> None:
        """``healthd_probe_container_setup_seconds``: each collected run's container start-up as its
        probe measured it (``ProbeResult.container``), under the class of its first node."""
        started = [(c.nodes[0], c.result.container) for c in done
                   if c.result is not None and c.result.container is not None and c.nodes]
        if not started:
            return
        classes = {n.name: n.node_class for n in self.store.nodes(names=sorted({node for node, _ in started}))}
        for node, container in started:
            self.metrics.container_setup.labels(classes.get(node) or "", container.kind).observe(
                container.setup_seconds)

    def _saving_judgement(self, judge: Callable[[], _Output]) -> _Output:
        """Run ``judge`` (an evaluation and its save). When the save fails the judge in memory is ahead
        of the store: it is reloaded from the store before it judges again, so the runs left unjudged
        are judged afresh, not skipped as seen."""
        if self._judge_stale:
            self.judge = load_judge(self.store, self.settings.judge, now=time.time())
            self.judge.set_topology(self.topology, now=time.time())
            self._judge_stale = False
        try:
            return judge()
        except StoreError:
            self._judge_stale = True
            raise

    def _judge(self, done: list[Collected]) -> None:
        """Judge the runs just collected, persist verdicts, then let remediation act on them.

        Runs finished earlier whose judgement was never saved (a stop or a store fault in between)
        are judged first. Scaling-sweep runs only feed the scaling table: a group of N nodes has no
        peers to be judged against among the pairs and single nodes the judge compares.
        """
        now = time.time()
        fresh = [run_from_collected(c, now) for c in done if c.kind is not RunKind.SWEEP]
        ids = {r.run_id for r in fresh}
        left = [r for r in self.store.unjudged_runs() if r.run_id not in ids]
        if left:
            log.warning("runs_judged_late", runs=len(left), run_ids=[r.run_id for r in left[:10]])
        if left or fresh:
            self.remediator.apply(self._saving_judgement(
                lambda: judge_runs(self.judge, self.store, left + fresh, now=now)))

    def refresh_topology(self) -> None:
        """Read the topology (``[topology]``) and hand a changed one to the judge. A failed read is
        logged once (until a read works or the error changes), counted, and the previous topology
        kept: never a tick failure, the daemon goes on with what it had."""
        try:
            topology = read_topology(self.settings.topology, self.observed)
            if topology is not None:
                known = [n.name for n in self.store.nodes()]
                if known:
                    check_nodes(topology, known)
        except HealthdError as exc:
            self.metrics.topology_errors.inc()
            error = f"{type(exc).__name__}: {exc}"[:500]
            if error != self._topology_error:
                log.error("topology_read_failed", source=self.settings.topology.source, error=error,
                          kept=describe(self.topology))
            self._topology_error = error
            return
        if self._topology_error is not None:
            log.info("topology_read_again")
        self._topology_error = None
        first = not self._topology_read
        self._topology_read = True
        if first or topology != self.topology:
            self.topology = topology
            self.judge.set_topology(topology, now=time.time())
            self.exposition.set_topology(topology)
            self.metrics.topology_nodes.set(len(topology.leaf_of) if topology else 0)
            log.info("topology", topology=describe(topology), source=self.settings.topology.source)

    def poll_passive(self) -> None:
        """One poll of the site's Prometheus (``[passive]``) with the nodes the store knows: its metrics,
        its line in ``/healthz``, then the judge (:meth:`judge_passive`). A Prometheus that does not answer
        is logged once per change of error, counted and shown; never a tick failure, never a node fault."""
        if self.passive is None:
            return
        poll = self.passive.poll([n.name for n in self.store.nodes()], time.time())
        before = self.passive_poll
        self.passive_poll = poll
        if self.passive_metrics is not None:
            self.passive_metrics.record(poll)
        if not poll.up:
            if before is None or before.up or before.errors[:1] != poll.errors[:1]:
                log.error("passive_down", url=self.settings.passive.prometheus_url, error=poll.errors[:1])
        elif before is not None and not before.up:
            log.warning("passive_back", url=self.settings.passive.prometheus_url)
        if poll.up and (before is None or before.unavailable != poll.unavailable):
            log.info("passive_signals", unavailable=list(poll.unavailable), covered=len(poll.covered))
        seen = {(x.node, x.gpu_uuid or x.gpu or "", x.code) for x in before.signals} if before is not None else set()
        for fired in poll.signals:
            if fired.kind == "level" and (fired.node, fired.gpu_uuid or fired.gpu or "", fired.code) in seen:
                continue  # a level still holding: said when it started
            log.info("passive_signal", node=fired.node, gpu=fired.gpu, gpu_uuid=fired.gpu_uuid, code=fired.code,
                     strength=str(fired.strength), kind=fired.kind, detail=fired.detail)
        self.judge_passive(poll)

    def judge_passive(self, poll: PassivePoll) -> None:
        """The poll judged with everything else (``Judge.observe``), the judgement saved, then
        remediation: a confirmed passive fault is recommended (and drained, in ``enforce``) like a probe's."""
        self.remediator.apply(self._saving_judgement(
            lambda: judge_passive_poll(self.judge, self.store, poll, now=time.time())))

    def housekeeping(self) -> None:
        now = time.time()
        cutoff = now - self.settings.store.retention_days * 86400
        deleted = self.store.prune(cutoff)
        kept_files = prune_boundary_files(self.settings.results_dir, cutoff) if self.leading() else 0
        if kept_files:
            log.info("boundary_files_pruned", files=kept_files)
        self.store.prune_judgement(cutoff)
        self.store.prune_probe_requests(cutoff)
        if deleted:
            log.info("store_pruned", runs=deleted)
        folded = self.store.rollup(older_than=now - self.settings.store.detail_days * 86400)
        if folded:
            log.info("store_rolled_up", runs=folded)

    def _refresh_metrics(self) -> None:
        """Bring the exposition up to date with what the tick (or another process) wrote: scrapes only
        serve its bytes. At start it reads the whole current state (a big fleet takes seconds; a scrape
        meanwhile waits for it)."""
        try:
            self.exposition.refresh_if_changed()
            self.coverage.refresh()
        except HealthdError as exc:
            log.error("metrics_refresh_failed", error=str(exc))

    # -- life cycle -------------------------------------------------------------------------
    def start(self) -> None:
        s = self.settings.scheduler
        threading.Thread(target=self._refresh_metrics, name="metrics-warm", daemon=True).start()
        self.http.start()
        log.info("http_listening", host=self.settings.http.host, port=self.http.port)
        try:
            self._judge(self.collector.recover())
        except HealthdError as exc:
            self.metrics.errors.labels("backend" if isinstance(exc, BackendError) else "store").inc()
            log.error("recover_failed", error=str(exc))
        except Exception:
            self.metrics.errors.labels("tick").inc()
            log.exception("recover_crashed")
        self._tick("ha", self.renew_lease)()
        self._tick("discover", self.discover)()
        self._tick("topology", self.refresh_topology)()
        jobs = (
            ("discover", self.discover, s.discover_interval_s),
            ("plan", self.plan_and_launch, s.plan_interval_s),
            ("collect", self.collect, s.collect_interval_s),
            ("housekeeping", self.housekeeping, s.housekeeping_interval_s),
            ("topology", self.refresh_topology, self.settings.topology.refresh_interval_s),
        ) + ((("passive", self.poll_passive, self.settings.passive.interval_s),) if self.passive else ()) + (
            (("ha", self.renew_lease, self.settings.ha.renew_interval_s),) if self.lease is not None else ())
        now = time.time()
        for name, fn, interval in jobs:
            first = now + (interval if name in ("discover", "housekeeping", "topology") else 0.5)
            if name == "passive":
                first = now + 1.0
            if name == "ha":
                first = now + interval
            self.scheduler.add_job(
                self._tick(name, fn), "interval", seconds=interval, id=name, name=name,
                next_run_time=_utc(first), replace_existing=True,
            )
        self.scheduler.start()
        self._heartbeat = time.monotonic()
        self.notifier.ready(status=f"backend {self.backend.name}, listening on port {self.http.port}")
        log.info("daemon_started", backend=self.backend.name, store=str(self.store.path),
                 config=str(self.config_path) if self.config_path else None)

    def request_stop(self) -> None:
        self._stop.set()

    def request_reload(self) -> None:
        self._reload.set()
        self._stop.set()

    def run_forever(self) -> None:
        interval = self.notifier.watchdog_interval()
        while True:
            self._stop.wait(timeout=min(interval or 5.0, 5.0))
            if self._reload.is_set():
                self._reload.clear()
                self._stop.clear()
                self.reload()
                continue
            if self._stop.is_set():
                break
            if interval and self.alive()[0]:
                self.notifier.watchdog()
        self.stop()

    def reload(self) -> None:
        """Re-read the config (SIGHUP). An invalid one is refused and the old one stays in force.

        Probe schedules, intervals and limits take effect at once; listen address, store path
        and backend need a restart (logged when they differ).
        """
        self.notifier.reloading()
        try:
            new, _ = load_settings(self.config_path)
        except ConfigError as exc:
            self._reload_refused(str(exc))
            return
        except Exception as exc:  # whatever a hostile file does to the parsers, the old config stays
            self._reload_refused(f"{type(exc).__name__}: {exc}")
            return
        for key in ("http", "store", "backend", "state_dir", "ha"):
            if getattr(new, key) != getattr(self.settings, key):
                log.warning("config_change_needs_restart", key=key)
        old = self.settings
        try:
            self._apply(new)
        except Exception as exc:
            log.exception("config_apply_failed")
            try:
                self._apply(old)
            except Exception:
                log.exception("config_restore_failed")
            self._reload_refused(f"{type(exc).__name__}: {exc}")
            return
        log.info("config_reloaded", config=str(self.config_path))
        self.notifier.ready(status="config reloaded")

    def _apply(self, new: Settings) -> None:
        topology_changed = new.topology != self.settings.topology
        old_passive = self.settings.passive
        self.settings = new
        self.collector.pending_timeout_s = new.slurm.pending_timeout_s
        self.judge.reconfigure(new.judge)
        self.remediator.settings = new.remediation
        self.exposition.set_detail(new.metrics.detail)
        for name, interval in (("discover", new.scheduler.discover_interval_s),
                               ("plan", new.scheduler.plan_interval_s),
                               ("collect", new.scheduler.collect_interval_s),
                               ("housekeeping", new.scheduler.housekeeping_interval_s),
                               ("topology", new.topology.refresh_interval_s)):
            self.scheduler.reschedule_job(name, trigger="interval", seconds=interval)
        if topology_changed:
            self._topology_error = None
            self.refresh_topology()
        self._apply_passive(old_passive)

    def _apply_passive(self, old: PassiveSettings) -> None:
        """A changed ``[passive]``: a new source (its previous values start again from a baseline) at the
        new interval; switching it on or off takes a restart (its job and metrics are made at start)."""
        new = self.settings.passive
        if new == old:
            return
        if new.enabled != (self.passive is not None):
            log.warning("config_change_needs_restart", key="passive.prometheus_url")
            return
        if self.passive is not None:
            self.passive = PassiveSource(new)
            self.passive_poll = None
            self.scheduler.reschedule_job("passive", trigger="interval", seconds=new.interval_s)

    def _reload_refused(self, error: str) -> None:
        self.metrics.errors.labels("config_reload").inc()
        log.error("config_reload_refused", error=error)
        self.notifier.ready(status="config reload refused; old config in force")

    def stop(self) -> None:
        """Stop within ``STOP_DEADLINE_S``: no new ticks, local probes killed, HTTP closed, store closed."""
        self.notifier.stopping()
        log.info("daemon_stopping")
        deadline = time.monotonic() + STOP_DEADLINE_S
        self.scheduler.pause()
        self.backend.close()
        if self.traits.probes_in_daemon:
            try:
                self._judge(self.collector.collect())
            except Exception as exc:
                log.warning("final_collect_failed", error=f"{type(exc).__name__}: {exc}")
        self.http.stop()
        waiter = threading.Thread(target=self.scheduler.shutdown, kwargs={"wait": True}, daemon=True)
        waiter.start()
        waiter.join(max(0.0, deadline - time.monotonic()))
        if self.lease is not None:
            self.lease.release()
            self.lease.close()
        self.store.close()
        log.info("daemon_stopped")


def plan_limits(traits: BackendTraits, settings: Settings) -> PlanLimits:
    """The planner's limits: the backend's, and the nodes the settings exclude (pure)."""
    return PlanLimits(
        max_jobs_in_flight=traits.max_jobs_in_flight,
        max_idle_share=traits.max_idle_share,
        partitions=traits.partitions,
        exclude=frozenset(settings.slurm.exclude_nodes),
        own_reservation=settings.slurm.reservation,
    )


def waiting_for_nodes(run: RunRow, now: float, plan_interval_s: float) -> bool:
    """A run submitted more than one plan interval ago that has not started: its nodes were taken
    by users between our read and sbatch (it pends at the lowest priority until it is cancelled)."""
    return run.state == "submitted" and now - run.submitted_at >= plan_interval_s


def jobs_in_flight(runs: Sequence[RunRow], now: float, plan_interval_s: float) -> int:
    """Backend jobs in flight (the runs of a combined job share one), less those ``waiting_for_nodes``."""
    return len({r.job_id or r.run_id for r in runs if not waiting_for_nodes(r, now, plan_interval_s)})


def _utc(ts: float) -> Any:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(ts, tz=UTC)


def run_daemon(config: str | Path | None) -> int:
    """``healthd run``: load settings (exit 2 on a bad config), start, serve until SIGTERM/SIGINT."""
    settings, path = load_settings(config)
    setup_logging(settings.logging.level, settings.logging.format)
    daemon = Daemon(settings, path)

    def on_signal(signum: int, frame: FrameType | None) -> None:
        if signum == signal.SIGHUP:
            daemon.request_reload()
        else:
            daemon.request_stop()

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, on_signal)
    daemon.start()
    daemon.run_forever()
    return 0


__all__ = ["Daemon", "SlurmError", "run_daemon"]
