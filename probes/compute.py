"""The ``compute`` probe: PARAM's compute benchmarks, per GPU, all GPUs at once.

In the manner of facebookresearch/param ``train/compute/pt``:

- ``pytorch_linear.py``: a stack of ``nn.Linear`` layers (``input, hidden x layers, output``)
  with ReLU, softmax and cross-entropy, trained with SGD on random data; weights and data cast
  to the dtype (PARAM's ``--explicit-cast``; ``tf32`` is fp32 with TF32 matmuls allowed).
  ``mlp_flop_per_second = 6 * batch * sum(in_i * out_i) / step`` (PARAM: forward 2, backward 4),
  the step timed around ``zero_grad; forward; loss; backward; step`` (CUDA events on GPU),
  median of ``--steps``, after ``--warmup`` steps and then ``--warmup-seconds`` more of them (1 s
  on GPU) until the step time is steady (as the ``gemm`` probe: a GPU at full load reaches its
  power limit and lowers its clock within about a second); gradients are set to ``None`` between
  steps (``zero_grad()``'s default since torch 2.0, what PARAM does there), not zero-filled;
- ``pytorch_emb.py``: ``nn.EmbeddingBag(features, dim, mode="sum")`` over ``batch`` bags of
  ``nnz`` random rows. ``embedding_bag_bytes_per_second = batch * nnz * dim * element size /
  time`` (PARAM's ``total_bytes``: the rows read), median of ``--steps`` lookups.

Each rank measures its own device (label ``gpu``); check ``compute.embedding_bag.result``: the
bags' sums equal a float64 reference over a few bags, and ``compute.mlp.finite``: the loss
stays finite. The defaults on GPU are larger than PARAM's (which fit in L2 on an H100): an MLP
of 8 x 4096 at batch 4096 and a 4M x 128 table; on CPU tiny ones.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from probes.catalogue import ProbeName
from probes.context import ProbeContext, ProbeOutput
from probes.gemm import set_tf32, settle, time_each
from probes.options import non_negative_float
from probes.result import Check, Measurement, ProbeResult
from probes.timing import median

if TYPE_CHECKING:
    import torch

NAME = ProbeName.COMPUTE
HELP = "per-GPU MLP training FLOP/s and EmbeddingBag bytes/s (PARAM's compute benchmarks)"

DTYPES = ("fp32", "tf32", "bf16", "fp16")
REFERENCE_BAGS = 8
EMB_TOLERANCE = 1e-4
"""Allowed ``max |bag - ref| / (nnz * max|row|)`` of fp32 sums (rounding of ``nnz`` additions is ~1e-7)."""


@dataclass(frozen=True)
class MlpShape:
    layers: tuple[int, ...]
    """Widths from the input to the output: ``layers[i] -> layers[i + 1]`` per ``nn.Linear``."""
    batch: int

    @property
    def flop_per_step(self) -> int:
        """PARAM's count: ``6 * batch * sum(in * out)`` (forward 2, backward 4; bias, ReLU, loss left out)."""
        return 6 * self.batch * sum(a * b for a, b in zip(self.layers, self.layers[1:], strict=False))


@dataclass(frozen=True)
class EmbShape:
    features: int
    dim: int
    nnz: int
    batch: int

    def bytes_per_lookup(self, element_bytes: int) -> int:
        """PARAM's ``total_bytes``: every looked-up row read once."""
        return self.batch * self.nnz * self.dim * element_bytes


GPU_MLP = MlpShape(layers=(4096,) * 9, batch=4096)
CPU_MLP = MlpShape(layers=(256,) * 3, batch=128)
GPU_EMB = EmbShape(features=4_000_000, dim=128, nnz=64, batch=16384)
CPU_EMB = EmbShape(features=100_000, dim=64, nnz=10, batch=1000)


def _dtype_arg(text: str) -> str:
    if text not in DTYPES:
        raise argparse.ArgumentTypeError(f"unknown dtype {text!r}; choose from {', '.join(DTYPES)}")
    return text


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dtype", type=_dtype_arg, default=None, help="MLP dtype (default bf16 on GPU, fp32 on CPU)")
    parser.add_argument("--layer-num", type=int, default=None, help="hidden Linear layers (default 7 GPU, 1 CPU)")
    parser.add_argument("--hidden-size", type=int, default=None, help="MLP width (default 4096 GPU, 256 CPU)")
    parser.add_argument("--batch-size", type=int, default=None, help="MLP batch (default 4096 GPU, 128 CPU)")
    parser.add_argument("--features", type=int, default=None, help="EmbeddingBag rows (default 4M GPU, 100k CPU)")
    parser.add_argument("--embdim", type=int, default=None, help="EmbeddingBag width (default 128 GPU, 64 CPU)")
    parser.add_argument("--nnz", type=int, default=None, help="rows per bag (default 64 GPU, 10 CPU)")
    parser.add_argument("--bags", type=int, default=None, help="bags per lookup (default 16384 GPU, 1000 CPU)")
    parser.add_argument("--warmup", type=int, default=None, help="untimed steps (default 5 GPU, 1 CPU)")
    parser.add_argument(
        "--warmup-seconds",
        type=non_negative_float,
        default=None,
        help="then MLP steps for at least this long and until steady, at most 3x (default 1.0 GPU, 0.05 CPU)",
    )
    parser.add_argument("--steps", type=int, default=None, help="timed steps (default 20 GPU, 5 CPU)")


