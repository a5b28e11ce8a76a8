"""The Slurm parsers against real Slurm 22.05.8 output (tests/fixtures/slurm/22.05, see its README).

Expected values below were read off the fixture files by hand (times converted from the UTC text
times and checked against the JSON's unix seconds), not produced by the parsers.
"""

from __future__ import annotations

import json
import logging
from datetime import timedelta, timezone
from pathlib import Path

import pytest

from healthd.cluster import slurm_parse as sp
from healthd.errors import ParseError, SlurmError
from healthd.model import JobState, JobStatus, Node

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "slurm" / "22.05"
UTC = timezone.utc  # noqa: UP017 (the name reads better than datetime.UTC here)

T_BUSY = 1795317324.0  # 2026-11-22T03:15:24Z: busy-phase jobs start, node3/node4 drained, scancel
T_DOWN1 = 1795317331.0  # 2026-11-22T03:15:31Z: node1 set DOWN by an admin
T_NORESP = 1795317356.0  # 2026-11-22T03:15:56Z: slurmctld sets node4 DOWN "Not responding"
T_JOBS = 1795317357.0  # 2026-11-22T03:15:57Z: jobs-phase jobs start
T_TIMEOUT = 1795317441.0  # 2026-11-22T03:17:21Z: healthd.timeout hits its one-minute limit

REASON3 = "healthd: nccl=busbw_low 12.5<40GB/s run=r-0003"
REASON4 = "maintenance: replace PSU | ticket=4711"
REASON1 = "hw: GPU fell off the bus"


def read(name: str) -> str:
    return (FIXTURES / name).read_text()


def node(
    name: str,
    state: str,
    flags: set[str] | None = None,
    reason: str | None = None,
    user: str | None = None,
    when: float | None = None,
) -> Node:
    """Every node of the test cluster: partitions batch+gpu, 2 tgpu GPUs, features fake,tgpu, 2 CPUs."""
    return Node(
        name=name,
        state=state,
        flags=frozenset(flags or ()),
        partitions=("batch", "gpu"),
        gpus=2,
        gpu_type="tgpu",
        features=("fake", "tgpu"),
        reason=reason,
        reason_user=user,
        reason_time=when,
        cpus=2,
    )


IDLE = [node(f"node{i}", "idle") for i in range(1, 5)]
BUSY = [
    node("node1", "allocated"),
    node("node2", "mixed"),
    node("node3", "mixed", {"DRAIN"}, REASON3, "root", T_BUSY),
    node("node4", "idle", {"DRAIN"}, REASON4, "root", T_BUSY),
]
NORESP = [
    node("node1", "down", None, REASON1, "root", T_DOWN1),
    node("node2", "idle", {"MAINTENANCE", "RESERVED"}),
    node("node3", "idle", {"RESERVED"}),
    node("node4", "idle", {"NOT_RESPONDING"}),
]
DOWN = [
    node("node1", "idle"),
    node("node2", "idle", {"MAINTENANCE", "RESERVED"}),
    node("node3", "idle", {"RESERVED"}),
    node("node4", "down", {"NOT_RESPONDING"}, "Not responding", "root", T_NORESP),
]
NODES = {"idle": IDLE, "busy": BUSY, "noresp": NORESP, "down": DOWN}


@pytest.mark.parametrize("scenario", sorted(NODES))
def test_sinfo_json_every_node_and_field(scenario: str) -> None:
    assert sp.parse_sinfo_json(read(f"{scenario}.sinfo.json")) == NODES[scenario]


@pytest.mark.parametrize("scenario", sorted(NODES))
def test_scontrol_oneliner_every_node_and_field(scenario: str) -> None:
    assert sp.parse_scontrol_nodes(read(f"{scenario}.scontrol.txt"), UTC) == NODES[scenario]


