"""The Slurm parsers against real Slurm 24.11.5 and 26.05.5 output (tests/fixtures/slurm/24.11 and
26.05, see their READMEs), and what changed since 22.05 (tests/fixtures/slurm/22.05).

Both were captured by the same run of capture.py, so the scenarios are those of 22.05. Expected
values were read off the fixture files by hand: times from the UTC text times, checked against the
JSON's unix seconds.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from datetime import timezone
from pathlib import Path
from typing import Any

import pytest

from healthd.cluster import slurm_argv as sa
from healthd.cluster import slurm_parse as sp
from healthd.errors import ParseError, SlurmError
from healthd.model import JobState, JobStatus, Node
from tests.unit.test_slurm_parse import node

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "slurm"
UTC = timezone.utc  # noqa: UP017
RELEASES = ("24.11", "26.05")
SCENARIOS = ("idle", "busy", "noresp", "down")

REASON3 = "healthd: nccl=busbw_low 12.5<40GB/s run=r-0003"
REASON4 = "maintenance: replace PSU | ticket=4711"
REASON1 = "hw: GPU fell off the bus"


@dataclass(frozen=True)
class Capture:
    version: tuple[int, int, int]
    t_busy: float  # busy-phase jobs start, node3/node4 drained, scancel
    t_down1: float  # node1 set DOWN by an admin
    t_noresp: float  # slurmctld sets node4 DOWN "Not responding"
    t_jobs: float  # jobs-phase jobs start
    t_timeout: float  # healthd.timeout hits its one-minute limit
    reason_down4: str  # node4's reason once slurmctld set it down


# 24.11 keeps node4's old drain reason after UNDRAIN and appends " : Not responding" to it.
CAPTURES = {
    "24.11": Capture(
        (24, 11, 5), 1795320214, 1795320216, 1795320244, 1795320248, 1795320332, f"{REASON4} : Not responding"
    ),
    "26.05": Capture((26, 5, 5), 1795320214, 1795320216, 1795320243, 1795320246, 1795320331, "Not responding"),
}


def read(release: str, name: str) -> str:
    return (FIXTURES / release / name).read_text()



def expected_nodes(release: str, scenario: str) -> list[Node]:
    c = CAPTURES[release]
    return {
        "idle": [node(f"node{i}", "idle") for i in range(1, 5)],
        "busy": [
            node("node1", "allocated"),
            node("node2", "mixed"),
            node("node3", "mixed", {"DRAIN"}, REASON3, "root", c.t_busy),
            node("node4", "idle", {"DRAIN"}, REASON4, "root", c.t_busy),
        ],
        "noresp": [
            node("node1", "down", None, REASON1, "root", c.t_down1),
            node("node2", "idle", {"MAINTENANCE", "RESERVED"}),
            node("node3", "idle", {"RESERVED"}),
            node("node4", "idle", {"NOT_RESPONDING"}),
        ],
        "down": [
            node("node1", "idle"),
            node("node2", "idle", {"MAINTENANCE", "RESERVED"}),
            node("node3", "idle", {"RESERVED"}),
            node("node4", "down", {"NOT_RESPONDING"}, c.reason_down4, "root", c.t_noresp),
        ],
    }[scenario]


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
    return JobStatus(job_id, state, exit_code, reason, started, finished, nodes, name)


def expected_jobs(release: str, scenario: str) -> list[JobStatus]:
    c = CAPTURES[release]
    b, j, C = c.t_busy, c.t_jobs, JobState.CANCELLED
    if scenario == "busy":
        return [
            job("1", "healthd.alloc", JobState.RUNNING, None, "", b, None, ("node1",)),
            job("2", "healthd.mixed", JobState.RUNNING, None, "", b, None, ("node2",)),
            job("3", "healthd.draining", JobState.RUNNING, None, "", b, None, ("node3",)),
            job("4", "healthd.pending", JobState.PENDING, None, "Resources", None, None, ()),
        ]
    return [
        # 26.05's job 2 shell exited 143 itself ("143:0"); the others died of SIGTERM ("0:15"): both 143.
        job("1", "healthd.alloc", C, 143, "", b, b, ("node1",)),
        job("2", "healthd.mixed", C, 143, "", b, b, ("node2",)),
        job("3", "healthd.draining", C, 143, "", b, b, ("node3",)),
        job("4", "healthd.pending", C, None, "Resources", None, b, ()),
        job("6", "healthd.ok", JobState.COMPLETED, 0, "", j, j, ("node1",)),
        job("7", "healthd.fail", JobState.FAILED, 3, "NonZeroExitCode", j, j, ("node1",)),
        job("8", "healthd.signal", JobState.FAILED, 137, "RaisedSignal", j, j, ("node2",)),
        job("10", "healthd.timeout", JobState.TIMEOUT, 143, "TimeLimit", j, c.t_timeout, ("node3",)),
        job("11", "healthd.cancel_run", C, 143, "", j, j, ("node3",)),
        job("12", "healthd.cancel_pend", C, None, "BeginTime", None, j, ()),
        job("13", "healthd.multi", JobState.RUNNING, None, "", j, None, ("node1", "node2")),
        job("14", "healthd.running", JobState.RUNNING, None, "", j, None, ("node1",)),
        job("15", "healthd.later", JobState.PENDING, None, "BeginTime", None, None, ()),
    ]


def by_id(jobs: list[JobStatus]) -> dict[str, JobStatus]:
    return {x.job_id: x for x in jobs}


# --- nodes ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("scenario", SCENARIOS)
@pytest.mark.parametrize("release", RELEASES)
def test_scontrol_json_every_node_and_field(release: str, scenario: str) -> None:
    assert sp.parse_scontrol_json(read(release, f"{scenario}.scontrol.json")) == expected_nodes(release, scenario)


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_unpinned_json_of_26_05_reads_alike(scenario: str) -> None:
    """26.05's default data parser is v0.0.45: more fields, the same ones healthd reads."""
    text = read("26.05", f"{scenario}.scontrol.unpinned.json")
    assert json.loads(text)["meta"]["plugin"]["data_parser"] == "data_parser/v0.0.45"
    assert sp.parse_scontrol_json(text) == expected_nodes("26.05", scenario)


