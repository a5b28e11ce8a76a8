"""``healthd run`` and ``healthd check-config``."""

from __future__ import annotations

import argparse

from healthd.commands.common import EXIT_OK, add_config_option, settings_from


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("run", help="run the daemon in the foreground")
    add_config_option(p)
    p.set_defaults(func=cmd_run)
    p = sub.add_parser("check-config", help="validate the configuration and print where it came from")
    add_config_option(p)
    p.set_defaults(func=cmd_check_config)


def cmd_run(args: argparse.Namespace) -> int:
    from healthd.daemon import run_daemon

    return run_daemon(args.config)


def cmd_check_config(args: argparse.Namespace) -> int:
    from healthd.collector import results_dir_problem
    from healthd.errors import ConfigError
    from healthd.service_store import service_user
    from healthd.webconfig import load_web_config

    settings, path = settings_from(args)
    user = service_user(settings)
    if problem := results_dir_problem(settings.results_dir, owner=user.uid if user else None):
        raise ConfigError(problem)
    if settings.http.web_config_file:
        web = load_web_config(settings.http.web_config_file)
        print(f"web config OK: {settings.http.web_config_file} (TLS {'on' if web.tls else 'off'},"
              f" {len(web.users)} basic auth user(s))")
    print(f"config OK: {path or 'built-in defaults'}")
    if user is not None:
        print(f"  service user: {user.name} (uid {user.uid}; {user.source})")
    print(f"  backend: {settings.backend}; store: {settings.store_path}; "
          f"http: {settings.http.host}:{settings.http.port}; remediation: {settings.remediation.mode}")
    for name, probe in sorted(settings.probes.items()):
        state = "enabled" if probe.enabled else "disabled"
        print(f"  probe {name}: {state}, every {probe.interval_s:g} s, timeout {probe.timeout_s:g} s")
    passive = settings.passive
    if passive.prometheus_url is None:
        print("  passive signals: off ([passive] prometheus_url not set)")
    else:
        print(f"  passive signals: {passive.prometheus_url} every {passive.interval_s:g} s, timeout "
              f"{passive.timeout_s:g} s; fault XIDs {passive.xid.fault}, application XIDs {passive.xid.application}")
    return EXIT_OK
