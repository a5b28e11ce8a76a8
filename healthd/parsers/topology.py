"""Pure parsers of Slurm's topology: ``scontrol show topology``, topology.conf and topology.yaml.

Text in, :class:`~healthd.topology.Topology` (or ``None`` for "no topology") out, no I/O.

``scontrol show topology`` (the text every release prints; Slurm has no JSON for topology):

- topology/tree, every release: one line per switch,
  ``SwitchName=s0 Level=0 LinkSpeed=1 Nodes=node[1-2]`` and ``SwitchName=s2 Level=1 LinkSpeed=1
  Switches=s[0-1]`` (``Nodes=``/``Switches=`` only when set; hostlists compressed).
- topology/block, 23.11+: ``BlockName=b1 BlockIndex=0 Nodes=node[1-4] BlockSize=4`` per base block
  and ``AggregatedBlock=b[1-2] BlockIndex=0 Nodes=node[1-8] BlockSize=8`` for the larger block
  sizes of ``BlockSizes=4,8``. Aggregated blocks are unions of base blocks: they are left out (a
  node belongs to exactly one base block, which is its leaf). A block without nodes is left out.
- 25.05+ with a topology.yaml of several named topologies: ``scontrol show topology`` prints the
  cluster default (``scontrol show topology <name>`` another) in its plugin's form above; the whole
  file is ``scontrol show topoconf`` (YAML, read by :func:`parse_topology_yaml`).
- no topology: topology/none (22.05, 23.02), topology/default (23.11-24.11) and topology/flat
  (25.05+) print nothing, or ``No topology information available`` on stderr: ``None``, never an error.
- topology/ring (26.05) and topology/torus3d have no switches: a :class:`TopologyError` saying so.

topology.conf (for sites whose Slurm runs no topology plugin, or to give healthd a different one):
``SwitchName=<name> [Switches=<hostlist>] [Nodes=<hostlist>] [LinkSpeed=<n>]`` or
``BlockName=<name> Nodes=<hostlist>`` plus one ``BlockSizes=<n>[,<n>...]``; ``#`` starts a comment;
a line ending in ``\\`` continues on the next; keys are case-insensitive (as Slurm reads them).

Hostile input (a line that is not ``Key=value`` words, an unknown key, an empty name, a huge line or
hostlist, a loop, a node under two leaves) raises :class:`TopologyError` naming the line.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from healthd.cluster.slurm_parse import expand_nodes, split_top_level
from healthd.errors import InvalidNodeName, ParseError, TopologyError
from healthd.model import validate_node_name
from healthd.topology import SwitchRecord, Topology, TopologyKind, build_topology

__all__ = [
    "MAX_LINE_CHARS",
    "MAX_NODES",
    "NO_TOPOLOGY_MESSAGE",
    "parse_show_topology",
    "parse_topology_conf",
    "parse_topology_yaml",
]

MAX_LINE_CHARS = 1 << 20
"""A longer line (after joining continuations) is refused, not read."""
MAX_NODES = 1_000_000
"""Most nodes (and switch names) one topology may expand to: a hostlist beyond it is refused before
it is expanded (``node[1-99999999999]``)."""
MAX_YAML_CHARS = 1 << 20
"""A larger topology.yaml is refused (hostlists keep a real one of 100,000 nodes far below it)."""
MAX_NAME_CHARS = 64
"""Slurm's own limit on a switch name."""

NO_TOPOLOGY_MESSAGE = "No topology information available"
"""What scontrol prints (stderr, exit 0) when the plugin has no records."""

_NAME = re.compile(r"^[A-Za-z0-9_.:+@%\-]+$")
_WORD = re.compile(r"^([A-Za-z]+)=(\S*)$")
_BRACKET = re.compile(r"\[([^\[\]]*)\]")
_RANGE = re.compile(r"^\s*([0-9]+)\s*(?:-\s*([0-9]+)\s*)?$")
_INT = re.compile(r"^[0-9]{1,10}$")

