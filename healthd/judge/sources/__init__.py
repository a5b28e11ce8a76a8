"""The judge's evidence sources: each module turns one kind of evidence into typed ``Finding``s.

``healthd.judge.engine.Judge`` keeps the state (series, marks, pools, events, verdicts) and the one
confirmation and conclusion stage; the sources only say what a piece of evidence shows about a node
(and a GPU), with no state of their own beyond what the judge hands them:

- ``measurements``: a run's judged measurements (``series.select``) → below the class's floor, off the
  node's own baseline, outliers of the class's fleet and of the node's own GPUs;
- ``checks``: a failed run (its failed checks, a hard fault the collector attributed, ``hardfault``) and
  the NCCL transport check → ``check_failed``, ``gpus_missing``, ``hang``, ``crash``, ``cuda_error``,
  ``nccl_error``, ``nccl_transport``;
- ``passive``: a poll of the site's Prometheus (dcgm-exporter: XIDs, row remaps, ECC, throttling,
  health) → ``xid_79``, ``row_remap_failure``, ``ecc_dbe``, ... (hard faults confirmed by a re-probe or a
  repeat; hints never drain).

Adding a source is adding a module that returns findings; the judge decides what they mean together.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from healthd.judge.model import Finding, SeriesKey


@dataclass
class RunFindings:
    """What the run-based sources found in one run, before suppression and confirmation."""

    node_findings: dict[str, list[Finding]] = field(default_factory=dict)
    group_findings: list[Finding] = field(default_factory=list)
    """Findings on a multi-node measurement (the group), localised later by ``confirm.attribute``."""
    values: list[tuple[str, SeriesKey, float, bool]] = field(default_factory=list)
    """(node, series, value, from a group measurement): what the baselines may accept."""
    shortfalls: dict[str, list[tuple[SeriesKey, float, float]]] = field(default_factory=dict)
    """Node → (series, distance from its own baseline in noise units and relative, positive: worse)."""
    ends: tuple[str, ...] = ()
    """The two nodes at the ends of the run's slowest inter-node link, when its group findings are on
    inter-node link figures (a link between two nodes, whatever the run's size): the group's suspects."""

    def place(self, nodes: tuple[str, ...], node: str | None, f: Finding) -> None:
        """On ``node`` when it is one of the run's ``nodes``, on the only node of a single-node run,
        else on the group."""
        if node is not None and node in nodes:
            self.node_findings.setdefault(node, []).append(f)
        elif len(nodes) == 1:
            self.node_findings.setdefault(nodes[0], []).append(f)
        else:
            self.group_findings.append(f)
