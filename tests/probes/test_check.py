"""``python -m probes check``: several probes after one start-up, one document each."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from healthd.parsers.healthd_json import parse_result
from probes.__main__ import build_parser
from probes.check import build_parts
from probes.result import Outcome, ProbeResult
from tests.probes.helpers import dump, run_probe, run_torchrun

FOUR = ("env", "nccl", "gemm", "ddp")
SMALL = {
    "nccl": ["--sizes", "4K,64K", "--iters", "3", "--warmup", "1"],
    "gemm": ["--size", "256", "--iters", "3", "--warmup", "1", "--copy-bytes", "4M"],
    "ddp": ["--steps", "3", "--warmup", "1"],
}
"""Small runs of each probe (the same options alone and inside the check)."""


def _check_argv(*extra: str, probes: tuple[str, ...] = FOUR) -> list[str]:
    argv = ["check", "--device", "cpu", "--timeout", "100", "--probes", ",".join(probes), "--run-ids",
            ",".join(f"{n}={n}-run" for n in probes), *extra]
    for name in probes:
        for token in SMALL.get(name, []):
            argv += ["--arg", f"{name}={token}"]
    return argv


def _documents(stdout: str) -> list[ProbeResult]:
    return [parse_result(line) for line in stdout.splitlines() if line.strip()]


def _parse(argv: list[str]) -> list[tuple[str, dict[str, object]]]:
    parser = build_parser()
    args = parser.parse_args(argv)
    return [(p.probe.NAME.value, vars(p.args)) for p in build_parts(args, parser)]


def test_each_probe_gets_its_own_options_run_id_limit_and_output(tmp_path: Path) -> None:
    parts = _parse(["check", "--probes", "gemm,env", "--timeout", "50", "--nproc", "3",
                    "--run-ids", "gemm=g-1", "--limits", "gemm=20", "--output-dir", str(tmp_path),
                    "--arg", "gemm=--size", "--arg", "gemm=512"])
    assert [name for name, _ in parts] == ["gemm", "env"]
    gemm, env = parts[0][1], parts[1][1]
    assert (gemm["size"], gemm["run_id"], gemm["timeout"], gemm["nproc"]) == (512, "g-1", 20.0, 3)
    assert gemm["output"] == str(tmp_path / "g-1.json")
    assert (env["run_id"], env["timeout"], env["nproc"]) == (None, 50.0, 3)
    assert env["output"] == str(tmp_path / "env.json")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["check", "--probes", "env,nccl_tests"], "'nccl_tests' cannot run in a check"),
        (["check", "--probes", "env,env"], "a probe named twice"),
        (["check", "--probes", "env", "--arg", "env=--timeout", "--arg", "env=5"], "sets a common option (timeout)"),
        (["check", "--probes", "env", "--arg", "gemm=--size"], "--arg for a probe not in --probes"),
        (["check", "--probes", "env", "--run-ids", "gemm=x"], "--run-ids names probes not in --probes"),
        (["check", "--probes", "env", "--limits", "env=0"], "--limits env: must be > 0"),
        (["check", "--run-id", "x"], "use --run-ids and --output-dir"),
        (["check", "--arg", "gemm=--bogus"], "unrecognized arguments: --bogus"),
    ],
)
def test_usage_errors(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        _parse(argv)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def _shape(result: ProbeResult) -> tuple[object, ...]:
    return (
        result.probe,
        result.outcome,
        result.nodes,
        sorted({(m.name, tuple(sorted(m.labels)), m.node) for m in result.measurements}),
        sorted((c.name, c.ok, c.gpu, c.node) for c in result.checks),
        sorted(k for k in result.params if k != "check"),
        result.environment is not None,
    )


@pytest.mark.slow
def test_check_documents_equal_the_single_probe_ones_in_shape(tmp_path: Path) -> None:
    run = run_probe(_check_argv("--output-dir", str(tmp_path)), timeout=150)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout == ""
    docs = [parse_result((tmp_path / f"{name}-run.json").read_text()) for name in FOUR]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(f"{n}-run.json" for n in FOUR)
    for name, doc in zip(FOUR, docs, strict=True):
        assert (doc.probe, doc.run_id, doc.outcome) == (name, f"{name}-run", Outcome.PASS), dump(doc)
        alone = run_probe([name, "--device", "cpu", "--run-id", "alone", *SMALL.get(name, [])], timeout=100)
        assert alone.returncode == 0, alone.stderr[-3000:]
        assert _shape(doc) == _shape(parse_result(alone.stdout))
        assert doc.params["check"]["probes"] == list(FOUR)
    first, *rest = docs
    assert first.startup_seconds is not None and first.startup_seconds > 0.5  # import torch, rendezvous
    assert first.params["check"]["startup_shared"] is False
    for before, doc in zip(docs, rest, strict=False):
        assert doc.startup_seconds == 0.0 and doc.params["check"]["startup_shared"] is True
        assert before.finished_at <= doc.started_at < doc.finished_at  # each its own part, in order


@pytest.mark.slow
def test_a_probe_body_that_raises_is_an_error_and_the_others_still_run() -> None:
    run = run_probe(_check_argv(), env={"HEALTHD_PROBE_FAULT": "raise:0,raise:1",
                                       "HEALTHD_PROBE_FAULT_PROBES": "gemm"}, timeout=150)
    assert run.returncode == 1, run.stderr[-3000:]
    docs = {d.probe: d for d in _documents(run.stdout)}
    assert list(docs) == list(FOUR)
    gemm = docs.pop("gemm")
    assert gemm.outcome is Outcome.ERROR and gemm.run_id == "gemm-run"
    assert gemm.reason == ("rank 0: RuntimeError: injected fault: the probe body raised; "
                           "rank 1: RuntimeError: injected fault: the probe body raised")
    for doc in docs.values():
        assert doc.outcome is Outcome.PASS, dump(doc)


@pytest.mark.slow
def test_a_hung_probe_ends_at_its_limit_and_the_later_ones_are_not_run() -> None:
    run = run_probe(_check_argv("--limits", "nccl=6"), env={"HEALTHD_PROBE_FAULT": "hang:1",
                                                            "HEALTHD_PROBE_FAULT_PROBES": "nccl"}, timeout=150)
    assert run.returncode == 1, run.stderr[-3000:]
    docs = {d.probe: d for d in _documents(run.stdout)}
    assert list(docs) == list(FOUR)
    assert docs["env"].outcome is Outcome.PASS
    nccl = docs["nccl"]
    assert nccl.outcome is Outcome.ERROR
    assert "rank 1 (node" in nccl.reason and "within its 6 s limit in the check" in nccl.reason
    assert nccl.finished_at - nccl.started_at < 15
    for name in ("gemm", "ddp"):
        assert docs[name].outcome is Outcome.ERROR and docs[name].run_id == f"{name}-run"
        assert docs[name].reason.startswith("not run: the check stopped in probe nccl: rank 1")


@pytest.mark.slow
def test_check_under_torchrun_writes_each_document(tmp_path: Path) -> None:
    run = run_torchrun(2, _check_argv("--output-dir", str(tmp_path), probes=("env", "gemm")))
    assert run.returncode == 0, run.stderr[-3000:]
    for name in ("env", "gemm"):
        doc = ProbeResult.model_validate(json.loads((tmp_path / f"{name}-run.json").read_text()))
        assert (doc.probe, doc.outcome) == (name, Outcome.PASS), dump(doc)
        assert doc.environment is not None and doc.environment.launcher == "torchrun"
        assert len(doc.environment.ranks) == 2
