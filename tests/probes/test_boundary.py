"""The node check at job boundaries (``probes.boundary``): checks, budget, exit status, the document.

``nvidia-smi`` is a fake (a shell script first on ``PATH``) whose output follows the real tool's
formats (``-L``, ``--query-compute-apps=pid,used_memory --format=csv,noheader``,
``--query-gpu=… --format=csv,noheader``); ``/proc`` and ``/dev/kmsg`` are fakes in a temporary
directory with the kernel's file formats.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

import probes.boundary as b
from probes.result import Outcome, ProbeResult

ROOT = Path(__file__).resolve().parents[2]
UUIDS = [f"GPU-{i}a1b2c3d-0000-1111-2222-33334444555{i}" for i in range(4)]


def smi_list(n: int) -> str:
    return "\n".join(f"GPU {i}: NVIDIA H100 80GB HBM3 (UUID: {UUIDS[i]})" for i in range(n))


def make_fake_smi(tmp_path: Path, *, gpus: int = 4, apps: str = "", health: str | None = None,
                  list_rc: int = 0, list_text: str | None = None, sleep: float = 0.0) -> Path:
    """A fake ``nvidia-smi`` on ``PATH`` (returned: its directory)."""
    bin_dir = tmp_path / "fake-bin"
    bin_dir.mkdir(exist_ok=True)
    health = health if health is not None else "\n".join(f"{i}, {UUIDS[i]}, No, No, 0" for i in range(gpus))
    listing = list_text if list_text is not None else smi_list(gpus)
    script = f"""#!/bin/sh
# a fake nvidia-smi for tests
sleep {sleep}
case "$1" in
  -L) cat <<'EOF'
{listing}
EOF
      exit {list_rc} ;;
  --query-compute-apps=pid,used_memory) cat <<'EOF'
{apps}
EOF
      ;;
  --query-gpu=*) cat <<'EOF'
{health}
EOF
      ;;
  *) exit 9 ;;
