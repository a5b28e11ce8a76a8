"""``python -m probes nccl_tests --bin-dir DIR``: run NVIDIA nccl-tests binaries, capture their output.

For sites that already build nccl-tests: each ``<collective>_perf`` binary of ``--bin-dir`` runs
once (argv list, own session, killed as a process group at the deadline) with
``-b MIN -e MAX -f FACTOR -g GPUS`` and the ``--extra-args``. ``probes`` does not import
``healthd``, so the output is not parsed here: it goes, raw, into ``params['raw_outputs']``, and
the daemon parses it with the same parser as ``healthd ingest --tool nccl-tests``
(``healthd.parsers.expand.expand_nccl_tests_result``). ``outcome`` says only whether every
binary ran and exited 0 (``pass``) or not (``error``, naming each binary and why); wrong data
and bandwidth are the daemon's to read from the output.

Launch: with one task on the node (``ranks_per_node = 1``, a plain build) ``-g`` defaults to
the visible GPU count; with several tasks per node (an MPI build under ``srun``, one task per
GPU) it defaults to 1 and every task runs the binaries, ``PMI_FD`` passed on, while only task
0 writes the document.

Raw output contract (read by ``expand_nccl_tests_result``): ``params['raw_outputs']`` is a list
with one object per binary, in the order run, with the keys ``collective``, ``program`` (the
file name), ``path``, ``argv``, ``exit_code`` (``None`` when not run or ended by a signal),
``signal`` (``"SIGSEGV"``...), ``timed_out``, ``error`` (empty when it ran and exited by
itself; else why: not found, not run, timed out, killed), ``seconds``, ``output`` (stdout and
stderr interleaved, undecodable bytes replaced), ``output_bytes`` (all it wrote) and
``lines_cut``. ``output`` keeps at most ``HEAD_BYTES`` + ``TAIL_BYTES``: ``NCCL INFO`` lines
past the first ``INFO_LINES_KEPT`` are dropped first, then the middle, where a ``# healthd:``
line says what was left out. ``params['tasks']`` (the job's task count) times
``params['gpus']`` (``-g``) is the rank count the output's device list must show;
``params['interrupted']`` is set when SIGTERM stopped the probe.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import os
import re
import selectors
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any, Literal, get_args

from probes.catalogue import ProbeName
from probes.dist import node_name
from probes.options import int_at_least, positive_float
from probes.report import emit, render
from probes.result import Outcome, ProbeResult
from probes.timing import process_start_time

NAME = ProbeName.NCCL_TESTS
HELP = "run nccl-tests binaries (<collective>_perf from --bin-dir) and capture their output for the daemon"

Collective = Literal[
    "all_reduce", "all_gather", "reduce_scatter", "alltoall", "broadcast", "reduce", "sendrecv", "gather",
    "scatter", "hypercube",
]  # fmt: skip
COLLECTIVES: tuple[str, ...] = get_args(Collective)

HEAD_BYTES = 256 * 1024
TAIL_BYTES = 256 * 1024
INFO_LINES_KEPT = 200
MAX_LINE_BYTES = 16 * 1024
KILL_GRACE_S = 2.0
"""Between SIGTERM and SIGKILL to a binary's process group."""
DRAIN_S = 2.0
"""After a binary exits, how long a process it left behind may keep the output pipe open."""
WRITE_MARGIN_S = 1.0
"""Reserved at the end of ``--timeout`` to write the document."""
POLL_S = 0.2
_UNITS = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3}
_SIZE = re.compile(r"^(\d{1,15})([KMG]?)B?$", re.IGNORECASE)
_RANK_VARS = ("SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "RANK")
_SIZE_VARS = ("SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE", "WORLD_SIZE")
_LOCAL_SIZE_VARS = ("SLURM_NTASKS_PER_NODE", "OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "LOCAL_WORLD_SIZE")
MAX_HOSTLIST = 100_000


# --------------------------------------------------------------------------- options


def parse_size(text: str) -> int:
    """Bytes from ``8``, ``64K``, ``1G`` (powers of 1024, as nccl-tests reads ``-b``/``-e``)."""
    m = _SIZE.match(text.strip())
    if not m:
        raise argparse.ArgumentTypeError(f"bad size {text!r} (a byte count with an optional K, M or G suffix)")
    return int(m.group(1)) * _UNITS[m.group(2).upper()]


def parse_collectives(text: str) -> tuple[str, ...]:
    names = tuple(dict.fromkeys(n.strip() for n in text.split(",") if n.strip()))
    unknown = [n for n in names if n not in COLLECTIVES]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown collective(s) {unknown}; known: {', '.join(COLLECTIVES)}")
    if not names:
        raise argparse.ArgumentTypeError("no collective given")
    return names


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("nccl_tests options")
    g.add_argument("--bin-dir", type=Path, required=True, help="directory of the nccl-tests binaries (build/)")
    g.add_argument("--collectives", type=parse_collectives, default=("all_reduce",),
                   help="comma-separated, each run as <name>_perf (default all_reduce)")
    g.add_argument("--min-bytes", type=parse_size, default=8, help="-b (default 8)")
    g.add_argument("--max-bytes", type=parse_size, default=1024**3, help="-e (default 1G)")
    g.add_argument("--factor", type=int_at_least(2), default=2, help="-f (default 2)")
    g.add_argument("--gpus", type=int_at_least(1), default=None,
                   help="-g (default: the visible GPUs with one task per node, else 1)")
    g.add_argument("--extra-args", action="append", default=[], metavar="ARGS",
                   help='more nccl-tests options, split like a shell would: --extra-args="-d bfloat16 -n 50"')


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser) -> None:
    """Add ``nccl_tests`` to ``python -m probes`` (``common``: the shared options' parent parser)."""
    p = sub.add_parser(NAME.value, parents=[common], help=HELP, description=HELP)
    add_arguments(p)


def build_parser() -> argparse.ArgumentParser:
    """The parser of ``python -m probes.nccl_tests`` (the same options without the dispatcher)."""
    p = argparse.ArgumentParser(prog="python -m probes.nccl_tests", description=HELP)
    p.add_argument("--timeout", type=positive_float, default=120.0,
                   help="seconds for every binary together (default 120)")
    p.add_argument("--run-id", default=None)
    p.add_argument("--output", default=None, help="write the result there (atomically) instead of stdout")
    p.add_argument("--format", choices=("json", "table"), default="json")
    add_arguments(p)
    return p


# --------------------------------------------------------------------------- environment


def _env_int(env: Mapping[str, str], names: Sequence[str]) -> int | None:
    for name in names:
        raw = env.get(name, "").strip()
        m = re.match(r"^(\d{1,9})", raw)
        if m:
            return int(m.group(1))
    return None


def task_rank(env: Mapping[str, str]) -> int:
    """This task's rank from Slurm, Open MPI, PMI or torchrun variables (0 when alone)."""
    return _env_int(env, _RANK_VARS) or 0


def visible_gpus(env: Mapping[str, str], proc_gpus: Path = Path("/proc/driver/nvidia/gpus")) -> int:
    cvd = env.get("CUDA_VISIBLE_DEVICES")
    if cvd is not None:
        entries = [d.strip() for d in cvd.split(",") if d.strip()]
        if not entries or entries[0] in ("-1", "NoDevFiles"):
            return 0
        return len(entries)
    try:
        return sum(1 for _ in proc_gpus.iterdir())
    except OSError:
        return 0


def default_gpus(env: Mapping[str, str], proc_gpus: Path = Path("/proc/driver/nvidia/gpus")) -> int:
    """``-g``: 1 with several tasks per node (one GPU each), else every visible GPU (at least 1)."""
    per_node = _env_int(env, _LOCAL_SIZE_VARS) or 1
    if per_node > 1:
        return 1
    return max(1, visible_gpus(env, proc_gpus))


def _split_top(text: str) -> list[str]:
    items: list[str] = []
    current: list[str] = []
    depth = 0
    for ch in text:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise ValueError(f"unbalanced ']' in host list {text!r}")
        if ch == "," and depth == 0:
            items.append("".join(current))
            current = []
        else:
            current.append(ch)
    if depth != 0:
        raise ValueError(f"unbalanced '[' in host list {text!r}")
    items.append("".join(current))
    return [i.strip() for i in items if i.strip()]


def _expand_item(item: str, budget: list[int]) -> list[str]:
    start = item.find("[")
    if start < 0:
        return [item]
    end = item.index("]", start)
    prefix, body, rest = item[:start], item[start + 1 : end], item[end + 1 :]
    tails = _expand_item(rest, budget)
    out: list[str] = []
    for part in body.split(","):
        lo, sep, hi = part.partition("-")
        if not lo.isdigit() or (sep and not hi.isdigit()):
            raise ValueError(f"bad range {part!r} in host list")
        numbers = range(int(lo), int(hi) + 1) if sep else range(int(lo), int(lo) + 1)
        budget[0] -= len(numbers) * len(tails)
        if budget[0] < 0:
            raise ValueError(f"host list expands to more than {MAX_HOSTLIST} names")
        out.extend(f"{prefix}{str(i).zfill(len(lo))}{tail}" for i in numbers for tail in tails)
    return out


def expand_hostlist(text: str) -> list[str]:
    """Slurm's compressed host list (``gpu[01-03,07],login1``) as names, in order."""
    budget = [MAX_HOSTLIST]
    out: list[str] = []
    for item in _split_top(text):
        out.extend(_expand_item(item, budget))
    return list(dict.fromkeys(out))


def job_nodes(env: Mapping[str, str]) -> list[str]:
    """The step's nodes from Slurm's node list, else this node."""
    raw = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
    if raw:
        with contextlib.suppress(ValueError):
            nodes = expand_hostlist(raw)
            if nodes:
                return nodes
    return [node_name(env)]


def _pass_fds(env: Mapping[str, str]) -> tuple[int, ...]:
    """``PMI_FD`` (srun --mpi=pmi2) must stay open in an MPI build's binary."""
    raw = env.get("PMI_FD", "")
    if raw.isdigit():
        fd = int(raw)
        with contextlib.suppress(OSError):
            os.fstat(fd)
            return (fd,)
    return ()


# --------------------------------------------------------------------------- capture


class OutputCapture:
    """A binary's output, bounded: the first ``head`` bytes, the last ``tail`` bytes, and at
    most ``info_lines`` ``NCCL INFO`` lines; the rest is counted."""

    def __init__(self, head: int = HEAD_BYTES, tail: int = TAIL_BYTES, info_lines: int = INFO_LINES_KEPT) -> None:
        self._head_limit, self._tail_limit, self._info_limit = head, tail, info_lines
        self._head: list[bytes] = []
        self._head_size = 0
        self._tail: collections.deque[bytes] = collections.deque()
        self._tail_size = 0
        self._partial = b""
        self._info = 0
        self.total_bytes = 0
        self.lines_cut = 0
        self.middle_cut = 0

    def feed(self, data: bytes) -> None:
        self.total_bytes += len(data)
        lines = (self._partial + data).split(b"\n")
        self._partial = lines.pop()
        for line in lines:
            self._line(line + b"\n")
        while len(self._partial) > MAX_LINE_BYTES:
            self._line(self._partial[:MAX_LINE_BYTES])
            self._partial = self._partial[MAX_LINE_BYTES:]

    def close(self) -> None:
        if self._partial:
            self._line(self._partial)
            self._partial = b""

    def _line(self, line: bytes) -> None:
        if b"NCCL INFO" in line:
            self._info += 1
            if self._info > self._info_limit:
                self.lines_cut += 1
                return
        if not self._tail and self._head_size + len(line) <= self._head_limit:
            self._head.append(line)
            self._head_size += len(line)
            return
        self._tail.append(line)
        self._tail_size += len(line)
        while self._tail_size > self._tail_limit and len(self._tail) > 1:
            dropped = self._tail.popleft()
            self._tail_size -= len(dropped)
            self.lines_cut += 1
            self.middle_cut += 1

    def text(self) -> str:
        marker = b""
        if self.middle_cut:
            marker = f"# healthd: {self.middle_cut} lines left out here\n".encode()
        return (b"".join(self._head) + marker + b"".join(self._tail)).decode("utf-8", errors="replace")


# --------------------------------------------------------------------------- running


@dataclass
class BinaryRun:
    collective: str
    program: str
    path: str
    argv: list[str]
    exit_code: int | None = None
    signal: str | None = None
    timed_out: bool = False
    error: str = ""
    seconds: float = 0.0
    output: str = ""
    output_bytes: int = 0
    lines_cut: int = 0

    @property
    def ok(self) -> bool:
        return not self.error and self.exit_code == 0

    def status(self) -> str:
        if self.error:
            return self.error
        return f"exited with status {self.exit_code}"


@dataclass
class _Stop:
    reason: str | None = None
    previous: dict[int, Any] = field(default_factory=dict)

    def handler(self, signum: int, frame: FrameType | None) -> None:
        self.reason = self.reason or f"terminated by {signal.Signals(signum).name}"

    def install(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT):
            self.previous[sig] = signal.signal(sig, self.handler)

    def restore(self) -> None:
        for sig, previous in self.previous.items():
            signal.signal(sig, previous)


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    """End ``proc`` (SIGTERM, then SIGKILL) and whatever else is left in its process group."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=KILL_GRACE_S)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def run_binary(
    collective: str,
    argv: list[str],
    *,
    timeout_s: float,
    stop: Callable[[], str | None] = lambda: None,
    env: Mapping[str, str] | None = None,
    pass_fds: Sequence[int] = (),
    capture: OutputCapture | None = None,
) -> BinaryRun:
    """Run one binary in its own session with stdout and stderr captured together; kill its
    process group after ``timeout_s`` or when ``stop()`` returns a reason."""
    run = BinaryRun(collective, Path(argv[0]).name, argv[0], list(argv))
    cap = capture or OutputCapture()
    start = time.monotonic()
    try:
        proc = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            env=dict(env) if env is not None else None, start_new_session=True, pass_fds=tuple(pass_fds),
        )  # fmt: skip
    except OSError as exc:
        run.error = f"cannot start {argv[0]}: {exc.strerror or exc}"
        return run
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    os.set_blocking(fd, False)
    stopped: str | None = None
    with selectors.DefaultSelector() as sel:
        sel.register(fd, selectors.EVENT_READ)
        exited_at: float | None = None
        eof = False
        try:
            while not eof:
                now = time.monotonic()
                if proc.poll() is not None:
                    exited_at = exited_at or now
                    if now - exited_at > DRAIN_S:
                        break
                elif now - start >= timeout_s:
                    run.timed_out = True
                    break
                elif (stopped := stop()) is not None:
                    break
                for _key, _events in sel.select(min(POLL_S, max(0.01, timeout_s - (now - start)))):
                    try:
                        chunk = os.read(fd, 65536)
                    except BlockingIOError:
                        continue
                    if not chunk:
                        eof = True
                        break
                    cap.feed(chunk)
        finally:
            _kill_group(proc)
            with contextlib.suppress(OSError):
                while chunk := os.read(fd, 65536):
                    cap.feed(chunk)
            proc.stdout.close()
    cap.close()
    run.seconds = round(time.monotonic() - start, 3)
    run.output, run.output_bytes, run.lines_cut = cap.text(), cap.total_bytes, cap.lines_cut
    code = proc.returncode
    if code is not None and code < 0:
        with contextlib.suppress(ValueError):
            run.signal = signal.Signals(-code).name
        run.signal = run.signal or f"signal {-code}"
    elif code is not None:
        run.exit_code = code
    if run.timed_out:
        run.exit_code = None
        run.error = f"did not finish within {timeout_s:.3g} s (killed)"
    elif stopped is not None:
        run.exit_code = None
        run.error = f"stopped: {stopped}"
    elif run.signal is not None:
        run.error = f"killed by {run.signal}"
    return run


def find_binary(bin_dir: Path, collective: str) -> tuple[Path, str]:
    """The binary for ``collective`` (``<name>_perf``, else ``<name>_perf_mpi``) and, when it
    cannot be run, why (naming the path)."""
    plain = bin_dir / f"{collective}_perf"
    if not bin_dir.is_dir():
        return plain, f"not run: {bin_dir} is not a directory"
    for candidate in (plain, bin_dir / f"{collective}_perf_mpi"):
        if candidate.exists():
            if candidate.is_dir() or not os.access(candidate, os.X_OK):
                return candidate, f"not run: {candidate} is not an executable file"
            return candidate, ""
    return plain, f"not run: {plain} not found (nor {plain.name}_mpi)"


def outcome_of(runs: Sequence[BinaryRun], interrupted: str | None) -> tuple[Outcome, str]:
    """``pass`` when every binary ran and exited 0; else ``error`` naming each one that did not."""
    problems = [f"{r.program}: {r.status()}" for r in runs if not r.ok]
    if interrupted:
        problems.insert(0, interrupted)
    if not runs:
        problems.append("no collective to run")
    if problems:
        return Outcome.ERROR, "; ".join(problems)
    return Outcome.PASS, ""


def format_table(result: ProbeResult) -> str:
    """Each binary's status line and its output, as nccl-tests printed it."""
    parts: list[str] = []
    for entry in result.params.get("raw_outputs", []):
        status = entry.get("error") or f"exit status {entry.get('exit_code')}"
        cut = f", {entry.get('lines_cut')} lines left out" if entry.get("lines_cut") else ""
        parts.append(f"# {entry.get('program')}: {status} in {entry.get('seconds', 0.0):.1f} s{cut}")
        output = str(entry.get("output", "")).rstrip("\n")
        if output:
            parts.append(output)
    return "\n".join(parts)


def run(args: argparse.Namespace) -> int:
    """Run the binaries; task 0 writes the document. Exit 0 when every binary exited 0, else 1;
    2 for options nccl-tests would refuse."""
    t0 = process_start_time()
    environ = dict(os.environ)
    if args.min_bytes > args.max_bytes:
        print(f"python -m probes {NAME}: --min-bytes is larger than --max-bytes", file=sys.stderr)
        return 2
    try:
        extra = [token for text in args.extra_args for token in shlex.split(text)]
    except ValueError as exc:
        print(f"python -m probes {NAME}: --extra-args: {exc}", file=sys.stderr)
        return 2
    timeout = float(args.timeout)
    deadline = t0 + timeout - WRITE_MARGIN_S
    gpus = args.gpus or default_gpus(environ)
    bin_dir: Path = args.bin_dir
    stop = _Stop()
    stop.install()
    runs: list[BinaryRun] = []
    try:
        for collective in args.collectives:
            binary, problem = find_binary(bin_dir, collective)
            argv = [str(binary), "-b", str(args.min_bytes), "-e", str(args.max_bytes), "-f", str(args.factor),
                    "-g", str(gpus), *extra]
            remaining = deadline - time.time()
            if not problem and stop.reason:
                problem = f"not run: {stop.reason}"
            if not problem and remaining <= 0:
                problem = f"not run: no time left of the {timeout:g} s timeout"
            if problem:
                runs.append(BinaryRun(collective, binary.name, str(binary) if binary.exists() else "", argv,
                                      error=problem))
                continue
            runs.append(run_binary(collective, argv, timeout_s=remaining, stop=lambda: stop.reason,
                                   pass_fds=_pass_fds(environ)))
    finally:
        stop.restore()
    outcome, reason = outcome_of(runs, stop.reason)
    if task_rank(environ) != 0:
        return 1 if outcome is Outcome.ERROR else 0
    params: dict[str, Any] = {
        "bin_dir": str(bin_dir),
        "collectives": list(args.collectives),
        "min_bytes": args.min_bytes,
        "max_bytes": args.max_bytes,
        "factor": args.factor,
        "gpus": gpus,
        "tasks": _env_int(environ, _SIZE_VARS) or 1,
        "extra_args": extra,
        "timeout_s": timeout,
        "raw_outputs": [asdict(r) for r in runs],
    }
    if stop.reason:
        params["interrupted"] = stop.reason
    result = ProbeResult(
        probe=NAME,
        run_id=args.run_id,
        outcome=outcome,
        reason=reason,
        started_at=t0,
        finished_at=time.time(),
        measure_seconds=sum(r.seconds for r in runs),
        nodes=job_nodes(environ),
        params=params,
    )
    emit(render(result, args.format, format_table), args.output)
    return 1 if outcome is Outcome.ERROR else 0


def main(argv: Sequence[str] | None = None) -> int:
    return run(build_parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
