"""Proof against reality: a real Prometheus server scrapes a real ``healthd run`` (local backend, real probes),
loads healthd's alert rules, and answers every dashboard query, every dashboard variable and every alert
expression through its HTTP API.

Each query must parse and return data, unless it is listed below with the reason it may be empty. Each alert
expression must return **nothing** on this healthy machine (no false positives), and every metric it
names must exist. Prometheus and healthd are stopped whatever happens.
"""

from __future__ import annotations

import calendar
import importlib.util
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from healthd.metrics import FULL_ONLY

pytestmark = [pytest.mark.slow, pytest.mark.promtool]

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "grafana" / "alerts" / "healthd.rules.yml"

# -- what may legitimately come back empty, and why (one place: shrink it as healthd grows) -------------------------
ALLOWED_EMPTY_METRICS: dict[str, str] = {
    **{f"healthd_baseline_{measurement}": "a baseline needs several passing runs of the node; this test sees one"
       for measurement in ("nccl_busbw_bytes_per_second", "gemm_flop_per_second",
                           "gemm_memory_bandwidth_bytes_per_second", "ddp_throughput_samples_per_second")},
    **{f"healthd_floor_{measurement}": "no floor is configured for the 'local' node class"
       for measurement in ("nccl_busbw_bytes_per_second", "gemm_flop_per_second",
                           "gemm_memory_bandwidth_bytes_per_second", "ddp_throughput_samples_per_second")},
    "healthd_fleet_event_active": "one healthy node has no fleet event",
    "healthd_switch_finding": "one healthy node under one leaf has no switch finding",
    "healthd_link_finding": "one node has no pair of nodes, so no link between two nodes to find slow",
    **{name: "a healthy machine has no confirmed finding (the e2e alert test makes one: test_alerts_e2e.py)"
       for name in ("healthd_node_finding", "healthd_node_finding_value", "healthd_node_finding_reference",
                    "healthd_node_finding_drop_ratio")},
    "healthd_node_passive_signal": "passive signals are off without [passive] prometheus_url, and a healthy node has "
                                   "none (test_passive_prometheus.py makes them)",
    "healthd_node_check_missed_total": "the local backend has no jobs, so no job end without a node check "
                                       "document (test_node_check_watch.py counts them)",
    "healthd_scaling_busbw_bytes_per_second": "the scaling sweep needs two or more nodes; this test has one",
    "healthd_drain_recommended": "no drain is recommended on a healthy machine (and no 0 rows with detail = summary)",
    "healthd_node_probe_baseline_ratio": "a baseline needs several passing runs of the node; this test sees one",
    "healthd_ddp_mfu_ratio": "the 'local' node class (a CPU) has no peak in healthd/judge/peaks.toml",
    **{name: "the compute probe is off by default (and its figures are full detail)"
       for name in ("healthd_compute_mlp_flop_per_second", "healthd_compute_embedding_bag_bytes_per_second",
                    "healthd_baseline_compute_mlp_flop_per_second",
                    "healthd_baseline_compute_embedding_bag_bytes_per_second",
                    "healthd_floor_compute_mlp_flop_per_second",
                    "healthd_floor_compute_embedding_bag_bytes_per_second")},
    **{name: 'exported with [metrics] detail = "full" only; this test runs the default, "summary"'
       for name in (*FULL_ONLY, "healthd_nccl_algbw_bytes_per_second", "healthd_nccl_time_seconds",
                    "healthd_gemm_memory_bandwidth_bytes_per_second", "healthd_ddp_step_seconds",
                    "healthd_ddp_scaling_efficiency_ratio", "healthd_ddp_single_rank_throughput_samples_per_second",
                    "healthd_env_visible_gpus", "healthd_ddp_model_flop_per_second",
                    "healthd_baseline_ddp_model_flop_per_second", "healthd_floor_ddp_model_flop_per_second")},
}
"""Metrics that may be absent from the scrape. A query that uses one may return nothing."""

NO_DRAIN = "no drain is recommended on a healthy machine"
ALLOWED_EMPTY_QUERIES: dict[str, str] = {
    "healthd-fleet/Nodes not passing/A": "every probe passes on a healthy machine",
    "healthd-fleet/Nodes not passing, by leaf switch/A": "every probe passes on a healthy machine",
    "healthd-fleet/Drain recommendations/A": NO_DRAIN,
    "healthd-node/Drain recommendation/A": NO_DRAIN,
}
"""Panel queries (dashboard uid/panel title/refId) that may return nothing even when all their metrics exist."""

FIRING_ON_A_HEALTHY_MACHINE: dict[str, str] = {}
"""Alerts whose expression may return series on this machine (none: a healthy local daemon must be silent)."""

GRAFANA_INTERVALS = {"__rate_interval": "1m", "__interval": "15s", "__range": "1h"}
PROBES = ("env", "gemm", "nccl", "ddp")
MEASUREMENTS = ("healthd_gemm_flop_per_second", "healthd_nccl_busbw_bytes_per_second",
                "healthd_ddp_throughput_samples_per_second")


