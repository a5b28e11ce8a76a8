"""Reading the topology end to end without a cluster: the argv, the Slurm client's answer (the fake
prints what scontrol prints: the golden files), ``[topology]`` sources, the daemon's refresh (a failure
keeps the previous topology, is logged once and counted), ``/healthz``, the API's ``switch_path`` and
``healthd status --by-switch``."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic import ValidationError
from structlog.testing import capture_logs

from healthd.cluster.base import ObservedBackend, TopologySource
from healthd.cluster.local import LocalBackend
from healthd.cluster.slurm_argv import scontrol_topology_argv
from healthd.cluster.slurm_cli import SlurmCli, SlurmCommands
from healthd.cluster.topology import check_nodes, read_topology, read_topology_file
from healthd.config import Settings, TopologySettings
from healthd.daemon import Daemon
from healthd.errors import SlurmError, TopologyError
from healthd.http import node_detail, nodes_page
from healthd.parsers.topology import parse_topology_conf
from healthd.topology import Topology
from tests.fakes.slurm import FakeSlurmClient, fake_backend, gpu_node

SLURM = Path(__file__).resolve().parents[1] / "fixtures" / "slurm"
TREE = (SLURM / "24.11" / "topology.tree.txt").read_text()
BLOCKS = (SLURM / "26.05" / "topology.yaml-blocks.txt").read_text()
NODES = [f"node{i}" for i in range(1, 6)]
CONF = "SwitchName=leaf1 Nodes=node[1-3]\nSwitchName=leaf2 Nodes=node[4-5]\nSwitchName=spine Switches=leaf[1-2]\n"


def test_argv() -> None:
    assert scontrol_topology_argv(["scontrol"]) == ["scontrol", "show", "topology"]
    assert scontrol_topology_argv(["/opt/slurm/bin/scontrol"], "fabric") == [
        "/opt/slurm/bin/scontrol", "show", "topology", "fabric"]
    for bad in ("node=node1", "a b", "", "-x;rm"):
        with pytest.raises(ValueError, match="not a topology name"):
            scontrol_topology_argv(["scontrol"], bad)


@pytest.fixture
def fake() -> FakeSlurmClient:
    return FakeSlurmClient([gpu_node(n) for n in NODES])


def test_the_slurm_backend_reads_scontrols_answer(fake: FakeSlurmClient, tmp_path: Path) -> None:
    backend = fake_backend(fake, tmp_path)
    assert isinstance(backend, TopologySource)
    assert backend.topology() is None  # no topology plugin: scontrol prints nothing
    fake.topology_text = TREE
    topo = backend.topology()
    assert topo is not None and topo.path("node5") == ("leaf2", "spine") and topo.source == "scontrol show topology"
    fake.named_topologies["blocks"] = BLOCKS
    named = backend.topology("blocks")
    assert named is not None and named.kind == "block"
    fake.topology_text = "SwitchName=a Level=0 LinkSpeed=1 Nodes=node1\nSwitchName=b Level=0 LinkSpeed=1 Nodes=node1\n"
    with pytest.raises(TopologyError, match="under both"):
        backend.topology()


def test_the_local_backend_has_none_of_its_own() -> None:
    local = LocalBackend(node_name="here", python=Path("python3"))
    assert not isinstance(local, TopologySource)
    assert ObservedBackend(local, lambda ok: None).topology() is None


def test_sources(fake: FakeSlurmClient, tmp_path: Path) -> None:
    backend = fake_backend(fake, tmp_path)
    conf = tmp_path / "topology.conf"
    conf.write_text(CONF)
    yaml_file = tmp_path / "topology.yaml"
    yaml_file.write_text((SLURM / "26.05" / "topology.yaml-topoconf.txt").read_text())

    assert read_topology(TopologySettings(), backend) is None
    from_file = read_topology(TopologySettings(file=conf), backend)
    assert from_file is not None and from_file.source == str(conf)  # auto: Slurm has none, the file
    assert read_topology(TopologySettings(source="slurm", file=conf), backend) is None
    assert read_topology(TopologySettings(source="none", file=conf), backend) is None
    fake.topology_text = TREE
    from_slurm = read_topology(TopologySettings(file=conf), backend)
    assert from_slurm is not None and from_slurm.source == "scontrol show topology"  # auto: Slurm's first
    assert from_slurm.leaf_of == from_file.leaf_of
    only_file = read_topology(TopologySettings(source="file", file=conf), backend)
    assert only_file is not None and only_file.source == str(conf)
    blocks = read_topology(TopologySettings(source="file", file=yaml_file, name="blocks"), None)
    assert blocks is not None and blocks.kind == "block"
    assert read_topology_file(yaml_file) is not None
    with pytest.raises(TopologyError, match="cannot read it"):
        read_topology_file(tmp_path / "missing.conf")
    with pytest.raises(ValidationError, match=r"needs topology\.file"):
        TopologySettings(source="file")
    with pytest.raises(ValidationError):
        TopologySettings(colour="red")  # type: ignore[call-arg]


def test_unknown_nodes_are_refused() -> None:
    topo = read_topology_file_text(CONF + "SwitchName=leaf3 Nodes=gone[1-9]\nSwitchName=top Switches=spine,leaf3\n")
    check_nodes(topo, [*NODES, *(f"gone{i}" for i in range(1, 10))])
    with pytest.raises(TopologyError, match=r"names 9 node\(s\) the cluster does not have: gone1, gone2, gone3, "
                                            r"gone4, gone5 and 4 more"):
        check_nodes(topo, NODES)


def read_topology_file_text(text: str) -> Topology:
    return parse_topology_conf(text)


@pytest.fixture
def daemon(fake: FakeSlurmClient, tmp_path: Path) -> Iterator[Daemon]:
    settings = Settings(backend="slurm", state_dir=tmp_path / "state", http={"host": "127.0.0.1", "port": 0})
    d = Daemon(settings, None, backend=fake_backend(fake, settings.results_dir))
    yield d
    d.http._server.server_close()
    d.store.close()


def _healthz(d: Daemon) -> str:
    """``/healthz``'s text after the liveness part (the scheduler is not started here)."""
    ok, text = d.healthy()
    assert not ok and text.startswith("scheduler not running; ")
    return text.removeprefix("scheduler not running; ").removesuffix("; passive signals: off")


