"""The topology parsers against the golden ``scontrol show topology`` / ``show topoconf`` output of
each release's test cluster (tests/fixtures/slurm/<release>/topology.*, scripts/capture-topology.sh),
topology.conf and topology.yaml text, and hostile input."""

from __future__ import annotations

from pathlib import Path

import pytest

from healthd.errors import ParseError, TopologyError
from healthd.parsers.topology import (
    MAX_LINE_CHARS,
    parse_show_topology,
    parse_topology_conf,
    parse_topology_yaml,
)
from healthd.topology import describe

SLURM = Path(__file__).resolve().parents[1] / "fixtures" / "slurm"
NODES = frozenset(f"node{i}" for i in range(1, 6))


def golden(release: str, name: str) -> str:
    return (SLURM / release / name).read_text()


@pytest.mark.parametrize("release", ["22.05", "24.11", "26.05"])
def test_tree_of_each_release(release: str) -> None:
    topo = parse_show_topology(golden(release, "topology.tree.txt"))
    assert topo is not None and topo.kind == "tree"
    assert set(topo.switches) == {"leaf1", "leaf2", "spine"}
    assert topo.nodes_under("leaf1") == {"node1", "node2", "node3"}
    assert topo.nodes_under("leaf2") == {"node4", "node5"}
    assert topo.nodes_under("spine") == NODES
    assert topo.switches["spine"].level == 1 and topo.switches["spine"].children == ("leaf1", "leaf2")
    assert topo.path("node4") == ("leaf2", "spine")
    assert topo.path("node9") == ()
    assert topo.same_leaf("node1", "node3") and not topo.same_leaf("node3", "node4")
    assert "2 leaves" in describe(topo) and "5 nodes" in describe(topo)


@pytest.mark.parametrize("release", ["24.11", "26.05"])
def test_block_of_each_release_leaves_out_aggregated_blocks(release: str) -> None:
    text = golden(release, "topology.block.txt")
    assert "AggregatedBlock=block[1-2]" in text
    topo = parse_show_topology(text)
    assert topo is not None and topo.kind == "block"
    assert {n: s.nodes for n, s in topo.switches.items()} == {
        "block1": {"node1", "node2"}, "block2": {"node3", "node4"}}
    assert topo.path("node3") == ("block2",)
    assert topo.path("node5") == ()


@pytest.mark.parametrize("release", ["22.05", "24.11", "26.05"])
def test_no_topology_is_none_on_each_release(release: str) -> None:
    assert parse_show_topology(golden(release, "topology.none.txt")) is None


def test_22_05_says_no_topology_on_stderr() -> None:
    stderr = golden("22.05", "topology.none.txt.stderr")
    assert "No topology information available" in stderr
    assert parse_show_topology(stderr) is None


def test_26_05_named_topologies() -> None:
    """topology.yaml of two: ``show topology`` prints the cluster default, ``show topology blocks``
    the other, ``show topoconf`` both (every kind printed, the unused as ``{}``)."""
    default = parse_show_topology(golden("26.05", "topology.yaml.txt"))
    assert default is not None and default.kind == "tree" and default.nodes_under("spine") == NODES
    blocks = parse_show_topology(golden("26.05", "topology.yaml-blocks.txt"))
    assert blocks is not None and blocks.kind == "block" and set(blocks.switches) == {"block1", "block2"}
    conf = golden("26.05", "topology.yaml-topoconf.txt")
    from_conf = parse_topology_yaml(conf, source="scontrol show topoconf")
    assert from_conf is not None and from_conf.leaf_of == default.leaf_of
    assert {n: s.level for n, s in from_conf.switches.items()} == {n: s.level for n, s in default.switches.items()}
    named = parse_topology_yaml(conf, "blocks")
    assert named is not None and named.leaf_of == blocks.leaf_of
    with pytest.raises(TopologyError, match="no topology named 'rails'"):
        parse_topology_yaml(conf, "rails")


def test_topology_conf_tree_with_comments_continuations_and_any_case() -> None:
    text = """# The fabric
SwitchName=s0 Nodes=dev[0-5]   # leaf
switchname=s1 \\
    nodes=dev-[6-11] LinkSpeed=100
SwitchName=s2 Nodes=dev-[12-17]

SwitchName=s3 Switches=s[0-2]
"""
    topo = parse_topology_conf(text, source="/etc/slurm/topology.conf")
    assert topo.kind == "tree" and topo.source == "/etc/slurm/topology.conf"
    assert topo.switches["s3"].level == 1 and len(topo.nodes_under("s3")) == 18
    assert topo.path("dev-7") == ("s1", "s3")


def test_topology_conf_blocks() -> None:
    topo = parse_topology_conf("BlockName=b1 Nodes=n[1-4]\nBlockName=b2 Nodes=n[5-8]\nBlockSizes=4,8\n")
    assert topo.kind == "block" and topo.leaf_of["n6"] == "b2"


