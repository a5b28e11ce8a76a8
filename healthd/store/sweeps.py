"""Scaling-sweep runs (kind ``sweep``) and the scaling table they feed."""

from __future__ import annotations

from healthd.store.rows import MeasurementRow
from healthd.store.runs import RunsStore


class SweepsStore(RunsStore):
    _SWEEP_RUNS = """
        SELECT r.run_id, r.state, r.outcome, r.submitted_at, r.finished_at,
               COUNT(rn.node) AS size,
               (SELECT n.node_class FROM run_nodes x JOIN nodes n ON n.name = x.node
                 WHERE x.run_id = r.run_id ORDER BY x.node LIMIT 1) AS node_class
        FROM runs r JOIN run_nodes rn ON rn.run_id = r.run_id
        WHERE r.kind = 'sweep' GROUP BY r.run_id
    """

    def last_sweeps(self) -> dict[tuple[str, int], float]:
        """Per (node class, node count): when a sweep run was last submitted."""
        out: dict[tuple[str, int], float] = {}
        for r in self._query(self._SWEEP_RUNS):
            key = (r["node_class"] or "", int(r["size"]))
            out[key] = max(out.get(key, float("-inf")), r["submitted_at"])
        return out

    def sweeping_classes(self) -> set[str]:
        """Node classes with a sweep run in flight."""
        return {r["node_class"] or "" for r in self._query(self._SWEEP_RUNS) if r["state"] != "finished"}

    def scaling_table(self) -> list[tuple[str, int, float, MeasurementRow]]:
        """The newest passing sweep run per (node class, node count): (class, count, finished_at, measurement)
        for each of its group measurements."""
        newest: dict[tuple[str, int], tuple[float, str]] = {}
        for r in self._query(self._SWEEP_RUNS):
            if r["state"] == "finished" and r["outcome"] == "pass":
                key = (r["node_class"] or "", int(r["size"]))
                if key not in newest or newest[key][0] < r["finished_at"]:
                    newest[key] = (r["finished_at"], r["run_id"])
        table = []
        for (cls, size), (at, run_id) in sorted(newest.items()):
            for m in self.measurements(run_id=run_id):
                if m.node is None:
                    table.append((cls, size, at, m))
        return table


