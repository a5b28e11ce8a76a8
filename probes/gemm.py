"""The ``gemm`` probe: matmul throughput and device memory bandwidth, each GPU on its own.

Every rank measures its own device (one rank per GPU; on CPU, each rank with its share of
the cores), all at the same time, dtype by dtype:

- ``M = N = K = --size`` (8192 on GPU, 1024 on CPU), random normal operands; on a CPU without
  native bf16 matmul (oneDNN's bf16 kernels need AVX-512 BF16 or AMX) bf16 is emulated about
  100 times slower than fp32, so its default size there is :data:`CPU_EMULATED_BF16_SIZE` (the size
  of each dtype is in the result's ``params``);
- several operand sets, rotated between iterations so that what is measured is not a cache
  (at least 512 MiB of operands on GPU, 256 MiB on CPU, 2 to 16 sets);
- steady state, every dtype: ``--warmup`` untimed matmuls, then more of them, timed in windows,
  for at least ``--warmup-seconds`` (1 s on GPU, 0.05 s on CPU) and until the last three windows'
  per-matmul times agree within 2% (:data:`STABLE_TOLERANCE`), for at most 3 times as long. A GPU
  at full load reaches its power limit within a second or so and its clock drops (an H100 from
  ~1,965 to ~1,330 MHz): a short burst reads up to 15% more than the GPU sustains, so the first
  matmuls are not the figure. Then ``--iters`` timed matmuls (on GPU, as many more as fill
  ``--measure-seconds``, 0.25 s), each timed on its own (CUDA events on GPU, the host clock on
  CPU, where the op is synchronous); the median is used: ``flop_per_second = 2*M*N*K / median``,
  PARAM's formula; on CPU fp32 and bf16 by default, fp16 and fp8 when ``--dtypes`` asks (recent
  torch runs them, emulated), tf32 never (a CUDA mode);
- the order of the dtypes favours none: it is rotated by the run id (``params.order``), so over
  runs every dtype is measured first, last and in between. Each dtype is measured right after its
  own warm-up reached a steady per-matmul time, which takes the GPU from whatever the previous
  dtype left (a cooler or hotter die, a higher or lower clock) to this dtype's own steady state;
  the rotation spreads what is left (the die warming over the whole run) evenly. Interleaving short
  windows of every dtype was not chosen: a power-capped GPU's clock follows the load, and each
  switch between dtypes (fp32 draws less power than fp8) would start every window in a transient;
- during each dtype's timed window the GPU's SM clock, power, power limit and clock-event
  (throttle) reasons are read through NVML (:mod:`probes.telemetry`, when ``pynvml`` is there):
  ``sm_clock_hertz``, ``power_watts``, ``power_limit_watts`` (means over the window) and
  ``throttle_ratio`` (share of the readings with a hardware, thermal or power-brake slowdown
  active), labelled ``gpu`` and ``dtype``; the reasons seen, by name, and each window's warm-up in
  ``params.gpu_state``; why nothing was read, if so, in ``params.telemetry``;
- a result check: sampled rows of the last product against a float64 reference from the
  same operands, ``max|C - ref| / sqrt(K)`` within the dtype's tolerance (:data:`TOLERANCE`);
  a failure names the GPU and fails the probe;
- ``memory_bandwidth_bytes_per_second``: a large device-to-device copy (``--copy-bytes``,
  1 GiB on GPU, 64 MiB on CPU), bytes read + written over the median copy time.
"""

from __future__ import annotations

import argparse
import math
import random
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from probes.catalogue import ProbeName
from probes.context import ProbeContext, ProbeOutput
from probes.nccl import parse_size
from probes.options import non_negative_float
from probes.result import Check, Measurement, ProbeResult
from probes.telemetry import GpuTelemetry, Summary, open_gpu
from probes.timing import median

if TYPE_CHECKING:
    import torch

NAME = ProbeName.GEMM
HELP = "per-GPU matmul throughput (fp32/tf32/bf16/fp16/fp8) and memory bandwidth"

DTYPES = ("fp32", "tf32", "bf16", "fp16", "fp8")
TOLERANCE = {"fp32": 1e-3, "tf32": 5e-2, "bf16": 1e-1, "fp16": 2e-2, "fp8": 1e-1}
"""Allowed ``max|C - ref| / sqrt(K)`` for N(0,1) operands: output rounding of a value of a
few ``sqrt(K)`` in the dtype (bf16 2^-8, fp16 2^-11) or input rounding (tf32 2^-11 per
product), with a wide margin: broken hardware is off by orders of magnitude, or NaN."""
REFERENCE_ROWS = 8