def shapes(args: argparse.Namespace, cuda: bool) -> tuple[MlpShape, EmbShape]:
    mlp, emb = (GPU_MLP, GPU_EMB) if cuda else (CPU_MLP, CPU_EMB)
    width = args.hidden_size or mlp.layers[0]
    hidden = args.layer_num if args.layer_num is not None else len(mlp.layers) - 2
    if hidden < 0:
        raise ValueError("--layer-num must be >= 0")
    layers = (width,) * (hidden + 2)
    out_mlp = MlpShape(layers=layers, batch=args.batch_size or mlp.batch)
    out_emb = EmbShape(features=args.features or emb.features, dim=args.embdim or emb.dim,
                       nnz=args.nnz or emb.nnz, batch=args.bags or emb.batch)
    if min(*out_mlp.layers, out_mlp.batch, out_emb.features, out_emb.dim, out_emb.nnz, out_emb.batch) < 1:
        raise ValueError("sizes must be >= 1")
    return out_mlp, out_emb


def support(dtype: str, device_type: str, capability: tuple[int, int] | None) -> str | None:
    """``None`` if the MLP can run in ``dtype`` here, else why not (tf32 is a CUDA matmul mode)."""
    if device_type == "cpu":
        return "tf32 is a CUDA matmul mode" if dtype == "tf32" else None
    if dtype in ("tf32", "bf16") and (capability or (0, 0)) < (8, 0):
        return "not supported on this device (needs compute capability 8.0)"
    return None