def test_topology_conf_three_levels() -> None:
    lines = [f"SwitchName=leaf{i} Nodes=n[{4 * i}-{4 * i + 3}]" for i in range(4)]
    lines += ["SwitchName=agg0 Switches=leaf[0-1]", "SwitchName=agg1 Switches=leaf[2-3]",
              "SwitchName=core Switches=agg[0-1]"]
    topo = parse_topology_conf("\n".join(lines))
    assert topo.path("n13") == ("leaf3", "agg1", "core")
    assert topo.switches["core"].level == 2


def test_topology_yaml_file() -> None:
    text = """
- topology: ib
  cluster_default: false
  tree:
    switches:
      - switch: s1
        nodes: ["gpu[1-2]", gpu3]
      - switch: top
        children: s1
- topology: nvl
  cluster_default: true
  block:
    block_sizes: [2]
    blocks:
      - block: nvl1
        nodes: gpu[1-2]
- topology: none
  flat: true
"""
    default = parse_topology_yaml(text)
    assert default is not None and default.kind == "block"
    tree = parse_topology_yaml(text, "ib")
    assert tree is not None and tree.path("gpu3") == ("s1", "top")
    assert parse_topology_yaml(text, "none") is None


BAD_SHOW = [
    ("garbage", "hello world\n", "expected Key=value"),
    ("unknown first key", "RackName=r1 Nodes=n1\n", "expected SwitchName="),
    ("unknown key", "SwitchName=s0 Level=0 LinkSpeed=1 Nodes=n1 Colour=red\n", "unknown key 'Colour'"),
    ("empty name", "SwitchName= Level=0 LinkSpeed=1 Nodes=n1\n", "SwitchName= is empty"),
    ("null name", "SwitchName=(null) Level=0 LinkSpeed=1 Nodes=n1\n", "SwitchName= is empty"),
    ("no level", "SwitchName=s0 Nodes=n1\n", "without Level="),
    ("bad level", "SwitchName=s0 Level=x LinkSpeed=1 Nodes=n1\n", "not a whole number"),
    ("superscript level", "SwitchName=s0 Level=\u00b2 LinkSpeed=1 Nodes=n1\n", "not a whole number"),
    ("bad node name", "SwitchName=s0 Level=0 LinkSpeed=1 Nodes=n$1\n", "invalid name"),
    ("bad child name", "SwitchName=s0 Level=1 LinkSpeed=1 Switches=a;b\n", "not a switch or block name"),
    ("wrong level", "SwitchName=s0 Level=3 LinkSpeed=1 Nodes=n1\n", "Level=3 but sits at level 0"),
    ("two leaves", "SwitchName=a Level=0 LinkSpeed=1 Nodes=n[1-2]\nSwitchName=b Level=0 LinkSpeed=1 Nodes=n2\n",
     "'n2' is under both 'a' and 'b'"),
    ("loop", "SwitchName=a Level=1 LinkSpeed=1 Switches=b\nSwitchName=b Level=1 LinkSpeed=1 Switches=a\n", "loop"),
    ("self loop", "SwitchName=a Level=1 LinkSpeed=1 Switches=a\n", "names itself"),
    ("unknown child", "SwitchName=a Level=1 LinkSpeed=1 Switches=b\n", "'b', which is not defined"),
    ("two parents", "SwitchName=l Level=0 LinkSpeed=1 Nodes=n1\nSwitchName=a Level=1 LinkSpeed=1 Switches=l\n"
     "SwitchName=b Level=1 LinkSpeed=1 Switches=l\n", "under both 'a' and 'b'"),
    ("defined twice", "SwitchName=a Level=0 LinkSpeed=1 Nodes=n1\nSwitchName=a Level=0 LinkSpeed=1 Nodes=n2\n",
     "defined twice"),
    ("no nodes", "SwitchName=a Level=0 LinkSpeed=1\n", "neither nodes nor switches"),
    ("key twice", "SwitchName=a Level=0 LinkSpeed=1 Nodes=n1 Nodes=n2\n", "given twice"),
    ("mixed kinds", "SwitchName=a Level=0 LinkSpeed=1 Nodes=n1\nBlockName=b BlockIndex=0 Nodes=n2 BlockSize=1\n",
     "block line in a tree"),
    ("bad hostlist", "SwitchName=a Level=0 LinkSpeed=1 Nodes=n[1-\n", "Nodes"),
    ("huge hostlist", "SwitchName=a Level=0 LinkSpeed=1 Nodes=n[1-99999999999]\n", "more than"),
    ("huge product", "SwitchName=a Level=0 LinkSpeed=1 Nodes=n[1-2000]x[1-2000]\n", "more than"),
    ("huge line", "SwitchName=a Level=0 LinkSpeed=1 Nodes=" + "n" * (MAX_LINE_CHARS + 1) + "\n", "longer than"),
    ("long name", "SwitchName=" + "s" * 65 + " Level=0 LinkSpeed=1 Nodes=n1\n", "not a switch or block name"),
    ("parent lists other nodes", "SwitchName=l Level=0 LinkSpeed=1 Nodes=n1\n"
     "SwitchName=t Level=1 LinkSpeed=1 Nodes=n[1-9] Switches=l\n", "other than the nodes of its child"),
    ("message among lines", "SwitchName=a Level=0 LinkSpeed=1 Nodes=n1\nNo topology information available\n",
     "among other lines"),
    ("ring", "RingName=r1 Nodes=n[1-4] RingSize=4\n", "topology/ring has no switches"),
    ("block without size", "BlockName=b BlockIndex=0 Nodes=n1\n", "without BlockSize="),
    ("blocks without nodes", "BlockName=b BlockIndex=0 BlockSize=4\n", "no block holds a node"),
    ("block node in two blocks", "BlockName=a BlockIndex=0 Nodes=n[1-2] BlockSize=2\n"
     "BlockName=b BlockIndex=1 Nodes=n[2-3] BlockSize=2\n", "under both"),
]


