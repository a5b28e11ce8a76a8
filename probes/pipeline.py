"""The ``pipeline`` probe: the DDP probe's GPT cut into pipeline stages, per-link send/recv, GPU pairs.

Three parts, one rank session:

1. **Pipeline + DDP.** The ``ddp`` probe's GPT-style decoder (:func:`probes.ddp.build_model`, its configs
   and model-FLOP formula) cut into ``--stages`` balanced stages (:func:`partition`: contiguous decoder
   blocks, the embeddings with the first stage and the final LayerNorm and LM head with the last, balanced
   on the per-token FLOPs of each piece). Rank ``r`` runs stage ``r % S`` of pipeline replica ``r // S``;
   with more ranks than stages the replicas are data parallel over the ranks of one stage (4
   ranks, 2 stages: 2 pipelines, DDP across them). The schedule is ``torch.distributed.pipelining``'s
   (``ScheduleGPipe``, or ``Schedule1F1B`` with ``--schedule 1f1b``) over ``--microbatches``
   micro-batches: that module runs on gloo (CPU) as on NCCL, its stages exchanging activations and
   gradients with point-to-point ``isend``/``irecv``, so no schedule of our own is needed. Data
   parallelism across the replicas is DDP's arithmetic done by hand (:meth:`Pipeline.average_gradients`:
   one all_reduce of each stage's flattened gradients over its replicas after the schedule's backward),
   not the ``DistributedDataParallel`` module: wrapped in a ``PipelineStage`` it fails with torch 2.13 (the
   reducer's bucket rebuild after the first step asserts "rebuilt parameter indices size is not same as
   original model parameters size"; with ``static_graph=True`` it runs but the last stage's gradients
   differ from the unpipelined step by 30%, which the gradient check caught). The LM head
   is untied from the token embedding (the two live on different stages: a tied weight would need its own
   gradient exchange, as Megatron does); ``params.parameters`` counts it.

   - ``throughput_samples_per_second``: ``replicas * batch / p50`` of the pipelined training step
     (``zero_grad``, the schedule's forward and backward of every micro-batch, DDP's all-reduce,
     ``AdamW.step``); ``per_rank``: ``batch / median`` of each rank's own steps;
   - ``step_seconds`` at ``quantile`` 0.5 and 0.9 over all ranks and steps;
   - ``model_flop_per_second`` (``dtype``), per GPU: the DDP probe's ``6 * parameters * tokens/s`` with
     the tokens of all replicas over all ranks (each GPU holds ``1/S`` of the model);
   - ``stage_compute_seconds`` (``gpu``: the rank's GPU, its ``node``): the rank's stage alone, forward
     and backward of the step's micro-batches and its optimizer step, no communication (random
     activations of the right shape in, random gradients back): the compute one step needs on that GPU;
   - ``stage_bubble_seconds`` (``gpu``): the rank's p50 pipelined step less its compute: waiting for its
     neighbours (the schedule's bubble, ``(S-1)/(M+S-1)`` of the step for GPipe), the transfers and DDP's
     all-reduce. A slow GPU shows as its stage's compute time; the others' bubbles grow with it;
   - ``stage_skew_ratio`` (``gpu``; with 2 replicas or more): the median compute time of the rank's stage
     over the replicas divided by its own (below 1: slower than the same stage on the other GPUs);
     ``params.slowest_stage`` names the slowest GPU;
   - check ``pipeline.gradients_match``: before any optimizer step, one pipelined step (fp32, no
     autocast) on a fixed batch gives the same gradients as the unpipelined model on the same batch
     (every rank computes the whole model on its replica's batch; averaged over the replicas as DDP
     averages), within ``--tolerance`` (relative L2 over each stage's gradients). A wrong one is
     ``fail``, naming the stages and ranks whose gradients differ.

2. **Per-link send/recv.** Every neighbour pair of the ring of all ranks in rank order (``r -> r+1``,
   direction ``next``, and ``r -> r-1``, ``prev``; two ranks: ``0 -> 1`` and ``1 -> 0``): it holds every
   stage-to-stage hop of every pipeline, the hops between pipelines, and each node boundary once per
   direction. Each link is measured alone, the other ranks idle (so its time is its own): ``--link-warmup``
   untimed and ``--link-iters`` timed ``send``/``recv`` of ``--link-size`` bytes, each ``recv`` timed on
   the receiver (device sync before and after) and the median op time kept: a host that preempts one op
   (a busy CPU node) does not make its link look slow, a link slow on every op does. Then, as nccl-tests'
   ``sendrecv_perf``: ``algbw = size / time`` and, its bus factor being 1, ``busbw = algbw`` (nccl-tests
   doc/PERFORMANCE.md). On a GPU the per-op sync costs a few microseconds per op (about 1% of a 64 MiB
   op over NVLink). The data of the last transfer is checked (check ``pipeline.links.wrong``).

   - ``link_busbw_bytes_per_second`` (``node`` and ``gpu``: the sending rank's; ``direction`` ``next`` or
     ``prev``; ``scope`` ``node`` when both ends are on one node, ``group`` when the link crosses nodes;
     ``size_bytes``): one series per link (``detail = "full"``);
   - ``link_min_busbw_bytes_per_second`` (``node``, ``scope``): the slowest link that starts or ends on the
     node, per scope; ``link_min_ratio`` (``node``, ``scope``): that over the median link of the scope in
     the run. These are the summary's figures: one bad link is one node's low ratio (both ends' nodes for
     a link between nodes);
   - ``params.links``: every link with both ends (rank, node, GPU index, GPU UUID), its busbw and its
     ratio to its scope's median; ``params.slowest_link``: per scope the link with the lowest ratio,
     and its ``text`` (``rank 1 (n1 gpu 1 GPU-…) -> rank 2 (n2 gpu 0 GPU-…): 12.3 GB/s, 0.45 x the
     median 27.1 GB/s of 4 inter-node links``).

3. **GPU pairs inside a node** (``p2p``, on CUDA when a node's first rank sees two GPUs or more; skipped
   with the reason on CPU and on one-GPU nodes, in ``params.p2p``): every ordered pair ``(gpu, peer)``
   of the node's GPUs, ``--p2p-size`` bytes copied with ``tensor.copy_`` between the devices (the copy
   engines; peer access as ``torch.cuda.can_device_access_peer`` says). ``p2p_bandwidth_bytes_per_second``
   and ``p2p_latency_seconds`` (an 8-byte copy, back to back) with ``gpu`` and ``peer``. SM copies (a
   kernel reading the peer's memory) are not measured: torch has no cross-device copy kernel of its own,
   ``copy_`` between devices always takes the copy engine.

Faults (test only, :mod:`probes.faults`): ``corrupt:<rank>`` perturbs that rank's stage output in the
checked step by ``CORRUPT_RELATIVE`` of its size (the gradient check must fail, at every stage position);
``slow_link:<rank>`` delays every send of that rank to its ``next`` neighbour by :data:`SLOW_LINK_DELAY_S`
(the link must be named the slowest, the others not).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from probes import ddp
from probes.catalogue import ProbeName
from probes.context import ProbeContext, ProbeOutput
from probes.options import int_at_least, positive_float
from probes.result import Check, Measurement, ProbeResult
from probes.timing import median, quantile

if TYPE_CHECKING:
    import torch

NAME = ProbeName.PIPELINE
HELP = "GPT pipeline (+DDP) training throughput, per-stage bubbles, per-link send/recv busbw, GPU-pair P2P"

Schedule = Literal["gpipe", "1f1b"]
Direction = Literal["next", "prev"]
QUANTILES = (0.5, 0.9)
GPU_LINK_SIZE = 64 << 20
CPU_LINK_SIZE = 1 << 20
GPU_P2P_SIZE = 256 << 20
P2P_LATENCY_BYTES = 8
SLOW_LINK_DELAY_S = 0.05
"""The delay ``slow_link:<rank>`` adds before each of that rank's sends to its ``next`` neighbour."""
CORRUPT_RELATIVE = 0.01
"""``corrupt:<rank>``: the relative size of the damage to that rank's stage output (``corrupt``): every other
feature scaled by ``1 + CORRUPT_RELATIVE``, the others by ``1 - CORRUPT_RELATIVE``. The same relative size at
every stage position, hidden states or the last stage's logits (an offset of one feature, as before, was
nothing against logits some 40 apart: the last stage's damage went unseen). The gradient check's error is about
1.1-1.6 times it at every position (bench/RESULTS.md, "Pipeline"), ten times ``--tolerance``'s default."""
CORRUPT_RELATIVE_ENV = "HEALTHD_PROBE_CORRUPT_RELATIVE"
"""Test only: another relative size for ``corrupt`` (``bench/pipeline_corrupt.py`` finds the smallest one the
check catches at each stage position)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    ddp.add_arguments(parser)
    parser.add_argument("--stages", type=int_at_least(1), default=None,
                        help="pipeline stages (default: 2 when the ranks are even, else every rank); the ranks "
                             "must be a multiple, the replicas are DDP")
    parser.add_argument("--microbatches", type=int_at_least(1), default=None,
                        help="micro-batches per step (default 4; must divide --batch-size)")
    parser.add_argument("--schedule", choices=("gpipe", "1f1b"), default="gpipe")
    parser.add_argument("--tolerance", type=positive_float, default=1e-3,
                        help="gradient check: largest relative L2 difference per stage (default 1e-3)")
    parser.add_argument("--link-size", type=int_at_least(1), default=None,
                        help="bytes per send/recv of the link test (default 64 MiB GPU, 1 MiB CPU)")
    parser.add_argument("--link-warmup", type=int_at_least(0), default=2)
    parser.add_argument("--link-iters", type=int_at_least(1), default=None, help="timed sends per link (default 10)")
    parser.add_argument("--p2p-size", type=int_at_least(1), default=GPU_P2P_SIZE,
                        help="bytes per copy of the GPU-pair matrix (default 256 MiB)")
    parser.add_argument("--p2p-iters", type=int_at_least(1), default=10)
    parser.add_argument("--no-p2p", action="store_true", help="leave out the GPU-pair matrix")
    parser.add_argument("--no-links", action="store_true", help="leave out the per-link send/recv")


# -- layout (pure) -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Layout:
    world: int
    stages: int

    @property
    def replicas(self) -> int:
        return self.world // self.stages

    def stage_of(self, rank: int) -> int:
        return rank % self.stages

    def replica_of(self, rank: int) -> int:
        return rank // self.stages

    def pipeline(self, replica: int) -> list[int]:
        """The ranks of one pipeline, stage 0 first."""
        return [replica * self.stages + s for s in range(self.stages)]

    def stage_group(self, stage: int) -> list[int]:
        """The ranks holding ``stage``: one per replica (DDP averages over them)."""
        return [p * self.stages + stage for p in range(self.replicas)]


def choose_layout(world: int, stages: int | None, n_layer: int) -> Layout:
    """``stages`` (default 2 for an even ``world``, else ``world``) over ``world`` ranks.

    >>> choose_layout(4, None, 2), choose_layout(3, None, 4).replicas
    (Layout(world=4, stages=2), 1)
    """
    s = stages if stages is not None else (2 if world % 2 == 0 else world)
    if s < 2:
        raise ValueError("a pipeline needs 2 stages or more")
    if world % s:
        raise ValueError(f"{world} ranks are not a multiple of {s} stages")
    if s > n_layer:
        raise ValueError(f"{s} stages but only {n_layer} decoder blocks (--n-layer) to share out")
    return Layout(world, s)


def unit_costs(cfg: ddp.ModelConfig) -> tuple[float, list[float], float]:
    """Forward FLOPs per token of the embeddings, of each decoder block and of the LM head: a block's
    four matrices (``12 e^2`` multiply-adds) and its attention (``2 T e``), the head's ``e V``."""
    e = cfg.n_embd
    block = 2.0 * (12 * e * e + 2 * cfg.seq_len * e)
    return 0.0, [block] * cfg.n_layer, 2.0 * e * cfg.vocab_size


