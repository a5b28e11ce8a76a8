"""NVSwitch errors (SXid lines of ``nvidia-nvswitch*`` in the kernel log) at the node check: read from the same
``/dev/kmsg`` read as the XIDs, since the last check; a fatal one fails an NVSwitch system (exit 1), a non-fatal
one is a hint the daemon answers with a probe of the node. Fixtures: tests/fixtures/kmsg (real lines)."""

from __future__ import annotations

from pathlib import Path

import pytest

import probes.boundary as b
from healthd.judge.model import MeasurementInput, RunInput
from healthd.model import Outcome, RunKind
from tests.probes.test_boundary import setup
from tests.unit.test_judge_engine import Fleet

KMSG = Path(__file__).resolve().parents[1] / "fixtures" / "kmsg"


def test_sxid_lines_are_one_event_each_with_the_fatality_a_line_states() -> None:
    boot = b.parse_sxids((KMSG / "sxid-nonfatal-boot.kmsg").read_text())
    assert [(x.switch, x.pci, x.code, x.fatal) for x in boot] == [
        ("nvidia-nvswitch3", "PCI:0000:04:00.0", 22013, False), ("nvidia-nvswitch3", "PCI:0000:04:00.0", 22013, False)]
    assert boot[0].seq == 1201 and "Link 44 Minion Link DLREQ interrupt" in boot[0].line
    [fatal] = b.parse_sxids((KMSG / "sxid-fatal.kmsg").read_text())
    assert (fatal.code, fatal.fatal, fatal.seq) == (12028, True, 5301)
    assert b.parse_kmsg((KMSG / "sxid-fatal.kmsg").read_text())[0].xid == 45  # the XID parser ignores SXids
    only_data = "3,7,1,-;nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 20034, Data {0x1, 0x2}\n"
    assert [x.fatal for x in b.parse_sxids(only_data)] == [None]
    many = "".join(f"3,{i},1,-;nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 22013, Non-fatal, Link {i} x\n"
                   for i in range(500))
    assert len(b.parse_sxids(many)) == b.MAX_SXIDS


def test_a_fatal_sxid_fails_an_nvswitch_system_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    s = setup(tmp_path, context="prolog", expect_gpus=None, job_id=None, job_uid=None, nvswitch=True,
              fabric=lambda: [])
    s.kmsg.write_text((KMSG / "sxid-fatal.kmsg").read_text())
    first = b.run_checks(s, b.Budget(5.0))
    [bad] = b.broken(first)
    assert bad.name == "boundary.sxid" and "12028, Fatal, Link 32 egress non-posted PRIV error" in bad.detail
    assert first.info["sxids_since_last_check"] == [12028]
    again = b.run_checks(s, b.Budget(5.0))
    assert not b.broken(again) and [c.detail for c in again.checks if c.name == "boundary.sxid"] == [
        "no fatal SXid since the last check (0 other)"]


def test_non_fatal_sxids_and_any_sxid_off_an_nvswitch_class_are_hints(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    s = setup(tmp_path, context="prolog", expect_gpus=None, job_id=None, job_uid=None, nvswitch=True,
              fabric=lambda: [])
    s.kmsg.write_text((KMSG / "sxid-nonfatal-boot.kmsg").read_text())
    f = b.run_checks(s, b.Budget(5.0))
    assert not b.broken(f)
    assert [(m.name, m.value) for m in f.measurements if m.name.startswith("nvswitch")] == [
        ("nvswitch_sxid_nonfatal", 2.0)]
    (tmp_path / "plain").mkdir()
    plain = setup(tmp_path / "plain", context="prolog", expect_gpus=None, job_id=None, job_uid=None)
    plain.kmsg.write_text((KMSG / "sxid-fatal.kmsg").read_text())
    g = b.run_checks(plain, b.Budget(5.0))
    assert not b.broken(g) and g.info["sxid_hints"][0].startswith("nvidia-nvswitch1: SXid (PCI:0000:84:00.0): 12028")


def test_the_daemon_answers_new_non_fatal_sxids_with_a_probe_of_the_node() -> None:
    fleet = Fleet([f"n{i}" for i in range(4)])
    fleet.healthy_gemm_rounds()

    def doc(k: int, count: float) -> RunInput:
        ms = (MeasurementInput("nvswitch_sxid_nonfatal", count, {}, "n2"),) if count else ()
        return RunInput(f"boundary-n2-epilog-{k}-1", "boundary", ("n2",), Outcome.PASS, "", fleet.t, ms,
                        kind=RunKind.BOUNDARY)

    quiet = fleet.feed([doc(1, 0)], advance=60)
    assert quiet.requests == []
    out = fleet.feed([doc(2, 2.0)], advance=60)
    assert [(r.kind, r.probe, r.nodes) for r in out.requests] == [("reprobe", "boundary", ("n2",))]
    assert "2 non-fatal NVSwitch error(s) (SXid)" in out.requests[0].reason
    assert out.recommendations == [] and fleet.judge.pending[("n2", "boundary")].reason == out.requests[0].reason
    assert fleet.feed([doc(3, 0)], advance=60).requests == []  # nothing new since: nothing asked
