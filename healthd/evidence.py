"""``healthd evidence NODE``: one document with everything the store holds on why a node is where it is,
for the ticket of a drained node (docs/alerts.md, ``HealthdDrainRecommended``).

The document (``SCHEMA``, a version that changes only when a field changes meaning or goes away; new
fields may be added) holds the node as healthd last saw it, its current verdicts with their evidence,
the runs behind them and its recent runs (each with its measurements and failed or passed checks), the
judged series (latest value, baseline, floor), the passive signals in force on it, its boundary checks,
the fleet events, switch findings and link findings in force that concern it, its recommendations,
healthd's drains and repairs of it and its audit trail. ``write_bundle`` adds the raw result documents
of those runs (``--out FILE.tar.gz``). Reads only (the store is opened read-only by the command).
"""

from __future__ import annotations

import io
import json
import tarfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import healthd
from healthd.http import _run, node_detail
from healthd.judge.sources.passive import PROBE as PASSIVE
from healthd.store import Store
from healthd.store.rows import RunRow
from healthd.topology import Topology

SCHEMA = 1
RECENT_RUNS = 50
AUDIT_ROWS = 500
MAX_DOCUMENT_BYTES = 64 << 20
"""A result document larger than this is left out of the bundle (named in ``left_out``)."""


def evidence_document(store: Store, name: str, *, topology: Topology | None = None,
                      now: float | None = None) -> dict[str, Any]:
    """The evidence of node ``name`` (``SCHEMA``); ``healthd.http.ApiError`` when the store knows no such node."""
    detail = node_detail(store, name, topology)
    verdicts = detail.pop("verdicts")
    detail.pop("recent_runs")
    behind = {r for v in verdicts.values() for r in v.get("run_ids", [])}
    runs = {r.run_id: r for r in store.recent_runs(node=name, limit=RECENT_RUNS)}
    for run_id in sorted(behind - set(runs)):
        if (row := store.run(run_id)) is not None:
            runs[run_id] = row
    ordered = sorted(runs.values(), key=lambda r: (r.submitted_at, r.run_id), reverse=True)
    class_ = detail.get("node_class")
    return {
        "schema": SCHEMA,
        "generated_at": time.time() if now is None else now,
        "healthd_version": healthd.__version__,
        "node": {k: detail[k] for k in ("name", "state", "flags", "partitions", "gpus", "node_class", "reason",
                                         "gpu_inventory", "switch_path")},
        "verdicts": [{"probe": probe, **v} for probe, v in sorted(verdicts.items()) if probe != PASSIVE],
        "passive_signals": [{"probe": probe, **v} for probe, v in sorted(verdicts.items()) if probe == PASSIVE],
        "findings": detail.get("findings", []),
        "series": detail.get("series", []),
        "last_results": detail["probes"],
        "runs": [_run_evidence(store, r, behind) for r in ordered if r.kind.value != "boundary"],
        "boundary_checks": [_run_evidence(store, r, behind) for r in ordered if r.kind.value == "boundary"],
        "fleet_events": [e for e in store.fleet_events(active_only=True) if e.get("node_class") == class_],
        "switch_findings": [e for e in store.switch_findings(active_only=True)
                            if name in e.get("nodes", []) or name in e.get("held", [])
                            or e.get("switch") in detail["switch_path"]],
        "link_findings": [{"probe": f.probe, "a": f.a, "b": f.b, "started_at": f.started_at, "series": f.series,
                           "value": f.value, "reference": f.reference, "text": f.text}
                          for f in store.link_findings(active_only=True) if name in (f.a, f.b)],
        "recommendations": [
            {"probe": r.probe, "state": r.state, "outcome": r.outcome, "reason_code": r.reason_code, "text": r.text,
             "evidence": r.evidence, "since": r.since, "updated_at": r.updated_at, "closed_at": r.closed_at,
             "close_reason": r.close_reason, "escalated": r.escalated, "refused": r.last_refusal or None}
            for r in store.recommendations(states=("active", "cleared", "withdrawn", "dismissed"), node=name)],
        "drains": [{"reason": d.reason, "actor": d.actor, "automatic": d.automatic, "drained_at": d.drained_at,
                    "undrained_at": d.undrained_at, "undrained_by": d.undrained_by, "probes": list(d.probes),
                    "check_since": d.check_since} for d in store.drains(node=name)],
        "repairs": [{"kind": r.kind, "reason_code": r.reason_code, "state": r.state, "full_check": list(r.probes),
                     "started_at": r.started_at, "validating_at": r.validating_at, "ended_at": r.ended_at,
                     "reason": r.reason} for r in store.repairs(node=name, open_too=True)],
        "audit": [{"at": a.at, "actor": a.actor, "action": a.action, "result": a.result, "reason": a.reason,
                   "detail": a.detail} for a in store.audit(node=name, limit=AUDIT_ROWS)],
    }


def _run_evidence(store: Store, run: RunRow, behind: set[str]) -> dict[str, Any]:
    checks = store.checks(run.run_id)
    return {**_run(run), "behind_verdict": run.run_id in behind,
            "measurements": [{"node": m.node, "name": m.name, "labels": m.labels, "value": m.value, "at": m.at}
                             for m in store.measurements(run_id=run.run_id)],
            "checks": [{k: c[k] for k in ("name", "ok", "detail", "node", "gpu", "rank")} for c in checks]}


def write_bundle(doc: dict[str, Any], out: Path) -> list[str]:
    """``out`` (a gzip'd tar): ``evidence.json`` and ``results/<run file>`` for each run of ``doc`` whose raw
    result document can be read; what was left out, and why (also in the bundle's ``evidence.json`` as
    ``bundle.left_out``)."""
    paths: list[tuple[str, Path]] = []
    left_out: list[str] = []
    for run in (*doc["runs"], *doc["boundary_checks"]):
        raw = run.get("result_path")
        if not raw:
            continue
        path = Path(raw)
        try:
            size = path.stat().st_size
        except OSError as exc:
            left_out.append(f"{raw}: {exc.strerror or exc}")
            continue
        if size > MAX_DOCUMENT_BYTES:
            left_out.append(f"{raw}: {size} bytes, over {MAX_DOCUMENT_BYTES}")
            continue
        paths.append((f"results/{path.name}", path))
    body = {**doc, "bundle": {"results": [name for name, _ in paths], "left_out": left_out}}
    with tarfile.open(out, "w:gz") as tar:
        _add(tar, "evidence.json", json.dumps(body, indent=1, sort_keys=True).encode())
        for name, path in paths:
            try:
                data = path.read_bytes()
            except OSError as exc:
                left_out.append(f"{path}: {exc.strerror or exc}")
                continue
            _add(tar, name, data)
    return left_out


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mtime = int(time.time())
    info.mode = 0o640
    tar.addfile(info, io.BytesIO(data))


def run_ids(doc: dict[str, Any]) -> Sequence[str]:
    """The runs of ``doc`` (newest first), for tests and the command's summary."""
    return [r["run_id"] for r in (*doc["runs"], *doc["boundary_checks"])]