def partition(first: float, blocks: Sequence[float], last: float, stages: int) -> list[tuple[int, int]]:
    """Contiguous block ranges ``[a, b)``, one per stage, every stage at least one block, minimising the
    largest stage cost (``first`` added to stage 0's, ``last`` to the last stage's).

    >>> partition(0, [1, 1, 1, 1], 0, 2)
    [(0, 2), (2, 4)]
    >>> partition(0, [1, 1, 1, 1, 1, 1], 3, 2)
    [(0, 4), (4, 6)]
    """
    n = len(blocks)
    if not 1 <= stages <= n:
        raise ValueError(f"cannot cut {n} blocks into {stages} stages")
    prefix = [0.0]
    for c in blocks:
        prefix.append(prefix[-1] + c)

    def cost(s: int, a: int, b: int) -> float:
        return prefix[b] - prefix[a] + (first if s == 0 else 0.0) + (last if s == stages - 1 else 0.0)

    inf = float("inf")
    # best[s][b]: the smallest largest cost of stages 0..s covering blocks [0, b)
    best = [[inf] * (n + 1) for _ in range(stages)]
    cut = [[0] * (n + 1) for _ in range(stages)]
    for b in range(1, n + 1):
        best[0][b] = cost(0, 0, b)
    for s in range(1, stages):
        for b in range(s + 1, n + 1):
            for a in range(s, b):
                value = max(best[s - 1][a], cost(s, a, b))
                if value < best[s][b]:
                    best[s][b], cut[s][b] = value, a
    bounds: list[tuple[int, int]] = []
    b = n
    for s in range(stages - 1, 0, -1):
        a = cut[s][b]
        bounds.append((a, b))
        b = a
    bounds.append((0, b))
    return bounds[::-1]


