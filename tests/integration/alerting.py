"""What the end-to-end alert tests share: a webhook receiver (a real HTTP server Alertmanager posts to) and the
Prometheus and Alertmanager configurations that connect the daemon's scrape, the shipped rules and the hook."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from collections.abc import Mapping
from pathlib import Path

WEBHOOK = """
import http.server, sys
class Hook(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers["Content-Length"]))
        with open(sys.argv[2], "ab") as out:
            out.write(body.replace(b"\\n", b" ") + b"\\n")
        self.send_response(200)
        self.end_headers()
    def log_message(self, *args):
        pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Hook).serve_forever()
"""
"""``python -c WEBHOOK PORT FILE``: every delivery appended to FILE as one JSON line."""


def write_prometheus_config(path: Path, *, rules: Path, alertmanager_port: int, targets: Mapping[str, int],
                            interval: str) -> Path:
    """Scrape each job's ``127.0.0.1:<port>`` every ``interval``, evaluate ``rules`` as often, alert to the
    Alertmanager on ``alertmanager_port``."""
    jobs = "".join(f"""  - job_name: {job}
    static_configs: [{{targets: ["127.0.0.1:{port}"]}}]
""" for job, port in targets.items())
    path.write_text(f"""
global: {{scrape_interval: {interval}, evaluation_interval: {interval}}}
rule_files: ["{rules}"]
alerting:
  alertmanagers: [{{static_configs: [{{targets: ["127.0.0.1:{alertmanager_port}"]}}]}}]
scrape_configs:
{jobs}""")
    return path


def write_alertmanager_config(path: Path, *, hook_port: int) -> Path:
    """Every alert, grouped by name and node, to the webhook at once (resolved ones too)."""
    path.write_text(f"""
route:
  receiver: hook
  group_by: [alertname, node]
  group_wait: 1s
  group_interval: 2s
  repeat_interval: 1h
receivers:
  - name: hook
    webhook_configs: [{{url: "http://127.0.0.1:{hook_port}/", send_resolved: true}}]
""")
    return path


def prometheus_missing() -> str | None:
    """Why a test with a real Prometheus server cannot run here, or ``None``."""
    if os.geteuid() != 0:
        return "needs root, like the alert tests; scripts/test.sh runs the integration suites as root"
    if shutil.which("prometheus") is None:
        return "prometheus not installed (Debian package prometheus; scripts/test.sh installs it as root)"
    return None


def start_prometheus(tmp: Path, port: int) -> subprocess.Popen[bytes]:
    """A Prometheus on ``127.0.0.1:port`` with ``tmp/prometheus.yml``, its TSDB in ``tmp/tsdb``, its log in
    ``tmp/prometheus.log``, in a session of its own (``stop_prometheus``)."""
    log = (tmp / "prometheus.log").open("ab")
    return subprocess.Popen(
        ["prometheus", f"--config.file={tmp / 'prometheus.yml'}", f"--storage.tsdb.path={tmp / 'tsdb'}",
         f"--web.listen-address=127.0.0.1:{port}"], stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def stop_prometheus(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM to its session, SIGKILL after 15 s; nothing when it has already ended."""
    if proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
