"""``healthd replay``: the stored history of a simulated fleet re-judged with another config."""

from __future__ import annotations

from pathlib import Path

import pytest

from healthd.cli import main
from healthd.commands.simulate import parse_when
from healthd.config import Settings
from healthd.errors import ConfigError, HealthdError
from healthd.replay import format_replay, replay, to_dict
from healthd.simulate import load_scenario, simulate
from healthd.store import Store

REPO = Path(__file__).resolve().parents[2]
LOOSE = """
[judge]
default_floors = false
[judge.baseline]
drift_fraction = 0.9
[judge.fleet]
min_deviation = 0.9
"""


@pytest.fixture(scope="module")
def history(tmp_path_factory: pytest.TempPathFactory) -> Path:
    workdir = tmp_path_factory.mktemp("sim")
    scenario = load_scenario(REPO / "bench" / "scenarios" / "small-24.toml").model_copy(update={"rounds": 6})
    simulate(scenario, echo=False, workdir=workdir)
    return workdir / "sim.sqlite"


def test_a_looser_config_would_have_missed_the_slow_nodes_but_not_the_failed_check(history: Path) -> None:
    store = Store(history)
    loose = Settings(judge={"default_floors": False, "baseline": {"drift_fraction": 0.9},
                            "fleet": {"min_deviation": 0.9}})
    report = replay(store, Settings(), loose, since=0.0)
    store.close()
    assert report.runs > 150
    assert sorted(report.old.recommended) == [("n05", "gemm"), ("n11", "nccl"), ("n17", "nccl"), ("n20", "nccl")]
    assert sorted(report.new.recommended) == [("n20", "nccl")]  # a failed check needs no threshold
    changed = {(n, p): (a.outcome.value if a else None, b.outcome.value if b else None)
               for n, p, a, b in report.changed()}
    assert changed[("n05", "gemm")][0] == "fail" and changed[("n05", "gemm")][1] == "pass"
    assert changed[("n17", "nccl")] == ("degraded", "pass")
    text = format_replay(report)
    assert "recommended only with the old config: 3" in text and "recommended only with the new config: 0" in text
    assert to_dict(report)["runs"] == report.runs


def test_replay_command(history: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    new = tmp_path / "new.toml"
    new.write_text(LOOSE)
    current = tmp_path / "current.toml"
    current.write_text("")
    assert main(["replay", "--config", str(new), "--current", str(current), "--store", str(history),
                 "--since", "0"]) == 0
    out = capsys.readouterr().out
    assert f"  new: {new}" in out and "recommended only with the old config: 3" in out
    with pytest.raises(HealthdError, match="no finished runs in the store since"):
        store = Store(history)
        try:
            replay(store, Settings(), Settings(), since=4e9)
        finally:
            store.close()


def test_parse_when() -> None:
    now = 1_000_000.0
    assert parse_when("7d", now=now) == now - 7 * 86400
    assert parse_when("12h", now=now) == now - 12 * 3600
    assert parse_when("30m", now=now) == now - 1800
    assert parse_when("1700000000", now=now) == 1_700_000_000.0
    assert parse_when("2023-11-14T22:13:20", now=now) == 1_700_000_000.0
    assert parse_when("2023-11-14T23:13:20+01:00", now=now) == 1_700_000_000.0
    with pytest.raises(ConfigError, match="cannot read 'last week' as a time"):
        parse_when("last week", now=now)
