"""The ``ddp`` probe: a few training steps of a small GPT-style decoder under DistributedDataParallel.

Like PyTorch's ``benchmarks/distributed/ddp/benchmark.py``: synthetic data, every step
``zero_grad; forward; loss; backward; optimizer.step`` timed on its own (CUDA events on GPU, with
no host synchronisation between steps, as in training; the host clock on CPU); ``--warmup``
steps dropped; step-time quantiles over all ranks x steps (p50, p90). The same model without DDP,
on each rank alone (all ranks at once, no communication), gives the single-rank throughput, and
the scaling efficiency is per-rank DDP throughput over it. Both models are built, warmed up and
then timed in alternating turns (single, DDP, DDP, single), so both see the same GPU state (a GPU
at its power limit clocks lower after a few seconds of load) and neither gains by going first.
DDP runs with ``gradient_as_bucket_view`` (gradients live in the all-reduce buckets: no copy into
and out of them each step) and without ``find_unused_parameters`` or buffer broadcasts.

- ``throughput_samples_per_second``: ``world_size * batch / p50`` (``per_rank``: each
  rank's ``batch / median`` of its own steps);
- ``step_seconds`` with ``quantile`` 0.5 and 0.9;
- ``single_rank_throughput_samples_per_second``: mean over ranks of ``batch / median`` without DDP;
- ``scaling_efficiency_ratio``: ``throughput / world_size / single_rank_throughput``;
- ``model_flop_per_second`` (label ``dtype``: ``bf16`` under autocast, else ``fp32``), per GPU:
  ``6 * parameters * tokens_per_second_per_gpu`` with ``tokens = batch * seq_len`` per rank and
  step and the p50 step time (``per_rank``: each rank's median). 6 FLOPs per parameter and token:
  2 forward, 4 backward, the formula of the LLaMA/Megatron benchmarks and Kaplan et al. Attention's
  own FLOPs (``12 * n_layer * seq_len * n_embd`` per token, forward and backward: PaLM's extra
  term) are not included; ``params.attention_flop_per_token`` gives them for who wants them.
  healthd divides it by the node class's peak for the dtype (``healthd/judge/peaks.toml``): MFU;
- check ``ddp.parameters_identical``: after the steps every rank holds bit-identical
  parameters (an element-wise MAX and MIN all-reduce agree everywhere); a rank whose
  parameter digest differs from the majority is named.

GPU default is GPT-2-small-like (12 layers, 12 heads, 768 wide, 1024 tokens, batch 8, bf16
autocast where supported); CPU default is tiny so the probe stays within seconds.
"""

from __future__ import annotations

import argparse
import itertools
import math
import time
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from probes.catalogue import ProbeName
from probes.context import ProbeContext, ProbeOutput
from probes.result import Check, Measurement, ProbeResult
from probes.timing import mean, median, quantile

if TYPE_CHECKING:
    import torch

NAME = ProbeName.DDP
HELP = "training throughput of a small GPT under DDP, scaling efficiency, parameter equality"

QUANTILES = (0.5, 0.9)
ROUNDS = 2
"""The timed steps of each model are taken in this many turns, alternating (see :func:`alternate`)."""


@dataclass(frozen=True)
class ModelConfig:
    n_layer: int
    n_head: int
    n_embd: int
    seq_len: int
    vocab_size: int
    batch_size: int


GPU_DEFAULT = ModelConfig(n_layer=12, n_head=12, n_embd=768, seq_len=1024, vocab_size=50304, batch_size=8)
CPU_DEFAULT = ModelConfig(n_layer=2, n_head=2, n_embd=64, seq_len=64, vocab_size=512, batch_size=4)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--n-layer", type=int, default=None, help="decoder blocks (default 12 GPU, 2 CPU)")
    parser.add_argument("--n-head", type=int, default=None, help="attention heads (default 12 GPU, 2 CPU)")
    parser.add_argument("--n-embd", type=int, default=None, help="model width (default 768 GPU, 64 CPU)")
    parser.add_argument("--seq-len", type=int, default=None, help="tokens per sample (default 1024 GPU, 64 CPU)")
    parser.add_argument("--vocab-size", type=int, default=None, help="vocabulary (default 50304 GPU, 512 CPU)")
    parser.add_argument("--batch-size", type=int, default=None, help="samples per rank and step (default 8 GPU, 4 CPU)")
    parser.add_argument("--warmup", type=int, default=None, help="untimed steps (default 5 GPU, 2 CPU)")
    parser.add_argument("--steps", type=int, default=None, help="timed steps (default 20 GPU, 8 CPU)")


