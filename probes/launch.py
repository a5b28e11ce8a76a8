"""Standalone mode: spawn ``--nproc`` local ranks, watch them, hand on rank 0's document.

The ranks are ``python -m probes <same arguments>`` subprocesses with torchrun-style
variables, a rendezvous on 127.0.0.1 and a free port. They stay in this process's session
and process group, so whoever kills this launcher's group kills them too; they also get
``PR_SET_PDEATHSIG`` so they die if this process dies first. Rank 0 writes its JSON to a
private file; this process re-emits it (``--output``/``--format``).

When the daemon expects GPUs (``--expect-gpus``) and this node shows fewer, no rank is started:
the launcher writes the ``fail`` document itself (``probes.expect``). The launcher never imports
torch unless it must count GPUs. If rank 0 ends without a
document (crashed, or killed at the deadline), the launcher writes the ``error`` document
itself, naming each rank that exited abnormally or was still running.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import ctypes
import importlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from types import FrameType

from probes.context import ProbeModule
from probes.dist import LAUNCHER_ENV, node_name
from probes.expect import missing_gpus_result
from probes.report import emit, render, reserve_stdout
from probes.result import Outcome, ProbeResult
from probes.runner import RESULT_FILE_ENV, exit_code_of
from probes.timing import T0_ENV, budget_t0, process_start_time

LAUNCHER_MARGIN_S = 0.3
"""The launcher kills what is left this long before ``--timeout`` so its document is on time."""
RANK0_GRACE_S = 1.0
"""After rank 0 has finished, the other ranks get this long to exit by themselves."""
STDERR_TAIL = 20


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def default_nproc(device: str, environ: dict[str, str] | None = None) -> int:
    """The visible GPU count on CUDA (or ``auto`` with a driver), else 2.

    ``CUDA_VISIBLE_DEVICES`` when set, else NVML (``nvidia-ml-py``) when importable, else
    torch: the launcher avoids importing torch where it can (seconds of start-up)."""
    env = os.environ if environ is None else environ
    if device == "cpu":
        return 2
    fallback = 2 if device == "auto" else 1
    cvd = env.get("CUDA_VISIBLE_DEVICES")
    if cvd is not None:
        entries = [d for d in cvd.split(",") if d.strip()]
        if not entries or entries[0].strip() in ("-1", "NoDevFiles"):
            return fallback
        return len(entries)
    if not (os.path.exists("/dev/nvidiactl") or os.path.isdir("/proc/driver/nvidia/gpus")):
        return fallback
    try:
        pynvml = importlib.import_module("pynvml")
        pynvml.nvmlInit()
        count = int(pynvml.nvmlDeviceGetCount())
    except Exception:
        import torch

        count = int(torch.cuda.device_count())
    return count if count > 0 else fallback


def _set_pdeathsig() -> None:
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass


@dataclass
class Child:
    rank: int
    proc: subprocess.Popen[bytes]
    tail: collections.deque[str] = field(default_factory=lambda: collections.deque(maxlen=STDERR_TAIL))
    exited_at: float | None = None
    killed: bool = False
    """Stopped by the launcher at the deadline (not merely after rank 0 had finished)."""


def _pump(child: Child) -> None:
    assert child.proc.stderr is not None
    for raw in iter(child.proc.stderr.readline, b""):
        line = raw.decode("utf-8", "replace").rstrip("\n")
        child.tail.append(line)
        sys.stderr.write(f"[rank {child.rank}] {line}\n")
        sys.stderr.flush()


def _stop(children: Sequence[Child], *, at_deadline: bool = False) -> None:
    live = [c for c in children if c.proc.poll() is None]
    for c in live:
        c.killed = at_deadline
        with contextlib.suppress(ProcessLookupError):
            c.proc.send_signal(signal.SIGTERM)
    end = time.monotonic() + 2.0
    for c in live:
        try:
            c.proc.wait(timeout=max(0.05, end - time.monotonic()))
        except subprocess.TimeoutExpired:
            c.proc.kill()
            c.proc.wait()


def describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


def launcher_reason(children: Sequence[Child], timeout_s: float, rank0_silent: bool) -> str:
    """Why the probe ended without (or with an incomplete) document, culprits first.

    Lists the ranks that exited abnormally by themselves (rank 0 only when it left no
    document) and those still running at the deadline."""
    lines: list[str] = []
    by_exit = sorted(
        (
            c
            for c in children
            if c.exited_at is not None
            and not c.killed
            and c.proc.returncode not in (None, 0, -signal.SIGTERM, 143)
            and (rank0_silent or c.rank != 0)
        ),
        key=lambda c: (c.exited_at or 0.0, c.rank),
    )
    for c in by_exit:
        last = next((ln for ln in reversed(c.tail) if ln.strip()), "")
        lines.append(f"rank {c.rank} {describe_exit(c.proc.returncode or 0)}" + (f": {last}" if last else ""))
    stuck = [c.rank for c in children if c.killed]
    if stuck:
        lines.append(f"rank(s) {stuck} still running at the {timeout_s:g} s timeout (killed)")
    if rank0_silent and not lines:
        lines.append("rank 0 ended without writing a result")
    return "; ".join(lines)


def stop_on_signals(children: list[Child], tmpdir: str) -> threading.Event:
    """SIGTERM/SIGINT stop the ranks, remove ``tmpdir`` and exit 128+signal; the event is set first."""
    stopping = threading.Event()

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        stopping.set()
        _stop(children)
        shutil.rmtree(tmpdir, ignore_errors=True)
        os._exit(128 + signum)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    return stopping


def run_standalone(probe: ProbeModule, args: argparse.Namespace, argv: Sequence[str]) -> int:
    reserve_stdout()
    t0 = process_start_time()
    if args.expect_gpus and args.device != "cpu":
        missing = missing_gpus_result(
            probe.NAME.value, run_id=args.run_id, node=node_name(), want=args.expect_gpus,
            expected_uuids=args.expect_gpu_uuids, environ=os.environ, started_at=t0,
            params={"backend": args.backend, "device": args.device, "timeout_s": args.timeout},
        )
        if missing is not None:
            emit(render(missing, args.format, probe.format_table), args.output)
            return exit_code_of(missing.outcome)
    deadline = budget_t0(t0) + float(args.timeout) - LAUNCHER_MARGIN_S
    nproc = args.nproc or default_nproc(args.device)
    args.nproc = nproc
    tmpdir = tempfile.mkdtemp(prefix="healthd-probe-")
    result_file = os.path.join(tmpdir, "result.json")
    port = free_port()
    children: list[Child] = []
    stopping = stop_on_signals(children, tmpdir)
    child_argv = [sys.executable, "-m", "probes", *argv, "--nproc", str(nproc)]
    try:
        run_ranks(children, child_argv, nproc, port, t0, deadline, {RESULT_FILE_ENV: result_file})
        result = _read_result(result_file)
        rank0_silent = result is None
        if result is None:
            result = ProbeResult(
                probe=probe.NAME,
                run_id=args.run_id,
                outcome=Outcome.ERROR,
                reason=launcher_reason(children, float(args.timeout), True),
                started_at=t0,
                finished_at=time.time(),
                nodes=[node_name()],
                params={"nproc": nproc, "timeout_s": args.timeout, "backend": args.backend, "device": args.device},
            )
        elif result.outcome is Outcome.ERROR:
            extra = launcher_reason(children, float(args.timeout), rank0_silent)
            if extra:
                result = result.model_copy(update={"reason": f"{result.reason}; launcher: {extra}"})
        emit(render(result, args.format, probe.format_table), args.output)
        return exit_code_of(result.outcome)
    finally:
        if not stopping.is_set():
            _stop(children)
        shutil.rmtree(tmpdir, ignore_errors=True)


def run_ranks(children: list[Child], child_argv: Sequence[str], nproc: int, port: int, t0: float,
              deadline: float, extra_env: dict[str, str]) -> None:
    """Start ``nproc`` ranks of ``child_argv`` (appended to ``children`` as they start) and wait
    until they exit, rank 0 has been gone for :data:`RANK0_GRACE_S`, or ``deadline``."""
    for rank in range(nproc):
        env = dict(os.environ)
        env.update(
            {
                "RANK": str(rank),
                "WORLD_SIZE": str(nproc),
                "LOCAL_RANK": str(rank),
                "LOCAL_WORLD_SIZE": str(nproc),
                "GROUP_RANK": "0",
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(port),
                LAUNCHER_ENV: "standalone",
                T0_ENV: repr(t0),
                **extra_env,
            }
        )
        for var in ("TORCHELASTIC_USE_AGENT_STORE", "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_RUN_ID"):
            env.pop(var, None)
        proc = subprocess.Popen(
            child_argv,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=2,
            stderr=subprocess.PIPE,
            preexec_fn=_set_pdeathsig,
        )
        children.append(Child(rank=rank, proc=proc))
    pumps = [threading.Thread(target=_pump, args=(c,), daemon=True) for c in children]
    for p in pumps:
        p.start()

    rank0_done_at: float | None = None
    while True:
        now = time.time()
        for c in children:
            if c.exited_at is None and c.proc.poll() is not None:
                c.exited_at = now
        if all(c.exited_at is not None for c in children):
            break
        if rank0_done_at is None and children[0].exited_at is not None:
            rank0_done_at = now
        if rank0_done_at is not None and now - rank0_done_at > RANK0_GRACE_S:
            _stop(children)
            break
        if now >= deadline:
            _stop(children, at_deadline=True)
            break
        time.sleep(0.05)
    for p in pumps:
        p.join(timeout=1.0)


def read_result(path: str) -> ProbeResult | None:
    """The document at ``path``; ``None`` when there is none or it does not parse."""
    return _read_result(path)


def _read_result(path: str) -> ProbeResult | None:
    try:
        with open(path, encoding="utf-8") as f:
            return ProbeResult.model_validate_json(f.read())
    except (OSError, ValueError):
        return None