def test_24_11_default_data_parser_is_the_pinned_one() -> None:
    index = json.loads(read("24.11", "index.json"))
    same = {k: v["same_as"] for k, v in index.items() if "same_as" in v}
    assert same == {f"{s}.scontrol.unpinned.json": f"{s}.scontrol.json" for s in SCENARIOS} | {
        f"{s}.squeue.unpinned.json": f"{s}.squeue.json" for s in ("idle", "busy", "jobs")
    }
    assert not (FIXTURES / "24.11" / "busy.scontrol.unpinned.json").exists()


@pytest.mark.parametrize("scenario", SCENARIOS)
@pytest.mark.parametrize("release", RELEASES)
def test_scontrol_text_every_node_and_field(release: str, scenario: str) -> None:
    assert sp.parse_scontrol_nodes(read(release, f"{scenario}.scontrol.txt"), UTC) == expected_nodes(release, scenario)


@pytest.mark.parametrize("scenario", SCENARIOS)
@pytest.mark.parametrize("release", RELEASES)
def test_sinfo_text_every_node_and_field(release: str, scenario: str) -> None:
    """Unlike 22.05 (``allocated+drain``), 24.11+ text calls the draining node3 ``mixed+drain`` as JSON does."""
    assert sp.parse_sinfo_text(read(release, f"{scenario}.sinfo.txt"), UTC) == expected_nodes(release, scenario)


