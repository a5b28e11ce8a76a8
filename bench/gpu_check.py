"""healthd's probes against an independent harness, side by side, on one GPU (or the CPU).

    python bench/gpu_check.py [--rounds 3] [--json] [--device cuda|cpu] [--gpu 0] [--tiny]

What a site runs on a new node type, and what a developer runs whenever a GPU is at hand. Each
round runs, alternating which goes first (probe then harness in even rounds, harness then probe
in odd ones), for every figure:

- ``gemm``: ``python -m probes gemm --nproc 1`` (a subprocess, timed) against plain
  ``torch.matmul`` (fp8: ``torch._scaled_mm``) of the same size and dtype, warmed up for
  ``--warmup-seconds`` and then timed as one block between two CUDA events (mean, not median);
- ``compute``: ``python -m probes compute`` against a plain ``nn.Sequential`` of the same
  ``Linear``/``ReLU`` stack, softmax, cross-entropy and SGD, fwd+bwd timed as one block;
- ``ddp``: ``python -m probes ddp`` (``model_flop_per_second``: the model under DDP, one rank;
  and its ``single_rank`` figure converted to model FLOP/s) against the same GPT-style model
  (``probes.ddp.build_model``) stepped without the DDP wrapper, AdamW, bf16 autocast.

It prints per figure the probe's value, the harness's, their ratio (probe / harness; medians
over the rounds) and the SM clock and power NVML read while each ran (samples where NVML reports
the GPU idle left out; ``-`` without ``pynvml``), then the wall time of a full check: ``env``,
``nccl``, ``gemm``, ``ddp`` one after the other as the daemon starts them, on every GPU of the node
with the probes' defaults, each with its outcome (and ``python -m probes check`` when this checkout
has it). The target on a GPU at the default sizes: ratio >= 0.97 for
every GEMM dtype. ``--tiny`` shrinks every size so that the whole thing runs on a CPU in seconds.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from probes import compute as compute_probe  # noqa: E402
from probes import ddp as ddp_probe  # noqa: E402
from probes import gemm as gemm_probe  # noqa: E402
from probes.telemetry import GpuTelemetry, Summary, open_gpu  # noqa: E402

GPU_IDLE = 0x1
PROBE_TIMEOUT_S = 300.0
FULL_CHECK = ("env", "nccl", "gemm", "ddp")


@dataclass
class Sizes:
    gemm: dict[str, int]
    mlp: compute_probe.MlpShape
    model: ddp_probe.ModelConfig
    warmup_seconds: float
    measure_seconds: float
    probe_args: dict[str, list[str]]


def sizes_for(device: str, dtypes: Sequence[str], tiny: bool, warmup_seconds: float | None) -> Sizes:
    cuda = device == "cuda"
    if tiny:
        gemm = {d: 96 for d in dtypes}
        mlp = compute_probe.MlpShape(layers=(64,) * 3, batch=32)
        model = ddp_probe.ModelConfig(n_layer=1, n_head=2, n_embd=32, seq_len=16, vocab_size=64, batch_size=2)
        warm = 0.05 if warmup_seconds is None else warmup_seconds
        probe_args = {
            "gemm": ["--size", "96", "--iters", "5", "--warmup", "1", "--copy-bytes", "1M"],
            "compute": ["--layer-num", "1", "--hidden-size", "64", "--batch-size", "32", "--features", "1000",
                        "--embdim", "8", "--nnz", "2", "--bags", "16", "--steps", "5"],
            "ddp": ["--n-layer", "1", "--n-head", "2", "--n-embd", "32", "--seq-len", "16", "--vocab-size", "64",
                    "--batch-size", "2", "--steps", "6", "--warmup", "1"],
        }
        return Sizes(gemm, mlp, model, warm, 0.02, probe_args)
    gemm = {d: gemm_probe.default_size(d, device) for d in dtypes}
    mlp = compute_probe.GPU_MLP if cuda else compute_probe.CPU_MLP
    model = ddp_probe.GPU_DEFAULT if cuda else ddp_probe.CPU_DEFAULT
    warm = (1.0 if cuda else 0.05) if warmup_seconds is None else warmup_seconds
    return Sizes(gemm, mlp, model, warm, 0.25 if cuda else 0.1, {"gemm": [], "compute": [], "ddp": []})


# --- NVML while something runs -------------------------------------------------------------------


class Watch:
    """NVML readings of the GPU while a block runs (nothing without ``pynvml``)."""

    def __init__(self, tel: GpuTelemetry | None) -> None:
        self.tel = tel

    def run(self, fn: Callable[[], Any]) -> tuple[Any, Summary | None]:
        if self.tel is None:
            return _released(fn), None
        sampler = self.tel.window(0.05).start()
        try:
            out = _released(fn)
        finally:
            sampler.stop()
        busy = [s for s in sampler.samples() if not (s.reasons or 0) & GPU_IDLE]
        return out, Summary.of(busy) if busy else None


def _released(fn: Callable[[], Any]) -> Any:
    """``fn()``, then this process's cached GPU memory handed back (the next probe process needs it)."""
    try:
        return fn()
    finally:
        import torch

        if torch.cuda.is_available():
            torch.cuda.empty_cache()


