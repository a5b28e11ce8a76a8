"""``healthd probe NAME``: run one probe on this machine now and print its result; with ``--node`` /
``--nodes``, ask the running daemon to probe those nodes now through its cluster backend.

The request goes through the store: one ``probe_requests`` row per node, which the daemon's next
plan tick refuses (``planning.why_refused``), launches as an ordinary run, or lets wait for its node.
The command waits for each run to finish and be judged and prints the verdicts.
"""

from __future__ import annotations

import argparse
import getpass
import json
import sys
import time
from typing import Any

from healthd.commands.common import EXIT_OK, EXIT_TROUBLE, EXIT_USAGE, add_config_option, settings_from
from healthd.config import ProbeSettings, Settings
from healthd.errors import CommandTimeout, ConfigError, ParseError
from healthd.model import Outcome, ProbeResult, validate_node_name
from healthd.units import human
from probes.catalogue import PROBE_NAMES


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("probe", help="run one probe on this machine now and print its result; with --node(s), "
                                     "ask the running daemon to probe those nodes and print the verdicts")
    add_config_option(p)
    p.add_argument("name", choices=PROBE_NAMES)
    p.add_argument("--json", action="store_true", help="print the result document (verdicts with --node) as JSON")
    p.add_argument("--timeout", type=float, default=None,
                   help="seconds (default: the probe's timeout_s); with --node: how long to wait for the verdicts")
    p.add_argument("--node", action="append", default=[], metavar="N",
                   help="ask the daemon to probe node N now (repeatable)")
    p.add_argument("--nodes", default="", metavar="HOSTLIST", help="nodes as a Slurm hostlist: gpu[01-04],gpu09")
    p.set_defaults(func=cmd_probe, passes_unknown_args=True, probe_args=[])
    p.epilog = ("Without --node: runs here; any other option goes to python -m probes NAME. With --node/--nodes: "
                "the daemon (same config and store) probes the nodes through its backend with the probe's configured "
                "options; a busy node or one drained by someone else is refused.")


def cmd_probe(args: argparse.Namespace) -> int:
    if args.node or args.nodes:
        return cmd_probe_nodes(args)
    return cmd_probe_here(args)


def cmd_probe_here(args: argparse.Namespace) -> int:
    from healthd.cluster.local import LocalGpus, discover_gpus, probe_argv, require_probe_python
    from healthd.model import ProbeJob
    from healthd.parsers.expand import expand_result
    from healthd.parsers.healthd_json import parse_result
    from healthd.planning import new_run_id
    from healthd.process import run

    settings, _ = settings_from(args)
    require_probe_python(settings.local.python, f"healthd probe runs {args.name} on this machine")
    timeout = args.timeout or settings.probes.get(args.name, ProbeSettings()).timeout_s
    extra = [a for a in args.probe_args if a != "--"]
    gpus = LocalGpus.of(discover_gpus(), gpus=settings.local.gpus, node_class=settings.local.node_class)
    job = ProbeJob(run_id=new_run_id(), probe=args.name, nodes=(settings.local.node_name,),
                   args=tuple(extra), timeout_s=timeout, expect_gpus=gpus.count or None)
    argv = probe_argv(settings.local.python, job, None, ranks=settings.local.ranks)
    try:
        done = run(argv, timeout=timeout + 15)
    except CommandTimeout as exc:
        print(f"healthd: probe {args.name} timed out: {exc}", file=sys.stderr)
        return EXIT_TROUBLE
    if done.returncode == 2:
        sys.stderr.write(done.stderr)
        return EXIT_USAGE
    try:
        result = expand_result(parse_result(done.stdout))
    except ParseError as exc:
        sys.stderr.write(done.stderr[-4000:])
        print(f"healthd: probe {args.name} gave no readable result: {exc}", file=sys.stderr)
        return EXIT_TROUBLE
    print(result.model_dump_json(indent=1) if args.json else format_result(result))
    return EXIT_OK if result.outcome is Outcome.PASS else EXIT_TROUBLE


def format_result(result: ProbeResult) -> str:
    lines = [
        f"probe {result.probe}: {result.outcome.value}" + (f" ({result.reason})" if result.reason else ""),
        f"  nodes: {', '.join(result.nodes) or '-'}; wall {result.finished_at - result.started_at:.1f} s"
        + (f" (start-up {result.startup_seconds:.1f} s)" if result.startup_seconds is not None else ""),
    ]
    for m in result.measurements:
        labels = ", ".join(f"{k}={v}" for k, v in sorted(m.labels.items()))
        value = human(m.name, m.value, column=True)
        lines.append(f"  {m.name:<40} {value:>16}  {labels}" + (f"  node={m.node}" if m.node else ""))
    bad = [c for c in result.checks if not c.ok]
    lines.append(f"  checks: {len(result.checks) - len(bad)}/{len(result.checks)} ok")
    lines += [f"  FAILED {c.name}: {c.detail}" for c in bad]
    return "\n".join(lines)


