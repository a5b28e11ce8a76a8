"""The admin node's install has no torch (it is the ``probes`` extra): every ``healthd`` module and the
command line work without it, and a local backend whose probe Python lacks it is refused at start."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Literal

import pytest

from healthd.cluster import make_backend
from healthd.cluster.local import LocalBackend, torch_problem
from healthd.config import LocalSettings, Settings, SlurmSettings
from healthd.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]
BLOCK_TORCH = 'import sys\nsys.modules["torch"] = None  # `import torch` fails as if it were not installed\n'


def run_without_torch(script: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HEALTHD_")}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])
    return subprocess.run([sys.executable, "-c", BLOCK_TORCH + textwrap.dedent(script), *args], capture_output=True,
                          text=True, timeout=timeout, env=env, cwd=REPO, check=False)


def cli_without_torch(*argv: str) -> subprocess.CompletedProcess[str]:
    return run_without_torch("import healthd.cli\nsys.exit(healthd.cli.main(sys.argv[1:]))\n", *argv)


def no_torch_python(tmp_path: Path) -> Path:
    """This interpreter without site-packages (``-S``): a real Python in which torch cannot be found."""
    python = tmp_path / "python-without-torch"
    python.write_text(f'#!/bin/sh\nexec "{sys.executable}" -S "$@"\n')
    python.chmod(0o755)
    return python


def test_every_healthd_module_imports_without_torch() -> None:
    done = run_without_torch("""
        import importlib, json, pkgutil
        try:
            import torch
        except ImportError:
            pass
        else:
            raise SystemExit("torch is not blocked")
        import healthd

        def fail(name):
            raise ImportError(f"cannot import the package {name}")

        names = [m.name for m in pkgutil.walk_packages(healthd.__path__, "healthd.", onerror=fail)]
        failed = {}
        for name in names:
            try:
                importlib.import_module(name)
            except ImportError as exc:
                failed[name] = repr(exc)
        print(json.dumps({"modules": names, "failed": failed}))
    """)
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(done.stdout.splitlines()[-1])
    assert report["failed"] == {}, report["failed"]
    assert {"healthd.cli", "healthd.daemon", "healthd.cluster.local", "healthd.cluster.slurm", "healthd.judge.fleet",
            "healthd.commands.probe", "healthd.parsers.healthd_json"} <= set(report["modules"])


def test_help_and_check_config_work_without_torch() -> None:
    helped = cli_without_torch("--help")
    assert helped.returncode == 0, helped.stderr
    assert "check-config" in helped.stdout and "run" in helped.stdout
    checked = cli_without_torch("check-config", "--config", str(REPO / "healthd.example.toml"))
    assert checked.returncode == 0, checked.stderr
    assert checked.stdout.startswith("config OK: ")


def test_daemon_on_the_local_backend_refuses_to_start_without_torch(tmp_path: Path) -> None:
    config = tmp_path / "healthd.toml"
    config.write_text(f'backend = "local"\nstate_dir = "{tmp_path / "state"}"\n[http]\nhost = "127.0.0.1"\nport = 0\n')
    done = cli_without_torch("run", "--config", str(config))
    assert done.returncode == 2, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    (line,) = [line for line in done.stderr.splitlines() if line.startswith("healthd: configuration error: ")]
    assert f"backend = 'local' runs the probes on this machine with local.python = {sys.executable}" in line
    assert "which cannot import torch" in line and "pip install 'healthd[probes]'" in line


def test_healthd_probe_refuses_without_torch() -> None:
    done = cli_without_torch("probe", "gemm")
    assert done.returncode == 2, done.stdout + done.stderr
    assert "healthd probe runs gemm on this machine" in done.stderr and "healthd[probes]" in done.stderr


# -- the check itself --------------------------------------------------------------------------

def settings(tmp_path: Path, backend: Literal["auto", "local"], python: Path) -> Settings:
    no_slurm = tmp_path / "no-slurm"  # slurm.bin_dir without sinfo: `auto` falls back to local
    no_slurm.mkdir(exist_ok=True)
    return Settings(backend=backend, state_dir=tmp_path / "state", local=LocalSettings(python=python),
                    slurm=SlurmSettings(bin_dir=no_slurm))


def test_this_interpreter_with_torch_passes(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    assert torch_problem(Path(sys.executable)) is None
    assert isinstance(make_backend(settings(tmp_path, "local", Path(sys.executable))), LocalBackend)


def test_this_interpreter_without_torch_is_asked_in_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)
    with pytest.raises(ConfigError, match=r"local\.python = .*, which cannot import torch\. .*'healthd\[probes\]'"):
        make_backend(settings(tmp_path, "local", Path(sys.executable)))


def test_another_python_without_torch_is_refused(tmp_path: Path) -> None:
    python = no_torch_python(tmp_path)
    assert torch_problem(python) == "cannot import torch"
    with pytest.raises(ConfigError) as err:
        make_backend(settings(tmp_path, "local", python))
    assert str(err.value) == (
        f"backend = 'local' runs the probes on this machine with local.python = {python}, which cannot import "
        "torch. Install healthd's probes extra there (pip install 'healthd[probes]') or point local.python at a "
        "Python that has it"
    )


def test_auto_falling_back_to_local_says_so(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"^backend = 'auto' found no Slurm answering \(sinfo\), so the local "
                                          r"backend runs the probes on this machine with local\.python = .*torch"):
        make_backend(settings(tmp_path, "auto", no_torch_python(tmp_path)))


def test_a_python_that_cannot_run_is_refused(tmp_path: Path) -> None:
    missing = tmp_path / "nope" / "python"
    with pytest.raises(ConfigError, match=r"local\.python = .*/nope/python, which cannot be run \(.*No such file"):
        make_backend(settings(tmp_path, "local", missing))


def test_commands_that_run_no_probes_skip_the_check(tmp_path: Path) -> None:
    backend = make_backend(settings(tmp_path, "local", no_torch_python(tmp_path)), runs_probes=False)
    assert isinstance(backend, LocalBackend)


def test_a_python_that_does_not_answer_in_time_is_not_refused(tmp_path: Path) -> None:
    slow = tmp_path / "slow-python"
    slow.write_text("#!/bin/sh\nexec sleep 30\n")
    slow.chmod(0o755)
    assert torch_problem(slow, timeout_s=0.5) is None
    odd = tmp_path / "odd-python"
    odd.write_text("#!/bin/sh\nexit 1\n")
    odd.chmod(0o755)
    assert torch_problem(odd) is None
