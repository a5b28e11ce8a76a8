"""The ``nccl`` probe: collective bandwidth the way nccl-tests measures it, with torch.distributed.

For every collective, size and placement:

1. ``--warmup`` untimed operations;
2. device sync and a barrier in the group, then ``--iters`` operations enqueued back to back
   and one device sync: the window divided by ``iters`` is the rank's mean time per op
   (nccl-tests' ``time``); the reported ``time_seconds`` is the average of the ranks' means
   (nccl-tests ``-a 1``), each rank's mean is kept in ``per_rank``;
3. ``algbw = S / t`` and ``busbw = algbw * factor`` with nccl-tests' ``S`` and factor
   (:func:`sizing`, :func:`bus_factor`); ``size_bytes`` is nccl-tests' ``size`` column;
4. validation: the buffers are refilled with exact small integers (:func:`pattern`), one more
   op runs, and every output element is compared with its exact expected value; the count of
   wrong elements is summed over the group (nccl-tests ``#wrong``). Any wrong element fails.

Placements: torch.distributed has no out-of-place ``all_reduce`` or ``broadcast`` (both work
on one tensor), and in-place ``alltoall``/``sendrecv`` would alias send and receive buffers;
those combinations are not measured and are listed in ``params["unmeasured"]``.

Scopes: ``node`` (one group per node; the default when all ranks share a node), ``group``
(all ranks; the default across nodes), ``rail`` (one group per local rank index across nodes,
like ``NCCL_TESTS_SPLIT="AND 0x7"``). Groups of one scope run concurrently.

Network path: :func:`before_init` (called by the runner before NCCL starts) sets ``NCCL_DEBUG=INFO``
and ``NCCL_DEBUG_SUBSYS=INIT,NET`` unless the site set them, and points ``NCCL_DEBUG_FILE`` at a
per-rank file in a private temporary directory. After the measurements every rank keeps the lines
that say which network, plugin, NICs and intra-node transports NCCL chose (:func:`select_debug_lines`,
bounded) and rank 0 puts them in ``params["nccl_debug"]``; the daemon parses and judges them
(``healthd.parsers.nccl_transport``). ``--expect-transport`` is only recorded, for the daemon.
With gloo there is no NCCL: ``params["nccl_debug"]`` says so.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import socket
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, get_args

from probes.catalogue import ProbeName
from probes.context import ProbeContext, ProbeOutput
from probes.faults import SLOW_FACTOR
from probes.result import Check, Measurement, ProbeResult
from probes.timing import mean

if TYPE_CHECKING:
    import torch

NAME = ProbeName.NCCL
HELP = "collective bandwidth (algbw/busbw) and correctness, nccl-tests style"

Collective = Literal["all_reduce", "all_gather", "reduce_scatter", "alltoall", "broadcast", "sendrecv"]
Placement = Literal["out_of_place", "in_place"]
Scope = Literal["node", "group", "rail"]
COLLECTIVES: tuple[Collective, ...] = get_args(Collective)
PLACEMENTS: tuple[Placement, ...] = get_args(Placement)

SUPPORTED_PLACEMENTS: dict[Collective, tuple[Placement, ...]] = {
    "all_reduce": ("in_place",),
    "broadcast": ("in_place",),
    "all_gather": ("out_of_place", "in_place"),
    "reduce_scatter": ("out_of_place", "in_place"),
    "alltoall": ("out_of_place",),
    "sendrecv": ("out_of_place",),
}
UNSUPPORTED_WHY = {
    "all_reduce": "torch.distributed.all_reduce works in place only",
    "broadcast": "torch.distributed.broadcast works in place only",
    "alltoall": "in-place alltoall would alias send and receive buffers",
    "sendrecv": "in-place sendrecv would alias send and receive buffers",
}

DTYPES: dict[str, tuple[str, int, int]] = {
    # name: (nccl-tests type name, bytes, largest integer all smaller ones are exact up to)
    "float32": ("float", 4, 2**24),
    "float16": ("half", 2, 2**11),
    "bfloat16": ("bfloat16", 2, 2**8),
    "float64": ("double", 8, 2**53),
    "int32": ("int32", 4, 2**31 - 1),
}

GPU_SIZES = (8 << 10, 64 << 20, 1 << 30)
CPU_SIZES = (8 << 10, 4 << 20)
VALIDATE_CHUNK = 1 << 24

_SIZE_RE = re.compile(r"^\s*(\d+)\s*([kmgt]?)(i?b)?\s*$", re.IGNORECASE)


def parse_size(text: str) -> int:
    """``8K``, ``64M``, ``1G``, ``4096``, ``8KiB``: binary multiples, as nccl-tests' ``-b/-e``."""
    m = _SIZE_RE.match(text)
    if not m:
        raise ValueError(f"bad size {text!r}: expected e.g. 8K, 64M, 1G or a byte count")
    return int(m.group(1)) << {"": 0, "k": 10, "m": 20, "g": 30, "t": 40}[m.group(2).lower()]