def _dtypes_arg(text: str) -> list[str]:
    names = [t.strip() for t in text.split(",") if t.strip()]
    bad = [n for n in names if n not in DTYPES]
    if bad or not names:
        raise argparse.ArgumentTypeError(f"unknown dtype(s) {bad}; choose from {', '.join(DTYPES)}")
    return list(dict.fromkeys(names))


def _bytes_arg(text: str) -> int:
    try:
        return parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--size", type=int, default=None, help="M=N=K (default 8192 on GPU, 1024 on CPU)")
    parser.add_argument(
        "--dtypes",
        type=_dtypes_arg,
        default=None,
        help=f"comma list from {','.join(DTYPES)} (default: all the device supports)",
    )
    parser.add_argument(
        "--warmup", type=int, default=5, help="untimed matmuls per dtype before the timed warm-up (default 5)"
    )
    parser.add_argument(
        "--warmup-seconds",
        type=non_negative_float,
        default=None,
        help="least warm-up per dtype, then until steady, at most 3x as long (default 1.0 GPU, 0.05 CPU; 0: none)",
    )
    parser.add_argument("--iters", type=int, default=None, help="timed matmuls per dtype (default 20 GPU, 10 CPU)")
    parser.add_argument(
        "--measure-seconds",
        type=non_negative_float,
        default=None,
        help="on GPU, time as many more matmuls as fill this (default 0.25 GPU, 0 CPU)",
    )
    parser.add_argument(
        "--copy-bytes", type=_bytes_arg, default=None, help="copy size for memory bandwidth (default 1G GPU, 64M CPU)"
    )


CPU_DEFAULT_DTYPES = ("fp32", "bf16")
"""The dtypes a CPU run measures unless ``--dtypes`` names others: fp16 and fp8 run on CPU in recent
torch, emulated at well under 1 GFLOP/s (ask for them with ``--dtypes``; tests do)."""
CPU_EMULATED_SIZE = 128
"""Default size of fp16 and fp8 on CPU (emulated, ~0.3 GFLOP/s)."""


def cpu_support(dtype: str) -> str | None:
    """``None`` if this torch can multiply ``dtype`` on the CPU (tried on a tiny matrix), else why not."""
    if dtype in ("fp32", "bf16"):
        return None
    if dtype == "tf32":
        return "not supported on this device (tf32 is a CUDA matmul mode)"
    import torch

    try:
        ops = _operands(dtype, 4, 1, torch.device("cpu"), seed=0)
        ops.step(0)
    except (RuntimeError, AttributeError, TypeError, NotImplementedError) as exc:
        return f"not supported on this device ({type(exc).__name__}: {str(exc)[:120]})"
    return None


def set_tf32(dtype: str, device_type: str) -> bool:
    """On CUDA, allow TF32 matmuls (cuBLAS and cuDNN) exactly when ``dtype`` is ``tf32``; whether they are on."""
    if device_type != "cuda":
        return False
    import torch

    torch.backends.cuda.matmul.allow_tf32 = dtype == "tf32"
    torch.backends.cudnn.allow_tf32 = dtype == "tf32"
    return bool(torch.backends.cuda.matmul.allow_tf32)


def support(dtype: str, device_type: str, capability: tuple[int, int] | None) -> str | None:
    """``None`` if ``dtype`` can be measured on this device, else why not."""
    if device_type == "cpu":
        return cpu_support(dtype)
    cap = capability or (0, 0)
    if dtype in ("tf32", "bf16") and cap < (8, 0):
        return "not supported on this device (needs compute capability 8.0)"
    if dtype == "fp8":
        import torch

        if cap < (8, 9) or not hasattr(torch, "_scaled_mm") or not hasattr(torch, "float8_e4m3fn"):
            return "not supported on this device (needs compute capability 8.9 and torch._scaled_mm)"
    return None


@dataclass
class Operands:
    a: list[torch.Tensor]
    b: list[torch.Tensor]
    c: list[torch.Tensor]
    step: Callable[[int], None]
    """Multiply operand set ``i mod len(a)`` into ``c[i mod len(a)]``."""


