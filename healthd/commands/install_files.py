"""``healthd install-files``: copy the shipped systemd units, Grafana dashboards, alert rules and
example config to where an admin wants them (nothing is overwritten unless ``--force``)."""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

from healthd.commands.common import EXIT_OK, EXIT_TROUBLE
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


def cmd_install_files(args: argparse.Namespace) -> int:
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
        print(f"{'would copy' if args.dry_run else 'copy'} {source} -> {target}")
        if not args.dry_run:
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, target)
    print(f"{len(copies) - skipped} file(s) {'to install' if args.dry_run else 'installed'}, {skipped} kept")
    return EXIT_OK
