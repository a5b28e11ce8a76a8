from __future__ import annotations

import json
import re
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from healthd.cli import main
from healthd.config import load_settings
from healthd.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "healthd.toml"
    path.write_text(text)
    return path


def test_defaults_work_without_a_file() -> None:
    settings, path = load_settings(None)
    assert path is None
    assert settings.backend == "auto"
    assert settings.http.port == 9469
    assert set(settings.probes) == {"gemm", "nccl"}
    assert settings.store_path.name == "healthd.sqlite"
    assert settings.remediation.mode == "recommend"


def test_example_config_documents_the_defaults() -> None:
    example, _ = load_settings(REPO / "healthd.example.toml")
    defaults, _ = load_settings(None)
    assert example == defaults


@pytest.mark.parametrize(
    ("text", "key", "message"),
    [
        ("[http]\nprot = 1\n", "http.prot", "Extra inputs are not permitted"),
        ("[http]\nport = 'abc'\n", "http.port", "valid integer"),
        ("[http]\nport = 99999\n", "http.port", "less than or equal to 65535"),
        ("backend = 'kubernetes'\n", "backend", "'auto', 'local' or 'slurm'"),
        ("[probes.gemm]\ninterval_s = -5\n", "probes.gemm.interval_s", "greater than or equal to 0.01"),
        ("[probes.gmm]\n", "probes", "unknown probe(s) ['gmm']"),
        ("[remediation]\nmode = 'yolo'\n", "remediation.mode", "'observe', 'recommend' or 'enforce'"),
        ("[local]\nnode_name = 'bad name;rm'\n", "local.node_name", "is not a node name"),
        ("typo_at_top = 1\n", "typo_at_top", "Extra inputs are not permitted"),
        ("[scheduler]\ncollect_interval_s = 1e20\n", "scheduler.collect_interval_s", "less than or equal"),
        ("[scheduler]\nplan_interval_s = nan\n", "scheduler.plan_interval_s", "finite number"),
        ("[scheduler]\nplan_interval_s = 0.0001\n", "scheduler.plan_interval_s", "greater than or equal"),
        ("[probes.gemm]\ntimeout_s = inf\n", "probes.gemm.timeout_s", "finite number"),
        ("[probes.gemm]\njitter_s = 1e300\n", "probes.gemm.jitter_s", "less than or equal"),
        ("[probes.gemm]\nnodes_per_job = 100000000000000000000\n", "probes.gemm.nodes_per_job", "less than"),
        ("[store]\nretention_days = inf\n", "store.retention_days", "finite number"),
        ("[remediation]\nbreaker_cooldown_s = -inf\n", "remediation.breaker_cooldown_s", "finite number"),
        ("[judge.baseline]\nspread_k = nan\n", "judge.baseline.spread_k", "finite number"),
        ("[slurm]\ncommand_timeout_s = 1e20\n", "slurm.command_timeout_s", "less than or equal"),
        ("[http]\nrequest_timeout_s = inf\n", "http.request_timeout_s", "finite number"),
        ('[slurm]\npartition = "gpu debug"\n', "slurm.partition", "should match pattern"),
        ("[slurm]\nqos = \"it's\"\n", "slurm.qos", "should match pattern"),
        ('[slurm]\naccount = "ops\\nx"\n', "slurm.account", "should match pattern"),
        ('[slurm]\nreservation = "a b"\n', "slurm.reservation", "should match pattern"),
        ('[slurm]\nextra_sbatch_args = ["--comment=two words"]\n', "slurm.extra_sbatch_args.0", "pattern"),
        ('[slurm]\nextra_sbatch_args = ["hold"]\n', "slurm.extra_sbatch_args.0", "pattern"),
        ('[slurm]\nextra_sbatch_args = ["--comment=\\"x\\""]\n', "slurm.extra_sbatch_args.0", "pattern"),
        ('[remediation]\nreason_prefix = "health\\nd:"\n', "remediation.reason_prefix", "pattern"),
        ('[remediation]\nreason_prefix = "two words:"\n', "remediation.reason_prefix", "pattern"),
    ],
)
def test_bad_values_name_file_key_and_problem(tmp_path: Path, text: str, key: str, message: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as err:
        load_settings(path)
    text_of_error = str(err.value)
    assert str(path) in text_of_error
    assert f"  {key}: " in text_of_error
    assert message in text_of_error


def test_all_errors_reported_at_once(tmp_path: Path) -> None:
    path = write(tmp_path, "[http]\nport = 'x'\nhost = 3\n[scheduler]\nplan_interval_s = 0\n")
    with pytest.raises(ConfigError, match="3 invalid setting"):
        load_settings(path)


def test_toml_syntax_error(tmp_path: Path) -> None:
    path = write(tmp_path, "[http\nport = 1\n")
    with pytest.raises(ConfigError, match=r"not valid TOML: .*line 1"):
        load_settings(path)


def test_missing_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="config file not found"):
        load_settings(tmp_path / "nope.toml")


