"""``healthd node-check --context {prolog,epilog,health}``: the node check at job boundaries.

The same check as ``healthd-node-check`` and ``python -m probes.boundary`` (``probes.boundary``,
which documents the checks, budgets and exit status). This entry point builds healthd's whole
command line first (about 0.3 s more start-up): Slurm's wrappers use the light ones.
"""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("node-check", add_help=False,
                       help="the node check for Slurm's Prolog/Epilog/HealthCheckProgram (see healthd-node-check)")
    p.set_defaults(func=cmd_node_check, passes_unknown_args=True, probe_args=[])


def cmd_node_check(args: argparse.Namespace) -> int:
    from probes.boundary import main

    return main(list(args.probe_args))