@pytest.mark.parametrize("scenario", sorted(NODES))
def test_sinfo_text_every_node_and_field(scenario: str) -> None:
    expected = list(NODES[scenario])
    if scenario == "busy":
        # sinfo's StateComplete calls the draining node3 "allocated+drain" where JSON and scontrol say MIXED.
        expected[2] = node("node3", "allocated", {"DRAIN"}, REASON3, "root", T_BUSY)
    assert sp.parse_sinfo_text(read(f"{scenario}.sinfo.txt"), UTC) == expected


def test_drained_property_on_parsed_nodes() -> None:
    assert [n.drained for n in BUSY] == [False, False, True, True]
    assert not any(n.drained for n in NORESP + DOWN)


def test_text_times_follow_the_given_zone() -> None:
    plus_one = timezone(timedelta(hours=1))
    nodes = sp.parse_sinfo_text(read("busy.sinfo.txt"), plus_one)
    assert nodes[3].reason_time == T_BUSY - 3600
    nodes = sp.parse_scontrol_nodes(read("busy.scontrol.txt"), plus_one)
    assert nodes[2].reason_time == T_BUSY - 3600


def job(
    job_id: str,
    name: str,
    state: JobState,
    exit_code: int | None,
    reason: str,
    started: float | None,
    finished: float | None,
    nodes: tuple[str, ...],
) -> JobStatus:
    return JobStatus(
        job_id=job_id,
        state=state,
        exit_code=exit_code,
        reason=reason,
        started_at=started,
        finished_at=finished,
        nodes=nodes,
        name=name,
    )


BUSY_JOBS = [
    job("1", "healthd.alloc", JobState.RUNNING, None, "", T_BUSY, None, ("node1",)),
    job("2", "healthd.mixed", JobState.RUNNING, None, "", T_BUSY, None, ("node2",)),
    job("3", "healthd.draining", JobState.RUNNING, None, "", T_BUSY, None, ("node3",)),
    job("4", "healthd.pending", JobState.PENDING, None, "Resources", None, None, ()),
]
C = JobState.CANCELLED
JOBS = [
    job("1", "healthd.alloc", C, 143, "", T_BUSY, T_BUSY, ("node1",)),
    job("2", "healthd.mixed", C, 143, "", T_BUSY, T_BUSY, ("node2",)),
    job("3", "healthd.draining", C, 143, "", T_BUSY, T_BUSY, ("node3",)),
    job("4", "healthd.pending", C, None, "Resources", None, T_BUSY, ()),
    job("6", "healthd.ok", JobState.COMPLETED, 0, "", T_JOBS, T_JOBS, ("node1",)),
    job("7", "healthd.fail", JobState.FAILED, 3, "NonZeroExitCode", T_JOBS, T_JOBS, ("node1",)),
    job("8", "healthd.signal", JobState.FAILED, 137, "JobLaunchFailure", T_JOBS, T_JOBS, ("node2",)),
    job("10", "healthd.timeout", JobState.TIMEOUT, 143, "TimeLimit", T_JOBS, T_TIMEOUT, ("node3",)),
    job("11", "healthd.cancel_run", C, 143, "", T_JOBS, T_JOBS, ("node3",)),
    job("12", "healthd.cancel_pend", C, None, "BeginTime", None, T_JOBS, ()),
    job("13", "healthd.multi", JobState.RUNNING, None, "", T_JOBS, None, ("node1", "node2")),
    job("14", "healthd.running", JobState.RUNNING, None, "", T_JOBS, None, ("node1",)),
    job("15", "healthd.later", JobState.PENDING, None, "BeginTime", None, None, ()),
]


def by_id(jobs: list[JobStatus]) -> dict[str, JobStatus]:
    return {j.job_id: j for j in jobs}


@pytest.mark.parametrize("scenario", ["busy", "jobs"])
def test_squeue_json_every_job_and_field(scenario: str) -> None:
    expected = BUSY_JOBS if scenario == "busy" else JOBS
    parsed = sp.parse_squeue_json(read(f"{scenario}.squeue.json"), "healthd.")
    assert by_id(parsed) == by_id(expected)
    assert len(parsed) == len(expected)


