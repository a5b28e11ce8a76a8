"""Passive signals reach the operator through the real chain: a fake dcgm-exporter (GPUs and DCGM cannot run
here; its text follows the real exporter's) scraped by a real Prometheus (Debian's package), which healthd's
daemon (local backend) polls; the shipped rule file (only the per-node alerts' ``for:`` shortened) and a real
Alertmanager with a webhook receiver.

- a stale XID 79 on the gauge since before the daemon started changes nothing;
- an XID 13 (an application's error) changes nothing;
- Prometheus stopped: ``healthd_passive_up 0``, no verdict changes; back when it returns;
- an XID 79 on GPU 1 while the node really lost a GPU (its probes now expect one: ``--expect-gpus 1`` on a
  machine with none, the probes' own ``gpus_missing`` failure): a passive finding, a re-probe, the re-probe
  failing confirms it, a drain recommendation naming the GPU and ``HealthdGpuPassiveFault`` at the webhook.

Needs Debian's ``prometheus`` and ``prometheus-alertmanager`` and torch (scripts/test.sh installs them as
root); skips with the reason otherwise. About a minute.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from healthd.store import Store
from tests.integration.alerting import WEBHOOK, write_alertmanager_config, write_prometheus_config

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "grafana" / "alerts" / "healthd.rules.yml"
NODE = "pnode"
DAEMON_PORT, PROM_PORT, AM_PORT, HOOK_PORT, EXPORTER_PORT = 9479, 9291, 9294, 9297, 9298



def _missing() -> str | None:
    for tool, package in (("prometheus", "prometheus"), ("prometheus-alertmanager", "prometheus-alertmanager")):
        if shutil.which(tool) is None:
            return f"{tool} not installed (Debian package {package}; scripts/test.sh installs it as root)"
    if subprocess.run([sys.executable, "-c", "import torch"], capture_output=True, timeout=120).returncode != 0:
        return "torch is not installed here (healthd[probes]): the local probes need it"
    return None


@dataclass
class Chain:
    tmp: Path
    store_path: Path
    hooks: Path
    gpu_lost: Path
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    def start(self, name: str, argv: list[str]) -> None:
        log = (self.tmp / f"{name}.log").open("ab")
        self.procs[name] = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def stop(self, name: str) -> None:
        proc = self.procs.pop(name)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()

    def log(self, name: str) -> str:
        path = self.tmp / f"{name}.log"
        return path.read_text(errors="replace")[-4000:] if path.exists() else ""

    def exporter(self, **doc: object) -> None:
        req = urllib.request.Request(f"http://127.0.0.1:{EXPORTER_PORT}/control", data=json.dumps(doc).encode(),
                                     headers={"Content-Type": "application/json"}, method="POST")
        with urllib.request.urlopen(req, timeout=10) as answer:
            assert answer.status == 200

    def metric(self, name: str) -> list[tuple[str, float]]:
        """The daemon's own ``/metrics`` samples of ``name``: (labels text, value)."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{DAEMON_PORT}/metrics", timeout=10) as answer:
                text = answer.read().decode()
        except OSError:
            return []
        return [(m.group(1) or "", float(m.group(2))) for m in
                re.finditer(rf"^{name}(\{{[^}}]*\}})? (\S+)$", text, re.MULTILINE)]

    def verdict(self, probe: str = "passive") -> tuple[str, str, str] | None:
        if not self.store_path.exists():
            return None
        store = Store(self.store_path)
        try:
            for v in store.current_verdicts_of([NODE]):
                if v.probe == probe:
                    return v.outcome.value, v.reason_code, str(v.evidence.get("stage", ""))
            return None
        finally:
            store.close()

    def runs(self) -> list[tuple[str, str, str]]:
        if not self.store_path.exists():
            return []
        store = Store(self.store_path)
        try:
            return [(r.probe, r.kind.value if hasattr(r.kind, "value") else str(r.kind), r.outcome.value
                     if r.outcome is not None else "") for r in store.recent_runs(limit=200)]
        finally:
            store.close()

    def recommendations(self) -> list[tuple[str, str, str]]:
        if not self.store_path.exists():
            return []
        store = Store(self.store_path)
        try:
            return [(r.probe, r.reason_code, r.text) for r in store.recommendations()]
        finally:
            store.close()

    def notifications(self) -> list[dict[str, object]]:
        if not self.hooks.exists():
            return []
        return [a for line in self.hooks.read_text().splitlines() if line.strip()
                for a in json.loads(line)["alerts"]]

    def wait(self, what: str, predicate: Callable[[], bool], timeout: float) -> None:
        deadline = time.time() + timeout
        while time.time() < deadline:
            for name, proc in self.procs.items():
                assert proc.poll() is None, f"{name} exited:\n{self.log(name)}"
            if predicate():
                return
            time.sleep(0.5)
        raise AssertionError(f"timed out after {timeout:g} s waiting for {what}; verdict {self.verdict()}, runs "
                             f"{self.runs()[:10]}, recommendations {self.recommendations()}, webhook "
                             f"{self.notifications()}\ndaemon log:\n{self.log('healthd')}")


