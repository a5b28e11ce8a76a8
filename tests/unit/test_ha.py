"""[ha]: its config and the epoch tag in drain reasons (the lease itself: tests/integration/test_ha_mariadb.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from healthd.config import HaSettings, Settings
from healthd.ha.fence import reason_epoch, tag_reason
from healthd.model import Node
from healthd.remediation import repair as rp


def test_off_by_default() -> None:
    s = Settings()
    assert s.ha.mode == "off" and s.ha.url is None
    assert s.ha.lease_ttl_s + s.ha.renew_interval_s < 60  # fails over in under a minute


@pytest.mark.parametrize(("kw", "message"), [
    ({"mode": "mariadb", "password_file": "/p"}, "needs ha.url"),
    ({"mode": "mariadb", "url": "mysql://h@db:3306/healthd"}, "needs ha.password_file"),
    ({"url": "mysql://h:secret@db:3306/healthd"}, "must not carry the password"),
    ({"url": "postgres://h@db/healthd"}, "is not mysql://USER@HOST:PORT/DATABASE"),
    ({"mode": "mariadb", "url": "mysql://h@db/x", "password_file": "/p", "lease_ttl_s": 10, "renew_interval_s": 6},
     "at most half"),
    ({"mode": "mariadb", "url": "mysql://h@db/x", "password_file": "/p", "lease_ttl_s": 10, "renew_interval_s": 5,
      "fence_margin_s": 5}, "must be below ha.lease_ttl_s"),
    ({"mode": "mariadb", "url": "mysql://h@db/x", "password_file": "/p", "hold": 1}, "Extra inputs"),
])
def test_config_errors_are_precise(kw: dict[str, object], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        HaSettings(**kw)  # type: ignore[arg-type]


def test_valid_mariadb_settings() -> None:
    s = HaSettings(mode="mariadb", url="mysql://healthd@db.example:3306/healthd", password_file=Path("/p"),
                   instance_id="admin1")
    assert (s.lease_ttl_s, s.renew_interval_s, s.fence_margin_s) == (45.0, 5.0, 30.0)


def test_fence_margin_covers_a_slurm_call() -> None:
    ha = {"mode": "mariadb", "url": "mysql://h@db/x", "password_file": "/p"}
    assert Settings(ha=ha).ha.fence_margin_s >= Settings().slurm.command_timeout_s  # type: ignore[arg-type]
    with pytest.raises(ValidationError, match=r"must be at least slurm\.command_timeout_s"):
        Settings(ha={**ha, "fence_margin_s": 5}, slurm={"command_timeout_s": 10})  # type: ignore[arg-type]


@pytest.mark.parametrize("reason", [
    "healthd: xid 79 gpu 3",
    rp.start_reason("healthd:", "reboot", "gpus_missing"),
    rp.failed_reason("healthd:", "reboot", "gpus_missing", "timeout"),
    "healthd: boundary epilog env.gpu_count: 0 GPU(s) visible run boundary-node2-1",
])
def test_epoch_tag_keeps_ownership(reason: str) -> None:
    tagged = tag_reason(reason, "healthd:", 42)
    assert tagged.startswith("healthd: [e42] ")
    assert reason_epoch(tagged, "healthd:") == 42 and reason_epoch(reason, "healthd:") is None
    assert tagged.replace(" [e42]", "") == reason
    assert tag_reason(tagged, "healthd:", 43) == tagged.replace("[e42]", "[e43]")  # one tag, the newest
    for r in (reason, tagged):  # owned with and without the tag
        node = Node(name="n1", state="drained", reason=r)
        assert node.owned_by("healthd:")
        assert rp.phase(node, "command", "healthd:") == "back"
    assert "repair failed" not in reason or "repair failed" in tagged


def test_epoch_tag_leaves_foreign_reasons() -> None:
    assert tag_reason("NHC: check failed", "healthd:", 7) == "NHC: check failed"
    assert reason_epoch("NHC: [e7] x", "healthd:") is None
    assert not Node(name="n1", state="drained", reason="NHC: [e7] x").owned_by("healthd:")


def test_inherited_drains() -> None:
    from healthd.ha.reconcile import inherited

    nodes = [Node(name="old", state="drained", reason="healthd: [e3] xid 79"),
             Node(name="mine", state="drained", reason="healthd: [e5] xid 79"),
             Node(name="known", state="drained", reason="healthd: [e2] xid 79"),
             Node(name="untagged", state="drained", reason="healthd: xid 79"),
             Node(name="foreign", state="drained", reason="NHC: [e1] x"),
             Node(name="back", state="idle", reason="healthd: [e1] x")]
    assert [(i.node.name, i.epoch) for i in inherited(nodes, {"known"}, "healthd:", 5)] == \
        [("old", 3), ("untagged", None)]
