"""The daemon's Slurm backend reads the real test cluster's topology (``scontrol show topology``) and
it is the topology slurmctld was given: the topology.conf or topology.yaml that
``scripts/slurm-test-cluster.sh`` wrote next to slurm.conf (``HEALTHD_SLURM_TOPOLOGY``, a tree by
default), or none."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from healthd.cluster.slurm import SlurmBackend
from healthd.cluster.topology import check_nodes, read_topology, read_topology_file
from healthd.config import Settings, TopologySettings
from healthd.daemon import Daemon
from healthd.errors import SlurmError
from healthd.jobs import LaunchSettings
from healthd.topology import Topology, describe

if TYPE_CHECKING:
    from tests.integration.conftest import SlurmTestCluster


def _given(cluster: SlurmTestCluster) -> tuple[bool, Topology | None]:
    """(whether the script's files say, the topology they describe)."""
    etc = cluster.conf.parent
    if cluster.directory is None:
        return False, None
    yaml_file = etc / "topology.yaml"
    if yaml_file.is_file() and cluster.release >= (25, 5):
        return True, read_topology_file(yaml_file)
    conf = etc / "topology.conf"
    return True, read_topology_file(conf) if conf.is_file() else None


def _shape(topology: Topology | None) -> object:
    if topology is None:
        return None
    return (topology.kind, dict(topology.leaf_of),
            {name: (s.level, s.parent, s.nodes) for name, s in topology.switches.items()})


@pytest.mark.slurm
@pytest.mark.slurm_release
def test_the_slurm_backend_reads_the_clusters_topology(slurm_cluster: SlurmTestCluster, tmp_path: Path) -> None:
    backend = SlurmBackend(slurm_cluster.cli(), LaunchSettings(python=sys.executable, results_dir=tmp_path))
    topology = read_topology(TopologySettings(), backend)
    known, expected = _given(slurm_cluster)
    if known:
        assert _shape(topology) == _shape(expected), describe(topology)
    if known and expected is not None and expected.kind == "tree":  # the script's default
        half = (len(slurm_cluster.nodes) + 1) // 2
        assert topology is not None and topology.path(slurm_cluster.nodes[0]) == ("leaf1", "spine")
        if len(slurm_cluster.nodes) > half:
            assert topology.path(slurm_cluster.nodes[-1]) == ("leaf2", "spine")
    if topology is not None:
        assert topology.source == "scontrol show topology"
        check_nodes(topology, [n.name for n in backend.list_nodes()])

    settings = Settings(backend="slurm", state_dir=tmp_path / "state", http={"host": "127.0.0.1", "port": 0})
    daemon = Daemon(settings, None, backend=backend)
    try:
        daemon.discover()
        daemon.refresh_topology()
        assert _shape(daemon.topology) == _shape(topology) and daemon.judge.topology is daemon.topology
        assert f"; {describe(topology)}; passive signals: off" in daemon.healthy()[1]
    finally:
        daemon.http._server.server_close()
        daemon.store.close()


@pytest.mark.slurm
@pytest.mark.slurm_release
def test_named_topologies(slurm_cluster: SlurmTestCluster) -> None:
    """25.05+: ``scontrol show topology NAME`` reads one of topology.yaml's; before, NAME would be a
    switch's name, so healthd refuses to ask."""
    cli = slurm_cluster.cli()
    if slurm_cluster.release < (25, 5):
        with pytest.raises(SlurmError, match="has no named topologies"):
            cli.topology("blocks")
        return
    yaml_file = slurm_cluster.conf.parent / "topology.yaml"
    if slurm_cluster.directory is None or not yaml_file.is_file():
        pytest.skip("the cluster has no topology.yaml (HEALTHD_SLURM_TOPOLOGY=yaml)")
    blocks = cli.topology("blocks")
    assert _shape(blocks) == _shape(read_topology_file(yaml_file, "blocks"))
    assert blocks is not None and blocks.source == "scontrol show topology blocks"
    with pytest.raises(SlurmError):
        cli.topology("nosuch")
