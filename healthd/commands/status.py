"""``healthd status``: nodes, last results and verdicts, read from the store."""

from __future__ import annotations

import argparse
import json
import sys
from datetime import UTC, datetime

from healthd.commands.common import EXIT_OK, EXIT_TROUBLE, add_config_option, settings_from
from healthd.config import Settings
from healthd.model import Outcome
from healthd.topology import Topology, describe
from healthd.units import human


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("status", help="nodes, last results and verdicts from the store")
    add_config_option(p)
    p.add_argument("--json", action="store_true")
    p.add_argument("--by-switch", action="store_true",
                   help="group the nodes by leaf switch (or block) of the topology ([topology]: Slurm's or the file)")
    p.set_defaults(func=cmd_status)


def _topology(settings: Settings) -> Topology | None:
    """The topology as the daemon reads it (``[topology]``); ``None`` (said on stderr) when there is none."""
    from healthd.cluster import make_backend
    from healthd.cluster.topology import read_topology

    backend = make_backend(settings, runs_probes=False) if settings.topology.source in ("auto", "slurm") else None
    topology = read_topology(settings.topology, backend)
    if topology is None:
        print(f"healthd status: {describe(None)}", file=sys.stderr)
    return topology


def ha_line(settings: Settings) -> str | None:
    """Who leads (``[ha]``), as ``healthd ha status`` says it in one line; ``None`` with ``[ha]`` off. A database
    that does not answer is said, never an error: the store's view is shown all the same."""
    if settings.ha.mode == "off":
        return None
    from healthd.errors import HealthdError
    from healthd.ha.lease import read_lease

    try:
        lease = read_lease(settings.ha)
    except HealthdError as exc:
        return f"ha: leader unknown: {exc}"
    if lease.live and lease.holder:
        return f"ha: {lease.holder} leads, epoch {lease.epoch}, since {lease.since} (database clock)"
    return f"ha: no leader (last: {lease.holder or 'none'}, epoch {lease.epoch}, lease ran out {lease.expires_at})"


def cmd_status(args: argparse.Namespace) -> int:
    from healthd.http import nodes_document
    from healthd.service_store import open_store

    settings, config_path = settings_from(args)
    store = open_store(settings, config_path, write=False, command="status")
    topology = _topology(settings) if args.by_switch else None
    try:
        doc = nodes_document(store.snapshot(), topology)
    finally:
        store.close()
    ha = ha_line(settings)
    if args.json:
        print(json.dumps({**doc, "ha": ha} if ha is not None else doc, indent=1, sort_keys=True))
        return EXIT_OK
    if ha is not None:
        print(ha)
    if topology is not None:
        print(describe(topology))
    bad = 0
    group: tuple[str, ...] | None = None
    for node in sorted(doc["nodes"], key=lambda n: (not n["switch_path"], n["switch_path"], n["name"])) \
            if args.by_switch else doc["nodes"]:
        if args.by_switch and tuple(node["switch_path"]) != group:
            group = tuple(node["switch_path"])
            print(f"== switch {' < '.join(group)}" if group else "== under no switch of the topology")
        print(f"{node['name']}  state={node['state'] or '?'}  class={node['node_class'] or '-'}")
        for gpu in node["gpu_inventory"]:
            gone = "" if gpu["present"] else "  (not found by the newest run)"
            print(f"  gpu {gpu['index']} ({gpu['uuid'] or 'no UUID'}) {gpu['name'] or ''}{gone}")
        for probe, info in sorted(node["probes"].items()):
            verdict = node["verdicts"].get(probe, {})
            when = datetime.fromtimestamp(info["last_run_at"], tz=UTC).strftime("%Y-%m-%d %H:%M:%S")
            outcome = verdict.get("outcome", info["last_outcome"])
            bad += outcome in (Outcome.FAIL.value, Outcome.DEGRADED.value)
            reason = verdict.get("reason") or info["last_reason"]
            run_outcome = info["last_outcome"]
            judged = f" (the run: {run_outcome}; the verdict: {outcome})" if run_outcome != outcome else ""
            print(f"  {probe:<8} {outcome:<9} last run {when} UTC{judged}" + (f"  {reason}" if reason else ""))
            for m in info["measurements"][:12]:
                labels = ",".join(f"{k}={v}" + (f" ({m['gpu_uuid']})" if k == "gpu" and m.get("gpu_uuid") else "")
                                  for k, v in sorted(m["labels"].items()))
                print(f"           {m['name']:<36} {human(m['name'], m['value'], column=True):>14}  {labels}")
    if not doc["nodes"]:
        print("no nodes known yet")
    return EXIT_TROUBLE if bad else EXIT_OK