_TREE_KEYS = frozenset({"SwitchName", "Level", "LinkSpeed", "Nodes", "Switches"})
_BLOCK_KEYS = frozenset({"BlockName", "AggregatedBlock", "BlockIndex", "Nodes", "BlockSize"})
_NO_SWITCH_KINDS = {"RingName": "topology/ring", "TorusName": "topology/torus3d"}


def _where(source: str, lineno: int | None) -> str:
    return f"{source} line {lineno}" if lineno is not None else source


def _hostlist_size(expr: str) -> int:
    """An upper bound on how many names ``expr`` expands to, computed without expanding it."""
    total = 0
    for part in split_top_level(expr, "[]"):
        size = 1
        for group in _BRACKET.findall(part):
            width = 0
            for item in group.split(","):
                m = _RANGE.match(item)
                if m is None:
                    width += 1
                    continue
                if len(m.group(1)) > 18 or len(m.group(2) or "") > 18:
                    return MAX_NODES + 1
                low = int(m.group(1))
                high = int(m.group(2)) if m.group(2) is not None else low
                width += abs(high - low) + 1
            size *= max(width, 1)
            if size > MAX_NODES:
                return size
        total += size
        if total > MAX_NODES:
            return total
    return total


def _expand(expr: str, what: str, where: str) -> tuple[str, ...]:
    size = _hostlist_size(expr)
    if size > MAX_NODES:
        raise TopologyError(f"{where}: {what} {expr[:80]!r} expands to more than {MAX_NODES} names")
    try:
        names = expand_nodes(expr)
    except ParseError as exc:
        raise TopologyError(f"{where}: {what}: {exc}") from None
    for name in names:
        try:
            validate_node_name(name) if what.lower() == "nodes" else _name(name, what, where)
        except InvalidNodeName:
            raise TopologyError(f"{where}: {what} {expr[:80]!r} holds an invalid name {name[:80]!r}") from None
    return names


def _name(value: str, key: str, where: str) -> str:
    if not value or value.lower() == "(null)":
        raise TopologyError(f"{where}: {key}= is empty")
    if len(value) > MAX_NAME_CHARS or not _NAME.match(value):
        raise TopologyError(f"{where}: {key}={value[:80]!r} is not a switch or block name "
                            f"(at most {MAX_NAME_CHARS} characters, no spaces or brackets)")
    return value


def _int(value: str, key: str, where: str) -> int:
    if not _INT.match(value):
        raise TopologyError(f"{where}: {key}={value[:80]!r} is not a whole number")
    return int(value)


def _words(line: str, where: str) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    for word in line.split():
        m = _WORD.match(word)
        if m is None:
            raise TopologyError(f"{where}: expected Key=value words, got {word[:80]!r}")
        out.append((m.group(1), m.group(2)))
    return out


def _lines(text: str, source: str, *, continuation: bool) -> Iterable[tuple[int, str]]:
    """Numbered logical lines: comments cut, blanks skipped, ``\\`` continuations joined."""
    pending = ""
    first = 0
    for lineno, raw in enumerate(text.splitlines(), 1):
        if len(raw) > MAX_LINE_CHARS:
            raise TopologyError(f"{source} line {lineno}: longer than {MAX_LINE_CHARS} characters")
        line = raw.split("#", 1)[0].rstrip() if continuation else raw.rstrip()
        if not pending:
            first = lineno
        if continuation and line.endswith("\\"):
            pending += line[:-1] + " "
            if len(pending) > MAX_LINE_CHARS:
                raise TopologyError(f"{source} line {first}: longer than {MAX_LINE_CHARS} characters")
            continue
        line = pending + line
        pending = ""
        if line.strip():
            yield first, line.strip()
    if pending.strip():
        yield first, pending.strip()


def _check_total(records: Sequence[SwitchRecord], source: str) -> None:
    if sum(len(r.nodes) + len(r.switches) for r in records) > MAX_NODES:
        raise TopologyError(f"{source}: more than {MAX_NODES} nodes and switches")