def test_24_11_keeps_reasons_after_undrain_but_they_are_not_reported() -> None:
    """The raw output has node3's old drain reason on an idle, reserved node; healthd reports none."""
    raw = json.loads(read("24.11", "noresp.scontrol.json"))["nodes"][2]
    assert (raw["name"], raw["state"], raw["reason"], raw["reason_set_by_user"]) == (
        "node3", ["IDLE", "RESERVED"], REASON3, "root",
    )  # fmt: skip
    assert raw["reason_changed_at"] == {"set": True, "infinite": False, "number": 1795320214}
    assert "Reason=healthd: nccl=busbw_low" in read("24.11", "noresp.scontrol.txt").splitlines()[2]
    for parsed in (
        sp.parse_scontrol_json(read("24.11", "noresp.scontrol.json")),
        sp.parse_scontrol_nodes(read("24.11", "noresp.scontrol.txt"), UTC),
        sp.parse_sinfo_text(read("24.11", "noresp.sinfo.txt"), UTC),
    ):
        assert (parsed[2].reason, parsed[2].reason_user, parsed[2].reason_time) == (None, None, None)
        assert not parsed[2].drained
    raw26 = json.loads(read("26.05", "noresp.scontrol.json"))["nodes"][2]
    assert (raw26["reason"], raw26["reason_set_by_user"]) == ("", "")


def test_scontrol_text_reason_followed_by_reservation() -> None:
    """24.11+ prints ``ReservationName=`` after the reason's ``[user@time]`` stamp."""
    line = read("24.11", "noresp.scontrol.txt").splitlines()[2].replace("State=IDLE+RESERVED", "State=IDLE+DRAIN")
    assert line.endswith(f"Reason={REASON3} [root@2026-11-22T04:03:34] ReservationName=healthd-test")
    parsed = sp.parse_scontrol_nodes(line, UTC)[0]
    assert (parsed.reason, parsed.reason_user, parsed.reason_time) == (REASON3, "root", 1795320214.0)


@pytest.mark.parametrize("release", RELEASES)
def test_one_node_and_unknown_node_json(release: str) -> None:
    # node2 runs one task of the two-node job 13 when this was captured.
    assert sp.parse_scontrol_json(read(release, "node.one.json")) == [node("node2", "mixed")]
    unknown = read(release, "node.unknown.json")
    assert json.loads(unknown)["warnings"] == [{"description": "No nodes to dump", "source": ""}]
    assert sp.parse_scontrol_json(unknown) == []


@pytest.mark.parametrize("release", RELEASES)
def test_sinfo_json_of_24_11_and_later_groups_nodes_and_is_refused(release: str) -> None:
    text = read(release, "busy.sinfo.json")
    groups = json.loads(text)["sinfo"]
    assert len(groups) == 8  # 2 partitions x 4 (state, reason, GRES use) groups of one node here
    assert [g["nodes"]["nodes"] for g in json.loads(read(release, "idle.sinfo.json"))["sinfo"]] == [
        ["node1", "node2", "node3", "node4"],
        ["node1", "node2", "node3", "node4"],
    ]
    with pytest.raises(ParseError, match=rf"sinfo --json of Slurm {release} groups nodes .* scontrol --json show node"):
        sp.parse_sinfo_json(text)


# --- jobs -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("scenario", ["busy", "jobs"])
@pytest.mark.parametrize("release", RELEASES)
def test_squeue_json_every_job_and_field(release: str, scenario: str) -> None:
    parsed = sp.parse_squeue_json(read(release, f"{scenario}.squeue.json"), "healthd.")
    assert by_id(parsed) == by_id(expected_jobs(release, scenario))
    assert len(parsed) == len(expected_jobs(release, scenario))


@pytest.mark.parametrize("scenario", ["busy", "jobs"])
def test_squeue_unpinned_json_of_26_05_reads_alike(scenario: str) -> None:
    parsed = sp.parse_squeue_json(read("26.05", f"{scenario}.squeue.unpinned.json"), "healthd.")
    assert by_id(parsed) == by_id(expected_jobs("26.05", scenario))


