"""``healthd install-files``: copy the shipped systemd units, Grafana dashboards, alert rules and
example config to where an admin wants them (nothing is overwritten unless ``--force``, and an edited
config never: the example goes to ``healthd.toml.new`` beside it), write the node check's wrappers for
Slurm (``usr/libexec/healthd/node-check-{prolog,epilog,health}``) and print the slurm.conf lines that
turn them on (docs/slurm.md).

The wrappers carry two values of the config, ``[slurm] python`` and the results directory, so they
are written only from an edited config: with no config, or one still equal to the shipped example,
they are refused (said on stderr, with what to edit), never written with the admin node's values."""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import sys
from pathlib import Path

from healthd.commands.common import EXIT_OK, EXIT_TROUBLE, add_config_option, settings_from
from healthd.config import DEFAULT_CONFIG_PATH, Settings
from healthd.resources import DATA_DIRS, EXAMPLE_CONFIG, data_root

LAYOUT = {
    "systemd/healthd.service": "lib/systemd/system/healthd.service",
    "systemd/healthd.sysusers": "lib/sysusers.d/healthd.conf",
    "systemd/healthd.tmpfiles": "lib/tmpfiles.d/healthd.conf",
    EXAMPLE_CONFIG: "etc/healthd/healthd.toml",
    "grafana": "usr/share/healthd/grafana",
}


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("install-files", help="copy systemd units, dashboards, alert rules and example config")
    p.add_argument("--prefix", type=Path, default=Path("/"), help="root to install under (default /)")
    p.add_argument("--force", action="store_true", help="overwrite existing files")
    p.add_argument("--dry-run", action="store_true", help="print what would be copied")
    p.add_argument("--node-check-python", default=None, metavar="PATH",
                   help="the Python on compute nodes that runs the node check (default: [slurm] python)")
    add_config_option(p)
    p.set_defaults(func=cmd_install_files)


def plan_copies(root: Path, prefix: Path) -> list[tuple[Path, Path]]:
    copies: list[tuple[Path, Path]] = []
    for rel, target in LAYOUT.items():
        source = root / rel
        if source.is_dir():
            copies += [(f, prefix / target / f.relative_to(source)) for f in sorted(source.rglob("*"))
                       if f.is_file() and "__pycache__" not in f.parts]
        elif source.is_file():
            copies.append((source, prefix / target))
    return copies


WRAPPER_DIR = "usr/libexec/healthd"
LOG_TAG = "healthd-node-check"
CONTEXTS = ("prolog", "epilog", "health")


def node_check_wrapper(context: str, python: str, results_dir: Path) -> str:
    """The shell wrapper Slurm runs for ``context``. Only the check's exit 1 (the node is certainly
    broken) leaves it as non-zero: a missing Python, a crash, a signal exit 0 with the reason on stderr,
    so a broken check never drains a healthy node."""
    py, results = shlex.quote(python), shlex.quote(str(results_dir))
    return f"""#!/bin/sh
# healthd node check, {context} context: written by `healthd install-files` (docs/slurm.md).
# Exit 1 only when the node is certainly broken (Slurm then drains it); anything else is exit 0.
# Slurm keeps no Prolog/Epilog output: why the check did not run also goes to the node's
# syslog/journal (journalctl -t {LOG_TAG}).
PY={py}
RESULTS={results}
say() {{
    echo "healthd node-check: $*" >&2
    command -v logger >/dev/null 2>&1 && logger -t {LOG_TAG} -p daemon.warning -- "{context}: $*"
    return 0
}}
if [ ! -x "$PY" ]; then
    say "$PY is not there; not run (exit 0)"
    exit 0
fi
if [ ! -d "$RESULTS" ]; then
    say "the results directory $RESULTS is not there; not run (exit 0)"
    exit 0
fi
"$PY" -m probes.boundary --context {context} --results-dir "$RESULTS" "$@"
rc=$?
[ "$rc" -eq 1 ] && exit 1
[ "$rc" -ne 0 ] && say "ended with status $rc: not the node's fault (exit 0)"
exit 0
"""