def model_config(args: argparse.Namespace, cuda: bool) -> ModelConfig:
    base = GPU_DEFAULT if cuda else CPU_DEFAULT
    cfg = ModelConfig(
        n_layer=args.n_layer or base.n_layer,
        n_head=args.n_head or base.n_head,
        n_embd=args.n_embd or base.n_embd,
        seq_len=args.seq_len or base.seq_len,
        vocab_size=args.vocab_size or base.vocab_size,
        batch_size=args.batch_size or base.batch_size,
    )
    if min(cfg.n_layer, cfg.n_head, cfg.n_embd, cfg.seq_len, cfg.vocab_size, cfg.batch_size) < 1:
        raise ValueError("model sizes must be >= 1")
    if cfg.n_embd % cfg.n_head:
        raise ValueError(f"--n-embd {cfg.n_embd} is not a multiple of --n-head {cfg.n_head}")
    return cfg


def build_model(cfg: ModelConfig) -> torch.nn.Module:
    """A GPT-2-style decoder: token + position embeddings, pre-LN blocks (causal attention,
    4x GELU MLP), final LayerNorm, tied LM head; ``forward(idx, targets)`` returns the loss."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ln1 = nn.LayerNorm(cfg.n_embd)
            self.qkv = nn.Linear(cfg.n_embd, 3 * cfg.n_embd)
            self.proj = nn.Linear(cfg.n_embd, cfg.n_embd)
            self.ln2 = nn.LayerNorm(cfg.n_embd)
            self.fc = nn.Linear(cfg.n_embd, 4 * cfg.n_embd)
            self.out = nn.Linear(4 * cfg.n_embd, cfg.n_embd)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            b, t, c = x.shape
            q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
            shape = (b, t, cfg.n_head, c // cfg.n_head)
            q, k, v = (z.view(shape).transpose(1, 2) for z in (q, k, v))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.proj(y.transpose(1, 2).contiguous().view(b, t, c))
            out: torch.Tensor = x + self.out(F.gelu(self.fc(self.ln2(x))))
            return out

    class GPT(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.wte = nn.Embedding(cfg.vocab_size, cfg.n_embd)
            self.wpe = nn.Embedding(cfg.seq_len, cfg.n_embd)
            self.blocks = nn.ModuleList(Block() for _ in range(cfg.n_layer))
            self.ln_f = nn.LayerNorm(cfg.n_embd)
            self.head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
            self.head.weight = self.wte.weight

        def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
            pos = torch.arange(idx.shape[1], device=idx.device)
            x = self.wte(idx) + self.wpe(pos)
            for block in self.blocks:
                x = block(x)
            logits = self.head(self.ln_f(x))
            return F.cross_entropy(logits.view(-1, logits.shape[-1]).float(), targets.view(-1))

    model: torch.nn.Module = GPT()
    return model


FLOP_PER_PARAMETER_TOKEN = 6
"""Forward (2) and backward (4) multiply-adds-as-2-FLOPs per parameter and token."""


def model_flop_per_second(parameters: int, tokens_per_second: float) -> float:
    """``6 * N * tokens/s``; attention's own FLOPs are not included (see :func:`attention_flop_per_token`).

    >>> model_flop_per_second(124_000_000, 100_000)
    74400000000000.0
    """
    return float(FLOP_PER_PARAMETER_TOKEN * parameters * tokens_per_second)


def attention_flop_per_token(cfg: ModelConfig) -> int:
    """The causal-attention score and value products, forward and backward, per token (PaLM, appendix B)."""
    return 12 * cfg.n_layer * cfg.seq_len * cfg.n_embd


def compute_dtype(autocast_bf16: bool) -> str:
    return "bf16" if autocast_bf16 else "fp32"


class Trainer:
    """One model, its AdamW and its synthetic batch; :meth:`steps` runs and times training steps."""

    def __init__(self, ctx: ProbeContext, model: torch.nn.Module, cfg: ModelConfig) -> None:
        import torch

        gen = torch.Generator(device=ctx.device)
        gen.manual_seed(2000 + ctx.rank)
        idx = torch.randint(0, cfg.vocab_size, (cfg.batch_size, cfg.seq_len + 1), device=ctx.device, generator=gen)
        self.x, self.y = idx[:, :-1].contiguous(), idx[:, 1:].contiguous()
        self.ctx = ctx
        self.model = model
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
        self.autocast_bf16 = ctx.device_type == "cuda" and torch.cuda.is_bf16_supported()

    def _step(self) -> None:
        import torch

        self.optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device_type=self.ctx.device_type, dtype=torch.bfloat16, enabled=self.autocast_bf16):
            loss = self.model(self.x, self.y)
        loss.backward()
        self.optimizer.step()

    def steps(self, count: int) -> list[float]:
        """Seconds of each of ``count`` steps. On GPU each step is timed by CUDA events and the host
        is not synchronised between steps (as in training: the host queues the next step while the
        GPU runs this one), only after the last; on CPU the host clock (the ops are synchronous)."""
        if self.ctx.device_type == "cuda":
            import torch

            event: Any = torch.cuda.Event
            marks = [event(enable_timing=True) for _ in range(count + 1)]
            marks[0].record()
            for i in range(count):
                self._step()
                marks[i + 1].record()
            self.ctx.sync()
            return [float(a.elapsed_time(b)) / 1e3 for a, b in itertools.pairwise(marks)]
        times = []
        for _ in range(count):
            t = time.perf_counter()
            self._step()
            times.append(time.perf_counter() - t)
        return times


def chunks(steps: int, rounds: int) -> list[int]:
    """``steps`` split into ``rounds`` nearly equal parts, empty ones dropped.

    >>> chunks(20, 2), chunks(5, 2), chunks(1, 2)
    ([10, 10], [3, 2], [1])
    """
    parts = [steps // rounds + (1 if i < steps % rounds else 0) for i in range(rounds)]
    return [p for p in parts if p]


def alternate(
    ctx: ProbeContext, single: Trainer, ddp: Trainer, warmup: int, steps: int
) -> tuple[list[float], list[float]]:
    """Warm both up, then time them in turns, single-DDP-DDP-single (:data:`ROUNDS` halves each), so
    that both see the same GPU state (clock, power cap, temperature) and neither is favoured by
    going first; the ranks enter each turn together."""
    single_times: list[float] = []
    ddp_times: list[float] = []
    ctx.mark("ddp.single.warmup")
    single.steps(warmup)
    ctx.barrier()
    ctx.mark("ddp.ddp.warmup")
    ddp.steps(warmup)
    parts = chunks(steps, ROUNDS)
    turns = [(t, n) for i, n in enumerate(parts) for t in ((single, ddp) if i % 2 == 0 else (ddp, single))]
    for trainer, n in turns:
        ctx.barrier()
        phase = "single" if trainer is single else "ddp"
        ctx.mark(f"ddp.{phase}.timed")
        (single_times if trainer is single else ddp_times).extend(trainer.steps(n))
    return single_times, ddp_times


def _flat_params(model: torch.nn.Module) -> torch.Tensor:
    import torch

    return torch.cat([p.detach().reshape(-1).float() for p in model.parameters()])


def _digest(flat: torch.Tensor) -> int:
    """A position-weighted checksum of the parameters' bits (equal bits -> equal digest)."""
    import torch

    bits = flat.view(torch.int32).to(torch.int64)
    weights = torch.arange(flat.numel(), device=flat.device, dtype=torch.int64) % 1_000_003 + 1
    return int((bits * weights).sum().item())