@pytest.mark.parametrize("scenario", ["busy", "jobs"])
@pytest.mark.parametrize("release", RELEASES)
def test_squeue_text_every_job_and_field(release: str, scenario: str) -> None:
    """Text ``exit_code`` is ``exit:signal`` on 24.11+; the reason of a signalled job has the signal."""
    expected = by_id(expected_jobs(release, scenario))
    if scenario == "jobs":
        expected["8"] = job("8", "healthd.signal", JobState.FAILED, 137, "RaisedSignal:9(Killed)", *_times(release))
    parsed = sp.parse_squeue_text(read(release, f"{scenario}.squeue.txt"), "healthd.", UTC)
    assert by_id(parsed) == expected
    assert len(parsed) == len(expected)


def _times(release: str) -> tuple[float, float, tuple[str, ...]]:
    t = CAPTURES[release].t_jobs
    return t, t, ("node2",)


@pytest.mark.parametrize("release", RELEASES)
def test_squeue_json_without_states_all_hides_finished_jobs(release: str) -> None:
    """Why 24.11+ is asked with ``--states=all``: without it only pending and running jobs show."""
    parsed = sp.parse_squeue_json(read(release, "jobs.squeue.nofilter.json"), "healthd.")
    assert [(x.job_id, x.state) for x in parsed] == [
        ("13", JobState.RUNNING), ("14", JobState.RUNNING), ("15", JobState.PENDING),
    ]  # fmt: skip


@pytest.mark.parametrize("release", RELEASES)
def test_exit_codes_are_objects_and_tres_per_node_uses_a_slash(release: str) -> None:
    jobs = {x["job_id"]: x for x in json.loads(read(release, "jobs.squeue.json"))["jobs"]}
    assert jobs[7]["exit_code"]["status"] == ["ERROR"]
    assert jobs[7]["exit_code"]["return_code"] == {"set": True, "infinite": False, "number": 3}
    assert jobs[8]["exit_code"]["signal"] == {"id": {"set": True, "infinite": False, "number": 9}, "name": "KILL"}
    assert jobs[2]["tres_per_node"] == "gres/gpu:tgpu:1"
    old = {x["job_id"]: x for x in json.loads(read("22.05", "jobs.squeue.json"))["jobs"]}
    assert (old[7]["exit_code"], old[8]["exit_code"], old[2]["tres_per_node"]) == (768, 9, "gres:gpu:tgpu:1")


def test_name_prefix_and_idle_cluster() -> None:
    for release in RELEASES:
        other = sp.parse_squeue_json(read(release, "jobs.squeue.json"), "other.")
        assert [(x.job_id, x.state, x.exit_code, x.nodes) for x in other] == [("9", JobState.COMPLETED, 0, ("node2",))]
        assert sp.parse_squeue_json(read(release, "idle.squeue.json"), "healthd.") == []
        assert sp.parse_squeue_text(read(release, "idle.squeue.txt"), "healthd.", UTC) == []


# --- versions, errors, unknown releases -----------------------------------------------------------


@pytest.mark.parametrize("release", RELEASES)
def test_version_from_meta_with_strings(release: str) -> None:
    text = read(release, "busy.scontrol.json")
    meta = json.loads(text)["meta"]
    assert "Slurm" not in meta and isinstance(meta["slurm"]["version"]["major"], str)
    doc = sp.load_json(text, "scontrol")
    assert doc.version == CAPTURES[release].version
    assert sp.parse_version(read(release, "version.txt")) == CAPTURES[release].version
    assert sp.parse_version(read(release, "ctld_down.version.txt")) == CAPTURES[release].version


def test_26_05_minor_has_a_leading_zero() -> None:
    assert json.loads(read("26.05", "idle.squeue.json"))["meta"]["slurm"]["version"]["minor"] == "05"
    assert sp.load_json(read("26.05", "idle.squeue.json"), "squeue").release == (26, 5)


