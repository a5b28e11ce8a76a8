"""The wheel carries what an admin needs: daemon, probes, systemd files, dashboards, rules, example config."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    done = subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(out), str(REPO)],
        capture_output=True, text=True, timeout=300, check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (path,) = out.glob("healthd-*.whl")
    return path


def test_wheel_contents(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    required = {
        "healthd/cli.py", "healthd/daemon.py", "healthd/py.typed", "probes/__main__.py", "probes/result.py",
        "probes/nccl.py", "probes/gemm.py", "probes/ddp.py",
        "healthd/_data/systemd/healthd.service", "healthd/_data/healthd.example.toml",
    }
    assert required <= names, sorted(required - names)
    assert any(n.startswith("healthd/_data/grafana/") for n in names)
    assert not any("__pycache__" in n or n.startswith("tests/") for n in names)
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    assert "healthd = healthd.cli:main" in zipfile.ZipFile(wheel).read(entry_points).decode()


def test_install_files_from_the_unpacked_wheel(wheel: Path, tmp_path: Path) -> None:
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    prefix = tmp_path / "root"
    env = {**os.environ, "PYTHONPATH": str(site)}
    done = subprocess.run([sys.executable, "-c", "import healthd.cli, sys; sys.exit(healthd.cli.main())",
                           "install-files", "--prefix", str(prefix)],
                          capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert str(site) in done.stdout  # copied from the wheel's _data, not from the checkout
    assert "\n[Service]\n" in (prefix / "lib/systemd/system/healthd.service").read_text()
    assert (prefix / "etc/healthd/healthd.toml").is_file()
    again = subprocess.run([sys.executable, "-c", "import healthd.cli, sys; sys.exit(healthd.cli.main())",
                            "install-files", "--prefix", str(prefix)],
                           capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path, check=False)
    assert "exists, kept" in again.stdout and "0 file(s) installed" in again.stdout
