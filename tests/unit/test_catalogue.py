from __future__ import annotations

import importlib
from pathlib import Path

import pytest

from healthd.cluster.local import probe_argv
from healthd.cluster.slurm import LaunchChoices
from healthd.config import NodeClassRule, Settings
from healthd.model import BundledRun, Node, ProbeJob
from healthd.node_class import DEFAULT_CLASS, class_of
from probes.__main__ import build_parser
from probes.catalogue import CATALOGUE, CHECK_COMMAND, CHECK_COMMON_OPTIONS, PROBE_NAMES, ProbeName, probe_spec


@pytest.mark.parametrize("name", list(ProbeName))
def test_every_probe_has_an_entry_and_a_module(name: ProbeName) -> None:
    spec = CATALOGUE[name]
    module = importlib.import_module(f"probes.{name.value}")
    assert spec.name is name and module.NAME is name
    wanted = ("HELP", "add_arguments", "run", "format_table") if spec.torch else ("register", "run")
    assert all(hasattr(module, attr) for attr in wanted), name


def test_names_are_plain_strings_in_catalogue_order() -> None:
    assert PROBE_NAMES == ("env", "nccl", "gemm", "ddp", "nccl_tests", "compute", "pipeline")
    assert all(type(n) is str for n in PROBE_NAMES)
    assert probe_spec("gemm") is CATALOGUE[ProbeName.GEMM] and probe_spec("param_comms") is None


def test_the_command_line_offers_every_probe() -> None:
    sub = next(a for a in build_parser()._actions if a.dest == "probe")
    assert tuple(sub.choices or ()) == (*PROBE_NAMES, CHECK_COMMAND)  # check: several probes, stored under theirs


def test_settings_know_every_probe() -> None:
    assert Settings(probes={name: {} for name in PROBE_NAMES}).probes.keys() == set(PROBE_NAMES)


@pytest.mark.parametrize("name", PROBE_NAMES)
def test_capabilities_reach_the_backends(name: str) -> None:
    spec = CATALOGUE[ProbeName(name)]
    argv = probe_argv("python", ProbeJob("r1", name, ("n1",), timeout_s=60.0), Path("/r/r1.json"), ranks=3)
    assert (argv[-2:] == ["--nproc", "3"]) is spec.local_ranks
    choices = LaunchChoices(probe_transport={name: ("IB",)})
    assert choices.expected_transport(name, None) == (("IB",) if spec.expect_transport else ())


def test_class_of() -> None:
    rules = [NodeClassRule(name="fat", gpus=8, features=["nvl"]), NodeClassRule(name="part", partition="p")]
    assert class_of(Node("a", "idle", gpus=8, gpu_type="h100", node_class="given"), rules) == "given"
    assert class_of(Node("a", "idle", gpus=8, gpu_type="h100", features=("nvl",)), rules) == "fat"
    assert class_of(Node("a", "idle", gpus=8, gpu_type="h100", partitions=("p",)), rules) == "part"
    assert class_of(Node("a", "idle", gpus=8, gpu_type="h100"), rules) == "h100x8"
    assert class_of(Node("a", "idle", gpus=4)) == "gpux4"
    assert class_of(Node("a", "idle")) == DEFAULT_CLASS == "cpu"


def test_a_check_job_runs_probes_check_with_each_run_and_its_options() -> None:
    job = ProbeJob("r1", "check", ("n1",), timeout_s=90.0, expect_gpus=2,
                   bundle=(BundledRun("r1", "env", (), 30.0), BundledRun("r2", "ddp", ("--steps", "3"), 60.0)))
    argv = probe_argv("python", job, Path("/r/r1.json"), ranks=3)
    assert argv == ["python", "-m", "probes", "check", "--probes", "env,ddp", "--run-ids", "env=r1,ddp=r2",
                    "--limits", "env=30,ddp=60", "--timeout", "90", "--output-dir", "/r", "--expect-gpus", "2",
                    "--arg", "ddp=--steps", "--arg", "ddp=3", "--nproc", "3"]
    only_env = ProbeJob("r1", "check", ("n1",), bundle=(BundledRun("r1", "env"), BundledRun("r2", "gemm")))
    assert "--nproc" not in probe_argv("python", only_env, None, ranks=3)  # no probe with local ranks
    assert "--output-dir" not in probe_argv("python", only_env, None, ranks=3)  # no result path: stdout


def test_the_common_options_a_check_takes_once_are_the_probes_common_options() -> None:
    from probes.__main__ import common_parser

    options = {o for action in common_parser()._actions for o in action.option_strings if o.startswith("--")}
    assert options == CHECK_COMMON_OPTIONS
