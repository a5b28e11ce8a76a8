"""Reading the cluster's network topology (I/O): from the backend (Slurm's topology plugin) or the
``[topology] file``, as ``[topology] source`` says. Parsing is ``healthd.parsers.topology`` (pure)."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from healthd.cluster.base import TopologySource
from healthd.config import TopologySettings
from healthd.errors import TopologyError
from healthd.parsers.topology import parse_topology_conf, parse_topology_yaml
from healthd.topology import Topology

__all__ = ["MAX_FILE_BYTES", "check_nodes", "read_topology", "read_topology_file"]

MAX_FILE_BYTES = 64 << 20
"""A larger topology file is refused, not read."""


def read_topology_file(path: Path, name: str | None = None) -> Topology | None:
    """A topology.conf, or (``*.yaml``/``*.yml``) a topology.yaml's topology ``name`` (else its default).

    :raises TopologyError: unreadable, too large, or no usable topology.
    """
    try:
        if path.stat().st_size > MAX_FILE_BYTES:
            raise TopologyError(f"{path}: larger than {MAX_FILE_BYTES} bytes")
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise TopologyError(f"{path}: cannot read it: {exc}") from None
    if path.suffix in (".yaml", ".yml"):
        return parse_topology_yaml(text, name, source=str(path))
    return parse_topology_conf(text, source=str(path))


def read_topology(settings: TopologySettings, backend: object) -> Topology | None:
    """The topology ``settings.source`` asks for; ``None``: none (correlation off).

    ``auto``: the backend's when it is a :class:`TopologySource` with one, else the file when given.

    :raises TopologyError: the chosen source's topology is unusable.
    :raises BackendError: the backend did not answer.
    """
    if settings.source == "none":
        return None
    if settings.source in ("auto", "slurm") and isinstance(backend, TopologySource):
        found = backend.topology(settings.name)
        if found is not None or settings.source == "slurm":
            return found
    if settings.source in ("auto", "file") and settings.file is not None:
        return read_topology_file(settings.file, settings.name)
    return None


def check_nodes(topology: Topology, known: Iterable[str], *, most: int = 5) -> None:
    """Refuse a topology that names nodes the cluster does not have (a stale file, another cluster's).

    :raises TopologyError: naming up to ``most`` of them and how many.
    """
    unknown = sorted(set(topology.leaf_of) - set(known))
    if unknown:
        shown = ", ".join(unknown[:most]) + (f" and {len(unknown) - most} more" if len(unknown) > most else "")
        raise TopologyError(f"{topology.source or 'topology'} names {len(unknown)} node(s) the cluster does not "
                            f"have: {shown}")