def ring_links(world: int) -> list[tuple[int, int, Direction]]:
    """Every neighbour pair of the ring of ``world`` ranks, both ways, each once: ``(src, dst, direction)``.

    >>> ring_links(2)
    [(0, 1, 'next'), (1, 0, 'next')]
    >>> ring_links(3)
    [(0, 1, 'next'), (1, 2, 'next'), (2, 0, 'next'), (0, 2, 'prev'), (1, 0, 'prev'), (2, 1, 'prev')]
    """
    if world < 2:
        return []
    links: list[tuple[int, int, Direction]] = [(r, (r + 1) % world, "next") for r in range(world)]
    seen = {(a, b) for a, b, _ in links}
    links += [(r, (r - 1) % world, "prev") for r in range(world) if (r, (r - 1) % world) not in seen]
    return links


# -- the model, cut ----------------------------------------------------------------------------


def build_stages(cfg: ddp.ModelConfig, bounds: Sequence[tuple[int, int]]) -> list[torch.nn.Module]:
    """The DDP probe's GPT (built from the current torch seed) cut at ``bounds``, its LM head untied."""
    import torch
    from torch import nn

    gpt: Any = ddp.build_model(cfg)
    gpt.head.weight = nn.Parameter(gpt.wte.weight.detach().clone())
    last = len(bounds) - 1

    class Stage(nn.Module):
        def __init__(self, index: int, a: int, b: int) -> None:
            super().__init__()
            self.first, self.last = index == 0, index == last
            self.autocast_bf16 = False
            self.corrupt = False
            if self.first:
                self.wte, self.wpe = gpt.wte, gpt.wpe
            self.blocks = nn.ModuleList(gpt.blocks[i] for i in range(a, b))
            if self.last:
                self.ln_f, self.head = gpt.ln_f, gpt.head

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            device_type = x.device.type
            with torch.autocast(device_type=device_type, dtype=torch.bfloat16, enabled=self.autocast_bf16):
                if self.first:
                    pos = torch.arange(x.shape[1], device=x.device)
                    x = self.wte(x) + self.wpe(pos)
                for block in self.blocks:
                    x = block(x)
                if self.last:
                    x = self.head(self.ln_f(x))
            if self.corrupt:
                x = corrupted(x, corrupt_relative())
            return x

    return [Stage(i, a, b) for i, (a, b) in enumerate(bounds)]


def corrupt_relative(environ: dict[str, str] | None = None) -> float:
    """The relative size of ``corrupt``'s damage: ``CORRUPT_RELATIVE``, or ``HEALTHD_PROBE_CORRUPT_RELATIVE``.

    >>> corrupt_relative({}), corrupt_relative({"HEALTHD_PROBE_CORRUPT_RELATIVE": "1e-4"})
    (0.01, 0.0001)
    """
    raw = (os.environ if environ is None else environ).get(CORRUPT_RELATIVE_ENV, "")
    if not raw:
        return CORRUPT_RELATIVE
    value = float(raw)
    if not 0.0 < value < 1.0:
        raise ValueError(f"{CORRUPT_RELATIVE_ENV}: expected a fraction in (0, 1), got {raw!r}")
    return value