def _operands(dtype: str, n: int, sets: int, device: torch.device, seed: int) -> Operands:
    import torch

    gen = torch.Generator(device=device)
    gen.manual_seed(seed)

    def randn() -> torch.Tensor:
        return torch.randn(n, n, device=device, generator=gen, dtype=torch.float32)

    if dtype == "fp8":
        a = [randn().to(torch.float8_e4m3fn) for _ in range(sets)]
        b = [randn().to(torch.float8_e4m3fn).t().contiguous().t() for _ in range(sets)]  # column-major
        c = [torch.empty(n, n, device=device, dtype=torch.bfloat16) for _ in range(sets)]
        one = torch.ones((), device=device, dtype=torch.float32)

        def step8(i: int) -> None:
            k = i % sets
            r = torch._scaled_mm(a[k], b[k], scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
            c[k] = r[0] if isinstance(r, tuple) else r  # torch < 2.4 also returned amax

        return Operands(a, b, c, step8)
    tdtype = {"fp32": torch.float32, "tf32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[dtype]
    a = [randn().to(tdtype) for _ in range(sets)]
    b = [randn().to(tdtype) for _ in range(sets)]
    c = [torch.empty(n, n, device=device, dtype=tdtype) for _ in range(sets)]

    def step(i: int) -> None:
        k = i % sets
        torch.mm(a[k], b[k], out=c[k])

    return Operands(a, b, c, step)


def operand_sets(n: int, elem_bytes: int, device_type: str) -> int:
    flush = (512 << 20) if device_type == "cuda" else (256 << 20)
    per_set = 3 * n * n * elem_bytes
    return max(2, min(16, math.ceil(flush / per_set)))


@dataclass(frozen=True)
class GemmRecord:
    dtype: str
    seconds: float
    error: float
    ok: bool
    size: int
    warmup_seconds: float = 0.0
    stable: bool = False
    iters: int = 0
    telemetry: Summary | None = None


CPU_EMULATED_BF16_SIZE = 256
"""Default bf16 size on a CPU without native bf16 matmul: ~0.1 s a matmul where 1024 takes ~6 s."""


def default_size(dtype: str, device_type: str) -> int:
    if device_type == "cuda":
        return 8192
    if dtype == "bf16" and not _native_cpu_bf16():
        return CPU_EMULATED_BF16_SIZE
    if dtype in ("fp16", "fp8"):
        return CPU_EMULATED_SIZE
    return 1024


def _native_cpu_bf16() -> bool:
    import torch

    supported = getattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", None)
    return bool(supported()) if supported is not None else True


def time_each(ctx: ProbeContext, fn: Any, count: int, first: int = 0) -> list[float]:
    """Seconds of each of ``count`` calls ``fn(first + i)``: CUDA events on GPU, host clock on CPU."""
    import torch

    if ctx.device_type == "cuda":
        event: Callable[..., Any] = torch.cuda.Event
        starts = [event(enable_timing=True) for _ in range(count)]
        ends = [event(enable_timing=True) for _ in range(count)]
        for i in range(count):
            starts[i].record()
            fn(first + i)
            ends[i].record()
        torch.cuda.synchronize(ctx.device)
        return [s.elapsed_time(e) / 1e3 for s, e in zip(starts, ends, strict=True)]
    out = []
    for i in range(count):
        t = time.perf_counter()
        fn(first + i)
        out.append(time.perf_counter() - t)
    return out


def time_block(ctx: ProbeContext, fn: Any, count: int, first: int = 0) -> float:
    """Seconds of ``count`` calls ``fn(first + i)`` back to back (one pair of CUDA events on GPU)."""
    import torch

    if ctx.device_type == "cuda":
        event: Callable[..., Any] = torch.cuda.Event
        start, end = event(enable_timing=True), event(enable_timing=True)
        start.record()
        for i in range(count):
            fn(first + i)
        end.record()
        torch.cuda.synchronize(ctx.device)
        return float(start.elapsed_time(end)) / 1e3
    t = time.perf_counter()
    for i in range(count):
        fn(first + i)
    return time.perf_counter() - t


STABLE_TOLERANCE = 0.02
"""Warm-up ends when the last :data:`STABLE_WINDOWS` windows' per-call times differ by at most this
fraction (after the least warm-up time)."""
STABLE_WINDOWS = 3
WARMUP_CAP_FACTOR = 3.0
"""Warm-up ends after this many times ``--warmup-seconds`` even if the time per call still moves."""
WINDOWS_PER_MIN = 8
MAX_TIMED = 5000


@dataclass(frozen=True)
class Settled:
    seconds: float
    """Wall time the timed warm-up took."""
    per_call: float | None
    """Seconds per call in the last window (``None``: no window ran)."""
    stable: bool
    calls: int


def settle(ctx: ProbeContext, fn: Any, min_seconds: float, first: int = 0) -> Settled:
    """Call ``fn(first + i)`` in timed windows (about ``min_seconds / 8`` each) until at least
    ``min_seconds`` passed and the last :data:`STABLE_WINDOWS` windows agree within
    :data:`STABLE_TOLERANCE`, or :data:`WARMUP_CAP_FACTOR` times ``min_seconds`` passed."""
    if min_seconds <= 0:
        return Settled(0.0, None, False, 0)
    t0 = time.perf_counter()
    window = min_seconds / WINDOWS_PER_MIN
    per: list[float] = []
    count, calls = 1, 0
    while True:
        seconds = time_block(ctx, fn, count, first + calls)
        calls += count
        per.append(seconds / count)
        elapsed = time.perf_counter() - t0
        last = per[-STABLE_WINDOWS:]
        stable = len(last) == STABLE_WINDOWS and max(last) <= (1 + STABLE_TOLERANCE) * min(last)
        if (elapsed >= min_seconds and stable) or elapsed >= WARMUP_CAP_FACTOR * min_seconds:
            return Settled(elapsed, per[-1], stable, calls)
        count = max(1, min(100_000, round(window / per[-1]))) if per[-1] > 0 else count * 2


def _gemm(
    ctx: ProbeContext,
    dtype: str,
    n: int,
    warmup: int,
    iters: int,
    warmup_seconds: float = 0.0,
    measure_seconds: float = 0.0,
    telemetry: GpuTelemetry | None = None,
) -> GemmRecord:
    import torch

    elem = 1 if dtype == "fp8" else (2 if dtype in ("bf16", "fp16") else 4)
    sets = operand_sets(n, elem, ctx.device_type)
    set_tf32(dtype, ctx.device_type)
    ops = _operands(dtype, n, sets, ctx.device, seed=1000 + ctx.rank)
    step = ops.step

    ctx.barrier()  # the ranks warm up together: one GPU's heat and power are its neighbours' too
    ctx.mark(f"gemm.{dtype}.warmup")
    for i in range(warmup):
        step(i)
    ctx.sync()
    settled = settle(ctx, step, warmup_seconds, first=warmup)
    done = warmup + settled.calls
    count = iters
    if measure_seconds > 0 and settled.per_call:
        count = max(iters, min(MAX_TIMED, math.ceil(measure_seconds / settled.per_call)))
    # No barrier here: a rank waiting for a slower one would idle its GPU and undo its steady state.
    ctx.mark(f"gemm.{dtype}.timed")
    sampler = telemetry.window().start() if telemetry is not None else None
    times = time_each(ctx, step, count, first=done)
    summary = sampler.stop() if sampler is not None else None
    ctx.mark(f"gemm.{dtype}.check")
    last = (done + count - 1) % sets
    c = ops.c[last]
    rows = torch.tensor(
        sorted({i * (n - 1) // max(1, REFERENCE_ROWS - 1) for i in range(REFERENCE_ROWS)}), device=ctx.device
    )
    if "corrupt" in ctx.faults:
        c[rows[0], 0] = float(1e3 * math.sqrt(n))
    a_rows = ops.a[last].view(torch.uint8)[rows].view(ops.a[last].dtype) if elem == 1 else ops.a[last][rows]
    ref = a_rows.to(torch.float64) @ ops.b[last].to(torch.float64)
    got = c[rows].to(torch.float64)
    finite = bool(torch.isfinite(got).all().item())
    err = float((got - ref).abs().max().item()) / math.sqrt(n) if finite else math.inf
    del ops
    return GemmRecord(
        dtype=dtype,
        seconds=median(times),
        error=err,
        ok=finite and err <= TOLERANCE[dtype],
        size=n,
        warmup_seconds=settled.seconds,
        stable=settled.stable,
        iters=count,
        telemetry=summary,
    )


def dtype_order(dtypes: list[str], run_id: str | None, fallback: int) -> list[str]:
    """``dtypes`` rotated to start at ``crc32(run_id) mod len`` (``fallback`` without a run id).

    >>> dtype_order(["fp32", "tf32", "bf16"], None, 4)
    ['tf32', 'bf16', 'fp32']
    """
    if not dtypes:
        return []
    start = (zlib.crc32(run_id.encode()) if run_id else fallback) % len(dtypes)
    return dtypes[start:] + dtypes[:start]


def telemetry_measurements(node: str, gpu: int, dtype: str, summary: Summary | None) -> list[Measurement]:
    """The readings of one GPU's timed window as measurements labelled ``gpu`` and ``dtype``."""
    if summary is None:
        return []
    labels = {"gpu": str(gpu), "dtype": dtype}
    values = (
        ("sm_clock_hertz", summary.sm_clock_hertz),
        ("power_watts", summary.power_watts),
        ("power_limit_watts", summary.power_limit_watts),
        ("throttle_ratio", summary.throttle_ratio),
    )
    return [
        Measurement(name=name, value=value, labels=labels, node=node)
        for name, value in values
        if value is not None and math.isfinite(value)
    ]


def rank_telemetry(ctx: ProbeContext) -> tuple[GpuTelemetry | None, str]:
    """NVML telemetry for this rank's GPU (by UUID, PCI bus id, node index), or ``None`` and why not."""
    if ctx.device_type != "cuda":
        return None, "not a GPU run"
    pci = next((d.pci_bus_id for d in ctx.ranks[ctx.rank].devices if d.index == ctx.gpu), None)
    return open_gpu(ctx.gpu_uuid, pci, ctx.gpu)


def _copy_bandwidth(ctx: ProbeContext, nbytes: int, iters: int) -> float:
    import torch

    elems = max(1, nbytes // 4)
    src = torch.randn(elems, device=ctx.device)
    dst = torch.empty_like(src)
    ctx.mark("gemm.copy")
    for _ in range(2):
        dst.copy_(src)
    ctx.sync()
    ctx.barrier()
    times = time_each(ctx, lambda _: dst.copy_(src), iters)
    return 2 * elems * 4 / median(times)


def run(ctx: ProbeContext) -> ProbeOutput:
    import torch

    args = ctx.args
    cuda = ctx.device_type == "cuda"
    n: int = args.size or default_size("fp32", ctx.device_type)
    iters: int = args.iters or (20 if cuda else 10)
    copy_bytes: int = args.copy_bytes or ((1 << 30) if cuda else (64 << 20))
    warmup_seconds: float = args.warmup_seconds if args.warmup_seconds is not None else (1.0 if cuda else 0.05)
    measure_seconds: float = args.measure_seconds if args.measure_seconds is not None else (0.25 if cuda else 0.0)
    if n < 1 or iters < 1 or args.warmup < 0:
        raise ValueError("--size and --iters must be >= 1, --warmup >= 0")
    capability = torch.cuda.get_device_capability(ctx.device) if cuda else None
    wanted: list[str] = args.dtypes or list(DTYPES if cuda else CPU_DEFAULT_DTYPES)
    skipped = {d: why for d in wanted if (why := support(d, ctx.device_type, capability))}
    # The ranks measure in lock-step (a barrier per dtype): agree on the dtypes and their order first.
    gathered_skips = ctx.gather((skipped, random.randrange(1 << 30)))
    for other, _ in gathered_skips:
        for d, why in other.items():
            skipped.setdefault(d, f"{why} (on another rank's device)")
    dtypes = [d for d in wanted if d not in skipped]
    order = dtype_order(dtypes, getattr(args, "run_id", None), gathered_skips[0][1])
    telemetry, no_telemetry = rank_telemetry(ctx)
    records: list[GemmRecord] = []
    sizes = {d: args.size or default_size(d, ctx.device_type) for d in dtypes}
    for dtype in order:
        records.append(_gemm(ctx, dtype, sizes[dtype], args.warmup, iters, warmup_seconds, measure_seconds, telemetry))
    records.sort(key=lambda r: dtypes.index(r.dtype))
    bandwidth = _copy_bandwidth(ctx, copy_bytes, iters)
    mine = (ctx.gpu, records, bandwidth, no_telemetry)
    gathered = ctx.gather(mine)
    unavailable = sorted({why for _, _, _, why in gathered if why})
    out = ProbeOutput(
        params={
            "size": n,
            **({"sizes": sizes} if set(sizes.values()) != {n} else {}),
            "dtypes": dtypes,
            "order": order,
            "warmup": args.warmup,
            "warmup_seconds": warmup_seconds,
            "iters": iters,
            "measure_seconds": measure_seconds,
            "copy_bytes": copy_bytes,
            "skipped_dtypes": skipped,
            "tolerance": {d: TOLERANCE[d] for d in dtypes},
            "telemetry": "nvml" if not unavailable else "; ".join(unavailable),
        }
    )
    if ctx.rank != 0:
        return out
    state: list[dict[str, Any]] = []
    out.params["gpu_state"] = state
    for rank, (gpu, recs, bw, _) in enumerate(gathered):
        node = ctx.node_of(rank)
        for r in recs:
            out.measurements.append(
                Measurement(
                    name="flop_per_second",
                    value=2.0 * r.size**3 / r.seconds,
                    labels={"gpu": str(gpu), "dtype": r.dtype},
                    node=node,
                )
            )
            out.measurements += telemetry_measurements(node, gpu, r.dtype, r.telemetry)
            state.append({
                "node": node,
                "gpu": gpu,
                "dtype": r.dtype,
                "warmup_s": round(r.warmup_seconds, 3),
                "stable": r.stable,
                "iters": r.iters,
                **({"samples": r.telemetry.samples, "reasons": list(r.telemetry.reasons)} if r.telemetry else {}),
            })
            out.checks.append(
                Check(
                    name=f"gemm.{r.dtype}.result",
                    ok=r.ok,
                    detail=f"max |C - ref| / sqrt(K) = {r.error:.3g} (tolerance {TOLERANCE[r.dtype]:g})",
                    node=node,
                    gpu=gpu,
                    rank=rank,
                )
            )
        out.measurements.append(
            Measurement(name="memory_bandwidth_bytes_per_second", value=bw, labels={"gpu": str(gpu)}, node=node)
        )
    return out


def format_table(result: ProbeResult) -> str:
    lines = [f"# {'node':<20}  {'gpu':>3}  {'dtype':>5}  {'TFLOP/s':>9}  {'MHz':>5}  {'W':>5}  {'throttled':>9}"
             f"  {'check':<5}  detail"]
    checks = {(c.node, c.gpu, c.name.split(".")[1]): c for c in result.checks if c.name.startswith("gemm.")}
    gpu_state = {(m.node, m.labels.get("gpu"), m.labels.get("dtype"), m.name): m.value for m in result.measurements}

    def state(m: Measurement, name: str, scale: float, fmt: str, unit: str = "") -> str:
        value = gpu_state.get((m.node, m.labels["gpu"], m.labels["dtype"], name))
        return "-" if value is None else format(value / scale, fmt) + unit

    for m in result.measurements:
        if m.name != "flop_per_second":
            continue
        c = checks.get((m.node, int(m.labels["gpu"]), m.labels["dtype"]))
        lines.append(
            f"  {m.node or '-':<20}  {m.labels['gpu']:>3}  {m.labels['dtype']:>5}  {m.value / 1e12:9.3f}"
            f"  {state(m, 'sm_clock_hertz', 1e6, '.0f'):>5}  {state(m, 'power_watts', 1, '.0f'):>5}"
            f"  {state(m, 'throttle_ratio', 0.01, '.0f', '%'):>9}"
            f"  {'ok' if c is None or c.ok else 'FAIL':<5}  {c.detail if c else ''}"
        )
    lines.append(f"# {'node':<20}  {'gpu':>3}  {'copy GB/s':>9}")
    for m in result.measurements:
        if m.name == "memory_bandwidth_bytes_per_second":
            lines.append(f"  {m.node or '-':<20}  {m.labels['gpu']:>3}  {m.value / 1e9:9.2f}")
    skipped = result.params.get("skipped_dtypes") or {}
    for dtype, why in skipped.items():
        lines.append(f"# {dtype}: skipped: {why}")
    if result.params.get("telemetry") not in (None, "nvml"):
        lines.append(f"# clock, power, throttling: {result.params['telemetry']}")
    return "\n".join(lines)
