"""Reboot and validate (``healthd.remediation.repair``) with a real store and the Slurm backend over a fake
Slurm (``FakeSlurmClient`` models what 22.05 did on the lab cluster: the reboot clears the drain and brings
the node back DOWN, or IDLE with ``ReturnToService=2``). The lab-cluster test is
``tests/integration/test_repair_slurm.py``."""

from __future__ import annotations

from pathlib import Path

import pytest

from healthd.cluster import slurm_argv as argv
from healthd.config import RemediationSettings
from healthd.errors import ConfigError
from healthd.judge.model import JudgeOutput, Mark, ReasonCode, RecommendationCandidate, Severity
from healthd.model import Outcome
from healthd.remediation import Remediator, recommendations_document
from healthd.store import Store
from tests.fakes.slurm import FakeSlurmClient, fake_backend, gpu_node
from tests.golden_files import assert_golden
from tests.old_stores import store_at

T0 = 1_000_000.0
REPAIR = {"repair": "reboot", "recheck_drained": True, "undrain_after_passes": 2}


class Rig:
    def __init__(self, tmp_path: Path, **settings: object) -> None:
        self.slurm = FakeSlurmClient([gpu_node(f"n{i:02d}") for i in range(10)])
        self.cluster = fake_backend(self.slurm, tmp_path / "results")
        self.store = Store(tmp_path / "s.sqlite")
        self.now = T0
        self.settings = RemediationSettings(**{"mode": "enforce", **REPAIR, **settings})
        self.remediator = Remediator(self.store, self.cluster, self.settings, clock=lambda: self.now,
                                     full_check=("gemm", "nccl"))

    def tick(self, out: JudgeOutput | None = None, *, after: float = 31.0) -> list[tuple[str, str, str]]:
        self.now += after  # past the backend's node cache
        return [(a.action, a.node or "", a.result)
                for a in self.remediator.apply(out or JudgeOutput(at=self.now))]

    def confirm(self, node: str, code: ReasonCode = ReasonCode.HANG, probe: str = "gemm") -> list[tuple[str, str, str]]:
        out = JudgeOutput(at=self.now, evaluated={(node, probe)}, recommendations=[
            RecommendationCandidate(node, probe, Outcome.FAIL, code, f"{code.value} on {node}",
                                    {"run_ids": ["rp01"]}, self.now)])
        return self.tick(out, after=0.0)

    def results(self, node: str, severity: Severity, *probes: str) -> None:
        self.store.save_judgement(JudgeOutput(at=self.now, marks=[
            Mark(f"{p}{self.now}", node, p, self.now + 1, severity,
                 ReasonCode.OK if severity is Severity.NONE else ReasonCode.HANG, "", False) for p in probes]))
        self.now += 2

    def state(self, node: str) -> tuple[str, frozenset[str], str | None]:
        n = self.slurm.node(node)
        return n.state, n.flags, n.reason


def test_reboot_argv_golden() -> None:
    lines = [argv.reboot_argv(["scontrol"], "n3", "healthd: repair reboot hang"),
             argv.resume_argv(["scontrol"], "n3"),
             argv.show_config_argv(["sudo", "-n", "scontrol"])]
    assert_golden("scontrol_repair_argv.txt", "\n".join(" ".join(a) for a in lines) + "\n")
    with pytest.raises(ValueError, match="printable"):
        argv.reboot_argv(["scontrol"], "n3", "healthd: a\nb")


