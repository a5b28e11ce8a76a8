"""The ``healthd`` command line: builds the parser from ``healthd.commands`` and dispatches.

Exit codes: 0 success, 1 the command ran and found trouble (a probe that could not run, a
failing node, an unreachable cluster), 2 usage or configuration error.
"""

from __future__ import annotations

import argparse
import importlib
import os
import pkgutil
import sys
from collections.abc import Sequence

import healthd
import healthd.commands
from healthd.commands.common import EXIT_OK, EXIT_TROUBLE, EXIT_USAGE
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


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Options in any order; a command that passes options on (``probe``) gets the unknown ones
    in ``probe_args``, any other command refuses them (exit 2)."""
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        if not getattr(args, "passes_unknown_args", False):
            parser.error(f"unrecognized arguments: {' '.join(unknown)}")
        args.probe_args = [*args.probe_args, *unknown]
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    try:
        return int(args.func(args))
    except BrokenPipeError:
        # the reader went away (``healthd status | head``): what it wanted it has; no traceback
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_OK
    except ConfigError as exc:
        print(f"healthd: configuration error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except HealthdError as exc:
        print(f"healthd: {exc}", file=sys.stderr)
        return EXIT_TROUBLE


if __name__ == "__main__":
    sys.exit(main())
