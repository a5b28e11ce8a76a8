"""Two admin nodes, active/standby, on the site's MariaDB (docs/ha.md).

``lease``: the lease row, the epoch and the fenced action journal (the one module here that does I/O);
``fence``: the daemon's backend with every call that changes the cluster recorded first; ``LeaderCollector``:
``healthd_leader`` and ``healthd_ha_epoch``.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from healthd.ha.lease import Lease


class LeaderCollector(Collector):
    """``healthd_leader`` (1 while this instance leads, else 0) and ``healthd_ha_epoch`` (the epoch it leads
    under; absent while it does not lead)."""

    def __init__(self, lease: Lease) -> None:
        self.lease = lease

    def collect(self) -> Iterator[GaugeMetricFamily]:
        leading = self.lease.leading()
        yield GaugeMetricFamily("healthd_leader", "1 while this instance holds the HA lease ([ha]), else 0",
                                value=1 if leading else 0)
        epoch = GaugeMetricFamily("healthd_ha_epoch", "The HA epoch this instance leads under")
        if leading and self.lease.epoch is not None:
            epoch.add_metric([], self.lease.epoch)
        yield epoch
