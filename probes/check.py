"""``python -m probes check``: several probes after one start-up, each writing its own document.

Command line (an argv list the daemon builds; nothing is split or quoted)::

    python -m probes check --probes env,nccl,gemm,ddp [common options]
        [--run-ids env=ID,gemm=ID,...] [--limits env=S,gemm=S,...]
        [--arg PROBE=TOKEN ...] [--output-dir DIR]

- the common options (``--backend``, ``--device``, ``--nproc``, ``--expect-gpus``, ...) hold for
  every probe; ``--timeout`` covers the whole check, start-up included;
- ``--run-ids``: each probe's ``run_id``; ``--limits``: each probe's own limit in seconds,
  counted from the start of its part (default: whatever is left of ``--timeout``);
- ``--arg PROBE=TOKEN``: one argv token of that probe's own options, in order
  (``--arg gemm=--size --arg gemm=4096``); a probe's own options only, never a common one;
- ``--output-dir DIR``: each document goes to ``DIR/<run id>.json`` (``DIR/<probe>.json`` without
  a run id), written atomically; without it, the documents go to stdout one after the other
  (one JSON document a line, or the tables).

One rank session (:func:`probes.runner.run_check_rank`): rendezvous, liveness and process group
once, then each probe's ``run(ctx)`` in the order of ``--probes``. Each probe's document is the one
it writes alone: its name, run id, its part's ``started_at``/``finished_at``, its measurements,
checks and outcome; ``startup_seconds`` is the shared start-up for the first probe and 0 for the
others, and ``params.check`` says so (``probes``, ``startup_shared``). A body that raises (on every
rank) gives that probe an ``error`` document and the check goes on; a probe that overruns its limit,
a rank that dies or hangs, or the check's timeout end the check: that probe gets the ``error``
document naming the cause and each probe not yet run one saying it was not run.

Exit codes: 0 every probe ran (``pass``/``fail``/``skipped``), 1 one or more got ``error``, 2 usage.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from typing import Any

from probes.catalogue import CHECK_COMMAND, CHECK_PROBES, ProbeName
from probes.context import ProbeModule, probe_module
from probes.dist import LaunchError, LaunchInfo, detect_launch, node_name
from probes.expect import missing_gpus_result
from probes.options import positive_float
from probes.report import emit, render, reserve_stdout
from probes.result import Outcome, ProbeResult
from probes.runner import RESULT_DIR_ENV, CheckPart, exit_code_of
from probes.timing import process_start_time

HELP = "several probes after one start-up (env, nccl, gemm, ddp), one document each"
SHARED = ("backend", "device", "nproc", "format", "expect_gpus", "expect_gpu_uuids")
"""Common options that hold for the whole check (a probe's ``--arg`` may not set them)."""


def _probe_list(text: str) -> tuple[str, ...]:
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    if not names:
        raise argparse.ArgumentTypeError("no probe named")
    for name in names:
        if name not in CHECK_PROBES:
            raise argparse.ArgumentTypeError(f"{name!r} cannot run in a check (choose from {','.join(CHECK_PROBES)})")
    if len(set(names)) != len(names):
        raise argparse.ArgumentTypeError(f"a probe named twice: {text!r}")
    return names


def _pairs(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in text.split(","):
        name, sep, value = item.strip().partition("=")
        if not sep or not name or not value:
            raise argparse.ArgumentTypeError(f"expected PROBE=VALUE[,PROBE=VALUE...], got {item!r}")
        out[name] = value
    return out


def _arg(text: str) -> tuple[str, str]:
    name, sep, token = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"expected PROBE=TOKEN, got {text!r}")
    return name, token


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(CHECK_COMMAND, parents=[common], help=HELP, description=HELP)
    g = p.add_argument_group("check options")
    g.add_argument("--probes", type=_probe_list, default=("env", "nccl", "gemm", "ddp"),
                   metavar="NAME,NAME", help="the probes, in order (default env,nccl,gemm,ddp)")
    g.add_argument("--run-ids", type=_pairs, default={}, metavar="PROBE=ID,...", help="each probe's run id")
    g.add_argument("--limits", type=_pairs, default={}, metavar="PROBE=SECONDS,...",
                   help="each probe's own limit from the start of its part (default: the rest of --timeout)")
    g.add_argument("--arg", type=_arg, action="append", default=[], metavar="PROBE=TOKEN",
                   help="one token of a probe's own options (repeat, in order)")
    g.add_argument("--output-dir", default=None,
                   help="write each document to DIR/<run id>.json (default: stdout, one after the other)")


def _module(name: str) -> ProbeModule:
    module: ProbeModule = probe_module(ProbeName(name))
    return module


def build_parts(args: argparse.Namespace, parser: argparse.ArgumentParser) -> list[CheckPart]:
    """Each probe's own namespace, as ``python -m probes <probe> ...`` would have parsed it (``parser``: the
    ``python -m probes`` parser, with the check's and each probe's subcommand).

    :raises SystemExit: (``parser.error``) on an option that does not fit."""
    names: tuple[str, ...] = args.probes
    if args.run_id is not None or args.output is not None:
        parser.error("check: use --run-ids and --output-dir (not --run-id/--output)")
    for mapping, what in ((args.run_ids, "--run-ids"), (args.limits, "--limits")):
        unknown = sorted(set(mapping) - set(names))
        if unknown:
            parser.error(f"check: {what} names probes not in --probes: {','.join(unknown)}")
    limits: dict[str, float] = {}
    for name, text in args.limits.items():
        try:
            limits[name] = positive_float(text)
        except argparse.ArgumentTypeError as exc:
            parser.error(f"check: --limits {name}: {exc}")
    tokens: dict[str, list[str]] = {name: [] for name in names}
    for name, token in args.arg:
        if name not in tokens:
            parser.error(f"check: --arg for a probe not in --probes: {name!r}")
        tokens[name].append(token)
    probe_parser = parser
    parts: list[CheckPart] = []
    for name in names:
        own = probe_parser.parse_args([name, *tokens[name]])
        base = probe_parser.parse_args([name])
        changed = sorted(k for k in vars(base) if k not in ("probe",) and k in vars(args)
                         and getattr(own, k) != getattr(base, k))
        if changed:
            parser.error(f"check: --arg {name}= sets a common option ({', '.join(changed)}): give it to the check")
        for key in SHARED:
            setattr(own, key, getattr(args, key))
        own.timeout = limits.get(name, args.timeout)
        own.run_id = args.run_ids.get(name)
        own.output = (os.path.join(args.output_dir, f"{own.run_id or name}.json") if args.output_dir else None)
        parts.append(CheckPart(_module(name), own))
    return parts


def check_params(parts: Sequence[CheckPart], args: argparse.Namespace) -> dict[str, Any]:
    return {"probes": [p.probe.NAME.value for p in parts], "timeout_s": args.timeout}


def main(args: argparse.Namespace, raw: Sequence[str], parser: argparse.ArgumentParser) -> int:
    parts = build_parts(args, parser)
    if args.output_dir:
        os.makedirs(args.output_dir, exist_ok=True)
    try:
        launch = detect_launch(os.environ)
    except LaunchError as exc:
        return _all_error(parts, args, f"cannot determine the launch: {exc}", process_start_time())
    if launch is None:
        return run_standalone(parts, args, raw)
    return _run_rank(parts, args, launch)


def _run_rank(parts: Sequence[CheckPart], args: argparse.Namespace, launch: LaunchInfo) -> int:
    from probes.runner import run_check_rank

    return run_check_rank(parts, float(args.timeout), launch, check_params(parts, args))


def _emit(part: CheckPart, result: ProbeResult) -> None:
    emit(render(result, part.args.format, part.probe.format_table), part.args.output)


def _all_error(parts: Sequence[CheckPart], args: argparse.Namespace, reason: str, t0: float) -> int:
    reserve_stdout()
    now = time.time()
    for part in parts:
        _emit(part, ProbeResult(
            probe=part.probe.NAME, run_id=part.args.run_id, outcome=Outcome.ERROR, reason=reason,
            started_at=t0, finished_at=now, nodes=[node_name()],
            params={"backend": args.backend, "device": args.device, "timeout_s": part.args.timeout,
                    "check": check_params(parts, args)},
        ))
    return 1


def run_standalone(parts: Sequence[CheckPart], args: argparse.Namespace, argv: Sequence[str]) -> int:
    """Spawn ``--nproc`` local ranks running the check (as :func:`probes.launch.run_standalone`
    does for one probe); rank 0 writes each document to a private directory, this process
    re-emits them and writes the ``error`` document of each probe rank 0 left without one."""
    from probes import launch as launcher

    reserve_stdout()
    t0 = process_start_time()
    if args.expect_gpus and args.device != "cpu":
        missing = [missing_gpus_result(
            part.probe.NAME.value, run_id=part.args.run_id, node=node_name(), want=args.expect_gpus,
            expected_uuids=args.expect_gpu_uuids, environ=os.environ, started_at=t0,
            params={"backend": args.backend, "device": args.device, "timeout_s": part.args.timeout},
        ) for part in parts]
        if all(m is not None for m in missing):
            for part, result in zip(parts, missing, strict=True):
                assert result is not None
                _emit(part, result)
            return max(exit_code_of(m.outcome) for m in missing if m is not None)
    deadline = t0 + float(args.timeout) - launcher.LAUNCHER_MARGIN_S
    nproc = args.nproc or launcher.default_nproc(args.device)
    args.nproc = nproc
    tmpdir = tempfile.mkdtemp(prefix="healthd-check-")
    port = launcher.free_port()
    children: list[launcher.Child] = []
    stopping = launcher.stop_on_signals(children, tmpdir)
    child_argv = [sys.executable, "-m", "probes", *argv, "--nproc", str(nproc)]
    try:
        launcher.run_ranks(children, child_argv, nproc, port, t0, deadline, {RESULT_DIR_ENV: tmpdir})
        code = 0
        for part in parts:
            result = launcher.read_result(os.path.join(tmpdir, f"{part.probe.NAME.value}.json"))
            rank0_silent = result is None
            if result is None:
                result = ProbeResult(
                    probe=part.probe.NAME,
                    run_id=part.args.run_id,
                    outcome=Outcome.ERROR,
                    reason=launcher.launcher_reason(children, float(args.timeout), True),
                    started_at=t0,
                    finished_at=time.time(),
                    nodes=[node_name()],
                    params={"nproc": nproc, "timeout_s": part.args.timeout, "backend": args.backend,
                            "device": args.device, "check": check_params(parts, args)},
                )
            elif result.outcome is Outcome.ERROR:
                extra = launcher.launcher_reason(children, float(args.timeout), rank0_silent)
                if extra:
                    result = result.model_copy(update={"reason": f"{result.reason}; launcher: {extra}"})
            _emit(part, result)
            code = max(code, exit_code_of(result.outcome))
        return code
    finally:
        if not stopping.is_set():
            launcher._stop(children)
        shutil.rmtree(tmpdir, ignore_errors=True)

