"""``healthd install-files``: the node check's wrappers for Slurm and the slurm.conf lines it prints."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from healthd.cli import main
from healthd.commands.install_files import node_check_wrapper, slurm_conf_lines
from healthd.config import Settings
from probes.result import Outcome, ProbeResult

ROOT = Path(__file__).resolve().parents[2]


def wrapper(tmp_path: Path, python: str, context: str = "health") -> Path:
    path = tmp_path / f"node-check-{context}"
    path.write_text(node_check_wrapper(context, python, tmp_path / "results"))
    path.chmod(0o755)
    return path


def fake_python(tmp_path: Path, body: str) -> str:
    """A stand-in for the compute node's Python that ends as ``body`` says (a shell script)."""
    path = tmp_path / "fake-python"
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)
    return str(path)


@pytest.mark.parametrize(("body", "rc"), [("exit 1", 1), ("exit 0", 0), ("exit 2", 0), ("exit 3", 0),
                                          ("kill -9 $$", 0)])
def test_only_a_broken_node_leaves_the_wrapper_non_zero(tmp_path: Path, body: str, rc: int) -> None:
    done = subprocess.run([wrapper(tmp_path, fake_python(tmp_path, body))], capture_output=True, text=True,
                          timeout=30, check=False)
    assert done.returncode == rc
    if body not in ("exit 0", "exit 1"):
        assert "not the node's fault (exit 0)" in done.stderr


def test_a_missing_python_is_not_a_drain(tmp_path: Path) -> None:
    done = subprocess.run([wrapper(tmp_path, str(tmp_path / "no-python"))], capture_output=True, text=True,
                          timeout=30, check=False)
    assert done.returncode == 0 and "not run (exit 0)" in done.stderr


def test_the_wrapper_runs_the_real_check_into_the_results_dir(tmp_path: Path) -> None:
    (tmp_path / "results").mkdir()
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "SLURMD_NODENAME": "n1", "HOME": str(tmp_path)}
    done = subprocess.run([wrapper(tmp_path, sys.executable), "--no-gemm", "--expect-gpus", "0"], env=env,
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    [doc] = (tmp_path / "results").glob("boundary-n1-health-0-*.json")
    result = ProbeResult.model_validate_json(doc.read_text())
    assert result.params["context"] == "health" and result.outcome is not Outcome.FAIL


def test_slurm_conf_lines() -> None:
    lines = slurm_conf_lines(Path("/usr/libexec/healthd"), Settings(node_check={"health_interval_s": 600}))
    assert lines == ["Prolog=/usr/libexec/healthd/node-check-prolog", "Epilog=/usr/libexec/healthd/node-check-epilog",
                     "HealthCheckProgram=/usr/libexec/healthd/node-check-health", "HealthCheckInterval=600",
                     "HealthCheckNodeState=ANY,CYCLE"]
    assert len(slurm_conf_lines(Path("/x"), Settings(node_check={"health_interval_s": 0}))) == 2


def test_install_files_writes_the_wrappers_and_prints_the_lines(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    conf = tmp_path / "healthd.toml"
    conf.write_text('[slurm]\nresults_dir = "/shared/healthd/results"\npython = "/opt/healthd/bin/python"\n')
    assert main(["install-files", "--prefix", str(tmp_path / "root"), "--config", str(conf)]) == 0
    out = capsys.readouterr().out
    assert "Epilog=/usr/libexec/healthd/node-check-epilog" in out and "HealthCheckInterval=300" in out
    epilog = tmp_path / "root/usr/libexec/healthd/node-check-epilog"
    assert os.access(epilog, os.X_OK)
    text = epilog.read_text()
    assert "PY=/opt/healthd/bin/python" in text
    assert "--context epilog --results-dir /shared/healthd/results" in text
    epilog.write_text("site's own\n")
    assert main(["install-files", "--prefix", str(tmp_path / "root"), "--config", str(conf)]) == 0
    assert epilog.read_text() == "site's own\n"
