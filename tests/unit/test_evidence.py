"""``healthd evidence NODE`` over a store filled by the daemon's own path (``test_remediation_daemon_path``:
the real collector reading real result files, the judge, remediation draining n3 for a slow GPU), read
back read-only, as the command does; and the command itself."""

from __future__ import annotations

import json
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from healthd.errors import StoreError
from healthd.evidence import SCHEMA, evidence_document, run_ids, write_bundle
from healthd.http import ApiError
from healthd.store import Store
from tests.unit.test_remediation_daemon_path import Cluster, Daemon, run_rounds, settings_for


@pytest.fixture(scope="module")
def drained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The state directory of a daemon path that drained n3 (its store and results directory)."""
    tmp = tmp_path_factory.mktemp("evidence")
    daemon = Daemon(tmp, settings_for(tmp), Cluster())
    run_rounds(daemon, range(1, 5))
    assert [d[0] for d in daemon.cluster.slurm.drains()] == ["n3"]
    daemon.store.close()
    return tmp


def test_the_evidence_of_a_drained_node(drained: Path) -> None:
    settings = settings_for(drained)
    store = Store(settings.store_path, read_only=True)
    try:
        doc = evidence_document(store, "n3", now=1.0)
        with pytest.raises(ApiError, match="no node 'n99' known to healthd"):
            evidence_document(store, "n99")
        with pytest.raises(StoreError):
            store.add_audit(at=1.0, actor="x", action="drain", node="n3", result="info", reason="a write")
    finally:
        store.close()
    assert (doc["schema"], doc["generated_at"], doc["node"]["name"]) == (SCHEMA, 1.0, "n3")
    (verdict,) = doc["verdicts"]
    assert (verdict["probe"], verdict["outcome"], verdict["reason_code"]) == ("gemm", "fail", "below_floor")
    assert verdict["evidence"]["gpu"] == "2"
    behind = [r for r in doc["runs"] if r["behind_verdict"]]
    assert sorted(r["run_id"] for r in behind) == sorted(verdict["run_ids"])
    slow = [m for r in behind for m in r["measurements"] if m["labels"].get("gpu") == "2"]
    assert slow and all(m["value"] < 400e12 for m in slow)  # the values behind the verdict
    (series,) = [s for s in doc["series"] if s["labels"].get("gpu") == "2"]
    assert series["floor"] == 525e12 and abs(series["baseline"] - 700e12) < 21e12
    assert [(d["automatic"], d["reason"][:31]) for d in doc["drains"]] == [(True, "healthd: below_floor gemm gpu 2")]
    assert [(a["action"], a["result"]) for a in doc["audit"]] == [("drain", "done"), ("recommend", "info")]
    assert [(r["state"], r["reason_code"]) for r in doc["recommendations"]] == [("active", "below_floor")]
    assert doc["repairs"] == [] and doc["boundary_checks"] == [] and doc["passive_signals"] == []
    assert len(doc["runs"]) == len(run_ids(doc)) >= 4
    json.dumps(doc)  # JSON all through


def test_the_bundle_holds_the_raw_result_documents(drained: Path, tmp_path: Path) -> None:
    store = Store(settings_for(drained).store_path, read_only=True)
    try:
        doc = evidence_document(store, "n3")
    finally:
        store.close()
    out = tmp_path / "n3.tar.gz"
    assert write_bundle(doc, out) == []
    with tarfile.open(out) as tar:
        names = tar.getnames()
        inside = json.loads(tar.extractfile("evidence.json").read())  # type: ignore[union-attr]
        first = json.loads(tar.extractfile(f"results/{doc['runs'][0]['run_id']}.json").read())  # type: ignore[union-attr]
    assert names[0] == "evidence.json" and len(names) == 1 + len(doc["runs"])
    assert inside["bundle"]["results"] == names[1:] and inside["verdicts"] == doc["verdicts"]
    assert first["run_id"] == doc["runs"][0]["run_id"] and first["probe"] == "gemm"


def test_the_command_reads_without_writing(drained: Path, tmp_path: Path) -> None:
    settings = settings_for(drained)
    config = tmp_path / "healthd.toml"
    config.write_text(f'backend = "local"\nstate_dir = "{settings.state_dir}"\n')
    before = sorted(p.name for p in settings.state_dir.iterdir())
    store_bytes = settings.store_path.read_bytes()
    done = subprocess.run([str(Path(sys.executable).parent / "healthd"), "evidence", "--config", str(config), "n3",
                           "--out", str(tmp_path / "n3.tar.gz")], capture_output=True, text=True, timeout=60,
                          check=False)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["node"]["name"] == "n3"
    assert "wrote" in done.stderr and (tmp_path / "n3.tar.gz").is_file()
    assert sorted(p.name for p in settings.state_dir.iterdir()) == before
    assert settings.store_path.read_bytes() == store_bytes
    missing = subprocess.run([str(Path(sys.executable).parent / "healthd"), "evidence", "--config", str(config),
                              "n99"], capture_output=True, text=True, timeout=60, check=False)
    assert missing.returncode != 0 and "no node 'n99' known to healthd" in missing.stderr