def test_env_overrides_one_key_and_keeps_the_rest(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write(tmp_path, "[http]\nhost = '127.0.0.1'\nport = 9000\n[probes.gemm]\ninterval_s = 5\n")
    monkeypatch.setenv("HEALTHD_HTTP__PORT", "9555")
    settings, _ = load_settings(path)
    assert settings.http.port == 9555
    assert settings.http.host == "127.0.0.1"
    assert settings.probes["gemm"].interval_s == 5


def test_bad_env_value_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HEALTHD_HTTP__PORT", "lots")
    with pytest.raises(ConfigError, match=r"http\.port"):
        load_settings(None)


def test_config_path_from_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write(tmp_path, "[http]\nport = 9100\n")
    monkeypatch.setenv("HEALTHD_CONFIG", str(path))
    settings, used = load_settings(None)
    assert used == path
    assert settings.http.port == 9100


def test_check_config_exit_codes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = write(tmp_path, "[http]\nport = 9100\n")
    assert main(["check-config", "--config", str(good)]) == 0
    assert "config OK" in capsys.readouterr().out
    bad = tmp_path / "bad.toml"
    bad.write_text("[store]\nretention_dayz = 3\n")
    assert main(["check-config", "--config", str(bad)]) == 2
    err = capsys.readouterr().err
    assert str(bad) in err and "store.retention_dayz" in err


def _documented_tables(data: dict[str, Any],
                       path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], dict[str, Any]]]:
    """Every table of the example with its plain (non-table) keys: the documented defaults."""
    plain = {k: v for k, v in data.items() if not isinstance(v, dict)}
    if path:
        yield path, plain
    for key, value in data.items():
        if isinstance(value, dict):
            yield from _documented_tables(value, (*path, key))


