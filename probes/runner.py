"""One rank's life: rendezvous, liveness, the probe body, the result document, the exit code.

Global rank 0 writes the one :class:`~probes.result.ProbeResult`; every other rank writes
nothing on stdout. Whatever ends the rank early (an exception, CUDA/NCCL error, a peer that
died or hung, ``--timeout``, SIGTERM from the launcher) goes through :meth:`RankSession.fail`,
which on rank 0 names the rank(s) at fault (:mod:`probes.liveness`) and still writes an
``error`` document; the exit code is then 1.

Time budget (``T`` = ``--timeout``, counted from the probe's start, or from the container launch
before it under a container launcher: :func:`probes.timing.budget_t0`; see
:func:`probes.timing.probe_t0`): the rank's watchdog fires at ``T - margin``; process-group
timeouts end a stuck collective two seconds before that, so the error text of the collective
is what gets reported; the standalone launcher kills whatever is left at ``T``.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn, cast, get_args

from probes import env as env_probe
from probes.context import ProbeContext, ProbeModule, ProbeOutput
from probes.dist import (
    Backend,
    DeviceType,
    LaunchInfo,
    init_process_group,
    resolve_backend,
    resolve_device,
)
from probes.expect import shortfall_text
from probes.faults import CRASH_EXIT_CODE, FaultKind, active_faults, faults_apply_to
from probes.gpus import gpu_slot, name_check_gpus, node_gpus
from probes.liveness import Liveness, diagnose, prefixed_client, tcp_store
from probes.report import emit, render, reserve_stdout
from probes.result import (
    NOT_RUN,
    Check,
    ContainerKind,
    ContainerStart,
    Environment,
    Outcome,
    ProbeResult,
    RankInfo,
)
from probes.timing import (
    CONTAINER_KIND_ENV,
    Deadline,
    budget_t0,
    container_setup_seconds,
    probe_t0,
    rank_margin_seconds,
)

RESULT_FILE_ENV = "HEALTHD_PROBE_RESULT_FILE"
"""Set by the standalone launcher: rank 0 writes its JSON document there instead of stdout."""
RESULT_DIR_ENV = "HEALTHD_PROBE_RESULT_DIR"
"""Set by the standalone launcher of a check: rank 0 writes each probe's document to ``<dir>/<probe>.json``."""

COLLECTIVE_TIMEOUT_LEAD_S = 2.0
FAILING_GRACE_S = 15.0


def log(msg: str) -> None:
    sys.stderr.write(f"[probes] {msg}\n")
    sys.stderr.flush()


def common_params(args: argparse.Namespace, launch: LaunchInfo) -> dict[str, Any]:
    return {
        "backend": args.backend,
        "device": args.device,
        "timeout_s": args.timeout,
        "expect_gpus": args.expect_gpus,
        "world_size": launch.world_size,
        "nproc": args.nproc if launch.launcher == "standalone" else None,
    }


def outcome_of(checks: list[Check]) -> Outcome:
    return Outcome.PASS if all(c.ok for c in checks) else Outcome.FAIL


def exit_code_of(outcome: Outcome) -> int:
    return 1 if outcome is Outcome.ERROR else 0


@dataclass(frozen=True)
class CheckPart:
    """One probe of a check (``python -m probes check``): its module and its own options."""

    probe: ProbeModule
    args: argparse.Namespace
    """As if the probe ran alone: its own options, run id, ``--timeout`` (its part's limit), ``--output``."""


