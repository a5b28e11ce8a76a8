"""NCCL network path: parsing real NCCL debug lines (tests/fixtures/nccl_debug, sources in
SOURCES.md there), the probe's line selection, and the daemon's verdict on the expected transport."""

from __future__ import annotations

import argparse
import json
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import probes.nccl as nccl_probe
from healthd.errors import ParseError
from healthd.parsers.expand import expand_result
from healthd.parsers.nccl_transport import (
    ProcessDebug,
    RankDebug,
    canonical_transport,
    expand_nccl_transport,
    mismatch_reason,
    parse_nccl_debug,
    summarize,
)
from probes.context import ProbeContext
from probes.dist import LaunchInfo
from probes.result import Outcome, ProbeResult, RankInfo

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "nccl_debug"


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


def by_pid(name: str) -> dict[int, ProcessDebug]:
    return {p.pid: p for p in parse_nccl_debug(fixture(name))}


# -- parsing -------------------------------------------------------------------------------------


def test_hpcx_rdma_sharp_plugin_is_ib() -> None:
    procs = by_pid("nccl-1357_ibext_sharp.log")
    assert sorted(procs) == [39629, 49355, 49356, 49357, 49360]
    p = procs[49357]
    assert (p.host, p.networks, p.transports) == ("qh100-gpu19", ("IBext",), frozenset({"IB"}))
    assert p.ib_devices == ("mlx5_0:1/IB/SHARP", "mlx5_1:1/IB/SHARP", "mlx5_4:1/IB/SHARP", "mlx5_5:1/IB/SHARP")
    assert p.ib_oob == "ibp25s0:10.20.0.119<0>"
    assert not p.ib_absent and p.socket_devices == () and p.communicators == ()
    assert procs[49355].networks == ("IBext",) and procs[49355].ib_devices == ()
    assert procs[39629].plugin == (
        "NET/Plugin: Failed to find ncclNetPlugin_v8 symbol.",
        "NET/Plugin: Loaded net plugin NCCL RDMA Plugin v6 (v6)",
        "NET/Plugin: Failed to find ncclCollNetPlugin_v8 symbol.",
        "NET/Plugin: Loaded collnet plugin SHARP (v6)",
        "Plugin Path : /opt/hpcx/nccl_rdma_sharp_plugin/lib/libnccl-net.so",
        "P2P plugin IBext",
    )
    assert procs[39629].networks == () and procs[39629].transports == frozenset()


def test_internal_ib_over_roce_without_a_plugin() -> None:
    procs = by_pid("nccl-tests-185_roce_no_plugin.log")
    a, b = procs[460770], procs[2152176]
    assert (a.host, a.version, a.networks) == ("dgxh100-4", "2.19.3+cuda12.3", ("IB",))
    assert (b.host, b.version, b.networks) == ("dgxh100-3", None, ("IB",))
    assert a.ib_devices == b.ib_devices == ("mlx5_10:1/RoCE", "mlx5_11:1/RoCE")
    assert (a.ib_oob, b.ib_oob) == ("enp220s0np0:11.1.128.136<0>", "enp220s0np0:11.1.128.128<0>")
    assert a.plugin == ("NET/Plugin : dlerror=libnccl-net.so: cannot open shared object file: No such file or "
                        "directory No plugin found (libnccl-net.so), using internal implementation",)
    assert b.plugin == ("NET/Plugin : Plugin load (libnccl-net.so) returned 2 : libnccl-net.so: cannot open shared "
                        "object file: No such file or directory",
                        "NET/Plugin : No plugin found, using internal implementation")


def test_socket_fallback_with_no_ib_device() -> None:
    (p,) = parse_nccl_debug(fixture("nccl-tests-217_socket_no_ib.log"))
    assert (p.host, p.pid, p.version) == ("NAME", 70918, "2.21.5+cuda12.4")
    assert p.ib_absent and p.ib_devices == ()
    assert p.socket_devices == ("lo:127.0.0.1<0>",)
    assert p.networks == ("Socket",) and p.transports == frozenset({"Socket"})
    assert p.plugin == ("NET/Plugin: No plugin found (libnccl-net.so)", "NET/Plugin: Using internal network plugin.")
    assert p.warnings == ("socketProgress: Connection closed by remote peer localhost<56086>",)