def _configs(tmp: Path, gpu_lost: Path) -> tuple[Path, Path, Path]:
    python = tmp / "probe-python"
    python.write_text(f"""#!/bin/sh
# while {gpu_lost} exists the node has lost its GPU: its probes expect one (a machine without: gpus_missing)
if [ -e {gpu_lost} ]; then exec {sys.executable} "$@" --expect-gpus 1; fi
exec {sys.executable} "$@"
""")
    python.chmod(0o755)
    daemon = tmp / "healthd.toml"
    daemon.write_text(f"""
backend = "local"
state_dir = "{tmp / "state"}"
[http]
host = "127.0.0.1"
port = {DAEMON_PORT}
[scheduler]
discover_interval_s = 2
plan_interval_s = 1
collect_interval_s = 0.5
[local]
node_name = "{NODE}"
python = "{python}"
ranks = 1
[probes.nccl]
enabled = false
[probes.gemm]
interval_s = 3600
jitter_s = 0
timeout_s = 120
args = ["--nproc", "1", "--dtypes", "fp32", "--copy-bytes", "1M"]
[passive]
prometheus_url = "http://127.0.0.1:{PROM_PORT}"
interval_s = 1
timeout_s = 1
[logging]
format = "json"
""")
    rules = tmp / "healthd.rules.yml"
    shortened = re.sub(r"^(\s+)for: (2m|1m)$", r"\1for: 2s", RULES.read_text(), flags=re.MULTILINE)
    rules.write_text(shortened)
    prometheus = write_prometheus_config(tmp / "prometheus.yml", rules=rules, alertmanager_port=AM_PORT,
                                         targets={"healthd": DAEMON_PORT, "dcgm-exporter": EXPORTER_PORT},
                                         interval="1s")
    alertmanager = write_alertmanager_config(tmp / "alertmanager.yml", hook_port=HOOK_PORT)
    return daemon, prometheus, alertmanager