@pytest.mark.parametrize("scenario", ["busy", "jobs"])
def test_squeue_text_every_job_and_field(scenario: str) -> None:
    expected = BUSY_JOBS if scenario == "busy" else JOBS
    parsed = sp.parse_squeue_text(read(f"{scenario}.squeue.txt"), "healthd.", UTC)
    assert by_id(parsed) == by_id(expected)
    assert len(parsed) == len(expected)


def test_name_prefix_selects_other_jobs() -> None:
    other = sp.parse_squeue_json(read("jobs.squeue.json"), "other.")
    assert [(j.job_id, j.state, j.exit_code, j.nodes) for j in other] == [("9", JobState.COMPLETED, 0, ("node2",))]
    user = sp.parse_squeue_text(read("busy.squeue.txt"), "user.", UTC)
    assert [(j.job_id, j.state, j.reason, j.started_at) for j in user] == [("5", JobState.PENDING, "BeginTime", None)]
    assert len(sp.parse_squeue_json(read("jobs.squeue.json"), "h")) == 13


def test_idle_cluster_has_no_jobs() -> None:
    assert sp.parse_squeue_json(read("idle.squeue.json"), "healthd.") == []
    assert sp.parse_squeue_text(read("idle.squeue.txt"), "healthd.", UTC) == []


def test_controller_down_json_raises_slurm_error() -> None:
    with pytest.raises(SlurmError, match=r"sinfo --json reported: Unspecified error \(errno -1\)"):
        sp.parse_sinfo_json(read("ctld_down.sinfo.json"))
    with pytest.raises(SlurmError, match="squeue --json reported: Failed while looking for jobs / Unspecified error"):
        sp.parse_squeue_json(read("ctld_down.squeue.json"), "healthd.")


def test_controller_down_is_slurm_error_not_parse_error() -> None:
    with pytest.raises(SlurmError) as info:
        sp.load_json(read("ctld_down.squeue.json"), "squeue")
    assert not isinstance(info.value, ParseError)


def test_json_version_from_meta() -> None:
    doc = sp.load_json(read("busy.sinfo.json"), "sinfo")
    assert doc.version == (22, 5, 8)
    assert doc.release == (22, 5)


def test_version_text() -> None:
    assert sp.parse_version(read("version.txt")) == (22, 5, 8)
    assert sp.parse_version(read("ctld_down.version.txt")) == (22, 5, 8)
    assert sp.parse_version("slurm 24.11.1\n") == (24, 11, 1)
    with pytest.raises(ParseError, match=r"expected 'slurm X\.Y\.Z' on line 1, got 'sinfo: error'"):
        sp.parse_version("sinfo: error\n")


def test_sbatch_parsable() -> None:
    assert sp.parse_sbatch_parsable(read("sbatch.parsable.txt")) == "1"
    assert sp.parse_sbatch_parsable("4711;cluster2\n") == "4711"
    with pytest.raises(ParseError, match="got no output"):
        sp.parse_sbatch_parsable(read("sbatch.bad_partition.txt"))
    with pytest.raises(ParseError, match="line 1, got 'Submitted batch job 12'"):
        sp.parse_sbatch_parsable("Submitted batch job 12\n")


@pytest.mark.parametrize(
    ("gres", "expected"),
    [
        ("gpu:tgpu:2", (2, "tgpu")),
        ("gpu:a100:8(S:0-1)", (8, "a100")),
        ("gpu:4", (4, None)),
        ("gpu", (1, None)),
        ("gpu:h100:4(S:0),gpu:a100:2(S:1),nic:2", (6, "a100,h100")),
        ("gpu:a100:4(S:0,2),shard:8", (4, "a100")),
        ("mps:400", (0, None)),
        ("(null)", (0, None)),
        ("N/A", (0, None)),
        ("", (0, None)),
    ],
)
def test_gres(gres: str, expected: tuple[int, str | None]) -> None:
    assert sp.parse_gres(gres) == expected