esac
"""
    fake = bin_dir / "nvidia-smi"
    fake.write_text(script)
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    return bin_dir


def fake_proc(root: Path, pid: int, *, uid: int, comm: str = "python", state: str = "S", ppid: int = 1,
              cgroup: str = "0::/user.slice\n") -> None:
    d = root / str(pid)
    d.mkdir(parents=True)
    (d / "stat").write_text(f"{pid} ({comm}) {state} {ppid} {pid} {pid} 0 -1 4194560 0 0 0 0 0 0 0 0 20 0 1 0 "
                            "12345 0 0\n")
    (d / "status").write_text(f"Name:\t{comm}\nState:\t{state}\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\n")
    (d / "cgroup").write_text(cgroup)


def setup(tmp_path: Path, **kw: object) -> b.Setup:
    defaults: dict[str, object] = dict(context="epilog", node="gpu01", job_id=77, job_uid=1000, expect_gpus=4,
                                       expect_uuids=tuple(UUIDS), proc_root=tmp_path / "proc",
                                       kmsg=tmp_path / "kmsg", state_dir=tmp_path / "state", gemm=False,
                                       nvml=lambda: [])
    defaults.update(kw)
    (tmp_path / "proc").mkdir(exist_ok=True)
    return b.Setup(**defaults)  # type: ignore[arg-type]


@pytest.fixture
def path_with(monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    def put(bin_dir: Path) -> None:
        monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    return put


# -- pure parts ---------------------------------------------------------------------------------

def test_parse_compute_apps_follows_nvidia_smi_csv() -> None:
    text = "12345, 1024 MiB\n678, [N/A]\nNo running processes found\n"
    assert b.parse_compute_apps(text) == [(12345, 1024.0), (678, 0.0)]


def test_parse_gpu_health_reads_remaps_and_ecc() -> None:
    text = f"0, {UUIDS[0]}, No, No, 0\n1, {UUIDS[1]}, Yes, No, 3\n2, {UUIDS[2]}, [N/A], [N/A], [N/A]\n"
    rows = b.parse_gpu_health(text)
    assert [(r.index, r.remap_pending, r.remap_failure, r.ecc_uncorrected) for r in rows] == [
        (0, False, False, 0), (1, True, False, 3), (2, None, None, None)]


def test_parse_kmsg_finds_xids_with_their_sequence() -> None:
    text = ("6,1001,5000,-;usb 1-1: new device\n"
            "4,1002,6000,-;NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus.\n"
            "4,1003,7000,-;NVRM: Xid (PCI:0000:3b:00): 13, Graphics SM Warp Exception\n")
    xids = b.parse_kmsg(text)
    assert [(x.seq, x.xid, x.pci) for x in xids] == [(1002, 79, "PCI:0000:3b:00"), (1003, 13, "PCI:0000:3b:00")]
    assert b.last_seq(text) == 1003


def test_leftovers_are_the_jobs_processes_only() -> None:
    procs = [
        b.Proc(10, 1000, "python", "S", 1, "0::/system.slice/slurmstepd.scope/job_77/step_0/user/task_0\n"),
        b.Proc(11, 1000, "python", "S", 1, "0::/system.slice/slurmstepd.scope/job_78/step_0/user/task_0\n"),
        b.Proc(12, 1000, "sleep", "S", 1, "0::/user.slice\n"),
        b.Proc(13, 1000, "defunct", "Z", 1, "0::/user.slice\n"),
        b.Proc(14, 0, "slurmstepd: [77.extern]", "S", 1, "0::/system.slice/slurmstepd.scope/job_77/x\n"),
        b.Proc(15, 1001, "other", "S", 1, "0::/user.slice\n"),
        b.Proc(16, 1000, "the check", "S", 1, "0::/user.slice\n"),
    ]
    found = b.leftovers(procs, job_id=77, job_uid=1000, exclude={16})
    assert [p.pid for p in found] == [10, 12]
    assert b.leftovers(procs, job_id=None, job_uid=0, exclude=set()) == []


# -- the checks with fakes -------------------------------------------------------------------------

def test_healthy_gpu_node_passes(tmp_path: Path, path_with) -> None:  # type: ignore[no-untyped-def]
    path_with(make_fake_smi(tmp_path))
    f = b.run_checks(setup(tmp_path), b.Budget(30.0))
    assert not b.broken(f), f.checks
    assert {c.name for c in f.checks} == {"env.gpu_count", "boundary.leftover_process"}
    assert f.info["gpu_uuids"] == UUIDS
    assert "errors.xid" in f.skipped  # no kernel log file here
    assert f.skipped["gemm"] == "turned off (--no-gemm)"


def test_missing_gpu_is_named_by_uuid(tmp_path: Path, path_with) -> None:  # type: ignore[no-untyped-def]
    path_with(make_fake_smi(tmp_path, gpus=3))
    f = b.run_checks(setup(tmp_path), b.Budget(30.0))
    [bad] = b.broken(f)
    assert bad.name == "env.gpu_count"
    assert bad.detail == f"3 GPU(s) visible, 4 expected; missing {UUIDS[3]}"
    assert bad.gpu_uuid == UUIDS[3]


def test_driver_down_is_zero_gpus(tmp_path: Path, path_with) -> None:  # type: ignore[no-untyped-def]
    text = ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure that the "
            "latest NVIDIA driver is installed and running.")
    path_with(make_fake_smi(tmp_path, list_rc=9, list_text=text))
    f = b.run_checks(setup(tmp_path), b.Budget(30.0))
    assert [c.detail.split(";")[0] for c in b.broken(f)] == ["0 GPU(s) visible, 4 expected"]


def test_no_tool_is_could_not_check(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    f = b.run_checks(setup(tmp_path), b.Budget(30.0))
    assert not b.broken(f)
    assert "neither nvidia-smi nor NVML" in f.errors["gpus"]
    cpu = b.run_checks(setup(tmp_path, expect_gpus=None, expect_uuids=()), b.Budget(30.0))
    assert "a CPU node" in cpu.skipped["gpus"]


def test_process_of_the_ended_job_holding_gpu_memory_fails(tmp_path: Path, path_with) -> None:  # type: ignore[no-untyped-def]
    path_with(make_fake_smi(tmp_path, apps="4242, 30512 MiB\n5151, 1000 MiB"))
    s = setup(tmp_path)
    fake_proc(s.proc_root, 4242, uid=1000, cgroup="0::/system.slice/slurmstepd.scope/job_77/step_0/user/task_0\n")
    fake_proc(s.proc_root, 5151, uid=1001, cgroup="0::/system.slice/slurmstepd.scope/job_90/step_0/user/task_0\n")
    f = b.run_checks(s, b.Budget(30.0))
    names = sorted(c.name for c in b.broken(f))
    assert names == ["boundary.leftover_gpu_process", "boundary.leftover_process"]
    gpu = next(c for c in f.checks if c.name == "boundary.leftover_gpu_process")
    assert "pid 4242" in gpu.detail and "30512 MiB" in gpu.detail
    assert f.info["gpu_processes"] == 2


def test_cpu_node_leftover_process_of_the_user(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    s = setup(tmp_path, expect_gpus=None, expect_uuids=())
    fake_proc(s.proc_root, 300, uid=1000, comm="sleep")
    fake_proc(s.proc_root, 301, uid=0, comm="sshd")
    f = b.run_checks(s, b.Budget(30.0))
    [bad] = b.broken(f)
    assert bad.name == "boundary.leftover_process" and "300 (sleep)" in bad.detail


def test_prolog_does_not_look_for_leftovers(tmp_path: Path, path_with) -> None:  # type: ignore[no-untyped-def]
    path_with(make_fake_smi(tmp_path))
    s = setup(tmp_path, context="prolog")
    fake_proc(s.proc_root, 300, uid=1000)
    f = b.run_checks(s, b.Budget(5.0))
    assert not b.broken(f)
    assert f.skipped["leftover"] == "not run in the prolog context"
    assert f.skipped["gemm"] == "not run in the prolog context"


def test_hard_xid_since_the_last_check_fails_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    s = setup(tmp_path, context="health", expect_gpus=None, job_id=None, job_uid=None)
    s.kmsg.write_text("6,10,5000,-;boot\n4,11,6000,-;NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off "
                      "the bus.\n")
    first = b.run_checks(s, b.Budget(30.0))
    assert [c.name for c in b.broken(first)] == ["boundary.xid"]
    assert first.info["xids_since_last_check"] == [79]
    again = b.run_checks(s, b.Budget(30.0))
    assert not b.broken(again)
    with s.kmsg.open("a") as k:
        k.write("4,12,7000,-;NVRM: Xid (PCI:0000:3b:00): 13, Graphics Exception\n")
    soft = b.run_checks(s, b.Budget(30.0))
    assert not b.broken(soft) and soft.info["xids_since_last_check"] == [13]


def test_row_remap_failure_fails_and_pending_is_a_hint(tmp_path: Path, path_with) -> None:  # type: ignore[no-untyped-def]
    health = f"0, {UUIDS[0]}, No, Yes, 0\n1, {UUIDS[1]}, Yes, No, 2\n2, {UUIDS[2]}, No, No, 0\n3, {UUIDS[3]}, No, No, 0"
    path_with(make_fake_smi(tmp_path, health=health))
    f = b.run_checks(setup(tmp_path, context="health", job_id=None, job_uid=None), b.Budget(30.0))
    [bad] = b.broken(f)
    assert (bad.name, bad.gpu, bad.gpu_uuid) == ("boundary.row_remap_failure", 0, UUIDS[0])
    assert f.info["row_remap_pending_gpus"] == [1]
    assert f.info["ecc_uncorrected_volatile"] == {"1": 2}


def test_a_check_that_raises_is_an_error_and_the_next_runs(tmp_path: Path, path_with,  # type: ignore[no-untyped-def]
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    path_with(make_fake_smi(tmp_path))

    def boom(*args: object) -> None:
        raise RuntimeError("bug")

    monkeypatch.setattr(b, "check_leftover", boom)
    f = b.run_checks(setup(tmp_path), b.Budget(30.0))
    assert f.errors["leftover"] == "RuntimeError: bug"
    assert not b.broken(f)


# -- budget ------------------------------------------------------------------------------------------

def test_what_does_not_fit_is_skipped_and_said(tmp_path: Path, path_with) -> None:  # type: ignore[no-untyped-def]
    path_with(make_fake_smi(tmp_path))
    f = b.run_checks(setup(tmp_path, gemm=True), b.Budget(1.2))
    assert "gpus" not in f.skipped
    assert f.skipped["gemm"].startswith("budget: ")
    spent = b.run_checks(setup(tmp_path), b.Budget(5.0, started_ago=5.0))
    assert set(spent.skipped) >= {"gpus", "leftover", "errors"}


# -- nothing of a stuck tool outlives the check ------------------------------------------------------

def make_hanging_smi(tmp_path: Path) -> Path:
    """A fake ``nvidia-smi`` that hangs with a child of its own (as a stuck tool waiting on a helper
    would): it writes its pid and its child's under ``tmp_path/pids``; returns its directory."""
    bin_dir = tmp_path / "hang-bin"
    bin_dir.mkdir()
    pids = tmp_path / "pids"
    pids.mkdir()
    fake = bin_dir / "nvidia-smi"
    fake.write_text(f"""#!/bin/sh
# a fake nvidia-smi that never answers
echo $$ > {pids}/tool
sleep 300 &
echo $! > {pids}/grandchild
wait
""")
    fake.chmod(0o755)
    return bin_dir


