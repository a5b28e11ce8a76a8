"""The ``healthd`` command line.

Exit codes: 0 success, 1 the command ran and found trouble (a probe that could not run,
a failing node), 2 usage or configuration error.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

import healthd
from healthd.config import KNOWN_PROBES, Settings, load_settings
from healthd.errors import CommandTimeout, ConfigError, HealthdError, ParseError
from healthd.model import Outcome, ProbeResult

EXIT_OK, EXIT_TROUBLE, EXIT_USAGE = 0, 1, 2


def _add_config(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", "-c", metavar="PATH",
                   help="TOML config file (default: $HEALTHD_CONFIG, else /etc/healthd/healthd.toml if present)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="healthd", description="Continuous health monitor for Slurm GPU clusters.")
    parser.add_argument("--version", action="version", version=f"healthd {healthd.__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("run", help="run the daemon in the foreground")
    _add_config(p)

    p = sub.add_parser("check-config", help="validate the configuration and print where it came from")
    _add_config(p)

    p = sub.add_parser("probe", help="run one probe on this machine now and print its result")
    _add_config(p)
    p.add_argument("name", choices=KNOWN_PROBES)
    p.add_argument("--json", action="store_true", help="print the result document as JSON")
    p.add_argument("--timeout", type=float, default=None, help="seconds (default: the probe's timeout_s)")
    p.add_argument("probe_args", nargs=argparse.REMAINDER, help="options passed to python -m probes NAME")

    p = sub.add_parser("status", help="nodes, last results and verdicts from the store")
    _add_config(p)
    p.add_argument("--json", action="store_true")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        if args.command == "run":
            from healthd.daemon import run_daemon

            return run_daemon(args.config)
        if args.command == "check-config":
            return cmd_check_config(args)
        if args.command == "probe":
            return cmd_probe(args)
        if args.command == "status":
            return cmd_status(args)
    except ConfigError as exc:
        print(f"healthd: configuration error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except HealthdError as exc:
        print(f"healthd: {exc}", file=sys.stderr)
        return EXIT_TROUBLE
    parser.error(f"unknown command {args.command}")
    return EXIT_USAGE


def _settings(args: argparse.Namespace) -> tuple[Settings, Path | None]:
    return load_settings(args.config)


def cmd_check_config(args: argparse.Namespace) -> int:
    settings, path = _settings(args)
    print(f"config OK: {path or 'built-in defaults'}")
    print(f"  backend: {settings.backend}; store: {settings.store_path}; "
          f"http: {settings.http.host}:{settings.http.port}; remediation: {settings.remediation.mode}")
    for name, probe in sorted(settings.probes.items()):
        state = "enabled" if probe.enabled else "disabled"
        print(f"  probe {name}: {state}, every {probe.interval_s:g} s, timeout {probe.timeout_s:g} s")
    return EXIT_OK


def cmd_probe(args: argparse.Namespace) -> int:
    from healthd.cluster.local import probe_argv
    from healthd.model import ProbeJob
    from healthd.parsers.healthd_json import parse_result
    from healthd.planning import new_run_id
    from healthd.process import run

    settings, _ = _settings(args)
    probe_settings = settings.probes.get(args.name)
    timeout = args.timeout or (probe_settings.timeout_s if probe_settings else 300.0)
    extra = [a for a in args.probe_args if a != "--"]
    job = ProbeJob(run_id=new_run_id(), probe=args.name, nodes=(settings.local.node_name,),
                   args=tuple(extra), timeout_s=timeout)
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
        result = parse_result(done.stdout)
    except ParseError as exc:
        sys.stderr.write(done.stderr[-4000:])
        print(f"healthd: probe {args.name} gave no readable result: {exc}", file=sys.stderr)
        return EXIT_TROUBLE
    if args.json:
        print(result.model_dump_json(indent=1))
    else:
        print(format_result(result))
    return EXIT_OK if result.outcome is Outcome.PASS else EXIT_TROUBLE


def format_result(result: ProbeResult) -> str:
    lines = [
        f"probe {result.probe}: {result.outcome.value}" + (f" ({result.reason})" if result.reason else ""),
        f"  nodes: {', '.join(result.nodes) or '-'}; wall {result.finished_at - result.started_at:.1f} s"
        + (f" (start-up {result.startup_seconds:.1f} s)" if result.startup_seconds is not None else ""),
    ]
    for m in result.measurements:
        labels = ", ".join(f"{k}={v}" for k, v in sorted(m.labels.items()))
        lines.append(f"  {m.name:<40} {_human(m.name, m.value):>16}  {labels}" + (f"  node={m.node}" if m.node else ""))
    bad = [c for c in result.checks if not c.ok]
    lines.append(f"  checks: {len(result.checks) - len(bad)}/{len(result.checks)} ok")
    lines += [f"  FAILED {c.name}: {c.detail}" for c in bad]
    return "\n".join(lines)


def _human(name: str, value: float) -> str:
    for unit, scale, suffix in (("flop_per_second", 1e12, "TFLOP/s"), ("bytes_per_second", 1e9, "GB/s"),
                                ("seconds", 1e-6, "us")):
        if name.endswith(unit):
            return f"{value / scale:.3f} {suffix}"
    return f"{value:.4g}"


def cmd_status(args: argparse.Namespace) -> int:
    from healthd.http import nodes_document
    from healthd.store import Store

    settings, _ = _settings(args)
    if not settings.store_path.exists():
        raise HealthdError(f"no state store at {settings.store_path}: has the daemon run with this config?")
    store = Store(settings.store_path)
    try:
        doc = nodes_document(store.snapshot())
    finally:
        store.close()
    if args.json:
        print(json.dumps(doc, indent=1, sort_keys=True))
        return EXIT_OK
    bad = 0
    for node in doc["nodes"]:
        print(f"{node['name']}  state={node['state'] or '?'}  class={node['node_class'] or '-'}")
        for probe, info in sorted(node["probes"].items()):
            verdict = node["verdicts"].get(probe, {})
            when = datetime.fromtimestamp(info["last_run_at"], tz=UTC).strftime("%Y-%m-%d %H:%M:%S")
            outcome = verdict.get("outcome", info["last_outcome"])
            bad += outcome in (Outcome.FAIL.value, Outcome.DEGRADED.value)
            reason = verdict.get("reason") or info["last_reason"]
            print(f"  {probe:<8} {outcome:<9} last run {when} UTC" + (f"  {reason}" if reason else ""))
            for m in info["measurements"][:12]:
                labels = ",".join(f"{k}={v}" for k, v in sorted(m["labels"].items()))
                print(f"           {m['name']:<36} {_human(m['name'], m['value']):>14}  {labels}")
    if not doc["nodes"]:
        print("no nodes known yet")
    return EXIT_TROUBLE if bad else EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
