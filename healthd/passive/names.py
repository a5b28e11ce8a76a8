"""A series' labels to healthd's node and GPU names (pure).

dcgm-exporter names the host ``Hostname`` (every release up to 4.8), ``hostname`` (newer), or not at all
(``--no-hostname``: then only Prometheus's scrape ``instance``, ``host:port``); the GPU by ``gpu`` (its
index) and ``UUID`` (``uuid`` with ``--use-old-namespace``, ``gpu_uuid`` on per-link NVLink series). Sites
whose host names differ from Slurm's node names map them with a regular expression (``[passive]
node_regex``/``node_replacement``).
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

UUID_LABELS = ("UUID", "uuid", "gpu_uuid")


def strip_port(instance: str) -> str:
    """``host:9400`` → ``host``; ``[fe80::1]:9400`` → ``fe80::1``; a bare host or IPv6 address is kept."""
    if instance.startswith("["):
        end = instance.find("]")
        return instance[1:end] if end > 0 else instance
    host, sep, port = instance.rpartition(":")
    if sep and port.isdigit() and ":" not in host:
        return host
    return instance


@dataclass(frozen=True, slots=True)
class NodeNamer:
    """The host label order and the site's mapping of host names to node names."""

    host_labels: tuple[str, ...] = ("Hostname", "hostname", "instance")
    pattern: re.Pattern[str] | None = None
    replacement: str = r"\1"

    @classmethod
    def of(cls, host_labels: Sequence[str], regex: str | None, replacement: str) -> NodeNamer:
        return cls(tuple(host_labels), re.compile(regex) if regex is not None else None, replacement)

    def host(self, labels: Mapping[str, str]) -> str | None:
        """The series' host as it names it (the first host label it has, ``instance`` without its port)."""
        for name in self.host_labels:
            value = labels.get(name)
            if value:
                return strip_port(value) if name == "instance" else value
        return None

    def node(self, labels: Mapping[str, str]) -> str | None:
        """The node name of a series: its host, mapped; None without a host label."""
        host = self.host(labels)
        if host is None or self.pattern is None:
            return host
        match = self.pattern.fullmatch(host)
        return match.expand(self.replacement) if match else host


@dataclass(frozen=True, slots=True)
class Located:
    """A series placed on a known node (and GPU)."""

    node: str
    gpu: str | None
    gpu_uuid: str | None
    labels: Mapping[str, str]
    value: float

    @property
    def gpu_key(self) -> str:
        """What identifies the GPU across polls: its UUID, else its index ('' for a node-wide series)."""
        return self.gpu_uuid or self.gpu or ""


def gpu_of(labels: Mapping[str, str]) -> tuple[str | None, str | None]:
    """The series' GPU index and UUID (either may be missing)."""
    uuid = next((labels[k] for k in UUID_LABELS if labels.get(k)), None)
    return labels.get("gpu") or None, uuid


def locate(samples: Sequence[tuple[Mapping[str, str], float]], namer: NodeNamer,
           known: Collection[str]) -> tuple[list[Located], int]:
    """The samples on known nodes, and how many named a host healthd does not know (or none at all)."""
    located: list[Located] = []
    unknown = 0
    for labels, value in samples:
        node = namer.node(labels)
        if node is None or node not in known:
            unknown += 1
            continue
        gpu, uuid = gpu_of(labels)
        located.append(Located(node, gpu, uuid, labels, value))
    return located, unknown