def run(ctx: ProbeContext) -> ProbeOutput:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    args = ctx.args
    cuda = ctx.device_type == "cuda"
    cfg = model_config(args, cuda)
    warmup = args.warmup if args.warmup is not None else (5 if cuda else 2)
    steps = args.steps if args.steps is not None else (20 if cuda else 8)
    if steps < 1 or warmup < 0:
        raise ValueError("--steps must be >= 1 and --warmup >= 0")

    ctx.mark("ddp.build")
    torch.manual_seed(1234)
    single_model = build_model(cfg).to(ctx.device)
    n_params = sum(p.numel() for p in single_model.parameters())
    torch.manual_seed(1234)
    model = build_model(cfg).to(ctx.device)
    ddp = DistributedDataParallel(
        model,
        device_ids=[ctx.device.index] if cuda else None,
        broadcast_buffers=False,
        bucket_cap_mb=25,
        gradient_as_bucket_view=True,
    )
    ctx.barrier()
    single_times, ddp_times = alternate(ctx, Trainer(ctx, single_model, cfg), Trainer(ctx, ddp, cfg), warmup, steps)
    del single_model

    bf16 = cuda and torch.cuda.is_bf16_supported()
    ctx.mark("ddp.check")
    flat = _flat_params(model)
    if "corrupt" in ctx.faults:
        flat[0] += 1.0
    hi, lo = flat.clone(), flat.clone()
    dist.all_reduce(hi, op=dist.ReduceOp.MAX)
    dist.all_reduce(lo, op=dist.ReduceOp.MIN)
    differing = int((hi != lo).sum().item())
    digest = _digest(flat)
    gathered = ctx.gather((single_times, ddp_times, digest))

    out = ProbeOutput(
        params={
            "n_layer": cfg.n_layer,
            "n_head": cfg.n_head,
            "n_embd": cfg.n_embd,
            "seq_len": cfg.seq_len,
            "vocab_size": cfg.vocab_size,
            "batch_size": cfg.batch_size,
            "parameters": n_params,
            "warmup": warmup,
            "steps": steps,
            "rounds": ROUNDS,
            "autocast": "bf16" if bf16 else None,
            "optimizer": "AdamW",
            "flop_per_token": FLOP_PER_PARAMETER_TOKEN * n_params,
            "attention_flop_per_token": attention_flop_per_token(cfg),
        }
    )
    if ctx.rank != 0:
        return out
    return summarize(ctx, cfg, n_params, compute_dtype(bf16), gathered, differing, out)


