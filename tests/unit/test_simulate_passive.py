"""Passive signals in ``healthd simulate`` (issue 29): the simulated site Prometheus answers the real passive
source, the real judge weighs it with the probes; a true fault is found through it, nothing else is drained."""

from __future__ import annotations

from pathlib import Path

import pytest

from healthd.errors import ConfigError
from healthd.simulate import Scenario, load_scenario, simulate
from healthd.simulate_passive import SimPrometheus

SMALL = Path(__file__).resolve().parents[2] / "bench" / "scenarios" / "small-24.toml"


def scenario(**passive_and_faults: object) -> Scenario:
    base = load_scenario(SMALL).model_dump()
    base.update({"rounds": 6, "faults": [], "events": [], "users": [], "admin_drains": [], **passive_and_faults})
    return Scenario(**base)


def test_a_lost_gpu_with_its_xid_is_found_through_the_signal_and_nothing_else_is_drained(tmp_path: Path) -> None:
    run = scenario(
        faults=[{"kind": "gpus_missing", "node": "n07", "visible_gpus": 7, "from_round": 3}],
        passive=[{"kind": "xid", "nodes": ["n07"], "gpu": 2, "xid": 79, "from_round": 3},
                 {"kind": "xid", "nodes": ["n03"], "gpu": 1, "xid": 79, "from_round": 3},  # probes keep passing
                 {"kind": "xid", "nodes": ["n10", "n11"], "xid": 13, "from_round": 2},
                 {"kind": "stale_xid", "nodes": ["n12", "n13", "n14"], "xid": 79},
                 {"kind": "throttle", "node_class": "h100x8", "share": 0.5, "gpu": 4, "from_round": 2},
                 {"kind": "exporter_missing", "nodes": ["n20", "n21"]}])
    report = simulate(run, echo=False, workdir=tmp_path)
    assert [(n, c) for _, n, c in report.passive_recommendations] == [("n07", "xid_79")]
    (found,) = report.faults
    assert found.found_round == 3 and found.named_right
    assert report.false_drains == [] and report.false_recommendations == []


def test_the_simulated_prometheus_answers_like_the_real_one() -> None:
    run = scenario(passive=[{"kind": "stale_xid", "nodes": ["n01"], "xid": 48}])
    prom = SimPrometheus({"n01": 2, "n02": 2}, run.passive, {"h100x8": ["n01", "n02"]})
    import json

    answer = json.loads(prom.query("DCGM_FI_DEV_XID_ERRORS or DCGM_EXP_XID_ERRORS_COUNT"))
    values = {(r["metric"]["Hostname"], r["metric"]["gpu"]): r["value"][1] for r in answer["data"]["result"]}
    assert values == {("n01", "0"): "48.0", ("n01", "1"): "0.0", ("n02", "0"): "0.0", ("n02", "1"): "0.0"}
    assert json.loads(prom.query("DCGM_FI_DEV_ROW_REMAP_PENDING"))["data"]["result"] == []  # not exported


def test_a_passive_signal_on_an_unknown_node_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "s.toml"
    path.write_text(SMALL.read_text() + '\n[[passive]]\nkind = "xid"\nnodes = ["nope"]\n')
    with pytest.raises(ConfigError, match="passive: no node 'nope'"):
        load_scenario(path)


def test_ports_and_a_held_brake_through_the_simulated_site(tmp_path: Path) -> None:
    """node_exporter's InfiniBand series (healthd.simulate_passive.IbSite) through the real fabric source: a
    flap alone, a reboot, an exporter restart, a cleared and a saturated counter drain nothing; a brake held on
    a busy GPU (whose GEMM is slow) is found as ``throttle_power_brake`` on that GPU."""
    run = scenario(
        faults=[{"kind": "gpu", "node": "n09", "gpu": 2, "probe": "gemm", "name": "flop_per_second", "factor": 0.9,
                 "from_round": 2}],
        passive=[{"kind": "ib_flap", "nodes": ["n05"], "device": "mlx5_1", "from_round": 2, "repeat_rounds": 1},
                 {"kind": "reboot", "nodes": ["n06"], "from_round": 3},
                 {"kind": "node_exporter_restart", "nodes": ["n07"], "from_round": 2, "until_round": 3},
                 {"kind": "ib_saturated", "nodes": ["n08"], "device": "mlx5_0", "from_round": 2},
                 {"kind": "ib_reset", "nodes": ["n00"], "from_round": 3},
                 {"kind": "throttle", "nodes": ["n09"], "gpu": 2, "bits": 0x80, "busy": True, "from_round": 2}])
    report = simulate(run, echo=False, workdir=tmp_path)
    assert {(n, c) for _, n, c in report.passive_recommendations} == {("n09", "throttle_power_brake")}
    (found,) = report.faults
    assert found.found_round is not None and found.named_right
    assert report.false_drains == [] and report.false_recommendations == []
