"""``healthd recommend``, ``drain``, ``undrain``, ``breaker`` and ``audit``: remediation by hand.

``drain``/``undrain`` follow the daemon's ownership rules (never a node drained by someone
else; only healthd's own drains are undone) and are written to the audit table like the
daemon's own actions.
"""

from __future__ import annotations

import argparse
import getpass
import json
from collections.abc import Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from healthd.commands.common import EXIT_OK, EXIT_TROUBLE, add_config_option, settings_from
from healthd.config import Settings
from healthd.errors import HealthdError

if TYPE_CHECKING:
    from healthd.remediation import Action, Remediator


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("recommend", help="drain recommendations, fleet events and the breaker state")
    add_config_option(p)
    p.add_argument("--json", action="store_true")
    p.add_argument("--all", action="store_true", help="also closed recommendations (cleared, withdrawn, dismissed)")
    p.set_defaults(func=cmd_recommend)

    p = sub.add_parser("drain", help="drain a node with a healthd reason (never one drained by someone else)")
    add_config_option(p)
    p.add_argument("node")
    p.add_argument("--reason", default="by an operator", help="free text after 'healthd: manual'")
    p.set_defaults(func=cmd_drain)

    p = sub.add_parser("undrain", help="undrain a node healthd drained (never one drained by someone else)")
    add_config_option(p)
    p.add_argument("node")
    p.set_defaults(func=cmd_undrain)

    p = sub.add_parser("breaker", help="show the remediation circuit breaker, or --reset it")
    add_config_option(p)
    p.add_argument("--reset", action="store_true", help="close an open breaker")
    p.set_defaults(func=cmd_breaker)

    p = sub.add_parser("audit", help="remediation actions and refusals, newest first")
    add_config_option(p)
    p.add_argument("--node")
    p.add_argument("--limit", type=int, default=50)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_audit)


def _store(args: argparse.Namespace, *, write: bool) -> tuple[Settings, Any]:
    """The settings and the store (``healthd.service_store.open_store``: read-only unless ``write``)."""
    from healthd.service_store import open_store

    settings, config_path = settings_from(args)
    return settings, open_store(settings, config_path, write=write, command=args.command,
                                argv=getattr(args, "argv", None))


def _when(ts: float | None) -> str:
    return datetime.fromtimestamp(ts, tz=UTC).strftime("%Y-%m-%d %H:%M:%S UTC") if ts else "-"


def _actor() -> str:
    try:
        return f"operator:{getpass.getuser()}"
    except (KeyError, OSError):
        return "operator"


def cmd_recommend(args: argparse.Namespace) -> int:
    from healthd.remediation import recommendations_document

    settings, store = _store(args, write=False)
    try:
        doc = recommendations_document(store, settings.remediation)
        closed = store.recommendations(states=("cleared", "withdrawn", "dismissed"), limit=200) if args.all else []
    finally:
        store.close()
    if args.json:
        doc["closed"] = [{"node": r.node, "probe": r.probe, "state": r.state, "reason_code": r.reason_code,
                          "since": r.since, "closed_at": r.closed_at, "close_reason": r.close_reason} for r in closed]
        print(json.dumps(doc, indent=1, sort_keys=True))
        return EXIT_OK
    print(f"remediation mode: {doc['mode']}; breaker: {'OPEN' if doc['breaker'].get('open') else 'closed'}"
          + (f" ({doc['breaker'].get('reason')})" if doc["breaker"].get("open") else ""))
    for e in doc["fleet_events"]:
        print(f"FLEET EVENT since {_when(e['started_at'])}: {e['text']}")
    for e in doc["switch_findings"]:
        print(f"SWITCH {e['switch']} since {_when(e['started_at'])}: {e['action']}")
        print(f"    {e['text']}")
    for f in doc["link_findings"]:
        print(f"LINK {f['a']} <-> {f['b']} ({f['probe']}) since {_when(f['started_at'])}: {f['action']}")
        print(f"    {f['text']}")
    recs = doc["recommendations"]
    if not recs:
        print("no drain recommended")
    for r in recs:
        flags = " [escalated: needs a human]" if r["escalated"] else ""
        print(f"{r['node']:<16} {r['probe']:<6} {r['outcome']:<9} {r['reason_code']:<15} since {_when(r['since'])}"
              + flags)
        print(f"    {r['text']}")
        if r["refused"]:
            print(f"    not drained: {r['refused']}")
        if r["repair"]:
            print(f"    repair: {r['repair']}")
    for p in doc["repairs"]:
        print(f"repair under way: {p['node']} {p['kind']} since {_when(p['started_at'])}, {p['state']}: {p['reason']}")
    for d in doc["drained_by_healthd"]:
        print(f"drained by healthd: {d['node']} since {_when(d['since'])}: {d['reason']}")
    for r in closed:
        print(f"closed {r.state:<9} {r.node:<16} {r.probe:<6} {r.reason_code:<15} {_when(r.closed_at)}: "
              f"{r.close_reason}")
    return EXIT_TROUBLE if recs else EXIT_OK


