"""``healthd doctor``: the interpreting functions of ``healthd.doctor`` on Prometheus's answers and the
store's nodes, and the command on a real store (local backend, no Prometheus: its checks are skipped and
said). The scrape and rule checks against a real Prometheus: tests/integration/test_doctor_prometheus.py."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from healthd.cli import main
from healthd.doctor import (
    Check,
    boundary_check,
    format_report,
    missed_check,
    report,
    rules_check,
    scrape_check,
    shipped_alerts,
)
from healthd.model import Node, Outcome, RunKind
from healthd.resources import data_root
from healthd.store import Store

URL = "http://prom:9090"
ALERTS = shipped_alerts(data_root())


def test_the_shipped_rules_are_read() -> None:
    assert {"HealthdDown", "HealthdNodeCheckSilent", "HealthdDrainRecommended"} <= ALERTS and len(ALERTS) > 15


def test_scrape_check() -> None:
    none = scrape_check([], URL, 9469)
    assert none.status == "fix" and "does not scrape healthd" in none.found and "job_name: healthd" in none.do
    assert ":9469" in none.do
    wrong = scrape_check([{"job": "exporters", "instance": "admin:9469"}], URL, 9469)
    assert wrong.status == "fix" and "as job exporters (exporters/admin:9469)" in wrong.found
    assert 'select job="healthd"' in wrong.do
    ok = scrape_check([{"job": "healthd", "instance": "admin:9469"}], URL, 9469)
    assert ok == Check("prometheus scrape", "ok", f"{URL} scrapes healthd: healthd/admin:9469")


def rule_groups(names: list[str]) -> list[dict[str, object]]:
    return [{"name": "healthd", "rules": [{"type": "alerting", "name": n} for n in names]},
            {"name": "other", "rules": [{"type": "recording", "name": "HealthdDown"}]}]


def test_rules_check() -> None:
    none = rules_check(rule_groups([]), ALERTS, URL)
    assert none.status == "fix" and f"none of healthd's {len(ALERTS)} alert rules" in none.found
    assert "rule_files: [/usr/share/healthd/alerts/healthd.rules.yml]" in none.do
    partial = rules_check(rule_groups(sorted(ALERTS - {"HealthdNodeCheckSilent"})), ALERTS, URL)
    assert partial.status == "fix"
    assert partial.found.endswith("lacks 1 of healthd's alert rules: HealthdNodeCheckSilent")
    assert partial.do.startswith("update the rule file from this healthd's")
    assert rules_check(rule_groups(sorted(ALERTS)), ALERTS, URL).status == "ok"


def test_missed_check() -> None:
    assert missed_check([], URL).status == "ok"
    found = missed_check([{"metric": {"node": "n2"}, "value": [0, "3"]},
                          {"metric": {"node": "n1"}, "value": [0, "1.02"]}], URL)
    assert found.status == "fix" and found.found.endswith("in the last day: n1 (1), n2 (3)")
    assert "journalctl -t healthd-node-check" in found.do


def test_boundary_check() -> None:
    results = Path("/shared/healthd/results")
    assert boundary_check([], set(), results).status == "skipped"
    silent = boundary_check(["n1", "n2"], set(), results)
    assert silent.status == "fix" and "none of the 2 nodes" in silent.found
    assert "journalctl -t healthd-node-check" in silent.do and str(results) in silent.do
    some = boundary_check([f"n{i:02d}" for i in range(13)], {"n00"}, results)
    assert some.found == ("12 of 13 nodes left no boundary document: n01, n02, n03, n04, n05, n06, n07, n08, "
                          "n09, n10 and 2 more")
    assert boundary_check(["n1"], {"n1"}, results).status == "ok"


def test_report_fails_only_on_something_to_fix() -> None:
    checks = [Check("a", "ok", "fine"), Check("b", "skipped", "not here", "how to")]
    assert report(checks)["ok"] is True
    assert format_report(checks).splitlines() == ["[ ok] a: fine", "[ --] b: not here", "      to check: how to",
                                                  "all good"]
    checks.append(Check("c", "fix", "broken", "step one\nstep two"))
    assert report(checks)["ok"] is False
    assert format_report(checks).splitlines()[-3:] == ["      do: step one", "      do: step two",
                                                        "1 thing(s) to fix"]


def test_doctor_on_a_store(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "healthd.toml"
    config.write_text(f'backend = "local"\nstate_dir = "{tmp_path / "state"}"\n')
    assert main(["doctor", "--config", str(config)]) == 1
    assert "no state store at" in capsys.readouterr().out
    store = Store(tmp_path / "state" / "healthd.sqlite")
    now = time.time()
    store.upsert_nodes([Node("n1", "idle"), Node("n2", "idle")], seen_at=now)
    store.add_run(run_id="boundary-n1-epilog-7-1", probe="boundary", nodes=("n1",), backend="boundary", job_id=None,
                  submitted_at=now, result_path=None, source="boundary", kind=RunKind.BOUNDARY)
    store.finish_run("boundary-n1-epilog-7-1", outcome=Outcome.PASS, reason="", finished_at=now)
    store.close()
    assert main(["doctor", "--config", str(config), "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    by_name = {c["name"]: c for c in doc["checks"]}
    assert by_name["store"]["status"] == "ok"
    assert str(tmp_path / "state" / "healthd.sqlite") in by_name["store"]["found"]
    assert by_name["slurm"]["status"] == "skipped" and by_name["prometheus"]["status"] == "skipped"
    assert by_name["node check"] == {"name": "node check", "status": "fix", "do": by_name["node check"]["do"],
                                     "found": "1 of 2 nodes left no boundary document: n2"}
    assert doc["ok"] is False