def test_gres_unreadable() -> None:
    with pytest.raises(ParseError, match=r"GRES 'gpu:a100:x': expected a count after 'gpu:a100'"):
        sp.parse_gres("gpu:a100:x")


@pytest.mark.parametrize(
    ("raw", "expected"),
    [(0, 0), (768, 3), (256, 1), (9, 137), (15, 143), (0x8B, 139), (-1, None), (4294967294, None)],
)
def test_exit_status(raw: int, expected: int | None) -> None:
    assert sp.exit_status(raw) == expected


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("PENDING", JobState.PENDING),
        ("CONFIGURING", JobState.PENDING),
        ("RUNNING", JobState.RUNNING),
        ("COMPLETING", JobState.RUNNING),
        ("COMPLETED", JobState.COMPLETED),
        ("FAILED", JobState.FAILED),
        ("NODE_FAIL", JobState.FAILED),
        ("OUT_OF_MEMORY", JobState.FAILED),
        ("BOOT_FAIL", JobState.FAILED),
        ("CANCELLED", JobState.CANCELLED),
        ("CANCELLED by 0", JobState.CANCELLED),
        ("PREEMPTED", JobState.PREEMPTED),
        ("DEADLINE", JobState.CANCELLED),
        ("TIMEOUT", JobState.TIMEOUT),
        ("timeout", JobState.TIMEOUT),
        ("SUSPENDED", JobState.RUNNING),
        ("REQUEUED", JobState.PENDING),
        ("SOMETHING_NEW", JobState.UNKNOWN),
        ("", JobState.UNKNOWN),
    ],
)
def test_job_state_mapping(name: str, expected: JobState) -> None:
    assert sp.job_state(name) is expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("idle", ("idle", set())),
        ("idle+drain", ("idle", {"DRAIN"})),
        ("IDLE+MAINTENANCE+RESERVED", ("idle", {"MAINTENANCE", "RESERVED"})),
        ("down+not_responding", ("down", {"NOT_RESPONDING"})),
        ("idle*", ("idle", {"NOT_RESPONDING"})),
        ("idle~", ("idle", {"POWERED_DOWN"})),
        ("drained", ("drained", {"DRAIN"})),
        ("mixed@", ("mixed", {"REBOOT_REQUESTED"})),
    ],
)
def test_split_state(text: str, expected: tuple[str, set[str]]) -> None:
    assert sp.split_state(text) == (expected[0], frozenset(expected[1]))


def test_split_state_unreadable() -> None:
    with pytest.raises(ParseError, match="expected a state"):
        sp.split_state("")
    with pytest.raises(ParseError, match="lower-case word"):
        sp.split_state("idle 3")


def test_slurm_time() -> None:
    assert sp.parse_slurm_time("2026-11-22T03:15:24", UTC) == T_BUSY
    for empty in ("N/A", "NONE", "Unknown", "None", ""):
        assert sp.parse_slurm_time(empty, UTC) is None
    with pytest.raises(ParseError, match="expected YYYY-MM-DDTHH:MM:SS"):
        sp.parse_slurm_time("22 Nov 03:15", UTC)


def test_expand_nodes_uses_hostlist() -> None:
    assert sp.expand_nodes("node[01-03,07]") == ("node01", "node02", "node03", "node07")
    assert sp.expand_nodes("") == ()
    with pytest.raises(ParseError, match="node list 'node\\[1-'"):
        sp.expand_nodes("node[1-")


def test_sinfo_text_wrong_field_count_names_the_line() -> None:
    text = read("idle.sinfo.txt").splitlines()
    text[2] = "node2|idle|batch*"
    with pytest.raises(ParseError, match=r"sinfo line 3: expected 9 '\|'-separated fields .* got 3"):
        sp.parse_sinfo_text("\n".join(text), UTC)


