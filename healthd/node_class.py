"""A node's hardware class: what floors, fleet comparison, sweeps and the drain breaker group by."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from healthd.model import Node

if TYPE_CHECKING:
    from healthd.config import NodeClassRule

DEFAULT_CLASS = "cpu"
"""The class of a node with no GPUs (and no class of its own or by rule), or of one not known at all."""
LOCAL_CLASS = "local"
"""The class the local backend gives its one node."""


def class_of(node: Node, rules: Sequence[NodeClassRule] = ()) -> str:
    """The class of ``node`` (pure): the one its backend gave it, else the first matching
    ``[[slurm.node_classes]]`` rule, else ``<gpu type>x<count>`` (``gpux8`` when the type is
    unknown), else ``DEFAULT_CLASS``."""
    if node.node_class:
        return node.node_class
    for rule in rules:
        if rule.gpu_type is not None and rule.gpu_type != node.gpu_type:
            continue
        if rule.gpus is not None and rule.gpus != node.gpus:
            continue
        if rule.partition is not None and rule.partition not in node.partitions:
            continue
        if not set(rule.features) <= set(node.features):
            continue
        return rule.name
    if node.gpus:
        return f"{node.gpu_type or 'gpu'}x{node.gpus}"
    return DEFAULT_CLASS