PICKUP_S = 60.0
"""How long a request may stay unread before the command concludes no daemon serves this store
(at least three plan intervals)."""


def requested_nodes(node: list[str], nodes: str) -> list[str]:
    from healthd.cluster.slurm_parse import expand_nodes

    names = [*node, *(expand_nodes(nodes) if nodes else ())]
    for name in names:
        validate_node_name(name)
    return list(dict.fromkeys(names))


def cmd_probe_nodes(args: argparse.Namespace) -> int:
    from healthd.service_store import open_store

    settings, config_path = settings_from(args)
    if args.probe_args:
        raise ConfigError("probe options cannot be passed with --node: the daemon runs the probe as configured")
    names = requested_nodes(args.node, args.nodes)
    if not settings.store_path.exists():
        print(f"healthd: no store at {settings.store_path}: is the daemon running with this config?", file=sys.stderr)
        return EXIT_TROUBLE
    store = open_store(settings, config_path, write=True, command="probe", argv=getattr(args, "argv", None))
    try:
        ids = store.add_probe_requests(args.name, names, at=time.time(), by=getpass.getuser())
        if not args.json:
            print(f"asked the daemon to probe {', '.join(names)} with {args.name}; waiting for the verdicts",
                  file=sys.stderr, flush=True)
        report = wait_for_requests(store, ids, settings, args.name, args.timeout)
    finally:
        store.close()
    print(json.dumps(report, indent=1) if args.json else format_report(report))
    return EXIT_OK if report and all(r["verdict"] == Outcome.PASS.value for r in report) else EXIT_TROUBLE


def wait_for_requests(store: Any, ids: list[int], settings: Settings, probe: str,
                      timeout: float | None) -> list[dict[str, Any]]:
    """Poll the store until every request is refused, expired, or launched with its run judged."""
    from healthd.daemon import ON_DEMAND_WAIT_S

    probe_timeout = settings.probes.get(probe, ProbeSettings()).timeout_s
    pickup = max(PICKUP_S, 3 * settings.scheduler.plan_interval_s)
    started = time.monotonic()
    deadline = started + (timeout or ON_DEMAND_WAIT_S + probe_timeout + settings.slurm.pending_timeout_s + 120)
    while True:
        rows = store.probe_requests(ids)
        now = time.monotonic()
        unread = [r for r in rows if r.state == "pending" and r.seen_at is None]
        if unread and now - started > pickup:
            for r in unread:
                store.settle_probe_request(r.id, "expired", at=time.time(),
                                           detail=f"no daemon read the request within {pickup:.0f} s")
            continue
        open_runs = [r for r in rows if r.state == "pending" or (r.state == "launched" and r.run_id
                                                                  and not store.run_judged(r.run_id))]
        if not open_runs or now > deadline:
            return [request_report(store, r) for r in rows]
        time.sleep(1.0)


def request_report(store: Any, r: Any) -> dict[str, Any]:
    """What became of one request: refused/expired with why, or the run's outcome and the verdict."""
    out: dict[str, Any] = {"node": r.node, "probe": r.probe, "state": r.state, "detail": r.detail,
                           "run_id": r.run_id, "outcome": None, "verdict": None, "reason": ""}
    if r.state == "pending":
        out["detail"] = "still waiting for the node" if r.seen_at else "not read by any daemon"
    if r.run_id is None:
        return out
    run = store.run(r.run_id)
    if run is not None and run.outcome is not None:
        out["outcome"], out["reason"] = run.outcome.value, run.reason
    verdict = next((v for v in store.current_verdicts()
                    if v.node == r.node and v.probe == r.probe and r.run_id in v.run_ids), None)
    if verdict is not None:
        out["verdict"], out["reason"] = verdict.outcome.value, verdict.reason or out["reason"]
    elif out["outcome"] is not None and store.run_judged(r.run_id):
        out["verdict"] = out["outcome"]
    return out


def format_report(report: list[dict[str, Any]]) -> str:
    lines = []
    for r in report:
        head = f"{r['node']} {r['probe']}: "
        if r["state"] in ("refused", "expired", "pending"):
            lines.append(head + f"{r['state']}: {r['detail']}")
            continue
        if r["verdict"] is None:
            lines.append(head + f"no verdict yet (run {r['run_id']}, {r['outcome'] or 'not finished'})")
            continue
        run = f"the run: {r['outcome']}; " if r["outcome"] != r["verdict"] else ""
        lines.append(head + f"{r['verdict']} ({run}run {r['run_id']})" + (f": {r['reason']}" if r["reason"] else ""))
    return "\n".join(lines)