def alive(pid: int) -> bool:
    """``pid`` runs (a zombie left for init to reap does not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def tree_of(tmp_path: Path) -> list[int]:
    pids = [int(p.read_text()) for p in sorted((tmp_path / "pids").glob("*")) if p.read_text().strip()]
    assert len(pids) == 2, "the fake tool did not start"
    return pids


def gone(pids: list[int], within: float = 2.0) -> bool:
    deadline = time.monotonic() + within
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not any(alive(p) for p in pids)


def run_main(args: list[str], env: dict[str, str], timeout: float = 60.0) -> tuple[int, str, float]:
    t0 = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "probes.boundary", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=timeout, check=False)
    return done.returncode, done.stderr, time.monotonic() - t0


def base_env(tmp_path: Path, bin_dir: Path | None = None) -> dict[str, str]:
    path = f"{bin_dir}:/usr/bin:/bin" if bin_dir else f"{tmp_path / 'empty'}:/usr/bin:/bin"
    return {"PATH": path, "SLURMD_NODENAME": "gpu01", "HOME": str(tmp_path), "PYTHONPATH": str(ROOT)}


def test_a_hanging_tool_never_exceeds_the_budget_and_is_killed_with_its_children(tmp_path: Path) -> None:
    out = tmp_path / "results"
    out.mkdir()
    rc, err, wall = run_main(["--context", "prolog", "--budget", "3", "--results-dir", str(out),
                              "--expect-gpus", "4"], base_env(tmp_path, make_hanging_smi(tmp_path)))
    assert rc == 0, err
    # from the process's start; the grandchild holds the tool's pipes: only the group's kill ends the wait
    assert wall < 3.6, wall
    assert "gpus could not run: nvidia-smi did not answer" in err
    [doc] = out.glob("boundary-gpu01-prolog-0-*.json")
    result = ProbeResult.model_validate_json(doc.read_text())
    assert result.outcome is Outcome.ERROR
    assert result.params["elapsed_s"] <= 3.0
    assert "budget" in result.params["skipped"]["errors"]
    pids = tree_of(tmp_path)
    assert gone(pids), [p for p in pids if alive(p)]


def test_the_watchdog_ends_a_stuck_check_at_the_budget_and_kills_its_tools_group(tmp_path: Path) -> None:
    code = ("import sys, probes.boundary as b\n"
            "b.check_gpus = lambda *a: None\n"
            "b.check_errors = lambda *a: b.run_tool(['nvidia-smi', '-q'], 60)\n"
            "sys.exit(b.main(['--context', 'health', '--budget', '3', '--stdout', '--no-gemm']))\n")
    t0 = time.monotonic()
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=base_env(tmp_path, make_hanging_smi(tmp_path)),
                          capture_output=True, text=True, timeout=30, check=False)
    assert done.returncode == 0, done.stderr
    assert time.monotonic() - t0 < 3.6
    assert "budget exhausted in errors" in done.stderr
    pids = tree_of(tmp_path)
    assert gone(pids), [p for p in pids if alive(p)]


def test_document_written_atomically_0644_and_exit_1_for_a_broken_node(tmp_path: Path) -> None:
    bin_dir = make_fake_smi(tmp_path, gpus=2)
    out = tmp_path / "results"
    (out / "expect").mkdir(parents=True)
    (out / "expect" / "gpu01.json").write_text(json.dumps({"gpus": 4, "gpu_uuids": UUIDS}))
    env = {**base_env(tmp_path, bin_dir), "SLURM_JOB_ID": "123"}
    rc, err, _ = run_main(["--context", "prolog", "--results-dir", str(out)], env)
    assert rc == 1
    assert "FAIL env.gpu_count: 2 GPU(s) visible, 4 expected" in err
    [doc] = out.glob("*.json")
    assert doc.name.startswith("boundary-gpu01-prolog-123-")
    assert stat.S_IMODE(doc.stat().st_mode) == 0o644
    result = ProbeResult.model_validate_json(doc.read_text())
    assert result.run_id == doc.stem and result.nodes == ["gpu01"] and result.outcome is Outcome.FAIL
    assert result.params["context"] == "prolog" and result.params["job_id"] == 123
    assert not list(out.glob(".boundary-*"))


def test_cannot_write_or_bad_options_exit_0(tmp_path: Path) -> None:
    env = base_env(tmp_path)
    rc, err, _ = run_main(["--context", "epilog", "--results-dir", str(tmp_path / "nope"), "--no-gemm"], env)
    assert rc == 0 and "could not be written" in err
    rc, err, _ = run_main(["--context", "health", "--budget", "59", "--stdout"], env)
    assert rc == 0 and "Slurm's 60 s kill" in err
    rc, err, _ = run_main(["--context", "bogus"], env)
    assert rc == 0 and "not run" in err
    rc, err, _ = run_main(["--context", "prolog"], env)
    assert rc == 0 and "no results directory" in err


def test_budget_and_results_dir_from_the_config(tmp_path: Path) -> None:
    conf = tmp_path / "healthd.toml"
    conf.write_text('[slurm]\nresults_dir = "/shared/r"\n[node_check]\nprolog_budget_s = 3.5\n')
    env = {"HEALTHD_CONFIG": str(conf), "SLURMD_NODENAME": "n1"}
    opts = b.options(["--context", "prolog", "--expect-gpus", "0"], env)
    assert (opts.budget_s, opts.results_dir) == (3.5, Path("/shared/r"))
    assert b.options(["--context", "prolog", "--budget", "1", "--expect-gpus", "0"], env).budget_s == 1.0
    assert b.options(["--context", "epilog", "--expect-gpus", "0"], env).budget_s == 30.0


def test_start_up_imports_neither_the_daemon_nor_torch(tmp_path: Path) -> None:
    code = ("import sys, probes.boundary\n"
            "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('healthd', 'torch', 'numpy'))\n"
            "print(heavy)\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60,
                          check=True)
    assert done.stdout.strip() == "[]"


def test_no_gemm_while_another_job_runs_on_the_node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    s = setup(tmp_path, context="epilog", expect_gpus=None, job_uid=None, gemm=True)
    fake_proc(s.proc_root, 500, uid=0, comm="slurmstepd")
    (s.proc_root / "500" / "cmdline").write_bytes(b"slurmstepd: [91.extern]\0")
    fake_proc(s.proc_root, 501, uid=0, comm="slurmstepd")
    (s.proc_root / "501" / "cmdline").write_bytes(b"slurmstepd: [77.batch]\0")
    assert b.running_jobs(s.proc_root) == {77, 91}
    f = b.run_checks(s, b.Budget(30.0))
    assert f.skipped["gemm"] == "job(s) 91 run on this node: their GPUs are not ours"


@pytest.mark.slow
def test_short_gemm_on_cpu_gives_a_figure(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", f"{tmp_path / 'empty'}:{os.environ['PATH']}")
    s = setup(tmp_path, context="health", expect_gpus=None, job_id=None, job_uid=None, gemm=True)
    f = b.run_checks(s, b.Budget(30.0))
    [m] = [m for m in f.measurements if m.name == "flop_per_second"]
    assert m.labels == {"dtype": "fp32"} and m.value > 1e8


def test_slurms_sigterm_then_sigkill_end_the_check_and_its_tools_with_an_error_document(tmp_path: Path) -> None:
    """As slurmd ends a script past PrologEpilogTimeout: SIGTERM to the script's process group, then
    SIGKILL (at once here). The check has left that group (``detach_from_script``): the wrapper's death tells it,
    it kills its stuck tool's group and writes an ``error`` document (never a drain)."""
    env = {**base_env(tmp_path, make_hanging_smi(tmp_path)), "SLURM_JOB_ID": "88"}
    out = tmp_path / "results"
    out.mkdir()
    wrapper = tmp_path / "node-check-epilog"
    wrapper.write_text(f"#!/bin/sh\n{sys.executable} -m probes.boundary --context epilog --budget 20 "
                       f"--results-dir {out} --expect-gpus 4\nexit $?\n")
    wrapper.chmod(0o755)
    script = subprocess.Popen([str(wrapper)], cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, process_group=0)  # as slurmd runs it: no terminal
    try:
        deadline = time.monotonic() + 15
        while len(list((tmp_path / "pids").glob("*"))) < 2 or not all(
                p.read_text().strip() for p in (tmp_path / "pids").glob("*")):
            assert time.monotonic() < deadline and script.poll() is None, "the fake tool never started"
            time.sleep(0.05)
        os.killpg(script.pid, 15)
        os.killpg(script.pid, 9)  # no time between: the check must not need any
        script.communicate(timeout=10)
    finally:
        if script.poll() is None:
            script.kill()
    pids = tree_of(tmp_path)
    assert gone(pids, within=5.0), [p for p in pids if alive(p)]
    deadline = time.monotonic() + 5
    while not list(out.glob("boundary-gpu01-epilog-88-*.json")) and time.monotonic() < deadline:
        time.sleep(0.05)
    [doc] = out.glob("boundary-gpu01-epilog-88-*.json")
    result = ProbeResult.model_validate_json(doc.read_text())
    assert result.outcome is Outcome.ERROR and result.checks == [] and result.run_id == doc.stem
    assert result.params["errors"]["gpus"].startswith("ended by signal 15 after ")
    assert "Slurm's time limit" in result.reason