def _tree_record(words: list[tuple[str, str]], where: str, *, shown: bool
                 ) -> tuple[SwitchRecord, frozenset[str] | None]:
    """One ``SwitchName=`` line; ``shown``: scontrol's answer (exact keys, Level and LinkSpeed
    printed) rather than a topology.conf line (keys in any case). With it, the ``Nodes=`` scontrol
    printed for a switch with children (every node below it), to be checked against them."""
    fields: dict[str, str] = {}
    for key, value in words:
        canon = next((k for k in _TREE_KEYS if k.lower() == key.lower()), None) if not shown else key
        if canon not in _TREE_KEYS:
            raise TopologyError(f"{where}: unknown key {key[:40]!r} on a SwitchName line "
                                f"(known: {', '.join(sorted(_TREE_KEYS))})")
        if canon in fields:
            raise TopologyError(f"{where}: {canon}= given twice")
        fields[canon] = value
    name = _name(fields["SwitchName"], "SwitchName", where)
    if not shown and "Level" in fields:
        raise TopologyError(f"{where}: Level= is not a topology.conf key (Slurm computes levels)")
    if shown and ("Level" not in fields or "LinkSpeed" not in fields):
        raise TopologyError(f"{where}: a SwitchName line of scontrol without Level= or LinkSpeed=")
    level = _int(fields["Level"], "Level", where) if "Level" in fields else None
    speed = _int(fields["LinkSpeed"], "LinkSpeed", where) if "LinkSpeed" in fields else None
    nodes = _expand(fields.get("Nodes", ""), "Nodes", where)
    switches = _expand(fields.get("Switches", ""), "Switches", where)
    for child in switches:
        _name(child, "Switches", where)
    if name in switches:
        raise TopologyError(f"{where}: switch {name!r} names itself as a child")
    if shown and switches:
        # scontrol prints a parent's Nodes= as every node below it: the children's, checked later.
        return SwitchRecord(name, (), switches, level, speed), frozenset(nodes)
    return SwitchRecord(name, nodes, switches, level, speed), None


def _block_record(words: list[tuple[str, str]], where: str, *, shown: bool) -> SwitchRecord | None:
    """One ``BlockName=`` (or ``AggregatedBlock=``) line; ``None`` for a line that is left out."""
    fields: dict[str, str] = {}
    for key, value in words:
        canon = next((k for k in _BLOCK_KEYS if k.lower() == key.lower()), None) if not shown else key
        if canon not in _BLOCK_KEYS or (not shown and canon in ("AggregatedBlock", "BlockIndex", "BlockSize")):
            raise TopologyError(f"{where}: unknown key {key[:40]!r} on a BlockName line")
        if canon in fields:
            raise TopologyError(f"{where}: {canon}= given twice")
        fields[canon] = value
    head = "AggregatedBlock" if "AggregatedBlock" in fields else "BlockName"
    if "AggregatedBlock" in fields and "BlockName" in fields:
        raise TopologyError(f"{where}: both BlockName= and AggregatedBlock=")
    if shown:
        for key in ("BlockIndex", "BlockSize"):
            if key not in fields:
                raise TopologyError(f"{where}: a {head} line of scontrol without {key}=")
            _int(fields[key], key, where)
    if head == "AggregatedBlock":
        _expand(fields[head], head, where)
        _expand(fields.get("Nodes", ""), "Nodes", where)
        return None
    name = _name(fields["BlockName"], "BlockName", where)
    nodes = _expand(fields.get("Nodes", ""), "Nodes", where)
    if not nodes:
        return None
    return SwitchRecord(name, nodes)