# --- the independent harness -----------------------------------------------------------------------


class Clock:
    """Wall time of a block of calls: one pair of CUDA events on GPU, the host clock on CPU."""

    def __init__(self, device: Any) -> None:
        import torch

        self.torch = torch
        self.device = device
        self.cuda = device.type == "cuda"

    def sync(self) -> None:
        if self.cuda:
            self.torch.cuda.synchronize(self.device)

    def warm(self, fn: Callable[[], Any], seconds: float) -> float:
        """Run ``fn`` for ``seconds`` (at least twice); the seconds per call of the last half."""
        calls, t0 = 0, time.perf_counter()
        half_t, half_calls = t0, 0
        while calls < 2 or time.perf_counter() - t0 < seconds:
            fn()
            calls += 1
            if calls % 4 == 0:
                self.sync()
            if half_calls == 0 and time.perf_counter() - t0 >= seconds / 2:
                self.sync()
                half_t, half_calls = time.perf_counter(), calls
        self.sync()
        done = calls - half_calls
        return (time.perf_counter() - half_t) / max(1, done)

    def block(self, fn: Callable[[], Any], count: int) -> float:
        """Seconds per call over ``count`` calls back to back."""
        if self.cuda:
            start = self.torch.cuda.Event(enable_timing=True)
            end = self.torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(count):
                fn()
            end.record()
            self.sync()
            return float(start.elapsed_time(end)) / 1e3 / count
        t = time.perf_counter()
        for _ in range(count):
            fn()
        return (time.perf_counter() - t) / count


def _count(per_call: float, seconds: float, least: int) -> int:
    return max(least, min(100_000, math.ceil(seconds / per_call) if per_call > 0 else least))


def harness_gemm(device: Any, dtype: str, n: int, sizes: Sizes) -> float:
    """FLOP/s of ``A @ B`` (``2 n^3`` per product)."""
    import torch

    clock = Clock(device)
    torch.backends.cuda.matmul.allow_tf32 = dtype == "tf32"
    a = torch.randn(n, n, device=device)
    b = torch.randn(n, n, device=device)
    fn: Callable[[], Any]
    if dtype == "fp8":
        a8 = a.to(torch.float8_e4m3fn)
        b8 = b.to(torch.float8_e4m3fn).t().contiguous().t()
        one = torch.ones((), device=device)
        fn = lambda: torch._scaled_mm(a8, b8, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)  # noqa: E731
    else:
        td = {"fp32": torch.float32, "tf32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[dtype]
        at, bt = a.to(td), b.to(td)
        fn = lambda: torch.matmul(at, bt)  # noqa: E731
    per = clock.warm(fn, sizes.warmup_seconds)
    seconds = clock.block(fn, _count(per, sizes.measure_seconds, 10))
    torch.backends.cuda.matmul.allow_tf32 = False
    return 2.0 * n**3 / seconds


def harness_mlp(device: Any, dtype: str, sizes: Sizes) -> float:
    """FLOP/s of PARAM's MLP step, ``6 * batch * sum(in * out)`` per step."""
    import torch
    from torch import nn

    shape = sizes.mlp
    clock = Clock(device)
    td = compute_probe.torch_dtype(dtype)
    layers: list[nn.Module] = []
    for i, o in zip(shape.layers, shape.layers[1:], strict=False):
        layers += [nn.Linear(i, o), nn.ReLU()]
    model = nn.Sequential(*layers).to(device=device, dtype=td)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loss_f = nn.CrossEntropyLoss()
    x = torch.randn(shape.batch, shape.layers[0], device=device).to(td)
    y = torch.randint(shape.layers[-1], (shape.batch,), device=device)

    def step() -> None:
        opt.zero_grad()
        loss = loss_f(torch.softmax(model(x), dim=1).float(), y)
        loss.backward()
        opt.step()

    per = clock.warm(step, sizes.warmup_seconds)
    return shape.flop_per_step / clock.block(step, _count(per, sizes.measure_seconds, 5))


def harness_gpt(device: Any, sizes: Sizes) -> float:
    """Model FLOP/s (``6 * parameters * tokens/s``) of the ddp probe's GPT stepped without DDP."""
    import torch

    cfg = sizes.model
    clock = Clock(device)
    torch.manual_seed(1234)
    model = ddp_probe.build_model(cfg).to(device)
    params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    idx = torch.randint(0, cfg.vocab_size, (cfg.batch_size, cfg.seq_len + 1), device=device)
    x, y = idx[:, :-1].contiguous(), idx[:, 1:].contiguous()
    bf16 = device.type == "cuda" and torch.cuda.is_bf16_supported()

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=bf16):
            loss = model(x, y)
        loss.backward()
        opt.step()

    per = clock.warm(step, sizes.warmup_seconds)
    seconds = clock.block(step, _count(per, sizes.measure_seconds, 5))
    return ddp_probe.model_flop_per_second(params, cfg.batch_size * cfg.seq_len / seconds)