@pytest.fixture
def chain(tmp_path: Path) -> Iterator[Chain]:
    missing = _missing()
    if missing:
        pytest.skip(missing)
    c = Chain(tmp_path, tmp_path / "state" / "healthd.sqlite", tmp_path / "webhook.jsonl", tmp_path / "gpu-lost")
    daemon, prometheus, alertmanager = _configs(tmp_path, c.gpu_lost)
    c.start("exporter", [sys.executable, "-m", "tests.fakes.dcgm_exporter", "--port", str(EXPORTER_PORT),
                         "--nodes", NODE, "--gpus", "2"])
    c.start("webhook", [sys.executable, "-c", WEBHOOK, str(HOOK_PORT), str(c.hooks)])
    c.start("alertmanager", ["prometheus-alertmanager", f"--config.file={alertmanager}",
                             f"--storage.path={tmp_path / 'am'}", f"--web.listen-address=127.0.0.1:{AM_PORT}",
                             "--cluster.listen-address="])
    c.prometheus_argv = ["prometheus", f"--config.file={prometheus}",  # type: ignore[attr-defined]
                         f"--storage.tsdb.path={tmp_path / 'tsdb'}", f"--web.listen-address=127.0.0.1:{PROM_PORT}",
                         "--rules.alert.resend-delay=1s"]
    c.start("prometheus", c.prometheus_argv)  # type: ignore[attr-defined]
    try:
        deadline = time.time() + 30
        while True:
            try:
                c.exporter(op="xid", node=NODE, gpu=0, xid=79)  # last week's XID 79: present before healthd starts
                break
            except OSError:
                assert time.time() < deadline, c.log("exporter")
                time.sleep(0.3)
        env_path = f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}"
        time.sleep(3)  # Prometheus has scraped the stale gauge before the daemon's first poll
        c.start("healthd", ["env", f"PATH={env_path}", f"PYTHONPATH={ROOT}", sys.executable, "-m", "healthd.cli",
                            "run", "--config", str(daemon)])
        yield c
    finally:
        for name in list(reversed(c.procs)):
            c.stop(name)


def test_passive_signals_through_prometheus_to_a_confirmed_finding_and_the_webhook(chain: Chain) -> None:
    c = chain
    c.wait("the daemon polling Prometheus", lambda: c.metric("healthd_passive_up") == [("", 1.0)], timeout=60)
    c.wait("a first gemm run judged", lambda: c.verdict("gemm") is not None, timeout=120)
    time.sleep(3)
    assert c.verdict() is None, "the stale XID gauge (present before start) made a passive verdict"

    c.exporter(op="xid", node=NODE, gpu=1, xid=13)
    time.sleep(5)
    assert c.verdict() is None and c.recommendations() == [], "an application XID changed something"

    c.stop("prometheus")
    c.wait("healthd_passive_up 0", lambda: c.metric("healthd_passive_up") == [("", 0.0)], timeout=30)
    assert c.verdict() is None and c.verdict("gemm") is not None and c.verdict("gemm")[0] == "pass"
    c.start("prometheus", c.prometheus_argv)  # type: ignore[attr-defined]
    c.wait("healthd_passive_up 1 again", lambda: c.metric("healthd_passive_up") == [("", 1.0)], timeout=60)
    assert c.verdict() is None

    c.gpu_lost.touch()
    c.exporter(op="xid", node=NODE, gpu=1, xid=79)
    c.wait("the passive finding", lambda: c.verdict() is not None, timeout=30)
    c.wait("the re-probe failing confirms it", lambda: (c.verdict() or ("",))[0] == "fail", timeout=120)
    assert c.verdict() == ("fail", "xid_79", "confirmed")
    assert any(kind == "reprobe" and outcome == "fail" for probe, kind, outcome in c.runs() if probe == "gemm")
    (rec,) = [r for r in c.recommendations() if r[0] == "passive"]
    assert rec[1] == "xid_79" and "a probe of the node failed after it" in rec[2]
    signals = [labels for labels, value in c.metric("healthd_node_passive_signal") if value == 1.0]
    assert len(signals) == 1 and 'code="xid_79"' in signals[0] and 'gpu="1"' in signals[0], signals

    def fired() -> list[dict[str, object]]:
        return [a for a in c.notifications() if a["status"] == "firing"
                and a["labels"]["alertname"] == "HealthdGpuPassiveFault"]  # type: ignore[index]

    c.wait("HealthdGpuPassiveFault at the webhook", lambda: bool(fired()), timeout=60)
    labels = fired()[0]["labels"]
    assert labels["node"] == NODE and labels["reason_code"] == "xid_79" and labels["gpu"] == "1", labels  # type: ignore[index]
    assert str(labels["gpu_uuid"]).startswith("GPU-"), labels  # type: ignore[index]