def test_the_daemon_reads_keeps_and_says(daemon: Daemon, fake: FakeSlurmClient) -> None:
    daemon.discover()
    assert _healthz(daemon) == "topology not read yet"
    with capture_logs() as logs:
        daemon.refresh_topology()
        daemon.refresh_topology()
    assert daemon.topology is None and daemon.judge.topology is None
    said = [e for e in logs if e["event"] == "topology"]
    assert len(said) == 1 and said[0]["topology"].startswith("no topology")  # said once
    assert _healthz(daemon).startswith("no topology: switch correlation off")

    fake.topology_text = TREE
    with capture_logs() as logs:
        daemon.refresh_topology()
    assert daemon.topology is not None and daemon.judge.topology is daemon.topology
    assert [e["topology"] for e in logs if e["event"] == "topology"] == [
        "topology/tree from scontrol show topology: 3 switches, 2 leaves, 5 nodes"]
    assert daemon.metrics.topology_nodes._value.get() == 5
    kept = daemon.topology

    fake.topology_text = TREE.replace("node[4-5]", "node[3-5]", 1)  # node3 under two leaves
    with capture_logs() as logs:
        for _ in range(3):
            daemon.refresh_topology()
    failed = [e for e in logs if e["event"] == "topology_read_failed"]
    assert len(failed) == 1 and "node 'node3' is under both 'leaf1' and 'leaf2'" in failed[0]["error"]
    assert daemon.metrics.topology_errors._value.get() == 3
    assert daemon.topology is kept and daemon.judge.topology is kept
    text = _healthz(daemon)
    assert text.startswith("topology/tree from scontrol show topology") and "the previous one kept" in text

    fake.topology_text = TREE.replace("node[4-5]", "node[4-6]").replace("node[1-5]", "node[1-6]")  # no node6
    daemon.refresh_topology()
    assert "node(s) the cluster does not have: node6" in _healthz(daemon) and daemon.topology is kept

    fake.topology_text = TREE
    with capture_logs() as logs:
        daemon.refresh_topology()
    assert [e["event"] for e in logs] == ["topology_read_again"]  # unchanged: not said again
    assert _healthz(daemon) == "topology/tree from scontrol show topology: 3 switches, 2 leaves, 5 nodes"