# --- the probes ------------------------------------------------------------------------------------


@dataclass
class ProbeRun:
    name: str
    wall_s: float
    outcome: str
    doc: dict[str, Any] = field(default_factory=dict)


def run_probe(name: str, device: str, args: Sequence[str], run_id: str, env: dict[str, str],
              nproc: int | None = 1) -> ProbeRun:
    """``python -m probes NAME`` as its own process (``nproc`` ranks; ``None``: the probe's default)."""
    argv = [sys.executable, "-m", "probes", name, "--device", device, "--run-id", run_id,
            "--timeout", str(PROBE_TIMEOUT_S - 10), *(["--nproc", str(nproc)] if nproc else []), *args]
    t = time.perf_counter()
    done = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=PROBE_TIMEOUT_S,
                          check=False)
    wall = time.perf_counter() - t
    try:
        doc = json.loads(done.stdout.strip().rsplit("\n", 1)[-1])
    except (json.JSONDecodeError, IndexError):
        return ProbeRun(name, wall, f"no result (exit {done.returncode}): {done.stderr.strip()[-300:]}")
    return ProbeRun(name, wall, str(doc.get("outcome")), doc)


def run_check(device: str, probe_args: dict[str, list[str]], env: dict[str, str]) -> tuple[float, str]:
    """``python -m probes check`` of :data:`FULL_CHECK` (one process); its wall time and each outcome."""
    tokens = [f"--arg={name}={token}" for name in FULL_CHECK for token in probe_args.get(name, [])]
    argv = [sys.executable, "-m", "probes", "check", "--device", device, "--probes", ",".join(FULL_CHECK),
            "--timeout", str(PROBE_TIMEOUT_S - 10), "--format", "json", *tokens]
    t = time.perf_counter()
    done = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=PROBE_TIMEOUT_S,
                          check=False)
    wall = time.perf_counter() - t
    outcomes: list[str] = []
    for line in done.stdout.splitlines():
        try:
            doc = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(doc, dict) and "probe" in doc:
            outcomes.append(f"{doc['probe']} {doc.get('outcome')}")
    if not outcomes:
        return wall, f"no result (exit {done.returncode}): {done.stderr.strip()[-300:]}"
    return wall, ", ".join(outcomes)


def measurement(doc: dict[str, Any], name: str, **labels: str) -> float | None:
    for m in doc.get("measurements", []):
        if m["name"] == name and all(m["labels"].get(k) == v for k, v in labels.items()):
            return float(m["value"])
    return None


# --- the rounds ------------------------------------------------------------------------------------


@dataclass
class Figure:
    key: str
    unit: str
    probe: list[float] = field(default_factory=list)
    harness: list[float] = field(default_factory=list)
    probe_clock_hz: list[float] = field(default_factory=list)
    probe_power_w: list[float] = field(default_factory=list)
    harness_clock_hz: list[float] = field(default_factory=list)
    harness_power_w: list[float] = field(default_factory=list)

    def ratios(self) -> list[float]:
        return [p / h for p, h in zip(self.probe, self.harness, strict=False) if h > 0]

    def summary(self) -> dict[str, Any]:
        def med(xs: list[float]) -> float | None:
            return statistics.median(xs) if xs else None

        p, h = med(self.probe), med(self.harness)
        return {**asdict(self), "probe_median": p, "harness_median": h,
                "ratio": (p / h) if p is not None and h else None, "ratios": self.ratios()}


def _note(fig: Figure, which: str, tel: Summary | None) -> None:
    if tel is None:
        return
    if tel.sm_clock_hertz is not None:
        getattr(fig, f"{which}_clock_hz").append(tel.sm_clock_hertz)
    if tel.power_watts is not None:
        getattr(fig, f"{which}_power_w").append(tel.power_watts)


