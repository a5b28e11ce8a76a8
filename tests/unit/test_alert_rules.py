"""The Prometheus alert rules: promtool accepts them, their promtool unit tests pass, and every alert follows
the monitoring-mixins conventions, has a runbook section, a case that fires and a case that must not."""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "grafana" / "alerts" / "healthd.rules.yml"
RULE_TESTS = ROOT / "tests" / "fixtures" / "promtool" / "healthd.rules.test.yml"
RUNBOOKS = ROOT / "docs" / "alerts.md"
CATALOGUE = ROOT / "docs" / "metrics.md"


@dataclass(frozen=True)
class Rule:
    alert: str
    body: str

    def field(self, name: str) -> str | None:
        found = re.search(rf"^\s+{name}: (.+)$", self.body, re.MULTILINE)
        return found.group(1).strip() if found else None


def rules() -> list[Rule]:
    """The alerts of the rule file, split on ``- alert:`` (the file's own layout; no YAML library needed)."""
    text = RULES.read_text()
    starts = [m for m in re.finditer(r"^\s+- alert: (\S+)$", text, re.MULTILINE)]
    return [
        Rule(m.group(1), text[m.end(): starts[i + 1].start() if i + 1 < len(starts) else len(text)])
        for i, m in enumerate(starts)
    ]


def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        pytest.skip("promtool not installed (Debian package 'prometheus'); scripts/test.sh installs it")
    return path


def test_the_rule_file_holds_the_alerts_the_issue_asks_for() -> None:
    names = [r.alert for r in rules()]
    assert len(names) == len(set(names)) == 25
    assert set(names) == {
        "HealthdNcclBandwidthBelowFloor", "HealthdNcclBandwidthDegraded", "HealthdGemmBelowFloor",
        "HealthdGemmDegraded", "HealthdDdpThroughputBelowFloor", "HealthdDdpThroughputDegraded",
        "HealthdNodeFailingProbes", "HealthdNodeNotProbed", "HealthdDrainRecommended", "HealthdFleetDegraded",
        "HealthdRemediationBreakerOpen", "HealthdProbeErrorRateHigh", "HealthdDown", "HealthdNotTicking",
        "HealthdSchedulerTickErrors", "HealthdSlurmUnreachable", "HealthdScalingBandwidthDropped",
        "HealthdSwitchDegraded", "HealthdGpuPassiveFault", "HealthdLinkDegraded", "HealthdNodeCheckSilent",
        "HealthdNodeCheckMissed", "HealthdInfinibandPortDegraded", "HealthdGpuPassiveDegraded", "HealthdNoLeader",
    }


@pytest.mark.parametrize("rule", rules(), ids=lambda r: r.alert)
def test_alert_follows_the_mixin_conventions(rule: Rule) -> None:
    assert re.fullmatch(r"Healthd(?:[A-Z][a-z0-9]+)+", rule.alert), "CamelCase with the Healthd prefix"
    assert rule.field("severity") in {"critical", "warning", "info"}
    summary = rule.field("summary")
    assert summary and summary.endswith(".") and "{{" not in summary, "a static sentence ending with a period"
    assert re.search(r"^\s+description: >-\n\s+\S", rule.body, re.MULTILINE), "a templated description"
    assert rule.field("runbook_url") == f"docs/alerts.md#{rule.alert.lower()}"
    assert rule.field("for") is not None, "every alert waits before firing"


def test_only_fleet_and_daemon_failures_page() -> None:
    critical = {r.alert for r in rules() if r.field("severity") == "critical"}
    assert critical == {"HealthdDown", "HealthdNotTicking", "HealthdFleetDegraded", "HealthdNoLeader"}


def test_every_alert_has_a_runbook_section() -> None:
    sections = set(re.findall(r"^### (\S+)$", RUNBOOKS.read_text(), re.MULTILINE))
    assert sections == {r.alert for r in rules()}
    for anchor in re.findall(r"\]\(#([a-z0-9-]+)\)", RUNBOOKS.read_text()):
        assert anchor in {s.lower() for s in sections}, anchor


def test_every_alert_has_a_case_that_fires_and_one_that_must_not() -> None:
    text = RULE_TESTS.read_text()
    fires = set(re.findall(r"alertname: (\w+)\n\s+exp_alerts:\n\s+- exp_labels:", text))
    silent = set(re.findall(r"alertname: (\w+)\n\s+exp_alerts: \[\]", text))
    names = {r.alert for r in rules()}
    assert names - fires == set()
    assert names - silent == set()
    assert (fires | silent) - names == set()


def test_rules_use_only_catalogued_metrics() -> None:
    catalogue = set(re.findall(r"`(healthd_[a-z0-9_]+)`", CATALOGUE.read_text()))
    used = set(re.findall(r"\bhealthd_[a-z0-9_]+", "".join(r.body for r in rules())))
    assert used and used - catalogue == set()


@pytest.mark.promtool
def test_promtool_check_rules_is_clean() -> None:
    done = subprocess.run([promtool(), "check", "rules", "--lint-fatal", str(RULES)],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(rules())} rules found" in done.stdout


@pytest.mark.promtool
def test_promtool_rule_unit_tests_pass() -> None:
    done = subprocess.run([promtool(), "test", "rules", str(RULE_TESTS)],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


@pytest.mark.promtool
def test_promtool_unit_tests_can_fail(tmp_path: Path) -> None:
    """A broken rule (the NCCL alert without its `for:`) makes the promtool tests fail: they are not vacuous."""
    (tmp_path / "grafana" / "alerts").mkdir(parents=True)
    broken = RULES.read_text().replace('healthd_node_finding_drop_ratio{probe="nccl", reference!="floor"}\n'
                                       "        for: 2m", 'healthd_node_finding_drop_ratio{probe="nccl", '
                                       'reference!="floor"}\n        for: 0m', 1)
    assert broken != RULES.read_text()
    (tmp_path / "grafana" / "alerts" / "healthd.rules.yml").write_text(broken)
    test_dir = tmp_path / "tests" / "fixtures" / "promtool"
    test_dir.mkdir(parents=True)
    (test_dir / RULE_TESTS.name).write_text(RULE_TESTS.read_text())
    done = subprocess.run([promtool(), "test", "rules", str(test_dir / RULE_TESTS.name)],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "HealthdNcclBandwidthDegraded, time: 11m" in done.stdout + done.stderr, "fires a minute too early"