def test_a_hard_fault_is_rebooted_validated_and_returned_to_service(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    assert rig.confirm("n01") == [("recommend", "n01", "info"), ("drain", "n01", "done")]
    assert rig.tick() == [("repair", "n01", "done")]  # the next tick, from Slurm's state of the drain
    assert rig.slurm.commands[-3:] == [("drain", "n01", "healthd: hang gemm run rp01"),
                                       ("reserve", "healthd_recheck", "n01"),
                                       ("reboot", "n01", "healthd: repair reboot hang")]
    assert rig.remediator.recheck_nodes() == {}  # no recheck while it reboots
    assert rig.tick() == []  # still rebooting
    rig.slurm.finish_reboot("n01")  # back DOWN, the drain cleared (22.05)
    assert rig.tick() == [("repair", "n01", "info")]
    assert rig.state("n01") == ("idle", frozenset({"DRAIN"}), "healthd: repair validating hang after reboot")
    assert rig.slurm.commands[-3:] == [("resume", "n01"),
                                       ("drain", "n01", "healthd: repair validating hang after reboot"),
                                       ("delete_reservation", "healthd_recheck")]  # the drain holds it now
    assert rig.remediator.recheck_nodes() == {"n01": ("gemm", "nccl")}  # the full check
    started = rig.remediator.validating_since()["n01"]
    rig.results("n01", Severity.NONE, "gemm")
    assert rig.tick() == []  # nccl has not run yet
    rig.results("n01", Severity.NONE, "nccl")
    actions = rig.tick()
    assert actions[0] == ("undrain", "n01", "done") and actions[-1] == ("repair", "n01", "done")  # one pass enough
    assert rig.state("n01") == ("idle", frozenset(), None)
    (repair,) = rig.store.repairs()
    assert (repair.state, repair.kind, repair.probes, repair.validating_at) == ("passed", "reboot",
                                                                                 ("gemm", "nccl"), started)
    assert rig.store.audit(limit=1)[0].detail["in_service_after_s"] == pytest.approx(rig.now - repair.started_at)
    assert rig.remediator.repairs_open() == {}


def test_a_fault_that_survives_the_reboot_stays_drained_and_is_not_rebooted_again(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    rig.confirm("n02", ReasonCode.GPUS_MISSING)
    assert rig.tick() == [("repair", "n02", "done")]
    rig.slurm.finish_reboot("n02", return_to_service=True)  # ReturnToService=2: IDLE, still in the reservation
    assert rig.state("n02") == ("idle", frozenset(), "healthd: repair reboot gpus_missing : reboot issued : reboot "
                                                     "complete")  # 24.11 keeps the reason
    assert rig.tick() == [("repair", "n02", "info")]
    assert ("resume", "n02") not in rig.slurm.commands
    rig.results("n02", Severity.FAIL, "gemm")
    assert rig.tick() == [("repair", "n02", "failed")]
    reason = "healthd: repair failed gpus_missing after reboot: gemm hang in the full check"
    assert rig.state("n02")[2] == reason
    assert rig.slurm.reservations == {}
    (drain,) = rig.store.drains(open_only=True)
    assert (drain.reason, drain.probes) == (reason, ())  # no recheck, no undrain: left to humans
    assert rig.remediator.recheck_nodes() == {}
    rig.results("n02", Severity.NONE, "gemm", "nccl")
    assert rig.confirm("n02", ReasonCode.GPUS_MISSING) == []
    assert rig.tick(after=86400.0) == []
    assert [c for c in rig.slurm.commands if c[0] == "reboot"] == [("reboot", "n02",
                                                                    "healthd: repair reboot gpus_missing")]


def test_a_node_back_in_service_without_a_reason_is_back_too(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    rig.slurm.release = (22, 5, 8)  # 22.05 clears the reason when ReturnToService=2 returns the node
    rig.confirm("n02")
    rig.tick()
    rig.slurm.finish_reboot("n02", return_to_service=True)
    assert rig.state("n02") == ("idle", frozenset(), None)
    assert rig.tick() == [("repair", "n02", "info")]
    assert rig.state("n02")[2] == "healthd: repair validating hang after reboot"


def test_never_a_node_drained_by_someone_else_nor_a_kind_not_listed(tmp_path: Path) -> None:
    rig = Rig(tmp_path, repair_on=["hang"])
    rig.slurm.admin_drain("n03", "hw: bad PSU ticket 42")
    assert rig.confirm("n03") == [("recommend", "n03", "info"), ("drain", "n03", "refused")]
    assert rig.confirm("n04", ReasonCode.BELOW_FLOOR)[-1] == ("drain", "n04", "done")
    assert rig.tick() == []
    assert [c for c in rig.slurm.commands if c[0] in ("reboot", "reserve")] == []
    assert rig.state("n03")[2] == "hw: bad PSU ticket 42"


def test_someone_taking_the_node_during_its_repair_ends_it_untouched(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    rig.confirm("n05")
    rig.tick()
    rig.slurm.finish_reboot("n05")
    rig.slurm.admin_drain("n05", "RMA ticket 7")
    assert rig.tick() == [("repair", "n05", "failed")]
    assert rig.state("n05")[2] == "RMA ticket 7"
    assert rig.slurm.reservations == {}
    assert rig.store.repairs()[0].state == "failed"


def test_a_reboot_that_never_ends_fails_after_the_timeout(tmp_path: Path) -> None:
    rig = Rig(tmp_path, repair_timeout_s=600.0)
    rig.confirm("n06")
    rig.tick()
    assert rig.tick(after=601.0) == [("repair", "n06", "failed")]
    assert rig.state("n06")[2] == "healthd: repair failed hang after reboot: its reboot not over within 600 s"


def test_breaker_open_and_hourly_cap_hold_repairs_back(tmp_path: Path) -> None:
    rig = Rig(tmp_path, max_actions_per_hour=1)
    rig.confirm("n07")
    assert rig.tick() == [("repair", "n07", "refused")]  # the drain was the hour's one action
    assert next(a for a in rig.store.audit() if a.action == "repair").reason == (
        "hourly cap of 1 automatic actions reached; waiting")
    assert [c for c in rig.slurm.commands if c[0] == "reboot"] == []
    assert rig.tick() == []  # said once
    assert rig.tick(after=3600.0) == [("repair", "n07", "done")]


def test_recommend_mode_says_what_would_be_done(tmp_path: Path) -> None:
    rig = Rig(tmp_path, mode="recommend")
    assert rig.confirm("n08") == [("recommend", "n08", "info")]
    doc = recommendations_document(rig.store, rig.settings)
    assert doc["recommendations"][0]["repair"].startswith(
        "would drain n08, reboot it through Slurm (scontrol reboot ASAP nextstate=DOWN)")
    assert rig.slurm.commands == []


def test_repair_command_runs_the_sites_argv_with_the_node(tmp_path: Path) -> None:
    log = tmp_path / "bmc.log"
    rig = Rig(tmp_path, repair="command",
              repair_command=["/bin/sh", "-c", f'echo "power cycle $0" >> {log}', "{node}"])
    rig.confirm("n09")
    assert rig.tick() == [("repair", "n09", "done")]
    assert log.read_text() == "power cycle n09\n"
    assert rig.tick() == [("repair", "n09", "info")]  # the command returned: the node is back, still drained
    assert rig.state("n09")[2] == "healthd: repair validating hang after command"


def test_settings_refuse_a_repair_that_cannot_validate() -> None:
    with pytest.raises(ValueError, match="recheck_drained = true and undrain_after_passes >= 1"):
        RemediationSettings(mode="enforce", repair="reboot")
    with pytest.raises(ValueError, match="put '\\{node\\}'"):
        RemediationSettings(repair="command", repair_command=["/usr/local/sbin/bmc-cycle"])
    with pytest.raises(ValueError, match="never drains a node"):
        RemediationSettings(repair_on=["fleet_event"])
    assert ConfigError  # the loader turns these into ConfigError (tests/unit/test_config.py)


def test_a_version_14_store_keeps_its_drains_and_gains_repairs(tmp_path: Path) -> None:
    path = tmp_path / "old.sqlite"
    db = store_at(path, 14)
    db.execute("INSERT INTO drains (node, node_class, reason, actor, automatic, probes, drained_at) VALUES"
               " ('n01', 'h100x8', 'healthd: hang gemm run rp01', 'healthd', 1, '[\"gemm\"]', ?)", (T0,))
    db.commit()
    db.close()
    store = Store(path)
    (drain,) = store.drains(open_only=True)
    assert (drain.reason, drain.probes, drain.check_since, drain.checks_from) == (
        "healthd: hang gemm run rp01", ("gemm",), None, T0)
    assert store.repairs(open_too=True) == []
    rig = Rig(tmp_path)
    rig.store.close()
    rig.store = store
    rig.remediator = Remediator(store, rig.cluster, rig.settings, clock=lambda: rig.now, full_check=("gemm",))
    rig.slurm.drain("n01", drain.reason)
    store.upsert_recommendation(node="n01", probe="gemm", outcome="fail", reason_code="hang", text="hang on n01",
                                evidence={}, at=rig.now)
    assert rig.tick() == [("repair", "n01", "done")]  # an old store's drain is repaired like a new one
    assert store.repairs()[0].state == "rebooting"


def test_the_daemon_moves_a_repair_on_without_runs_and_plans_its_full_check_at_once(tmp_path: Path) -> None:
    """The daemon's ticks (``Daemon.collect``, ``Daemon.plan_and_launch``) over the Slurm backend and a fake
    Slurm: the reboot starts and the node's return is seen with no run collected, and the full check is
    submitted in healthd's reservation at once although gemm ran on the node minutes ago (its interval is an
    hour)."""
    import time

    from healthd.config import Settings
    from healthd.daemon import Daemon

    settings = Settings(backend="slurm", state_dir=tmp_path / "state", http={"host": "127.0.0.1", "port": 0},
                        probes={"gemm": {"interval_s": 3600.0, "timeout_s": 120.0}, "nccl": {"enabled": False}},
                        remediation={"mode": "enforce", **REPAIR})
    fake = FakeSlurmClient([gpu_node("gpu01"), gpu_node("gpu02")])
    d = Daemon(settings, None, backend=fake_backend(fake, settings.results_dir))
    try:
        d.discover()
        before = time.time() - 300
        d.store.add_run(run_id="r0", probe="gemm", nodes=["gpu01"], backend="slurm", job_id=None,
                        submitted_at=before, result_path=None)
        d.store.finish_run("r0", outcome=Outcome.FAIL, reason="hang on gpu01: stuck", finished_at=before + 60)
        now = time.time()
        d.remediator.apply(JudgeOutput(at=now, evaluated={("gpu01", "gemm")}, recommendations=[
            RecommendationCandidate("gpu01", "gemm", Outcome.FAIL, ReasonCode.HANG, "hang on gpu01",
                                    {"run_ids": ["r0"]}, now)]))
        assert fake.drains()[-1][0] == "gpu01"
        d.collect()  # nothing collected: the repair starts all the same
        assert ("reboot", "gpu01", "healthd: repair reboot hang") in fake.commands
        fake.finish_reboot("gpu01")
        d.collect()
        assert d.remediator.repairs_open() == {"gpu01": "validating"}
        d.plan_and_launch()
        (job,) = fake.jobs_by_id.values()
        assert (job.nodes, job.reservation) == (("gpu01",), "healthd_recheck")
        assert fake.reservations["healthd_recheck"].nodes == ("gpu01",)
    finally:
        d.http._server.server_close()
        d.store.close()