def torch_dtype(dtype: str) -> torch.dtype:
    import torch

    return {"fp32": torch.float32, "tf32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[dtype]


def _mlp(
    ctx: ProbeContext, shape: MlpShape, dtype: str, warmup: int, steps: int, warmup_seconds: float = 0.0
) -> tuple[float, bool]:
    """Median step seconds and whether every loss was finite."""
    import torch
    from torch import nn

    torch.manual_seed(1 + ctx.rank)
    tdtype = torch_dtype(dtype)
    layers: list[nn.Module] = []
    for a, b in zip(shape.layers, shape.layers[1:], strict=False):
        layers += [nn.Linear(a, b), nn.ReLU()]
    model = nn.Sequential(*layers).to(device=ctx.device, dtype=tdtype)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loss_f = nn.CrossEntropyLoss()
    gen = torch.Generator(device=ctx.device)
    gen.manual_seed(100 + ctx.rank)
    data = torch.randn(shape.batch, shape.layers[0], device=ctx.device, generator=gen).to(tdtype)
    target = torch.randint(shape.layers[-1], (shape.batch,), device=ctx.device, generator=gen)
    losses: list[torch.Tensor] = []

    def step(_: int) -> None:
        optimizer.zero_grad(set_to_none=True)
        out = torch.softmax(model(data), dim=1)
        loss = loss_f(out.float(), target)
        loss.backward()
        optimizer.step()
        losses.append(loss.detach())

    ctx.barrier()
    ctx.mark("compute.mlp.warmup")
    for i in range(warmup):
        step(i)
    ctx.sync()
    settle(ctx, step, warmup_seconds)
    ctx.mark("compute.mlp.timed")
    times = time_each(ctx, step, steps)
    finite = bool(torch.isfinite(torch.stack(losses)).all().item())
    return median(times), finite


def _embedding_bag(ctx: ProbeContext, shape: EmbShape, warmup: int, steps: int) -> tuple[float, float]:
    """Median lookup seconds and the check's relative error over a few bags."""
    import torch
    from torch import nn

    torch.manual_seed(2 + ctx.rank)
    emb = nn.EmbeddingBag(shape.features, shape.dim, mode="sum").to(ctx.device)
    gen = torch.Generator(device=ctx.device)
    gen.manual_seed(200 + ctx.rank)
    indices = torch.randint(0, shape.features, (shape.batch * shape.nnz,), device=ctx.device, generator=gen)
    offsets = torch.arange(0, shape.batch * shape.nnz, shape.nnz, device=ctx.device)
    out: list[torch.Tensor] = []

    def lookup(_: int) -> None:
        with torch.no_grad():
            out[:] = [emb(indices, offsets)]

    ctx.mark("compute.embedding_bag.warmup")
    for i in range(max(1, warmup)):
        lookup(i)
    ctx.sync()
    ctx.barrier()
    ctx.mark("compute.embedding_bag.timed")
    times = time_each(ctx, lookup, steps)
    result = out[0]
    if "corrupt" in ctx.faults:
        result[0, 0] += 1.0
    bags = torch.tensor(sorted({i * (shape.batch - 1) // max(1, REFERENCE_BAGS - 1) for i in range(REFERENCE_BAGS)}),
                        device=ctx.device)
    rows = indices.view(shape.batch, shape.nnz)[bags]
    weight = emb.weight.detach()
    ref = weight[rows].to(torch.float64).sum(dim=1)
    got = result[bags].to(torch.float64)
    scale = shape.nnz * float(weight.abs().max().item()) or 1.0
    error = float((got - ref).abs().max().item()) / scale if bool(torch.isfinite(got).all().item()) else math.inf
    return median(times), error


def run(ctx: ProbeContext) -> ProbeOutput:
    import torch

    args = ctx.args
    cuda = ctx.device_type == "cuda"
    mlp, emb = shapes(args, cuda)
    dtype: str = args.dtype or ("bf16" if cuda else "fp32")
    warmup = args.warmup if args.warmup is not None else (5 if cuda else 1)
    steps = args.steps if args.steps is not None else (20 if cuda else 5)
    warmup_seconds: float = args.warmup_seconds if args.warmup_seconds is not None else (1.0 if cuda else 0.05)
    if steps < 1 or warmup < 0:
        raise ValueError("--steps must be >= 1 and --warmup >= 0")
    capability = torch.cuda.get_device_capability(ctx.device) if cuda else None
    why = support(dtype, ctx.device_type, capability)
    reasons = [w for w in ctx.gather(why) if w]
    tf32 = set_tf32(dtype, ctx.device_type)
    mlp_seconds, finite = (0.0, True) if reasons else _mlp(ctx, mlp, dtype, warmup, steps, warmup_seconds)
    emb_seconds, emb_error = _embedding_bag(ctx, emb, warmup, steps)
    gathered = ctx.gather((ctx.gpu, mlp_seconds, finite, emb_seconds, emb_error))
    out = ProbeOutput(params={
        "dtype": dtype,
        "tf32": tf32,
        "mlp_layers": list(mlp.layers),
        "mlp_batch": mlp.batch,
        "mlp_flop_per_step": mlp.flop_per_step,
        "emb_features": emb.features,
        "emb_dim": emb.dim,
        "emb_nnz": emb.nnz,
        "emb_bags": emb.batch,
        "emb_bytes_per_lookup": emb.bytes_per_lookup(4),
        "warmup": warmup,
        "warmup_seconds": warmup_seconds,
        "steps": steps,
        "tolerance": EMB_TOLERANCE,
        **({"skipped": {"mlp": reasons[0]}} if reasons else {}),
    })
    if ctx.rank != 0:
        return out
    for rank, (gpu, mlp_s, fin, emb_s, err) in enumerate(gathered):
        node = ctx.node_of(rank)
        labels = {"gpu": str(gpu)}
        if not reasons:
            out.measurements.append(Measurement(name="mlp_flop_per_second", value=mlp.flop_per_step / mlp_s,
                                                labels={**labels, "dtype": dtype}, node=node))
            out.checks.append(Check(name="compute.mlp.finite", ok=fin, node=node, gpu=gpu, rank=rank,
                                    detail="every loss finite" if fin else "a training step gave a non-finite loss"))
        out.measurements.append(Measurement(name="embedding_bag_bytes_per_second",
                                            value=emb.bytes_per_lookup(4) / emb_s, labels=labels, node=node))
        out.checks.append(Check(name="compute.embedding_bag.result", ok=err <= EMB_TOLERANCE, node=node, gpu=gpu,
                                rank=rank, detail=f"max |bag - ref| / (nnz max|row|) = {err:.3g} "
                                                  f"(tolerance {EMB_TOLERANCE:g})"))
    return out


def format_table(result: ProbeResult) -> str:
    p = result.params
    lines = [f"# MLP {p.get('mlp_layers')} batch {p.get('mlp_batch')} {p.get('dtype')}; EmbeddingBag "
             f"{p.get('emb_features')} x {p.get('emb_dim')}, {p.get('emb_bags')} bags of {p.get('emb_nnz')}",
             f"# {'node':<20}  {'gpu':>3}  {'MLP TFLOP/s':>11}  {'EmbBag GB/s':>11}"]
    rows: dict[tuple[str, str], dict[str, float]] = {}
    for m in result.measurements:
        rows.setdefault((m.node or "-", m.labels.get("gpu", "-")), {})[m.name] = m.value
    for (node, gpu), values in rows.items():
        tflops = values.get("mlp_flop_per_second")
        gbs = values.get("embedding_bag_bytes_per_second")
        lines.append(f"  {node:<20}  {gpu:>3}  {'-' if tflops is None else f'{tflops / 1e12:.3f}':>11}"
                     f"  {'-' if gbs is None else f'{gbs / 1e9:.2f}':>11}")
    skipped: dict[str, Any] = p.get("skipped") or {}
    lines += [f"# {what}: skipped: {why}" for what, why in skipped.items()]
    return "\n".join(lines)