def _remediator(args: argparse.Namespace) -> tuple[Any, Any]:
    from healthd.cluster import make_backend
    from healthd.remediation import Remediator

    settings, store = _store(args, write=True)
    return Remediator(store, make_backend(settings, runs_probes=False), settings.remediation), store


def cmd_drain(args: argparse.Namespace) -> int:
    return _by_hand(args, lambda remediator: remediator.drain(args.node, args.reason, actor=_actor()))


def cmd_undrain(args: argparse.Namespace) -> int:
    return _by_hand(args, lambda remediator: remediator.undrain(args.node, actor=_actor()))


def _by_hand(args: argparse.Namespace, act: Callable[[Remediator], Action]) -> int:
    """An operator's drain or undrain: the same ownership rules, one audit line, printed."""
    remediator, store = _remediator(args)
    try:
        action = act(remediator)
    finally:
        store.close()
    print(f"{action.action} {args.node}: {action.result}: {action.reason}")
    return EXIT_OK if action.result == "done" else EXIT_TROUBLE


def cmd_breaker(args: argparse.Namespace) -> int:
    from healthd.remediation import BREAKER_KEY, Remediator

    settings, store = _store(args, write=args.reset)
    try:
        if args.reset:
            action = Remediator(store, _NoCluster(), settings.remediation).reset_breaker(actor=_actor())
            print(f"breaker: {action.result}: {action.reason}")
            return EXIT_OK if action.result == "done" else EXIT_TROUBLE
        state = store.remediation_state(BREAKER_KEY) or {"open": False}
    finally:
        store.close()
    if state.get("open"):
        print(f"breaker OPEN since {_when(state.get('opened_at'))}: {state.get('reason')}")
        return EXIT_TROUBLE
    print("breaker closed" + (f" (last closed {_when(state.get('closed_at'))})" if state.get("closed_at") else ""))
    return EXIT_OK


class _NoCluster:
    """Resetting the breaker touches no node."""

    name = "none"

    def list_nodes(self) -> list[Any]:
        return []

    def drain(self, node: str, reason: str) -> None:
        raise HealthdError("not available")

    def undrain(self, node: str) -> None:
        raise HealthdError("not available")


def cmd_audit(args: argparse.Namespace) -> int:
    _, store = _store(args, write=False)
    try:
        rows = store.audit(limit=args.limit, node=args.node)
    finally:
        store.close()
    if args.json:
        print(json.dumps([r.__dict__ for r in rows], indent=1, sort_keys=True))
        return EXIT_OK
    for r in rows:
        print(f"{_when(r.at)}  {r.actor:<18} {r.action:<13} {r.result:<8} {r.node or '-':<16} {r.reason}")
    if not rows:
        print("no remediation actions recorded")
    return EXIT_OK