@pytest.mark.parametrize(("text", "match"), [c[1:] for c in BAD_SHOW], ids=[c[0] for c in BAD_SHOW])
def test_bad_show_topology(text: str, match: str) -> None:
    with pytest.raises(TopologyError, match=match) as info:
        parse_show_topology(text)
    assert isinstance(info.value, ParseError)


BAD_CONF = [
    ("empty", "# nothing here\n\n", "no SwitchName= or BlockName="),
    ("level given", "SwitchName=s0 Level=0 Nodes=n1\n", "Level= is not a topology.conf key"),
    ("unknown key", "SwitchName=s0 Nodes=n1 Speed=4\n", "unknown key 'Speed'"),
    ("both kinds", "SwitchName=s0 Nodes=n1\nBlockName=b Nodes=n2\n", "in a file of SwitchName="),
    ("bad block sizes", "BlockName=b Nodes=n[1-4]\nBlockSizes=4,6\n", "power of two"),
    ("block sizes twice", "BlockName=b Nodes=n[1-4]\nBlockSizes=4\nBlockSizes=4\n", "given once"),
    ("block without nodes", "BlockName=b\n", "block without Nodes="),
    ("node under two leaves", "SwitchName=a Nodes=n[1-3]\nSwitchName=b Nodes=n3\n", "'n3' is under both"),
    ("continued into garbage", "SwitchName=a \\\n garbage\n", "expected Key=value"),
    ("loop", "SwitchName=a Switches=b\nSwitchName=b Switches=c\nSwitchName=c Switches=a\n", "loop"),
]


@pytest.mark.parametrize(("text", "match"), [c[1:] for c in BAD_CONF], ids=[c[0] for c in BAD_CONF])
def test_bad_topology_conf(text: str, match: str) -> None:
    with pytest.raises(TopologyError, match=match):
        parse_topology_conf(text)


BAD_YAML = [
    ("not yaml", "- topology: [\n", "not YAML"),
    ("not a list", "topology: a\n", "must be a list"),
    ("empty list", "[]\n", "no topology"),
    ("two kinds", "- topology: a\n  tree: {switches: [{switch: s, nodes: n1}]}\n  block: {blocks: []}\n",
     "exactly one"),
    ("ring", "- topology: a\n  ring: {rings: [{ring: r, nodes: 'n[1-4]'}]}\n", "no switches or blocks"),
    ("switch without name", "- topology: a\n  tree: {switches: [{nodes: n1}]}\n", "switch= is empty"),
    ("nodes a number", "- topology: a\n  tree: {switches: [{switch: s, nodes: 7}]}\n", "hostlist"),
    ("deep", "- topology: a\n  tree: " + "[" * 5000 + "]" * 5000 + "\n", "must be a mapping|nested|not YAML"),
]


@pytest.mark.parametrize(("text", "match"), [c[1:] for c in BAD_YAML], ids=[c[0] for c in BAD_YAML])
def test_bad_topology_yaml(text: str, match: str) -> None:
    with pytest.raises(TopologyError, match=match):
        parse_topology_yaml(text)


def test_huge_topology_is_refused_fast() -> None:
    import time

    lines = "\n".join(f"SwitchName=s{i} Level=0 LinkSpeed=1 Nodes=n{i}x[1-9999]" for i in range(120))
    t0 = time.perf_counter()
    with pytest.raises(TopologyError, match="more than"):
        parse_show_topology(lines)
    assert time.perf_counter() - t0 < 10
