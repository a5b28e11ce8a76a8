"""healthd's Grafana dashboards as code (grafana-foundation-sdk, Grafana 11.6 branch).

The committed JSON in ``grafana/dashboards/`` is this module's output; ``tests/unit/test_dashboards.py``
fails when they differ. After changing a panel::

    python grafana/generate.py            # rewrite grafana/dashboards/*.json
    python grafana/generate.py --check    # exit 1 if the committed JSON is stale

Every panel and every query variable uses the ``datasource`` template variable (``${datasource}``), never an
import-time ``${DS_...}`` input: file-provisioned dashboards do not substitute those. Every query selects
``instance=~"$instance"`` so one Grafana can show several healthd instances. Metric names are documented in
``docs/metrics.md``; the queries run against a real Prometheus in ``tests/integration/test_prometheus_reality.py``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol, Self, TypeVar

from grafana_foundation_sdk.builders import common as common_b
from grafana_foundation_sdk.builders import dashboard as dash
from grafana_foundation_sdk.builders import heatmap, histogram, prometheus, stat, statetimeline, table, timeseries
from grafana_foundation_sdk.cog.builder import Builder
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common
from grafana_foundation_sdk.models import dashboard as model
from grafana_foundation_sdk.models import heatmap as heatmap_model
from grafana_foundation_sdk.models.prometheus import PromQueryFormat

OUT_DIR = Path(__file__).resolve().parent / "dashboards"
DS = model.DataSourceRef(type_val="prometheus", uid="${datasource}")
INST = 'instance=~"$instance"'
NODE_CLASS_JOIN = ("* on (job, instance, node) group_left (node_class) "
                   f'healthd_node_info{{{INST}, node_class=~"$node_class"}}')

OUTCOME_CODES = {"pass": 0, "degraded": 1, "fail": 2, "error": 3}
OUTCOME_COLORS = {"pass": "green", "degraded": "yellow", "fail": "red", "error": "purple"}

Panel = Builder[model.Panel]


# -- queries and variables ----------------------------------------------------------------------------------------

def query(expr: str, legend: str = "", *, ref: str = "A", instant: bool = False, table_format: bool = False
          ) -> prometheus.Dataquery:
    q = prometheus.Dataquery().expr(expr).ref_id(ref).datasource(DS).legend_format(legend or "__auto")
    q = q.instant() if instant else q.range()
    if table_format:
        q = q.format(PromQueryFormat.TABLE)
    return q


def outcome_code(metric: str, selector: str, by: str) -> str:
    """One number per ``by`` group for the outcome whose 0/1 series is 1 (pass 0, degraded 1, fail 2, error 3)."""
    parts = [f'{code} * {metric}{{{selector}, outcome="{outcome}"}}' for outcome, code in OUTCOME_CODES.items()]
    return f"max by ({by}) (\n  " + "\nor\n  ".join(parts) + "\n)"


def datasource_variable() -> dash.DatasourceVariable:
    return dash.DatasourceVariable("datasource").label("Data source").type("prometheus")


def label_variable(name: str, label: str, source: str, *, multi: bool = True, include_all: bool = True,
                   sort: model.VariableSort = model.VariableSort.ALPHABETICAL_ASC) -> dash.QueryVariable:
    v = (dash.QueryVariable(name).label(label).datasource(DS)
         .query({"query": f"label_values({source}, {name})", "refId": "PrometheusVariableQueryEditor-VariableQuery"})
         .refresh(model.VariableRefresh.ON_TIME_RANGE_CHANGED).sort(sort).multi(multi).include_all(include_all))
    if include_all:
        v = v.all_value(".*")
    return v


def instance_variable() -> dash.QueryVariable:
    return label_variable("instance", "healthd instance", "healthd_build_info")


# -- panels ---------------------------------------------------------------------------------------------------------

class _PanelBuilder(Protocol):
    def title(self, title: str) -> Self: ...
    def description(self, description: str) -> Self: ...
    def datasource(self, datasource: model.DataSourceRef) -> Self: ...
    def span(self, w: int) -> Self: ...
    def height(self, h: int) -> Self: ...


P = TypeVar("P", bound=_PanelBuilder)


def framed(panel: P, title: str, description: str, w: int, h: int) -> P:
    """Title, description, the ``${datasource}`` reference and the size every panel has."""
    return panel.title(title).description(description).datasource(DS).span(w).height(h)


def ts(title: str, description: str, targets: Sequence[prometheus.Dataquery], unit: str, *, w: int = 12,
       h: int = 8, stack: bool = False, bars: bool = False, minimum: float | None = None,
       overrides: Sequence[tuple[str, list[model.DynamicConfigValue]]] = ()) -> Panel:
    p = framed(timeseries.Panel(), title, description, w, h).unit(unit)
    for t in targets:
        p = p.with_target(t)
    p = p.legend(common_b.VizLegendOptions().display_mode(common.LegendDisplayMode.TABLE)
                 .placement(common.LegendPlacement.BOTTOM).show_legend(True).calcs(["lastNotNull", "min", "max"]))
    if stack:
        p = p.stacking(common_b.StackingConfig().mode(common.StackingMode.NORMAL)).fill_opacity(30)
    if bars:
        p = p.draw_style(common.GraphDrawStyle.BARS).fill_opacity(60)
    if minimum is not None:
        p = p.min(minimum)
    for ref, props in overrides:
        p = p.override_by_query(ref, props)
    return p


def stat_panel(title: str, description: str, target: prometheus.Dataquery, unit: str = "none", *, w: int = 4,
               h: int = 4, steps: Sequence[tuple[float | None, str]] = ((None, "green"),)) -> Panel:
    p = (framed(stat.Panel(), title, description, w, h).with_target(target).unit(unit)
         .reduce_options(common_b.ReduceDataOptions().calcs(["lastNotNull"]).values(False))
         .color_mode(common.BigValueColorMode.BACKGROUND).graph_mode(common.BigValueGraphMode.AREA)
         .thresholds(dash.ThresholdsConfig().mode(model.ThresholdsMode.ABSOLUTE)
                     .steps([model.Threshold(value=v, color=c) for v, c in steps])))
    return p


def table_panel(title: str, description: str, targets: Sequence[prometheus.Dataquery], *, w: int = 12,
                h: int = 8, hide: Sequence[str] = ("Time", "__name__", "job"), unit: str = "none") -> Panel:
    p = framed(table.Panel(), title, description, w, h).unit(unit)
    for t in targets:
        p = p.with_target(t)
    exclude = {name: True for name in hide}
    p = p.with_transformation(model.DataTransformerConfig(id_val="merge", options={}))
    p = p.with_transformation(model.DataTransformerConfig(
        id_val="organize", options={"excludeByName": exclude, "renameByName": {"Value": "value"}}))
    return p


def outcome_timeline(title: str, description: str, target: prometheus.Dataquery, *, w: int = 24,
                     h: int = 8) -> Panel:
    mapping = model.ValueMap(options={
        str(code): model.ValueMappingResult(text=outcome, color=OUTCOME_COLORS[outcome], index=code)
        for outcome, code in OUTCOME_CODES.items()
    })
    p = (framed(statetimeline.Panel(), title, description, w, h).with_target(target)
         .mappings([mapping]).show_value(common.VisibilityMode.NEVER).merge_values(True)
         .color_scheme(dash.FieldColor().mode(model.FieldColorModeId.THRESHOLDS))
         .thresholds(dash.ThresholdsConfig().mode(model.ThresholdsMode.ABSOLUTE).steps([
             model.Threshold(value=None, color="green"), model.Threshold(value=1, color="yellow"),
             model.Threshold(value=2, color="red"), model.Threshold(value=3, color="purple")])))
    return p


def flag_timeline(title: str, description: str, target: prometheus.Dataquery, on_text: str, *, w: int = 12,
                  h: int = 6, on_color: str = "red", off_color: str = "green") -> Panel:
    mapping = model.ValueMap(options={
        "0": model.ValueMappingResult(text="no", color=off_color, index=0),
        "1": model.ValueMappingResult(text=on_text, color=on_color, index=1),
    })
    p = (framed(statetimeline.Panel(), title, description, w, h).with_target(target).mappings([mapping])
         .show_value(common.VisibilityMode.NEVER).merge_values(True))
    return p


def heatmap_panel(title: str, description: str, target: prometheus.Dataquery, unit: str, *, w: int = 12,
                  h: int = 9) -> Panel:
    p = (framed(heatmap.Panel(), title, description, w, h).with_target(target).calculate(True)
         .color(heatmap.HeatmapColorOptions().mode(heatmap_model.HeatmapColorMode.SCHEME).scheme("Spectral")
                .scale(heatmap_model.HeatmapColorScale.EXPONENTIAL).exponent(0.5).steps(64))
         .y_axis(heatmap.YAxisConfig().unit(unit))
         .cell_values(heatmap.CellValues().unit("short")))
    return p


def histogram_panel(title: str, description: str, target: prometheus.Dataquery, unit: str, *, w: int = 12,
                    h: int = 9) -> Panel:
    p = framed(histogram.Panel(), title, description, w, h).with_target(target).unit(unit).bucket_count(20)
    return p


def reference_lines() -> list[tuple[str, list[model.DynamicConfigValue]]]:
    """Style of the measured (A), baseline (B) and floor (C) queries of a "measured vs baseline vs floor" panel."""
    return [
        ("B", [model.DynamicConfigValue(id_val="custom.lineStyle", value={"fill": "dash", "dash": [10, 10]}),
               model.DynamicConfigValue(id_val="custom.lineWidth", value=1)]),
        ("C", [model.DynamicConfigValue(id_val="custom.lineStyle", value={"fill": "dot", "dash": [2, 6]}),
               model.DynamicConfigValue(id_val="color", value={"mode": "fixed", "fixedColor": "red"}),
               model.DynamicConfigValue(id_val="custom.lineWidth", value=2)]),
    ]


def measured_vs_reference(title: str, description: str, metric: str, selector: str, legend: str,
                          unit: str, *, w: int = 12, h: int = 9) -> Panel:
    return ts(title, description, [
        query(f"{metric}{{{selector}}}", f"{legend}", ref="A"),
        query(f"healthd_baseline_{metric.removeprefix('healthd_')}{{{selector}}}", f"baseline {legend}", ref="B"),
        query(f"healthd_floor_{metric.removeprefix('healthd_')}{{{selector}}}", f"floor {legend}", ref="C"),
    ], unit, w=w, h=h, overrides=reference_lines())


def row(title: str) -> dash.Row:
    return dash.Row(title)


# -- dashboards -----------------------------------------------------------------------------------------------------

def base(uid: str, title: str, description: str) -> dash.Dashboard:
    return (dash.Dashboard(title).uid(uid).description(description).tags(["healthd", "gpu", "slurm"])
            .editable().tooltip(model.DashboardCursorSync.CROSSHAIR).time("now-24h", "now").refresh("1m")
            .timezone("browser")
            .link(dash.DashboardLink("healthd").type(model.DashboardLinkType.DASHBOARDS).tags(["healthd"])
                  .as_dropdown(True).include_vars(True).keep_time(True))
            .with_variable(datasource_variable()).with_variable(instance_variable()))


def fleet_overview() -> dash.Dashboard:
    d = base("healthd-fleet", "healthd / Fleet overview",
             "Every node's verdict, healthd's recommendations, probe coverage and the spread of measured "
             "performance per node class.")
    d = d.with_variable(label_variable("node_class", "Node class", f"healthd_node_info{{{INST}}}"))
    d = d.with_variable(label_variable("collective", "Collective", f"healthd_nccl_busbw_bytes_per_second{{{INST}}}",
                                       multi=False, include_all=False))
    d = d.with_variable(label_variable(
        "size_bytes", "Message size (bytes)",
        f'healthd_nccl_busbw_bytes_per_second{{{INST}, collective="$collective"}}',
        multi=False, include_all=False, sort=model.VariableSort.NUMERICAL_DESC))
    d = d.with_variable(label_variable("dtype", "GEMM dtype", f"healthd_gemm_flop_per_second{{{INST}}}",
                                       multi=False, include_all=False))
    nccl_sel = f'{INST}, collective="$collective", size_bytes="$size_bytes"'
    gemm_sel = f'{INST}, dtype="$dtype"'

    d = d.with_row(row("Now"))
    d = d.with_panel(stat_panel("Nodes", "Nodes healthd knows in the selected classes (healthd_node_info).",
                                query(f'count(healthd_node_info{{{INST}, node_class=~"$node_class"}})', "nodes")))
    for outcome, color in (("fail", "red"), ("degraded", "orange")):
        d = d.with_panel(stat_panel(
            f"Nodes judged {outcome}",
            f"Nodes with at least one probe whose current verdict is {outcome}.",
            query(f'count(max by (job, instance, node) (healthd_node_verdict{{{INST}, outcome="{outcome}"}} '
                  f'{NODE_CLASS_JOIN}) == 1) or vector(0)', outcome),
            steps=((None, "green"), (1, color))))
    d = d.with_panel(stat_panel(
        "Drains recommended", "Nodes healthd recommends draining now (healthd_drain_recommended).",
        query(f"count(max by (job, instance, node) (healthd_drain_recommended{{{INST}}}) == 1) or vector(0)",
              "drains"), steps=((None, "green"), (1, "red"))))
    d = d.with_panel(stat_panel(
        "Results fresher than 2 h",
        "Share of (node, probe) pairs whose newest finished run is younger than 2 hours: the probing coverage.",
        query(f"count((time() - healthd_node_probe_last_run_timestamp_seconds{{{INST}}}) < 7200) "
              f"/ count(healthd_node_probe_last_run_timestamp_seconds{{{INST}}})", "fresh"),
        "percentunit", steps=((None, "red"), (0.5, "orange"), (0.9, "green"))))
    d = d.with_panel(stat_panel(
        "Fleet events", "Node-class and probe pairs in which the judge sees a fleet-wide degradation.",
        query(f"sum(healthd_fleet_event_active{{{INST}}}) or vector(0)", "events"),
        steps=((None, "green"), (1, "red"))))

    d = d.with_row(row("Verdicts and recommendations"))
    d = d.with_panel(ts(
        "Nodes by verdict, per probe",
        "How many nodes the judge currently puts in each outcome, per probe (healthd_node_verdict).",
        [query(f"sum by (probe, outcome) (healthd_node_verdict{{{INST}}} {NODE_CLASS_JOIN})", "{{probe}} {{outcome}}")],
        "none", stack=True, minimum=0))
    d = d.with_panel(table_panel(
        "Drain recommendations", "Nodes healthd recommends draining, with the reason code.",
        [query(f"healthd_drain_recommended{{{INST}}} == 1", instant=True, table_format=True)],
        hide=("Time", "__name__", "job", "Value")))
    d = d.with_panel(table_panel(
        "Nodes not passing", "Current verdicts other than pass: which node, which probe, why.",
        [query(f'healthd_node_verdict{{{INST}, outcome=~"fail|degraded|error"}} == 1', instant=True,
               table_format=True)],
        hide=("Time", "__name__", "job", "Value"), w=24))
    d = d.with_panel(table_panel(
        "Nodes not passing, by leaf switch",
        "Nodes judged fail or degraded per leaf switch (or block) and probe, out of the leaf's nodes, from the "
        "topology healthd reads (healthd_node_switch). Many under one leaf: look at the switch findings below.",
        [query(f'count by (leaf, probe) ((healthd_node_verdict{{{INST}, outcome=~"fail|degraded"}} == 1) '
               f"* on (job, instance, node) group_left (leaf) healthd_node_switch{{{INST}}})",
               instant=True, table_format=True, ref="A"),
         query(f"count by (leaf) (healthd_node_switch{{{INST}}})", instant=True, table_format=True, ref="B")],
        hide=("Time", "__name__", "job"), w=24))

    d = d.with_row(row("Coverage"))
    d = d.with_panel(ts(
        "Oldest result per probe",
        "Age of the stalest node's newest finished run, per probe. healthd only probes idle nodes, so busy "
        "nodes age; a rise on every probe means healthd is not probing at all.",
        [query(f"max by (probe) (time() - healthd_node_probe_last_run_timestamp_seconds{{{INST}}})", "{{probe}}")],
        "s", minimum=0))
    d = d.with_panel(table_panel(
        "Least recently probed", "The 15 (node, probe) pairs with the oldest finished run.",
        [query(f"topk(15, time() - healthd_node_probe_last_run_timestamp_seconds{{{INST}}})", instant=True,
               table_format=True)], unit="s"))

    d = d.with_row(row("Performance by node class"))
    d = d.with_panel(heatmap_panel(
        "NCCL bus bandwidth distribution",
        "Distribution over nodes of busbw for the selected collective and message size, per node class selection. "
        "A second cluster of cells below the main band is a group of slow nodes.",
        query(f"healthd_nccl_busbw_bytes_per_second{{{nccl_sel}}} {NODE_CLASS_JOIN}", "{{node}}"), "Bps"))
    d = d.with_panel(heatmap_panel(
        "GEMM FLOP/s distribution",
        "Distribution over GPUs of the matrix-multiply rate for the selected dtype.",
        query(f"healthd_gemm_flop_per_second{{{gemm_sel}}} {NODE_CLASS_JOIN}", "{{node}}/{{gpu}}"), "flops"))
    d = d.with_panel(histogram_panel(
        "NCCL bus bandwidth now, per node",
        "Histogram of the latest busbw of every node (selected collective and size).",
        query(f"max by (node) (healthd_nccl_busbw_bytes_per_second{{{nccl_sel}}} {NODE_CLASS_JOIN})",
              "{{node}}", instant=True), "Bps"))
    d = d.with_panel(histogram_panel(
        "GEMM FLOP/s now, per GPU", "Histogram of the latest matrix-multiply rate of every GPU (selected dtype).",
        query(f"healthd_gemm_flop_per_second{{{gemm_sel}}} {NODE_CLASS_JOIN}", "{{node}}/{{gpu}}",
              instant=True), "flops"))

    d = d.with_row(row("Worst nodes"))
    d = d.with_panel(table_panel(
        "Slowest NCCL nodes vs their class",
        "The 10 nodes with the lowest busbw relative to the median of their node class (1 = median).",
        [query(f"bottomk(10, healthd_nccl_busbw_bytes_per_second{{{nccl_sel}}} {NODE_CLASS_JOIN} "
               f"/ on (job, instance, node_class, collective, size_bytes, placement, scope) group_left () "
               f"quantile by (job, instance, node_class, collective, size_bytes, placement, scope) (0.5, "
               f"healthd_nccl_busbw_bytes_per_second{{{nccl_sel}}} {NODE_CLASS_JOIN}))",
               instant=True, table_format=True)], unit="percentunit"))
    d = d.with_panel(table_panel(
        "Slowest GPUs vs their class",
        "The 10 GPUs with the lowest GEMM rate relative to the median of their node class (1 = median).",
        [query(f"bottomk(10, healthd_gemm_flop_per_second{{{gemm_sel}}} {NODE_CLASS_JOIN} "
               f"/ on (job, instance, node_class, dtype) group_left () "
               f"quantile by (job, instance, node_class, dtype) (0.5, "
               f"healthd_gemm_flop_per_second{{{gemm_sel}}} {NODE_CLASS_JOIN}))",
               instant=True, table_format=True)], unit="percentunit"))
    d = d.with_panel(table_panel(
        "Furthest below baseline",
        "The 10 (node, probe) pairs whose last run is furthest below the node's own baseline: the worst judged "
        "figure of the run over its baseline (healthd_node_probe_baseline_ratio; times inverted).",
        [query(f"bottomk(10, healthd_node_probe_baseline_ratio{{{INST}}})", instant=True, table_format=True)],
        unit="percentunit", w=24))

    d = d.with_row(row("Scaling"))
    d = d.with_panel(table_panel(
        "Scaling table: busbw per node count",
        "Bus bandwidth over groups of 2, 4, 8, ... idle nodes of a class, from the newest scaling sweep ([sweep]).",
        [query(f"max by (node_class, nodes, collective, size_bytes) "
               f"(healthd_scaling_busbw_bytes_per_second{{{INST}}})", instant=True, table_format=True)],
        unit="Bps"))
    d = d.with_panel(ts(
        "Scaling over time", "Largest-size busbw per node class and node count, one point per sweep.",
        [query(f"max by (node_class, nodes) (healthd_scaling_busbw_bytes_per_second{{{INST}}})",
               "{{node_class}} x{{nodes}}")], "Bps"))

    d = d.with_row(row("Fleet events and remediation"))
    d = d.with_panel(flag_timeline(
        "Fleet events", "When the judge saw a fleet-wide degradation, per node class and probe.",
        query(f"healthd_fleet_event_active{{{INST}}}", "{{node_class}} {{probe}} {{scope}}"), "fleet event"))
    d = d.with_panel(ts(
        "Remediation actions", "Drains, resumes and refusals per hour, by action and result.",
        [query(f"sum by (action, result) (increase(healthd_remediation_actions_total{{{INST}}}[1h]))",
               "{{action}} {{result}}")], "none", bars=True, minimum=0))
    d = d.with_panel(flag_timeline(
        "Remediation circuit breaker", "Open: healthd stopped acting on recommendations (too many too fast).",
        query(f"healthd_remediation_breaker_open{{{INST}}}", "{{instance}}"), "open", w=24, h=4))
    d = d.with_panel(flag_timeline(
        "Switch findings", "When the nodes under one switch failed a probe together beyond chance (one finding, "
        "their drains held), per switch, level (0: leaf) and probe.",
        query(f"healthd_switch_finding{{{INST}}}", "{{switch}} (level {{level}}) {{probe}}"), "switch finding",
        w=24))
    return d


def node_detail() -> dash.Dashboard:
    d = base("healthd-node", "healthd / Node detail",
             "One node: each measurement over time against its baseline and floor, per-GPU GEMM, the probe "
             "history and outcomes, and drain recommendations.")
    d = d.with_variable(label_variable("node", "Node", f"healthd_node_info{{{INST}}}", multi=False,
                                       include_all=False))
    d = d.with_variable(label_variable("collective", "Collective",
                                       f'healthd_nccl_busbw_bytes_per_second{{{INST}, node="$node"}}'))
    d = d.with_variable(label_variable(
        "size_bytes", "Message size (bytes)",
        f'healthd_nccl_busbw_bytes_per_second{{{INST}, node="$node", collective=~"$collective"}}',
        sort=model.VariableSort.NUMERICAL_DESC))
    n = f'{INST}, node="$node"'
    nccl = f'{n}, collective=~"$collective", size_bytes=~"$size_bytes"'

    d = d.with_row(row("Node"))
    d = d.with_panel(table_panel(
        "Node", "Class and GPUs of the node (healthd_node_info, healthd_node_gpus).",
        [query(f"healthd_node_info{{{n}}}", instant=True, table_format=True, ref="A"),
         query(f"healthd_node_gpus{{{n}}}", instant=True, table_format=True, ref="B")],
        hide=("Time", "__name__", "job", "Value #A"), w=8, h=5))
    d = d.with_panel(table_panel(
        "Current verdicts", "The judge's verdict per probe and its reason code.",
        [query(f"healthd_node_verdict{{{n}}} == 1", instant=True, table_format=True)],
        hide=("Time", "__name__", "job", "Value", "instance", "node"), w=8, h=5))
    d = d.with_panel(table_panel(
        "Drain recommendation", "Present while healthd recommends draining this node.",
        [query(f"healthd_drain_recommended{{{n}}} == 1", instant=True, table_format=True)],
        hide=("Time", "__name__", "job", "Value", "instance"), w=8, h=5))

    d = d.with_row(row("Verdicts and probe history"))
    d = d.with_panel(outcome_timeline(
        "Verdict per probe", "The judge's verdict over time (pass, degraded, fail, error).",
        query(outcome_code("healthd_node_verdict", n, "probe"), "{{probe}}")))
    d = d.with_panel(outcome_timeline(
        "Outcome of the last run, per probe",
        "What the newest probe run reported, over time; error means the probe could not check the node.",
        query(outcome_code("healthd_node_probe_last_outcome", n, "probe"), "{{probe}}"), h=6))
    d = d.with_panel(ts(
        "Time since last run and last success",
        "Seconds since the newest finished run (solid) and the newest passing run, per probe.",
        [query(f"time() - healthd_node_probe_last_run_timestamp_seconds{{{n}}}", "last run {{probe}}", ref="A"),
         query(f"time() - healthd_node_probe_last_success_timestamp_seconds{{{n}}}", "last success {{probe}}",
               ref="B")], "s", minimum=0,
        overrides=[("B", [model.DynamicConfigValue(id_val="custom.lineStyle",
                                                   value={"fill": "dash", "dash": [10, 10]})])]))
    d = d.with_panel(ts(
        "Duration and queue wait of the last run",
        "How long the newest run took and how long it waited in the queue before starting, per probe.",
        [query(f"healthd_node_probe_last_duration_seconds{{{n}}}", "duration {{probe}}", ref="A"),
         query(f"healthd_node_probe_last_queue_wait_seconds{{{n}}}", "queue wait {{probe}}", ref="B")],
        "s", minimum=0))
    d = d.with_panel(flag_timeline(
        "Drain recommended", "When healthd recommended draining this node, by reason code.",
        query(f"healthd_drain_recommended{{{n}}}", "{{reason_code}}"), "drain", w=24, h=4))

    d = d.with_row(row("Passive signals (dcgm-exporter)"))
    d = d.with_panel(table_panel(
        "Passive signals followed now",
        "The site's dcgm-exporter signals healthd follows on this node (healthd_node_passive_signal): XID, row "
        "remap, ECC, throttling, health; per GPU and UUID, with their strength (fault or hint) and stage (awaiting "
        "confirmation, confirmed, suspect, hint). Empty while none fires.",
        [query(f"healthd_node_passive_signal{{{n}, signal!=\"infiniband\"}} == 1", instant=True,
               table_format=True)],
        hide=("Time", "__name__", "job", "Value", "instance", "node", "device", "port"), w=12, h=6))
    d = d.with_panel(flag_timeline(
        "Passive signals over time", "When each passive signal was followed on this node, by code and GPU.",
        query(f"max by (code, gpu) (healthd_node_passive_signal{{{n}, signal!=\"infiniband\"}})",
              "{{code}} gpu {{gpu}}"), "signal", w=12, h=6))
    d = d.with_panel(table_panel(
        "InfiniBand port signals followed now",
        "node_exporter's InfiniBand port signals healthd follows on this node (healthd_node_passive_signal, "
        "signal infiniband): flaps (ib_link_down), port errors, links below the class's rate; per HCA device and "
        "port. Stage hint: port errors alone (never a drain); confirmed: with the node's inter-node busbw low in "
        "the same window, or a degraded link. Empty while none fires.",
        [query(f"healthd_node_passive_signal{{{n}, signal=\"infiniband\"}} == 1", instant=True, table_format=True)],
        hide=("Time", "__name__", "job", "Value", "instance", "node", "gpu", "gpu_uuid", "signal"), w=12, h=6))
    d = d.with_panel(flag_timeline(
        "InfiniBand port signals over time", "When each port signal was followed on this node, by code, device "
        "and port.",
        query(f"max by (code, device, port) (healthd_node_passive_signal{{{n}, signal=\"infiniband\"}})",
              "{{code}} {{device}} port {{port}}"), "port", w=12, h=6))

    d = d.with_row(row("NCCL"))
    d = d.with_panel(measured_vs_reference(
        "NCCL bus bandwidth vs baseline and floor",
        "busbw (nccl-tests definition) per collective and size; dashed: the node's baseline; red dots: the floor.",
        "healthd_nccl_busbw_bytes_per_second", nccl, "{{collective}} {{size_bytes}} {{placement}}", "Bps", w=24))
    d = d.with_panel(ts(
        "NCCL algorithm bandwidth", "algbw (size / time) per collective and size.",
        [query(f"healthd_nccl_algbw_bytes_per_second{{{nccl}}}", "{{collective}} {{size_bytes}} {{placement}}")],
        "Bps"))
    d = d.with_panel(ts(
        "NCCL time per collective", "Mean time of one collective, averaged across ranks.",
        [query(f"healthd_nccl_time_seconds{{{nccl}}}", "{{collective}} {{size_bytes}} {{placement}}")], "s"))

    d = d.with_row(row("GEMM per GPU"))
    d = d.with_panel(measured_vs_reference(
        "GEMM FLOP/s vs baseline and floor",
        "Matrix-multiply rate per GPU and dtype; dashed: baseline; red dots: floor.",
        "healthd_gemm_flop_per_second", n, "GPU {{gpu}} {{dtype}}", "flops", w=24))
    d = d.with_panel(ts(
        "GEMM FLOP/s, latest per GPU", "The newest rate per GPU and dtype, side by side.",
        [query(f"healthd_gemm_flop_per_second{{{n}}}", "GPU {{gpu}} {{dtype}}")], "flops", bars=True))
    d = d.with_panel(measured_vs_reference(
        "GPU memory bandwidth vs baseline and floor", "Device-memory copy bandwidth per GPU.",
        "healthd_gemm_memory_bandwidth_bytes_per_second", n, "GPU {{gpu}}", "Bps"))

    d = d.with_row(row("DDP step"))
    d = d.with_panel(measured_vs_reference(
        "DDP throughput vs baseline and floor", "Training samples per second of the DDP step probe.",
        "healthd_ddp_throughput_samples_per_second", n, "samples/s", "none", w=8))
    d = d.with_panel(ts(
        "DDP step time", "Step time at p50 and p90 over all ranks and steps.",
        [query(f"healthd_ddp_step_seconds{{{n}}}", "p{{quantile}}")], "s", w=8))
    d = d.with_panel(ts(
        "DDP scaling efficiency", "Samples/s per rank with DDP divided by samples/s of one rank alone (1 = perfect).",
        [query(f"healthd_ddp_scaling_efficiency_ratio{{{n}}}", "efficiency")], "percentunit", w=8, minimum=0))
    d = d.with_panel(measured_vs_reference(
        "DDP model FLOP/s per GPU vs baseline and floor",
        "6 x parameters x tokens/s per GPU of the DDP step (attention FLOPs not included); dashed: baseline; "
        "red dots: floor.", "healthd_ddp_model_flop_per_second", n, "{{dtype}}", "flops"))
    d = d.with_panel(ts(
        "DDP MFU", "Model FLOPs utilisation: model FLOP/s per GPU over the node class's dense peak for the dtype "
        "(healthd/judge/peaks.toml); no line for a class without a peak.",
        [query(f"healthd_ddp_mfu_ratio{{{n}}}", "{{dtype}}")], "percentunit", minimum=0))

    d = d.with_row(row("Compute per GPU (optional compute probe)"))
    d = d.with_panel(measured_vs_reference(
        "MLP training FLOP/s vs baseline", "PARAM-style Linear stack, 6 x batch x sum(in x out) / step, per GPU.",
        "healthd_compute_mlp_flop_per_second", n, "GPU {{gpu}} {{dtype}}", "flops"))
    d = d.with_panel(measured_vs_reference(
        "EmbeddingBag bytes/s vs baseline", "PARAM-style EmbeddingBag lookups: rows read per second, per GPU.",
        "healthd_compute_embedding_bag_bytes_per_second", n, "GPU {{gpu}}", "Bps"))
    return d


def probe_operations() -> dash.Dashboard:
    d = base("healthd-probes", "healthd / Probe operations",
             "What healthd's probing costs and how well it runs: runs and outcomes, errors, queue wait and "
             "duration, GPU time spent, the scheduler and the cluster backend.")
    d = d.with_variable(label_variable("probe", "Probe", f"healthd_probe_runs_total{{{INST}}}"))
    p = f'{INST}, probe=~"$probe"'

    d = d.with_row(row("Daemon"))
    d = d.with_panel(stat_panel(
        "Slurm reachable", "1 when healthd's last Slurm command worked (always 0 on the local backend).",
        query(f"min(healthd_slurm_up{{{INST}}})", "slurm"), steps=((None, "red"), (1, "green"))))
    d = d.with_panel(stat_panel(
        "Backend up", "1 when healthd's last call to its cluster backend (Slurm or local) worked.",
        query(f"min(healthd_backend_up{{{INST}}})", "backend"), steps=((None, "red"), (1, "green"))))
    d = d.with_panel(stat_panel(
        "Probes in flight", "Runs submitted and not yet finished.",
        query(f"sum(healthd_probes_in_flight{{{INST}}})", "in flight")))
    d = d.with_panel(stat_panel(
        "Last scheduler tick", "Seconds since any scheduler task last ran; healthd is unhealthy above 120 s.",
        query(f"time() - max(healthd_scheduler_last_tick_timestamp_seconds{{{INST}}})", "age"), "s",
        steps=((None, "green"), (120, "red"))))
    d = d.with_panel(table_panel(
        "Build", "healthd version, Python and backend of each instance.",
        [query(f"healthd_build_info{{{INST}}}", instant=True, table_format=True)],
        hide=("Time", "__name__", "job", "Value"), w=8, h=4))

    d = d.with_row(row("Runs and outcomes"))
    d = d.with_panel(ts(
        "Probe runs per hour by outcome", "Finished runs per hour, by probe and outcome.",
        [query(f"sum by (probe, outcome) (rate(healthd_probe_runs_total{{{p}}}[$__rate_interval])) * 3600",
               "{{probe}} {{outcome}}")], "none", stack=True, minimum=0))
    d = d.with_panel(ts(
        "Probe error ratio", "Share of runs that ended in error (the probe could not check the node), per probe.",
        [query(f'(sum by (probe) (rate(healthd_probe_runs_total{{{p}, outcome="error"}}[$__rate_interval])) '
               f"or sum by (probe) (rate(healthd_probe_runs_total{{{p}}}[$__rate_interval])) * 0) "
               f"/ sum by (probe) (rate(healthd_probe_runs_total{{{p}}}[$__rate_interval]))", "{{probe}}")],
        "percentunit", minimum=0))
    d = d.with_panel(ts(
        "Daemon errors by kind", "Errors healthd handled without stopping, per hour, by kind.",
        [query(f"sum by (kind) (rate(healthd_errors_total{{{INST}}}[$__rate_interval])) * 3600", "{{kind}}")],
        "none", minimum=0))
    d = d.with_panel(ts(
        "Error verdicts by reason", "Nodes whose current verdict is error, by probe and reason code (0 per "
        "probe without one: the verdict series carries only the current outcome).",
        [query(f'sum by (probe, reason_code) (healthd_node_verdict{{{p}, outcome="error"}}) '
               f"or sum by (probe) (healthd_node_verdict{{{p}}}) * 0",
               "{{probe}} {{reason_code}}")], "none", stack=True, minimum=0))

    d = d.with_row(row("Queue wait and duration"))
    d = d.with_panel(ts(
        "Queue wait of the last runs",
        "Median and worst time the newest run of each node waited between submission and start, per probe.",
        [query(f"quantile by (probe) (0.5, healthd_node_probe_last_queue_wait_seconds{{{p}}})",
               "median {{probe}}", ref="A"),
         query(f"max by (probe) (healthd_node_probe_last_queue_wait_seconds{{{p}}})", "max {{probe}}", ref="B")],
        "s", minimum=0))
    d = d.with_panel(ts(
        "Run duration",
        "Mean duration of the runs that finished in the interval (exact, from the counters), and the worst "
        "newest run per probe.",
        [query(f"sum by (probe) (rate(healthd_probe_seconds_total{{{p}}}[$__rate_interval])) "
               f"/ sum by (probe) (rate(healthd_probe_runs_total{{{p}}}[$__rate_interval]))", "mean {{probe}}",
               ref="A"),
         query(f"max by (probe) (healthd_node_probe_last_duration_seconds{{{p}}})", "max {{probe}}", ref="B")],
        "s", minimum=0))

    d = d.with_row(row("Probe cost"))
    d = d.with_panel(ts(
        "Probe time", "Seconds of probe runs per second of wall clock, per probe: the average number of probe "
        "runs going on at once.",
        [query(f"sum by (probe) (rate(healthd_probe_seconds_total{{{p}}}[$__rate_interval]))", "{{probe}}")],
        "none", stack=True, minimum=0))
    d = d.with_panel(ts(
        "GPU-seconds per hour",
        "GPU-seconds the probe runs that finished in the last hour held, per probe (exact, from the counter).",
        [query(f"sum by (probe) (increase(healthd_probe_gpu_seconds_total{{{p}}}[1h]))", "{{probe}}")],
        "s", stack=True, minimum=0))
    d = d.with_panel(ts(
        "GPU-seconds of one sweep",
        "GPU-seconds the newest run of every node held, summed per probe: what probing the whole fleet once costs.",
        [query(f"sum by (probe) (healthd_node_probe_last_gpu_seconds{{{p}}})", "{{probe}}")], "s", minimum=0))
    d = d.with_panel(stat_panel(
        "Fleet GPUs", "GPUs on the nodes healthd knows (healthd_node_gpus).",
        query(f"sum(healthd_node_gpus{{{INST}}})", "GPUs"), w=12, h=8))

    d = d.with_row(row("Scheduler"))
    d = d.with_panel(ts(
        "Scheduler ticks", "Ticks per minute, by task (discover, plan, collect, housekeeping).",
        [query(f"sum by (task) (rate(healthd_scheduler_ticks_total{{{INST}}}[$__rate_interval])) * 60", "{{task}}")],
        "none", w=8, minimum=0))
    d = d.with_panel(ts(
        "Tick errors and missed ticks", "Ticks that raised, and ticks skipped, per hour, by task.",
        [query(f"sum by (task) (rate(healthd_scheduler_tick_errors_total{{{INST}}}[$__rate_interval])) * 3600",
               "errors {{task}}", ref="A"),
         query(f"sum by (task) (rate(healthd_scheduler_missed_runs_total{{{INST}}}[$__rate_interval])) * 3600",
               "missed {{task}}", ref="B")], "none", w=8, minimum=0))
    d = d.with_panel(ts(
        "Time since each task ran", "Seconds since each scheduler task last ran.",
        [query(f"time() - healthd_scheduler_last_tick_timestamp_seconds{{{INST}}}", "{{task}}")], "s", w=8,
        minimum=0))
    d = d.with_panel(flag_timeline(
        "Slurm and backend", "Whether healthd's cluster backend and Slurm answered, over time.",
        query(f"healthd_backend_up{{{INST}}}", "backend {{backend}}"), "up", on_color="green", off_color="red",
        w=24, h=4))
    d = d.with_panel(flag_timeline(
        "Slurm reachable over time", "healthd_slurm_up (0 on the local backend).",
        query(f"healthd_slurm_up{{{INST}}}", "slurm {{instance}}"), "up", on_color="green", off_color="red",
        w=24, h=4))
    return d


DASHBOARDS: dict[str, Callable[[], dash.Dashboard]] = {
    "healthd-fleet.json": fleet_overview,
    "healthd-node.json": node_detail,
    "healthd-probes.json": probe_operations,
}


def _number_panels(panels: list[Any]) -> None:
    for number, panel in enumerate(panels, start=1):
        panel.id_val = number


def render(build: Callable[[], dash.Dashboard]) -> str:
    board = build().build()
    _number_panels(board.panels or [])
    return JSONEncoder(sort_keys=True, indent=2).encode(board) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--check", action="store_true", help="exit 1 if a committed dashboard differs")
    args = parser.parse_args(argv)
    stale = []
    for name, build in DASHBOARDS.items():
        text = render(build)
        path = OUT_DIR / name
        if args.check:
            if not path.exists() or path.read_text() != text:
                stale.append(name)
        else:
            path.write_text(text)
    if stale:
        print("stale: " + ", ".join(stale) + "; run python grafana/generate.py", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
