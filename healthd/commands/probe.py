"""``healthd probe NAME``: run one probe on this machine now and print its result."""

from __future__ import annotations

import argparse
import sys

from healthd.commands.common import EXIT_OK, EXIT_TROUBLE, EXIT_USAGE, add_config_option, settings_from
from healthd.config import ProbeSettings
from healthd.errors import CommandTimeout, ParseError
from healthd.model import Outcome, ProbeResult
from healthd.units import human
from probes.catalogue import PROBE_NAMES


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("probe", help="run one probe on this machine now and print its result")
    add_config_option(p)
    p.add_argument("name", choices=PROBE_NAMES)
    p.add_argument("--json", action="store_true", help="print the result document as JSON")
    p.add_argument("--timeout", type=float, default=None, help="seconds (default: the probe's timeout_s)")
    p.set_defaults(func=cmd_probe, passes_unknown_args=True, probe_args=[])
    p.epilog = "Any other option (before or after healthd's own) goes to python -m probes NAME."


def cmd_probe(args: argparse.Namespace) -> int:
    from healthd.cluster.local import probe_argv, require_probe_python
    from healthd.model import ProbeJob
    from healthd.parsers.expand import expand_result
    from healthd.parsers.healthd_json import parse_result
    from healthd.planning import new_run_id
    from healthd.process import run

    settings, _ = settings_from(args)
    require_probe_python(settings.local.python, f"healthd probe runs {args.name} on this machine")
    timeout = args.timeout or settings.probes.get(args.name, ProbeSettings()).timeout_s
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
