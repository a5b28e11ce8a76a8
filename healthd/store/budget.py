"""What probing cost and covered: GPU-seconds of recent runs, typical durations, and when each
(node, probe) was last judged (for the probe budget and the coverage figure)."""

from __future__ import annotations

from healthd.store.db import Database

_PROBED = "r.kind IN ('probe', 'reprobe', 'sweep')"


class BudgetStore(Database):
    def gpu_seconds_since(self, since: float) -> float:
        """GPU-seconds held by the runs healthd launched that finished at or after ``since`` (duration
        times the GPUs of the run's nodes, as ``healthd_probe_gpu_seconds_total`` counts them)."""
        row = self._query(
            "SELECT COALESCE(SUM(r.duration_s * (SELECT COALESCE(SUM(nd.gpus), 0) FROM run_nodes rn"
            " JOIN nodes nd ON nd.name = rn.node WHERE rn.run_id = r.run_id)), 0.0)"
            f" FROM runs r WHERE r.state = 'finished' AND r.finished_at >= ? AND r.outcome != 'skipped' AND {_PROBED}",
            (since,),
        )
        return float(row[0][0])

    def mean_durations(self, since: float) -> dict[str, float]:
        """Per probe, the mean wall time of its runs (not sweeps) finished at or after ``since``."""
        rows = self._query(
            "SELECT r.probe, AVG(r.duration_s) FROM runs r WHERE r.state = 'finished' AND r.finished_at >= ?"
            " AND r.duration_s IS NOT NULL AND r.outcome != 'skipped' AND r.kind IN ('probe', 'reprobe')"
            " GROUP BY r.probe",
            (since,),
        )
        return {r[0]: float(r[1]) for r in rows}

    def last_judged(self) -> dict[tuple[str, str], float]:
        """Per (node, probe): when its newest run that reached a verdict (pass, degraded or fail: the
        probe ran and was judged; an error judges nothing) finished. Sweeps are not per node."""
        rows = self._query("SELECT node, probe, last_judged_at FROM latest_runs WHERE last_judged_at IS NOT NULL")
        return {(r[0], r[1]): float(r[2]) for r in rows}