def check(args: argparse.Namespace, log: Callable[[str], None]) -> dict[str, Any]:
    import torch

    device = torch.device(args.device if args.device == "cpu" else f"cuda:{args.gpu}")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    if device.type == "cuda":
        env["CUDA_VISIBLE_DEVICES"] = str(args.gpu)
    capability = torch.cuda.get_device_capability(device) if device.type == "cuda" else None
    wanted = args.dtypes or list(gemm_probe.DTYPES if device.type == "cuda" else gemm_probe.CPU_DEFAULT_DTYPES)
    dtypes = [d for d in wanted if gemm_probe.support(d, device.type, capability) is None]
    sizes = sizes_for(device.type, dtypes, args.tiny, args.warmup_seconds)
    mlp_dtype = "bf16" if device.type == "cuda" else "fp32"
    tel, why = (None, "not a GPU run") if device.type == "cpu" else open_gpu(None, None, args.gpu)
    watch = Watch(tel)
    gemm_args = [*sizes.probe_args["gemm"], "--dtypes", ",".join(dtypes)]
    if args.warmup_seconds is not None:
        gemm_args += ["--warmup-seconds", str(args.warmup_seconds)]
    figures = {f"gemm.{d}": Figure(f"gemm.{d}", "FLOP/s") for d in dtypes}
    figures["compute.mlp"] = Figure("compute.mlp", "FLOP/s")
    figures["ddp.model"] = Figure("ddp.model", "FLOP/s")
    figures["ddp.single_rank_model"] = Figure("ddp.single_rank_model", "FLOP/s")
    errors: list[str] = []
    params = sizes.model
    tokens = params.batch_size * params.seq_len

    def probe_gemm(r: int) -> None:
        run, t = watch.run(lambda: run_probe("gemm", device.type, gemm_args, f"gpucheck-gemm-{r}", env))
        if run.outcome != "pass":
            errors.append(f"round {r} gemm: {run.outcome}")
        for d in dtypes:
            value = measurement(run.doc, "flop_per_second", dtype=d)
            if value is not None:
                figures[f"gemm.{d}"].probe.append(value)
            clock, power = measurement(run.doc, "sm_clock_hertz", dtype=d), measurement(run.doc, "power_watts", dtype=d)
            own = Summary(1, clock, power, None, (), None) if clock is not None else t
            _note(figures[f"gemm.{d}"], "probe", own)

    def harness_gemms(r: int) -> None:
        for d in dtypes:
            value, t = watch.run(lambda d=d: harness_gemm(device, d, sizes.gemm[d], sizes))
            figures[f"gemm.{d}"].harness.append(value)
            _note(figures[f"gemm.{d}"], "harness", t)

    def probe_compute(r: int) -> None:
        run, t = watch.run(lambda: run_probe("compute", device.type, sizes.probe_args["compute"],
                                             f"gpucheck-compute-{r}", env))
        value = measurement(run.doc, "mlp_flop_per_second")
        if value is None:
            errors.append(f"round {r} compute: {run.outcome}")
            return
        figures["compute.mlp"].probe.append(value)
        _note(figures["compute.mlp"], "probe", t)

    def harness_compute(r: int) -> None:
        value, t = watch.run(lambda: harness_mlp(device, mlp_dtype, sizes))
        figures["compute.mlp"].harness.append(value)
        _note(figures["compute.mlp"], "harness", t)

    def probe_ddp(r: int) -> None:
        run, t = watch.run(lambda: run_probe("ddp", device.type, sizes.probe_args["ddp"], f"gpucheck-ddp-{r}", env))
        value = measurement(run.doc, "model_flop_per_second")
        single = measurement(run.doc, "single_rank_throughput_samples_per_second")
        n_params = run.doc.get("params", {}).get("parameters")
        if value is None or single is None or not n_params:
            errors.append(f"round {r} ddp: {run.outcome}")
            return
        figures["ddp.model"].probe.append(value)
        figures["ddp.single_rank_model"].probe.append(
            ddp_probe.model_flop_per_second(int(n_params), single * params.seq_len))
        _note(figures["ddp.model"], "probe", t)
        _note(figures["ddp.single_rank_model"], "probe", t)

    def harness_ddp(r: int) -> None:
        value, t = watch.run(lambda: harness_gpt(device, sizes))
        for key in ("ddp.model", "ddp.single_rank_model"):
            figures[key].harness.append(value)
            _note(figures[key], "harness", t)

    pairs = [(probe_gemm, harness_gemms), (probe_compute, harness_compute), (probe_ddp, harness_ddp)]
    for r in range(args.rounds):
        for probe_fn, harness_fn in pairs:
            first, second = (probe_fn, harness_fn) if r % 2 == 0 else (harness_fn, probe_fn)
            first(r)
            second(r)
        log(f"# round {r + 1}/{args.rounds} done")

    full: dict[str, Any] = {}
    full_env = {k: v for k, v in env.items() if k != "CUDA_VISIBLE_DEVICES" or device.type == "cpu"}
    if not args.no_full_check:
        walls: dict[str, float] = {}
        outcomes: dict[str, str] = {}
        for name in FULL_CHECK:
            extra = sizes.probe_args.get(name, [])
            run = run_probe(name, device.type, extra, "gpucheck-full", full_env, nproc=None)
            walls[name], outcomes[name] = run.wall_s, run.outcome
        full = {"probes_s": walls, "outcomes": outcomes, "total_s": sum(walls.values())}
        help_run = subprocess.run([sys.executable, "-m", "probes", "check", "--help"], cwd=REPO, env=env,
                                  capture_output=True, text=True, timeout=60, check=False)
        if help_run.returncode == 0:
            wall, outcome = run_check(device.type, sizes.probe_args, full_env)
            full["one_process_s"] = wall
            full["one_process_outcome"] = outcome
    return {
        "device": device.type,
        "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "rounds": args.rounds,
        "tokens_per_step": tokens,
        "telemetry": "nvml" if tel is not None else why,
        "figures": [f.summary() for f in figures.values()],
        "full_check": full,
        "errors": errors,
    }


