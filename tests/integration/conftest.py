"""Fixtures for tests against real services.

``slurm_cluster``: the Slurm test cluster of ``scripts/slurm-test-cluster.sh``, of any release
(``HEALTHD_SLURM_RELEASE=bookworm|trixie|sid``: Slurm 22.05, 24.11, 26.05). Tests that use it skip
unless ``SLURM_CONF`` is set and ``sinfo`` answers; with ``HEALTHD_REQUIRE_SLURM=1`` (CI) they fail
instead:

    scripts/slurm-test-cluster.sh start && eval "$(scripts/slurm-test-cluster.sh env)"
    .venv/bin/python -m pytest -m slurm tests/integration

``scripts/slurm-matrix.sh`` does that once per release.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

import pytest

from healthd.cluster.slurm_argv import Release
from healthd.cluster.slurm_cli import CommandObserver, OutputMode, SlurmCli, SlurmCommands
from healthd.cluster.slurm_parse import parse_version
from healthd.config import NodeClassRule

REPO = Path(__file__).resolve().parents[2]
CLUSTER_SCRIPT = REPO / "scripts" / "slurm-test-cluster.sh"
NO_CLUSTER = "no Slurm test cluster: run scripts/slurm-test-cluster.sh start and eval its env"
FAKE_GPU_CLASSES = (NodeClassRule(name="tgpux2", gpu_type="tgpu", expect_gpus=0),)
"""The test cluster's GRES ``gpu:tgpu:2`` are character devices, not CUDA GPUs: this rule (as a site
would write it for GRES that are no GPUs) lets the probes run on the CPU there. Without it every probe
of those nodes is ``fail``/``gpus_missing`` (``test_daemon_slurm``: the defaults)."""
FAKE_GPU_CLASSES_TOML = """[[slurm.node_classes]]
name = "tgpux2"
gpu_type = "tgpu"
expect_gpus = 0
"""


@dataclass(frozen=True)
class SlurmTestCluster:
    conf: Path
    env: dict[str, str]
    """The environment of the tests' Slurm commands (``SLURM_CONF`` included)."""
    directory: Path | None
    """The cluster's directory when the script started it (its daemons can be stopped), else None."""
    version: tuple[int, int, int]
    """The release of its ``sinfo --version``, e.g. ``(24, 11, 5)``."""
    nodes: tuple[str, ...] = ()
    """Its node names, in the controller's order (five in the script's cluster)."""

    @property
    def release(self) -> Release:
        return self.version[0], self.version[1]

    def cli(
        self,
        commands: SlurmCommands | None = None,
        *,
        timeout_s: float = 30.0,
        output: OutputMode = "auto",
        observer: CommandObserver | None = None,
    ) -> SlurmCli:
        return SlurmCli(commands, env=self.env, timeout_s=timeout_s, output=output, observer=observer)

    def command(self, *argv: str, timeout: float = 30.0) -> subprocess.CompletedProcess[str]:
        """A helper command for test set-up (not the code under test)."""
        return subprocess.run(list(argv), env=self.env, capture_output=True, text=True, timeout=timeout, check=False)

    def ctld_pid(self) -> int | None:
        if self.directory is None:
            return None
        pidfile = self.directory / "run" / "slurmctld.pid"
        try:
            pid = int(pidfile.read_text())
            os.kill(pid, 0)
        except (OSError, ValueError):
            return None
        return pid

    def start(self) -> None:
        """``slurm-test-cluster.sh start``: restarts whatever of the cluster is not running."""
        done = subprocess.run(
            [str(CLUSTER_SCRIPT), "start"],
            env={**self.env, "HEALTHD_SLURM_DIR": str(self.directory)},
            capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr


def _no_cluster(why: str) -> NoReturn:
    """Skip; or, where a cluster is required (``HEALTHD_REQUIRE_SLURM=1``), fail."""
    if os.environ.get("HEALTHD_REQUIRE_SLURM") == "1":
        pytest.fail(f"HEALTHD_REQUIRE_SLURM=1 but {why}", pytrace=False)
    pytest.skip(why)


@pytest.fixture(scope="session")
def slurm_cluster() -> SlurmTestCluster:
    conf = os.environ.get("SLURM_CONF")
    if not conf or not Path(conf).is_file() or not shutil.which("sinfo"):
        _no_cluster(NO_CLUSTER)
    env = dict(os.environ)
    try:
        done = subprocess.run(
            ["sinfo", "--noheader", "--format=%n"], env=env, capture_output=True, text=True, timeout=15, check=False
        )
        version = subprocess.run(["sinfo", "--version"], env=env, capture_output=True, text=True, timeout=15)
    except subprocess.TimeoutExpired:
        _no_cluster(f"{NO_CLUSTER} (sinfo did not answer within 15 s)")
    if done.returncode != 0 or not done.stdout.strip():
        _no_cluster(f"{NO_CLUSTER} (sinfo: {done.stderr.strip() or 'no nodes'})")
    directory = Path(conf).resolve().parent.parent
    ours = (directory / "run" / "slurmctld.pid").is_file() and (directory / "munge").is_dir()
    listed = subprocess.run(["sinfo", "-h", "-N", "-o", "%N"], env=env, capture_output=True, text=True, timeout=15,
                            check=False)
    names = tuple(dict.fromkeys(listed.stdout.split()))
    return SlurmTestCluster(Path(conf), env, directory if ours else None, parse_version(version.stdout), names)


def wait_for(predicate: Callable[[], object], timeout: float, what: str) -> object:
    """``predicate()``'s first truthy value, polled every half second; fails after ``timeout`` s."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture
def cluster(slurm_cluster: SlurmTestCluster) -> Iterator[SlurmTestCluster]:
    """All nodes idle and undrained before and after the test (every job cancelled, the tests'
    reservation deleted)."""
    def reset() -> None:
        slurm_cluster.command("scancel", "--user=root")
        slurm_cluster.command("scontrol", "delete", "reservation=hd_test")
        for node in slurm_cluster.nodes:
            slurm_cluster.command("scontrol", "update", f"nodename={node}", "state=resume")
        wait_for(lambda: set(slurm_cluster.command("sinfo", "-h", "-N", "-p", "batch", "-o", "%t").stdout.split())
                 == {"idle"}, 60, "all nodes idle")

    reset()
    yield slurm_cluster
    reset()
