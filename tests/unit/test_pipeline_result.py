"""A real ``pipeline`` probe document (tests/fixtures/pipeline) through the daemon's side: the parser,
the judged series of the default config, and the metrics of either detail."""

from __future__ import annotations

import statistics
from pathlib import Path

from healthd.config import Settings
from healthd.judge.model import MeasurementInput, RunInput
from healthd.judge.series import select
from healthd.model import Node, Outcome
from healthd.parsers.healthd_json import parse_result
from healthd.store import Store
from probes.result import ProbeResult
from tests.unit.test_metrics import lookup, node_series, scrape

DOC = Path(__file__).resolve().parents[1] / "fixtures" / "pipeline" / "sim_2x2_pipeline.json"


def _result() -> ProbeResult:
    return parse_result(DOC.read_text())


def test_the_document_holds_every_link_and_its_per_node_summary() -> None:
    result = _result()
    assert result.outcome is Outcome.PASS and result.nodes == ["sim0", "sim1"]
    links = result.params["links"]
    assert len(links) == 8 and {x["scope"] for x in links} == {"node", "group"}
    for scope in ("node", "group"):
        mine = [x["busbw_bytes_per_second"] for x in links if x["scope"] == scope]
        med = statistics.median(mine)
        slowest = result.params["slowest_link"][scope]
        assert slowest["busbw_bytes_per_second"] == min(mine) and slowest["median_bytes_per_second"] == med
        for node in ("sim0", "sim1"):
            touching = [x["busbw_bytes_per_second"] for x in links
                        if x["scope"] == scope and node in (x["src_node"], x["dst_node"])]
            [low] = [m.value for m in result.measurements if m.name == "link_min_busbw_bytes_per_second"
                     and m.node == node and m.labels["scope"] == scope]
            [ratio] = [m.value for m in result.measurements if m.name == "link_min_ratio"
                       and m.node == node and m.labels["scope"] == scope]
            assert low == min(touching) and ratio == low / med


def test_the_default_config_judges_throughput_and_each_nodes_slowest_link() -> None:
    result = _result()
    run = RunInput(run_id="pipe-sim-2x2", probe="pipeline", nodes=tuple(result.nodes), outcome=result.outcome,
                   reason="", at=result.finished_at,
                   measurements=tuple(MeasurementInput(m.name, m.value, m.labels, m.node) for m in result.measurements))
    chosen = select(run, Settings().judge.series)
    judged = sorted((m.name, m.node or "", m.labels.get("scope", ""), d) for m, d in chosen)
    assert judged == sorted([
        ("throughput_samples_per_second", "", "", "higher"),
        *((name, node, scope, "higher") for name in ("link_min_busbw_bytes_per_second", "link_min_ratio")
          for node in ("sim0", "sim1") for scope in ("node", "group")),
    ])


def test_summary_exports_the_slowest_link_per_node_and_full_every_link(tmp_path: Path) -> None:
    result = _result()
    store = Store(tmp_path / "s.sqlite")
    store.upsert_nodes([Node("sim0", "idle", node_class="cpu"), Node("sim1", "idle", node_class="cpu")], 1.0)
    store.add_run(run_id="pipe-sim-2x2", probe="pipeline", nodes=["sim0", "sim1"], backend="slurm", job_id="7",
                  submitted_at=result.started_at, result_path=None)
    store.finish_run("pipe-sim-2x2", outcome=Outcome.PASS, reason="", finished_at=result.finished_at, result=result)
    summary, full = scrape(store, "summary"), scrape(store, "full")
    for node in ("sim0", "sim1"):
        pipeline = [line for line in node_series(summary, node) if line.startswith("healthd_pipeline_")]
        assert sorted(line.split("{")[0] for line in pipeline) == [
            "healthd_pipeline_link_min_busbw_bytes_per_second", "healthd_pipeline_link_min_ratio"]
        assert all('scope="group"' in line for line in pipeline)  # the inter-node link first
        [ratio] = [m.value for m in result.measurements if m.name == "link_min_ratio" and m.node == node
                   and m.labels["scope"] == "group"]
        assert lookup(summary)("healthd_pipeline_link_min_ratio",
                               {"node": node, "scope": "group", "size_bytes": "1048576"}) == ratio
        per_link = [line for line in node_series(full, node) if line.startswith("healthd_pipeline_link_busbw")]
        assert len(per_link) == 4  # the links this node sends on: next and prev of its two ranks
        assert all('direction="' in line and 'gpu_uuid=""' in line for line in per_link)