def summarize(
    ctx: ProbeContext,
    cfg: ModelConfig,
    parameters: int,
    dtype: str,
    gathered: list[Any],
    differing: int,
    out: ProbeOutput,
) -> ProbeOutput:
    batch = cfg.batch_size
    tokens = batch * cfg.seq_len
    world = len(gathered)
    nodes = {ctx.node_of(r) for r in range(world)}
    node = next(iter(nodes)) if len(nodes) == 1 else None
    single_per_rank = [batch / median(s) for s, _, _ in gathered]
    ddp_per_rank = [batch / median(d) for _, d, _ in gathered]
    all_steps = [t for _, d, _ in gathered for t in d]
    p50 = quantile(all_steps, 0.5)
    throughput = world * batch / p50
    single = mean(single_per_rank)
    out.measurements += [
        Measurement(name="throughput_samples_per_second", value=throughput, node=node, per_rank=ddp_per_rank),
        *(
            Measurement(
                name="step_seconds",
                value=quantile(all_steps, q),
                labels={"quantile": str(q)},
                node=node,
                per_rank=[quantile(d, q) for _, d, _ in gathered],
            )
            for q in QUANTILES
        ),
        Measurement(
            name="single_rank_throughput_samples_per_second", value=single, node=node, per_rank=single_per_rank
        ),
        Measurement(name="scaling_efficiency_ratio", value=throughput / world / single, node=node),
        Measurement(
            name="model_flop_per_second",
            value=model_flop_per_second(parameters, tokens / p50),
            labels={"dtype": dtype},
            node=node,
            per_rank=[model_flop_per_second(parameters, tokens / median(d)) for _, d, _ in gathered],
        ),
    ]
    digests = [g for _, _, g in gathered]
    majority, votes = Counter(digests).most_common(1)[0]
    odd = [r for r, d in enumerate(digests) if d != majority] if votes * 2 > world else []
    detail = f"{differing} parameter elements differ across ranks"
    if differing and odd:
        detail += "; differing rank(s): " + ", ".join(f"{r} (node {ctx.node_of(r)})" for r in odd)
    elif differing:
        detail += "; no majority to name the differing rank"
    out.checks.append(
        Check(
            name="ddp.parameters_identical",
            ok=differing == 0 and not odd,
            detail=detail,
            node=node if node is not None else (ctx.node_of(odd[0]) if len(odd) == 1 else None),
            rank=odd[0] if len(odd) == 1 else None,
        )
    )
    if not math.isfinite(throughput):
        raise ValueError("non-finite DDP throughput")
    return out


def format_table(result: ProbeResult) -> str:
    p = result.params
    lines = [
        f"# model: {p.get('n_layer')} layers, {p.get('n_head')} heads, {p.get('n_embd')} wide, "
        f"seq {p.get('seq_len')}, vocab {p.get('vocab_size')}, {p.get('parameters')} parameters; "
        f"batch {p.get('batch_size')} per rank; {p.get('warmup')} warm-up + {p.get('steps')} timed steps"
    ]
    for m in result.measurements:
        label = m.name + "".join(f"{{{k}={m.labels[k]}}}" for k in ("quantile", "dtype") if k in m.labels)
        per = "" if not m.per_rank else "  per rank: " + " ".join(f"{v:.4g}" for v in m.per_rank)
        lines.append(f"  {label:<52} {m.value:>12.4g}{per}")
    return "\n".join(lines)
