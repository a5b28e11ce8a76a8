"""``healthd doctor`` against a real daemon (local backend, probes off: nothing but discovery runs) and a real
Prometheus: first one that scrapes healthd under another job name without the rules (two things to fix),
then one wired as docs/admin-guide.md says (scrape job ``healthd``, the shipped rules); the node check is
to fix until the real node check (``probes.boundary``, as Slurm's Epilog wrapper runs it) leaves a
document in the results directory and the daemon collects it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from probes.catalogue import PROBE_NAMES
from tests.integration.daemons import free_port, get

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "grafana" / "alerts" / "healthd.rules.yml"


class Proc:
    def __init__(self, argv: list[str], log: Path) -> None:
        self.log = log
        self._out = log.open("ab")
        self.proc = subprocess.Popen(argv, stdout=self._out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     start_new_session=True, cwd=log.parent)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, 9)
                self.proc.wait()
        self._out.close()


def wait(what: str, check: Any, procs: list[Proc], timeout: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for p in procs:
            assert p.proc.poll() is None, f"{p.log.name} exited:\n{p.log.read_text()[-3000:]}"
        try:
            if value := check():
                return value
        except (OSError, ValueError, KeyError):
            pass
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}:\n" + "\n".join(p.log.read_text()[-2000:] for p in procs))


def prometheus(tmp_path: Path, name: str, healthd_port: int, *, job: str, rules: bool) -> tuple[Proc, int]:
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.skip("prometheus not installed (Debian package 'prometheus'); scripts/test.sh installs it")
    port = free_port()
    config = tmp_path / f"{name}.yml"
    config.write_text(f"""
global: {{scrape_interval: 1s, scrape_timeout: 1s, evaluation_interval: 1s}}
rule_files: [{f'"{RULES}"' if rules else ''}]
scrape_configs:
  - job_name: {job}
    static_configs: [{{targets: ["127.0.0.1:{healthd_port}"]}}]
""")
    return Proc([binary, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / (name + '-tsdb')}",
                 f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"], tmp_path / f"{name}.log"), port


def doctor(config: Path, prom_port: int) -> tuple[int, dict[str, dict[str, str]]]:
    done = subprocess.run([sys.executable, "-m", "healthd.cli", "doctor", "--config", str(config), "--json",
                           "--prometheus", f"http://127.0.0.1:{prom_port}"], cwd=ROOT, capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode in (0, 1), done.stderr
    return done.returncode, {c["name"]: c for c in json.loads(done.stdout)["checks"]}


def scraped(prom_port: int) -> bool:
    status, body = get(prom_port, "/api/v1/query?query=healthd_node_info")
    return status == 200 and bool(json.loads(body)["data"]["result"])


@pytest.fixture
def procs() -> Iterator[list[Proc]]:
    started: list[Proc] = []
    yield started
    for p in reversed(started):
        p.stop()


def test_doctor_against_a_real_prometheus(tmp_path: Path, procs: list[Proc]) -> None:
    port = free_port()
    results = tmp_path / "state" / "results"
    config = tmp_path / "healthd.toml"
    config.write_text(f'backend = "local"\nstate_dir = "{tmp_path / "state"}"\n'
                      f'[http]\nhost = "127.0.0.1"\nport = {port}\n'
                      "[scheduler]\ndiscover_interval_s = 1\nplan_interval_s = 1\ncollect_interval_s = 0.5\n"
                      f'[local]\nnode_name = "testnode"\npython = "{sys.executable}"\n'
                      + "".join(f"[probes.{name}]\nenabled = false\n" for name in PROBE_NAMES))
    procs.append(Proc([sys.executable, "-m", "healthd.cli", "run", "--config", str(config)], tmp_path / "healthd.log"))
    wrong, wrong_port = prometheus(tmp_path, "wrong", port, job="exporters", rules=False)
    right, right_port = prometheus(tmp_path, "right", port, job="healthd", rules=True)
    procs += [wrong, right]
    wait("both Prometheus scraping healthd", lambda: scraped(wrong_port) and scraped(right_port), procs)

    rc, checks = doctor(config, wrong_port)
    assert rc == 1
    assert checks["prometheus scrape"]["status"] == "fix" and "as job exporters" in checks["prometheus scrape"]["found"]
    assert checks["prometheus rules"]["status"] == "fix" and "none of healthd's" in checks["prometheus rules"]["found"]

    rc, checks = doctor(config, right_port)
    assert checks["prometheus scrape"]["status"] == "ok", checks
    assert checks["prometheus rules"]["status"] == "ok", checks
    assert checks["store"]["status"] == "ok" and checks["results directory"]["status"] == "ok"
    assert checks["node check"] == {"name": "node check", "status": "fix", "do": checks["node check"]["do"],
                                    "found": "none of the 1 nodes has left a boundary document: the node check is "
                                             "not running"}
    assert rc == 1

    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "SLURMD_NODENAME": "testnode", "HOME": str(tmp_path)}
    check = subprocess.run([sys.executable, "-m", "probes.boundary", "--context", "epilog", "--results-dir",
                            str(results), "--no-gemm", "--expect-gpus", "0"], env=env, capture_output=True, text=True,
                           timeout=60, check=False)
    assert check.returncode == 0, check.stderr
    rc, checks = wait("the daemon to collect the boundary document",
                      lambda: (found := doctor(config, right_port))[1]["node check"]["status"] == "ok" and found,
                      procs)
    assert rc == 0 and {c["status"] for c in checks.values()} <= {"ok", "skipped"}
    assert checks["slurm"]["status"] == "skipped"