@pytest.mark.parametrize("release", RELEASES)
def test_controller_down_exits_1_with_no_json(release: str) -> None:
    """24.11+ exit 1 with empty stdout (22.05: exit 0 and an ``errors`` array): no JSON, a ParseError."""
    index = json.loads(read(release, "index.json"))
    for name, command in [("sinfo", "sinfo"), ("squeue", "squeue"), ("scontrol", "scontrol")]:
        entry = index[f"ctld_down.{name}.json"]
        assert (entry["rc"], read(release, f"ctld_down.{name}.json")) == (1, "")
        assert "Unable to contact slurm controller (connect failure)" in read(release, f"ctld_down.{name}.json.stderr")
        assert entry["argv"][0] == command
    with pytest.raises(ParseError, match="scontrol --json: expected JSON, got no output"):
        sp.parse_scontrol_json(read(release, "ctld_down.scontrol.json"))
    with pytest.raises(ParseError, match="squeue --json: expected JSON, got no output"):
        sp.parse_squeue_json(read(release, "ctld_down.squeue.json"), "healthd.")


def _doc(release: str, name: str) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(read(release, name))
    return doc


def test_errors_array_of_24_11_is_a_slurm_error() -> None:
    doc = _doc("24.11", "busy.squeue.json")
    doc["errors"] = [
        {"description": "Unable to query jobs", "source": "slurm_load_jobs()", "error": "x", "error_number": 1}
    ]
    with pytest.raises(
        SlurmError, match=r"squeue --json reported: Unable to query jobs / x / slurm_load_jobs\(\) \(errno 1\)"
    ):
        sp.parse_squeue_json(json.dumps(doc), "healthd.")


def test_number_objects_not_set_or_infinite_are_none() -> None:
    doc = _doc("24.11", "busy.scontrol.json")
    doc["nodes"][2]["reason_changed_at"] = {"set": False, "infinite": False, "number": 0}
    assert sp.parse_scontrol_json(json.dumps(doc))[2].reason_time is None
    jobs = _doc("24.11", "jobs.squeue.json")
    jobs["jobs"][5]["end_time"] = {"set": False, "infinite": True, "number": 0}
    assert by_id(sp.parse_squeue_json(json.dumps(jobs), "healthd."))["6"].finished_at is None
    jobs["jobs"][5]["end_time"] = 1795320248
    with pytest.raises(ParseError, match=r"jobs\[5\].end_time: expected dict, got int"):
        sp.parse_squeue_json(json.dumps(jobs), "healthd.")
    jobs["jobs"][5]["end_time"] = {"set": True, "infinite": False}
    with pytest.raises(ParseError, match=r"jobs\[5\].end_time.number: missing"):
        sp.parse_squeue_json(json.dumps(jobs), "healthd.")


def test_v0_0_42_unreadable_fields_name_their_path() -> None:
    doc = _doc("26.05", "busy.scontrol.json")
    doc["nodes"][1]["state"] = ["DRAIN"]
    with pytest.raises(ParseError, match=r"nodes\[1\].state: node state \['DRAIN'\]: expected exactly one base state"):
        sp.parse_scontrol_json(json.dumps(doc))
    doc["nodes"][1]["state"] = "MIXED"
    with pytest.raises(ParseError, match=r"nodes\[1\].state: expected list, got str"):
        sp.parse_scontrol_json(json.dumps(doc))
    jobs = _doc("26.05", "jobs.squeue.json")
    del jobs["jobs"][6]["exit_code"]["signal"]
    with pytest.raises(ParseError, match=r"jobs\[6\].exit_code.signal: missing"):
        sp.parse_squeue_json(json.dumps(jobs), "healthd.")


def _logged(caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]) -> str:
    captured = capsys.readouterr()
    return caplog.text + captured.out + captured.err


