"""The node check at job boundaries as a source: the collector stores each boundary document as a run of
the pseudo-probe ``boundary`` (its failed checks are ``checks``' findings); no planner runs it, so a re-probe
asked for it runs the node's single-node probes, and any judged run of the node answers it."""

from __future__ import annotations

from healthd.judge.sources.seam import BaseSource

PROBE = "boundary"
"""The pseudo-probe of boundary checks (``healthd.coverage.BOUNDARY_PROBE``)."""


class Boundary(BaseSource):
    name = "boundary"
    by_node_probes = frozenset({PROBE})