def test_a_signal_after_a_failed_check_is_still_an_error(tmp_path: Path) -> None:
    """What a check had found before Slurm ended it (here a GPU missing) is not a verdict: Slurm's
    limit, not the check, decided the exit; the document is ``error``."""
    opts = b.options(["--context", "epilog", "--stdout", "--expect-gpus", "4"], {"SLURMD_NODENAME": "gpu01"})
    partial = b.Findings(checks=[b.Check(name="env.gpu_count", ok=False, node="gpu01", detail="3 GPU(s) visible")],
                         skipped={"gemm": "turned off (--no-gemm)"})
    result = b.terminated_document(b._Run(opts, b.Budget(30.0), time.time()), partial, 15, "errors")
    assert result.outcome is Outcome.ERROR and result.checks == []
    assert result.params["skipped"] == {"gemm": "turned off (--no-gemm)"}
    assert "errors" in result.params["errors"]


def test_the_check_leaves_the_scripts_group_unless_run_from_a_terminal(tmp_path: Path) -> None:
    import pty

    code = "import os, probes.boundary as b\nb.detach_from_script()\nprint(os.getpgid(0) == os.getpid())\n"
    slurmd = subprocess.run([sys.executable, "-c", code], cwd=ROOT, stdin=subprocess.DEVNULL, capture_output=True,
                            text=True, timeout=30, check=True)
    assert slurmd.stdout.strip() == "True"
    leader, follower = pty.openpty()
    try:
        by_hand = subprocess.run([sys.executable, "-c", code], cwd=ROOT, stdin=follower, capture_output=True,
                                 text=True, timeout=30, check=True)
    finally:
        os.close(leader)
        os.close(follower)
    assert by_hand.stdout.strip() == "False"  # in the terminal's group: Ctrl-C reaches it


