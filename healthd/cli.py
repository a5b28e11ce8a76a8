"""The ``healthd`` command line: builds the parser from ``healthd.commands`` and dispatches.

Exit codes: 0 success, 1 the command ran and found trouble (a probe that could not run, a
failing node, an unreachable cluster), 2 usage or configuration error.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys
from collections.abc import Sequence

import healthd
import healthd.commands
from healthd.commands.common import EXIT_TROUBLE, EXIT_USAGE
from healthd.errors import ConfigError, HealthdError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="healthd", description="Continuous health monitor for Slurm GPU clusters.")
    parser.add_argument("--version", action="version", version=f"healthd {healthd.__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for info in sorted(pkgutil.iter_modules(healthd.commands.__path__), key=lambda i: i.name):
        module = importlib.import_module(f"healthd.commands.{info.name}")
        register = getattr(module, "register", None)
        if register is not None:
            register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except ConfigError as exc:
        print(f"healthd: configuration error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except HealthdError as exc:
        print(f"healthd: {exc}", file=sys.stderr)
        return EXIT_TROUBLE


if __name__ == "__main__":
    sys.exit(main())