@pytest.mark.parametrize(
    ("version", "parser", "fixture"),
    [(("25", "05"), "24.11", "24.11"), (("27", "11"), "26.05", "26.05"), (("30", "02"), "26.05", "24.11")],
)
def test_unknown_newer_release_uses_closest_parser_and_warns(
    version: tuple[str, str],
    parser: str,
    fixture: str,
    caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
) -> None:
    doc = _doc(fixture, "busy.scontrol.json")
    doc["meta"]["slurm"]["version"] = {"major": version[0], "minor": version[1], "micro": "1"}
    release = (int(version[0]), int(version[1]))
    sp._warned.discard(("scontrol", release))
    with caplog.at_level(logging.WARNING):
        assert sp.parse_scontrol_json(json.dumps(doc)) == expected_nodes(fixture, "busy")
    logged = _logged(caplog, capsys)
    assert logged.count("slurm_json_release_unknown") == 1
    assert f"{version[0]}.{version[1]}" in logged and parser in logged


def test_release_between_known_ones_gets_the_older_parser_and_a_parse_error_not_a_crash() -> None:
    """23.11 would be read as 22.05: a v0.0.42 document then fails cleanly (the client falls back to text)."""
    doc = _doc("24.11", "jobs.squeue.json")
    doc["meta"]["slurm"]["version"] = {"major": "23", "minor": "11", "micro": "4"}
    with pytest.raises(ParseError, match=r"jobs\[0\].job_state: expected str, got list"):
        sp.parse_squeue_json(json.dumps(doc), "healthd.")


def test_meta_without_version_is_a_parse_error() -> None:
    doc = _doc("24.11", "idle.squeue.json")
    del doc["meta"]["slurm"]["version"]["minor"]
    with pytest.raises(ParseError, match=r"expected meta.Slurm.version"):
        sp.parse_squeue_json(json.dumps(doc), "healthd.")


# --- state words, exit codes, dialects ----------------------------------------------------------


@pytest.mark.parametrize(
    ("words", "expected"),
    [
        (["IDLE"], ("idle", set())),
        (["MIXED", "DRAIN"], ("mixed", {"DRAIN"})),
        (["DRAIN", "MIXED"], ("mixed", {"DRAIN"})),
        (["IDLE", "RESERVED", "MAINTENANCE"], ("idle", {"MAINTENANCE", "RESERVED"})),
        (["IDLE", "MAINTENANCE", "RESERVED"], ("idle", {"MAINTENANCE", "RESERVED"})),
        (["DOWN", "NOT_RESPONDING"], ("down", {"NOT_RESPONDING"})),
        (["idle", "powered_down"], ("idle", {"POWERED_DOWN"})),
    ],
)
def test_node_state_words_compare_as_sets(words: list[str], expected: tuple[str, set[str]]) -> None:
    assert sp.node_state_words(words) == (expected[0], frozenset(expected[1]))


def test_node_state_words_need_one_base_state() -> None:
    for words in ([], ["DRAIN"], ["IDLE", "DOWN"]):
        with pytest.raises(ParseError, match="expected exactly one base state"):
            sp.node_state_words(words)


def test_22_05_json_and_24_11_json_give_the_same_flags_for_the_same_states() -> None:
    old = sp.parse_sinfo_json(read("22.05", "noresp.sinfo.json"))
    new = sp.parse_scontrol_json(read("24.11", "noresp.scontrol.json"))
    assert [(n.name, n.state, n.flags) for n in old] == [(n.name, n.state, n.flags) for n in new]


