"""Where the judge meets the collector and the store: the daemon's (and the simulator's) entry points.

The judge (``healthd.judge.engine``) knows neither; the store maps the judge's types to its tables
(``healthd.store.judgement``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from healthd.config import JudgeSettings
from healthd.judge.engine import Judge
from healthd.judge.model import CheckInput, Declarations, JudgeOutput, MeasurementInput, RunInput
from healthd.model import Node, devices_by_node
from healthd.parsers.nccl_transport import ib_ports_used
from healthd.passive.model import PassivePoll

if TYPE_CHECKING:
    from healthd.collector import Collected
    from healthd.store import Store


def run_from_collected(c: Collected, now: float) -> RunInput:
    """A collected run as judge input (the daemon's path)."""
    result = c.result
    measurements: tuple[MeasurementInput, ...] = ()
    failed: tuple[CheckInput, ...] = ()
    uuids: dict[tuple[str, str], str] = {}
    if result is not None:
        uuids = {(node, str(index)): uuid for node, gpus in devices_by_node(result, c.nodes).items()
                 for index, uuid, _ in gpus if uuid}
        measurements = tuple(MeasurementInput(m.name, m.value, dict(m.labels), m.node) for m in result.measurements)
        failed = tuple(CheckInput(ch.name, ch.detail, ch.node, ch.gpu, ch.gpu_uuid)
                       for ch in result.checks if not ch.ok)
    return RunInput(c.run_id, c.probe, tuple(c.nodes), c.outcome, c.reason,
                    result.finished_at if result is not None else now, measurements, failed, c.kind, uuids,
                    slowest_links(result.params) if result is not None else {},
                    ib_ports_used(result.params) if result is not None else {},
                    result.environment.container_image if result is not None and result.environment else None)


def slowest_links(params: Mapping[str, object]) -> dict[tuple[str, str], str]:
    """(node, scope) → the text of the slowest link the run measured there (both its ends' nodes)."""
    out: dict[tuple[str, str], str] = {}
    slowest = params.get("slowest_link")
    if not isinstance(slowest, Mapping):
        return out
    for scope, link in slowest.items():
        if isinstance(link, Mapping) and isinstance(link.get("text"), str):
            for end in ("src_node", "dst_node"):
                node = link.get(end)
                if isinstance(node, str):
                    out[(node, str(scope))] = str(link["text"])[:300]
    return out


def keep_seconds(settings: JudgeSettings) -> float:
    """How long marks and group records are kept: the confirmation window (and an hour of slack)."""
    return max(settings.confirm.window_s, settings.fleet.event_window_s) + 3600.0


def judge_collected(judge: Judge, store: Store, done: Sequence[Collected], *, now: float,
                    nodes: Sequence[Node] | None = None) -> JudgeOutput:
    """What the daemon calls after each collect: judge the collected runs and persist the result.

    ``nodes`` (classes, drain state; default: the store's) and the undrain times that reset a
    node's evidence come from the store; the caller hands the output to ``Remediator.apply``.
    """
    return judge_runs(judge, store, [run_from_collected(c, now) for c in done], now=now, nodes=nodes)


def judge_runs(judge: Judge, store: Store, runs: Sequence[RunInput], *, now: float,
               nodes: Sequence[Node] | None = None) -> JudgeOutput:
    """Judge ``runs`` and save the judgement, with the runs marked judged in the same transaction."""
    output = judge.evaluate(runs, store.nodes() if nodes is None else nodes, now=now, resets=store.judge_resets())
    store.save_judgement(output, keep_s=keep_seconds(judge.settings), judged=[r.run_id for r in runs])
    return output


def judge_passive_poll(judge: Judge, store: Store, poll: PassivePoll, *, now: float,
                       nodes: Sequence[Node] | None = None) -> JudgeOutput:
    """Judge one poll of the site's Prometheus (``healthd.passive.source``) and save the judgement."""
    output = judge.observe(poll, store.nodes() if nodes is None else nodes, now=now)
    store.save_judgement(output, keep_s=keep_seconds(judge.settings))
    return output


def judge_declared(judge: Judge, store: Store, *, now: float, nodes: Sequence[Node] | None = None) -> JudgeOutput:
    """Hand the judge the events operators declared (``healthd event start/end``: the store's) and save what
    started or ended (``healthd.judge.sources.declared``)."""
    output = judge.observe(Declarations(now, tuple(store.declared_events())), store.nodes() if nodes is None
                           else nodes, now=now)
    if output.fleet_events:
        store.save_judgement(output, keep_s=keep_seconds(judge.settings))
    return output


def judge_ingested(judge: Judge, store: Store, *, now: float, nodes: Sequence[Node] | None = None,
                   limit: int = 500) -> JudgeOutput | None:
    """Judge the runs ``healthd ingest`` stored since the last call, like probe results, and persist the
    judgement with the new watermark in one transaction (``None``: nothing new). Idempotent: a run is
    judged once, even when a crash came between judging and saving (the judge skips run ids it has).
    The first call only sets the watermark: what was ingested before the daemon judged ingests stays
    history (``healthd replay`` sees it)."""
    after = store.ingest_watermark()
    if after is None:
        store.save_judgement(JudgeOutput(at=now), ingest_watermark=store.last_ingest_position())
        return None
    batch = store.ingested_runs(after=after, limit=limit)
    if not batch:
        return None
    output = judge.evaluate([run for _, run in batch], store.nodes() if nodes is None else nodes, now=now,
                            resets=store.judge_resets())
    store.save_judgement(output, keep_s=keep_seconds(judge.settings), ingest_watermark=batch[-1][0])
    return output


def load_judge(store: Store, settings: JudgeSettings, *, now: float) -> Judge:
    """A judge with the state a previous daemon left in the store."""
    judge = Judge(settings)
    judge.restore(store.load_judgement(since=now - keep_seconds(settings)), store.nodes(), now=now)
    judge.images.update(store.judged_images())
    return judge
