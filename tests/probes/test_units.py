"""Pure parts of the probes: sizes and nccl-tests arithmetic, data patterns, launch detection,
host lists, liveness diagnosis, statistics, documents."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import hostlist
import pytest

from probes import env as env_probe
from probes.dist import (
    LaunchError,
    detect_launch,
    expand_hostlist,
    expand_hostlist_simple,
    parse_tasks_per_node,
    resolve_backend,
    resolve_device,
    srun_master_port,
)
from probes.faults import Fault, active_faults, parse_faults
from probes.liveness import RankState, diagnose
from probes.nccl import (
    Pattern,
    bus_factor,
    parse_size,
    pattern_for,
    pattern_values,
    plan_groups,
    reduced_values,
    sizing,
)
from probes.report import atomic_write
from probes.result import DeviceInfo, RankInfo
from probes.timing import median, process_start_time, quantile, rank_margin_seconds

# -- sizes and nccl-tests arithmetic ----------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [("8K", 8192), ("64M", 64 << 20), ("1G", 1 << 30), ("4096", 4096), ("8KiB", 8192), ("2kb", 2048)],
)
def test_parse_size(text: str, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "8X", "-1", "1.5G", "K"])
def test_parse_size_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="bad size"):
        parse_size(text)


def test_sizing_follows_nccl_tests_byte_counts() -> None:
    # all_reduce: size = count * typesize, S = size
    s = sizing("all_reduce", 1000, 4, 4)
    assert (s.count, s.size_bytes, s.algbw_bytes, s.in_elems, s.out_elems) == (250, 1000, 1000, 250, 250)
    # all_gather: per-rank count = size / (n * typesize), rounded down; S = count * typesize * n
    s = sizing("all_gather", 1000, 4, 4)
    assert (s.count, s.size_bytes, s.algbw_bytes, s.in_elems, s.out_elems) == (62, 992, 992, 62, 248)
    s = sizing("reduce_scatter", 1000, 4, 4)
    assert (s.count, s.size_bytes, s.algbw_bytes, s.in_elems, s.out_elems) == (62, 992, 992, 248, 62)
    # alltoall: count per peer, S = count * n * typesize
    s = sizing("alltoall", 8192, 2, 2)
    assert (s.count, s.size_bytes, s.algbw_bytes, s.in_elems, s.out_elems) == (2048, 8192, 8192, 4096, 4096)
    s = sizing("broadcast", 10, 8, 4)
    assert (s.count, s.size_bytes, s.algbw_bytes) == (2, 8, 8)
    s = sizing("sendrecv", 8192, 8, 8)
    assert (s.count, s.size_bytes, s.algbw_bytes) == (1024, 8192, 8192)
    assert sizing("all_gather", 8, 4, 4).count == 0


def test_bus_factors() -> None:
    assert bus_factor("all_reduce", 8) == pytest.approx(1.75)
    assert bus_factor("all_reduce", 2) == pytest.approx(1.0)
    assert bus_factor("all_reduce", 1) == 0.0
    for c in ("all_gather", "reduce_scatter", "alltoall"):
        assert bus_factor(c, 8) == pytest.approx(0.875)
        assert bus_factor(c, 4) == pytest.approx(0.75)
    assert bus_factor("broadcast", 8) == 1.0
    assert bus_factor("sendrecv", 8) == 1.0


def test_plan_groups() -> None:
    nodes = ["a", "a", "b", "b"]
    local = [0, 1, 0, 1]
    assert plan_groups("group", nodes, local) == [([0, 1, 2, 3], None)]
    assert plan_groups("node", nodes, local) == [([0, 1], None), ([2, 3], None)]
    assert plan_groups("rail", nodes, local) == [([0, 2], 0), ([1, 3], 1)]


# -- exact-integer patterns -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("dtype", "n", "k", "onehot"),
    [("float32", 8, 16, False), ("bfloat16", 32, 8, False), ("bfloat16", 256, 1, False), ("bfloat16", 300, 1, True)],
)
def test_reducing_pattern_sums_stay_exact(dtype: str, n: int, k: int, onehot: bool) -> None:
    pat = pattern_for(dtype, n, reducing=True)
    assert (pat.k, pat.onehot) == (k, onehot)
    limit = {"float32": 2**24, "bfloat16": 256}[dtype]
    largest = 1 if onehot else n * k
    assert largest <= limit


@pytest.mark.parametrize("pat", [Pattern(k=16), Pattern(k=7), Pattern(k=1), Pattern(k=1, onehot=True)])
@pytest.mark.parametrize("n", [2, 3, 8])
def test_reduced_values_is_the_sum_of_every_rank(pat: Pattern, n: int) -> None:
    import torch

    start, length = 5, 100
    brute = sum(pattern_values(pat, n, p, start, length, "cpu") for p in range(n))
    assert isinstance(brute, torch.Tensor)
    assert torch.equal(reduced_values(pat, n, start, length, "cpu"), brute)


def test_patterns_tell_ranks_apart() -> None:
    import torch

    pat = pattern_for("float32", 4, reducing=False)
    rows = [pattern_values(pat, 4, p, 0, 32, "cpu") for p in range(4)]
    for a in range(4):
        for b in range(a + 1, 4):
            assert not torch.equal(rows[a], rows[b])
    assert int(min(r.min() for r in rows)) >= 1
    assert int(max(r.max() for r in rows)) <= pat.k


# -- launch detection -------------------------------------------------------------------------


def test_no_launcher_means_standalone() -> None:
    assert detect_launch({"HOME": "/root", "SLURM_JOB_ID": "7", "SLURM_PROCID": "0"}) is None


def test_torchrun_launch() -> None:
    info = detect_launch(
        {
            "RANK": "3",
            "WORLD_SIZE": "8",
            "LOCAL_RANK": "1",
            "LOCAL_WORLD_SIZE": "2",
            "GROUP_RANK": "1",
            "MASTER_ADDR": "node1",
            "MASTER_PORT": "29500",
            "TORCHELASTIC_USE_AGENT_STORE": "True",
            "TORCHELASTIC_RESTART_COUNT": "0",
            "TORCHELASTIC_RUN_ID": "abc",
            "SLURMD_NODENAME": "gpu17",
        }
    )
    assert info is not None
    assert (info.launcher, info.rank, info.world_size, info.local_rank, info.local_world_size) == (
        "torchrun",
        3,
        8,
        1,
        2,
    )
    assert (info.group_rank, info.master_addr, info.master_port, info.node) == (1, "node1", 29500, "gpu17")
    assert info.agent_store is True
    assert info.store_prefix == "healthd/abc/0"


def test_standalone_child_launch() -> None:
    info = detect_launch(
        {"RANK": "0", "WORLD_SIZE": "2", "MASTER_PORT": "4000", "HEALTHD_PROBE_LAUNCHER": "standalone"}
    )
    assert info is not None
    assert (info.launcher, info.master_addr, info.agent_store, info.local_world_size) == (
        "standalone",
        "127.0.0.1",
        False,
        2,
    )


def srun_env(**over: str) -> dict[str, str]:
    env = {
        "SLURM_JOB_ID": "123456",
        "SLURM_STEP_ID": "2",
        "SLURM_PROCID": "5",
        "SLURM_LOCALID": "1",
        "SLURM_NODEID": "2",
        "SLURM_NTASKS": "99",
        "SLURM_STEP_NUM_TASKS": "7",
        "SLURM_STEP_TASKS_PER_NODE": "2(x3),1",
        "SLURM_STEP_NODELIST": "gpu[007-009],gpu100",
        "SLURM_JOB_NODELIST": "gpu[001-100]",
        "SLURMD_NODENAME": "gpu009",
    }
    env.update(over)
    return env


def test_srun_launch() -> None:
    info = detect_launch(srun_env())
    assert info is not None
    assert (info.launcher, info.rank, info.world_size, info.local_rank, info.local_world_size) == ("srun", 5, 7, 1, 2)
    assert (info.group_rank, info.master_addr, info.node) == (2, "gpu007", "gpu009")
    assert info.master_port == 24562


def test_srun_launch_last_node_and_fallbacks() -> None:
    info = detect_launch(
        srun_env(SLURM_PROCID="6", SLURM_LOCALID="0", SLURM_NODEID="3", MASTER_ADDR="10.0.0.1", MASTER_PORT="6000")
    )
    assert info is not None
    assert (info.local_world_size, info.master_addr, info.master_port) == (1, "10.0.0.1", 6000)
    env = srun_env()
    del env["SLURM_STEP_TASKS_PER_NODE"], env["SLURM_STEP_NUM_TASKS"], env["SLURM_STEP_NODELIST"]
    env.update(SLURM_NTASKS="4", SLURM_PROCID="3", SLURM_NODEID="1", SLURM_NTASKS_PER_NODE="2")
    info = detect_launch(env)
    assert info is not None
    assert (info.world_size, info.local_world_size, info.master_addr) == (4, 2, "gpu001")


def test_srun_batch_step_is_not_a_launch() -> None:
    env = srun_env()
    del env["SLURM_STEP_ID"]
    assert detect_launch(env) is None


def test_one_task_srun_step_is_standalone() -> None:
    assert detect_launch(srun_env(SLURM_PROCID="0", SLURM_STEP_NUM_TASKS="1")) is None


@pytest.mark.parametrize(
    ("over", "message"),
    [
        ({"SLURM_PROCID": "x"}, "SLURM_PROCID='x' is not an integer"),
        ({"SLURM_NODEID": "9"}, "SLURM_NODEID=9 but tasks per node"),
        ({"SLURM_PROCID": "7"}, "rank 7 outside world size 7"),
        ({"SLURM_STEP_TASKS_PER_NODE": "2(x3"}, "cannot parse tasks-per-node item"),
    ],
)
def test_bad_srun_environment(over: dict[str, str], message: str) -> None:
    with pytest.raises(LaunchError, match=message.replace("(", r"\(")):
        detect_launch(srun_env(**over))


def test_tasks_per_node() -> None:
    assert parse_tasks_per_node("2(x3),1") == [2, 2, 2, 1]
    assert parse_tasks_per_node("8") == [8]
    assert parse_tasks_per_node("4,4(x2)") == [4, 4, 4]


@pytest.mark.parametrize(
    "nodelist",
    [
        "gpu[007-009],gpu100",
        "node1",
        "a[1-2]-b[01-02]",
        "x[0001-0003,0010],y,z[8-11]",
        "rack1-n[9-11]",
        "n[1,3,5]",
    ],
)
def test_hostlist_expander_agrees_with_python_hostlist(nodelist: str) -> None:
    assert expand_hostlist_simple(nodelist) == hostlist.expand_hostlist(nodelist)
    assert expand_hostlist(nodelist) == hostlist.expand_hostlist(nodelist)


@pytest.mark.parametrize("nodelist", ["gpu[1-", "gpu]1", "gpu[3-1]", "gpu[a-b]", ","])
def test_hostlist_expander_rejects(nodelist: str) -> None:
    with pytest.raises(LaunchError):
        expand_hostlist_simple(nodelist)


def test_srun_port_is_high_and_below_ephemeral_range() -> None:
    ports = {srun_master_port(job, step) for job in range(0, 5000, 7) for step in range(3)}
    assert min(ports) >= 20000
    assert max(ports) <= 29999
    assert srun_master_port(1, 0) != srun_master_port(1, 1)


def test_device_and_backend_choice() -> None:
    assert resolve_device("auto", False) == "cpu"
    assert resolve_device("auto", True) == "cuda"
    with pytest.raises(LaunchError, match="no CUDA device"):
        resolve_device("cuda", False)
    assert resolve_backend("auto", "cuda") == "nccl"
    assert resolve_backend("auto", "cpu") == "gloo"
    assert resolve_backend("gloo", "cuda") == "gloo"
    with pytest.raises(LaunchError, match="needs CUDA"):
        resolve_backend("nccl", "cpu")


# -- faults, liveness -------------------------------------------------------------------------


def test_faults() -> None:
    assert parse_faults("corrupt:1, hang:0") == (Fault("corrupt", 1), Fault("hang", 0))
    assert parse_faults("") == ()
    assert active_faults(1, {"HEALTHD_PROBE_FAULT": "corrupt:1,crash:2"}) == frozenset({"corrupt"})
    env = {"HEALTHD_PROBE_FAULT": "hang@node2"}
    assert parse_faults(env["HEALTHD_PROBE_FAULT"]) == (Fault("hang", None, "node2"),)
    assert active_faults(2, env, node="node2", local_rank=0) == frozenset({"hang"})
    assert active_faults(3, env, node="node2", local_rank=1) == active_faults(0, env, node="node1") == frozenset()
    for bad in ("explode:1", "hang", "hang:x"):
        with pytest.raises(ValueError, match="HEALTHD_PROBE_FAULT"):
            parse_faults(bad)


def test_diagnose_dead_rank_comes_first() -> None:
    d = diagnose(
        [
            RankState(rank=0, node="a", seq=9, phase="nccl.x", alive=True, error="RuntimeError: closed"),
            RankState(rank=1, node="b", seq=8, phase="probe.start", alive=False),
        ]
    )
    assert d.culprits == (1, 0)
    assert d.lines[0] == "rank 1 (node b) died without reporting an error, in phase 'probe.start'"
    assert d.lines[1] == "rank 0 (node a) failed in phase 'nccl.x': RuntimeError: closed"


def test_diagnose_hung_rank_behind_the_others() -> None:
    d = diagnose(
        [
            RankState(rank=0, seq=9, phase="p9", alive=True, error="timeout"),
            RankState(rank=1, seq=9, phase="p9", alive=True),
            RankState(rank=2, seq=7, phase="p7", alive=True),
            RankState(rank=3, seq=9, phase="p9", alive=True, done=False),
        ]
    )
    assert d.culprits == (2, 0)
    assert d.lines == (
        "rank 2 was stuck in phase 'p7' while rank 0 reached 'p9'",
        "rank 0 failed in phase 'p9': timeout",
    )


def test_diagnose_never_joined_terminated_and_all_stuck() -> None:
    d = diagnose(
        [
            RankState(rank=0, seq=3, phase="init", alive=True),
            RankState(rank=1, alive=None),
            RankState(rank=2, seq=3, phase="init", alive=False, terminated=True),
        ]
    )
    assert d.culprits == (1,)
    assert d.lines == ("rank 1 never joined (no heartbeat)", "rank 2 was terminated by its launcher (SIGTERM)")
    # the stuck rank was terminated by the launcher before rank 0 looked: still the one left behind
    late = diagnose([RankState(rank=r, seq=5, phase="nccl.a", alive=True, node="n1" if r < 2 else "n2")
                     for r in (0, 1, 3)] + [RankState(rank=2, seq=2, phase="probe.start", node="n2", terminated=True)])
    assert late.culprits == (2,)
    assert late.lines == ("rank 2 (node n2) was stuck in phase 'probe.start' while rank 0 reached 'nccl.a' (then "
                          "terminated by its launcher)",)
    stuck = diagnose([RankState(rank=r, seq=5, phase="nccl.a", alive=True) for r in range(3)])
    assert stuck.culprits == ()
    assert stuck.text == "all 3 ranks stuck in phase 'nccl.a'"
    timed_out = diagnose([RankState(rank=r, seq=2, phase="init", alive=True, error="timeout") for r in range(2)])
    assert timed_out.lines == (
        "all 2 ranks stuck in phase 'init'",
        "rank 0 failed in phase 'init': timeout",
        "rank 1 failed in phase 'init': timeout",
    )


# -- statistics, time ---------------------------------------------------------------------------


def test_quantiles_match_numpy_linear() -> None:
    import numpy as np

    values = [0.3, 0.1, 0.7, 0.2, 0.9, 0.4]
    for q in (0.0, 0.5, 0.9, 1.0):
        assert quantile(values, q) == pytest.approx(float(np.quantile(values, q)))
    assert median([3.0, 1.0, 2.0]) == 2.0
    with pytest.raises(ValueError):
        quantile([], 0.5)


def test_process_start_time_of_a_child() -> None:
    import time

    before = time.time()
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(5)"])
    try:
        started = process_start_time(child.pid)
    finally:
        child.kill()
        child.wait()
    assert before - 0.05 <= started <= time.time()


def test_rank_margin() -> None:
    assert rank_margin_seconds(120) == 10.0
    assert rank_margin_seconds(30) == pytest.approx(4.5)
    assert rank_margin_seconds(12) == 3.0
    assert rank_margin_seconds(3) == 1.0


# -- environment checks, documents --------------------------------------------------------------


def _rank(rank: int, node: str, uuids: list[str]) -> RankInfo:
    return RankInfo(
        rank=rank,
        local_rank=rank,
        world_size=4,
        local_world_size=2,
        hostname=node,
        node=node,
        device="cuda:0",
        devices=[DeviceInfo(index=i, name="H100", uuid=u) for i, u in enumerate(uuids)],
    )


def test_gpu_count_checks() -> None:
    ranks = [_rank(0, "a", ["GPU-1"]), _rank(1, "a", ["GPU-2"]), _rank(2, "b", ["GPU-3"]), _rank(3, "b", ["GPU-3"])]
    assert env_probe.visible_gpus_per_node(ranks) == {"a": 2, "b": 1}
    checks, expected = env_probe.gpu_count_checks(ranks, None, "cuda")
    assert expected == {"a": 2, "b": 2}
    assert [(c.node, c.ok, c.detail) for c in checks] == [
        ("a", True, "2 GPU(s) visible, 2 expected"),
        ("b", False, "1 GPU(s) visible, 2 expected"),
    ]
    assert env_probe.gpu_count_checks(ranks, None, "cpu") == ([], {})
    checks, _ = env_probe.gpu_count_checks(ranks, 1, "cuda")
    assert all(c.ok for c in checks)


def test_driver_version_from_proc() -> None:
    text = (
        "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.104.05  Sat Aug 19 01:15:15 UTC 2023\n"
        "GCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n"
    )
    assert env_probe.parse_driver_version(text) == "535.104.05"
    open_text = "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  550.54.15  Release Build\n"
    assert env_probe.parse_driver_version(open_text) == "550.54.15"
    assert env_probe.parse_driver_version("nothing") is None


def test_atomic_write(tmp_path: Path) -> None:
    target = tmp_path / "out.json"
    target.write_text("old")
    atomic_write(str(target), json.dumps({"a": 1}))
    assert json.loads(target.read_text()) == {"a": 1}
    assert stat.S_IMODE(os.stat(target).st_mode) == 0o644
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.json"]


def test_default_nproc_without_torch() -> None:
    from probes.launch import default_nproc

    assert default_nproc("cpu", {}) == 2
    assert default_nproc("auto", {"CUDA_VISIBLE_DEVICES": "0,1,3"}) == 3
    assert default_nproc("auto", {"CUDA_VISIBLE_DEVICES": ""}) == 2
    assert default_nproc("cuda", {"CUDA_VISIBLE_DEVICES": "-1"}) == 1
    assert default_nproc("auto", {"CUDA_VISIBLE_DEVICES": "GPU-8f1c,GPU-77aa"}) == 2


def test_cli_and_launcher_import_neither_torch_nor_healthd() -> None:
    """The standalone launcher and usage errors stay fast: torch is imported by the ranks only,
    and compute nodes need nothing of the daemon."""
    code = (
        "import sys, probes.__main__, probes.launch, probes.runner\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'healthd')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "[]"


def test_gemm_default_sizes_follow_the_device_and_native_bf16(monkeypatch: pytest.MonkeyPatch) -> None:
    from probes import gemm

    assert gemm.default_size("bf16", "cuda") == gemm.default_size("fp32", "cuda") == 8192
    assert gemm.default_size("fp32", "cpu") == 1024
    monkeypatch.setattr(gemm, "_native_cpu_bf16", lambda: False)
    assert gemm.default_size("bf16", "cpu") == gemm.CPU_EMULATED_BF16_SIZE
    monkeypatch.setattr(gemm, "_native_cpu_bf16", lambda: True)
    assert gemm.default_size("bf16", "cpu") == 1024
