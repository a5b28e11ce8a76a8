"""The ``nccl_tests`` probe run for real against stand-in binaries.

The real ``all_reduce_perf`` needs CUDA and GPUs; ``nccl_tests_standin.py``, installed in a bin
directory as a script named like the binary, prints a real capture from
``tests/fixtures/tools/nccl_tests/`` and exits, crashes or hangs as told. The probe's document
then goes through the daemon-side parse (``expand_nccl_tests_result``); every number asserted
is read from the capture.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from healthd.parsers.expand import expand_nccl_tests_result
from probes import nccl_tests
from probes.result import Outcome, ProbeResult
from tests.probes.helpers import REPO, clean_env, run_probe

STANDIN = Path(__file__).with_name("nccl_tests_standin.py")
NCCL = REPO / "tests" / "fixtures" / "tools" / "nccl_tests"
A100 = NCCL / "v2.19_all_reduce_8xa100.txt"
GATHER = NCCL / "v2.18_all_gather_mpirun_tag_output.txt"
WRONG = NCCL / "v2.17_all_reduce_wrong_data_2nodes.txt"
PROBE = (sys.executable, "-m", "probes.nccl_tests")
NODE = {"SLURMD_NODENAME": "n042"}
BIG = {"collective": "all_reduce", "size_bytes": "134217728", "dtype": "float"}


def install(bin_dir: Path, collective: str, mode: str, fixture: Path) -> Path:
    """A stand-in for ``<collective>_perf`` in ``bin_dir``; it logs its arguments to ``<name>.log``."""
    bin_dir.mkdir(exist_ok=True)
    path = bin_dir / f"{collective}_perf"
    log = bin_dir.parent / f"{collective}.log"
    words = [sys.executable, str(STANDIN), mode, str(fixture), str(log)]
    path.write_text("#!/bin/sh\nexec " + " ".join(shlex.quote(w) for w in words) + ' "$@"\n')
    path.chmod(0o755)
    return log


def logged_args(log: Path) -> list[list[str]]:
    return [json.loads(line) for line in log.read_text().splitlines()]


def value(result: ProbeResult, name: str, **labels: str) -> float:
    found = [m for m in result.measurements if m.name == name and all(m.labels.get(k) == v for k, v in labels.items())]
    assert len(found) == 1, (name, labels, found)
    return found[0].value


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


# --------------------------------------------------------------------------- real runs


def test_runs_the_binary_and_the_daemon_parses_its_output(tmp_path: Path) -> None:
    log = install(tmp_path / "bin", "all_reduce", "replay:0", A100)
    run = run_probe(["--bin-dir", str(tmp_path / "bin"), "--run-id", "r-1", "--timeout", "60", "--gpus", "8"],
                    env=NODE, launcher=PROBE)
    assert run.returncode == 0, run.stderr
    result = run.result
    assert (result.probe, result.run_id, result.outcome, result.reason) == ("nccl_tests", "r-1", Outcome.PASS, "")
    assert result.nodes == ["n042"] and result.measurements == []
    raw = result.params["raw_outputs"]
    assert len(raw) == 1
    assert raw[0]["output"] == A100.read_text()
    assert (raw[0]["exit_code"], raw[0]["error"], raw[0]["signal"], raw[0]["lines_cut"]) == (0, "", None, 0)
    assert raw[0]["output_bytes"] == A100.stat().st_size
    # defaults: -b 8 -e 1G -f 2
    assert logged_args(log) == [["-b", "8", "-e", "1073741824", "-f", "2", "-g", "8"]]
    assert (result.params["tasks"], result.params["gpus"]) == (1, 8)
    assert raw[0]["argv"] == [str(tmp_path / "bin" / "all_reduce_perf"), *logged_args(log)[0]]

    parsed = expand_nccl_tests_result(result)
    assert parsed.outcome is Outcome.PASS
    assert len(parsed.measurements) == 151 and {m.node for m in parsed.measurements} == {"n042"}
    assert value(parsed, "busbw_bytes_per_second", placement="out_of_place", **BIG) == pytest.approx(181.32e9)
    assert value(parsed, "avg_busbw_bytes_per_second") == pytest.approx(34.9024e9)


def test_default_gpu_count_and_the_rank_check(tmp_path: Path) -> None:
    log = install(tmp_path / "bin", "all_reduce", "replay:0", A100)
    run = run_probe(["--bin-dir", str(tmp_path / "bin")], env={**NODE, "CUDA_VISIBLE_DEVICES": "0,1"}, launcher=PROBE)
    assert run.returncode == 0, run.stderr
    assert logged_args(log) == [["-b", "8", "-e", "1073741824", "-f", "2", "-g", "2"]]
    # the capture shows 8 ranks where the job started 2: the daemon does not trust its numbers
    parsed = expand_nccl_tests_result(run.result)
    assert parsed.outcome is Outcome.ERROR
    assert parsed.reason.startswith("all_reduce_perf: nccl-tests ran 8 ranks, the job 2 (1 task x 2 GPUs)")


def test_options_and_several_collectives(tmp_path: Path) -> None:
    reduce_log = install(tmp_path / "bin", "all_reduce", "replay:0", A100)
    gather_log = install(tmp_path / "bin", "all_gather", "replay:0", GATHER)
    run = run_probe(["--bin-dir", str(tmp_path / "bin"), "--collectives", "all_reduce,all_gather",
                     "--min-bytes", "1K", "--max-bytes", "64M", "--factor", "4", "--gpus", "8",
                     "--extra-args=-d float -n 5", "--extra-args=-c 0"], env=NODE, launcher=PROBE)
    assert run.returncode == 0, run.stderr
    expected = ["-b", "1024", "-e", "67108864", "-f", "4", "-g", "8", "-d", "float", "-n", "5", "-c", "0"]
    assert logged_args(reduce_log) == logged_args(gather_log) == [expected]
    result = run.result
    assert [e["program"] for e in result.params["raw_outputs"]] == ["all_reduce_perf", "all_gather_perf"]
    assert (result.params["min_bytes"], result.params["max_bytes"], result.params["gpus"]) == (1024, 67108864, 8)
    parsed = expand_nccl_tests_result(result)
    assert parsed.outcome is Outcome.ERROR  # the all_gather capture ran 2 ranks, not 8
    assert parsed.reason.startswith("all_gather_perf: nccl-tests ran 2 ranks, the job 8 (1 task x 8 GPUs)")
    gather = {"collective": "all_gather", "size_bytes": "134217728", "dtype": "float", "placement": "out_of_place"}
    assert value(parsed, "busbw_bytes_per_second", **gather) == pytest.approx(2.31e9)
    assert value(parsed, "busbw_bytes_per_second", placement="in_place", **BIG) == pytest.approx(182.90e9)


def test_a_crashing_binary_is_an_error_with_its_partial_output(tmp_path: Path) -> None:
    install(tmp_path / "bin", "all_reduce", "crash:19", A100)
    run = run_probe(["--bin-dir", str(tmp_path / "bin")], env=NODE, launcher=PROBE)
    assert run.returncode == 1
    result = run.result
    assert result.outcome is Outcome.ERROR
    assert result.reason == "all_reduce_perf: killed by SIGSEGV"
    raw = result.params["raw_outputs"][0]
    assert (raw["exit_code"], raw["signal"]) == (None, "SIGSEGV")
    assert raw["output"] == "".join(A100.read_text().splitlines(keepends=True)[:19])
    parsed = expand_nccl_tests_result(result)
    assert parsed.outcome is Outcome.ERROR and parsed.reason == "all_reduce_perf: killed by SIGSEGV"
    assert value(parsed, "time_seconds", placement="out_of_place", size_bytes="16") == pytest.approx(35.44e-6)


@pytest.mark.slow
def test_a_hanging_binary_is_killed_with_its_group_at_the_timeout(tmp_path: Path) -> None:
    log = install(tmp_path / "bin", "all_reduce", "hang:19", A100)
    run = run_probe(["--bin-dir", str(tmp_path / "bin"), "--timeout", "4"], env=NODE, launcher=PROBE)
    assert run.returncode == 1
    assert run.wall < 4 + nccl_tests.KILL_GRACE_S + 3, run.wall
    result = run.result
    assert result.outcome is Outcome.ERROR
    assert result.reason.startswith("all_reduce_perf: did not finish within ")
    assert result.reason.endswith(" s (killed)")
    raw = result.params["raw_outputs"][0]
    assert raw["timed_out"] is True and raw["exit_code"] is None
    pids = [int(p) for p in Path(f"{log}.pids").read_text().split()]
    deadline = time.monotonic() + 5
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(alive(p) for p in pids), "the binary or the child it started outlived the timeout"
    parsed = expand_nccl_tests_result(result)
    assert parsed.outcome is Outcome.ERROR
    assert value(parsed, "busbw_bytes_per_second", placement="in_place", size_bytes="8") == pytest.approx(0.0)
    assert value(parsed, "time_seconds", placement="in_place", size_bytes="8") == pytest.approx(36.18e-6)


def test_missing_binary_or_directory_names_the_path(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    install(bin_dir, "all_reduce", "replay:0", A100)
    run = run_probe(["--bin-dir", str(bin_dir), "--collectives", "all_reduce,all_gather"], env=NODE, launcher=PROBE)
    assert run.returncode == 1
    result = run.result
    assert result.reason == f"all_gather_perf: not run: {bin_dir}/all_gather_perf not found (nor all_gather_perf_mpi)"
    assert [e["exit_code"] for e in result.params["raw_outputs"]] == [0, None]
    parsed = expand_nccl_tests_result(result)
    assert parsed.outcome is Outcome.ERROR and len(parsed.measurements) == 151

    run = run_probe(["--bin-dir", str(tmp_path / "nowhere")], env=NODE, launcher=PROBE)
    assert run.returncode == 1
    assert run.result.reason == f"all_reduce_perf: not run: {tmp_path / 'nowhere'} is not a directory"

    (bin_dir / "all_reduce_perf").chmod(0o644)
    run = run_probe(["--bin-dir", str(bin_dir)], env=NODE, launcher=PROBE)
    assert run.result.reason == f"all_reduce_perf: not run: {bin_dir}/all_reduce_perf is not an executable file"


def test_mpi_named_binary_is_found(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    install(bin_dir, "all_reduce", "replay:0", A100)
    (bin_dir / "all_reduce_perf").rename(bin_dir / "all_reduce_perf_mpi")
    run = run_probe(["--bin-dir", str(bin_dir)], env=NODE, launcher=PROBE)
    assert run.returncode == 0, run.stderr
    assert run.result.params["raw_outputs"][0]["program"] == "all_reduce_perf_mpi"


def test_wrong_data_exit_7_is_reported_raw_and_judged_fail_by_the_daemon(tmp_path: Path) -> None:
    install(tmp_path / "bin", "all_reduce", "replay:7", WRONG)
    run = run_probe(["--bin-dir", str(tmp_path / "bin")], env=NODE, launcher=PROBE)
    assert run.returncode == 1
    assert run.result.reason == "all_reduce_perf: exited with status 7"
    parsed = expand_nccl_tests_result(run.result)
    assert parsed.outcome is Outcome.FAIL
    assert parsed.reason == ("all_reduce_perf: wrong data: 4 out-of-bounds test instances, "
                             "2 results with wrong elements")


def test_sigterm_stops_the_binary_and_still_writes_the_document(tmp_path: Path) -> None:
    log = install(tmp_path / "bin", "all_reduce", "hang:19", A100)
    proc = subprocess.Popen([*PROBE, "--bin-dir", str(tmp_path / "bin"), "--timeout", "120"], env=clean_env(NODE),
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        pids_file = Path(f"{log}.pids")
        deadline = time.monotonic() + 30
        while not pids_file.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert pids_file.exists()
        started = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert time.monotonic() - started < nccl_tests.KILL_GRACE_S + 2
    assert proc.returncode == 1, err
    result = ProbeResult.model_validate_json(out)
    assert result.params["interrupted"] == "terminated by SIGTERM"
    assert result.reason == "terminated by SIGTERM; all_reduce_perf: stopped: terminated by SIGTERM"
    pids = [int(p) for p in pids_file.read_text().split()]
    time.sleep(0.2)
    assert not any(alive(p) for p in pids)


def test_other_tasks_run_the_binary_but_write_nothing(tmp_path: Path) -> None:
    log = install(tmp_path / "bin", "all_reduce", "replay:0", A100)
    run = run_probe(["--bin-dir", str(tmp_path / "bin")], env={**NODE, "SLURM_PROCID": "1",
                                                                 "SLURM_NTASKS_PER_NODE": "8"}, launcher=PROBE)
    assert (run.returncode, run.stdout) == (0, "")
    assert logged_args(log) == [["-b", "8", "-e", "1073741824", "-f", "2", "-g", "1"]]


def test_output_file_and_table_format(tmp_path: Path) -> None:
    install(tmp_path / "bin", "all_reduce", "replay:0", A100)
    out = tmp_path / "result.json"
    run = run_probe(["--bin-dir", str(tmp_path / "bin"), "--output", str(out)], env=NODE, launcher=PROBE)
    assert (run.returncode, run.stdout) == (0, "")
    assert ProbeResult.model_validate_json(out.read_text()).params["raw_outputs"][0]["output"] == A100.read_text()
    run = run_probe(["--bin-dir", str(tmp_path / "bin"), "--format", "table"], env=NODE, launcher=PROBE)
    assert run.returncode == 0
    assert "# all_reduce_perf: exit status 0 in " in run.stdout
    assert A100.read_text().rstrip("\n") in run.stdout


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--collectives", "all_reduce,gossip"], "unknown collective(s) ['gossip']"),
        (["--min-bytes", "8X"], "bad size '8X'"),
        (["--factor", "1"], "must be >= 2: '1'"),
        (["--min-bytes", "1G", "--max-bytes", "8"], "--min-bytes is larger than --max-bytes"),
        (["--extra-args=-d 'float"], "--extra-args: No closing quotation"),
    ],
)
def test_usage_errors_exit_2(tmp_path: Path, argv: list[str], message: str) -> None:
    run = run_probe(["--bin-dir", str(tmp_path), *argv], env=NODE, launcher=PROBE)
    assert run.returncode == 2 and run.stdout == ""
    assert message in run.stderr


def test_registered_in_the_probe_dispatcher(tmp_path: Path) -> None:
    from probes import __main__ as dispatcher

    try:
        dispatcher.build_parser().parse_args(["nccl_tests", "--bin-dir", str(tmp_path)])
    except SystemExit:
        pytest.skip("probes/__main__.py does not register probes.nccl_tests yet (see probes/nccl_tests.py)")
    install(tmp_path / "bin", "all_reduce", "replay:0", A100)
    run = run_probe(["nccl_tests", "--bin-dir", str(tmp_path / "bin"), "--run-id", "r-9"], env=NODE)
    assert run.returncode == 0, run.stderr
    assert run.result.run_id == "r-9" and run.result.params["raw_outputs"][0]["output"] == A100.read_text()


# --------------------------------------------------------------------------- pure parts


def test_capture_keeps_head_and_tail_and_caps_nccl_info() -> None:
    lines = A100.read_text().splitlines(keepends=True)
    info = [f"n042:1234:1234 [0] NCCL INFO Channel {i:02d}/32 : 0 1 2 3 4 5 6 7\n" for i in range(5000)]
    cap = nccl_tests.OutputCapture(head=4096, tail=4096, info_lines=10)
    data = "".join(lines[:14] + info + lines[14:]).encode()
    for i in range(0, len(data), 777):  # arbitrary chunking splits lines
        cap.feed(data[i : i + 777])
    cap.close()
    assert cap.total_bytes == len(data)
    assert cap.lines_cut == 4990 and cap.middle_cut == 0
    text = cap.text()
    assert text == "".join(lines[:14] + info[:10] + lines[14:])
    result = ProbeResult(probe="nccl_tests", outcome=Outcome.PASS, started_at=1.0, finished_at=2.0, nodes=["n042"],
                         params={"raw_outputs": [{"collective": "all_reduce", "program": "all_reduce_perf",
                                                  "exit_code": 0, "error": "", "output": text}]})
    parsed = expand_nccl_tests_result(result)
    assert parsed.outcome is Outcome.PASS and len(parsed.measurements) == 151


def test_capture_cuts_the_middle_and_says_so() -> None:
    lines = A100.read_text().splitlines(keepends=True)
    cap = nccl_tests.OutputCapture(head=1500, tail=800, info_lines=0)
    cap.feed("".join(lines).encode())
    cap.close()
    text = cap.text()
    assert cap.middle_cut > 0 and f"# healthd: {cap.middle_cut} lines left out here\n" in text
    assert text.startswith(lines[0]) and text.endswith(lines[-1])
    assert len(text.encode()) <= 1500 + 800 + 60


def test_capture_splits_endless_lines_and_keeps_bytes() -> None:
    cap = nccl_tests.OutputCapture(head=100_000, tail=100_000)
    cap.feed(b"\xff" * (nccl_tests.MAX_LINE_BYTES * 2 + 5))
    cap.close()
    assert cap.total_bytes == nccl_tests.MAX_LINE_BYTES * 2 + 5
    assert cap.text() == "\ufffd" * (nccl_tests.MAX_LINE_BYTES * 2 + 5)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("gpu01", ["gpu01"]),
        ("gpu[01-03,07],login1", ["gpu01", "gpu02", "gpu03", "gpu07", "login1"]),
        ("rack[1-2]-n[8-9]", ["rack1-n8", "rack1-n9", "rack2-n8", "rack2-n9"]),
        ("a[098-101]", ["a098", "a099", "a100", "a101"]),
    ],
)
def test_expand_hostlist(text: str, expected: list[str]) -> None:
    assert nccl_tests.expand_hostlist(text) == expected


@pytest.mark.parametrize("text", ["gpu[01-03", "gpu01]", "gpu[a-b]", "n[0-999999]"])
def test_expand_hostlist_refuses(text: str) -> None:
    with pytest.raises(ValueError):
        nccl_tests.expand_hostlist(text)


def test_job_nodes_and_rank_from_the_environment() -> None:
    env = {"SLURM_STEP_NODELIST": "gpu[01-02]", "SLURMD_NODENAME": "gpu01", "SLURM_PROCID": "3"}
    assert nccl_tests.job_nodes(env) == ["gpu01", "gpu02"]
    assert nccl_tests.task_rank(env) == 3
    assert nccl_tests.job_nodes({"SLURMD_NODENAME": "gpu07"}) == ["gpu07"]
    assert nccl_tests.job_nodes({"SLURM_JOB_NODELIST": "bad[", "SLURMD_NODENAME": "gpu07"}) == ["gpu07"]
    assert nccl_tests.task_rank({}) == 0


def test_default_gpus(tmp_path: Path) -> None:
    none = tmp_path / "none"
    assert nccl_tests.default_gpus({"CUDA_VISIBLE_DEVICES": "0,1,2,3"}, none) == 4
    assert nccl_tests.default_gpus({"CUDA_VISIBLE_DEVICES": "0,1,2,3", "SLURM_NTASKS_PER_NODE": "4"}, none) == 1
    assert nccl_tests.default_gpus({"CUDA_VISIBLE_DEVICES": ""}, none) == 1
    gpus = tmp_path / "gpus"
    for bus in ("0000:14:00.0", "0000:19:00.0"):
        (gpus / bus).mkdir(parents=True)
    assert nccl_tests.default_gpus({}, gpus) == 2


@pytest.mark.parametrize(("text", "expected"), [("8", 8), ("64K", 65536), ("1G", 1024**3), ("128m", 128 * 1024**2)])
def test_parse_size(text: str, expected: int) -> None:
    assert nccl_tests.parse_size(text) == expected


def test_parse_size_refuses() -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="bad size '1T'"):
        nccl_tests.parse_size("1T")