class RankSession:
    """Shared state of one rank, and the single way out of it.

    A check runs several probes (:class:`CheckPart`) in one session: ``probe``/``args``/``params``
    are the current part's; ``later`` the parts not yet run (a failure gives each an ``error``
    document); ``check_timeout`` the whole check's ``--timeout`` (``None``: a single probe).
    """

    def __init__(self, probe: ProbeModule, args: argparse.Namespace, launch: LaunchInfo, *,
                 later: Sequence[CheckPart] = (), check_timeout: float | None = None,
                 check_params: dict[str, Any] | None = None) -> None:
        self.probe = probe
        self.args = args
        self.launch = launch
        started = probe_t0()
        self.container = container_start(started)
        self.t0 = budget_t0(started)
        total = float(args.timeout if check_timeout is None else check_timeout)
        self.check_timeout = check_timeout
        self.deadline = Deadline(self.t0 + total)
        self.rank_deadline = Deadline(self.deadline.at - rank_margin_seconds(total))
        self.later: list[CheckPart] = list(later)
        self.check_params = check_params
        self.part_t0 = self.t0
        self.part_deadline = self._part_deadline()
        self.part_ready_at: float | None = None
        """When the current part could start measuring: the shared start-up's end for the first."""
        self.params = common_params(args, launch)
        self.liveness: Liveness | None = None
        self.ranks: list[RankInfo] = []
        self.environment: Environment | None = None
        self.backend: Backend | None = None
        self.device_type: DeviceType | None = None
        self.pg_ready_at: float | None = None
        self.stage = "start-up: importing torch"
        """What this rank is doing before the liveness store exists (for error reasons)."""
        self._lock = threading.Lock()
        self._finished = False
        self._failing = False
        self._exit_code = 1
        self._parts_code = 0
        self.result_file = os.environ.get(RESULT_FILE_ENV)
        self.result_dir = os.environ.get(RESULT_DIR_ENV)

    # -- check parts -------------------------------------------------------------------------
    def _part_deadline(self) -> Deadline:
        if self.check_timeout is None:
            return self.rank_deadline
        return Deadline(min(self.rank_deadline.at, self.part_t0 + float(self.args.timeout)))

    def next_part(self) -> None:
        """Make the first of ``later`` the current part (a check), its clock starting now."""
        with self._lock:
            part = self.later.pop(0)
            self.probe, self.args = part.probe, part.args
            self.part_t0 = self.part_ready_at = time.time()
            self.container = None
            self.part_deadline = self._part_deadline()
            backend, device = self.params["backend"], self.params["device"]
            self.params = {**common_params(part.args, self.launch), "backend": backend, "device": device}
            if self.check_params is not None:
                self.params["check"] = {**self.check_params, "startup_shared": True}

    def _startup_seconds(self) -> float | None:
        return (self.part_ready_at - self.part_t0) if self.part_ready_at else None

    # -- the way out -------------------------------------------------------------------------
    def _write(self, result: ProbeResult, probe: ProbeModule | None = None,
               args: argparse.Namespace | None = None) -> None:
        probe, args = probe or self.probe, args or self.args
        if self.result_dir:
            emit(result.to_json() + "\n", os.path.join(self.result_dir, f"{probe.NAME.value}.json"))
        elif self.result_file:
            emit(result.to_json() + "\n", self.result_file)
        else:
            emit(render(result, args.format, probe.format_table), args.output)

    def part_error(self, reason: str) -> None:
        """The current part of a check could not run (its body raised on some rank): rank 0
        writes its ``error`` document; the check goes on with the next part."""
        with self._lock:
            if self._finished or self.launch.rank != 0:
                return
            self._parts_code = 1
            self._write(self._error_result(reason, self.environment))

    def _error_result(self, reason: str, environment: Environment | None) -> ProbeResult:
        """The current part's ``error`` document."""
        return ProbeResult(
            probe=self.probe.NAME,
            run_id=self.args.run_id,
            outcome=Outcome.ERROR,
            reason=reason,
            started_at=self.part_t0,
            finished_at=time.time(),
            startup_seconds=self._startup_seconds(),
            container=self.container,
            nodes=env_probe.nodes_in_order(self.ranks) if self.ranks else [self.launch.node],
            environment=environment,
            params=self.params,
        )

    def finish(self, output: ProbeOutput, measure_end: float, *, final: bool = True) -> int:
        """Write the normal document (rank 0) and return the exit code; ``final=False``: a part of
        a check that others follow."""
        with self._lock:
            if self._finished:
                return self._exit_code
            self._finished = final
            if self.launch.rank != 0:
                self._exit_code = 0
                return 0
            checks = list(output.checks)
            outcome = outcome_of(checks)
            reason = "; ".join(f"{c.name}: {c.detail}" for c in checks if not c.ok)
            if outcome is Outcome.PASS and output.skipped:
                outcome, reason = Outcome.SKIPPED, output.skipped
            result = ProbeResult(
                probe=self.probe.NAME,
                run_id=self.args.run_id,
                outcome=outcome,
                reason=reason,
                started_at=self.part_t0,
                finished_at=time.time(),
                startup_seconds=self._startup_seconds(),
            container=self.container,
                measure_seconds=(measure_end - self.part_ready_at) if self.part_ready_at else None,
                nodes=env_probe.nodes_in_order(self.ranks),
                environment=self.environment,
                params={**self.params, **output.params},
                measurements=output.measurements,
                checks=checks,
            )
            self._parts_code = max(self._parts_code, exit_code_of(outcome))
            self._exit_code = self._parts_code
            self._write(result)
            return self._exit_code

    def fail(self, reason: str, *, observe: bool = True) -> NoReturn:
        """End this rank with an error (from any thread); rank 0 writes the error document."""
        with self._lock:
            already, failing = self._finished, self._failing
            self._finished = self._failing = True
        if already:
            if failing:
                # Another thread is writing the error document and will exit; give it time.
                time.sleep(FAILING_GRACE_S)
            sys.stderr.flush()
            os._exit(self._exit_code)
        log(f"rank {self.launch.rank}: {reason}")
        if self.liveness is not None:
            self.liveness.report("err", reason)
        if self.launch.rank != 0:
            os._exit(1)
        text = reason if self.liveness is not None else f"{reason} (rank {self.launch.rank} was in {self.stage})"
        if observe and self.liveness is not None:
            try:
                diagnosis = diagnose(self.liveness.observe())
                if diagnosis.lines:
                    text = diagnosis.text
            except Exception as exc:
                text = f"{reason} (rank states unreadable: {type(exc).__name__}: {exc})"
        environment = self.environment or self._partial_environment()
        try:
            result = self._error_result(text, environment)
            nodes = result.nodes
            self._write(result)
            now = time.time()
            for part in self.later:
                self._write(ProbeResult(
                    probe=part.probe.NAME,
                    run_id=part.args.run_id,
                    outcome=Outcome.ERROR,
                    reason=f"{NOT_RUN}the check stopped in probe {self.probe.NAME.value}: {text}",
                    started_at=now,
                    finished_at=now,
                    nodes=nodes,
                    environment=environment,
                    params={**common_params(part.args, self.launch), "check": self.check_params},
                ), part.probe, part.args)
        except Exception:
            traceback.print_exc()
        sys.stderr.flush()
        os._exit(1)

    def _partial_environment(self) -> Environment | None:
        if self.backend is None or self.device_type is None:
            return None
        try:
            vers = env_probe.versions(self.device_type)
            return env_probe.build_environment(self.launch.launcher, self.backend, self.device_type, vers, self.ranks)
        except Exception:
            return None

    # -- threads -----------------------------------------------------------------------------
    def start_signal_thread(self) -> None:
        """SIGTERM is blocked in every thread (set before any thread exists) and taken here."""
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})

        def wait_term() -> None:
            signal.sigwait({signal.SIGTERM})
            if self.launch.rank != 0:
                if self.liveness is not None:
                    self.liveness.report("term", "SIGTERM")
                os._exit(143)
            self.fail("terminated by SIGTERM (the launcher stopped the probe)")

        threading.Thread(target=wait_term, name="healthd-sigterm", daemon=True).start()

    def start_watchdog(self) -> None:
        def watch() -> None:
            while (remaining := self.part_deadline.remaining()) > 0:
                time.sleep(min(remaining, 0.5))
            if self.check_timeout is not None and self.part_deadline.at < self.rank_deadline.at:
                self.fail(f"probe did not finish within its {self.args.timeout:g} s limit in the check")
            if self.check_timeout is not None:
                self.fail(f"check did not finish within its {self.check_timeout:g} s timeout")
            self.fail(f"probe did not finish within its {self.args.timeout:g} s timeout")

        threading.Thread(target=watch, name="healthd-watchdog", daemon=True).start()

    def on_peer_failure(self, summary: str) -> None:
        self.fail(f"stopped early: {summary}")

    def on_leader_lost(self) -> None:
        log(f"rank {self.launch.rank}: rank 0 is gone; exiting")
        self.fail("rank 0 is gone", observe=False)


