"""Hostile or absurd configuration (issue 19): numbers out of range, values sbatch would choke on, drain
reasons with control characters, files that break the TOML parser on reload, ingest past a bad file."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

import pytest

from healthd.cluster.slurm_argv import drain_argv
from healthd.commands.ingest import cmd_ingest
from healthd.config import MAX_SECONDS, Settings, load_settings
from healthd.daemon import Daemon
from healthd.errors import ConfigError
from healthd.remediation.apply import call_backend
from healthd.remediation.decide import MAX_REASON, BackendCall, drain_reason, one_line_reason
from healthd.store.rows import RecommendationRow
from tests.fakes.slurm import FakeSlurmClient, fake_backend, gpu_node

REPO = Path(__file__).resolve().parents[2]
GEMM = REPO / "tests" / "fixtures" / "tools" / "param" / "compute_gemm_readme_cpu_gflops.txt"


def write(tmp_path: Path, text: str | bytes, name: str = "healthd.toml") -> Path:
    path = tmp_path / name
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    return path


def test_what_slurm_accepts_is_accepted(tmp_path: Path) -> None:
    settings, _ = load_settings(write(tmp_path, '[slurm]\npartition = "gpu,debug"\nqos = "high-prio_1.x"\n'
                                                'account = "ops"\nreservation = "maint,healthd"\n'
                                                'extra_sbatch_args = ["--hold", "--comment=probe", "--gres=gpu:8"]\n'
                                                'exclude_nodes = ["n[1-3,7]"]\n'
                                                "[scheduler]\ncollect_interval_s = 0.5\n"))
    assert settings.slurm.partition == "gpu,debug"
    assert settings.slurm.extra_sbatch_args == ["--hold", "--comment=probe", "--gres=gpu:8"]
    assert Settings(scheduler={"housekeeping_interval_s": MAX_SECONDS}).scheduler.housekeeping_interval_s == MAX_SECONDS


def test_environment_values_are_bounded_too(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HEALTHD_SCHEDULER__COLLECT_INTERVAL_S", "inf")
    with pytest.raises(ConfigError, match="collect_interval_s: Input should be a finite number"):
        load_settings(None)


def test_invalid_utf8_and_deep_nesting_are_config_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not UTF-8"):
        load_settings(write(tmp_path, b"[http]\nhost = \"\xff\xfe\"\n"))
    with pytest.raises(ConfigError, match="nested too deeply"):
        load_settings(write(tmp_path, "x = " + "[" * 3000 + "]" * 3000 + "\n"))


@pytest.fixture
def daemon(tmp_path: Path) -> Any:
    fake = FakeSlurmClient([gpu_node("n1")])
    config = write(tmp_path, f'backend = "slurm"\nstate_dir = "{tmp_path / "state"}"\n'
                             '[http]\nhost = "127.0.0.1"\nport = 0\n')
    settings, path = load_settings(config)
    d = Daemon(settings, path, backend=fake_backend(fake, settings.results_dir))
    yield d
    d.http._server.server_close()
    d.store.close()


def _refusals(d: Daemon) -> float:
    return d.registry.get_sample_value("healthd_errors_total", {"kind": "config_reload"}) or 0.0


@pytest.mark.parametrize(
    "content",
    [b"[http]\nhost = \"\xff\"\n", ("x = " + "[" * 3000 + "]" * 3000 + "\n").encode(),
     b"[scheduler]\ncollect_interval_s = 1e20\n", b"[probes.gemm]\ntimeout_s = inf\n", b"[[[", None],
    ids=["invalid-utf8", "deep-array", "huge-interval", "inf-timeout", "bad-toml", "deleted"],
)
def test_reload_refuses_anything_invalid_and_keeps_the_old_config(daemon: Daemon, content: bytes | None) -> None:
    old = daemon.settings
    assert daemon.config_path is not None
    if content is None:
        daemon.config_path.unlink()
    else:
        daemon.config_path.write_bytes(content)
    daemon.reload()
    assert daemon.settings is old
    assert _refusals(daemon) == 1


def test_reload_survives_an_unexpected_exception(daemon: Daemon, monkeypatch: pytest.MonkeyPatch) -> None:
    old = daemon.settings

    def boom(path: object) -> object:
        raise RuntimeError("something nobody expected")

    monkeypatch.setattr("healthd.daemon.load_settings", boom)
    daemon.reload()
    assert daemon.settings is old and _refusals(daemon) == 1


def test_a_reload_that_fails_half_applied_restores_the_old_config(daemon: Daemon,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    old = daemon.settings
    assert daemon.config_path is not None
    daemon.config_path.write_text(daemon.config_path.read_text() + "[judge]\nnoise_band = 0.05\n")
    monkeypatch.setattr(daemon.scheduler, "reschedule_job", lambda *a, **k: None)
    real = daemon.judge.reconfigure

    def reconfigure(judge: Any) -> None:
        if judge.noise_band == 0.05:
            raise RuntimeError("cannot apply")
        real(judge)

    monkeypatch.setattr(daemon.judge, "reconfigure", reconfigure)
    daemon.reload()
    assert daemon.settings is old and _refusals(daemon) == 1


def _rec(series: str) -> RecommendationRow:
    evidence = {"run_ids": ["r1\nr2"], "findings": [{"series": series, "value": 1.0, "threshold": 2.0}]}
    return RecommendationRow(1, "n1", "gemm", "fail", "below_floor", "slow", evidence, 0.0, 0.0, "active", None, "",
                             False, "")


@pytest.mark.parametrize("series", ["gemm flop_per_second{dtype=bf16\nState=RESUME}", "x\r\0\x1b[31m\u2028y",
                                    "z" * 5000])
def test_drain_reasons_are_one_bounded_printable_line(series: str) -> None:
    reason = drain_reason("healthd:", _rec(series))
    assert reason.startswith("healthd: below_floor gemm ")
    assert reason.isprintable() and len(reason) <= MAX_REASON
    argv = drain_argv(["scontrol"], "n1", reason)
    assert argv[-1] == f"Reason={reason}"


def test_one_line_reason_keeps_printable_text() -> None:
    assert one_line_reason("healthd: below_floor gemm run r1") == "healthd: below_floor gemm run r1"
    assert one_line_reason("a\tb\nc") == "a b c"


class _Refusing:
    def drain(self, node: str, reason: str) -> None:
        drain_argv(["scontrol"], node, reason)

    def undrain(self, node: str) -> None:
        raise AssertionError


def test_a_drain_argument_slurm_cannot_take_is_refused_not_a_crash() -> None:
    result = call_backend(_Refusing(), BackendCall("drain", "n1", "bad\nreason"))  # type: ignore[arg-type]
    assert result.result == "refused" and "one line" in result.message


def test_ingest_goes_on_past_a_bad_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    fifo = tmp_path / "fifo.txt"
    os.mkfifo(fifo)
    boom = tmp_path / "boom.txt"
    boom.write_text("anything\n")
    import healthd.commands.ingest as ingest_cmd

    real_prepare = ingest_cmd.prepare

    def prepare(data: bytes, **kwargs: Any) -> Any:
        if kwargs["name"] == str(boom):
            raise RuntimeError("parser blew up")
        return real_prepare(data, **kwargs)

    monkeypatch.setattr(ingest_cmd, "prepare", prepare)
    config = write(tmp_path, f'backend = "local"\nstate_dir = "{tmp_path / "state"}"\n')
    args = argparse.Namespace(config=str(config), tool="param-compute", node="n9", time=1714564800.0,
                              files=[fifo, boom, tmp_path, GEMM])
    assert cmd_ingest(args) == 1
    out, err = capsys.readouterr()
    assert err.splitlines() == [f"{fifo}: cannot read: not a regular file",
                                f"{boom}: not stored: RuntimeError: parser blew up",
                                f"{tmp_path}: cannot read: Is a directory"]
    assert out.splitlines()[-1].startswith(f"{GEMM}: stored run ")
    assert "outcome pass, 16 measurements" in out