# -- the fabric of an NVSwitch system (Fabric Manager) --------------------------------------------

def fake_nvml_module(tmp_path: Path, states: list[tuple[int, int, bool]]) -> Path:
    """A directory with a ``pynvml`` that is the FAKE (tests/probes/fake_pynvml.py) with one GPU per
    (fabric state, status, supported), for a check run as a subprocess (``PYTHONPATH`` first)."""
    d = tmp_path / "nvml"
    d.mkdir()
    gpus = ", ".join(f"FakeGpu({UUIDS[i]!r}, '0000:{0x18 + i:02X}:00.0', fabric_state={st}, fabric_status={code}, "
                     f"supports_fabric={ok})" for i, (st, code, ok) in enumerate(states))
    (d / "pynvml.py").write_text("from tests.probes.fake_pynvml import *  # noqa\n"
                                 "from tests.probes.fake_pynvml import FakeGpu, reset\n"
                                 f"reset([{gpus}])\n")
    return d


def test_fabric_state_is_read_on_an_nvswitch_node_and_reported_not_judged(tmp_path: Path, path_with,  # type: ignore[no-untyped-def]
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.probes import fake_pynvml
    from tests.probes.fake_pynvml import FakeGpu

    path_with(make_fake_smi(tmp_path))
    fake_pynvml.reset([FakeGpu(UUIDS[0], "0000:18:00.0"), FakeGpu(UUIDS[1], "0000:28:00.0", fabric_state=2),
                       FakeGpu(UUIDS[2], "0000:38:00.0", fabric_status=fake_pynvml.NVML_ERROR_NOT_FOUND),
                       FakeGpu(UUIDS[3], "0000:48:00.0", supports_fabric=False)])
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml)
    f = b.run_checks(setup(tmp_path, context="prolog", nvswitch=True), b.Budget(5.0))
    assert not b.broken(f), f.checks  # the daemon judges the values
    state = {m.labels["gpu"]: m.value for m in f.measurements if m.name == "fabric_state"}
    status = {m.labels["gpu"]: m.value for m in f.measurements if m.name == "fabric_status"}
    assert state == {"0": 3.0, "1": 2.0, "2": 3.0, "3": 0.0}
    assert status == {"0": 0.0, "1": 0.0, "2": 6.0, "3": 3.0}
    assert f.info["fabric_gpu_uuids"] == {str(i): u for i, u in enumerate(UUIDS)}
    assert f.info["fabric"]["1"] == "in progress, status 0"
    plain = b.run_checks(setup(tmp_path, context="prolog"), b.Budget(5.0))
    assert plain.skipped["fabric"].startswith("not an NVSwitch system")
    assert not [m for m in plain.measurements if m.name.startswith("fabric")]


