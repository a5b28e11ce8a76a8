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
    (tmp_path / "results").mkdir(exist_ok=True)
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


def logger_on_path(tmp_path: Path) -> dict[str, str]:
    """A ``logger`` first on PATH that appends its arguments to ``logged`` (the journal stands in)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "logger").write_text(f'#!/bin/sh\necho "$*" >> {tmp_path / "logged"}\n')
    (bin_dir / "logger").chmod(0o755)
    return {"PATH": f"{bin_dir}:/usr/bin:/bin"}


def test_what_stops_the_check_goes_to_the_journal(tmp_path: Path) -> None:
    env = logger_on_path(tmp_path)
    path = wrapper(tmp_path, str(tmp_path / "no-python"), "epilog")
    done = subprocess.run([path], capture_output=True, text=True, timeout=30, check=False, env=env)
    assert done.returncode == 0
    assert (tmp_path / "logged").read_text() == (
        f"-t healthd-node-check -p daemon.warning -- epilog: {tmp_path / 'no-python'} is not there; not run (exit 0)\n")
    (tmp_path / "results").rmdir()
    path = wrapper(tmp_path, fake_python(tmp_path, "exit 1"), "prolog")
    (tmp_path / "results").rmdir()
    done = subprocess.run([path], capture_output=True, text=True, timeout=30, check=False, env=env)
    assert done.returncode == 0
    assert (tmp_path / "logged").read_text().splitlines()[-1] == (
        f"-t healthd-node-check -p daemon.warning -- prolog: the results directory {tmp_path / 'results'} is not "
        "there; not run (exit 0)")
    done = subprocess.run([wrapper(tmp_path, fake_python(tmp_path, "exit 3"))], capture_output=True, text=True,
                          timeout=30, check=False, env=env)
    assert done.returncode == 0
    assert (tmp_path / "logged").read_text().splitlines()[-1].endswith(
        "health: ended with status 3: not the node's fault (exit 0)")


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
    assert "RESULTS=/shared/healthd/results" in text and '--context epilog --results-dir "$RESULTS"' in text
    epilog.write_text("site's own\n")
    assert main(["install-files", "--prefix", str(tmp_path / "root"), "--config", str(conf)]) == 0
    assert epilog.read_text() == "site's own\n"


@pytest.mark.parametrize("config", ["none", "example"])
def test_no_wrappers_before_the_config_is_edited(tmp_path: Path, config: str, capsys: pytest.CaptureFixture[str],
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HEALTHD_CONFIG", raising=False)
    monkeypatch.setenv("HEALTHD_SERVICE_CONFIG", str(tmp_path / "etc" / "healthd.toml"))
    argv = ["install-files", "--prefix", str(tmp_path / "root")]
    if config == "example":
        example = tmp_path / "healthd.toml"
        example.write_bytes((ROOT / "healthd.example.toml").read_bytes())
        argv += ["--config", str(example)]
    assert main(argv) == 0
    err = capsys.readouterr().err
    why = "there is no config yet" if config == "none" else f"{tmp_path / 'healthd.toml'} is still the shipped example"
    assert f"node-check wrappers NOT written: {why}" in err
    assert "Edit " in err and "[slurm] python" in err and "results_dir" in err
    assert not (tmp_path / "root/usr/libexec/healthd").exists()


def test_force_never_overwrites_an_edited_config(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    conf = tmp_path / "root/etc/healthd/healthd.toml"
    conf.parent.mkdir(parents=True)
    conf.write_text('[slurm]\nresults_dir = "/shared/healthd/results"\n')
    assert main(["install-files", "--prefix", str(tmp_path / "root"), "--config", str(conf), "--force"]) == 0
    out = capsys.readouterr().out
    assert conf.read_text() == '[slurm]\nresults_dir = "/shared/healthd/results"\n'
    new = conf.with_name("healthd.toml.new")
    assert new.read_bytes() == (ROOT / "healthd.example.toml").read_bytes()
    assert f"kept the edited {conf}; wrote the shipped example to {new}" in out
    assert (tmp_path / "root/usr/libexec/healthd/node-check-epilog").exists()
    conf.write_bytes(new.read_bytes())
    new.unlink()
    assert main(["install-files", "--prefix", str(tmp_path / "root"), "--config", str(conf), "--force"]) == 0
    assert f"unchanged: {conf}" in capsys.readouterr().out and not new.exists()
