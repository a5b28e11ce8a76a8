"""What the README's commands meet on a machine that never ran them (issue 36): no marked /etc/hosts line,
no cache, no state. The whole path is proven by scripts/pristine-check.sh on a pristine root (.ci/run);
these are its fast parts."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CLUSTER = REPO / "scripts" / "slurm-test-cluster.sh"
MARK = "# healthd-slurm-test-cluster"


def add_hosts(hosts: Path, nodes: int) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HEALTHD_SLURM_HOSTS_FILE": str(hosts), "HEALTHD_SLURM_NODES": str(nodes)}
    return subprocess.run([str(CLUSTER), "hosts"], env=env, capture_output=True, text=True, timeout=30)


@pytest.mark.parametrize("before", ["", "127.0.0.1\tlocalhost\n::1\tlocalhost\n"], ids=["empty", "as-a-new-machine"])
def test_a_hosts_file_without_our_line_gets_it(tmp_path: Path, before: str) -> None:
    hosts = tmp_path / "hosts"
    hosts.write_text(before)
    done = add_hosts(hosts, 3)
    assert done.returncode == 0, done.stderr
    assert hosts.read_text() == before + f"127.0.0.1 node1 node2 node3 {MARK}\n"


def test_the_line_keeps_other_clusters_nodes_and_a_second_run_changes_nothing(tmp_path: Path) -> None:
    hosts = tmp_path / "hosts"
    hosts.write_text(f"127.0.0.1 localhost\n127.0.0.1 node1 node9 {MARK}\n")
    assert add_hosts(hosts, 3).returncode == 0
    want = f"127.0.0.1 localhost\n127.0.0.1 node1 node2 node3 node9 {MARK}\n"
    assert hosts.read_text() == want
    assert add_hosts(hosts, 2).returncode == 0
    assert hosts.read_text() == want


def test_a_hosts_file_with_only_our_line_is_updated(tmp_path: Path) -> None:
    hosts = tmp_path / "hosts"
    hosts.write_text(f"127.0.0.1 node1 {MARK}\n")
    assert add_hosts(hosts, 2).returncode == 0
    assert hosts.read_text() == f"127.0.0.1 node1 node2 {MARK}\n"


def test_the_start_scripts_say_which_step_failed() -> None:
    """A command failing under `set -e` outside a check ends a start script: each names the line and command
    (an ERR trap inherited by functions), so no failure is silent as issue 36's was."""
    for name in ("test.sh", "slurm-test-cluster.sh", "install-debian-deps.sh", "pristine-check.sh"):
        text = (REPO / "scripts" / name).read_text()
        assert re.search(r"^set -Eeuo pipefail$", text, re.MULTILINE), name
        assert re.search(r"^trap '.*error: line .*\$LINENO.*\$BASH_COMMAND.*' ERR$", text, re.MULTILINE), name


def test_ci_runs_the_pristine_check_before_the_readme_test_command() -> None:
    lines = [line.strip() for line in (REPO / ".ci" / "run").read_text().splitlines() if not line.startswith("#")]
    check = next(i for i, line in enumerate(lines) if "scripts/pristine-check.sh" in line)
    suite = next(i for i, line in enumerate(lines) if line.endswith("scripts/test.sh"))
    assert check < suite
