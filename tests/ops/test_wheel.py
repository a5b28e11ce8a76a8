"""The wheel carries what an admin needs: daemon, probes, systemd files, dashboards, rules, example config;
its metadata asks for torch only with the ``probes`` extra (compute nodes, the local backend)."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from email.parser import HeaderParser
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

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


def requires_dist(wheel: Path) -> list[Requirement]:
    with zipfile.ZipFile(wheel) as zf:
        metadata = zf.read(next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))).decode()
    return [Requirement(line) for line in HeaderParser().parsestr(metadata).get_all("Requires-Dist") or []]


def names_with(requires: list[Requirement], extra: str | None) -> set[str]:
    """The projects an install asks for: ``pip install healthd`` (None) or ``healthd[extra]``."""
    env = {"extra": extra or ""}
    return {canonicalize_name(r.name) for r in requires if r.marker is None or r.marker.evaluate(env)}


def test_torch_only_with_the_probes_extra(wheel: Path) -> None:
    requires = requires_dist(wheel)
    daemon = names_with(requires, None)
    assert {"apscheduler", "prometheus-client", "pydantic", "numpy"} <= daemon
    assert "torch" not in daemon
    assert "torch" in names_with(requires, "probes")
    assert names_with(requires, "probes") <= names_with(requires, "dev")  # the tests need the probes' torch
    assert "torch" not in names_with(requires, "pyslurm")


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
