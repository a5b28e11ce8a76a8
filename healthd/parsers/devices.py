"""What ran where: a GPU node's result is never a CPU run, a one-GPU node's intra-node NCCL is ``skipped``.

Pure functions of ``ProbeResult`` documents, applied by ``healthd.parsers.expand.expand_result`` to
every result the daemon reads. The probes already refuse to fall back to the CPU when told to expect
GPUs (``probes.expect``); these rules also hold for documents of probes that predate that
(healthd e12ebff and older, the real H100 documents among them):

- ``cpu_on_gpu_node``: a document whose ``params.expect_gpus`` > 0 but whose environment ran on the
  CPU keeps none of its figures (they would be stored and judged as GPU series) and is ``fail``
  with a failed ``env.gpu_count`` check (``gpus_missing``).
- ``one_gpu_nccl``: the ``nccl`` probe's old ``error`` on a node whose ranks form groups of one
  (``scope 'node' gives groups of one rank here: nothing to measure``) is ``skipped``: one GPU has
  no intra-node link to measure.
"""

from __future__ import annotations

from probes.result import Check, Measurement, Outcome, ProbeResult

GPU_COUNT_CHECK = "env.gpu_count"
ONE_GPU_REASON = "one GPU per node: nothing to measure"
_OLD_ONE_RANK = "gives groups of one rank here: nothing to measure"


def expected_gpus(result: ProbeResult) -> int:
    """``params.expect_gpus`` as the probe recorded it (0 when absent or not a count)."""
    value = result.params.get("expect_gpus")
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def cpu_on_gpu_node(result: ProbeResult) -> ProbeResult:
    want = expected_gpus(result)
    env = result.environment
    if not want or env is None or env.device_type != "cpu" or result.outcome is Outcome.ERROR:
        return result
    nodes = result.nodes or sorted({r.node for r in env.ranks})
    detail = f"0 GPU(s) visible, {want} expected (the probe ran on the CPU)"
    checks = [Check(name=GPU_COUNT_CHECK, ok=False, detail=detail, node=node) for node in nodes]
    kept: list[Measurement] = [m for m in result.measurements if m.name == "visible_gpus"]
    return result.model_copy(update={
        "outcome": Outcome.FAIL,
        "reason": "; ".join(f"{c.name}: {c.detail}" for c in checks),
        "measurements": kept,
        "checks": checks + [c for c in result.checks if c.name != GPU_COUNT_CHECK],
        "params": {**result.params, "dropped_cpu_measurements": len(result.measurements) - len(kept)},
    })


def one_gpu_nccl(result: ProbeResult) -> ProbeResult:
    if result.probe != "nccl" or result.outcome is not Outcome.ERROR or _OLD_ONE_RANK not in result.reason:
        return result
    return result.model_copy(update={"outcome": Outcome.SKIPPED, "reason": ONE_GPU_REASON})


def device_rules(result: ProbeResult) -> ProbeResult:
    """Both rules above, in order."""
    return one_gpu_nccl(cpu_on_gpu_node(result))
