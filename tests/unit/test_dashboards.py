"""The Grafana dashboards: the committed JSON is what grafana/generate.py produces, it is structurally sound for
file provisioning (every panel on the ``${datasource}`` variable, unique ids, a 24-column grid), every query
parses (promtool), and every metric it uses is in the catalogue (docs/metrics.md), which in turn covers every
family a real scrape exports."""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from healthd.metrics import DaemonMetrics, render_text
from healthd.model import Node, Outcome, Verdict
from healthd.parsers.healthd_json import parse_result
from healthd.store import Store
from tests.unit.test_metrics import lookup

ROOT = Path(__file__).resolve().parents[2]
GRAFANA = ROOT / "grafana"
CATALOGUE = ROOT / "docs" / "metrics.md"
PROBE_RESULTS = ROOT / "tests" / "fixtures" / "promtool" / "probe_results"
DS_REF = {"type": "prometheus", "uid": "${datasource}"}


def load_module(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"healthd_grafana_{name}", GRAFANA / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


queries = load_module("queries")
DASHBOARDS: dict[str, dict[str, Any]] = queries.dashboards()


def catalogue() -> set[str]:
    return set(re.findall(r"`(healthd_[a-z0-9_]+)`", CATALOGUE.read_text()))


def catalogued(name: str, names: set[str]) -> bool:
    """A documented name, or a baseline/floor of a documented measurement (same labels, same unit)."""
    for prefix in ("healthd_baseline_", "healthd_floor_"):
        if name.startswith(prefix):
            return "healthd_" + name.removeprefix(prefix) in names
    return name in names


def test_committed_json_is_what_the_generator_writes() -> None:
    generate = load_module("generate")
    assert set(generate.DASHBOARDS) == set(DASHBOARDS) == {
        "healthd-fleet.json", "healthd-node.json", "healthd-probes.json"}
    for name, build in generate.DASHBOARDS.items():
        assert generate.render(build) == (GRAFANA / "dashboards" / name).read_text(), (
            f"{name} is stale: run python grafana/generate.py")


def test_generator_check_mode_notices_a_stale_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    generate = load_module("generate")
    for name in DASHBOARDS:
        (tmp_path / name).write_text((GRAFANA / "dashboards" / name).read_text())
    monkeypatch.setattr(generate, "OUT_DIR", tmp_path)
    assert generate.main(["--check"]) == 0
    (tmp_path / "healthd-node.json").write_text("{}\n")
    assert generate.main(["--check"]) == 1
    assert generate.main([]) == 0
    assert generate.main(["--check"]) == 0


@pytest.mark.parametrize("name", sorted(DASHBOARDS))
def test_dashboard_model(name: str) -> None:
    doc = DASHBOARDS[name]
    text = (GRAFANA / "dashboards" / name).read_text()
    assert doc["schemaVersion"] == 41, "the Grafana 11.6 schema (grafana-foundation-sdk 1769699379!11.6.0)"
    assert 8 <= len(doc["uid"]) <= 40 and doc["uid"] == name.removesuffix(".json")
    assert doc["title"].startswith("healthd / ") and "healthd" in doc["tags"]
    assert "__inputs" not in doc and "${DS_" not in text, "import-time inputs break file provisioning"

    variables = doc["templating"]["list"]
    assert variables[0] == {**variables[0], "name": "datasource", "type": "datasource", "query": "prometheus"}
    for var in variables[1:]:
        assert var["type"] == "query" and var["datasource"] == DS_REF, var["name"]

    ids = [p["id"] for p in queries.panels(doc)]
    assert len(ids) == len(set(ids)) and all(isinstance(i, int) and i > 0 for i in ids)
    occupied: set[tuple[int, int]] = set()
    for panel in queries.panels(doc):
        pos = panel["gridPos"]
        assert pos["x"] >= 0 and pos["w"] > 0 and pos["x"] + pos["w"] <= 24 and pos["h"] > 0, panel["title"]
        cells = {(x, y) for x in range(pos["x"], pos["x"] + pos["w"]) for y in range(pos["y"], pos["y"] + pos["h"])}
        assert not cells & occupied, f"{panel['title']} overlaps another panel"
        occupied |= cells
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == DS_REF, panel["title"]
        assert panel["title"] and panel["description"], panel["id"]
        targets = panel["targets"]
        assert targets, panel["title"]
        refs = [t["refId"] for t in targets]
        assert all(refs) and len(refs) == len(set(refs)), panel["title"]
        for t in targets:
            assert t["expr"].strip() and t["datasource"] == DS_REF, panel["title"]
            assert "instance=~\"$instance\"" in t["expr"], f"{panel['title']}: every query selects $instance"


@pytest.mark.parametrize("name", sorted(DASHBOARDS))
def test_variables_are_defined_and_used(name: str) -> None:
    doc = DASHBOARDS[name]
    defined = queries.variable_names(doc)
    texts = [q.expr for q in queries.panel_queries(doc)] + [v.selector for v in queries.query_variables(doc)]
    used = set().union(*(queries.referenced_variables(t) for t in texts))
    assert used - defined - queries.GRAFANA_BUILTINS == set()
    assert defined - used == {"datasource"}, "every variable but the data source appears in a query"


def substitution(doc: dict[str, Any]) -> dict[str, str]:
    values = {"__rate_interval": "1m", "__interval": "15s", "__range": "1h", "datasource": "prometheus"}
    for var in queries.query_variables(doc):
        values[var.name] = var.all_value if var.include_all else "placeholder"
    return values


def all_expressions() -> list[tuple[str, str]]:
    out = []
    for doc in DASHBOARDS.values():
        values = substitution(doc)
        out += [(q.key, queries.substitute(q.expr, values)) for q in queries.panel_queries(doc)]
        out += [(f"{doc['uid']}/${v.name}", queries.substitute(v.selector, values))
                for v in queries.query_variables(doc)]
    return out


def test_the_dashboards_have_the_panels_the_issue_asks_for() -> None:
    titles = {doc["uid"]: {p["title"] for p in queries.panels(doc)} for doc in DASHBOARDS.values()}
    assert {"Nodes by verdict, per probe", "Drain recommendations", "Oldest result per probe",
            "NCCL bus bandwidth distribution", "GEMM FLOP/s distribution", "Slowest NCCL nodes vs their class",
            "Fleet events"} <= titles["healthd-fleet"]
    assert {"NCCL bus bandwidth vs baseline and floor", "GEMM FLOP/s vs baseline and floor",
            "DDP throughput vs baseline and floor", "Verdict per probe", "Drain recommended"} <= titles["healthd-node"]
    assert {"Probe runs per hour by outcome", "Probe error ratio", "Daemon errors by kind",
            "Queue wait of the last runs", "GPU-seconds per hour", "Scheduler ticks",
            "Slurm reachable"} <= titles["healthd-probes"]
    reference = [p for p in queries.panels(DASHBOARDS["healthd-node.json"]) if "baseline and floor" in p["title"]]
    for panel in reference:
        exprs = {t["refId"]: t["expr"] for t in panel["targets"]}
        measured = queries.metric_names(exprs["A"]).pop()
        assert queries.metric_names(exprs["B"]) == {measured.replace("healthd_", "healthd_baseline_", 1)}
        assert queries.metric_names(exprs["C"]) == {measured.replace("healthd_", "healthd_floor_", 1)}


def test_every_metric_a_dashboard_uses_is_catalogued() -> None:
    names = catalogue()
    used = set().union(*(queries.metric_names(expr) for _, expr in all_expressions()))
    assert len(used) > 25
    assert {n for n in used if not catalogued(n, names)} == set()


@pytest.mark.promtool
def test_every_dashboard_query_parses(tmp_path: Path) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed (Debian package 'prometheus'); scripts/test.sh installs it")
    exprs = all_expressions()
    lines = ["groups:", "  - name: dashboard-queries", "    rules:"]
    for number, (_, expr) in enumerate(exprs):
        lines += [f"      - record: dashboard:query_{number}", f"        expr: {json.dumps(expr)}"]
    path = tmp_path / "dashboard-queries.yml"
    path.write_text("\n".join(lines) + "\n")
    done = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=60,
                          check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(exprs)} rules found" in done.stdout

    path.write_text("\n".join([*lines[:3], "      - record: dashboard:broken", '        expr: "sum(rate(x[1m])"']))
    broken = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=60,
                            check=False)
    assert broken.returncode == 1 and "unclosed left parenthesis" in broken.stdout + broken.stderr