def slurm_conf_lines(wrapper_dir: Path, settings: Settings) -> list[str]:
    """What slurm.conf needs for the wrappers in ``wrapper_dir`` (``HealthCheck*`` only with an interval)."""
    lines = [f"Prolog={wrapper_dir / 'node-check-prolog'}", f"Epilog={wrapper_dir / 'node-check-epilog'}"]
    interval = settings.node_check.health_interval_s
    if interval > 0:
        lines += [f"HealthCheckProgram={wrapper_dir / 'node-check-health'}", f"HealthCheckInterval={interval}",
                  "HealthCheckNodeState=ANY,CYCLE"]
    return lines


def unedited_config(config_path: Path | None, example: Path) -> str | None:
    """Why the wrappers may not be written from ``config_path`` yet, or ``None``."""
    if config_path is None:
        return "there is no config yet"
    try:
        if config_path.read_bytes() == example.read_bytes():
            return f"{config_path} is still the shipped example"
    except OSError:
        return None
    return None


def install_wrappers(args: argparse.Namespace, settings: Settings, config_path: Path | None) -> int:
    """Write the three wrappers (kept when they exist, unless ``--force``); the count written. Refused
    (said on stderr) while the config is not edited: they would carry the admin node's values."""
    if why := unedited_config(config_path, data_root() / EXAMPLE_CONFIG):
        config = config_path or DEFAULT_CONFIG_PATH
        print(f"node-check wrappers NOT written: {why}, and they would carry this admin node's Python "
              f"({settings.slurm.python}) and results directory ({settings.results_dir}), which compute nodes "
              f"may not have. Edit {config} first ([slurm] python: the Python on the compute nodes; [slurm] "
              "results_dir: a directory they share with this node), then run `healthd install-files` again "
              "(it keeps the files already there).", file=sys.stderr)
        return 0
    python = args.node_check_python or settings.slurm.python
    written = 0
    for context in CONTEXTS:
        target = args.prefix / WRAPPER_DIR / f"node-check-{context}"
        if target.exists() and not args.force:
            print(f"exists, kept: {target}")
            continue
        print(f"{'would write' if args.dry_run else 'write'} {target}")
        if not args.dry_run:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(node_check_wrapper(context, python, settings.results_dir))
            os.chmod(target, 0o755)
        written += 1
    return written


def _keep_edited_config(source: Path, target: Path, dry_run: bool) -> None:
    """``--force`` on an existing config: an edited one is kept and the example written beside it."""
    if target.read_bytes() == source.read_bytes():
        print(f"unchanged: {target}")
        return
    new = target.with_name(target.name + ".new")
    print(f"kept the edited {target}; {'would write' if dry_run else 'wrote'} the shipped example to {new} "
          f"(compare: diff -u {target} {new})")
    if not dry_run:
        shutil.copyfile(source, new)


def cmd_install_files(args: argparse.Namespace) -> int:
    settings, config_path = settings_from(args)
    root = data_root()
    copies = plan_copies(root, args.prefix)
    missing = [d for d in DATA_DIRS if not (root / d).is_dir()]
    if missing:
        print(f"healthd: shipped data incomplete under {root}: missing {missing}")
        return EXIT_TROUBLE
    skipped = 0
    for source, target in copies:
        if target.exists() and not args.force:
            print(f"exists, kept: {target}")
            skipped += 1
            continue
        if target.exists() and source.name == EXAMPLE_CONFIG:
            _keep_edited_config(source, target, args.dry_run)
            skipped += 1
            continue
        print(f"{'would copy' if args.dry_run else 'copy'} {source} -> {target}")
        if not args.dry_run:
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, target)
    print(f"{len(copies) - skipped} file(s) {'to install' if args.dry_run else 'installed'}, {skipped} kept")
    install_wrappers(args, settings, config_path)
    print("\n# slurm.conf: healthd's node check at job boundaries (docs/slurm.md); the wrappers must be on"
          " every compute node at this path")
    for line in slurm_conf_lines(Path("/") / WRAPPER_DIR, settings):
        print(line)
    return EXIT_OK
