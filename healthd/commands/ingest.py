"""``healthd ingest`` (store other tools' output as runs) and ``healthd parse`` (print it, store nothing).

``ingest`` prints one line per stored run (normally one per file) on stdout and one line per
file it could not use on stderr, and goes on to the next file whatever went wrong; it exits 1
when a file could not be read, held unreadable output (stored as an ``error`` run when a node
is known), could not be attributed to a node or could not be stored, else 0, whatever the
outcomes of the runs it stored.
"""

from __future__ import annotations

import argparse
import errno
import os
import sqlite3
import stat
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from healthd.commands.common import EXIT_OK, EXIT_TROUBLE, add_config_option, settings_from
from healthd.errors import InvalidNodeName, ParseError
from healthd.ingest import MAX_FILE_BYTES, SOURCE, IngestError, Prepared, parse_results, parse_time, prepare
from healthd.model import validate_node_name
from healthd.parsers.tools import TOOL_NAMES, decode_output
from healthd.units import human
from probes.result import ProbeResult

if TYPE_CHECKING:
    from healthd.store import Store

SUMMARY_LINES = 40


def _node(text: str) -> str:
    try:
        return validate_node_name(text)
    except InvalidNodeName as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _time(text: str) -> float:
    try:
        return parse_time(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tool", required=True, choices=TOOL_NAMES, help="the tool that wrote the output")
    p.add_argument("--node", type=_node, default=None,
                   help="the node the output is from, where the output names none (nccl-tests device lines do)")
    p.add_argument("--time", type=_time, default=None, metavar="T",
                   help="when it ran: unix seconds or ISO 8601 (default: the file's modification time)")


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("ingest", help="store other tools' output (nccl-tests, param, dcgmi...) as measurements",
                       description="Parse each FILE with the tool's parser and store it as a finished run.")
    add_config_option(p)
    _common(p)
    p.add_argument("files", nargs="+", type=Path, metavar="FILE")
    p.set_defaults(func=cmd_ingest)

    q = sub.add_parser("parse", help="parse another tool's output and print the result (stores nothing)")
    _common(q)
    q.add_argument("file", type=Path, metavar="FILE")
    q.add_argument("--json", action="store_true", help="print the ProbeResult documents, one per line")
    q.set_defaults(func=cmd_parse)


def _read(path: Path) -> tuple[bytes, float]:
    """The file's bytes (at most one more than ``MAX_FILE_BYTES``) and its modification time.

    :raises OSError: also for anything but a regular file (a FIFO would block, a device never end).
    """
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(errno.EINVAL, "not a regular file")
        return fh.read(MAX_FILE_BYTES + 1), st.st_mtime


def _where(nodes: tuple[str, ...] | list[str]) -> str:
    return ",".join(nodes) if nodes else "-"


def _count(n: int, what: str) -> str:
    return f"{n} {what}" + ("" if n == 1 else "s")


def _describe(result: ProbeResult) -> str:
    return (f"{result.probe} on {_where(result.nodes)}, outcome {result.outcome.value}, "
            f"{_count(len(result.measurements), 'measurement')}, {_count(len(result.checks), 'check')}")


def _store_one(store: Store, item: Prepared, path: Path) -> str:
    existing = store.run(item.run_id)
    if existing is not None and existing.state == "finished":
        outcome = existing.outcome.value if existing.outcome else "-"
        return (f"{path}: already stored as run {item.run_id} ({item.result.probe} on {_where(item.nodes)}, "
                f"outcome {outcome})")
    try:
        if existing is None:
            store.record_result(item.result, nodes=item.nodes, backend=SOURCE, source=SOURCE,
                                result_path=str(path.absolute()))
        else:  # a run left half-written by an interrupted ingest: finish it
            store.finish_run(item.run_id, outcome=item.result.outcome, reason=item.result.reason,
                             finished_at=item.result.finished_at, started_at=item.result.started_at,
                             result=item.result)
    except sqlite3.IntegrityError:
        return f"{path}: already stored as run {item.run_id} (by another ingest at the same time)"
    line = f"{path}: stored run {item.run_id}: {_describe(item.result)}"
    return line + (f": {item.result.reason}" if item.result.reason else "")


def cmd_ingest(args: argparse.Namespace) -> int:
    from healthd.service_store import open_store

    settings, config_path = settings_from(args)
    store = open_store(settings, config_path, write=True, command="ingest", argv=getattr(args, "argv", None))
    trouble = False
    try:
        for path in args.files:
            try:
                trouble = not _ingest_file(store, path, args) or trouble
            except Exception as exc:  # one bad file never stops the others
                print(f"{path}: not stored: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
                trouble = True
    finally:
        store.close()
    return EXIT_TROUBLE if trouble else EXIT_OK


def _ingest_file(store: Store, path: Path, args: argparse.Namespace) -> bool:
    """Store the runs of one file; whether it was fully usable (messages printed here)."""
    try:
        data, mtime = _read(path)
    except OSError as exc:
        print(f"{path}: cannot read: {exc.strerror or exc}", file=sys.stderr)
        return False
    try:
        prepared = prepare(data, tool=args.tool, node=args.node, at=args.time or mtime, name=str(path))
    except IngestError as exc:
        print(str(exc), file=sys.stderr)
        return False
    usable = True
    for item in prepared:
        print(_store_one(store, item, path), flush=True)
        usable = usable and item.readable
    return usable


def _summary(result: ProbeResult) -> list[str]:
    lines = [f"{result.probe}  outcome {result.outcome.value}  nodes {_where(result.nodes)}  "
             f"{_count(len(result.measurements), 'measurement')}, {_count(len(result.checks), 'check')}"]
    if result.reason:
        lines.append(f"  reason: {result.reason}")
    # Per series, the value at the largest message size (small sizes are latency-bound).
    best: dict[tuple[str, str | None, tuple[tuple[str, str], ...]], tuple[int, float]] = {}
    for m in result.measurements:
        rest = tuple(sorted((k, v) for k, v in m.labels.items() if k != "size_bytes"))
        size = int(m.labels["size_bytes"]) if m.labels.get("size_bytes", "").isdigit() else -1
        key = (m.name, m.node, rest)
        if key not in best or size > best[key][0]:
            best[key] = (size, m.value)
    shown = sorted(best.items())
    for (name, node, rest), (size, value) in shown[:SUMMARY_LINES]:
        labels = ",".join(f"{k}={v}" for k, v in rest) + (f",size_bytes={size}" if size >= 0 else "")
        where = f"  node={node}" if node else ""
        lines.append(f"  {name:<34} {human(name, value, column=True):>16}  {labels}{where}")
    if len(shown) > SUMMARY_LINES:
        lines.append(f"  ... {len(shown) - SUMMARY_LINES} more series (--json prints every value)")
    for c in result.checks:
        if not c.ok:
            where = c.where()
            lines.append(f"  FAIL {c.name} {where} {c.detail}".rstrip())
    return lines


def cmd_parse(args: argparse.Namespace) -> int:
    path: Path = args.file
    try:
        data, mtime = _read(path)
    except OSError as exc:
        print(f"{path}: cannot read: {exc.strerror or exc}", file=sys.stderr)
        return EXIT_TROUBLE
    if len(data) > MAX_FILE_BYTES:
        print(f"{path}: larger than the {MAX_FILE_BYTES // (1024 * 1024)} MiB healthd parses", file=sys.stderr)
        return EXIT_TROUBLE
    try:
        results = parse_results(decode_output(data), tool=args.tool, node=args.node, at=args.time or mtime)
    except ParseError as exc:
        print(f"{path}: unreadable {args.tool} output: {exc}", file=sys.stderr)
        return EXIT_TROUBLE
    if args.json:
        for result in results:
            print(result.to_json())
        return EXIT_OK
    for result in results:
        print("\n".join(_summary(result)))
    return EXIT_OK

