"""One store for the CLI and the service (``healthd.service_store``), with real users: the store is the
service's (uid 65534 here, the ``healthd`` user of a site), the CLI runs as root (this test) or as another
user (``setpriv``), and the "service" afterwards writes the store as its own user (``setpriv``, plain
``sqlite3``) to show it still can. The service's config is found as the CLI finds it, through
``$HEALTHD_SERVICE_CONFIG`` standing for ``/etc/healthd/healthd.toml``."""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from healthd.config import SERVICE_STATE_DIR, load_settings
from healthd.store import Store

REPO = Path(__file__).resolve().parents[2]
SERVICE_UID = 65534
OTHER_UID = 65533
needs_root = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None,
                                reason="needs root and setpriv (users other than the caller)")


def healthd(*argv: str | Path, env: dict[str, str], as_uid: int | None = None) -> subprocess.CompletedProcess[str]:
    prefix = ["setpriv", f"--reuid={as_uid}", f"--regid={as_uid}", "--clear-groups"] if as_uid is not None else []
    return subprocess.run([*prefix, sys.executable, "-m", "healthd.cli", *map(str, argv)], cwd=REPO,
                          capture_output=True, text=True, timeout=120, check=False, env=env)


def as_service_write(store: Path) -> subprocess.CompletedProcess[str]:
    """The service writing its store as its own user, after the CLI was there."""
    code = (f"import sqlite3; db = sqlite3.connect({str(store)!r}); db.execute('CREATE TABLE t_after(x)'); "
            "db.execute('DROP TABLE t_after'); db.commit(); db.close()")
    return subprocess.run(["setpriv", f"--reuid={SERVICE_UID}", f"--regid={SERVICE_UID}", "--clear-groups",
                           "/usr/bin/python3", "-c", code], capture_output=True, text=True, timeout=60, check=False)


@pytest.fixture
def site() -> Iterator[tuple[Path, dict[str, str]]]:
    """A state directory owned by the service's user holding its store (closed: no -wal/-shm), and the
    service's config naming it, installed where the CLI looks (``$HEALTHD_SERVICE_CONFIG``)."""
    root = Path(tempfile.mkdtemp(prefix="healthd-svc-"))
    root.chmod(0o755)
    state = root / "state"
    state.mkdir(mode=0o750)
    Store(state / "healthd.sqlite").close()
    for path in (state, *state.iterdir()):
        os.chown(path, SERVICE_UID, SERVICE_UID)
    config = root / "healthd.toml"
    config.write_text(f'backend = "local"\nstate_dir = "{state}"\n')
    env = {k: v for k, v in os.environ.items() if not k.startswith("HEALTHD_")}
    env.update(HEALTHD_SERVICE_CONFIG=str(config), XDG_STATE_HOME=str(root / "xdg"))
    try:
        yield state, env
    finally:
        shutil.rmtree(root)


def owners(state: Path) -> dict[str, int]:
    return {p.name: p.stat().st_uid for p in state.iterdir()}


def test_the_service_config_sets_the_service_state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "healthd.toml"
    config.write_text('backend = "local"\n')
    other = tmp_path / "other.toml"
    other.write_text('backend = "local"\n')
    monkeypatch.delenv("STATE_DIRECTORY", raising=False)
    monkeypatch.delenv("HEALTHD_CONFIG", raising=False)
    monkeypatch.setenv("HEALTHD_SERVICE_CONFIG", str(config))
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))
    settings, found = load_settings(None)
    assert found == config and settings.state_dir == SERVICE_STATE_DIR
    assert load_settings(other)[0].state_dir == tmp_path / "xdg" / "healthd"
    monkeypatch.setenv("HEALTHD_STATE_DIR", str(tmp_path / "env"))
    assert load_settings(None)[0].state_dir == tmp_path / "env"


@needs_root
def test_root_reads_the_service_store_read_only_and_leaves_it_writable(site: tuple[Path, dict[str, str]]) -> None:
    state, env = site
    for argv in (["status", "--json"], ["recommend"], ["audit"], ["breaker"]):
        done = healthd(*argv, env=env)
        assert done.returncode == 0, (argv, done.stderr)
        assert set(owners(state).values()) == {SERVICE_UID}, (argv, owners(state))
    assert not (Path(env["XDG_STATE_HOME"]) / "healthd").exists()
    written = as_service_write(state / "healthd.sqlite")
    assert written.returncode == 0, written.stderr


