"""Job ends without the node check's document: a node seen busy (a job on it) and later seen not busy had a
job end in between, after which Slurm ran its ``Epilog=``; healthd's wrapper there leaves a boundary
document (``probes.boundary``). When no document of the node finished after the node was last seen busy
by ``grace_s`` after it was first seen free again, the wrapper did not run the check (no Python, no results
directory: it logs why to the node's journal) or is not installed: the end is counted as missed.

Pure: the daemon feeds it the node states of each discovery and the newest document of each node
(``healthd.daemon.Daemon.discover``); ``healthd_node_check_missed_total`` exports the counts. Only job
ends seen are counted: a job that starts and ends between two discoveries is not seen.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field

from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from healthd.model import Node

BUSY_STATES = frozenset({"allocated", "mixed", "completing"})


def busy(node: Node) -> bool:
    return node.state in BUSY_STATES or "COMPLETING" in node.flags


@dataclass
class JobEndWatch:
    grace_s: float
    """How long after a job end is seen its document may still arrive (the epilog's budget, collection)."""
    busy_seen: dict[str, float] = field(default_factory=dict)
    """Node -> when it was last seen busy, while no job end has been seen since."""
    ended: dict[str, tuple[float, float]] = field(default_factory=dict)
    """Node -> (last seen busy, first seen free): a job end awaiting its document."""
    missed: dict[str, int] = field(default_factory=dict)
    """Node -> job ends counted without a document, since this daemon started."""

    def see(self, nodes: Iterable[Node], now: float) -> list[str]:
        """Take one discovery's node states; the nodes with a job end awaiting its document."""
        for node in nodes:
            if busy(node):
                self.busy_seen[node.name] = now
            elif node.name in self.busy_seen:
                self.ended.setdefault(node.name, (self.busy_seen.pop(node.name), now))
        return sorted(self.ended)

    def settle(self, documents: Mapping[str, float], now: float) -> list[str]:
        """Given the newest document (finish time) of the nodes ``see`` returned: the nodes whose job end
        is counted as missed now."""
        counted = []
        for name, (was_busy, free) in sorted(self.ended.items()):
            if documents.get(name, 0.0) >= was_busy:
                del self.ended[name]
            elif now - free > self.grace_s:
                del self.ended[name]
                self.missed[name] = self.missed.get(name, 0) + 1
                counted.append(name)
        return counted


class JobEndCollector(Collector):
    """``healthd_node_check_missed_total{node}`` from a ``JobEndWatch`` at scrape time."""

    def __init__(self, watch: JobEndWatch) -> None:
        self._watch = watch

    def describe(self) -> list[CounterMetricFamily]:
        return []

    def collect(self) -> Iterator[CounterMetricFamily]:
        family = CounterMetricFamily("healthd_node_check_missed", "Job ends seen on the node after which no node "
                                     "check document arrived (its Epilog wrapper did not run the check)",
                                     labels=["node"])
        for node, count in sorted(dict(self._watch.missed).items()):
            family.add_metric([node], float(count))
        yield family