def test_aws_ofi_plugin_on_efa() -> None:
    procs = by_pid("nccl-1597_ofi_efa.log")
    a, b = procs[6831], procs[6310]
    assert a.networks == ("Libfabric",) and a.transports == frozenset({"OFI"})
    assert a.ofi_nics == ("0000:a3:00.0", "0000:a2:00.0") and a.ofi_provider is None
    assert b.ofi_provider == "efa" and b.networks == ()
    assert b.ofi_nics == ("0000:56:00.0", "0000:55:00.0", "0000:58:00.0", "0000:57:00.0", "0000:6f:00.0",
                          "0000:6e:00.0", "0000:71:00.0")


def test_slingshot_cxi_provider() -> None:
    procs = by_pid("determined-169_slingshot_cxi.log")
    assert {pid: p.ofi_provider for pid, p in procs.items()} == {51404: "cxi", 51338: "cxi"}
    assert all(p.host == "nid000019" and p.transports == frozenset() for p in procs.values())


def test_old_ring_lines_behind_mpirun_tags() -> None:
    procs = by_pid("aws-ofi-nccl-24_ring_libfabric.log")
    assert len(procs) == 10
    net = procs[21471]
    assert net.host == "ip-172-32-38-1" and net.networks == ()
    (comm,) = net.communicators
    assert (comm.inter, comm.channel_networks, comm.nics, comm.intra) == (
        ("NET/AWS Libfabric",), ("AWS Libfabric",), (0,), ())
    assert net.transports == frozenset({"OFI"})
    (local,) = procs[8716].communicators
    assert local.intra == ("P2P/IPC",) and local.inter == () and procs[8716].transports == frozenset()
    assert procs[72593].warnings == ("NET/OFI Couldn't open AV. RC: -22, ERROR: Invalid argument",)
    assert procs[8800].communicators == () and procs[8800].warnings == ()


def test_channel_transports_and_nic_indices() -> None:
    procs = by_pid("nccl-1189_ib_gdrdma_cumem.log")
    (c40,) = procs[4015540].communicators
    assert (c40.inter, c40.nics, c40.intra, c40.channel_networks) == (
        ("NET/IB/GDRDMA",), (2,), ("P2P/CUMEM",), ("IB",))
    (c39,) = procs[4015539].communicators
    assert (c39.inter, c39.nics, c39.intra) == (("NET/IB/GDRDMA",), (3,), ())
    (c25,) = procs[1789225].communicators
    assert (c25.intra, c25.inter) == (("P2P/CUMEM",), ())
    assert procs[1789224].communicators == ()


def test_commid_nvls_and_lines_before_init_complete() -> None:
    procs = by_pid("nccl-1814_ibext_v8_nvls.log")
    (c983,) = procs[983].communicators
    assert (c983.pointer, c983.comm_id, c983.rank, c983.nranks) == ("0x55f01c18e490", "0x5ae77eb5ea4ec1ee", 35, 64)
    assert (c983.inter, c983.nics, c983.nvls, c983.intra) == (("NET/IBext_v8",), (0,), True, ())
    (c980,) = procs[980].communicators
    assert (c980.rank, c980.nics, c980.intra, c980.nvls) == (32, (7,), ("P2P/CUMEM",), False)
    (c982,) = procs[982].communicators
    assert (c982.rank, c982.nvls, c982.inter) == (34, True, ())
    (c981,) = procs[981].communicators  # its Init COMPLETE is not in the excerpt
    assert (c981.pointer, c981.nics, c981.channel_networks) == (None, (4, 7), ("IBext_v8",))
    assert procs[981].transports == frozenset({"IB"})


def test_shm_when_p2p_is_impossible() -> None:
    procs = by_pid("nccl-1516_shm_ib_shared.log")
    (comm,) = procs[1696338].communicators
    assert (comm.intra, comm.inter, comm.nics) == (("SHM/direct/direct",), ("NET/IB/Shared",), (0,))
    assert procs[1424218].communicators == ()  # "Ring 00 : 1 -> 2 -> 3" is a ring order, not a channel


def test_one_process_many_threads() -> None:
    (p,) = parse_nccl_debug(fixture("nccl-1817_socket_p2p_direct.log"))
    assert (p.pid, p.version, p.networks, p.socket_devices) == (
        3884994, "2.20.5+cuda12.4", ("Socket",), ("eth0:10.45.223.193<0>",))
    assert len(p.communicators) == 5  # one per thread that printed channel lines
    assert {c.intra for c in p.communicators} == {("P2P/direct pointer",)}
    assert [c.network for c in p.communicators].count("Socket") == 2  # threads 3885029 and 3885025


