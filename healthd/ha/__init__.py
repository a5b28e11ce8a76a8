"""Two admin nodes, active/standby, on the site's MariaDB (docs/ha.md).

``lease``: the lease row, the epoch and the fenced action journal (the one module here that does I/O);
``fence``: the daemon's backend with every call that changes the cluster recorded first; ``LeaderCollector``:
``healthd_leader`` and ``healthd_ha_epoch``; ``LeaderOnly``: a collector whose families only the leader exports.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from healthd.ha.lease import Lease


class LeaderCollector(Collector):
    """``healthd_leader`` (1 while this instance may act, else 0; always 1 with ``[ha] mode = "off"``, where the
    one instance leads) and, with a lease, ``healthd_ha_epoch`` (the epoch it leads under; absent while it does
    not lead). ``HealthdNoLeader`` fires when no instance exports 1."""

    def __init__(self, lease: Lease | None) -> None:
        self.lease = lease

    def collect(self) -> Iterator[GaugeMetricFamily]:
        leading = self.lease is None or self.lease.leading()
        yield GaugeMetricFamily("healthd_leader", "1 while this instance leads (holds the [ha] lease, or [ha] is off), "
                                "else 0", value=1 if leading else 0)
        if self.lease is None:
            return
        epoch = GaugeMetricFamily("healthd_ha_epoch", "The HA epoch this instance leads under")
        if leading and self.lease.epoch is not None:
            epoch.add_metric([], self.lease.epoch)
        yield epoch


class LeaderOnly(Collector):
    """``inner``'s families while ``leading()``, none on a standby: the judgement families (coverage, passive
    signals, missed node checks) come from the leader only, so rules and dashboards see one copy."""

    def __init__(self, inner: Collector, leading: Callable[[], bool]) -> None:
        self.inner = inner
        self.leading = leading

    def describe(self) -> Iterable[Metric]:
        return []

    def collect(self) -> Iterable[Metric]:
        return self.inner.collect() if self.leading() else []
