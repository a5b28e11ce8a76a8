"""A node's hardware class: what floors, fleet comparison, sweeps and the drain breaker group by."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from healthd.model import Node

if TYPE_CHECKING:
    from healthd.config import NodeClassRule

DEFAULT_CLASS = "cpu"
"""The class of a node with no GPUs (and no class of its own or by rule), or of one not known at all."""


def matching_rule(node: Node, rules: Sequence[NodeClassRule]) -> NodeClassRule | None:
    """The first ``[[slurm.node_classes]]`` rule ``node`` matches (every given field), else ``None``."""
    for rule in rules:
        if rule.gpu_type is not None and rule.gpu_type != node.gpu_type:
            continue
        if rule.gpus is not None and rule.gpus != node.gpus:
            continue
        if rule.partition is not None and rule.partition not in node.partitions:
            continue
        if not set(rule.features) <= set(node.features):
            continue
        return rule
    return None


def gpu_type_of(name: str) -> str:
    """A GPU type from the model name NVML or ``nvidia-smi`` report, as a class part:
    ``NVIDIA H100 80GB HBM3`` -> ``nvidia_h100_80gb_hbm3`` (the packaged floors and peaks match
    ``*h100*``)."""
    return re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_") or "gpu"


def class_of(node: Node, rules: Sequence[NodeClassRule] = ()) -> str:
    """The class of ``node`` (pure): the one its backend gave it, else the first matching
    ``[[slurm.node_classes]]`` rule, else ``<gpu type>x<count>`` (``gpux8`` when the type is
    unknown), else ``DEFAULT_CLASS``."""
    if node.node_class:
        return node.node_class
    rule = matching_rule(node, rules)
    if rule is not None:
        return rule.name
    if node.gpus:
        return f"{node.gpu_type or 'gpu'}x{node.gpus}"
    return DEFAULT_CLASS


def classed(node: Node, rules: Sequence[NodeClassRule] = ()) -> Node:
    """``node`` with its class and, where its rule says (``expect_gpus``), the GPUs the probes must find."""
    rule = None if node.node_class else matching_rule(node, rules)
    expect = rule.expect_gpus if rule is not None else None
    return replace(node, node_class=class_of(node, rules),
                   expect_gpus=expect if expect is not None else node.expect_gpus)
