"""``healthd ha init`` (create or upgrade the HA schema) and ``healthd ha status`` (who leads, since when)."""

from __future__ import annotations

import argparse
import json

from healthd.commands.common import EXIT_OK, EXIT_TROUBLE, add_config_option, settings_from
from healthd.errors import ConfigError
from healthd.ha.lease import Connection


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("ha", help="two admin nodes on the site's MariaDB ([ha]): init the schema, show the leader")
    verbs = p.add_subparsers(dest="ha_command", required=True, metavar="VERB")
    init = verbs.add_parser("init", help="create the schema in [ha] url's database, or upgrade it (idempotent)")
    add_config_option(init)
    init.set_defaults(func=cmd_init)
    status = verbs.add_parser("status", help="the leader, its epoch and since when (exit 1: no one leads)")
    add_config_option(status)
    status.add_argument("--json", action="store_true")
    status.set_defaults(func=cmd_status)


def _connection(args: argparse.Namespace) -> Connection:
    from healthd.ha.lease import connect, target

    settings, _ = settings_from(args)
    if settings.ha.mode == "off":
        raise ConfigError("[ha] mode is 'off' in this config: set mode = 'mariadb', url and password_file")
    return connect(target(settings.ha), settings.ha.timeout_s)


def cmd_init(args: argparse.Namespace) -> int:
    from healthd.ha.lease import SCHEMA_VERSION, init_schema

    conn = _connection(args)
    try:
        before = init_schema(conn)
    finally:
        conn.close()
    if before == SCHEMA_VERSION:
        print(f"healthd ha: schema version {SCHEMA_VERSION} already in place")
    else:
        print(f"healthd ha: schema version {before} -> {SCHEMA_VERSION}" if before else
              f"healthd ha: schema version {SCHEMA_VERSION} created")
    return EXIT_OK


def cmd_status(args: argparse.Namespace) -> int:
    """With ``[ha] mode = "off"`` there is no lease to read: the one instance leads alone (its
    ``healthd_leader`` is 1), said and exit 0, so a runbook's ``healthd ha status`` answers on any site."""
    from healthd.ha.lease import read_lease

    settings, _ = settings_from(args)
    if settings.ha.mode == "off":
        if args.json:
            print(json.dumps({"mode": "off", "leader": "this instance (alone)"}, sort_keys=True))
        else:
            print("[ha] mode is off: one admin node, this instance leads alone (healthd_leader 1); "
                  "docs/ha.md sets up two")
        return EXIT_OK
    lease = read_lease(settings.ha)
    leads = lease.holder if lease.live and lease.holder else None
    if args.json:
        print(json.dumps({"leader": leads, "epoch": lease.epoch, "since": lease.since,
                          "expires_at": lease.expires_at, "last_holder": lease.holder}, sort_keys=True))
    elif leads:
        print(f"leader {leads}, epoch {lease.epoch}, since {lease.since} (lease until {lease.expires_at}, "
              "database clock)")
    else:
        print(f"no leader (last: {lease.holder or 'none'}, epoch {lease.epoch}, lease ran out {lease.expires_at})")
    return EXIT_OK if leads else EXIT_TROUBLE
