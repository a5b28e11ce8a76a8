"""The argv builders of the Slurm client: exact argv lists, validation before anything runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from healthd.cluster import slurm_argv as sa
from healthd.cluster.slurm_cli import SlurmCommands
from healthd.errors import InvalidNodeName

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "slurm" / "22.05"
WRAPPED = ["sudo", "-n", "/opt/slurm/bin/scontrol"]


def test_sinfo_and_squeue_argv() -> None:
    assert sa.version_argv(["sinfo"]) == ["sinfo", "--version"]
    assert sa.sinfo_json_argv(["/opt/slurm/bin/sinfo"]) == ["/opt/slurm/bin/sinfo", "--json"]
    assert sa.squeue_json_argv(["squeue"]) == ["squeue", "--json"]
    assert sa.sinfo_text_argv(["sinfo"]) == [
        "sinfo", "--noheader", "--all", "--Node", "--Format",
        "NodeList:|,StateComplete:|,Partition:|,Gres:|,Features:|,CPUs:|,User:|,TimeStamp:|,Reason:",
    ]  # fmt: skip
    assert sa.squeue_text_argv(["squeue"]) == [
        "squeue", "--noheader", "--all", "--states=all", "--Format",
        "JobID:|,State:|,exit_code:|,Reason:|,StartTime:|,EndTime:|,NodeList:|,Name:",
    ]  # fmt: skip


def test_fixtures_were_captured_with_these_argv() -> None:
    """A changed text format needs re-captured fixtures (tests/fixtures/slurm/22.05/capture.py)."""
    index = json.loads((FIXTURES / "index.json").read_text())
    builders = {
        "sinfo.json": sa.sinfo_json_argv,
        "sinfo.txt": sa.sinfo_text_argv,
        "squeue.json": sa.squeue_json_argv,
        "squeue.txt": sa.squeue_text_argv,
        "scontrol.txt": sa.scontrol_node_argv,
    }
    checked = 0
    for name, entry in index.items():
        suffix = name.split(".", 1)[1]
        if suffix in builders and not name.startswith("ctld_down"):
            command = builders[suffix]([entry["argv"][0]])
            assert entry["argv"] == command, name
            assert entry["rc"] == 0, name
            checked += 1
    assert checked == 4 * 3 + 3 * 2  # idle/busy/noresp/down nodes, idle/busy/jobs jobs


def test_sbatch_argv() -> None:
    script = Path("/var/lib/healthd/jobs/run-1.sh")
    assert sa.sbatch_argv(["sbatch"], script) == ["sbatch", "--parsable", "/var/lib/healthd/jobs/run-1.sh"]
    assert sa.sbatch_argv(["sbatch"], script, ["--job-name", "healthd.nccl", "--nodelist=node1"]) == [
        "sbatch", "--parsable", "--job-name", "healthd.nccl", "--nodelist=node1", "/var/lib/healthd/jobs/run-1.sh",
    ]  # fmt: skip
    with pytest.raises(TypeError, match="sequence of strings"):
        sa.sbatch_argv(["sbatch"], script, "--exclusive")
    with pytest.raises(TypeError, match="sequence of strings"):
        sa.sbatch_argv(["sbatch"], script, ["--time", 5])  # type: ignore[list-item]


def test_scancel_argv() -> None:
    assert sa.scancel_argv(["scancel"], ["12", "13_4", "14+1"]) == ["scancel", "12", "13_4", "14+1"]
    with pytest.raises(ValueError, match="at least one job id"):
        sa.scancel_argv(["scancel"], [])
    with pytest.raises(TypeError, match="not one string"):
        sa.scancel_argv(["scancel"], "12")
    for bad in ("", "12;13", "--user=root", "-1", "12 13", "abc"):
        with pytest.raises(ValueError, match="is not a Slurm job id"):
            sa.scancel_argv(["scancel"], ["12", bad])


def test_drain_and_undrain_argv() -> None:
    assert sa.drain_argv(WRAPPED, "gpu-a17", " healthd: nccl=busbw_low run=r-1 ") == [
        *WRAPPED, "update", "NodeName=gpu-a17", "State=DRAIN", "Reason=healthd: nccl=busbw_low run=r-1",
    ]  # fmt: skip
    assert sa.undrain_argv(["scontrol"], "node1") == ["scontrol", "update", "NodeName=node1", "State=UNDRAIN"]


@pytest.mark.parametrize("bad", ["", "node[1-2]", "node1 State=DOWN", "-node", "node1,node2", "a" * 64, "n;rm"])
def test_node_names_are_validated(bad: str) -> None:
    with pytest.raises(InvalidNodeName):
        sa.drain_argv(["scontrol"], bad, "healthd: x")
    with pytest.raises(InvalidNodeName):
        sa.undrain_argv(["scontrol"], bad)
    with pytest.raises(InvalidNodeName):
        sa.scontrol_node_argv(["scontrol"], bad)


@pytest.mark.parametrize("bad", ["", "   ", "healthd: a\nState=DOWN", "x\rY", "nul\0"])
def test_drain_reason_is_one_non_empty_line(bad: str) -> None:
    with pytest.raises(ValueError, match="drain reason"):
        sa.drain_argv(["scontrol"], "node1", bad)


def test_scontrol_node_argv() -> None:
    assert sa.scontrol_node_argv(["scontrol"]) == ["scontrol", "--oneliner", "show", "node"]
    assert sa.scontrol_node_argv(["scontrol"], "node3") == ["scontrol", "--oneliner", "show", "node", "node3"]


def test_commands_from_a_bin_dir() -> None:
    commands = SlurmCommands.in_dir(Path("/opt/slurm/bin"))
    assert commands == SlurmCommands(
        sinfo=("/opt/slurm/bin/sinfo",),
        squeue=("/opt/slurm/bin/squeue",),
        sbatch=("/opt/slurm/bin/sbatch",),
        scancel=("/opt/slurm/bin/scancel",),
        scontrol=("/opt/slurm/bin/scontrol",),
    )
    assert SlurmCommands().sinfo == ("sinfo",)