@pytest.mark.parametrize(
    ("words", "expected"),
    [
        (["RUNNING"], JobState.RUNNING),
        (["PENDING"], JobState.PENDING),
        (["COMPLETED"], JobState.COMPLETED),
        (["FAILED"], JobState.FAILED),
        (["CANCELLED"], JobState.CANCELLED),
        (["TIMEOUT"], JobState.TIMEOUT),
        (["OUT_OF_MEMORY"], JobState.FAILED),
        (["COMPLETED", "COMPLETING"], JobState.RUNNING),
        (["RUNNING", "CONFIGURING"], JobState.PENDING),
        (["PENDING", "REQUEUED"], JobState.PENDING),
        (["FAILED", "LAUNCH_FAILED"], JobState.FAILED),
        (["SOMETHING_NEW"], JobState.UNKNOWN),
        ([], JobState.UNKNOWN),
    ],
)
def test_job_state_words_read_like_slurms_own_string(words: list[str], expected: JobState) -> None:
    assert sp.job_state_words(words) is expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [("3:0", 3), ("0:15", 143), ("143:0", 143), ("0:9", 137), ("0:0", 0), ("768", 3), ("15", 143), ("-1:0", None)],
)
def test_exit_status_text_of_every_release(text: str, expected: int | None) -> None:
    assert sp.exit_status_text(text) == expected


def test_exit_status_text_unreadable() -> None:
    with pytest.raises(ParseError, match="exit_code signal: expected an integer, got 'x'"):
        sp.exit_status_text("3:x")


@pytest.mark.parametrize("release", ["22.05", *RELEASES])
def test_fixtures_were_captured_with_the_dialect_of_their_release(release: str) -> None:
    """The JSON argv in index.json are what ``SlurmCli`` runs for that release (re-capture if not)."""
    dialect = sa.JSON_DIALECTS[(int(release[:2]), int(release[3:]))]
    parser, filters = dialect.data_parser, dialect.squeue_filters
    builders = {
        "sinfo.json": sa.sinfo_json_argv(["sinfo"], parser),
        "squeue.json": sa.squeue_json_argv(["squeue"], parser, filters=filters),
        "scontrol.json": sa.scontrol_nodes_json_argv(["scontrol"], data_parser=parser),
        "sinfo.txt": sa.sinfo_text_argv(["sinfo"]),
        "squeue.txt": sa.squeue_text_argv(["squeue"]),
        "scontrol.txt": sa.scontrol_node_argv(["scontrol"]),
    }
    index = json.loads(read(release, "index.json"))
    checked = 0
    for name, entry in index.items():
        prefix, _, suffix = name.partition(".")
        if suffix in builders:
            assert entry["argv"] == builders[suffix], name
            # controller down: 22.05's JSON commands exit 0 (with an errors array), all others 1
            down_rc = 0 if release == "22.05" and suffix.endswith(".json") else 1
            assert entry["rc"] == (down_rc if prefix == "ctld_down" else 0), name
            checked += 1
    per_scenario = 4 if dialect.nodes_command == "scontrol" else 3
    assert checked == 4 * per_scenario + 3 * 2 + (5 if dialect.nodes_command == "scontrol" else 4)


def test_dialects() -> None:
    assert sa.scontrol_nodes_json_argv(["scontrol"], "node1") == ["scontrol", "--json=v0.0.42", "show", "node", "node1"]
    assert sa.squeue_json_argv(["squeue"], "v0.0.42", filters=True) == [
        "squeue", "--json=v0.0.42", "--all", "--states=all",
    ]  # fmt: skip
    assert sa.sinfo_json_argv(["sinfo"], None) == ["sinfo", "--json"]
    with pytest.raises(ValueError, match="is not a Slurm data parser version"):
        sa.sinfo_json_argv(["sinfo"], "0.0.42; rm")
    assert sa.JSON_DIALECTS[(22, 5)].nodes_command == "sinfo"
    assert {sa.JSON_DIALECTS[r].data_parser for r in [(24, 11), (26, 5)]} == {"v0.0.42"}
    assert set(sa.JSON_DIALECTS) == set(sp.NODE_NORMALISERS) == set(sp.JOB_NORMALISERS)
