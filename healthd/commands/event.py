"""``healthd event start --class CLASS --reason TEXT`` / ``healthd event end --class CLASS`` / ``healthd event
list``: declare that a node class is being changed (a driver or firmware roll-out), so that the judge holds its
flags as a class-wide event's, by intent, instead of recommending its nodes one by one.

The declaration goes through the store (it survives a restart of either side); the running daemon reads it at
its next collect tick (``healthd.judge.sources.declared``) and shows it as a fleet event
(``healthd_fleet_event_active{probe="*"}``). A failed check or missing GPUs still count against a node.
"""

from __future__ import annotations

import argparse
import getpass
import sys
import time

from healthd.commands.common import EXIT_OK, EXIT_TROUBLE, add_config_option, settings_from


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("event", help="declare that a node class is being changed (its flags are held as an event's)")
    add_config_option(p)
    verbs = p.add_subparsers(dest="verb", required=True)
    start = verbs.add_parser("start", help="declare an event on a class")
    add_config_option(start)
    start.add_argument("--class", dest="node_class", required=True, metavar="CLASS", help="the node class")
    start.add_argument("--reason", required=True, help="why (shown in the event, its alert and each held verdict)")
    end = verbs.add_parser("end", help="end the declared event on a class")
    add_config_option(end)
    end.add_argument("--class", dest="node_class", required=True, metavar="CLASS", help="the node class")
    listing = verbs.add_parser("list", help="the declared events in force")
    add_config_option(listing)
    p.set_defaults(func=cmd_event)


def cmd_event(args: argparse.Namespace) -> int:
    from healthd.service_store import open_store

    settings, config_path = settings_from(args)
    if not settings.store_path.exists():
        print(f"healthd: no store at {settings.store_path}: is the daemon running with this config?", file=sys.stderr)
        return EXIT_TROUBLE
    store = open_store(settings, config_path, write=args.verb != "list", command="event",
                       argv=getattr(args, "argv", None))
    try:
        now, who = time.time(), getpass.getuser()
        if args.verb == "start":
            if not args.reason.strip():
                print("healthd: --reason must say why", file=sys.stderr)
                return EXIT_TROUBLE
            if not store.declare_event(args.node_class, args.reason.strip(), at=now, by=who):
                print(f"healthd: an event is already declared on {args.node_class}", file=sys.stderr)
                return EXIT_TROUBLE
            print(f"declared event on {args.node_class}: {args.reason.strip()} (the daemon holds its flags from its "
                  "next tick)")
        elif args.verb == "end":
            if not store.end_declared_event(args.node_class, at=now, by=who):
                print(f"healthd: no event is declared on {args.node_class}", file=sys.stderr)
                return EXIT_TROUBLE
            print(f"ended the declared event on {args.node_class} (its nodes are probed again before any finding)")
        else:
            for d in store.declared_events():
                print(f"{d.node_class}\tsince {time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime(d.started_at))}Z"
                      f"\tby {d.by}\t{d.reason}")
    finally:
        store.close()
    return EXIT_OK
