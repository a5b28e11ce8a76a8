"""``healthd simulate``: scenarios through the real planner, collector, store, judge and remediation."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from healthd.cli import main
from healthd.cluster.base import ClusterBackend
from healthd.errors import ConfigError
from healthd.simulate import Scenario, SimCluster, format_report, load_scenario, simulate

REPO = Path(__file__).resolve().parents[2]
SMALL = REPO / "bench" / "scenarios" / "small-24.toml"
BENCH = REPO / "bench" / "scenarios" / "fleet-1000.toml"


@pytest.fixture(scope="module")
def small_report() -> object:
    return simulate(load_scenario(SMALL), echo=False)


def test_the_sim_cluster_is_a_cluster_backend() -> None:
    assert isinstance(SimCluster(load_scenario(SMALL)), ClusterBackend)


def test_small_scenario_finds_every_fault_and_drains_nothing_else(small_report: object) -> None:
    report = small_report
    rows = {(f.fault.kind, f.fault.node): f for f in report.faults}  # type: ignore[attr-defined]
    for kind, node in (("gpu", "n05"), ("node", "n11"), ("link", "n17"), ("check", "n20")):
        f = rows[(kind, node)]
        assert f.rounds_to_find is not None and f.rounds_to_find <= 2, (kind, node)
        assert f.named_right, (kind, node, f.detail)
        assert f.drained_round == f.found_round
    assert rows[("gpu", "n05")].detail == "gpu 2"
    assert rows[("link", "n17")].detail == "localised"  # the partner of the bad link is never blamed
    assert rows[("error", "n08")].found_round is None  # infrastructure errors: never recommended
    assert report.false_recommendations == [] and report.false_drains == []  # type: ignore[attr-defined]
    assert [(r, c, p) for r, c, p, _ in report.fleet_events] == [(7, "h100x8", "gemm")]  # type: ignore[attr-defined]
    assert report.event_drains == 0 and report.foreign_touched == []  # type: ignore[attr-defined]
    lines = {line.round: line for line in report.rounds}  # type: ignore[attr-defined]
    assert lines[9].undrained == ["n05"]  # repaired after round 5, rechecked, undrained (after the event)
    assert all("n22" not in line.drained for line in report.rounds)  # type: ignore[attr-defined]
    assert report.ok  # type: ignore[attr-defined]


def test_the_report_table(small_report: object) -> None:
    text = format_report(small_report)  # type: ignore[arg-type]
    assert "fault                        where            injected  found rounds  drained  named" in text
    assert "gpu gemm flop x0.5           n05 gpu 2               3      3      1        3  yes (gpu 2)" in text
    assert "link nccl busbw x0.4         n17                     3      3      1        3  yes (localised)" in text
    assert ("faults injected 4, found 4 (within 2 rounds 4), named right 4; false recommendations 0; "
            "false drains 0; fleet events raised 1; foreign drains touched 0") in text


def test_simulate_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # a subprocess: the command sets up logging for its process, which a test must not do to pytest's
    done = subprocess.run([sys.executable, "-m", "healthd.cli", "simulate", "--scenario", str(SMALL), "--quiet",
                           "--rounds", "4"], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert "round " not in done.stdout and "scenario small-24: 4 rounds of 900 s, 24 nodes" in done.stdout
    done = subprocess.run([sys.executable, "-m", "healthd.cli", "simulate", "--scenario", str(SMALL), "--json",
                           "--rounds", "4"], capture_output=True, text=True, timeout=120, check=False)
    doc = json.loads(done.stdout)
    assert doc["scenario"] == "small-24" and len(doc["rounds"]) == 4
    assert {f["node"]: f["found_round"] for f in doc["faults"]}["n05"] == 3
    bad = tmp_path / "bad.toml"
    bad.write_text('rounds = 2\n[[classes]]\nname = "x"\ncount = 2\n[[faults]]\nkind = "gpu"\nnode = "nope"\n'
                   'gpu = 1\nprobe = "gemm"\n')
    assert main(["simulate", "--scenario", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "faults: no node 'nope' in the scenario's classes" in err
    assert main(["simulate", "--scenario", str(SMALL), "--rounds", "0"]) == 2
    assert "--rounds must be at least 1" in capsys.readouterr().err


@pytest.mark.parametrize(("text", "message"), [
    ('[[classes]]\nname = "x"\ncount = 2\ntick_s = 5\n', "Extra inputs are not permitted"),
    ('tick_s = 1000\n[[classes]]\nname = "x"\ncount = 2\n', "tick_s is longer than round_s"),
    ('[[classes]]\nname = "x"\ncount = 2\n[[events]]\nnode_class = "y"\nprobe = "nccl"\nfactor = 0.5\n'
     'from_round = 2\n', "events: no class 'y'"),
    ('[[classes]]\nname = "x"\ncount = 2\n[[faults]]\nkind = "gpu"\nnode = "node0"\nprobe = "gemm"\n',
     "a gpu fault needs gpu = <index>"),
    ("rounds = [\n", "not valid TOML"),
    ("seed = 1\n", "classes: Field required"),
])
def test_scenario_errors_are_precise(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "s.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace("[", r"\[")):
        load_scenario(path)


def test_the_benchmark_scenario_is_what_the_issue_asks_for() -> None:
    scenario: Scenario = load_scenario(BENCH)
    (cls,) = scenario.classes
    assert (cls.count, cls.noise, cls.gpus) == (1000, 0.02, 8)
    kinds = [(f.kind, f.factor) for f in scenario.faults]
    assert kinds.count(("node", 0.85)) == 10
    assert kinds.count(("gpu", 0.5)) == 3 and all(f.name == "flop_per_second" for f in scenario.faults
                                                  if f.kind == "gpu")
    assert kinds.count(("link", 0.5)) == 1
    (event,) = scenario.events
    assert (event.factor, event.from_round) == (0.7, 9) and event.from_round > max(f.from_round for f in
                                                                                   scenario.faults)


@pytest.mark.slow
def test_the_benchmark_meets_its_goals() -> None:
    report = simulate(load_scenario(BENCH), echo=False)
    faults = [f for f in report.faults if f.fault.kind != "error"]
    assert len(faults) == 14
    assert all(f.rounds_to_find is not None and f.rounds_to_find <= 2 and f.named_right for f in faults)
    assert report.false_drains == [] and report.false_recommendations == []
    # the event hits NCCL's busbw on both scopes: one event per series, a node's own NVLink and the fabric
    assert sorted((c, p, t.split(": ")[2]) for _, c, p, t in report.fleet_events) == [
        ("h100x8", "nccl", f"busbw_bytes_per_second{{collective=all_reduce,scope={scope},size_bytes=1073741824}}"
                           f" (scope {scope})") for scope in ("group", "node")]
    assert report.event_drains == 0
    assert report.elapsed_s < 240


def test_a_job_ended_before_the_poll_writes_its_result_once(tmp_path: Path) -> None:
    """``end_due`` writes the results of the jobs whose time is up (outside the timed collect tick, as a
    node's probe does); ``poll`` then only reports them, and never rewrites a result."""
    from healthd.model import JobState, ProbeJob

    cluster = SimCluster(load_scenario(SMALL))
    node = sorted(cluster.nodes)[0]
    early, late = tmp_path / "early.json", tmp_path / "late.json"
    first = cluster.submit(ProbeJob(run_id="early", probe="gemm", nodes=(node,)), early)
    cluster.now += 10_000
    cluster.end_due([first])
    assert early.exists() and node not in cluster.running
    written = early.read_bytes()
    early.write_text("not rewritten")
    assert cluster.poll([first])[first].state is JobState.COMPLETED
    assert early.read_text() == "not rewritten"
    second = cluster.submit(ProbeJob(run_id="late", probe="gemm", nodes=(node,)), late)
    cluster.end_due([second])
    assert not late.exists() and cluster.running[node] == second
    cluster.now += 10_000
    assert cluster.poll([second])[second].state is JobState.COMPLETED and late.exists()
    assert json.loads(written)["run_id"] == "early"