def test_a_configured_pipeline_probe_is_planned_on_an_idle_node_pair_with_its_local_ranks(tmp_path: Path) -> None:
    from healthd.cluster.local import probe_argv
    from healthd.config import load_settings
    from healthd.planning import PlanLimits, plan

    config = tmp_path / "healthd.toml"
    config.write_text("[probes.pipeline]\nenabled = true\n")
    settings, _ = load_settings(config)
    probes = {"pipeline": settings.probes["pipeline"]}
    nodes = [Node(n, "idle", gpus=8, gpu_type="h100", node_class="h100x8") for n in ("a", "b", "c")]
    jobs = plan(nodes, probes=probes, last_attempts={}, busy_nodes=(), in_flight=0, now=1000.0,
                limits=PlanLimits(), make_run_id=lambda: "r1", combine=True)
    assert [(j.probe, j.nodes, j.timeout_s) for j in jobs] == [("pipeline", ("a", "b"), 300.0)]
    assert jobs[0].bundle == ()  # a multi-node probe never joins a one-node check
    argv = probe_argv("python", jobs[0], tmp_path / "r1.json", ranks=2)
    assert argv[argv.index("--nproc") + 1] == "2" and argv[argv.index("--expect-gpus") + 1] == "8"
    later = plan(nodes, probes=probes, last_attempts={(n.name, "pipeline"): 1000.0 for n in nodes}, busy_nodes=(),
                 in_flight=0, now=1000.0 + 3600, limits=PlanLimits(), combine=True)
    assert later == []  # its own interval: six hours


def test_a_finding_on_a_nodes_slowest_link_names_the_link_with_both_ends() -> None:
    from healthd.config import JudgeSettings
    from healthd.judge.engine import Judge
    from healthd.judge.persist import slowest_links

    assert slowest_links(_result().params)[("sim0", "node")].startswith("rank ")
    names = [f"p{i}" for i in range(8)]
    judge = Judge(JudgeSettings())
    nodes = [Node(n, "idle", gpus=2, gpu_type="h100", node_class="h100x2") for n in names]
    t, k = 1000.0, 0

    def run(a: str, b: str, ratio_a: float = 0.9, *, link: str = "") -> RunInput:
        nonlocal k
        k += 1
        labels = {"scope": "group", "size_bytes": "1048576"}
        ms = tuple(MeasurementInput(name, value * (1 + 0.003 * ((k + i) % 3)), labels, node)
                   for i, node in enumerate((a, b))
                   for name, value in (("link_min_ratio", ratio_a if node == a else 0.9),
                                       ("link_min_busbw_bytes_per_second", 20e9 * (ratio_a if node == a else 0.9))))
        ms += (MeasurementInput("throughput_samples_per_second", 400.0, {}, None),)
        return RunInput(f"{k:016x}", "pipeline", (a, b), Outcome.PASS, "", t, ms,
                        links={(a, "group"): link} if link else {})

    for _ in range(4):
        judge.evaluate([run(names[i], names[i + 1]) for i in range(0, 8, 2)], nodes, now=t)
        t += 900
    text = "rank 1 (p2 gpu 1) -> rank 2 (p3 gpu 0): 0.9 GB/s, 0.05 x the median 18 GB/s of 4 inter-node links"
    out = judge.evaluate([run("p2", "p3", 0.05, link=text)], nodes, now=t)
    [verdict] = [v for v in out.verdicts if v.node == "p2"]
    assert verdict.outcome is Outcome.DEGRADED and f"the slowest link: {text}" in verdict.reason, verdict


def test_a_gpu_slower_than_its_stage_on_the_other_replicas_is_a_finding_on_that_gpu() -> None:
    from healthd.config import JudgeSettings
    from healthd.judge.engine import Judge

    names = [f"p{i}" for i in range(8)]
    judge = Judge(JudgeSettings())
    nodes = [Node(n, "idle", gpus=2, gpu_type="h100", node_class="h100x2") for n in names]
    t, k = 1000.0, 0

    def run(a: str, b: str, slow: float = 1.0) -> RunInput:
        nonlocal k
        k += 1
        ms = tuple(MeasurementInput("stage_skew_ratio", (slow if (node, gpu) == ("p4", 1) else 1.0)
                                    * (1 + 0.004 * ((k + gpu) % 3 - 1)), {"gpu": str(gpu)}, node)
                   for node in (a, b) for gpu in (0, 1))
        ms += (MeasurementInput("throughput_samples_per_second", 400.0, {}, None),)
        uuids = {(node, str(gpu)): f"GPU-{node}-{gpu}" for node in (a, b) for gpu in (0, 1)}
        return RunInput(f"{k:016x}", "pipeline", (a, b), Outcome.PASS, "", t, ms, gpu_uuids=uuids)

    for _ in range(4):
        judge.evaluate([run(names[i], names[i + 1]) for i in range(0, 8, 2)], nodes, now=t)
        t += 900
    out = judge.evaluate([run("p4", "p5", 0.5)], nodes, now=t)
    [verdict] = [v for v in out.verdicts if v.node == "p4"]
    assert verdict.outcome is Outcome.DEGRADED and verdict.evidence["gpu"] == "1", verdict
    assert verdict.evidence["gpu_uuid"] == "GPU-p4-1" and "stage_skew_ratio" in verdict.reason, verdict
    assert not [v for v in out.verdicts if v.node == "p5" and v.outcome is not Outcome.PASS]
