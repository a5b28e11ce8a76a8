"""``python -m probes <name> [common options] [probe options]``, a name from ``probes.catalogue``,
or ``python -m probes check ...``: several probes after one start-up (:mod:`probes.check`).

Exit codes: 0 the probe ran (outcome ``pass`` or ``fail``), 1 it could not run (outcome
``error``; the document is still written, with the reason), 2 usage error (argparse).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence

from probes.catalogue import CATALOGUE, CHECK_COMMAND, PROBE_NAMES, ProbeName
from probes.context import CommandModule, ProbeModule, probe_module
from probes.dist import LaunchError, detect_launch, node_name
from probes.expect import parse_uuid_list
from probes.options import int_at_least, positive_float
from probes.report import emit, render, reserve_stdout
from probes.result import Outcome, ProbeResult
from probes.timing import process_start_time


def common_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    g = common.add_argument_group("common options")
    g.add_argument(
        "--backend", choices=("auto", "gloo", "nccl"), default="auto", help="auto: nccl on CUDA devices, gloo on CPU"
    )
    g.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    g.add_argument(
        "--nproc",
        type=int_at_least(1),
        default=None,
        help="standalone only: local ranks to spawn (default: visible GPUs, or 2 on CPU)",
    )
    g.add_argument(
        "--timeout",
        type=positive_float,
        default=120.0,
        help="seconds for the whole probe, start-up included (default 120)",
    )
    g.add_argument("--run-id", default=None, help="an id copied into the result")
    g.add_argument("--output", default=None, help="write the result there (atomically) instead of stdout")
    g.add_argument("--format", choices=("json", "table"), default="json")
    g.add_argument(
        "--expect-gpus",
        type=int_at_least(0),
        default=None,
        help="GPUs every node must show (default: the node's rank count on CUDA, none on CPU); "
        "with N > 0 the probe never falls back to the CPU: a node with fewer GPUs fails (gpus_missing)",
    )
    g.add_argument(
        "--expect-gpu-uuids",
        type=_uuid_list,
        default=(),
        metavar="GPU-…,GPU-…",
        help="the UUIDs the node's GPUs had when last seen: a missing GPU is named by its UUID",
    )
    return common


def _uuid_list(text: str) -> tuple[str, ...]:
    try:
        return parse_uuid_list(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m probes",
        description="healthd probes for compute nodes; prints one ProbeResult JSON document",
    )
    sub = parser.add_subparsers(dest="probe", required=True,
                                metavar="{" + ",".join((*PROBE_NAMES, CHECK_COMMAND)) + "}")
    common = common_parser()
    for name, spec in CATALOGUE.items():
        if not spec.torch:
            command: CommandModule = probe_module(name)
            command.register(sub, common)
            continue
        module: ProbeModule = probe_module(name)
        p = sub.add_parser(name.value, parents=[common], help=module.HELP, description=module.HELP)
        module.add_arguments(p)
    from probes import check

    check.register(sub, common)
    return parser


def _launch_error(module: ProbeModule, args: argparse.Namespace, reason: str) -> int:
    reserve_stdout()
    now = time.time()
    result = ProbeResult(
        probe=module.NAME,
        run_id=args.run_id,
        outcome=Outcome.ERROR,
        reason=reason,
        started_at=process_start_time(),
        finished_at=now,
        nodes=[node_name()],
        params={"backend": args.backend, "device": args.device, "timeout_s": args.timeout},
    )
    emit(render(result, args.format, module.format_table), args.output)
    return 1


def main(argv: Sequence[str] | None = None) -> int:
    raw = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args = parser.parse_args(raw)
    if args.probe == CHECK_COMMAND:
        from probes import check

        return check.main(args, raw, parser)
    spec = CATALOGUE[ProbeName(args.probe)]
    if not spec.torch:
        command: CommandModule = probe_module(spec.name)
        return command.run(args)
    module: ProbeModule = probe_module(spec.name)
    try:
        launch = detect_launch(os.environ)
    except LaunchError as exc:
        return _launch_error(module, args, f"cannot determine the launch: {exc}")
    if launch is None:
        from probes.launch import run_standalone

        return run_standalone(module, args, raw)
    from probes.runner import run_rank

    return run_rank(module, args, launch)


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