@needs_root
def test_root_reads_while_the_service_holds_the_store_open(site: tuple[Path, dict[str, str]]) -> None:
    state, env = site
    code = (f"import sqlite3, sys, time; db = sqlite3.connect({str(state / 'healthd.sqlite')!r}); "
            "db.execute('CREATE TABLE t_open(x)'); db.commit(); print('open', flush=True); sys.stdin.read(); "
            "db.execute('DROP TABLE t_open'); db.commit()")
    service = subprocess.Popen(["setpriv", f"--reuid={SERVICE_UID}", f"--regid={SERVICE_UID}", "--clear-groups",
                                "/usr/bin/python3", "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               text=True)
    try:
        assert service.stdout is not None and service.stdout.readline() == "open\n"
        done = healthd("status", env=env)
        assert done.returncode == 0, done.stderr
        assert set(owners(state).values()) == {SERVICE_UID}, owners(state)
    finally:
        service.communicate("", timeout=60)
    assert service.returncode == 0


@needs_root
def test_root_writes_as_the_service_user(site: tuple[Path, dict[str, str]]) -> None:
    state, env = site
    done = healthd("breaker", "--reset", env=env)
    assert "breaker: refused: the breaker is not open" in done.stdout, done.stderr
    assert set(owners(state).values()) == {SERVICE_UID}, owners(state)
    audit = healthd("audit", "--json", env=env)
    assert '"breaker_close"' in audit.stdout
    assert as_service_write(state / "healthd.sqlite").returncode == 0


@needs_root
def test_another_user_is_refused_a_write_and_told_how(site: tuple[Path, dict[str, str]]) -> None:
    state, env = site
    state.chmod(0o755)
    (state / "healthd.sqlite").chmod(0o644)
    done = healthd("breaker", "--reset", env=env, as_uid=OTHER_UID)
    assert done.returncode == 1
    assert f"belongs to the service's user nobody (the owner of {state})" in done.stderr
    assert "sudo -u nobody healthd breaker ..." in done.stderr
    assert set(owners(state).values()) == {SERVICE_UID}


@needs_root
def test_a_store_nobody_reads_is_not_created(site: tuple[Path, dict[str, str]], tmp_path: Path) -> None:
    state, env = site
    mine = tmp_path / "mine.toml"
    mine.write_text(f'backend = "local"\nstate_dir = "{tmp_path / "mine"}"\n')
    fixture = REPO / "tests" / "fixtures" / "tools" / "nccl_tests" / "v2.19_all_reduce_8xa100.txt"
    done = healthd("ingest", "--config", mine, "--tool", "nccl-tests", fixture, env=env)
    assert done.returncode == 1
    assert f"refused to create {tmp_path / 'mine' / 'healthd.sqlite'}: no service reads it; " \
           f"the service's store is {state / 'healthd.sqlite'}" in done.stderr
    assert not (tmp_path / "mine").exists()


@needs_root
def test_a_store_at_an_older_schema_is_not_migrated_by_a_reader(site: tuple[Path, dict[str, str]]) -> None:
    state, env = site
    db = sqlite3.connect(state / "healthd.sqlite")
    version = db.execute("PRAGMA user_version").fetchone()[0]
    db.execute(f"PRAGMA user_version = {version - 1}")
    db.commit()
    db.close()
    done = healthd("status", env=env)
    assert done.returncode == 1 and "read-only commands never migrate a store" in done.stderr
    db = sqlite3.connect(state / "healthd.sqlite")
    assert db.execute("PRAGMA user_version").fetchone()[0] == version - 1
    db.close()


@needs_root
def test_check_config_checks_the_results_dir_against_the_service_user(site: tuple[Path, dict[str, str]]) -> None:
    state, env = site
    results = state / "results"
    results.mkdir(mode=0o750)
    os.chown(results, SERVICE_UID, SERVICE_UID)
    done = healthd("check-config", env=env)
    assert done.returncode == 0, done.stderr
    assert f"service user: nobody (uid {SERVICE_UID}; the owner of {state})" in done.stdout
    os.chown(results, 0, 0)
    done = healthd("check-config", env=env)
    assert done.returncode == 2 and f"belongs to uid 0, not to healthd (uid {SERVICE_UID})" in done.stderr


@needs_root
def test_a_member_of_the_service_group_reads_a_stopped_service_store(site: tuple[Path, dict[str, str]]) -> None:
    """The directory 0750 (the unit's StateDirectoryMode): a group member may read but not create the -shm file
    SQLite's read-only WAL open needs; with no -wal (the service stopped) the store is read as it is."""
    state, env = site
    (state / "healthd.sqlite").chmod(0o640)
    prefix = ["setpriv", f"--reuid={OTHER_UID}", f"--regid={OTHER_UID}", f"--groups={SERVICE_UID}"]
    done = subprocess.run([*prefix, sys.executable, "-m", "healthd.cli", "audit"], cwd=REPO, capture_output=True,
                          text=True, timeout=120, check=False, env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "no remediation actions recorded\n"
    assert set(owners(state)) == {"healthd.sqlite"}
