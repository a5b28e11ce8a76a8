"""Helpers shared by the subcommands: config loading, exit codes."""

from __future__ import annotations

import argparse
from pathlib import Path

from healthd.config import Settings, load_settings

EXIT_OK, EXIT_TROUBLE, EXIT_USAGE = 0, 1, 2



def add_config_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", "-c", metavar="PATH",
                   help="TOML config file (default: $HEALTHD_CONFIG, else /etc/healthd/healthd.toml if present)")


def settings_from(args: argparse.Namespace) -> tuple[Settings, Path | None]:
    return load_settings(args.config)