def _commented_probe_tables(text: str) -> dict[str, dict[str, Any]]:
    """``# [probes.ddp]`` blocks of commented-out keys: documented defaults of probes that do not run by default."""
    tables: dict[str, dict[str, Any]] = {}
    for name, body in re.findall(r"^# \[probes\.(\w+)\]\n((?:# \w+ = .*\n)+)", text, re.MULTILINE):
        tables[name] = tomllib.loads("\n".join(line[2:] for line in body.splitlines()))
    return tables


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k} = {_toml(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    return json.dumps(value)


def _effective(settings: object, path: tuple[str, ...]) -> dict[str, Any]:
    value: Any = settings
    for key in path:
        value = value[key] if isinstance(value, dict) else getattr(value, key)
    dumped: dict[str, Any] = value.model_dump(mode="json")
    return dumped


def test_a_partial_table_keeps_the_documented_values_of_the_keys_it_leaves_out(tmp_path: Path) -> None:
    """check-config's effective values equal healthd.example.toml's for every key a config does not set:
    for each documented table, a config with that table present but setting only one other key."""
    text = (REPO / "healthd.example.toml").read_text()
    example = tomllib.loads(text)
    tables = list(_documented_tables(example))
    tables += [(("probes", name), values) for name, values in _commented_probe_tables(text).items()]
    assert ("probes", "nccl") in dict(tables) and ("probes", "ddp") in dict(tables)
    for path, documented in tables:
        for set_key in documented:
            header = ".".join(path)
            others = {k: v for k, v in documented.items() if k != set_key}
            value = documented[set_key]
            settings, _ = load_settings(write(tmp_path, f"[{header}]\n{set_key} = {_toml(value)}\n"))
            effective = _effective(settings, path)
            assert {k: effective[k] for k in others} == others, (header, set_key)


def test_check_config_prints_the_documented_probe_defaults_for_a_partial_table(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(tmp_path, "[probes.nccl]\ninterval_s = 60\n[probes.gemm]\nenabled = true\n")
    assert main(["check-config", "--config", str(path)]) == 0
    out = capsys.readouterr().out
    assert "probe nccl: enabled, every 60 s, timeout 180 s" in out
    assert "probe gemm: enabled, every 900 s, timeout 180 s" in out


@pytest.mark.parametrize(("text", "key", "message"), [
    ('[passive]\nprometheus_url = "prometheus:9090"\n', "passive.prometheus_url", "needs the scheme http:// or https://"),
    ('[passive]\nprometheus_url = "http://"\n', "passive.prometheus_url", "has no host"),
    ("[passive]\nnode_regex = '^(['\n", "passive", "passive.node_regex is not a regular expression"),
    ("[passive]\nnode_regex = '^(a)$'\nnode_replacement = '\\2'\n", "passive", "refers to group 2"),
    ('[passive]\nusername = "u"\npassword_file = "/p"\nbearer_token_file = "/t"\n', "passive", "exclude each other"),
    ('[passive]\nusername = "u"\n', "passive", "username and passive.password_file go together"),
    ("[passive]\ntimeout_s = 120\n", "passive", "longer than passive.interval_s"),
    ("[passive.xid]\nfault = [79, 13]\n", "passive.xid", "XID(s) [13] in both passive.xid.fault and"),
    ('[passive.tls]\ncert_file = "/c"\n', "passive.tls", "cert_file and passive.tls.key_file go together"),
    ("[passive.queries]\nxid = ''\n", "passive.queries.xid", "at least 1 character"),
    ("[passive]\nhost_labels = ['bad-label']\n", "passive.host_labels.0", "should match pattern"),
])
def test_bad_passive_settings_are_named(tmp_path: Path, text: str, key: str, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_settings(write(tmp_path, text))
    assert f"  {key}: " in str(err.value)
    assert message in str(err.value)


def test_passive_is_off_unless_a_url_is_set(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert not load_settings(None)[0].passive.enabled
    path = write(tmp_path, '[passive]\nprometheus_url = "https://prom.example:9090/"\n')
    settings, _ = load_settings(path)
    assert settings.passive.enabled and settings.passive.prometheus_url == "https://prom.example:9090"
    assert main(["check-config", "--config", str(path)]) == 0
    assert "passive signals: https://prom.example:9090 every 60 s, timeout 10 s; fault XIDs [48," in (
        capsys.readouterr().out)


def test_the_pipeline_probe_is_off_by_default_and_keeps_its_own_defaults(tmp_path: Path) -> None:
    assert "pipeline" not in load_settings(None)[0].probes
    assert ("probes", "pipeline") in {("probes", n) for n in
                                      _commented_probe_tables((REPO / "healthd.example.toml").read_text())}
    settings, _ = load_settings(write(tmp_path, "[probes.pipeline]\nenabled = true\n"))
    pipeline = settings.probes["pipeline"]
    assert (pipeline.interval_s, pipeline.timeout_s, pipeline.nodes_per_job) == (21600.0, 300.0, 2)