def test_communicator_topology_and_init_start() -> None:
    (p,) = parse_nccl_debug(fixture("nccl-tests-213_comm_topology.log"))
    assert [(c.rank, c.nranks, c.nnodes, c.pointer) for c in p.communicators] == [
        (1, 8, 1, "0x55a7be569d00"), (2, 8, 1, "0x55a7be570210"), (0, 8, 1, "0x55a7be5601c0"),
        (5, 8, 1, "0x55a7be582ff0")]
    procs = by_pid("nccl-tests-252_init_start.log")
    started = {pid: (c.rank, c.comm_id) for pid, p in procs.items() for c in p.communicators}
    assert started == {25146: (4, "0x996ee6f117cb8e1e"), 27255: (0, "0x996ee6f117cb8e1e"),
                       25172: (5, "0x996ee6f117cb8e1e"), 25169: (6, "0x996ee6f117cb8e1e"),
                       25148: (7, "0x996ee6f117cb8e1e"), 27223: (1, "0x996ee6f117cb8e1e")}


def test_version_line_belongs_to_the_process_before_it() -> None:
    procs = by_pid("nccl-983_ib_version.log")
    assert procs[113168].version == "2.13.4+cuda11.7" and procs[12381].version is None
    assert procs[113168].ib_devices == ("mlx5_0:1/IB", "mlx5_1:1/IB", "mlx5_2:1/IB", "mlx5_3:1/IB")


def test_text_without_nccl_lines_is_a_parse_error() -> None:
    with pytest.raises(ParseError, match=r"no NCCL debug line.*line 1 is 'Traceback \(most recent call last\):'"):
        parse_nccl_debug("Traceback (most recent call last):\n  File x\n")
    with pytest.raises(ParseError, match="the text is empty"):
        parse_nccl_debug([])


@pytest.mark.parametrize(("name", "family"), [
    ("IB", "IB"), ("IBext", "IB"), ("IBext_v8", "IB"), ("AWS Libfabric", "OFI"), ("Libfabric", "OFI"),
    ("OFI", "OFI"), ("Socket", "Socket"), ("UCX", "UCX"), ("GPUDirectTCPX", "GPUDirectTCPX"), ("ib", "IB"),
])
def test_canonical_transport(name: str, family: str) -> None:
    assert canonical_transport(name) == family


# -- summary and verdict -------------------------------------------------------------------------


def rank(r: int, node: str, name: str) -> RankDebug:
    return RankDebug(r, node, tuple(parse_nccl_debug(fixture(name))))


def test_expectation_met_and_missed() -> None:
    ib = summarize([rank(0, "gpu01", "nccl-983_ib_version.log"), rank(1, "gpu02", "nccl-983_ib_version.log")])
    assert ib.used == ("IB",) and mismatch_reason(ib, ["IB"]) is None and mismatch_reason(ib, []) is None
    assert mismatch_reason(ib, ["OFI"]) == "nccl_transport: expected OFI, used IB"
    sock = summarize([rank(0, "gpu01", "nccl-tests-217_socket_no_ib.log")])
    assert mismatch_reason(sock, ["IB", "OFI"]) == "nccl_transport: expected IB or OFI, used Socket"
    mixed = summarize([rank(0, "gpu01", "nccl-983_ib_version.log"),
                       rank(8, "gpu02", "nccl-tests-217_socket_no_ib.log")])
    assert mixed.used == ("IB", "Socket")
    assert mismatch_reason(mixed, ["IB"]) == "nccl_transport: expected IB, used Socket (on gpu02)"
    efa = summarize([rank(0, "p5-1", "nccl-1597_ofi_efa.log")])
    assert mismatch_reason(efa, ["IB", "Libfabric"]) is None  # an expectation given as NCCL's name


def test_summary_merges_communicators_by_commid() -> None:
    s = summarize([rank(32, "hostname-test", "nccl-1814_ibext_v8_nvls.log")])
    merged = [c for c in s.communicators if c["comm_id"] == "0x5ae77eb5ea4ec1ee"]
    assert len(merged) == 1
    (c,) = merged
    assert (c["nranks"], c["networks"], c["transports"], c["nvls"], c["ranks"]) == (
        64, ["IBext_v8"], ["IB"], True, [32])
    assert sorted(c["inter"]) == ["NET/IBext_v8"] and c["intra"] == ["P2P/CUMEM"]
    node = s.nodes["hostname-test"]
    assert node["nics"] == [] and node["ib_absent"] is False


