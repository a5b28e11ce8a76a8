"""``healthd run`` and ``healthd check-config``."""

from __future__ import annotations

import argparse

from healthd.commands.common import EXIT_OK, add_config_option, settings_from
from healthd.config import Settings


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
    if problem := reboot_problem(settings):
        raise ConfigError(problem)
    if settings.http.web_config_file:
        web = load_web_config(settings.http.web_config_file)
        print(f"web config OK: {settings.http.web_config_file} (TLS {'on' if web.tls else 'off'},"
              f" {len(web.users)} basic auth user(s))")
    print(f"config OK: {path or 'built-in defaults'}")
    if user is not None:
        print(f"  service user: {user.name} (uid {user.uid}; {user.source})")
    print(f"  backend: {settings.backend}; store: {settings.store_path}; "
          f"http: {settings.http.host}:{settings.http.port}; remediation: {settings.remediation.mode}"
          f"{'' if settings.remediation.repair == 'none' else ', repair: ' + settings.remediation.repair}")
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


def reboot_problem(settings: Settings) -> str | None:
    """Why ``[remediation] repair = "reboot"`` cannot work on this cluster (Slurm has no ``RebootProgram``,
    or cannot say), else ``None``."""
    from healthd.cluster.slurm_cli import SlurmCli
    from healthd.errors import SlurmError

    if settings.remediation.repair != "reboot":
        return None
    if settings.backend == "local":
        return "remediation.repair = 'reboot' needs Slurm (backend = 'local' cannot reboot a node)"
    try:
        program = SlurmCli(bin_dir=settings.slurm.bin_dir, timeout_s=settings.slurm.command_timeout_s).reboot_program()
    except SlurmError as exc:
        return f"remediation.repair = 'reboot': cannot read Slurm's RebootProgram (scontrol show config): {exc}"
    if program is None:
        return ("remediation.repair = 'reboot' needs Slurm's RebootProgram, and slurm.conf sets none "
                "(scontrol show config: RebootProgram = (null)); set it, or use repair = 'command' or 'none'")
    return None