def corrupted(x: torch.Tensor, relative: float) -> torch.Tensor:
    """``x`` with every other feature (last dimension) scaled by ``1 + relative`` and the others by
    ``1 - relative``: a damage of relative L2 size ``relative`` that LayerNorm does not undo (a pattern, not a
    scale) nor the softmax (not a shift of every logit), whatever the scale of ``x``.

    >>> import torch
    >>> corrupted(torch.tensor([[2.0, 2.0, 4.0]]), 0.5).tolist()
    [[3.0, 1.0, 6.0]]
    """
    import torch

    sign = 1.0 - 2.0 * (torch.arange(x.shape[-1], device=x.device) % 2).to(x.dtype)
    return x * (1.0 + relative * sign)


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    import torch.nn.functional as F

    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1))


def replica_batch(ctx: ProbeContext, cfg: ddp.ModelConfig, replica: int,
                  seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The synthetic batch of one replica (every rank of the replica draws the same)."""
    import torch

    gen = torch.Generator(device=ctx.device)
    gen.manual_seed(seed + replica)
    idx = torch.randint(0, cfg.vocab_size, (cfg.batch_size, cfg.seq_len + 1), device=ctx.device, generator=gen)
    return idx[:, :-1].contiguous(), idx[:, 1:].contiguous()


# -- the probe ---------------------------------------------------------------------------------


@dataclass
class Groups:
    pipeline: Any
    """This rank's pipeline's process group (``None``: the world)."""
    stage: Any
    """The process group of this rank's stage across the replicas (``None`` with one replica)."""


def _make_groups(ctx: ProbeContext, layout: Layout) -> Groups:
    import torch.distributed as dist

    timeout = ctx.collective_timeout()
    mine_pp: Any = None
    mine_dp: Any = None
    if layout.replicas > 1:
        for p in range(layout.replicas):
            g = dist.new_group(ranks=layout.pipeline(p), timeout=timeout)
            if p == layout.replica_of(ctx.rank):
                mine_pp = g
        for s in range(layout.stages):
            g = dist.new_group(ranks=layout.stage_group(s), timeout=timeout)
            if s == layout.stage_of(ctx.rank):
                mine_dp = g
    return Groups(pipeline=mine_pp, stage=mine_dp)


class Pipeline:
    """This rank's stage of its pipeline replica, its schedule, optimizer and batch."""

    def __init__(self, ctx: ProbeContext, cfg: ddp.ModelConfig, layout: Layout, groups: Groups,
                 module: torch.nn.Module, microbatches: int, schedule: Schedule) -> None:
        import torch
        from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

        self.ctx, self.cfg, self.layout = ctx, cfg, layout
        self.stage_index = layout.stage_of(ctx.rank)
        self.module: Any = module
        self.stage_group = groups.stage
        self.stage = PipelineStage(module, self.stage_index, layout.stages, ctx.device, group=groups.pipeline)
        kind = ScheduleGPipe if schedule == "gpipe" else Schedule1F1B
        self.schedule = kind(self.stage, n_microbatches=microbatches, loss_fn=lm_loss)
        self.optimizer = torch.optim.AdamW(module.parameters(), lr=1e-4)
        self.x, self.y = replica_batch(ctx, cfg, layout.replica_of(ctx.rank), 2000)

    @property
    def first(self) -> bool:
        return self.stage_index == 0

    @property
    def last(self) -> bool:
        return self.stage_index == self.layout.stages - 1

    def run_schedule(self, x: torch.Tensor, y: torch.Tensor) -> None:
        if self.first:
            self.schedule.step(x)
        elif self.last:
            self.schedule.step(target=y, losses=[])
        else:
            self.schedule.step()

    def average_gradients(self) -> None:
        """Data parallelism across the replicas: this stage's gradients averaged over the ranks holding it
        (one all_reduce of the flattened gradients, as DDP's buckets do, after the schedule's backward)."""
        if self.layout.replicas < 2:
            return
        import torch
        import torch.distributed as dist

        params = [p for p in self.module.parameters() if p.grad is not None]
        flat = torch.cat([p.grad.reshape(-1) for p in params])
        dist.all_reduce(flat, group=self.stage_group)
        flat /= self.layout.replicas
        for p, g in zip(params, torch.split(flat, [p.numel() for p in params]), strict=True):
            p.grad.copy_(g.view_as(p.grad))

    def train_step(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        self.run_schedule(self.x, self.y)
        self.average_gradients()
        self.optimizer.step()

    def timed_steps(self, count: int) -> list[float]:
        times = []
        for _ in range(count):
            self.ctx.sync()
            t = time.perf_counter()
            self.train_step()
            self.ctx.sync()
            times.append(time.perf_counter() - t)
        return times


def _grads(module: torch.nn.Module) -> list[torch.Tensor]:
    import torch

    return [p.grad.detach().float().clone() if p.grad is not None else torch.zeros_like(p, dtype=torch.float32)
            for p in module.parameters()]


def check_gradients(ctx: ProbeContext, pipe: Pipeline, reference: list[torch.nn.Module], groups: Groups,
                    corrupt: bool) -> float:
    """One fp32 pipelined step on a fixed batch against the unpipelined model on the same batch; returns
    the relative L2 difference of this rank's stage's gradients (``inf`` when the reference is all zero)."""
    import torch
    import torch.distributed as dist

    x, y = replica_batch(ctx, pipe.cfg, pipe.layout.replica_of(ctx.rank), 3000)
    pipe.optimizer.zero_grad(set_to_none=True)
    pipe.module.corrupt = corrupt
    try:
        pipe.run_schedule(x, y)
    finally:
        pipe.module.corrupt = False
    pipe.average_gradients()
    got = _grads(pipe.module)
    pipe.optimizer.zero_grad(set_to_none=True)

    h: torch.Tensor = x
    for stage in reference:
        h = stage(h)
    torch.autograd.backward(lm_loss(h, y))
    want = _grads(reference[pipe.stage_index])
    if pipe.layout.replicas > 1:
        flat = torch.cat([g.reshape(-1) for g in want])
        dist.all_reduce(flat, group=groups.stage)
        flat /= pipe.layout.replicas
        want = list(torch.split(flat, [g.numel() for g in want]))
    d = float(torch.cat([a.reshape(-1) - b.reshape(-1) for a, b in zip(got, want, strict=True)]).norm())
    n = float(torch.cat([b.reshape(-1) for b in want]).norm())
    if n == 0.0:
        return 0.0 if d == 0.0 else float("inf")
    return d / n


def stage_compute(ctx: ProbeContext, pipe: Pipeline, microbatches: int, count: int) -> list[float]:
    """Seconds of this rank's stage alone per step: forward and backward of each micro-batch and the
    optimizer step, with random activations in and random gradients back (no communication)."""
    import torch

    module = pipe.module
    mb = pipe.cfg.batch_size // microbatches
    xs = pipe.x[:mb]
    ys = pipe.y[:mb]
    gen = torch.Generator(device=ctx.device)
    gen.manual_seed(4000 + ctx.rank)
    shape = (mb, pipe.cfg.seq_len, pipe.cfg.n_embd)
    act = torch.randn(shape, device=ctx.device, generator=gen)
    grad_out = torch.randn(shape, device=ctx.device, generator=gen)
    times = []
    for _ in range(count):
        ctx.sync()
        t = time.perf_counter()
        pipe.optimizer.zero_grad(set_to_none=True)
        for _ in range(microbatches):
            inp = xs if pipe.first else act.detach().requires_grad_(True)
            out = module(inp)
            if pipe.last:
                torch.autograd.backward(lm_loss(out, ys))
            else:
                torch.autograd.backward(out, grad_out)
        pipe.optimizer.step()
        ctx.sync()
        times.append(time.perf_counter() - t)
    return times


@dataclass(frozen=True)
class LinkRecord:
    src: int
    dst: int
    direction: Direction
    seconds: float
    wrong: int


def measure_links(ctx: ProbeContext, size: int, warmup: int, iters: int, slow: bool) -> list[LinkRecord]:
    """Every ring link alone (:func:`ring_links`); this rank's records are the links it received on."""
    import torch
    import torch.distributed as dist

    count = max(1, size // 4)
    buf = torch.empty(count, dtype=torch.float32, device=ctx.device)
    mine: list[LinkRecord] = []
    for src, dst, direction in ring_links(ctx.world_size):
        ctx.mark(f"pipeline.link.{src}.{dst}")
        ctx.barrier()
        if ctx.rank == src:
            buf.fill_(float(src + 1))
            delay = SLOW_LINK_DELAY_S if slow and direction == "next" else 0.0
            for i in range(warmup + iters):
                if delay and i >= warmup:
                    time.sleep(delay)
                dist.send(buf, dst)
            ctx.sync()
            ctx.barrier()
        elif ctx.rank == dst:
            for _ in range(warmup):
                dist.recv(buf, src)
            ctx.sync()
            buf.zero_()
            times = []
            for _ in range(iters):
                ctx.sync()
                t = time.perf_counter()
                dist.recv(buf, src)
                ctx.sync()
                times.append(time.perf_counter() - t)
            seconds = median(times)
            wrong = int((buf != float(src + 1)).sum().item())
            mine.append(LinkRecord(src, dst, direction, seconds, wrong))
            ctx.barrier()
        else:
            ctx.barrier()
    return mine


def _physical(ordinal: int, count: int) -> tuple[int, str | None]:
    from probes.gpus import gpu_slot, node_gpus

    try:
        slot = gpu_slot(ordinal, count, count, os.environ, node_gpus())
        return slot.physical, slot.uuid
    except Exception:
        return ordinal, None


def measure_p2p(ctx: ProbeContext, size: int, iters: int) -> tuple[list[dict[str, Any]], str | None]:
    """The ordered GPU pairs of this node (called on its first rank); ``(rows, why not)``."""
    if ctx.device_type != "cuda":
        return [], "not a GPU run"
    import torch

    n = torch.cuda.device_count()
    if n < 2:
        return [], f"{n} GPU visible on the node: no GPU pair"
    rows: list[dict[str, Any]] = []
    names = [_physical(i, n) for i in range(n)]
    for i in range(n):
        for j in range(n):
            if i == j:
                continue
            src = torch.empty(size, dtype=torch.uint8, device=f"cuda:{i}")
            dst = torch.empty(size, dtype=torch.uint8, device=f"cuda:{j}")
            tiny_src = torch.empty(P2P_LATENCY_BYTES, dtype=torch.uint8, device=f"cuda:{i}")
            tiny_dst = torch.empty(P2P_LATENCY_BYTES, dtype=torch.uint8, device=f"cuda:{j}")

            def timed(a: torch.Tensor, b: torch.Tensor, k: int, i: int = i, j: int = j) -> float:
                for _ in range(2):
                    b.copy_(a)
                torch.cuda.synchronize(i)
                torch.cuda.synchronize(j)
                t = time.perf_counter()
                for _ in range(k):
                    b.copy_(a)
                torch.cuda.synchronize(i)
                torch.cuda.synchronize(j)
                return (time.perf_counter() - t) / k

            seconds = timed(src, dst, iters)
            latency = timed(tiny_src, tiny_dst, max(iters, 100))
            rows.append({
                "gpu": names[i][0], "peer": names[j][0], "gpu_uuid": names[i][1], "peer_uuid": names[j][1],
                "peer_access": bool(torch.cuda.can_device_access_peer(i, j)),
                "bandwidth_bytes_per_second": size / seconds, "latency_seconds": latency,
            })
            del src, dst, tiny_src, tiny_dst
    return rows, None


def run(ctx: ProbeContext) -> ProbeOutput:
    import torch

    args = ctx.args
    cuda = ctx.device_type == "cuda"
    cfg = ddp.model_config(args, cuda)
    if ctx.world_size < 2:
        return ProbeOutput(skipped=("one GPU" if cuda else "one rank") + ": no pipeline stages to connect")
    layout = choose_layout(ctx.world_size, args.stages, cfg.n_layer)
    microbatches = args.microbatches or min(4, cfg.batch_size)
    if cfg.batch_size % microbatches:
        raise ValueError(f"--microbatches {microbatches} does not divide --batch-size {cfg.batch_size}")
    warmup = args.warmup if args.warmup is not None else (5 if cuda else 2)
    steps = args.steps if args.steps is not None else (20 if cuda else 8)
    if steps < 1 or warmup < 0:
        raise ValueError("--steps must be >= 1 and --warmup >= 0")
    first, blocks, last = unit_costs(cfg)
    bounds = partition(first, blocks, last, layout.stages)
    stage_index = layout.stage_of(ctx.rank)

    ctx.mark("pipeline.build")
    torch.manual_seed(1234)
    stages = build_stages(cfg, bounds)
    n_params = sum(p.numel() for s in stages for p in s.parameters())
    module: Any = stages[stage_index].to(ctx.device)
    torch.manual_seed(1234)
    reference = [s.to(ctx.device) for s in build_stages(cfg, bounds)]
    groups = _make_groups(ctx, layout)
    pipe = Pipeline(ctx, cfg, layout, groups, module, microbatches, args.schedule)
    ctx.barrier()

    ctx.mark("pipeline.check")
    error = check_gradients(ctx, pipe, reference, groups, "corrupt" in ctx.faults)
    del reference
    bf16 = cuda and torch.cuda.is_bf16_supported()
    module.autocast_bf16 = bf16

    ctx.mark("pipeline.warmup")
    pipe.timed_steps(warmup)
    ctx.barrier()
    ctx.mark("pipeline.timed")
    step_times = pipe.timed_steps(steps)
    ctx.barrier()
    ctx.mark("pipeline.stage_compute")
    compute_times = stage_compute(ctx, pipe, microbatches, max(1, min(steps, 5)))
    ctx.barrier()

    link_size = args.link_size or (GPU_LINK_SIZE if cuda else CPU_LINK_SIZE)
    link_iters = args.link_iters or 10
    links: list[LinkRecord] = []
    if not args.no_links:
        links = measure_links(ctx, link_size, args.link_warmup, link_iters, "slow_link" in ctx.faults)

    p2p_rows: list[dict[str, Any]] = []
    p2p_why: str | None = "not asked for (--no-p2p)" if args.no_p2p else None
    if not args.no_p2p and ctx.ranks[ctx.rank].local_rank == 0:
        ctx.mark("pipeline.p2p")
        p2p_rows, p2p_why = measure_p2p(ctx, args.p2p_size, args.p2p_iters)
    gathered = ctx.gather({
        "steps": step_times, "compute": compute_times, "error": error, "gpu": ctx.gpu, "uuid": ctx.gpu_uuid,
        "links": [(r.src, r.dst, r.direction, r.seconds, r.wrong) for r in links],
        "p2p": p2p_rows, "p2p_why": p2p_why if ctx.ranks[ctx.rank].local_rank == 0 else None,
    })
    out = ProbeOutput(params={
        "n_layer": cfg.n_layer, "n_head": cfg.n_head, "n_embd": cfg.n_embd, "seq_len": cfg.seq_len,
        "vocab_size": cfg.vocab_size, "batch_size": cfg.batch_size, "parameters": n_params,
        "stages": layout.stages, "replicas": layout.replicas, "microbatches": microbatches,
        "schedule": args.schedule, "schedule_impl": "torch.distributed.pipelining",
        "stage_blocks": [list(b) for b in bounds], "warmup": warmup, "steps": steps,
        "autocast": "bf16" if bf16 else None, "optimizer": "AdamW", "tied_head": False,
        "flop_per_token": ddp.FLOP_PER_PARAMETER_TOKEN * n_params,
        "bubble_fraction_gpipe": (layout.stages - 1) / (microbatches + layout.stages - 1),
        "tolerance": args.tolerance,
        "link_size_bytes": link_size, "link_iters": link_iters, "link_warmup": args.link_warmup,
    })
    if ctx.rank != 0:
        return out
    return summarize(ctx, cfg, layout, n_params, ddp.compute_dtype(bf16), gathered, link_size, out)


# -- summary (rank 0) --------------------------------------------------------------------------


@dataclass(frozen=True)
class Link:
    src: int
    dst: int
    direction: Direction
    src_node: str
    dst_node: str
    src_gpu: int
    dst_gpu: int
    src_uuid: str | None
    dst_uuid: str | None
    busbw: float
    wrong: int

    @property
    def scope(self) -> str:
        return "node" if self.src_node == self.dst_node else "group"

    def end(self, which: Literal["src", "dst"]) -> str:
        rank, node, gpu, uuid = ((self.src, self.src_node, self.src_gpu, self.src_uuid) if which == "src"
                                 else (self.dst, self.dst_node, self.dst_gpu, self.dst_uuid))
        return f"rank {rank} ({node} gpu {gpu}{' ' + uuid if uuid else ''})"


def link_summary(links: Sequence[Link]) -> dict[str, dict[str, Any]]:
    """Per scope: the median busbw, and the link with the lowest ratio to it (its ends and the text)."""
    out: dict[str, dict[str, Any]] = {}
    for scope in ("node", "group"):
        mine = [x for x in links if x.scope == scope]
        if not mine:
            continue
        med = statistics.median(x.busbw for x in mine)
        worst = min(mine, key=lambda x: x.busbw)
        ratio = worst.busbw / med if med > 0 else 0.0
        kind = "intra-node" if scope == "node" else "inter-node"
        out[scope] = {
            "src_rank": worst.src, "dst_rank": worst.dst, "src_node": worst.src_node, "dst_node": worst.dst_node,
            "src_gpu": worst.src_gpu, "dst_gpu": worst.dst_gpu, "src_uuid": worst.src_uuid,
            "dst_uuid": worst.dst_uuid, "busbw_bytes_per_second": worst.busbw, "median_bytes_per_second": med,
            "ratio": ratio, "links": len(mine),
            "text": f"{worst.end('src')} -> {worst.end('dst')}: {worst.busbw / 1e9:.3g} GB/s, {ratio:.2f} x the "
                    f"median {med / 1e9:.3g} GB/s of {len(mine)} {kind} links",
        }
    return out


def link_measurements(links: Sequence[Link], size: int) -> list[Measurement]:
    """One series per link, and per node and scope the slowest link touching the node and its ratio."""
    out: list[Measurement] = []
    for x in links:
        out.append(Measurement(name="link_busbw_bytes_per_second", value=x.busbw, node=x.src_node,
                               labels={"gpu": str(x.src_gpu), "direction": x.direction, "scope": x.scope,
                                       "size_bytes": str(size)}))
    medians = {scope: statistics.median(x.busbw for x in links if x.scope == scope)
               for scope in {x.scope for x in links}}
    nodes = sorted({x.src_node for x in links} | {x.dst_node for x in links})
    for node in nodes:
        for scope, med in sorted(medians.items()):
            touching = [x.busbw for x in links if x.scope == scope and node in (x.src_node, x.dst_node)]
            if not touching:
                continue
            low = min(touching)
            labels = {"scope": scope, "size_bytes": str(size)}
            out.append(Measurement(name="link_min_busbw_bytes_per_second", value=low, node=node, labels=labels))
            out.append(Measurement(name="link_min_ratio", value=low / med if med > 0 else 0.0, node=node,
                                   labels=labels))
    return out


def stage_skew(rows: Sequence[dict[str, Any]]) -> dict[int, float]:
    """Rank → the median compute time of its stage over the replicas divided by its own (1: like its stage's
    other GPUs; 0.5: twice as slow). The same stage does the same work on every replica, so a slow GPU is
    its own stage's outlier; different stages differ in work and are never compared. Only with 2 replicas
    or more."""
    by_stage: dict[int, list[dict[str, Any]]] = {}
    for row in rows:
        by_stage.setdefault(row["stage"], []).append(row)
    out: dict[int, float] = {}
    for group in by_stage.values():
        if len(group) < 2:
            continue
        mid = median([row["compute_seconds"] for row in group])
        for row in group:
            out[row["rank"]] = mid / row["compute_seconds"] if row["compute_seconds"] > 0 else 0.0
    return out


def summarize(ctx: ProbeContext, cfg: ddp.ModelConfig, layout: Layout, parameters: int, dtype: str,
              gathered: list[dict[str, Any]], link_size: int, out: ProbeOutput) -> ProbeOutput:
    world = len(gathered)
    nodes = {ctx.node_of(r) for r in range(world)}
    node = next(iter(nodes)) if len(nodes) == 1 else None
    batch = cfg.batch_size
    all_steps = [t for g in gathered for t in g["steps"]]
    p50 = quantile(all_steps, 0.5)
    throughput = layout.replicas * batch / p50
    tokens_per_gpu = layout.replicas * batch * cfg.seq_len / world
    out.measurements += [
        Measurement(name="throughput_samples_per_second", value=throughput, node=node,
                    per_rank=[batch / median(g["steps"]) for g in gathered]),
        *(Measurement(name="step_seconds", value=quantile(all_steps, q), labels={"quantile": str(q)}, node=node,
                      per_rank=[quantile(g["steps"], q) for g in gathered]) for q in QUANTILES),
        Measurement(name="model_flop_per_second", value=ddp.model_flop_per_second(parameters, tokens_per_gpu / p50),
                    labels={"dtype": dtype}, node=node,
                    per_rank=[ddp.model_flop_per_second(parameters, tokens_per_gpu / median(g["steps"]))
                              for g in gathered]),
    ]
    stage_rows = []
    for r, g in enumerate(gathered):
        compute = median(g["compute"])
        step = median(g["steps"])
        labels = {"gpu": str(g["gpu"])}
        out.measurements += [
            Measurement(name="stage_compute_seconds", value=compute, node=ctx.node_of(r), labels=labels),
            Measurement(name="stage_bubble_seconds", value=max(0.0, step - compute), node=ctx.node_of(r),
                        labels=labels),
        ]
        stage_rows.append({"rank": r, "stage": layout.stage_of(r), "replica": layout.replica_of(r),
                           "node": ctx.node_of(r), "gpu": g["gpu"], "gpu_uuid": g["uuid"],
                           "compute_seconds": compute, "step_seconds": step,
                           "bubble_seconds": max(0.0, step - compute), "gradient_error": g["error"]})
    out.params["stage_times"] = stage_rows
    skew = stage_skew(stage_rows)
    for row in stage_rows:
        ratio = skew.get(row["rank"])
        if ratio is not None:
            row["skew_ratio"] = ratio
            out.measurements.append(Measurement(name="stage_skew_ratio", value=ratio, node=row["node"],
                                                labels={"gpu": str(row["gpu"])}))
    if skew:
        slow = min((row for row in stage_rows if row["rank"] in skew), key=lambda row: skew[row["rank"]])
        uuid = f", {slow['gpu_uuid']}" if slow["gpu_uuid"] else ""
        out.params["slowest_stage"] = {
            **{k: slow[k] for k in ("rank", "stage", "replica", "node", "gpu", "gpu_uuid")},
            "ratio": skew[slow["rank"]],
            "text": f"stage {slow['stage']} on rank {slow['rank']} ({slow['node']} gpu {slow['gpu']}{uuid}): "
                    f"{1 / skew[slow['rank']]:.2f} x its stage's median compute time over {layout.replicas} replicas"}

    bad = [row for row in stage_rows if not row["gradient_error"] <= ctx.args.tolerance]
    detail = "largest relative L2 difference of a stage's gradients from the unpipelined step: " + \
        f"{max(row['gradient_error'] for row in stage_rows):.3g} (tolerance {ctx.args.tolerance:g})"
    if bad:
        detail += "; differing: " + ", ".join(
            f"stage {row['stage']} rank {row['rank']} ({row['node']}): {row['gradient_error']:.3g}" for row in bad)
    bad_nodes = {row["node"] for row in bad}
    out.checks.append(Check(
        name="pipeline.gradients_match", ok=not bad, detail=detail,
        node=node if node is not None else (next(iter(bad_nodes)) if len(bad_nodes) == 1 else None),
        rank=bad[0]["rank"] if len(bad) == 1 else None,
    ))

    links = [
        Link(src, dst, direction, ctx.node_of(src), ctx.node_of(dst), gathered[src]["gpu"], gathered[dst]["gpu"],
             gathered[src]["uuid"], gathered[dst]["uuid"], link_size / seconds, wrong)
        for g in gathered for src, dst, direction, seconds, wrong in g["links"]
    ]
    links.sort(key=lambda x: (x.direction != "next", x.src))
    if links:
        summary = link_summary(links)
        out.measurements += link_measurements(links, link_size)
        out.params["links"] = [
            {"src_rank": x.src, "dst_rank": x.dst, "direction": x.direction, "scope": x.scope,
             "src_node": x.src_node, "dst_node": x.dst_node, "src_gpu": x.src_gpu, "dst_gpu": x.dst_gpu,
             "src_uuid": x.src_uuid, "dst_uuid": x.dst_uuid, "busbw_bytes_per_second": x.busbw,
             "ratio": x.busbw / summary[x.scope]["median_bytes_per_second"]
             if summary[x.scope]["median_bytes_per_second"] > 0 else 0.0}
            for x in links
        ]
        out.params["slowest_link"] = summary
        wrong = [x for x in links if x.wrong]
        out.checks.append(Check(
            name="pipeline.links.wrong", ok=not wrong,
            detail=f"{sum(x.wrong for x in links)} wrong elements"
            + ("" if not wrong else " (" + ", ".join(f"{x.end('src')} -> {x.end('dst')}: {x.wrong}"
                                                      for x in wrong) + ")"),
            node=node if node is not None else (wrong[0].dst_node if len(wrong) == 1 else None),
            rank=wrong[0].dst if len(wrong) == 1 else None,
        ))

    p2p: dict[str, Any] = {}
    for r, g in enumerate(gathered):
        if g["p2p_why"] is not None:
            p2p[ctx.node_of(r)] = {"skipped": g["p2p_why"]}
        elif g["p2p"]:
            p2p[ctx.node_of(r)] = {"pairs": g["p2p"]}
            for row in g["p2p"]:
                labels = {"gpu": str(row["gpu"]), "peer": str(row["peer"])}
                out.measurements += [
                    Measurement(name="p2p_bandwidth_bytes_per_second", value=row["bandwidth_bytes_per_second"],
                                node=ctx.node_of(r), labels=labels),
                    Measurement(name="p2p_latency_seconds", value=row["latency_seconds"], node=ctx.node_of(r),
                                labels=labels),
                ]
    out.params["p2p"] = p2p
    return out


def format_table(result: ProbeResult) -> str:
    p = result.params
    lines = [
        f"# model: {p.get('n_layer')} layers, {p.get('n_embd')} wide, seq {p.get('seq_len')}, "
        f"{p.get('parameters')} parameters; {p.get('stages')} stages x {p.get('replicas')} replicas, "
        f"{p.get('microbatches')} micro-batches ({p.get('schedule')}), batch {p.get('batch_size')} per replica"
    ]
    for m in result.measurements:
        if m.name.startswith(("link_busbw", "p2p_")):
            continue
        label = m.name + "".join(f"{{{k}={v}}}" for k, v in sorted(m.labels.items()) if k != "size_bytes")
        where = f" [{m.node}]" if m.node else ""
        lines.append(f"  {label + where:<64} {m.value:>12.4g}")
    links = p.get("links") or []
    if links:
        lines.append(f"# links ({p.get('link_size_bytes')} B send/recv, busbw = algbw)")
        for x in links:
            lines.append(f"  rank {x['src_rank']:>3} ({x['src_node']}) -> rank {x['dst_rank']:>3} ({x['dst_node']})"
                         f"  {x['busbw_bytes_per_second'] / 1e9:8.3f} GB/s  x{x['ratio']:.2f} of the median")
        for scope, s in (p.get("slowest_link") or {}).items():
            lines.append(f"# slowest {scope} link: {s['text']}")
    for node, part in (p.get("p2p") or {}).items():
        if "skipped" in part:
            lines.append(f"# p2p {node}: skipped ({part['skipped']})")
            continue
        for row in part["pairs"]:
            lines.append(f"  p2p {node} gpu {row['gpu']} -> {row['peer']}: "
                         f"{row['bandwidth_bytes_per_second'] / 1e9:8.2f} GB/s, {row['latency_seconds'] * 1e6:.1f} us")
    return "\n".join(lines)