def test_a_prolog_on_an_nvswitch_node_reads_the_fabric_within_its_budget(tmp_path: Path) -> None:
    bin_dir = make_fake_smi(tmp_path, gpus=2)
    out = tmp_path / "results"
    (out / "expect").mkdir(parents=True)
    (out / "expect" / "gpu01.json").write_text(json.dumps({"gpus": 2, "gpu_uuids": UUIDS[:2], "nvswitch": True}))
    env = base_env(tmp_path, bin_dir)
    env["PYTHONPATH"] = f"{fake_nvml_module(tmp_path, [(3, 0, True), (1, 0, True)])}:{ROOT}"
    rc, err, took = run_main(["--context", "prolog", "--results-dir", str(out)], env)
    assert rc == 0, err
    [doc] = out.glob("*.json")
    result = ProbeResult.model_validate_json(doc.read_text())
    assert result.outcome is Outcome.PASS
    assert [(m.labels["gpu"], m.value) for m in result.measurements if m.name == "fabric_state"] == \
        [("0", 3.0), ("1", 1.0)]
    assert float(result.params["elapsed_s"]) < b.DEFAULT_BUDGET_S["prolog"] and "fabric" not in result.params["errors"]
    assert took < 5.0 + 2.0  # the budget, plus the interpreter's start under a loaded CI machine