def parse_show_topology(text: str, *, source: str = "scontrol show topology") -> Topology | None:
    """The topology in ``scontrol show topology``'s answer; ``None`` when Slurm has none.

    :raises TopologyError: anything else than a tree's or a block topology's lines, or lines that do
        not make one topology (see :func:`healthd.topology.build_topology`).
    """
    lines = list(_lines(text, source, continuation=False))
    if not lines:
        return None
    if len(lines) == 1 and NO_TOPOLOGY_MESSAGE.lower() in lines[0][1].lower():
        return None
    records: list[SwitchRecord] = []
    printed: dict[str, tuple[int, frozenset[str]]] = {}
    kind: TopologyKind | None = None
    for lineno, line in lines:
        where = _where(source, lineno)
        if NO_TOPOLOGY_MESSAGE.lower() in line.lower():
            raise TopologyError(f"{where}: {NO_TOPOLOGY_MESSAGE!r} among other lines")
        words = _words(line, where)
        head = words[0][0]
        if head in _NO_SWITCH_KINDS:
            raise TopologyError(f"{where}: {_NO_SWITCH_KINDS[head]} has no switches or blocks to "
                                "correlate with (use [topology] file = a topology.conf)")
        if head == "SwitchName":
            line_kind: TopologyKind = "tree"
        elif head in ("BlockName", "AggregatedBlock"):
            line_kind = "block"
        else:
            raise TopologyError(f"{where}: expected SwitchName=, BlockName= or AggregatedBlock= first, "
                                f"got {head[:40]!r}")
        if kind is not None and line_kind != kind:
            raise TopologyError(f"{where}: a {line_kind} line in a {kind} topology")
        kind = line_kind
        record: SwitchRecord | None
        if kind == "tree":
            record, below = _tree_record(words, where, shown=True)
            if below is not None:
                printed[record.name] = (lineno, below)
        else:
            record = _block_record(words, where, shown=True)
        if record is not None:
            records.append(record)
        _check_total(records, source)
    assert kind is not None
    if not records:
        raise TopologyError(f"{source}: no block holds a node")
    topology = build_topology(records, kind, source=source)
    for name, (lineno, below) in printed.items():
        if below and below != topology.switches[name].nodes:
            raise TopologyError(f"{_where(source, lineno)}: switch {name!r} lists Nodes= other than "
                                "the nodes of its child switches")
    if kind == "tree":
        for r in records:
            if r.level is not None and not (r.nodes and r.switches) and r.level != topology.switches[r.name].level:
                raise TopologyError(f"{source}: switch {r.name!r} has Level={r.level} but sits at level "
                                    f"{topology.switches[r.name].level} of its tree")
    return topology


def parse_topology_conf(text: str, *, source: str = "topology.conf") -> Topology:
    """The topology a topology.conf describes (tree: ``SwitchName=`` lines; block: ``BlockName=``).

    :raises TopologyError: an empty file, unknown keys, both kinds in one file, and whatever
        :func:`healthd.topology.build_topology` refuses.
    """
    records: list[SwitchRecord] = []
    kind: TopologyKind | None = None
    sizes_seen = False
    for lineno, line in _lines(text, source, continuation=True):
        where = _where(source, lineno)
        words = _words(line, where)
        head = words[0][0].lower()
        if head == "blocksizes":
            if len(words) != 1 or sizes_seen:
                raise TopologyError(f"{where}: BlockSizes= must be alone on its line, and given once")
            sizes = [_int(v, "BlockSizes", where) for v in words[0][1].split(",")]
            if sizes[0] < 1 or any(b < a * 2 or b & (b - 1) or b % a for a, b in itertools.pairwise(sizes)):
                raise TopologyError(f"{where}: BlockSizes={words[0][1][:80]!r}: each size must be a "
                                    "power of two times the one before")
            sizes_seen = True
            line_kind: TopologyKind = "block"
        elif head == "switchname":
            line_kind = "tree"
        elif head == "blockname":
            line_kind = "block"
        else:
            raise TopologyError(f"{where}: expected SwitchName=, BlockName= or BlockSizes= first, "
                                f"got {words[0][0][:40]!r}")
        if kind is not None and line_kind != kind:
            raise TopologyError(f"{where}: {words[0][0]}= in a file of "
                                f"{'SwitchName' if kind == 'tree' else 'BlockName'}= lines")
        kind = line_kind
        if head == "switchname":
            records.append(_tree_record(words, where, shown=False)[0])
        elif head == "blockname":
            record = _block_record(words, where, shown=False)
            if record is None:
                raise TopologyError(f"{where}: block without Nodes=")
            records.append(record)
        _check_total(records, source)
    if kind is None or not records:
        raise TopologyError(f"{source}: no SwitchName= or BlockName= line")
    return build_topology(records, kind, source=source)


