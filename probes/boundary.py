"""The node check at job boundaries: ``python -m probes.boundary --context {prolog,epilog,health}``.

Slurm runs it on the compute node (``Prolog=``, ``Epilog=``, ``HealthCheckProgram=``: as root,
without a terminal, with ``SLURM_JOB_ID``, ``SLURM_JOB_UID``... set). It never calls a Slurm
command and imports nothing of the daemon: python start-up plus imports cost about 0.2 s
(pydantic for the result document), measured by ``tests/probes/test_boundary.py``.

Budget
------
Each context has a hard time budget counted from the process's start (``DEFAULT_BUDGET_S``;
``--budget`` or ``[node_check]`` in healthd.toml). A check runs only when its nominal cost fits in
what is left (less ``WRITE_RESERVE_S`` kept for the document); each tool call's timeout is what is
left; every tool and the short GEMM run in a process group of their own, killed whole at their
timeout; and a watchdog timer ends the process with exit 0 at the budget, whatever hangs, killing
those groups first (as does Slurm's SIGTERM when it ends the script: nothing of the check is
left). What does not fit is listed in the document's ``params.skipped`` with the reason.

Checks, cheapest first
----------------------
``gpus``      the GPUs the node must have are listed by ``nvidia-smi -L`` (else NVML), by count and by
              UUID; ``CUDA_VISIBLE_DEVICES`` is ignored (the node, not the job's share, is checked).
``leftover``  epilog only: a process still holding GPU memory
              (``nvidia-smi --query-compute-apps``) or, on any node, a live process of the job's user
              (``SLURM_JOB_UID``) after the job ended, unless its cgroup names another job.
``errors``    hard XIDs in the kernel log (``/dev/kmsg``) since the last check, NVSwitch errors (SXid lines of
              ``nvidia-nvswitch*``: a fatal one fails an NVSwitch system, a non-fatal one is a hint,
              ``nvswitch_sxid_nonfatal``), and row-remapping
              failures / pending remaps, volatile uncorrected ECC (``nvidia-smi --query-gpu``); skipped
              with the reason where the log or the tool is unavailable.
``links``     each InfiniBand port's error counters (``link_downed``, ``symbol_error``, ``port_rcv_errors``, ...),
              state, physical state and rate, and the PCIe link width and speed (current and maximum) of each
              NVIDIA GPU and HCA, read from sysfs (``probes.links``: file reads, no tool), and the node's boot
              time: absolute values (``ib_port_counter`` per ``device``, ``port`` and ``counter``,
              ``ib_port_state``, ``ib_port_phys_state``, ``ib_port_rate_bytes_per_second``, ``pcie_link_*``,
              ``boot_time_seconds``); the daemon computes the increases between documents and judges them.
``fabric``    on a node whose expectation says it is an NVSwitch system (``"nvswitch": true``: its class is
              marked ``nvswitch = true`` in ``[[slurm.node_classes]]``), each GPU's fabric state and status
              from NVML (``nvmlDeviceGetGpuFabricInfo``: what ``nvidia-smi -q`` shows as "Fabric", read
              without it): the measurements ``fabric_state`` (0 not supported, 1 not started, 2 in progress,
              3 completed) and ``fabric_status`` (the NVML return code of the fabric's registration, 0
              success) per ``gpu``. Absolute values: the daemon judges them (``fabric_manager``).
``gemm``      epilog and health only, when time is left and no other job runs on the node (no
              ``slurmstepd`` of another job): a short matmul per GPU (on a CPU node one small
              matmul) in a child process; its ``flop_per_second`` is judged by the daemon against
              the node's own series.

Exit status (what Slurm acts on: non-zero drains the node)
----------------------------------------------------------
``1`` only when the node is certainly broken: GPUs missing, a leftover process of the ended job
(holding GPU memory, or of the job's user), a hard XID, a row-remapping failure, a fatal SXid on an NVSwitch
system. ``0`` otherwise,
including every check that could not run (a missing tool, its own exception, bad options, a results
directory that cannot be written) and a check ended by a signal (Slurm's time limit for the script:
its document, when there is time to write it, is ``error`` with what was found so far dropped): the
reason is printed on stderr and, where possible, written in the document. A broken health check
never drains a healthy cluster.

The document
------------
One ``ProbeResult`` (probe ``boundary``) written atomically, mode 0644, owned by the results
directory's owner (the daemon refuses files of other owners) as
``<results_dir>/boundary-<node>-<context>-<job id or 0>-<unix ms>.json``; its ``run_id`` is the
file's stem. The daemon collects it as a run of kind ``boundary``.

Expectation
-----------
Slurm commands are forbidden here, so what the node must have comes from ``--expect-gpus`` /
``--expect-gpu-uuids``, else from the expectation file (``--expect-file``, default
``<results_dir>/expect/<node>.json``): ``{"gpus": 8, "gpu_uuids": ["GPU-…", …]}``, written by the
daemon at each discovery (``healthd.boundary``) or by the admin. Without any, the GPU count is not
judged (only recorded).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any, Literal, cast, get_args

from probes import links
from probes.dist import node_name
from probes.expect import missing, parse_uuid_list, shortfall_text, visible_of
from probes.gpus import NodeGpu, _nvml_gpus, parse_nvidia_smi_list
from probes.result import Check, Measurement, Outcome, ProbeResult
from probes.timing import process_start_time

PROBE = "boundary"
Context = Literal["prolog", "epilog", "health"]
CONTEXTS: tuple[Context, ...] = get_args(Context)
DEFAULT_BUDGET_S: dict[Context, float] = {"prolog": 5.0, "epilog": 30.0, "health": 45.0}
MAX_BUDGET_S = 600.0
HEALTH_MAX_BUDGET_S = 55.0
"""Slurm kills ``HealthCheckProgram`` at 60 s: a health budget above this is refused."""
WRITE_RESERVE_S = 0.3
"""Kept out of every check for writing the document."""
COST_S: dict[str, float] = {"gpus": 0.5, "leftover": 0.5, "errors": 0.5, "links": 0.2, "fabric": 0.5, "gemm": 3.0}
"""Nominal cost of each check: it runs only when this much is left."""
TOOL_TIMEOUT_S = 10.0
GEMM_SECONDS = 1.0
"""Measured time of the short GEMM per GPU (after a warm-up)."""
EXIT_OK, EXIT_BROKEN = 0, 1
HARD_XIDS = frozenset({48, 62, 64, 74, 79, 92, 94, 95, 119, 120, 123, 140})
"""XIDs NVIDIA's guide treats as a GPU or its memory failing (reset or service needed): 48 DBE, 62/119/120
firmware/GSP, 64 row-remap failure, 74 NVLink, 79 fell off the bus, 92 high SBE rate, 94/95 ECC
contained/uncontained, 123 SPI PMU, 140 ECC unrecovered."""
_XID = re.compile(r"NVRM: Xid \((?P<pci>[^)]*)\): (?P<xid>\d+)")
_SXID = re.compile(r"(?P<dev>nvidia-nvswitch\d+): SXid \((?P<pci>[^)]*)\): (?P<code>\d+), ?(?P<rest>.*)$")
MAX_SXIDS = 200
"""SXid records kept of one read (an NVSwitch logs several lines per event, many links at once)."""
STATE_DIR = Path("/run/healthd-node-check")
"""Where the last kernel-log record seen is kept (tmpfs: the kernel log starts afresh at boot too)."""
_JOB_CGROUP = re.compile(r"/job_(\d+)(/|$)")


class UsageError(Exception):
    """Bad options or configuration: said on stderr, exit 0 (never a drain)."""


@dataclass
class Findings:
    checks: list[Check] = field(default_factory=list)
    measurements: list[Measurement] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)
    """Checks that did not run, with the reason (budget, context, tool unavailable)."""
    errors: dict[str, str] = field(default_factory=dict)
    """Checks that tried to run and could not (their own fault, never the node's)."""
    info: dict[str, Any] = field(default_factory=dict)


class Budget:
    """The context's time budget, counted from ``t0`` (the process's start) on the monotonic clock."""

    def __init__(self, seconds: float, *, started_ago: float = 0.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.seconds = seconds
        self.clock = clock
        self.deadline = clock() - started_ago + seconds

    def left(self) -> float:
        """Seconds left for checks (the document's reserve excluded)."""
        return self.deadline - self.clock() - WRITE_RESERVE_S

    def elapsed(self) -> float:
        return self.seconds - (self.deadline - self.clock())

    def fits(self, cost: float) -> bool:
        return self.left() >= cost


@dataclass(frozen=True)
class Tool:
    """What a tool call gave: its exit status and output (``None``: no such tool)."""

    rc: int
    out: str
    err: str = ""


class ToolTimeout(Exception):
    pass


_groups: set[int] = set()
"""Process groups of the children running now (each child leads its own): the watchdog and a
termination signal kill them whole, so a stuck tool leaves nothing behind, its own children included."""


def kill_groups() -> None:
    """SIGKILL every child's process group still running (the watchdog's and a signal's last act)."""
    for pgid in list(_groups):
        with contextlib.suppress(OSError):
            os.killpg(pgid, signal.SIGKILL)


def run_group(argv: Sequence[str], timeout: float) -> subprocess.CompletedProcess[str]:
    """``argv`` in a process group of its own, its output captured; at ``timeout`` the whole group is
    killed (a tool's children too, which would otherwise hold its pipes open and outlive the check)
    and ``subprocess.TimeoutExpired`` raised."""
    proc = subprocess.Popen(list(argv), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, process_group=0)
    _groups.add(proc.pid)
    try:
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(OSError):
                os.killpg(proc.pid, signal.SIGKILL)  # the leader is not reaped yet: its group id is still ours
            proc.communicate()
            raise
    finally:
        _groups.discard(proc.pid)
    return subprocess.CompletedProcess(list(argv), proc.returncode, out, err)


def run_tool(argv: Sequence[str], timeout: float) -> Tool | None:
    """``argv`` with ``timeout`` (``run_group``); ``None`` when the program is not on ``PATH``."""
    exe = shutil.which(argv[0])
    if exe is None:
        return None
    if timeout <= 0:
        raise ToolTimeout(f"{argv[0]}: no time left")
    try:
        done = run_group([exe, *argv[1:]], timeout)
    except subprocess.TimeoutExpired:
        raise ToolTimeout(f"{argv[0]} did not answer within {timeout:.1f} s") from None
    return Tool(done.returncode, done.stdout, done.stderr)


# -- pure parts ---------------------------------------------------------------------------------

_DRIVER_DOWN = re.compile(r"couldn't communicate with the NVIDIA driver|No devices were found|Unable to determine "
                          r"the device handle", re.IGNORECASE)


def parse_compute_apps(text: str) -> list[tuple[int, float]]:
    """``nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader``: ``(pid, MiB)`` rows
    (``12345, 1024 MiB``; ``[N/A]`` memory is 0)."""
    out = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) < 2 or not parts[0].isdigit():
            continue
        mem = parts[1].split()[0] if parts[1] else ""
        out.append((int(parts[0]), float(mem) if re.fullmatch(r"\d+(\.\d+)?", mem) else 0.0))
    return out


@dataclass(frozen=True)
class GpuHealth:
    index: int
    uuid: str
    remap_pending: bool | None
    remap_failure: bool | None
    ecc_uncorrected: int | None


def _yes(value: str) -> bool | None:
    v = value.strip().lower()
    return True if v in ("yes", "1") else False if v in ("no", "0") else None


def _count(value: str) -> int | None:
    v = value.strip()
    return int(v) if v.isdigit() else None


HEALTH_QUERY = "index,uuid,remapped_rows.pending,remapped_rows.failure,ecc.errors.uncorrected.volatile.total"


def parse_gpu_health(text: str) -> list[GpuHealth]:
    """``nvidia-smi --query-gpu=<HEALTH_QUERY> --format=csv,noheader`` (``0, GPU-…, No, No, 0``;
    ``[N/A]`` where a GPU does not support a field)."""
    out = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 5 or not parts[0].isdigit():
            continue
        out.append(GpuHealth(int(parts[0]), parts[1], _yes(parts[2]), _yes(parts[3]), _count(parts[4])))
    return out


@dataclass(frozen=True)
class KernelXid:
    seq: int
    xid: int
    pci: str
    line: str


def kmsg_records(text: str) -> Iterator[tuple[int, str]]:
    """(sequence number, message) of each ``/dev/kmsg`` record (``<prio>,<seq>,<usec>,<flags>;<message>``)."""
    for line in text.splitlines():
        head, sep, message = line.partition(";")
        fields = head.split(",")
        if sep and len(fields) >= 2 and fields[1].isdigit():
            yield int(fields[1]), message


def parse_kmsg(text: str) -> list[KernelXid]:
    """XID records of ``/dev/kmsg`` lines (``<prio>,<seq>,<usec>,<flags>;NVRM: Xid (PCI:0000:3b:00): 79, …``)."""
    return [KernelXid(seq, int(m.group("xid")), m.group("pci"), message.strip()[:300])
            for seq, message in kmsg_records(text) if (m := _XID.search(message))]


@dataclass(frozen=True)
class KernelSxid:
    """One NVSwitch error (``nvidia-nvswitch3: SXid (PCI:0000:04:00.0): 22013, Non-fatal, Link 44 …``)."""

    seq: int
    switch: str
    pci: str
    code: int
    fatal: bool | None
    """``Fatal`` / ``Non-fatal`` as the driver wrote it; ``None`` where no line of the event says."""
    line: str


def parse_sxids(text: str, *, limit: int = MAX_SXIDS) -> list[KernelSxid]:
    """SXid records of ``/dev/kmsg`` lines, one per event (switch, PCI address, code): the driver writes an
    event as several lines (``…: 12028, Non-fatal, Link 32 egress non-posted PRIV error``, ``…: 12028, Severity 0
    Engine instance 32 …``, ``…: 12028, Data {0x…}``); its fatality is the one a line of it states. At most
    ``limit`` events (the first ones)."""
    events: dict[tuple[int, str, str, int], KernelSxid] = {}
    last: dict[tuple[str, str, int], tuple[int, str, str, int]] = {}
    for seq, message in kmsg_records(text):
        m = _SXID.search(message)
        if m is None:
            continue
        rest = m.group("rest").lower()
        fatal = True if rest.startswith("fatal") else False if rest.startswith("non-fatal") else None
        what = (m.group("dev"), m.group("pci"), int(m.group("code")))
        key = last.get(what)
        if key is None or (events[key].fatal is not None and fatal is not None):
            if len(events) >= limit:
                break
            key = (seq, *what)
            last[what] = key
            events[key] = KernelSxid(seq, what[0], what[1], what[2], fatal, message.strip()[:300])
        elif fatal is not None and events[key].fatal is None:
            events[key] = KernelSxid(events[key].seq, what[0], what[1], what[2], fatal, message.strip()[:300])
    return list(events.values())


def last_seq(text: str) -> int:
    seqs = [int(f[1]) for line in text.splitlines() if len(f := line.split(";", 1)[0].split(",")) >= 2
            and f[1].isdigit()]
    return max(seqs, default=-1)


@dataclass(frozen=True)
class Proc:
    pid: int
    uid: int
    comm: str
    state: str
    ppid: int
    cgroup: str


def read_proc(root: Path, pid: int) -> Proc | None:
    """One process of ``root`` (``/proc``), or ``None`` when it is gone or unreadable."""
    try:
        stat_text = (root / str(pid) / "stat").read_text(encoding="utf-8", errors="replace")
        status = (root / str(pid) / "status").read_text(encoding="utf-8", errors="replace")
        try:
            cgroup = (root / str(pid) / "cgroup").read_text(encoding="utf-8", errors="replace")
        except OSError:
            cgroup = ""
    except OSError:
        return None
    try:
        comm = stat_text[stat_text.index("(") + 1:stat_text.rindex(")")]
        rest = stat_text[stat_text.rindex(")") + 2:].split()
        uid_line = next(line for line in status.splitlines() if line.startswith("Uid:"))
        return Proc(pid, int(uid_line.split()[1]), comm, rest[0], int(rest[1]), cgroup)
    except (ValueError, IndexError, StopIteration):
        return None


def processes(root: Path) -> list[Proc]:
    try:
        pids = [int(p) for p in os.listdir(root) if p.isdigit()]
    except OSError:
        return []
    return [p for pid in pids if (p := read_proc(root, pid)) is not None]


def job_of(proc: Proc) -> int | None:
    """The Slurm job whose cgroup holds ``proc`` (``…/job_123/step_0…``), if any."""
    m = _JOB_CGROUP.search(proc.cgroup)
    return int(m.group(1)) if m else None


def leftovers(procs: Sequence[Proc], *, job_id: int | None, job_uid: int | None, exclude: set[int]) -> list[Proc]:
    """Live processes of the ended job: in its cgroup, or of its user (``job_uid``, not root) unless
    their cgroup names another job. Zombies, ``slurmstepd`` and ``exclude`` (the check and its
    ancestors) are never leftovers."""
    out = []
    for p in procs:
        if p.pid in exclude or p.state in ("Z", "X") or p.comm.startswith("slurmstepd"):
            continue
        job = job_of(p)
        in_job = job_id is not None and job == job_id
        of_user = job is None and job_uid is not None and job_uid != 0 and p.uid == job_uid
        if in_job or of_user:
            out.append(p)
    return out


_STEPD = re.compile(r"^slurmstepd: \[(\d+)\.")


def running_jobs(root: Path) -> set[int]:
    """The jobs a ``slurmstepd`` of this node serves (its command line: ``slurmstepd: [123.extern]``)."""
    jobs: set[int] = set()
    for p in processes(root):
        if not p.comm.startswith("slurmstepd"):
            continue
        try:
            cmdline = (root / str(p.pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if m := _STEPD.match(cmdline):
            jobs.add(int(m.group(1)))
    return jobs


def ancestors(root: Path, pid: int) -> set[int]:
    """``pid`` and its ancestors (the check, its wrapper, slurmd's child)."""
    seen: set[int] = set()
    while pid > 0 and pid not in seen:
        seen.add(pid)
        p = read_proc(root, pid)
        if p is None:
            break
        pid = p.ppid
    return seen


# -- the checks -----------------------------------------------------------------------------

@dataclass
class Setup:
    context: Context
    node: str
    job_id: int | None
    job_uid: int | None
    expect_gpus: int | None
    expect_uuids: tuple[str, ...]
    proc_root: Path = Path("/proc")
    kmsg: Path = Path("/dev/kmsg")
    state_dir: Path = STATE_DIR
    gemm: bool = True
    nvml: Callable[[], list[NodeGpu]] = _nvml_gpus
    nvswitch: bool = False
    """The expectation says this node is an NVSwitch system: its GPUs' fabric state is read."""
    fabric: Callable[[], list[FabricReading]] = lambda: _nvml_fabric()
    sys_root: Path = Path("/sys")


def check_gpus(s: Setup, budget: Budget, f: Findings) -> list[NodeGpu] | None:
    """The node's GPUs (``None``: unknown), and a failed ``env.gpu_count`` check when fewer than expected."""
    listing: list[NodeGpu] | None
    how = "nvidia-smi"
    tool = run_tool(["nvidia-smi", "-L"], min(TOOL_TIMEOUT_S, budget.left()))
    if tool is not None and tool.rc == 0:
        listing = parse_nvidia_smi_list(tool.out)
    elif tool is not None and _DRIVER_DOWN.search(tool.out + tool.err):
        listing = []
        f.info["nvidia_smi"] = (tool.out + tool.err).strip()[:300]
    else:
        listing, how = s.nvml(), "NVML"
        if not listing:
            listing = None
            if tool is not None:
                f.info["nvidia_smi"] = f"exit {tool.rc}: {(tool.out + tool.err).strip()[:300]}"
    visible = visible_of(listing, {}) if listing is not None else None
    if visible is None and listing == []:
        visible = []
    if visible is None:
        if s.expect_gpus:
            f.errors["gpus"] = "neither nvidia-smi nor NVML answered: the GPUs could not be counted"
        else:
            f.skipped["gpus"] = "no nvidia-smi or NVML on this node (a CPU node)"
        return None
    f.info["gpus_seen_by"] = how
    f.info["gpu_uuids"] = [g.uuid for g in visible]
    f.measurements.append(Measurement(name="visible_gpus", value=float(len(visible)), node=s.node))
    want = s.expect_gpus
    if want is None:
        f.skipped["gpus.expectation"] = "no expectation for this node (--expect-gpus or the expectation file)"
        return visible
    gone = missing(s.expect_uuids, [g.uuid for g in visible])
    if len(visible) < want or gone:
        f.checks.append(Check(name="env.gpu_count", ok=False, node=s.node,
                              detail=shortfall_text(len(visible), want, gone),
                              gpu_uuid=gone[0] if len(gone) == 1 else None))
    else:
        f.checks.append(Check(name="env.gpu_count", ok=True, node=s.node, detail=f"{len(visible)} GPU(s) visible"))
    return visible


def check_leftover(s: Setup, budget: Budget, f: Findings, gpus: list[NodeGpu] | None) -> None:
    exclude = ancestors(s.proc_root, os.getpid())
    procs = {p.pid: p for p in processes(s.proc_root)}
    if gpus:
        tool = run_tool(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader"],
                        min(TOOL_TIMEOUT_S, budget.left()))
        if tool is None or tool.rc != 0:
            f.errors["leftover.gpu"] = "nvidia-smi --query-compute-apps did not answer"
        else:
            apps = parse_compute_apps(tool.out)
            f.info["gpu_processes"] = len(apps)
            for pid, mib in apps:
                p = procs.get(pid)
                mine = p is not None and p in leftovers([p], job_id=s.job_id, job_uid=s.job_uid, exclude=exclude)
                if mine:
                    f.checks.append(Check(name="boundary.leftover_gpu_process", ok=False, node=s.node,
                                          detail=f"pid {pid} ({p.comm if p else '?'}) of the ended job "
                                                 f"{s.job_id} still holds {mib:g} MiB of GPU memory"))
    if s.job_uid is None and s.job_id is None:
        f.skipped["leftover.process"] = "no SLURM_JOB_UID or SLURM_JOB_ID: no job to look after"
        return
    found = leftovers(list(procs.values()), job_id=s.job_id, job_uid=s.job_uid, exclude=exclude)
    if found and budget.fits(0.5):
        time.sleep(0.3)  # a process of the job may still be exiting: only one that stays counts
        found = [p for p in found if (q := read_proc(s.proc_root, p.pid)) is not None and q.state not in ("Z", "X")]
    named = ", ".join(f"{p.pid} ({p.comm})" for p in found[:5])
    f.checks.append(Check(
        name="boundary.leftover_process", ok=not found, node=s.node,
        detail=f"{len(found)} process(es) of job {s.job_id} (uid {s.job_uid}) still running: {named}" if found
        else "no process of the ended job left"))


def check_errors(s: Setup, budget: Budget, f: Findings, gpus: list[NodeGpu] | None) -> None:
    _check_xids(s, f)
    if not gpus:
        f.skipped["errors.ecc"] = "no GPUs listed"
        return
    tool = run_tool(["nvidia-smi", f"--query-gpu={HEALTH_QUERY}", "--format=csv,noheader"],
                    min(TOOL_TIMEOUT_S, budget.left()))
    if tool is None or tool.rc != 0:
        f.errors["errors.ecc"] = "nvidia-smi --query-gpu did not answer"
        return
    pending = []
    for g in parse_gpu_health(tool.out):
        if g.remap_failure:
            f.checks.append(Check(name="boundary.row_remap_failure", ok=False, node=s.node, gpu=g.index,
                                  gpu_uuid=g.uuid, detail="row remapping failed: the GPU needs service"))
        if g.remap_pending:
            pending.append(g.index)
        if g.ecc_uncorrected:
            f.info.setdefault("ecc_uncorrected_volatile", {})[str(g.index)] = g.ecc_uncorrected
    if pending:
        f.info["row_remap_pending_gpus"] = pending  # a hint: a GPU reset applies it; never a drain by itself


def _check_xids(s: Setup, f: Findings) -> None:
    try:
        fd = os.open(s.kmsg, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        f.skipped["errors.xid"] = f"cannot read {s.kmsg}: {exc.strerror}"
        return
    chunks = []
    try:
        while True:
            try:
                chunk = os.read(fd, 8192)
            except BlockingIOError:
                break
            except OSError as exc:  # EPIPE: records overwritten while reading; go on
                if exc.errno == 32:
                    continue
                break
            if not chunk:
                break
            chunks.append(chunk.decode(errors="replace").rstrip("\n") + "\n")
    finally:
        os.close(fd)
    text = "".join(chunks)
    mark = s.state_dir / "kmsg-seq"
    try:
        since = int(mark.read_text().strip())
    except (OSError, ValueError):
        since = -1
    xids = [x for x in parse_kmsg(text) if x.seq > since]
    with contextlib.suppress(OSError):
        s.state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        mark.write_text(f"{max(last_seq(text), since)}\n")
    f.info["xids_since_last_check"] = sorted({x.xid for x in xids})
    hard = [x for x in xids if x.xid in HARD_XIDS]
    f.checks.append(Check(
        name="boundary.xid", ok=not hard, node=s.node,
        detail="; ".join(x.line for x in hard[:3]) if hard
        else f"no hard XID since the last check ({len(xids)} XID(s))"))
    _sxids(s, f, [x for x in parse_sxids(text) if x.seq > since])


def _sxids(s: Setup, f: Findings, sxids: list[KernelSxid]) -> None:
    """NVSwitch errors since the last check: a fatal one fails the node on an NVSwitch system (the switch needs
    a reset: NVLink traffic through it stalls); a non-fatal one, or one whose fatality no line states, is a
    hint (``nvswitch_sxid_nonfatal``, the events' count: the daemon asks for a probe of the node)."""
    fatal = [x for x in sxids if x.fatal and s.nvswitch]
    soft = [x for x in sxids if x not in fatal]
    if s.nvswitch:
        f.checks.append(Check(name="boundary.sxid", ok=not fatal, node=s.node,
                              detail="fatal NVSwitch error: " + "; ".join(x.line for x in fatal[:3]) if fatal
                              else f"no fatal SXid since the last check ({len(soft)} other)"))
    if not sxids:
        return
    f.info["sxids_since_last_check"] = sorted({x.code for x in sxids})
    if soft:  # on a node not marked an NVSwitch system, a fatal one too: the class decides what is a fault
        f.measurements.append(Measurement(name="nvswitch_sxid_nonfatal", value=float(len(soft)), node=s.node))
        f.info["sxid_hints"] = [x.line for x in soft[:5]]


@dataclass(frozen=True)
class FabricReading:
    """One GPU's fabric as NVML reports it (``nvmlGpuFabricInfo_t``)."""

    gpu: int
    uuid: str
    state: int
    """``NVML_GPU_FABRIC_STATE_*``: 0 not supported, 1 not started, 2 in progress, 3 completed."""
    status: int
    """The NVML return code of the GPU's registration with the fabric (0: success)."""
    clique: int | None = None


FABRIC_STATES = {0: "not supported", 1: "not started", 2: "in progress", 3: "completed"}


def _nvml_fabric() -> list[FabricReading]:
    """Each GPU's fabric info from NVML (raises what NVML raises: the check's own error, not the node's). A GPU
    whose driver does not support the query reads as state 0 (not supported)."""
    import ctypes

    nvml = importlib.import_module("pynvml")
    nvml.nvmlInit()
    try:
        out: list[FabricReading] = []
        for i in range(int(nvml.nvmlDeviceGetCount())):
            handle = nvml.nvmlDeviceGetHandleByIndex(i)
            uuid = nvml.nvmlDeviceGetUUID(handle)
            uuid = uuid.decode() if isinstance(uuid, bytes) else str(uuid)
            info = nvml.c_nvmlGpuFabricInfo_t()
            try:
                nvml.nvmlDeviceGetGpuFabricInfo(handle, ctypes.byref(info))
            except nvml.NVMLError as exc:
                if getattr(exc, "value", None) != nvml.NVML_ERROR_NOT_SUPPORTED:
                    raise
                out.append(FabricReading(i, uuid, 0, int(nvml.NVML_ERROR_NOT_SUPPORTED)))
                continue
            out.append(FabricReading(i, uuid, int(info.state), int(info.status), int(info.cliqueId)))
        return out
    finally:
        with contextlib.suppress(Exception):
            nvml.nvmlShutdown()


def check_fabric(s: Setup, budget: Budget, f: Findings, gpus: list[NodeGpu] | None) -> None:
    """Each GPU's fabric state and status as measurements (the daemon judges them); nothing on a node that is
    not an NVSwitch system."""
    if not s.nvswitch:
        f.skipped["fabric"] = "not an NVSwitch system (the expectation has no \"nvswitch\": true)"
        return
    readings = s.fabric()
    f.info["fabric"] = {str(r.gpu): f"{FABRIC_STATES.get(r.state, r.state)}, status {r.status}" for r in readings}
    f.info["fabric_gpu_uuids"] = {str(r.gpu): r.uuid for r in readings}
    for r in readings:
        labels = {"gpu": str(r.gpu)}
        f.measurements.append(Measurement(name="fabric_state", value=float(r.state), labels=labels, node=s.node))
        f.measurements.append(Measurement(name="fabric_status", value=float(r.status), labels=labels, node=s.node))


def check_links(s: Setup, budget: Budget, f: Findings, gpus: list[NodeGpu] | None) -> None:
    """Each InfiniBand port's counters, state and rate, and each GPU's and HCA's PCIe link, from sysfs
    (``probes.links``): absolute values as measurements, judged by the daemon (``ib_link_down``,
    ``ib_link_degraded``, ``pcie_downtrained``, ...); and the node's boot time, so that a reboot's fresh
    counters and link-downed rise are not read as a flap."""
    ports = links.read_ib_ports(s.sys_root)
    if not ports:
        f.skipped["links.infiniband"] = f"no InfiniBand device in {s.sys_root / 'class' / 'infiniband'}"
    for p in ports:
        where = {"device": p.device, "port": p.port}
        for counter, value in p.counters.items():
            f.measurements.append(Measurement(name="ib_port_counter", value=value, node=s.node,
                                              labels={**where, "counter": counter}))
        for name, reading in (("ib_port_state", p.state), ("ib_port_phys_state", p.phys_state),
                              ("ib_port_rate_bytes_per_second", p.rate)):
            if reading is not None:
                f.measurements.append(Measurement(name=name, value=float(reading), labels=where, node=s.node))
    if ports:
        f.info["ib_ports"] = {f"{p.device}/{p.port}": f"state {p.state}, phys {p.phys_state}, {p.rate_text or '?'}, "
                                                      f"{p.link_layer or '?'}" for p in ports}
    pcie = links.read_pcie(s.sys_root, {p.pci: p.device for p in ports if p.pci})
    if not pcie:
        f.skipped["links.pcie"] = "no NVIDIA GPU or HCA among the PCI devices"
    for d in pcie:
        where = {"gpu": d.name} if d.kind == "gpu" else {"device": d.name}
        for name, reading in (("pcie_link_width", d.width), ("pcie_link_max_width", d.max_width),
                              ("pcie_link_speed_gts", d.speed), ("pcie_link_max_speed_gts", d.max_speed)):
            if reading is not None:
                f.measurements.append(Measurement(name=name, value=reading, labels=where, node=s.node))
    if pcie:
        f.info["pcie"] = {d.pci: f"{d.kind} {d.name}: x{d.width or 0:g}/x{d.max_width or 0:g}, "
                                 f"{d.speed or 0:g}/{d.max_speed or 0:g} GT/s" for d in pcie}
    booted = links.boot_time(s.proc_root)
    if booted is not None and (ports or pcie):
        f.measurements.append(Measurement(name="boot_time_seconds", value=booted, node=s.node))


GEMM_CODE = """
import json, sys, time
import torch
budget = float(sys.argv[1])
end = time.monotonic() + budget
cuda = torch.cuda.is_available()
devices = [torch.device(f"cuda:{i}") for i in range(torch.cuda.device_count())] if cuda else [torch.device("cpu")]
out = []
for d in devices:
    n, dtype = (8192, torch.bfloat16) if cuda else (512, torch.float32)
    a = torch.randn(n, n, device=d, dtype=dtype); b = torch.randn(n, n, device=d, dtype=dtype)
    (a @ b); torch.cuda.synchronize(d) if cuda else None
    iters, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < min(%(seconds)s, max(0.05, end - time.monotonic() - 0.2)):
        a @ b; iters += 1
        if cuda: torch.cuda.synchronize(d)
    dt = time.perf_counter() - t0
    out.append({"gpu": d.index if cuda else None, "dtype": "bf16" if cuda else "fp32",
                "flops": 2.0 * n**3 * iters / dt})
print(json.dumps(out))
"""


def check_gemm(s: Setup, budget: Budget, f: Findings, gpus: list[NodeGpu] | None) -> None:
    """A short matmul in a child process (killed at the budget): ``flop_per_second`` per GPU, or one
    CPU figure without ``gpu`` label on a node without GPUs."""
    others = running_jobs(s.proc_root) - {s.job_id or 0}
    if others:
        jobs = ", ".join(map(str, sorted(others)[:5]))
        f.skipped["gemm"] = f"job(s) {jobs} run on this node: their GPUs are not ours"
        return
    left = budget.left()
    try:
        done = run_group([sys.executable, "-c", GEMM_CODE % {"seconds": GEMM_SECONDS}, f"{left - 0.5:.2f}"],
                         max(0.1, left))
    except subprocess.TimeoutExpired:
        f.errors["gemm"] = f"killed at the budget after {left:.1f} s"
        return
    if done.returncode != 0:
        tail = (done.stderr.strip().splitlines() or ["?"])[-1][:300]
        f.errors["gemm"] = f"the GEMM could not run: {tail}"
        return
    try:
        rows = json.loads(done.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        f.errors["gemm"] = "the GEMM printed no figure"
        return
    by_index = {g.index: g.uuid for g in gpus or []}
    for row in rows:
        labels = {"dtype": str(row["dtype"])}
        if row["gpu"] is not None:
            labels["gpu"] = str(row["gpu"])
        f.measurements.append(Measurement(name="flop_per_second", value=float(row["flops"]), labels=labels,
                                          node=s.node))
    f.info["gemm_gpu_uuids"] = {str(i): u for i, u in by_index.items()}


Step = tuple[str, Callable[[Setup, Budget, Findings, list[NodeGpu] | None], None], tuple[Context, ...]]


def run_checks(s: Setup, budget: Budget) -> Findings:
    """Every check of ``s.context`` that fits in ``budget``, cheapest first; one that raises is recorded
    in ``errors`` and the next goes on."""
    f = Findings()
    _findings[0] = f
    gpus: list[NodeGpu] | None = None
    if budget.fits(COST_S["gpus"]):
        _current[0] = "gpus"
        try:
            gpus = check_gpus(s, budget, f)
        except ToolTimeout as exc:
            f.errors["gpus"] = str(exc)
        except Exception as exc:
            f.errors["gpus"] = f"{type(exc).__name__}: {exc}"
    else:
        f.skipped["gpus"] = f"budget: {budget.left():.2f} s left, {COST_S['gpus']:g} s needed"
    steps: list[Step] = [("leftover", check_leftover, ("epilog",)), ("errors", check_errors, CONTEXTS),
                         ("links", check_links, CONTEXTS), ("fabric", check_fabric, CONTEXTS),
                         ("gemm", check_gemm, ("epilog", "health"))]
    for name, fn, contexts in steps:
        if s.context not in contexts:
            f.skipped[name] = f"not run in the {s.context} context"
            continue
        if name == "gemm" and not s.gemm:
            f.skipped[name] = "turned off (--no-gemm)"
            continue
        if not budget.fits(COST_S[name]):
            f.skipped[name] = f"budget: {max(0.0, budget.left()):.2f} s left, {COST_S[name]:g} s needed"
            continue
        _current[0] = name
        try:
            fn(s, budget, f, gpus)
        except ToolTimeout as exc:
            f.errors[name] = str(exc)
        except Exception as exc:
            f.errors[name] = f"{type(exc).__name__}: {exc}"
    _current[0] = "the document"
    return f


def broken(f: Findings) -> list[Check]:
    """The failed checks that make the node certainly broken (exit ``EXIT_BROKEN``)."""
    return [c for c in f.checks if not c.ok]


def result_of(s: Setup, f: Findings, budget: Budget, *, run_id: str, started_at: float) -> ProbeResult:
    bad = broken(f)
    if bad:
        outcome, reason = Outcome.FAIL, "; ".join(f"{c.name}: {c.detail}" for c in bad)[:1000]
    elif f.checks or f.measurements:
        outcome, reason = Outcome.PASS, ""
    else:
        outcome = Outcome.ERROR
        reason = "nothing could be checked: " + "; ".join(f"{k}: {v}" for k, v in {**f.errors, **f.skipped}.items())
    return ProbeResult(
        probe=PROBE, run_id=run_id, outcome=outcome, reason=reason[:1000], started_at=started_at,
        finished_at=time.time(), nodes=[s.node],
        params={"context": s.context, "job_id": s.job_id, "job_uid": s.job_uid, "budget_s": budget.seconds,
                "elapsed_s": round(budget.elapsed(), 3), "skipped": f.skipped, "errors": f.errors,
                "expect_gpus": s.expect_gpus, **f.info},
        measurements=f.measurements, checks=f.checks,
    )


def document_name(node: str, context: Context, job_id: int | None, started_at: float) -> str:
    """``boundary-<node>-<context>-<job id or 0>-<unix ms>`` (the run id, and the file's stem)."""
    return f"{PROBE}-{node}-{context}-{job_id or 0}-{int(started_at * 1000)}"


def write_document(directory: Path, name: str, text: str) -> Path:
    """``directory/name.json`` atomically, mode 0644, owned by the directory's owner (the daemon
    refuses a result of another owner; as root the check writes it as the daemon's user)."""
    st = os.stat(directory)
    fd, tmp = tempfile.mkstemp(prefix=".boundary-", suffix=".tmp", dir=directory)
    try:
        os.fchmod(fd, 0o644)
        if os.geteuid() == 0 and st.st_uid != 0:
            os.fchown(fd, st.st_uid, st.st_gid)
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(text)
            out.flush()
            os.fsync(out.fileno())
        path = directory / f"{name}.json"
        os.replace(tmp, path)
        return path
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


# -- options and configuration ---------------------------------------------------------------

DEFAULT_CONFIG = Path("/etc/healthd/healthd.toml")


def read_config(path: Path | None, explicit: bool) -> dict[str, Any]:
    """``[node_check]`` of healthd.toml (with ``[slurm].results_dir`` as ``results_dir`` when not set there)."""
    if path is None or (not explicit and not path.is_file()):
        return {}
    import tomllib

    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise UsageError(f"cannot read {path}: {exc}") from None
    section = dict(data.get("node_check", {}))
    results = data.get("slurm", {}).get("results_dir")
    if results:
        section["results_dir"] = results
    return section


def read_expectation(path: Path) -> tuple[int | None, tuple[str, ...]]:
    """``{"gpus": N, "gpu_uuids": [...]}`` (a missing file: no expectation)."""
    gpus, uuids, _ = read_expectation_file(path)
    return gpus, uuids


def read_expectation_file(path: Path) -> tuple[int | None, tuple[str, ...], bool]:
    """``{"gpus": N, "gpu_uuids": [...], "nvswitch": true}`` (a missing file: no expectation; ``nvswitch``
    absent: false)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None, (), False
    except (OSError, ValueError) as exc:
        raise UsageError(f"the expectation file {path} is unreadable: {exc}") from None
    if not isinstance(data, dict):
        raise UsageError(f"the expectation file {path} is not a JSON object")
    gpus = data.get("gpus")
    if gpus is not None and (not isinstance(gpus, int) or isinstance(gpus, bool) or gpus < 0):
        raise UsageError(f"{path}: 'gpus' must be a whole number >= 0")
    uuids = data.get("gpu_uuids", [])
    if not isinstance(uuids, list) or not all(isinstance(u, str) for u in uuids):
        raise UsageError(f"{path}: 'gpu_uuids' must be a list of GPU UUIDs")
    nvswitch = data.get("nvswitch", False)
    if not isinstance(nvswitch, bool):
        raise UsageError(f"{path}: 'nvswitch' must be true or false")
    try:
        return gpus, parse_uuid_list(",".join(uuids)), nvswitch
    except ValueError as exc:
        raise UsageError(f"{path}: {exc}") from None


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # never exit 2: Slurm drains on any non-zero status
        raise UsageError(message)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="python -m probes.boundary",
                description="healthd's node check at job boundaries (Slurm Prolog, Epilog, HealthCheckProgram)")
    p.add_argument("--context", choices=CONTEXTS, required=True)
    p.add_argument("--budget", type=float, default=None,
                   help="seconds for the whole check from process start (default: prolog 5, epilog 30, health 45)")
    p.add_argument("--results-dir", type=Path, default=None, help="where the document goes (default: from the config)")
    p.add_argument("--config", type=Path, default=None,
                   help="healthd.toml with a [node_check] section (default: $HEALTHD_CONFIG, else "
                        "/etc/healthd/healthd.toml if present)")
    p.add_argument("--expect-gpus", type=int, default=None, help="GPUs the node must show")
    p.add_argument("--expect-gpu-uuids", default=None, metavar="GPU-…,GPU-…")
    p.add_argument("--expect-file", type=Path, default=None,
                   help="JSON expectation (default <results_dir>/expect/<node>.json)")
    p.add_argument("--no-gemm", action="store_true", help="skip the short GEMM")
    p.add_argument("--stdout", action="store_true", help="print the document instead of writing it")
    return p


@dataclass(frozen=True)
class Options:
    setup: Setup
    budget_s: float
    results_dir: Path | None
    stdout: bool


def _int_env(environ: Mapping[str, str], name: str) -> int | None:
    raw = environ.get(name, "").strip()
    return int(raw) if raw.isdigit() else None


def options(argv: Sequence[str], environ: Mapping[str, str]) -> Options:
    args = build_parser().parse_args(list(argv))
    context = cast(Context, args.context)
    explicit = args.config is not None or bool(environ.get("HEALTHD_CONFIG"))
    config_path = args.config or (Path(environ["HEALTHD_CONFIG"]) if environ.get("HEALTHD_CONFIG") else DEFAULT_CONFIG)
    conf = read_config(config_path, explicit)
    budget = args.budget if args.budget is not None else conf.get(f"{context}_budget_s", DEFAULT_BUDGET_S[context])
    if not isinstance(budget, (int, float)) or isinstance(budget, bool) or not 0 < budget <= MAX_BUDGET_S:
        raise UsageError(f"the {context} budget must be a number of seconds in (0, {MAX_BUDGET_S:g}]")
    if context == "health" and budget > HEALTH_MAX_BUDGET_S:
        raise UsageError(f"the health budget must stay under Slurm's 60 s kill: at most {HEALTH_MAX_BUDGET_S:g} s")
    results = args.results_dir or (Path(conf["results_dir"]) if conf.get("results_dir") else None)
    if results is None and not args.stdout:
        raise UsageError("no results directory: give --results-dir or [slurm] results_dir in healthd.toml")
    node = node_name(environ)
    want: int | None = args.expect_gpus
    uuids: tuple[str, ...] = ()
    if args.expect_gpu_uuids:
        try:
            uuids = parse_uuid_list(args.expect_gpu_uuids)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
    nvswitch = False
    expect_file = args.expect_file or (results / "expect" / f"{node}.json" if results else None)
    if expect_file is not None and want is None:
        want, file_uuids, nvswitch = read_expectation_file(expect_file)
        uuids = uuids or file_uuids
    elif expect_file is not None:
        with contextlib.suppress(UsageError):  # --expect-gpus given: the file only for "nvswitch"
            nvswitch = read_expectation_file(expect_file)[2]
    if want is not None and want < 0:
        raise UsageError("--expect-gpus must be >= 0")
    setup = Setup(context=context, node=node, job_id=_int_env(environ, "SLURM_JOB_ID"),
                  job_uid=_int_env(environ, "SLURM_JOB_UID"), expect_gpus=want, expect_uuids=uuids,
                  gemm=not args.no_gemm and bool(conf.get("gemm", True)), nvswitch=nvswitch)
    return Options(setup, float(budget), results, args.stdout)


# -- main ----------------------------------------------------------------------------------------

_current = ["start-up"]


def _watchdog(signum: int, frame: FrameType | None) -> None:
    kill_groups()
    os.write(2, f"healthd node-check: budget exhausted in {_current[0]}; nothing more checked (exit 0)\n".encode())
    os._exit(EXIT_OK)


@dataclass(frozen=True)
class _Run:
    """What a termination signal needs to report the check it ends."""

    opts: Options
    budget: Budget
    started_at: float


_findings: list[Findings | None] = [None]
_run: list[_Run | None] = [None]


def terminated_document(run: _Run, partial: Findings | None, signum: int, where: str) -> ProbeResult:
    """The document of a check ended by a signal (Slurm's time limit for the script): ``error``, could
    not check, whatever the checks had found so far (a partial check never drains, not even by healthd:
    only its ``skipped`` and ``errors`` are kept)."""
    f = Findings(skipped=dict(partial.skipped) if partial else {}, errors=dict(partial.errors) if partial else {})
    f.errors[where] = (f"ended by signal {signum} after {run.budget.elapsed():.1f} s (Slurm's time limit for the "
                       "script, or a stop): not checked")
    return result_of(run.opts.setup, f, run.budget, run_id=doc_name(run), started_at=run.started_at)


def _terminated(signum: int, frame: FrameType | None) -> None:
    """The check is stopped (Slurm ended its script: see ``detach_from_script``): its tools' groups are
    killed and it writes an ``error`` document if it can."""
    kill_groups()
    where, said = _current[0], "no document"
    run = _run[0]
    if run is not None:
        with contextlib.suppress(Exception):
            doc = terminated_document(run, _findings[0], signum, where).to_json() + "\n"
            if run.opts.stdout or run.opts.results_dir is None:
                os.write(1, doc.encode())
                said = "an error document printed"
            else:
                said = f"error document {write_document(run.opts.results_dir, doc_name(run), doc)}"
    os.write(2, f"healthd node-check: ended by signal {signum} in {where}; {said} (exit 0)\n".encode())
    os._exit(EXIT_OK)


PR_SET_PDEATHSIG = 1


def detach_from_script() -> None:
    """Lead a process group of our own and be sent SIGTERM when the script that ran the check dies.

    Slurm ends a prolog or epilog past its time limit with SIGTERM to the script's process group (seen
    on 22.05, 24.11 and 26.05), then SIGKILL: in that group, the check could be killed before it ends
    its tools (in groups of their own) and reports. Out of it, the wrapper's death tells the check (Linux's parent-death
    signal), which kills its tools and writes its ``error`` document in its own time; its watchdog
    still ends it at the budget. Where this cannot be done (the check is its session's leader, no
    ``prctl``) it stays as it was; run from a terminal (stdin a tty: by hand, not by slurmd) it stays
    too, in the terminal's foreground group, where Ctrl-C reaches it."""
    with contextlib.suppress(OSError, ValueError):
        if sys.stdin is not None and sys.stdin.isatty():
            return
    with contextlib.suppress(OSError):
        if os.getpgid(0) != os.getpid():
            os.setpgid(0, 0)
    parent = os.getppid()
    try:
        import ctypes

        if ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM) != 0:
            return
    except (OSError, AttributeError):
        return
    _pdeathsig[0] = True
    if os.getppid() != parent:  # the script died before the parent-death signal was set
        os.kill(os.getpid(), signal.SIGTERM)


_pdeathsig = [False]


def _attach_again() -> None:
    """No parent-death signal any more (``main`` returns to an in-process caller)."""
    if _pdeathsig[0]:
        import ctypes

        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, 0)
        _pdeathsig[0] = False


def doc_name(run: _Run) -> str:
    s = run.opts.setup
    return document_name(s.node, s.context, s.job_id, run.started_at)


def main(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None, *, detach: bool = True) -> int:
    """The check; ``detach``: leave the script's process group first (``detach_from_script``)."""
    env = os.environ if environ is None else environ
    started_at = process_start_time()
    try:
        opts = options(sys.argv[1:] if argv is None else argv, env)
    except UsageError as exc:
        print(f"healthd node-check: not run: {exc} (exit 0: a check that cannot run never drains)", file=sys.stderr)
        return EXIT_OK
    budget = Budget(opts.budget_s, started_ago=max(0.0, time.time() - started_at))
    if budget.deadline - time.monotonic() <= 0:
        print("healthd node-check: the budget was spent before the check started (exit 0)", file=sys.stderr)
        return EXIT_OK
    _run[0], _findings[0] = _Run(opts, budget, started_at), None
    previous = {sig: signal.signal(sig, _terminated) for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    signal.signal(signal.SIGALRM, _watchdog)
    if detach:
        detach_from_script()
    signal.setitimer(signal.ITIMER_REAL, max(0.01, budget.deadline - time.monotonic()))
    try:
        s = opts.setup
        findings = run_checks(s, budget)
        name = document_name(s.node, s.context, s.job_id, started_at)
        result = result_of(s, findings, budget, run_id=name, started_at=started_at)
        for check, why in findings.errors.items():
            print(f"healthd node-check: {check} could not run: {why}", file=sys.stderr)
        for c in broken(findings):
            print(f"healthd node-check: FAIL {c.name}: {c.detail}", file=sys.stderr)
        if opts.stdout or opts.results_dir is None:
            sys.stdout.write(result.to_json() + "\n")
        else:
            try:
                write_document(opts.results_dir, name, result.to_json() + "\n")
            except OSError as exc:
                print(f"healthd node-check: the document could not be written to {opts.results_dir}: {exc}",
                      file=sys.stderr)
        return EXIT_BROKEN if broken(findings) else EXIT_OK
    except Exception as exc:  # the check's own bug: said, never a drain
        print(f"healthd node-check: internal error {type(exc).__name__}: {exc} (exit 0)", file=sys.stderr)
        return EXIT_OK
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        _attach_again()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        _run[0] = None


if __name__ == "__main__":
    sys.exit(main())