def parse_sizes(text: str) -> list[int]:
    sizes = [parse_size(t) for t in text.split(",") if t.strip()]
    if not sizes or any(s <= 0 for s in sizes):
        raise argparse.ArgumentTypeError(f"bad size list {text!r}")
    return sizes


def _sizes_arg(text: str) -> list[int]:
    try:
        return parse_sizes(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _collectives_arg(text: str) -> list[Collective]:
    names = [t.strip() for t in text.split(",") if t.strip()]
    if names == ["all"]:
        return list(COLLECTIVES)
    bad = [n for n in names if n not in COLLECTIVES]
    if bad or not names:
        raise argparse.ArgumentTypeError(f"unknown collective(s) {bad}; choose from {', '.join(COLLECTIVES)}")
    return list(dict.fromkeys(names))  # type: ignore[arg-type]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--collectives",
        type=_collectives_arg,
        default=["all_reduce"],
        help=f"comma list from {','.join(COLLECTIVES)} or 'all' (default all_reduce)",
    )
    parser.add_argument(
        "--sizes",
        type=_sizes_arg,
        default=None,
        help="comma list of nccl-tests sizes, e.g. 8K,64M,1G (default: 8K,64M,1G on GPU; 8K,4M on CPU)",
    )
    parser.add_argument("--warmup", type=int, default=5, help="untimed ops per size (default 5)")
    parser.add_argument("--iters", type=int, default=20, help="timed ops per size (default 20)")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="float32", help="element type")
    parser.add_argument(
        "--scope",
        choices=get_args(Scope),
        default=None,
        help="node: a group per node; group: all ranks; rail: a group per local GPU index "
        "(default: node on one node, group across nodes)",
    )
    parser.add_argument(
        "--expect-transport",
        type=_names_arg,
        default=[],
        help="comma list of the NCCL networks this node class should use (IB, OFI, Socket...); "
        "recorded for the daemon, which judges it",
    )


def _names_arg(text: str) -> list[str]:
    names = [t.strip() for t in text.split(",") if t.strip()]
    if not names or any(not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9 _./-]*", n) for n in names):
        raise argparse.ArgumentTypeError(f"bad transport list {text!r}: e.g. IB,OFI")
    return names


# -- arithmetic (nccl-tests src/*.cu *GetCollByteCount / *GetBw) --------------------------------


@dataclass(frozen=True)
class Sizing:
    count: int
    """Elements per rank (nccl-tests' ``count`` column; per peer for alltoall)."""
    size_bytes: int
    """nccl-tests' ``size`` column after rounding to whole elements per rank."""
    algbw_bytes: int
    """``S`` in ``algbw = S / t``."""
    in_elems: int
    out_elems: int


def sizing(collective: Collective, size_bytes: int, n: int, typesize: int) -> Sizing:
    if collective in ("all_gather", "reduce_scatter", "alltoall"):
        per = size_bytes // (n * typesize)
        total = per * n
        in_elems = per if collective == "all_gather" else total
        out_elems = per if collective == "reduce_scatter" else total
        return Sizing(per, total * typesize, total * typesize, in_elems, out_elems)
    count = size_bytes // typesize
    return Sizing(count, count * typesize, count * typesize, count, count)


def bus_factor(collective: Collective, n: int) -> float:
    if collective == "all_reduce":
        return 2.0 * (n - 1) / n
    if collective in ("all_gather", "reduce_scatter", "alltoall"):
        return (n - 1) / n
    return 1.0