def _fmt(value: float | None, scale: float, digits: int) -> str:
    return "-" if value is None else f"{value / scale:,.{digits}f}"


def _state(clock: list[float], power: list[float]) -> str:
    c = statistics.median(clock) if clock else None
    p = statistics.median(power) if power else None
    return f"{_fmt(c, 1e6, 0)} MHz {_fmt(p, 1, 0)} W" if c is not None or p is not None else "-"


def render(report: dict[str, Any]) -> str:
    cpu = report["device"] == "cpu"
    scale, unit = (1e9, "GFLOP/s") if cpu else (1e12, "TFLOP/s")
    lines = [f"# gpu_check on {report['gpu']} ({report['device']}), torch {report['torch']}, "
             f"{report['rounds']} round(s), NVML: {report['telemetry']}",
             f"{'figure':<24} {'probe ' + unit:>16} {'harness ' + unit:>18} {'ratio':>7} {'ratios':>19}"
             f"  {'probe clock/power':>20}  {'harness clock/power':>20}"]
    for f in report["figures"]:
        ratios = f["ratios"]
        spread = f"{min(ratios):.3f}-{max(ratios):.3f}" if ratios else "-"
        lines.append(
            f"{f['key']:<24} {_fmt(f['probe_median'], scale, 2):>16} {_fmt(f['harness_median'], scale, 2):>18}"
            f" {_fmt(f['ratio'], 1, 3):>7} {spread:>19}  {_state(f['probe_clock_hz'], f['probe_power_w']):>20}"
            f"  {_state(f['harness_clock_hz'], f['harness_power_w']):>20}")
    full = report["full_check"]
    if full:
        parts = " + ".join(f"{k} {v:.1f} s ({full['outcomes'][k]})" for k, v in full["probes_s"].items())
        lines.append(f"# full check, one process per probe: {parts} = {full['total_s']:.1f} s")
        if "one_process_s" in full:
            lines.append(f"# full check in one process (probes check): {full['one_process_s']:.1f} s "
                         f"({full['one_process_outcome']})")
    lines += [f"# error: {e}" for e in report["errors"]]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=3, help="alternating probe/harness rounds (default 3)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--device", choices=("cuda", "cpu"), default=None, help="default: cuda when there is one")
    p.add_argument("--gpu", type=int, default=0, help="the GPU's index on the node (default 0)")
    p.add_argument("--dtypes", type=lambda s: [d for d in s.split(",") if d], default=None,
                   help="GEMM dtypes (default: every one the device supports)")
    p.add_argument("--warmup-seconds", type=float, default=None,
                   help="warm-up of each harness figure and of the gemm probe (default the probe's: 1 s GPU)")
    p.add_argument("--tiny", action="store_true", help="tiny sizes (a CPU test in seconds)")
    p.add_argument("--no-full-check", action="store_true", help="skip the full-check timing")
    args = p.parse_args(argv)
    if args.rounds < 1:
        p.error("--rounds must be >= 1")
    if args.device is None:
        import torch

        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    report = check(args, lambda line: print(line, file=sys.stderr, flush=True))
    print(json.dumps(report, indent=1) if args.json else render(report))
    return 1 if report["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
