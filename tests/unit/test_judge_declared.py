"""Declared events (``healthd event start/end``, ``healthd.judge.sources.declared``): an operator says a class is
being changed, and its flags are held as an event's, by intent, across a restart, with no finding revived when
it ends; a failed check still counts; the command writes the store the daemon reads."""

from __future__ import annotations

from pathlib import Path

import pytest

from healthd import cli
from healthd.judge.model import JudgeOutput
from healthd.judge.persist import judge_declared, load_judge
from healthd.judge.sources.declared import ANY_PROBE
from healthd.model import Outcome
from healthd.store import Store
from tests.unit.test_judge_engine import CLASS, Fleet
from tests.unit.test_judge_passive import gpus_missing

SLOW = ("n00", "n01", "n02")


def stored_fleet(tmp_path: Path) -> Fleet:
    fleet = Fleet([f"n{i:02d}" for i in range(20)])
    fleet.store = Store(tmp_path / "h.db")
    fleet.store.upsert_nodes(fleet.nodes, seen_at=fleet.t)
    return fleet


def slow_rounds(fleet: Fleet, rounds: int) -> list[JudgeOutput]:
    return [fleet.feed([fleet.gemm(n, scale=0.6 if n in SLOW else 1.0) for n in fleet.names]) for _ in range(rounds)]


def declare(fleet: Fleet) -> JudgeOutput:
    assert fleet.store is not None
    return judge_declared(fleet.judge, fleet.store, now=fleet.t)


def test_a_declared_event_holds_the_class_across_a_restart_and_revives_nothing_when_it_ends(tmp_path: Path) -> None:
    fleet = stored_fleet(tmp_path)
    assert fleet.store is not None
    fleet.healthy_gemm_rounds()
    assert fleet.store.declare_event(CLASS, "driver 570 roll-out", at=fleet.t, by="ops")
    assert not fleet.store.declare_event(CLASS, "twice", at=fleet.t, by="ops")
    out = declare(fleet)
    assert [(e.node_class, e.probe, e.cause, e.active) for e in out.fleet_events] == \
        [(CLASS, ANY_PROBE, "declared", True)]
    assert "driver 570 roll-out" in out.fleet_events[0].text
    assert declare(fleet).fleet_events == [], "told again: nothing new"
    outs = slow_rounds(fleet, 2)
    fleet.judge = load_judge(fleet.store, fleet.judge.settings, now=fleet.t)
    assert [e.cause for e in fleet.judge.active_events()] == ["declared"]
    assert declare(fleet).fleet_events == []
    outs += slow_rounds(fleet, 4)
    assert [r.node for out in outs for r in out.recommendations] == []
    assert {fleet.judge.verdicts[(n, "gemm")].reason_code for n in SLOW} == {"fleet_event"}
    assert fleet.store.end_declared_event(CLASS, at=fleet.t, by="ops")
    out = declare(fleet)
    assert [(e.cause, e.active) for e in out.fleet_events] == [("declared", False)]
    assert fleet.store.fleet_events(active_only=True) == []
    outs = [fleet.feed([fleet.gemm(n) for n in fleet.names]) for _ in range(2)]
    assert [r.node for out in outs for r in out.recommendations] == []
    assert {fleet.judge.verdicts[(n, "gemm")].outcome for n in fleet.names} == {Outcome.PASS}


def test_without_a_declaration_the_same_nodes_are_recommended(tmp_path: Path) -> None:
    fleet = stored_fleet(tmp_path)
    fleet.healthy_gemm_rounds()
    declare(fleet)
    outs = slow_rounds(fleet, 6)
    assert {r.node for out in outs for r in out.recommendations} == set(SLOW)


def test_a_failed_check_still_counts_during_a_declared_event(tmp_path: Path) -> None:
    fleet = stored_fleet(tmp_path)
    assert fleet.store is not None
    fleet.healthy_gemm_rounds()
    fleet.store.declare_event(CLASS, "firmware", at=fleet.t, by="ops")
    declare(fleet)
    outs = [fleet.feed([gpus_missing(fleet, "n05")]) for _ in range(2)]
    assert [(r.node, r.reason_code) for out in outs for r in out.recommendations] == [("n05", "gpus_missing")]


def test_the_command_declares_lists_and_ends_through_the_store(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "healthd.toml"
    config.write_text(f'state_dir = "{tmp_path}"\n')
    Store(tmp_path / "healthd.sqlite").close()
    assert cli.main(["event", "start", "--class", CLASS, "--reason", "driver roll-out", "-c", str(config)]) == 0
    assert cli.main(["event", "start", "--class", CLASS, "--reason", "again", "-c", str(config)]) == 1
    assert cli.main(["event", "list", "-c", str(config)]) == 0
    assert f"{CLASS}\t" in capsys.readouterr().out
    store = Store(tmp_path / "healthd.sqlite")
    assert [(d.node_class, d.reason) for d in store.declared_events()] == [(CLASS, "driver roll-out")]
    assert cli.main(["event", "end", "--class", CLASS, "-c", str(config)]) == 0
    assert cli.main(["event", "end", "--class", CLASS, "-c", str(config)]) == 1
    assert store.declared_events() == []
    store.close()