def _cpu_threads(local_world_size: int) -> int:
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:
        cores = os.cpu_count() or 1
    return max(1, cores // max(1, local_world_size))


def run_rank(probe: ProbeModule, args: argparse.Namespace, launch: LaunchInfo) -> int:
    """Run ``probe`` as one rank of the job described by ``launch``; returns the exit code."""
    if not os.environ.get(RESULT_FILE_ENV):
        reserve_stdout()
    session = RankSession(probe, args, launch)
    session.start_signal_thread()
    session.start_watchdog()
    # CleanUpOnly: an NCCL error or timeout aborts the communicator and raises here instead
    # of tearing the process down (torchrun's default), so the error can still be reported.
    os.environ["TORCH_NCCL_ASYNC_ERROR_HANDLING"] = "2"
    try:
        return _run(session)
    except Exception as exc:
        session.fail(f"{type(exc).__name__}: {exc}".strip())
    except KeyboardInterrupt:
        session.fail("interrupted")


def container_start(t0: float, environ: Mapping[str, str] | None = None) -> ContainerStart | None:
    """The container's start-up before ``t0`` when a container launcher started this probe
    (:data:`probes.timing.CONTAINER_KIND_ENV` names a known kind and the launch time is set)."""
    env = os.environ if environ is None else environ
    kind = env.get(CONTAINER_KIND_ENV)
    setup = container_setup_seconds(t0, env)
    if setup is None or kind not in get_args(ContainerKind):
        return None
    return ContainerStart(kind=cast(ContainerKind, kind), setup_seconds=round(setup, 3))


def run_check_rank(parts: Sequence[CheckPart], check_timeout: float, launch: LaunchInfo,
                   check_params: dict[str, Any]) -> int:
    """Run the probes of a check as one rank: one start-up, then each part's body in turn."""
    if not os.environ.get(RESULT_FILE_ENV) and not os.environ.get(RESULT_DIR_ENV):
        reserve_stdout()
    first = parts[0]
    session = RankSession(first.probe, first.args, launch, later=parts[1:], check_timeout=check_timeout,
                          check_params=check_params)
    session.params["check"] = {**check_params, "startup_shared": False}
    session.start_signal_thread()
    session.start_watchdog()
    os.environ["TORCH_NCCL_ASYNC_ERROR_HANDLING"] = "2"
    try:
        return _run_check(session, parts)
    except Exception as exc:
        session.fail(f"{type(exc).__name__}: {exc}".strip())
    except KeyboardInterrupt:
        session.fail("interrupted")


@dataclass
class _Started:
    """What the start-up of a rank session leaves for the probe bodies."""

    device: Any
    gpu: int
    devices: list[Any]
    faults: frozenset[FaultKind]
    meta: Any
    liveness: Liveness


def _run(session: RankSession) -> int:
    started = _start(session, [CheckPart(session.probe, session.args)])
    output = _part(session, started, catch=False)
    assert output is not None
    code = session.finish(output, time.time())
    _close(started)
    return code


def _run_check(session: RankSession, parts: Sequence[CheckPart]) -> int:
    started = _start(session, parts)
    code = 0
    for index in range(len(parts)):
        if index:
            session.next_part()
        output = _part(session, started, catch=True)
        if output is not None:
            code = session.finish(output, time.time(), final=index == len(parts) - 1)
    _close(started)
    return max(code, session._parts_code)


def _start(session: RankSession, parts: Sequence[CheckPart]) -> _Started:
    """Everything before the probe bodies: device, rendezvous, liveness, process group, ranks."""
    args, launch = session.args, session.launch
    import torch
    import torch.distributed as dist

    gpus_short = None
    if args.expect_gpus and args.device != "cpu" and not torch.cuda.is_available():
        # No CPU fallback on a GPU node: this rank reports the shortfall once the others can hear it.
        # Fewer GPUs than expected but some: gpu_slot and the env.gpu_count check name them.
        gpus_short = shortfall_text(0, args.expect_gpus, args.expect_gpu_uuids)
    requested = "cuda" if args.expect_gpus and args.device == "auto" else args.device
    device_type = resolve_device("cpu" if gpus_short else requested, torch.cuda.is_available())
    backend = resolve_backend("gloo" if gpus_short else args.backend, device_type)
    session.device_type, session.backend = device_type, backend
    session.params.update({"backend": backend, "device": device_type})
    for part in parts:
        before_init = getattr(part.probe, "before_init", None)
        if before_init is not None:
            before_init(part.args, backend)
    if device_type == "cuda":
        slot = gpu_slot(launch.local_rank, launch.local_world_size, torch.cuda.device_count(), os.environ,
                        node_gpus())
        torch.cuda.set_device(slot.ordinal)
        device = torch.device("cuda", slot.ordinal)
        gpu = slot.physical
        physical_of = {slot.ordinal: slot.physical}
        uuid_of = {slot.ordinal: slot.uuid} if slot.uuid else {}
    else:
        if not os.environ.get("OMP_NUM_THREADS"):
            torch.set_num_threads(_cpu_threads(launch.local_world_size))
        device = torch.device("cpu")
        gpu = launch.local_rank
        physical_of, uuid_of = {}, {}
    faults = active_faults(launch.rank, node=launch.node, local_rank=launch.local_rank)

    session.stage = f"start-up: connecting to the store at {launch.master_addr}:{launch.master_port}"
    remaining = session.rank_deadline.remaining()
    base = tcp_store(
        launch.master_addr,
        launch.master_port,
        remaining,
        is_master=(launch.rank == 0 and not launch.agent_store),
    )
    liveness = Liveness(
        prefixed_client(launch.master_addr, launch.master_port, launch.store_prefix), launch.rank, launch.world_size
    )
    liveness.attach(dist.PrefixStore(launch.store_prefix, base))  # type: ignore[attr-defined]
    session.liveness = liveness
    liveness.start(session.on_peer_failure, session.on_leader_lost)
    liveness.mark("init")
    if gpus_short:
        session.fail(gpus_short)

    pg_timeout = session.rank_deadline.remaining() - COLLECTIVE_TIMEOUT_LEAD_S
    init_process_group(
        backend,
        dist.PrefixStore(f"{launch.store_prefix}/pg", base),  # type: ignore[attr-defined]
        launch.rank,
        launch.world_size,
        pg_timeout,
        device,
    )
    if backend == "gloo":
        meta = dist.group.WORLD
    else:
        from datetime import timedelta

        meta = dist.new_group(backend="gloo", timeout=timedelta(seconds=max(1.0, pg_timeout)))
    dist.barrier(group=meta)
    session.pg_ready_at = session.part_ready_at = time.time()

    liveness.mark("environment")
    if device_type == "cuda":
        from probes.env import cuda_devices

        devices = cuda_devices(physical_of, uuid_of)
    else:
        devices = []
    mine = env_probe.rank_info(launch, str(device), devices)
    session.ranks = [mine]
    gathered: list[Any] = [None] * launch.world_size
    dist.all_gather_object(gathered, mine.model_dump(), group=meta)
    session.ranks = [RankInfo.model_validate(r) for r in gathered]
    liveness.nodes = {r.rank: r.node for r in session.ranks}
    if launch.rank == 0:
        session.environment = env_probe.build_environment(
            launch.launcher, backend, device_type, env_probe.versions(device_type), session.ranks
        )
    return _Started(device=device, gpu=gpu, devices=devices, faults=faults, meta=meta, liveness=liveness)


def _part(session: RankSession, started: _Started, *, catch: bool) -> ProbeOutput | None:
    """One probe's body and its checks, on every rank; ``catch`` (a check): a body that raises on
    some rank gives this probe an ``error`` document (``None`` is returned) once every rank is
    through, instead of ending the session."""
    import torch.distributed as dist

    args, launch, liveness, meta = session.args, session.launch, started.liveness, started.meta
    assert session.device_type is not None and session.backend is not None
    faults = started.faults if not catch or faults_apply_to(session.probe.NAME.value) else frozenset()
    ctx = ProbeContext(
        args=args,
        launch=launch,
        device=started.device,
        device_type=session.device_type,
        backend=session.backend,
        gpu=started.gpu,
        gpu_uuid=next((d.uuid for d in started.devices if d.index == started.gpu), None),
        ranks=session.ranks,
        faults=faults,
        mark=liveness.mark,
        meta_group=meta,
        deadline_at=session.part_deadline.at,
    )
    liveness.mark("probe.start")
    if "crash" in faults:
        log(f"rank {launch.rank}: injected crash ({CRASH_EXIT_CODE})")
        os._exit(CRASH_EXIT_CODE)
    if "hang" in faults:
        log(f"rank {launch.rank}: injected hang")
        while True:
            time.sleep(3600)

    try:
        if "raise" in faults:
            raise RuntimeError("injected fault: the probe body raised")
        output = session.probe.run(ctx)
        raised = None
    except Exception as exc:
        if not catch:
            raise
        raised = f"{type(exc).__name__}: {exc}".strip()
        log(f"rank {launch.rank}: probe {session.probe.NAME.value} raised: {raised}")
        traceback.print_exc()
        output = ProbeOutput()
    liveness.mark("probe.end")
    if catch:
        errors = ctx.gather(raised)  # every rank through the body (or its exception) before a document
        if any(errors):
            session.part_error("; ".join(f"rank {r}: {e}" for r, e in enumerate(errors) if e))
            return None
    else:
        dist.barrier(group=meta)  # every rank got through the probe before a document says so
    env_checks, expected = env_probe.gpu_count_checks(session.ranks, args.expect_gpus, session.device_type,
                                                      args.expect_gpu_uuids)
    output.checks[:0] = env_checks
    output.checks = name_check_gpus(output.checks, session.ranks)
    if expected:
        output.params.setdefault("expected_gpus_per_node", expected)
    liveness.mark("finish")
    return output


def _close(started: _Started) -> None:
    import torch.distributed as dist

    started.liveness.report("done", "1")
    started.liveness.mark("done")
    dist.barrier(group=started.meta)
    started.liveness.stop()
    dist.destroy_process_group()