def load_queries_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("healthd_grafana_queries", ROOT / "grafana" / "queries.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


queries = load_queries_module()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def http_get(url: str, timeout: float = 10.0) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


class Proc:
    """A subprocess in its own session, stopped (SIGTERM, then SIGKILL to the group) by ``stop``."""

    def __init__(self, argv: list[str], log_path: Path, cwd: Path | None = None) -> None:
        self.log_path = log_path
        self._log = log_path.open("ab")
        self.proc = subprocess.Popen(argv, stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     start_new_session=True, cwd=cwd)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def tail(self, chars: int = 4000) -> str:
        return self.log_path.read_text(errors="replace")[-chars:]

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=15)
        self._log.close()


@dataclass
class Prometheus:
    base: str

    def api(self, path: str, **params: str) -> Any:
        status, body = http_get(f"{self.base}{path}?{urllib.parse.urlencode(params)}")
        doc = json.loads(body)
        assert status == 200 and doc["status"] == "success", f"{path} {params}: {status} {body[:2000]}"
        return doc["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        data = self.api("/api/v1/query", query=expr)
        if data["resultType"] == "scalar":
            return [{"value": data["result"]}]
        return list(data["result"])

    def label_values(self, label: str, selector: str) -> list[str]:
        return list(self.api(f"/api/v1/label/{label}/values", **{"match[]": selector,
                                                                 "start": str(time.time() - 3600)}))


def wait_until(what: str, check: Callable[[], bool], timeout: float, alive: list[Proc]) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        for p in alive:
            assert p.alive(), f"{p.log_path.name} exited:\n{p.tail()}"
        try:
            if check():
                return
        except (OSError, AssertionError, json.JSONDecodeError):
            pass
        time.sleep(1.0)
    raise AssertionError(f"timed out waiting for {what}:\n" + "\n".join(f"{p.log_path.name}:\n{p.tail()}"
                                                                      for p in alive))


def healthd_config(tmp_path: Path, port: int) -> Path:
    probes = "\n".join(f"[probes.{name}]\ninterval_s = 3600\ntimeout_s = 180\n" for name in PROBES)
    topology = tmp_path / "topology.conf"  # the fleet dashboard groups nodes by leaf switch
    topology.write_text("SwitchName=leaf1 Nodes=testnode\nSwitchName=spine1 Switches=leaf1\n")
    config = tmp_path / "healthd.toml"
    config.write_text(f"""
backend = "local"
state_dir = "{tmp_path / 'state'}"
[http]
host = "127.0.0.1"
port = {port}
[scheduler]
discover_interval_s = 2
plan_interval_s = 1
collect_interval_s = 0.5
[local]
node_name = "testnode"
python = "{sys.executable}"
ranks = 2
[topology]
source = "file"
file = "{topology}"
{probes}
[logging]
format = "json"
""")
    return config


def prometheus_config(tmp_path: Path, healthd_port: int) -> Path:
    config = tmp_path / "prometheus.yml"
    config.write_text(f"""
global:
  scrape_interval: 1s
  scrape_timeout: 1s
  evaluation_interval: 1s
rule_files:
  - {RULES}
scrape_configs:
  - job_name: healthd
    static_configs:
      - targets: ["127.0.0.1:{healthd_port}"]
""")
    return config


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[tuple[Prometheus, int, list[Proc]]]:
    prometheus, promtool = shutil.which("prometheus"), shutil.which("promtool")
    if prometheus is None or promtool is None:
        pytest.skip("prometheus/promtool not installed (Debian package 'prometheus'); scripts/test.sh installs it")
    started: list[Proc] = []
    try:
        healthd_port, prom_port = free_port(), free_port()
        started.append(Proc([sys.executable, "-m", "healthd.cli", "run", "--config",
                             str(healthd_config(tmp_path, healthd_port))], tmp_path / "healthd.log", cwd=ROOT))
        started.append(Proc([prometheus, f"--config.file={prometheus_config(tmp_path, healthd_port)}",
                             f"--storage.tsdb.path={tmp_path / 'tsdb'}", f"--web.listen-address=127.0.0.1:{prom_port}",
                             "--storage.tsdb.retention.time=1d", "--log.level=warn"],
                            tmp_path / "prometheus.log", cwd=tmp_path))
        yield Prometheus(f"http://127.0.0.1:{prom_port}"), healthd_port, started
    finally:
        for p in reversed(started):
            p.stop()
        for p in started:
            assert not p.alive()


def resolve_variables(prom: Prometheus, doc: dict[str, Any]) -> tuple[dict[str, str], list[str]]:
    """Each query variable's value as Grafana picks it by default: "All" where offered, else the first value."""
    values = dict(GRAFANA_INTERVALS, datasource="prometheus")
    empty = []
    for var in queries.query_variables(doc):
        selector = queries.substitute(var.selector, values)
        found = prom.label_values(var.label, selector)
        if not found:
            pending = queries.metric_names(selector) & ALLOWED_EMPTY_METRICS.keys()
            assert pending, f"{doc['uid']}: variable ${var.name} has no values for {selector}"
            empty.append(f"${var.name}")
        if var.include_all:
            values[var.name] = var.all_value or "|".join(found)
        elif found:
            values[var.name] = max(found, key=float) if var.numeric_desc else sorted(found)[0]
        else:
            values[var.name] = "none"
    return values, empty


def test_dashboards_and_alerts_against_a_real_prometheus(stack: tuple[Prometheus, int, list[Proc]]) -> None:
    prom, healthd_port, procs = stack
    promtool = shutil.which("promtool")
    assert promtool is not None

    def all_measured() -> bool:
        text = http_get(f"http://127.0.0.1:{healthd_port}/metrics")[1]
        return all(f"{m}{{" in text for m in MEASUREMENTS)

    wait_until("healthd to measure every probe", all_measured, timeout=300, alive=procs)
    wait_until("Prometheus to scrape the measurements",
               lambda: all(prom.query(f"count_over_time({m}[1m]) >= 3") for m in MEASUREMENTS),
               timeout=60, alive=procs)
    data_at = time.time()

    def rules_evaluated() -> bool:
        groups = prom.api("/api/v1/rules")["groups"]
        return all(calendar.timegm(time.strptime(r["lastEvaluation"][:19], "%Y-%m-%dT%H:%M:%S")) > data_at
                   for g in groups for r in g["rules"])

    wait_until("Prometheus to evaluate every rule on the data", rules_evaluated, timeout=60, alive=procs)

    # promtool on what healthd really serves, and on the rule file Prometheus loaded.
    scrape = http_get(f"http://127.0.0.1:{healthd_port}/metrics")[1]
    lint = subprocess.run([promtool, "check", "metrics"], input=scrape, capture_output=True, text=True, timeout=30,
                          check=False)
    assert lint.returncode == 0, lint.stdout + lint.stderr
    check = subprocess.run([promtool, "check", "rules", "--lint-fatal", str(RULES)], capture_output=True, text=True,
                           timeout=30, check=False)
    assert check.returncode == 0, check.stdout + check.stderr
    series_in_scrape = sum(1 for line in scrape.splitlines() if line and not line.startswith("#"))
    stored = int(float(prom.query('count({job="healthd"})')[0]["value"][1]))

    exported = {r["metric"]["__name__"] for r in prom.query('count by (__name__) ({job="healthd"})')}
    stale_allowances = sorted(exported & ALLOWED_EMPTY_METRICS.keys())
    assert not stale_allowances, f"now exported, remove from ALLOWED_EMPTY_METRICS: {stale_allowances}"

    def missing_metrics(expr: str) -> set[str]:
        return {m for m in queries.metric_names(expr) if m not in exported}

    # Every dashboard variable and panel query.
    panels = checked = 0
    empty: dict[str, str] = {}
    for name, doc in queries.dashboards().items():
        values, empty_vars = resolve_variables(prom, doc)
        checked += len(queries.query_variables(doc))
        for var in empty_vars:
            empty[f"{doc['uid']}/{var}"] = "its metric may be absent (ALLOWED_EMPTY_METRICS)"
        panels += sum(1 for p in queries.panels(doc) if p["type"] != "row")
        for q in queries.panel_queries(doc):
            expr = queries.substitute(q.expr, values)
            result = prom.query(expr)
            checked += 1
            missing = missing_metrics(expr)
            assert missing <= ALLOWED_EMPTY_METRICS.keys(), f"{name} {q.key}: no such series {missing}: {expr}"
            if result:
                continue
            reason = ALLOWED_EMPTY_QUERIES.get(q.key) or "; ".join(sorted({ALLOWED_EMPTY_METRICS[m] for m in missing}))
            assert reason, f"{name} {q.key} returned no data: {expr}"
            empty[q.key] = reason

    # Every alert: Prometheus loaded and evaluated it without error; its expression runs, names real metrics and
    # stays silent on a healthy machine.
    rules = [r for g in prom.api("/api/v1/rules")["groups"] for r in g["rules"]]
    assert len(rules) == len(re.findall(r"^\s+- alert: ", RULES.read_text(), re.MULTILINE)) == 25
    for rule in rules:
        assert rule["type"] == "alerting" and rule["health"] == "ok", rule
        assert rule["labels"]["severity"] in {"critical", "warning", "info"}
        assert {"summary", "description", "runbook_url"} <= rule["annotations"].keys(), rule["name"]
        result = prom.query(rule["query"])
        checked += 1
        missing = missing_metrics(rule["query"]) - {"up"}
        assert missing <= ALLOWED_EMPTY_METRICS.keys(), f"{rule['name']}: no such series {missing}"
        if rule["name"] not in FIRING_ON_A_HEALTHY_MACHINE:
            assert result == [], f"{rule['name']} fires on a healthy machine: {result}"
            assert rule["state"] == "inactive", rule
    assert prom.query('up{job="healthd"} == 1'), "the rules' HealthdDown selector matches the scrape job"

    print(f"\nseries in one healthd scrape: {series_in_scrape} (Prometheus holds {stored}); metric names: "
          f"{len(exported)}; panels: {panels}; queries run: {checked} "
          f"(panel targets, variables, {len(rules)} alert expressions); empty with a reason: {len(empty)}")
    for key, reason in sorted(empty.items()):
        print(f"  empty: {key}: {reason}")
