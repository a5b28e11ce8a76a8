"""``healthd simulate --scenario FILE`` and ``healthd replay --config NEW``."""

from __future__ import annotations

import argparse
import json
import math
import re
import time
from datetime import UTC, datetime
from pathlib import Path

from healthd.commands.common import EXIT_OK, EXIT_TROUBLE
from healthd.errors import ConfigError, HealthdError


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("simulate", help="run a synthetic fleet scenario through the real planner, judge and "
                                        "remediation, and print what was found")
    p.add_argument("--scenario", required=True, metavar="FILE", help="scenario TOML (see docs/judgement.md)")
    p.add_argument("--rounds", type=int, default=None, help="override the scenario's number of rounds")
    p.add_argument("--noise", type=float, default=None, metavar="X",
                   help="multiply every class's noise by X (a sweep: a class at noise = 0.01 and --noise 4 is 4%%)")
    p.add_argument("--quiet", action="store_true", help="only the final table")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(func=cmd_simulate)

    p = sub.add_parser("replay", help="re-judge the stored history with another config and show what changes")
    p.add_argument("--config", "-c", required=True, metavar="NEW", help="the config to try")
    p.add_argument("--current", metavar="PATH",
                   help="the config in force (default: $HEALTHD_CONFIG, else /etc/healthd/healthd.toml if present)")
    p.add_argument("--store", metavar="PATH", help="the SQLite store (default: the current config's)")
    p.add_argument("--since", default="7d", help="how far back: 7d, 12h, 30m, an ISO date or a Unix time (default 7d)")
    p.add_argument("--until", default=None, help="same forms as --since (default: now)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_replay)


def cmd_simulate(args: argparse.Namespace) -> int:
    from healthd.logging import setup_logging
    from healthd.simulate import format_report, load_scenario, report_json, scale_noise, simulate

    scenario = load_scenario(Path(args.scenario))
    if args.rounds is not None:
        if args.rounds < 1:
            raise ConfigError("--rounds must be at least 1")
        scenario = scenario.model_copy(update={"rounds": args.rounds})
    if args.noise is not None:
        scenario = scale_noise(scenario, args.noise)
    setup_logging("error", "console")
    report = simulate(scenario, echo=not (args.quiet or args.json))
    print(report_json(report) if args.json else "\n" + format_report(report))
    return EXIT_OK if report.ok else EXIT_TROUBLE


_RELATIVE = re.compile(r"^(\d+(?:\.\d+)?)([smhd])$")


def parse_when(text: str, *, now: float) -> float:
    """``7d``/``12h``/``30m``/``45s`` before ``now``, an ISO date or time (UTC if no zone), or a Unix time."""
    text = text.strip()
    match = _RELATIVE.match(text)
    if match:
        return now - float(match.group(1)) * {"s": 1, "m": 60, "h": 3600, "d": 86400}[match.group(2)]
    try:
        return float(text)
    except ValueError:
        pass
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise ConfigError(f"cannot read {text!r} as a time: use 7d, 12h, 30m, 2026-11-01[T12:00] or a Unix time") \
            from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.timestamp()


def cmd_replay(args: argparse.Namespace) -> int:
    from healthd.config import load_settings, resolve_config_path
    from healthd.replay import format_replay, replay, to_dict
    from healthd.store import Store

    new, new_path = load_settings(args.config)
    current_path = resolve_config_path(args.current)
    old, _ = load_settings(current_path)
    store_path = Path(args.store) if args.store else old.store_path
    if not store_path.exists():
        raise HealthdError(f"no state store at {store_path}")
    now = time.time()
    since = parse_when(args.since, now=now)
    until = parse_when(args.until, now=now) if args.until else math.inf
    store = Store(store_path, read_only=True)
    try:
        report = replay(store, old, new, since=since, until=until,
                        old_source=str(current_path or "built-in defaults"), new_source=str(new_path))
    finally:
        store.close()
    print(json.dumps(to_dict(report), indent=1, sort_keys=True) if args.json else format_replay(report))
    return EXIT_OK
