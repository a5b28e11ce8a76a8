"""``healthd doctor``: which store, which Slurm, which topology, whether Prometheus scrapes healthd and has
its rules, whether the nodes' jobs leave boundary documents; each check with what to do (``healthd.doctor``).
Exit 0 when nothing is to fix, 1 otherwise (a check that could not be made is said, not a failure)."""

from __future__ import annotations

import argparse
import json

from healthd.commands.common import EXIT_OK, EXIT_TROUBLE, add_config_option, settings_from


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("doctor", help="check this admin node's healthd: store, Slurm, topology, Prometheus, node check")
    add_config_option(p)
    p.add_argument("--json", action="store_true")
    p.add_argument("--prometheus", metavar="URL", default=None,
                   help="the Prometheus that scrapes healthd (default: [passive] prometheus_url)")
    p.set_defaults(func=cmd_doctor)


def cmd_doctor(args: argparse.Namespace) -> int:
    from healthd.doctor import (
        boundary_check,
        format_report,
        prometheus_checks,
        prometheus_fetch,
        report,
        shipped_alerts,
        slurm_checks,
        store_checks,
    )
    from healthd.passive.client import PrometheusClient
    from healthd.resources import data_root

    settings, config_path = settings_from(args)
    checks, nodes, with_documents = store_checks(settings, config_path)
    checks += slurm_checks(settings)
    url = args.prometheus or settings.passive.prometheus_url
    fetch = None
    if url is not None:
        headers = PrometheusClient(settings.passive).headers() if settings.passive.prometheus_url == url else {}
        fetch = prometheus_fetch(url, headers, settings.passive.timeout_s)
    checks += prometheus_checks(url, fetch, settings.http.port, shipped_alerts(data_root()))
    if nodes is not None:
        checks.append(boundary_check(nodes, with_documents, settings.results_dir))
    if args.json:
        print(json.dumps(report(checks), indent=1, sort_keys=True))
    else:
        print(format_report(checks))
    return EXIT_OK if report(checks)["ok"] else EXIT_TROUBLE