def gloo_result() -> ProbeResult:
    return ProbeResult.model_validate_json((FIXTURES / "probe_nccl_gloo_result.json").read_text())


def with_debug(debug: dict[str, Any], expect: list[str], outcome: Outcome = Outcome.PASS) -> ProbeResult:
    base = gloo_result()
    return base.model_copy(update={"outcome": outcome, "params": {**base.params, "nccl_debug": debug,
                                                                   "expect_transport": expect}})


def captured(*ranks: tuple[int, str, str]) -> dict[str, Any]:
    return {"status": "captured", "NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,NET",
            "set_by_probe": ["NCCL_DEBUG", "NCCL_DEBUG_SUBSYS", "NCCL_DEBUG_FILE"],
            "ranks": [{"rank": r, "node": node, "lines": fixture(name).splitlines(), "truncated": False}
                      for r, node, name in ranks]}


def test_gloo_records_gloo_and_no_false_alarm() -> None:
    result = gloo_result()
    assert result.params["expect_transport"] == ["IB", "OFI"] and result.params["nccl_debug"]["status"] == "gloo"
    out = expand_result(result)
    assert out.outcome is Outcome.PASS and out.reason == ""
    assert out.params["nccl_transport"] == {
        "expected": ["IB", "OFI"], "status": "gloo", "used": ["gloo"],
        "why": "gloo backend: NCCL was not used, no expectation applies"}
    assert out.measurements == result.measurements


def test_socket_where_ib_is_expected_is_degraded() -> None:
    result = with_debug(captured((0, "gpu01", "nccl-tests-217_socket_no_ib.log")), ["IB"])
    out = expand_nccl_transport(result)
    assert out.outcome is Outcome.DEGRADED
    assert out.reason == "nccl_transport: expected IB, used Socket"
    record = out.params["nccl_transport"]
    assert (record["status"], record["used"], record["networks"], record["mismatch"]) == (
        "ok", ["Socket"], ["Socket"], "nccl_transport: expected IB, used Socket")
    assert record["nodes"]["gpu01"] == {
        "nics": ["lo:127.0.0.1<0>"], "ib_absent": True, "ofi_provider": None, "version": "2.21.5+cuda12.4",
        "plugin": ["NET/Plugin: No plugin found (libnccl-net.so)", "NET/Plugin: Using internal network plugin."]}
    assert record["warnings"] == ["socketProgress: Connection closed by remote peer localhost<56086>"]
    json.loads(out.to_json())  # still serialisable for the store and the API


def test_expected_transport_passes_and_a_fail_stays_a_fail() -> None:
    good = expand_nccl_transport(with_debug(captured((0, "gpu01", "nccl-983_ib_version.log")), ["IB", "OFI"]))
    assert good.outcome is Outcome.PASS and "mismatch" not in good.params["nccl_transport"]
    assert good.params["nccl_transport"]["used"] == ["IB"]
    failed = with_debug(captured((0, "gpu01", "nccl-tests-217_socket_no_ib.log")), ["IB"], Outcome.FAIL)
    out = expand_nccl_transport(failed.model_copy(update={"reason": "nccl.all_reduce.8192.in_place.wrong: 3"}))
    assert out.outcome is Outcome.FAIL and out.reason == "nccl.all_reduce.8192.in_place.wrong: 3"
    assert out.params["nccl_transport"]["mismatch"] == "nccl_transport: expected IB, used Socket"


def test_no_expectation_no_verdict() -> None:
    out = expand_nccl_transport(with_debug(captured((0, "gpu01", "nccl-tests-217_socket_no_ib.log")), []))
    assert out.outcome is Outcome.PASS and out.params["nccl_transport"]["used"] == ["Socket"]