def test_sinfo_text_bad_cpus_names_the_line() -> None:
    text = read("idle.sinfo.txt").replace("|2|Unknown", "|two|Unknown", 1)
    with pytest.raises(ParseError, match="sinfo line 1: CPUs: expected an integer, got 'two'"):
        sp.parse_sinfo_text(text, UTC)


def test_squeue_text_bad_exit_code_names_the_line() -> None:
    lines = read("jobs.squeue.txt").splitlines()
    assert lines[9].startswith("7|FAILED|768|")
    lines[9] = lines[9].replace("|768|", "|x|", 1)
    with pytest.raises(ParseError, match="squeue line 10: exit_code: expected an integer, got 'x'"):
        sp.parse_squeue_text("\n".join(lines), "healthd.", UTC)


def test_scontrol_missing_key_names_the_line() -> None:
    lines = read("idle.scontrol.txt").splitlines()
    lines[1] = lines[1].replace("State=IDLE", "Status=IDLE")
    with pytest.raises(ParseError, match="scontrol line 2: expected State="):
        sp.parse_scontrol_nodes("\n".join(lines), UTC)


def test_scontrol_reason_followed_by_comment_and_extra() -> None:
    line = read("idle.scontrol.txt").splitlines()[0].replace("State=IDLE", "State=IDLE+DRAIN")
    line += " Reason=r1 k=v [root@2026-11-22T03:18:42] Comment=a comment=x Extra=extra y"
    parsed = sp.parse_scontrol_nodes(line, UTC)[0]
    assert (parsed.reason, parsed.reason_user, parsed.reason_time) == ("r1 k=v", "root", 1795317522.0)
    assert parsed.flags == {"DRAIN"}


def test_json_unreadable() -> None:
    with pytest.raises(ParseError, match="sinfo --json: expected JSON, Expecting value at line 1"):
        sp.parse_sinfo_json("sinfo: unrecognized option '--json'\n")
    with pytest.raises(ParseError, match=r"expected meta.Slurm.version"):
        sp.parse_sinfo_json('{"nodes": []}')
    doc = json.loads(read("busy.sinfo.json"))
    doc["nodes"][1]["cpus"] = "2"
    with pytest.raises(ParseError, match=r"nodes\[1\].cpus: expected int, got str"):
        sp.parse_sinfo_json(json.dumps(doc))
    del doc["nodes"]
    with pytest.raises(ParseError, match="expected a 'nodes' list"):
        sp.parse_sinfo_json(json.dumps(doc))
    jobs = json.loads(read("jobs.squeue.json"))
    del jobs["jobs"][2]["exit_code"]
    with pytest.raises(ParseError, match=r"jobs\[2\].exit_code: missing"):
        sp.parse_squeue_json(json.dumps(jobs), "healthd.")


def test_unknown_release_uses_closest_parser_and_warns_once(
    caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = json.loads(read("busy.sinfo.json"))
    doc["meta"]["Slurm"]["version"] = {"major": 23, "minor": 2, "micro": 7}
    sp._warned.discard(("sinfo", (23, 2)))
    with caplog.at_level(logging.WARNING):
        assert sp.parse_sinfo_json(json.dumps(doc)) == BUSY
        assert sp.parse_sinfo_json(json.dumps(doc)) == BUSY
    # structlog prints when logging is not set up, and goes through stdlib logging when it is.
    captured = capsys.readouterr()
    logged = caplog.text + captured.out + captured.err
    assert logged.count("slurm_json_release_unknown") == 1
    assert "23.02" in logged and "22.05" in logged


def test_closest_release() -> None:
    known = [(22, 5), (24, 11), (26, 5)]
    assert sp.closest_release((22, 5), known) == (22, 5)
    assert sp.closest_release((23, 11), known) == (22, 5)
    assert sp.closest_release((25, 5), known) == (24, 11)
    assert sp.closest_release((27, 5), known) == (26, 5)
    assert sp.closest_release((21, 8), known) == (22, 5)
