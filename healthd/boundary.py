"""What the node check at job boundaries (``probes.boundary``) must find on each node, written by the daemon.

Slurm commands are forbidden in prologs and epilogs, so the daemon leaves each node's expectation in
the shared results directory: ``<results_dir>/expect/<node>.json``, ``{"gpus": N, "gpu_uuids": [...]}``
(``gpus``: ``Node.required_gpus``, from Slurm's GRES and the node-class rules; ``gpu_uuids``: the
UUIDs last seen, where the backend knows them; ``"nvswitch": true`` for a node of a class marked
``nvswitch = true``, whose GPUs' fabric state the check then reads). A file is rewritten only when its text
changes.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Collection, Iterable, MutableMapping
from pathlib import Path

from healthd.model import Node
from healthd.node_class import class_of

EXPECT_DIR = "expect"


def expectation_text(node: Node, *, nvswitch: bool = False) -> str:
    """The expectation file's text for ``node`` (pure, stable: no time in it)."""
    doc: dict[str, object] = {"gpus": node.required_gpus, "gpu_uuids": list(node.gpu_uuids)}
    if nvswitch:
        doc["nvswitch"] = True
    return json.dumps(doc, sort_keys=True) + "\n"


def write_expectations(results_dir: Path, nodes: Iterable[Node], written: MutableMapping[str, str], *,
                       nvswitch: Collection[str] = ()) -> int:
    """Write the expectation of every node in ``nodes`` whose text differs from ``written`` (the texts
    this daemon wrote, updated here); the count written. A file that cannot be written is left to the
    next discovery (``OSError`` is raised after the others are done). ``nvswitch``: the node classes marked
    ``nvswitch = true``."""
    directory = results_dir / EXPECT_DIR
    count = 0
    failed: OSError | None = None
    for node in nodes:
        text = expectation_text(node, nvswitch=class_of(node) in nvswitch)
        if written.get(node.name) == text:
            continue
        try:
            directory.mkdir(mode=0o750, parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=".expect-", suffix=".tmp", dir=directory)
            try:
                os.fchmod(fd, 0o644)
                with os.fdopen(fd, "w", encoding="utf-8") as out:
                    out.write(text)
                os.replace(tmp, directory / f"{node.name}.json")
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                raise
        except OSError as exc:
            failed = failed or exc
            continue
        written[node.name] = text
        count += 1
    if failed is not None:
        raise failed
    return count