def _yaml_list(value: object, what: str, source: str) -> list[Mapping[str, Any]]:
    if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
        raise TopologyError(f"{source}: {what} must be a list of mappings")
    return value


def _yaml_names(value: object, what: str, where: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        return _expand(value, what, where)
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return tuple(n for v in value for n in _expand(v, what, where))
    raise TopologyError(f"{where}: {what} must be a hostlist or a list of them")


def parse_topology_yaml(text: str, name: str | None = None, *, source: str = "topology.yaml") -> Topology | None:
    """One topology of a topology.yaml (or ``scontrol show topoconf``, 25.05+): ``name``'s, else the
    first with ``cluster_default: true``, else the first. ``None`` for a ``flat`` one (or one without
    any kind: topoconf prints every kind, the unused ones as ``{}``).

    :raises TopologyError: not YAML, not a list of topologies, ``name`` absent, a ring or torus3d.
    """
    import yaml

    if len(text) > MAX_YAML_CHARS:
        raise TopologyError(f"{source}: larger than {MAX_YAML_CHARS} characters")
    try:
        doc = yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except yaml.YAMLError as exc:
        raise TopologyError(f"{source}: not YAML: {str(exc).splitlines()[0]}") from None
    except UnicodeError:
        raise TopologyError(f"{source}: not UTF-8 text") from None
    except ValueError as exc:  # a number of 10,000 digits
        raise TopologyError(f"{source}: unreadable value: {str(exc)[:80]}") from None
    except RecursionError:
        raise TopologyError(f"{source}: nested too deeply") from None
    topologies = _yaml_list(doc, "the document", source)
    if not topologies:
        raise TopologyError(f"{source}: no topology")
    names = [t.get("topology") for t in topologies]
    if name is not None:
        chosen = [t for t in topologies if t.get("topology") == name]
        if not chosen:
            raise TopologyError(f"{source}: no topology named {name!r} (it has {names})")
    else:
        chosen = [t for t in topologies if t.get("cluster_default") is True] or topologies
    topo = chosen[0]
    label = f"{source} topology {topo.get('topology')!r}"
    # topoconf prints every kind, the unused ones as ``{}``: a kind is the one with a value.
    kinds = [k for k in ("tree", "block", "flat", "ring", "torus3d") if topo.get(k) not in (None, {}, False)]
    if len(kinds) > 1:
        raise TopologyError(f"{label}: expected exactly one of tree, block, flat, ring, torus3d; got {kinds}")
    if not kinds or kinds[0] == "flat":
        return None
    if kinds[0] in ("ring", "torus3d"):
        raise TopologyError(f"{label}: topology/{kinds[0]} has no switches or blocks to correlate with")
    body = topo[kinds[0]]
    if not isinstance(body, dict):
        raise TopologyError(f"{label}: {kinds[0]} must be a mapping")
    records: list[SwitchRecord] = []
    if kinds[0] == "tree":
        for i, sw in enumerate(_yaml_list(body.get("switches"), "tree.switches", label)):
            where = f"{label} switch {i + 1}"
            sw_name = _name(str(sw.get("switch") or ""), "switch", where)
            children = _yaml_names(sw.get("children"), "children", where)
            for child in children:
                _name(child, "children", where)
            records.append(SwitchRecord(sw_name, _yaml_names(sw.get("nodes"), "nodes", where), children))
            _check_total(records, label)
        return build_topology(records, "tree", source=label)
    for i, block in enumerate(_yaml_list(body.get("blocks"), "block.blocks", label)):
        where = f"{label} block {i + 1}"
        block_name = _name(str(block.get("block") or ""), "block", where)
        nodes = _yaml_names(block.get("nodes"), "nodes", where)
        if nodes:
            records.append(SwitchRecord(block_name, nodes))
        _check_total(records, label)
    return build_topology(records, "block", source=label)
