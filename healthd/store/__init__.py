"""SQLite state: the single source of truth for the metrics endpoint, the HTTP API and the CLI.

One module per aggregate, each a part of the ``Store`` facade over one connection (``db``):

- ``schema``: tables and forward migrations;
- ``runs``: runs, measurements, checks and the counters a run's end bumps;
- ``nodes``: node states from discovery;
- ``judgement``: verdicts and the judge's saved state;
- ``remediation``: recommendations, audit, drains, breaker state (it reads the judgement's marks);
- ``sweeps``: scaling-sweep runs and the scaling table;
- ``requests``: on-demand probe requests (``healthd probe NAME --node N``);
- ``declared``: events an operator declared on a class (``healthd event start/end``);
- ``budget``: what probing cost and covered (GPU-seconds in a window, last judged run per node and probe);
- ``rows``: the row types (pure; import these, not the store, for a dataclass).

Readers that need only part of the store depend on a narrow Protocol of what they call.
"""

from __future__ import annotations

import time
from collections.abc import Collection, Sequence

from healthd.store.budget import BudgetStore
from healthd.store.declared import DeclaredStore
from healthd.store.judgement import JUDGEMENT_PRUNE, JudgementStore
from healthd.store.nodes import NodesStore
from healthd.store.remediation import REMEDIATION_PRUNE, RemediationStore
from healthd.store.requests import RequestsStore
from healthd.store.rows import (
    AuditRow,
    DrainRow,
    GpuSeen,
    JudgedSeries,
    LastRun,
    MeasurementRow,
    RecommendationRow,
    RunRow,
    RunTiming,
    Snapshot,
    canonical_labels,
)
from healthd.store.schema import SCHEMA_VERSION
from healthd.store.sweeps import SweepsStore

__all__ = [
    "SCHEMA_VERSION",
    "AuditRow",
    "DrainRow",
    "GpuSeen",
    "JudgedSeries",
    "LastRun",
    "MeasurementRow",
    "RecommendationRow",
    "RunRow",
    "RunTiming",
    "Snapshot",
    "Store",
    "canonical_labels",
]


class Store(SweepsStore, NodesStore, RemediationStore, JudgementStore, BudgetStore, RequestsStore, DeclaredStore):
    """The whole store: every aggregate over one connection."""

    def snapshot(self, *, node_seen_since: float = 0.0, nodes: Sequence[str] | None = None,
                 fleet: bool = True, families: Collection[tuple[str, str]] | None = None,
                 judged: bool = True) -> Snapshot:
        """An immutable copy of what the metrics endpoint and the API show, read under one lock: of every
        node, or of ``nodes`` only (reads linear in what they return); ``fleet``: with the counters, runs in
        flight and the scaling table; ``families``: only the measurements and judged series of these
        (probe, name) pairs; ``judged``: with the judged series."""
        with self._lock:
            if nodes is None:
                node_rows, verdicts = self.nodes(seen_since=node_seen_since), self.current_verdicts()
                series = [JudgedSeries.of(s) for s in self.judge_series()]
                recommendations = self.recommendations(limit=1_000_000)
            else:
                node_rows = self.nodes(seen_since=node_seen_since, names=nodes) if nodes else []
                verdicts = self.current_verdicts_of(nodes) if nodes else []
                series = self.judge_series_of(nodes, families) if nodes and judged else []
                wanted = set(nodes)
                recommendations = [r for r in self.recommendations(limit=1_000_000) if r.node in wanted]
            return Snapshot(
                taken_at=time.time(),
                nodes=tuple(node_rows),
                last_runs=tuple(self.last_runs(nodes)) if nodes != () else (),
                latest=tuple(self.latest_measurements(nodes, families)) if nodes != () else (),
                verdicts=tuple(verdicts),
                counters=tuple(self.counters()) if fleet else (),
                in_flight=self.in_flight() if fleet else 0,
                run_timings=tuple(self.last_run_timings(nodes)) if nodes != () else (),
                scaling=tuple(self.scaling_table()) if fleet else (),
                series=tuple(series),
                recommendations=tuple(recommendations),
                gpus=self.gpu_inventory(nodes) if nodes != () else {},
            )

    def prune_judgement(self, older_than: float) -> int:
        """Retention for the judgement and remediation tables (the daemon's housekeeping); open
        drains, active recommendations and active fleet events stay whatever their age."""
        with self._tx() as db:
            return sum(db.execute(sql, (older_than,)).rowcount
                       for sql in (*REMEDIATION_PRUNE, *JUDGEMENT_PRUNE))