def test_a_slurm_outage_keeps_the_topology(daemon: Daemon, fake: FakeSlurmClient) -> None:
    fake.topology_text = TREE
    daemon.discover()
    daemon.refresh_topology()
    kept = daemon.topology
    fake.topology = lambda name=None: (_ for _ in ()).throw(SlurmError("scontrol did not answer"))  # type: ignore[method-assign]
    daemon.refresh_topology()
    assert daemon.topology is kept and "scontrol did not answer" in _healthz(daemon)


def test_the_api_and_status_carry_the_switch_path(daemon: Daemon, fake: FakeSlurmClient, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    fake.topology_text = TREE
    daemon.discover()
    daemon.refresh_topology()
    page = nodes_page(daemon.store, "", daemon.topology)
    assert {n["name"]: n["switch_path"] for n in page["nodes"]}["node4"] == ["leaf2", "spine"]
    assert node_detail(daemon.store, "node1", daemon.topology)["switch_path"] == ["leaf1", "spine"]
    assert node_detail(daemon.store, "node1")["switch_path"] == []

    from healthd.cli import main

    conf = tmp_path / "topology.conf"
    conf.write_text(CONF.replace("leaf2 Nodes=node[4-5]", "leaf2 Nodes=node[4-6]"))
    config = tmp_path / "healthd.toml"
    config.write_text(f'state_dir = "{daemon.settings.state_dir}"\nbackend = "local"\n'
                      f'[topology]\nsource = "file"\nfile = "{conf}"\n')
    capsys.readouterr()
    main(["status", "--config", str(config), "--by-switch"])
    out = capsys.readouterr().out
    assert out.splitlines()[0].startswith("topology/tree from")
    heads = [line for line in out.splitlines() if line.startswith("==")]
    assert heads == ["== switch leaf1 < spine", "== switch leaf2 < spine"]
    assert out.index("node3") < out.index("== switch leaf2") < out.index("node4")
    main(["status", "--config", str(config), "--by-switch", "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert {n["name"]: n["switch_path"] for n in doc["nodes"]}["node5"] == ["leaf2", "spine"]


def _scontrol(stdout: Path | None, stderr: Path | None) -> SlurmCli:
    """SlurmCli whose scontrol is a fake printing captured real output (the golden files)."""
    script = " ".join([f'cat "{stdout}";' if stdout else "", f'cat "{stderr}" >&2;' if stderr else "", "exit 0"])
    return SlurmCli(SlurmCommands(scontrol=("sh", "-c", script, "scontrol")), timeout_s=10)


def test_slurm_cli_reads_the_answers_of_scontrol() -> None:
    """scontrol exits 0 on every one of these: only the text tells them apart."""
    tree = _scontrol(SLURM / "22.05" / "topology.tree.txt", None).topology()
    assert tree is not None and tree.path("node1") == ("leaf1", "spine")
    none = SLURM / "22.05" / "topology.none.txt"
    assert _scontrol(none, none.with_name(none.name + ".stderr")).topology() is None
    assert _scontrol(SLURM / "24.11" / "topology.none.txt", None).topology() is None
    down = SLURM / "22.05" / "topology.ctld_down.txt"
    with pytest.raises(SlurmError, match="Unable to contact slurm controller"):
        _scontrol(down, down.with_name(down.name + ".stderr")).topology()
    unknown = SLURM / "26.05" / "topology.yaml-nosuch.txt"
    with pytest.raises(SlurmError, match="Requested topology configuration is not available"):
        _scontrol(unknown, unknown.with_name(unknown.name + ".stderr")).topology()
