"""The Debian packages of a test run are listed once (scripts/debian-packages.txt) and installed once, up
front, by scripts/install-debian-deps.sh, which never overlaps with itself (issue 26: on a fresh machine
the background chroot build's apt-get met slurm-test-cluster.sh's `apt-get update` on apt's lists lock)."""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = REPO / "scripts"
INSTALL = SCRIPTS / "install-debian-deps.sh"


def listed(*roles: str) -> list[str]:
    done = subprocess.run([str(INSTALL), "--list", *roles], capture_output=True, text=True, timeout=30, check=True)
    return done.stdout.split()


def test_roles_select_their_packages() -> None:
    everything = listed()
    assert set(listed("slurm")) == {"slurmctld", "slurmd", "slurm-client", "munge"}
    assert {"mmdebstrap", "util-linux"} <= set(listed("chroot"))
    assert set(listed("venv")) == {"python3-venv"}
    assert {"crun", "podman", "squashfs-tools", "charliecloud-runtime", "mmdebstrap"} <= set(listed("containers"))
    assert set(listed("slurm", "chroot", "tests", "containers", "venv")) == set(everything)
    assert len(everything) == len(set(everything))
    unknown = subprocess.run([str(INSTALL), "--list", "nosuchrole"], capture_output=True, text=True, timeout=30)
    assert unknown.returncode != 0 and "nosuchrole" in unknown.stderr


def test_every_debian_package_the_tests_and_scripts_name_is_listed() -> None:
    """The skip reasons and scripts that tell an admin to install a package name one of the list."""
    named: set[str] = set()
    pattern = re.compile(
        r"apt-get install (?:--no-install-recommends )?([a-z0-9][a-z0-9.+-]+)|\(package ([a-z0-9][a-z0-9.+-]+)\)"
    )
    for path in [*(REPO / "tests").rglob("*.py"), *SCRIPTS.glob("*.sh")]:
        named.update(name for match in pattern.findall(path.read_text()) for name in match if name)
    assert named, "the pattern found no package: it no longer matches how the tests name them"
    assert named <= set(listed()), sorted(named - set(listed()))


def test_only_the_install_script_runs_apt_and_test_sh_runs_it_before_anything_in_the_background() -> None:
    for path in SCRIPTS.glob("*.sh"):
        if path != INSTALL:
            assert not re.search(r"^[^#]*\bapt-get\b.*\b(update|install)\b", path.read_text(), re.MULTILINE), (
                f"{path.name} runs apt-get itself")
    lines = (SCRIPTS / "test.sh").read_text().splitlines()
    install = next(i for i, line in enumerate(lines) if line.strip() == "scripts/install-debian-deps.sh")
    background = [i for i, line in enumerate(lines) if re.search(r"[^&]&\s*$", line) and not line.startswith("#")]
    assert background and install < min(background)
    cluster = (SCRIPTS / "slurm-test-cluster.sh").read_text()
    assert '"$REPO/scripts/install-debian-deps.sh" "$@"' in cluster


def _unavailable() -> str | None:
    if os.geteuid() != 0:
        return "needs root: without root the script only checks and never takes the lock"
    if shutil.which("dpkg-query") is None or shutil.which("flock") is None:
        return "needs dpkg-query and flock (a Debian host)"
    missing = [
        p for p in listed()
        if "install ok installed" not in subprocess.run(
            ["dpkg-query", "-W", "-f=${Status}", p], capture_output=True, text=True, timeout=30).stdout
    ]
    if missing:
        return (f"Debian packages {' '.join(missing)} are missing; this test must never run apt-get "
                "(scripts/test.sh installs them first)")
    return None


@pytest.mark.skipif(_unavailable() is not None, reason=str(_unavailable()))
def test_an_install_waits_for_one_in_progress_and_then_finds_nothing_to_do(tmp_path: Path) -> None:
    lock = tmp_path / "apt.lock"
    env = {**os.environ, "HEALTHD_APT_LOCK": str(lock)}
    with lock.open("w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        proc = subprocess.Popen([str(INSTALL)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        time.sleep(1.5)
        assert proc.poll() is None, "did not wait for the install in progress"
        released = time.monotonic()
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert time.monotonic() - released < 10
    assert "waiting for another install" in err and "installing" not in err