# -- exact-integer data -----------------------------------------------------------------------


@dataclass(frozen=True)
class Pattern:
    """Rank at group position ``p`` holds ``((i + shift(p)) mod K) + 1`` at element ``i``
    (or, when even ``n`` ones would not sum exactly, ``1`` where ``(i + p) mod n == 0``)."""

    k: int
    onehot: bool = False

    def shift(self, p: int) -> int:
        return (7 * p) % self.k


def pattern_for(dtype: str, n: int, reducing: bool) -> Pattern:
    limit = DTYPES[dtype][2]
    if not reducing:
        return Pattern(k=min(251, limit))
    k = min(16, limit // n)
    if k >= 1:
        return Pattern(k=k)
    return Pattern(k=1, onehot=True)


def pattern_values(pat: Pattern, n: int, p: int, start: int, length: int, device: Any) -> torch.Tensor:
    """int64 values of position ``p``'s buffer at indices ``[start, start+length)``."""
    import torch

    i = torch.arange(start, start + length, device=device, dtype=torch.int64)
    if pat.onehot:
        return ((i + p) % n == 0).to(torch.int64)
    return (i + pat.shift(p)) % pat.k + 1


def reduced_values(pat: Pattern, n: int, start: int, length: int, device: Any) -> torch.Tensor:
    """Sum over all ``n`` positions of :func:`pattern_values`, in ``O(k)`` passes."""
    import torch

    if pat.onehot:
        return torch.ones(length, device=device, dtype=torch.int64)
    counts: dict[int, int] = defaultdict(int)
    for p in range(n):
        counts[pat.shift(p)] += 1
    i = torch.arange(start, start + length, device=device, dtype=torch.int64)
    total = torch.zeros(length, device=device, dtype=torch.int64)
    for shift, c in counts.items():
        total += c * ((i + shift) % pat.k + 1)
    return total


def fill(t: torch.Tensor, fn: Callable[[int, int], torch.Tensor]) -> None:
    """Fill 1-D ``t`` chunk by chunk from ``fn(start, length)``."""
    for start in range(0, t.numel(), VALIDATE_CHUNK):
        length = min(VALIDATE_CHUNK, t.numel() - start)
        t[start : start + length].copy_(fn(start, length))


def count_wrong(t: torch.Tensor, fn: Callable[[int, int], torch.Tensor]) -> int:
    """Elements of 1-D ``t`` that differ from ``fn(start, length)`` (NaN counts as wrong)."""
    wrong = 0
    for start in range(0, t.numel(), VALIDATE_CHUNK):
        length = min(VALIDATE_CHUNK, t.numel() - start)
        expected = fn(start, length).to(t.dtype)
        wrong += int((t[start : start + length] != expected).sum().item())
    return wrong


# -- one collective ----------------------------------------------------------------------------


@dataclass
class Group:
    members: list[int]
    """Global ranks, in group order."""
    handle: Any
    """The torch ProcessGroup (``None``: the default group)."""
    rail: int | None = None

    @property
    def n(self) -> int:
        return len(self.members)


@dataclass
class Case:
    """Buffers, the op and its validation for one collective/size/placement on one rank."""

    op: Callable[[], None]
    prepare: Callable[[], None]
    """Fill the inputs (and clear the outputs) for validation."""
    output: torch.Tensor
    expected: Callable[[int, int], torch.Tensor]


def make_case(
    collective: Collective,
    placement: Placement,
    sz: Sizing,
    group: Group,
    position: int,
    dtype: torch.dtype,
    dtype_name: str,
    device: torch.device,
) -> Case:
    import torch
    import torch.distributed as dist

    n, p, c, g = group.n, position, sz.count, group.handle
    dev = device
    all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    red = pattern_for(dtype_name, n, reducing=True)
    plain = pattern_for(dtype_name, n, reducing=False)

    def empty(elems: int) -> torch.Tensor:
        return torch.zeros(elems, dtype=dtype, device=dev)

    if collective == "all_reduce":
        buf = empty(c)

        def prepare() -> None:
            fill(buf, lambda s, ln: pattern_values(red, n, p, s, ln, dev))

        return Case(
            op=lambda: dist.all_reduce(buf, group=g),
            prepare=prepare,
            output=buf,
            expected=lambda s, ln: reduced_values(red, n, s, ln, dev),
        )
    if collective == "broadcast":
        buf = empty(c)
        root = group.members[0]

        def prepare() -> None:
            if p == 0:
                fill(buf, lambda s, ln: pattern_values(plain, n, 0, s, ln, dev))
            else:
                buf.zero_()

        return Case(
            op=lambda: dist.broadcast(buf, src=root, group=g),
            prepare=prepare,
            output=buf,
            expected=lambda s, ln: pattern_values(plain, n, 0, s, ln, dev),
        )
    if collective == "all_gather":
        out = empty(c * n)
        inp = out.narrow(0, p * c, c) if placement == "in_place" else empty(c)

        def prepare() -> None:
            out.zero_()
            fill(inp, lambda s, ln: pattern_values(plain, n, p, s, ln, dev))

        def expected_ag(s: int, ln: int) -> torch.Tensor:
            idx = torch.arange(s, s + ln, device=dev, dtype=torch.int64)
            src, j = idx // c, idx % c
            shifts = (7 * src) % plain.k
            return (j + shifts) % plain.k + 1

        return Case(op=lambda: all_gather(out, inp, group=g), prepare=prepare, output=out, expected=expected_ag)
    if collective == "reduce_scatter":
        inp = empty(c * n)
        out = inp.narrow(0, p * c, c) if placement == "in_place" else empty(c)

        def prepare() -> None:
            if placement == "out_of_place":
                out.zero_()
            fill(inp, lambda s, ln: pattern_values(red, n, p, s, ln, dev))

        return Case(
            op=lambda: reduce_scatter(out, inp, group=g),
            prepare=prepare,
            output=out,
            expected=lambda s, ln: reduced_values(red, n, p * c + s, ln, dev),
        )
    if collective == "alltoall":
        inp, out = empty(c * n), empty(c * n)

        def prepare() -> None:
            out.zero_()
            fill(inp, lambda s, ln: pattern_values(plain, n, p, s, ln, dev))

        def expected_a2a(s: int, ln: int) -> torch.Tensor:
            idx = torch.arange(s, s + ln, device=dev, dtype=torch.int64)
            src, j = idx // c, idx % c
            return (p * c + j + (7 * src) % plain.k) % plain.k + 1

        return Case(
            op=lambda: dist.all_to_all_single(out, inp, group=g),
            prepare=prepare,
            output=out,
            expected=expected_a2a,
        )
    # sendrecv: a ring, each rank sends to the next and receives from the previous one
    send, recv = empty(c), empty(c)
    nxt, prv = group.members[(p + 1) % n], group.members[(p - 1) % n]

    def sendrecv() -> None:
        ops = [dist.P2POp(dist.isend, send, nxt, g), dist.P2POp(dist.irecv, recv, prv, g)]
        for work in dist.batch_isend_irecv(ops):
            work.wait()

    def prepare_sr() -> None:
        recv.zero_()
        fill(send, lambda s, ln: pattern_values(plain, n, p, s, ln, dev))

    return Case(
        op=sendrecv,
        prepare=prepare_sr,
        output=recv,
        expected=lambda s, ln: pattern_values(plain, n, (p - 1) % n, s, ln, dev),
    )


# -- groups ------------------------------------------------------------------------------------


def plan_groups(scope: Scope, nodes: Sequence[str], local_ranks: Sequence[int]) -> list[tuple[list[int], int | None]]:
    """Member lists (global ranks) of the groups of ``scope``, with the rail index for rails."""
    world = len(nodes)
    if scope == "group":
        return [(list(range(world)), None)]
    if scope == "node":
        by_node: dict[str, list[int]] = {}
        for r, node in enumerate(nodes):
            by_node.setdefault(node, []).append(r)
        return [(members, None) for members in by_node.values()]
    by_rail: dict[int, list[int]] = {}
    for r, lr in enumerate(local_ranks):
        by_rail.setdefault(lr, []).append(r)
    return [(by_rail[k], k) for k in sorted(by_rail)]


def _make_groups(ctx: ProbeContext, plan: list[tuple[list[int], int | None]]) -> tuple[Group, list[Group]]:
    import torch.distributed as dist

    if len(plan) == 1 and len(plan[0][0]) == ctx.world_size:
        only = Group(members=plan[0][0], handle=None, rail=plan[0][1])
        return only, [only]
    groups: list[Group] = []
    mine: Group | None = None
    for members, rail in plan:
        handle = dist.new_group(ranks=members, timeout=ctx.collective_timeout())
        grp = Group(members=members, handle=handle, rail=rail)
        groups.append(grp)
        if ctx.rank in members:
            mine = grp
    if mine is None:
        raise RuntimeError(f"rank {ctx.rank} is in no group of the plan")
    return mine, groups


# -- NCCL debug capture ------------------------------------------------------------------------

DEBUG_DEFAULTS = (("NCCL_DEBUG", "INFO"), ("NCCL_DEBUG_SUBSYS", "INIT,NET"))
MAX_DEBUG_LINES = 200
MAX_DEBUG_BYTES = 24 << 10
"""Per rank: what of the NCCL debug file goes into the result."""
_DEBUG_KEEP = re.compile(
    r"NCCL WARN|NCCL version|Using network|NET/|Init (?:START|COMPLETE)|\bcomm 0x[0-9a-f]+ rank \d+ nRanks"
    r"|\bvia\b|nvls channels|NVLS|P2P plugin|Plugin Path"
)
_DEBUG_PREFIX = re.compile(r"^\S*:\d+:\d+ \[\d+\] ")
_CHANNEL = re.compile(r"\b(?:Channel|Ring) \d+(?:/\d+)? : ")


@dataclass(frozen=True)
class DebugCapture:
    directory: str | None
    """The private directory of this rank's debug file (``None``: the site chose the file)."""
    set_here: tuple[str, ...]
    """The ``NCCL_DEBUG*`` variables this probe set (the others came from the site)."""


_capture: DebugCapture | None = None


def before_init(args: argparse.Namespace, backend: str) -> None:
    """Route NCCL's INIT/NET debug output to a per-rank file; call before NCCL initialises.

    Variables the site already set are kept (a site ``NCCL_DEBUG=WARN`` means no transport record).
    """
    global _capture
    if backend != "nccl" or _capture is not None:
        return
    set_here = [key for key, _ in DEBUG_DEFAULTS if key not in os.environ]
    for key, value in DEBUG_DEFAULTS:
        os.environ.setdefault(key, value)
    directory = None
    if "NCCL_DEBUG_FILE" not in os.environ:
        directory = tempfile.mkdtemp(prefix="healthd-nccl-")
        os.environ["NCCL_DEBUG_FILE"] = os.path.join(directory, "nccl.%h.%p.log")
        set_here.append("NCCL_DEBUG_FILE")
    _capture = DebugCapture(directory, tuple(set_here))


def debug_file_path(pattern: str, hostname: str, pid: int) -> str:
    """``NCCL_DEBUG_FILE`` as NCCL expands it: ``%h`` the host name up to its first dot, ``%p`` the pid."""
    host = hostname.split(".", 1)[0]
    return re.sub(r"%([hp])", lambda m: host if m.group(1) == "h" else str(pid), pattern)


def select_debug_lines(lines: Sequence[str], *, max_lines: int = MAX_DEBUG_LINES,
                       max_bytes: int = MAX_DEBUG_BYTES) -> tuple[list[str], bool]:
    """The lines about networks, plugins, NICs, communicators and channel transports, verbatim;
    a channel line repeating an earlier one but for its channel number is dropped. Returns the
    lines and whether the bounds cut any off."""
    kept: list[str] = []
    seen: set[str] = set()
    size = 0
    for raw in lines:
        line = raw.rstrip("\n")
        if not _DEBUG_KEEP.search(line):
            continue
        if _CHANNEL.search(line):
            key = _CHANNEL.sub("", _DEBUG_PREFIX.sub("", line))
            if key in seen:
                continue
            seen.add(key)
        if len(kept) >= max_lines or size + len(line) + 1 > max_bytes:
            return kept, True
        kept.append(line)
        size += len(line) + 1
    return kept, False


def _my_debug_lines() -> dict[str, Any]:
    pattern = os.environ.get("NCCL_DEBUG_FILE")
    if not pattern:
        return {"error": "NCCL_DEBUG_FILE is not set"}
    path = debug_file_path(pattern, socket.gethostname(), os.getpid())
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            lines, truncated = select_debug_lines(fh.readlines())
    except OSError as exc:
        return {"error": f"cannot read the NCCL debug file {path}: {exc.strerror or exc}"}
    finally:
        if _capture is not None and _capture.directory is not None:
            shutil.rmtree(_capture.directory, ignore_errors=True)
    return {"lines": lines, "truncated": truncated}


def debug_params(ctx: ProbeContext) -> dict[str, Any] | None:
    """``params["nccl_debug"]`` on rank 0 (a collective: every rank calls it), else ``None``."""
    if ctx.backend != "nccl":
        return {"status": "gloo", "backend": ctx.backend} if ctx.rank == 0 else None
    level = os.environ.get("NCCL_DEBUG", "")
    out: dict[str, Any] = {
        "NCCL_DEBUG": level or None,
        "NCCL_DEBUG_SUBSYS": os.environ.get("NCCL_DEBUG_SUBSYS"),
        "set_by_probe": list(_capture.set_here) if _capture is not None else [],
    }
    mine: dict[str, Any] = {"rank": ctx.rank, "node": ctx.node_of(ctx.rank)}
    if level.upper() not in ("INFO", "TRACE"):
        mine["error"] = f"NCCL_DEBUG={level or '(unset)'}: NCCL printed no INFO lines"
    else:
        mine.update(_my_debug_lines())
    gathered = ctx.gather(mine)
    if ctx.rank != 0:
        return None
    captured = any("lines" in r for r in gathered)
    out["status"] = "captured" if captured else "not_captured"
    out["ranks"] = gathered
    return out


# -- the probe ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Record:
    collective: str
    size_bytes: int
    algbw_bytes: int
    placement: str
    time_s: float
    wrong: int


def run(ctx: ProbeContext) -> ProbeOutput:
    import torch

    args = ctx.args
    if args.iters < 1 or args.warmup < 0:
        raise ValueError("--iters must be >= 1 and --warmup >= 0")
    nodes = [r.node for r in ctx.ranks]
    scope: Scope = args.scope or ("node" if len(set(nodes)) == 1 else "group")
    plan = plan_groups(scope, nodes, [r.local_rank for r in ctx.ranks])
    if all(len(m) < 2 for m, _ in plan):
        one = "one GPU" if ctx.device_type == "cuda" else "one rank"
        return ProbeOutput(params={"scope": scope},
                           skipped=f"{one} per {'node' if scope == 'node' else 'group'}: nothing to measure")
    sizes: list[int] = args.sizes or list(GPU_SIZES if ctx.device_type == "cuda" else CPU_SIZES)
    dtype_name: str = args.dtype
    dtype = getattr(torch, dtype_name)
    typesize = DTYPES[dtype_name][1]
    group, groups = _make_groups(ctx, plan)
    position = group.members.index(ctx.rank)

    records: list[Record] = []
    if group.n >= 2:
        for collective in args.collectives:
            for size in sizes:
                sz = sizing(collective, size, group.n, typesize)
                if sz.count == 0:
                    continue
                for placement in SUPPORTED_PLACEMENTS[collective]:
                    records.append(_measure(ctx, group, position, collective, placement, sz, dtype, dtype_name))

    gathered = ctx.gather(
        [(r.collective, r.size_bytes, r.algbw_bytes, r.placement, r.time_s, r.wrong) for r in records]
    )
    debug = debug_params(ctx)
    out = ProbeOutput()
    out.params = {
        "collectives": list(args.collectives),
        "sizes": sizes,
        "dtype": dtype_name,
        "warmup": args.warmup,
        "iters": args.iters,
        "scope": scope,
        "groups": [{"ranks": g.members, "rail": g.rail} for g in groups],
        "unmeasured": {
            f"{c}.{pl}": UNSUPPORTED_WHY[c]
            for c in args.collectives
            for pl in PLACEMENTS
            if pl not in SUPPORTED_PLACEMENTS[c]
        },
        "expect_transport": list(args.expect_transport),
    }
    if ctx.rank != 0:
        return out
    if debug is not None:
        out.params["nccl_debug"] = debug
    skipped = [g.members for g in groups if g.n < 2]
    if skipped:
        out.params["skipped_groups"] = skipped
    for grp in groups:
        if grp.n < 2:
            continue
        _summarize(ctx, grp, scope, [gathered[r] for r in grp.members], out)
    return out


def _measure(
    ctx: ProbeContext,
    group: Group,
    position: int,
    collective: Collective,
    placement: Placement,
    sz: Sizing,
    dtype: torch.dtype,
    dtype_name: str,
) -> Record:
    import torch.distributed as dist

    args = ctx.args
    phase = f"nccl.{collective}.{sz.size_bytes}.{placement}"
    ctx.mark(phase + ".warmup")
    case = make_case(collective, placement, sz, group, position, dtype, dtype_name, ctx.device)
    case.prepare()
    slow = "slow" in ctx.faults and len({ctx.node_of(r) for r in group.members}) > 1
    warm: list[float] = []
    for _ in range(max(args.warmup, 1 if slow else 0)):
        t0 = time.perf_counter()
        case.op()
        if slow:
            ctx.sync()
            warm.append(time.perf_counter() - t0)
    delay = SLOW_FACTOR * sorted(warm)[len(warm) // 2] if slow else 0.0
    ctx.sync()
    dist.barrier(group=group.handle)
    ctx.sync()
    ctx.mark(phase + ".timed")
    start = time.perf_counter()
    for _ in range(args.iters):
        if delay:  # test-only (probes.faults): a slow inter-node path, in proportion to the op's own time
            time.sleep(delay)
        case.op()
    ctx.sync()
    elapsed = time.perf_counter() - start
    ctx.mark(phase + ".validate")
    case.prepare()
    ctx.sync()
    dist.barrier(group=group.handle)
    case.op()
    ctx.sync()
    if "corrupt" in ctx.faults:
        k = min(3, case.output.numel())
        case.output[:k] += 1
    wrong = count_wrong(case.output, case.expected)
    return Record(collective, sz.size_bytes, sz.algbw_bytes, placement, elapsed / args.iters, wrong)


def _summarize(
    ctx: ProbeContext,
    grp: Group,
    scope: Scope,
    per_rank: list[list[tuple[str, int, int, str, float, int]]],
    out: ProbeOutput,
) -> None:
    node_names = {ctx.node_of(r) for r in grp.members}
    node = next(iter(node_names)) if len(node_names) == 1 else None
    for i, (collective, size_bytes, s, placement, _, _) in enumerate(per_rank[0]):
        times = [rows[i][4] for rows in per_rank]
        wrongs = [rows[i][5] for rows in per_rank]
        coll: Collective = collective  # type: ignore[assignment]
        factor = bus_factor(coll, grp.n)
        t = mean(times)
        labels = {"collective": collective, "size_bytes": str(size_bytes), "placement": placement, "scope": scope}
        if grp.rail is not None:
            labels["rail"] = str(grp.rail)
        out.measurements += [
            Measurement(name="time_seconds", value=t, labels=labels, node=node, per_rank=times),
            Measurement(
                name="algbw_bytes_per_second",
                value=s / t,
                labels=labels,
                node=node,
                per_rank=[s / x for x in times],
            ),
            Measurement(
                name="busbw_bytes_per_second",
                value=s / t * factor,
                labels=labels,
                node=node,
                per_rank=[s / x * factor for x in times],
            ),
        ]
        total = sum(wrongs)
        bad = [(grp.members[j], w) for j, w in enumerate(wrongs) if w]
        detail = f"{total} wrong elements"
        if bad:
            detail += " (" + ", ".join(f"rank {r}: {w}" for r, w in bad) + ")"
        only = bad[0][0] if len(bad) == 1 else None
        out.checks.append(
            Check(
                name=f"nccl.{collective}.{size_bytes}.{placement}.wrong",
                ok=total == 0,
                detail=detail,
                node=node if node is not None else (ctx.node_of(only) if only is not None else None),
                gpu=grp.rail,
                rank=only,
            )
        )


# -- table -------------------------------------------------------------------------------------


def _fmt_time_us(seconds: float) -> str:
    us = seconds * 1e6
    if us < 100:
        return f"{us:7.2f}"
    if us < 10_000:
        return f"{us:7.1f}"
    return f"{us:7.0f}"


def format_table(result: ProbeResult) -> str:
    """nccl-tests-like columns: size count type redop root, then time algbw busbw #wrong for
    out-of-place and in-place (``N/A`` where torch.distributed cannot measure it)."""
    dtype = str(result.params.get("dtype", "float32"))
    type_name, typesize, _ = DTYPES.get(dtype, ("?", 1, 0))
    rows: dict[tuple[str, str | None, str, int], dict[str, dict[str, float]]] = {}
    group_size: dict[tuple[str, str | None, str, int], int] = {}
    for m in result.measurements:
        key = (m.labels["collective"], m.node or m.labels.get("rail"), m.labels["scope"], int(m.labels["size_bytes"]))
        rows.setdefault(key, {}).setdefault(m.labels["placement"], {})[m.name] = m.value
        group_size[key] = len(m.per_rank or [])
    wrong: dict[tuple[str, int, str, str | None], str] = {}
    wrong_any: dict[tuple[str, int, str], list[str]] = {}
    for c in result.checks:
        parts = c.name.split(".")
        if len(parts) == 5 and parts[0] == "nccl" and parts[2].isdigit():
            where = c.node if c.gpu is None else str(c.gpu)
            nwrong = c.detail.split()[0] if c.detail else "?"
            wrong[(parts[1], int(parts[2]), parts[3], where)] = nwrong
            wrong_any.setdefault((parts[1], int(parts[2]), parts[3]), []).append(nwrong)
    lines: list[str] = []
    current: tuple[str, str | None, str] | None = None
    for key in sorted(rows, key=lambda k: (k[0], str(k[1]), k[2], k[3])):
        collective, where, scope, size = key
        if current != (collective, where, scope):
            current = (collective, where, scope)
            lines.append(f"# {collective}  scope {scope}  {where or 'all nodes'}  ranks {group_size[key]}")
            lines.append(
                f"# {'size':>10}  {'count':>12}  {'type':>8}  {'redop':>6}  {'root':>5}"
                f"  {'time':>7}  {'algbw':>6}  {'busbw':>6}  {'#wrong':>6}"
                f"  {'time':>7}  {'algbw':>6}  {'busbw':>6}  {'#wrong':>6}"
            )
            lines.append(
                f"# {'(B)':>10}  {'(elements)':>12}  {'':>8}  {'':>6}  {'':>5}"
                f"  {'(us)':>7}  {'(GB/s)':>6}  {'(GB/s)':>6}  {'':>6}"
                f"  {'(us)':>7}  {'(GB/s)':>6}  {'(GB/s)':>6}  {'':>6}"
            )
        n = max(1, group_size[key])
        divided = collective in ("all_gather", "reduce_scatter", "alltoall")
        count = size // (n * typesize) if divided else size // typesize
        redop = "sum" if collective in ("all_reduce", "reduce_scatter") else "none"
        root = 0 if collective == "broadcast" else -1
        cells = f"  {size:>10}  {count:>12}  {type_name:>8}  {redop:>6}  {root:>5}"
        for placement in PLACEMENTS:
            vals = rows[key].get(placement)
            if vals is None:
                cells += f"  {'N/A':>7}  {'N/A':>6}  {'N/A':>6}  {'N/A':>6}"
                continue
            w = wrong.get((collective, size, placement, where), "?")
            if w == "?" and len(wrong_any.get((collective, size, placement), [])) == 1:
                w = wrong_any[(collective, size, placement)][0]
            cells += (
                f"  {_fmt_time_us(vals['time_seconds'])}  {vals['algbw_bytes_per_second'] / 1e9:6.2f}"
                f"  {vals['busbw_bytes_per_second'] / 1e9:6.2f}  {w:>6}"
            )
        lines.append(cells)
    return "\n".join(lines)