def test_provisioning_files() -> None:
    datasource = (GRAFANA / "provisioning" / "datasources" / "prometheus.yml").read_text()
    assert re.search(r"^apiVersion: 1$", datasource, re.MULTILINE)
    assert re.search(r"^\s+type: prometheus$", datasource, re.MULTILINE)
    assert re.search(r"^\s+uid: \S+$", datasource, re.MULTILINE)
    provider = (GRAFANA / "provisioning" / "dashboards" / "healthd.yml").read_text()
    assert re.search(r"^apiVersion: 1$", provider, re.MULTILINE)
    assert re.search(r"^\s+type: file$", provider, re.MULTILINE)
    assert re.search(r"^\s+path: /\S+$", provider, re.MULTILINE)
    for doc in DASHBOARDS.values():
        assert "DS_" not in json.dumps(doc)


# -- the catalogue against a scrape of real probe results -----------------------------------------------------------

@pytest.fixture
def scrape(tmp_path: Path) -> str:
    store = Store(tmp_path / "s.sqlite")
    store.upsert_nodes([Node("vm", "idle", gpus=0, node_class="local")], 1.0)
    for path in sorted(PROBE_RESULTS.glob("*.json")):
        result = parse_result(path.read_text())
        store.record_result(result, nodes=["vm"], backend="local", source="test", result_path=None)
        store.put_verdicts([Verdict("vm", result.probe, Outcome.PASS, reason_code="ok", at=result.finished_at)])
    registry = CollectorRegistry()
    DaemonMetrics(registry)
    return render_text(store, "local", "full", registry)


