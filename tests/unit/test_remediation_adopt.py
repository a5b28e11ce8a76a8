"""Taking over the drains Slurm made for healthd's failed boundary checks (``healthd.remediation.adopt``)."""

from __future__ import annotations

from healthd.model import Node
from healthd.remediation.adopt import BoundaryFailure, adoptions, boundary_reason

T = 1_800_000_000.0
FAIL = BoundaryFailure("n1", "boundary-n1-epilog-42-1800000000000", "epilog",
                       "boundary.leftover_process: 1 process of uid 65534 left: 4242 (sleep)", T)


def drained(name: str, reason: str, at: float | None = T + 1) -> Node:
    return Node(name, "idle", frozenset({"DRAIN"}), reason=reason, reason_time=at)


def test_slurms_epilog_drain_of_a_failed_check_is_taken_over_with_healthds_reason() -> None:
    (a,) = adoptions([FAIL], {"n1": drained("n1", "Epilog error")}, set(), "healthd:")
    assert (a.node, a.slurm_reason, a.context, a.run_id) == ("n1", "Epilog error", "epilog", FAIL.run_id)
    assert a.reason.startswith("healthd: boundary epilog boundary.leftover_process") and a.reason.endswith(FAIL.run_id)
    assert len(a.reason) <= 160


def test_prolog_failures_take_over_prolog_drains_only() -> None:
    prolog = BoundaryFailure("n1", "r2", "prolog", "env.gpu_count: 0 GPU(s) visible, 8 expected", T)
    assert [a.slurm_reason for a in adoptions([prolog], {"n1": drained("n1", "Prolog error")}, set(), "healthd:")] \
        == ["Prolog error"]
    assert adoptions([prolog], {"n1": drained("n1", "Epilog error")}, set(), "healthd:") == []


def test_what_is_not_certainly_healthds_is_left_alone() -> None:
    cases = {
        "an operator's reason": {"n1": drained("n1", "bad DIMM, ticket 123")},
        "not drained": {"n1": Node("n1", "idle", reason="Epilog error", reason_time=T)},
        "drained long after the check": {"n1": drained("n1", "Epilog error", at=T + 3600)},
        "drained long before the check": {"n1": drained("n1", "Epilog error", at=T - 3600)},
        "another node": {"n2": drained("n2", "Epilog error")},
        "healthd's own already": {"n1": drained("n1", "healthd: boundary epilog x run r")},
    }
    for why, nodes in cases.items():
        assert adoptions([FAIL], nodes, set(), "healthd:") == [], why
    assert adoptions([FAIL], {"n1": drained("n1", "Epilog error")}, {"n1"}, "healthd:") == []
    health = BoundaryFailure("n1", "r3", "health", "x", T)  # HealthCheckProgram's exit drains nothing
    assert adoptions([health], {"n1": drained("n1", "Epilog error")}, set(), "healthd:") == []


def test_a_drain_without_a_time_is_taken_with_the_newest_failure() -> None:
    older = BoundaryFailure("n1", "old", "epilog", "old failure", T - 10)
    (a,) = adoptions([FAIL, older], {"n1": drained("n1", "Epilog error", at=None)}, set(), "healthd:")
    assert a.run_id == FAIL.run_id


def test_the_reason_is_one_line_and_fits_slurms_field() -> None:
    long = BoundaryFailure("n1", "r" * 40, "epilog", "line one\nline two " + "x" * 400, T)
    text = boundary_reason("healthd:", long)
    assert "\n" not in text and len(text) <= 160 and text.endswith("r" * 40) and ".." in text


class FakeSlurmDrains:
    """A fake of the Slurm backend's node list and reason update (the real one: test_boundary_slurm.py)."""

    name = "slurm"

    def __init__(self) -> None:
        self.nodes = {"n1": Node("n1", "idle")}
        self.calls: list[tuple[str, str, str]] = []

    def list_nodes(self) -> list[Node]:
        return list(self.nodes.values())

    def drain(self, node: str, reason: str) -> None:
        raise AssertionError("never a new drain")

    def undrain(self, node: str) -> None:
        raise AssertionError("never an undrain")

    def take_over_drain(self, node: str, slurm_reason: str, reason: str) -> None:
        self.calls.append((node, slurm_reason, reason))
        self.nodes[node] = drained(node, reason)


def test_the_remediator_waits_for_slurms_drain_then_owns_it_once(tmp_path: object) -> None:
    from pathlib import Path

    from healthd.config import RemediationSettings
    from healthd.remediation import Remediator
    from healthd.store import Store

    now = [T + 2]
    cluster = FakeSlurmDrains()
    store = Store(Path(str(tmp_path)) / "s.sqlite")
    try:
        r = Remediator(store, cluster, RemediationSettings(), clock=lambda: now[0])
        assert r.adopt_boundary_drains([FAIL]) == []  # the document came before slurmctld's drain
        cluster.nodes["n1"] = drained("n1", "Epilog error")
        now[0] += 1
        assert r.adopt_boundary_drains([]) == []  # tried again only every few seconds
        now[0] += 10
        (action,) = r.adopt_boundary_drains([])
        assert (action.action, action.node, action.result) == ("drain", "n1", "done")
        assert [c[:2] for c in cluster.calls] == [("n1", "Epilog error")]
        (d,) = store.drains(open_only=True)
        assert d.node == "n1" and d.reason == cluster.calls[0][2] and d.automatic
        now[0] += 10
        assert r.adopt_boundary_drains([FAIL]) == [] and len(cluster.calls) == 1
        now[0] = T + 1000  # a failure older than the slack is forgotten
        cluster.nodes["n1"] = drained("n1", "Epilog error", at=now[0])
        assert r.adopt_boundary_drains([]) == []
    finally:
        store.close()
