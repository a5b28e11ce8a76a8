"""``healthd evidence NODE``: everything the store holds on a node, as JSON for a ticket (``healthd.evidence``)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from healthd.commands.common import EXIT_OK, add_config_option, settings_from
from healthd.errors import HealthdError


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("evidence", help="a node's verdicts, runs, values, drains, repairs and audit as JSON "
                                        "(a ticket's attachment); reads the store only")
    add_config_option(p)
    p.add_argument("node")
    p.add_argument("--out", type=Path, metavar="FILE.tar.gz",
                   help="also write a gzip'd tar with evidence.json and the raw result documents of its runs")
    p.set_defaults(func=cmd_evidence)


def cmd_evidence(args: argparse.Namespace) -> int:
    from healthd.evidence import evidence_document, write_bundle
    from healthd.http import ApiError
    from healthd.service_store import open_store

    settings, config_path = settings_from(args)
    store = open_store(settings, config_path, write=False, command="evidence")
    try:
        doc = evidence_document(store, args.node)
    except ApiError as exc:
        raise HealthdError(f"evidence {args.node}: {exc}") from None
    finally:
        store.close()
    if args.out is not None:
        if not str(args.out).endswith((".tar.gz", ".tgz")):
            raise HealthdError(f"--out {args.out}: name it FILE.tar.gz (a gzip'd tar is written)")
        left_out = write_bundle(doc, args.out)
        print(f"healthd evidence: wrote {args.out}" + (f"; left out: {'; '.join(left_out)}" if left_out else ""),
              file=sys.stderr)
    print(json.dumps(doc, indent=1, sort_keys=True))
    return EXIT_OK