def families(text: str) -> set[str]:
    names = {line.split(" ")[2] for line in text.splitlines() if line.startswith("# TYPE ")}
    return {n for n in names if not (n.endswith("_created") and n.removesuffix("_created") + "_total" in names)}


def test_catalogue_documents_every_exported_family(scrape: str) -> None:
    exported = families(scrape)
    assert {"healthd_gemm_flop_per_second", "healthd_nccl_busbw_bytes_per_second",
            "healthd_ddp_throughput_samples_per_second", "healthd_env_visible_gpus",
            "healthd_node_probe_last_gpu_seconds"} <= exported
    assert exported - catalogue() == set()


def test_new_cost_families_carry_the_stored_values(scrape: str) -> None:
    results = {p.stem: json.loads(p.read_text()) for p in PROBE_RESULTS.glob("*.json")}
    for probe, doc in results.items():
        duration = doc["finished_at"] - doc["started_at"]
        line = f'healthd_node_probe_last_duration_seconds{{node="vm",probe="{probe}"}} '
        value = float(next(x for x in scrape.splitlines() if x.startswith(line)).split(" ")[1])
        assert value == pytest.approx(duration, rel=1e-9)
        assert f'healthd_node_probe_last_queue_wait_seconds{{node="vm",probe="{probe}"}} 0.0' in scrape
        assert f'healthd_node_probe_last_gpu_seconds{{node="vm",probe="{probe}"}} 0.0' in scrape
    assert 'healthd_node_gpus{node="vm"} 0.0' in scrape
    assert 'healthd_scheduler_missed_runs_total{task="housekeeping"} 0.0' in scrape
    assert "exported_job" not in scrape and 'job="' not in scrape


def test_queue_wait_duration_and_gpu_seconds_of_the_newest_run(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.sqlite")
    store.upsert_nodes([Node("g1", "idle", gpus=8, node_class="h100x8"), Node("g2", "idle", gpus=4)], 1.0)
    for run_id, nodes, submitted, started, finished in [("old", ("g1",), 10.0, 12.0, 20.0),
                                                        ("new", ("g1", "g2"), 100.0, 130.0, 190.0)]:
        store.add_run(run_id=run_id, probe="nccl", nodes=nodes, backend="slurm", job_id="7", submitted_at=submitted,
                      result_path=None)
        store.mark_running(run_id, started)
        store.finish_run(run_id, outcome=Outcome.PASS, reason="", finished_at=finished)
    v = lookup(render_text(store, "slurm", "full"))
    for node, gpus in (("g1", 8), ("g2", 4)):
        labels = {"node": node, "probe": "nccl"}
        assert v("healthd_node_probe_last_queue_wait_seconds", labels) == 30.0
        assert v("healthd_node_probe_last_duration_seconds", labels) == 60.0
        assert v("healthd_node_probe_last_gpu_seconds", labels) == 60.0 * gpus
        assert v("healthd_node_gpus", {"node": node}) == gpus


@pytest.mark.promtool
def test_promtool_accepts_a_scrape_of_real_probe_results(scrape: str) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed (Debian package 'prometheus'); scripts/test.sh installs it")
    done = subprocess.run([promtool, "check", "metrics"], input=scrape, capture_output=True, text=True,
                          timeout=30, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