def test_nothing_captured_is_unknown_and_changes_nothing() -> None:
    debug = {"status": "not_captured", "NCCL_DEBUG": "WARN", "ranks": [
        {"rank": 0, "node": "gpu01", "error": "NCCL_DEBUG=WARN: NCCL printed no INFO lines"}]}
    out = expand_nccl_transport(with_debug(debug, ["IB"]))
    assert out.outcome is Outcome.PASS
    assert out.params["nccl_transport"] == {
        "expected": ["IB"], "status": "unknown",
        "why": "NCCL_DEBUG=WARN: rank 0: NCCL_DEBUG=WARN: NCCL printed no INFO lines"}
    garbage = {"status": "captured", "NCCL_DEBUG": "INFO", "ranks": [{"rank": 0, "node": "n", "lines": ["hello"]}]}
    why = expand_nccl_transport(with_debug(garbage, ["IB"])).params["nccl_transport"]["why"]
    assert why == ("rank 0: no NCCL debug line: expected lines like 'host:pid:tid [dev] NCCL INFO ...'; "
                   "line 1 is 'hello'")
    older = gloo_result().model_copy(update={"params": {"expect_transport": ["IB"]}})
    assert expand_nccl_transport(older).params["nccl_transport"]["status"] == "unknown"


def test_other_probes_are_untouched() -> None:
    other = gloo_result().model_copy(update={"probe": "gemm"})
    assert expand_nccl_transport(other) is other


# -- the probe side ------------------------------------------------------------------------------


def test_probe_keeps_relevant_lines_and_drops_repeated_channels() -> None:
    lines = fixture("nccl-1189_ib_gdrdma_cumem.log").splitlines()
    kept, truncated = nccl_probe.select_debug_lines(lines)
    assert not truncated
    assert kept == [
        lines[1],  # NET/Plugin
        "H20-GPU-06:4015539:4015652 [0] NCCL INFO Channel 07/0 : 0[0] -> 2[0] [receive] via NET/IB/3/GDRDMA",
        "H20-GPU-06:4015540:4015653 [1] NCCL INFO Channel 00/0 : 1[1] -> 3[1] [receive] via NET/IB/2/GDRDMA",
        "H20-GPU-06:4015540:4015653 [1] NCCL INFO Channel 01/0 : 3[1] -> 1[1] [send] via NET/IB/2/GDRDMA",
        "H20-GPU-06:4015540:4015653 [1] NCCL INFO Channel 00/0 : 3[1] -> 2[0] via P2P/CUMEM",
        "H20-GPU-05:1789225:1789736 [1] NCCL INFO Channel 01/0 : 1[1] -> 0[0] via P2P/CUMEM",
    ]
    assert [p.transports for p in parse_nccl_debug(kept)] == [p.transports for p in parse_nccl_debug(lines)]
    few, cut = nccl_probe.select_debug_lines(lines, max_lines=2)
    assert few == kept[:2] and cut
    small, cut = nccl_probe.select_debug_lines(lines, max_bytes=len(lines[1]) + 1)
    assert small == [lines[1]] and cut


def test_probe_keeps_every_line_the_parser_reads() -> None:
    for path in sorted(FIXTURES.glob("*.log")):
        lines = path.read_text().splitlines()
        kept, _ = nccl_probe.select_debug_lines(lines, max_lines=10_000, max_bytes=1 << 20)
        full = {p.pid: p for p in parse_nccl_debug(lines)}
        selected = {p.pid: p for p in parse_nccl_debug(kept)}
        assert all(full[pid] == p for pid, p in selected.items()), path.name
        for pid in full.keys() - selected.keys():  # processes whose lines say nothing the parser reads
            assert full[pid] == ProcessDebug(host=full[pid].host, pid=pid, version=None, networks=()), path.name


def test_debug_file_name_as_nccl_expands_it() -> None:
    assert nccl_probe.debug_file_path("/tmp/d/nccl.%h.%p.log", "gpu01.cluster.local", 4242) == \
        "/tmp/d/nccl.gpu01.4242.log"


def test_before_init_keeps_site_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in ("NCCL_DEBUG", "NCCL_DEBUG_SUBSYS", "NCCL_DEBUG_FILE"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setattr(nccl_probe, "_capture", None)
    monkeypatch.setenv("NCCL_DEBUG_SUBSYS", "INIT,NET,GRAPH")
    nccl_probe.before_init(argparse.Namespace(), "gloo")
    assert "NCCL_DEBUG" not in os.environ and nccl_probe._capture is None
    nccl_probe.before_init(argparse.Namespace(), "nccl")
    capture = nccl_probe._capture
    assert capture is not None and capture.directory is not None
    try:
        assert capture.set_here == ("NCCL_DEBUG", "NCCL_DEBUG_FILE")
        assert os.environ["NCCL_DEBUG"] == "INFO" and os.environ["NCCL_DEBUG_SUBSYS"] == "INIT,NET,GRAPH"
        assert os.environ["NCCL_DEBUG_FILE"] == os.path.join(capture.directory, "nccl.%h.%p.log")
        assert Path(capture.directory).is_dir()
    finally:
        os.rmdir(capture.directory)


@pytest.fixture
def one_rank_group(tmp_path: Path) -> Iterator[object]:
    """A real one-rank gloo process group, for the probe's gathers."""
    import torch.distributed as dist

    store = dist.FileStore(str(tmp_path / "store"), 1)  # type: ignore[attr-defined]
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        yield dist.group.WORLD
    finally:
        dist.destroy_process_group()


def nccl_context(group: object) -> ProbeContext:
    import torch

    launch = LaunchInfo(launcher="srun", rank=0, world_size=1, local_rank=0, local_world_size=1, group_rank=0,
                        master_addr="127.0.0.1", master_port=29500, hostname=socket.gethostname(), node="gpu07")
    me = RankInfo(rank=0, local_rank=0, world_size=1, local_world_size=1, hostname=launch.hostname, node="gpu07",
                  device="cuda:0")
    return ProbeContext(args=argparse.Namespace(), launch=launch, device=torch.device("cpu"), device_type="cuda",
                        backend="nccl", gpu=0, ranks=[me], faults=frozenset(), mark=lambda _: None,
                        meta_group=group, deadline_at=time.time() + 60)


def test_probe_capture_reaches_the_daemon_verdict(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, one_rank_group: object
) -> None:
    # What NCCL leaves in a rank's NCCL_DEBUG_FILE when the image lacks the IB plugin and verbs.
    host = socket.gethostname().split(".", 1)[0]
    (tmp_path / f"nccl.{host}.{os.getpid()}.log").write_text(fixture("nccl-tests-217_socket_no_ib.log"))
    monkeypatch.setenv("NCCL_DEBUG", "INFO")
    monkeypatch.setenv("NCCL_DEBUG_SUBSYS", "INIT,NET")
    monkeypatch.setenv("NCCL_DEBUG_FILE", str(tmp_path / "nccl.%h.%p.log"))
    monkeypatch.setattr(nccl_probe, "_capture", None)
    debug = nccl_probe.debug_params(nccl_context(one_rank_group))
    assert debug is not None
    (entry,) = debug["ranks"]
    assert (debug["status"], debug["NCCL_DEBUG"], debug["set_by_probe"]) == ("captured", "INFO", [])
    assert (entry["rank"], entry["node"], entry["truncated"]) == (0, "gpu07", False)
    assert entry["lines"] == [
        "NAME :70918:70918 [0] NCCL INFO NET/Plugin: No plugin found (libnccl-net.so)",
        "NAME :70918:70918 [0] NCCL INFO NET/Plugin: Using internal network plugin.",
        "NCCL version 2.21.5+cuda12.4",
        "NAME :70918:70928 [0] NCCL INFO NET/IB : No device found.",
        "NAME :70918:70928 [0] NCCL INFO NET/Socket : Using [0]lo:127.0.0.1<0>",
        "NAME :70918:70928 [0] NCCL INFO Using network Socket",
        "NAME :70918:70927 [0] misc/socket.cc:50 NCCL WARN socketProgress: Connection closed by remote peer "
        "localhost<56086>",
    ]
    out = expand_result(with_debug(json.loads(json.dumps(debug)), ["IB", "OFI"]))
    assert out.outcome is Outcome.DEGRADED and out.reason == "nccl_transport: expected IB or OFI, used Socket"
    assert out.params["nccl_transport"]["nodes"]["gpu07"]["ib_absent"] is True


def test_probe_capture_with_site_warn_level(monkeypatch: pytest.MonkeyPatch, one_rank_group: object) -> None:
    monkeypatch.setenv("NCCL_DEBUG", "WARN")
    monkeypatch.setattr(nccl_probe, "_capture", None)
    debug = nccl_probe.debug_params(nccl_context(one_rank_group))
    assert debug is not None and debug["status"] == "not_captured"
    assert debug["ranks"] == [{"rank": 0, "node": "gpu07", "error": "NCCL_DEBUG=WARN: NCCL printed no INFO lines"}]
