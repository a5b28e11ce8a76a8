"""The README's module table and docs/architecture.md match the tree: every path they name exists, every
dotted name in the architecture page resolves, and every top-level module or package of ``healthd`` is
named in one of them."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
ARCHITECTURE = ROOT / "docs" / "architecture.md"
TABLE_HEADER = "| Module | Owns |"
PATH_ROOTS = ("healthd", "probes", "tests", "docs", "bench", "scripts", "grafana", "systemd")
UNLISTED = {"__init__.py", "__main__.py", "_data", "__pycache__"}

_CODE = re.compile(r"`([^`]+)`")
_PATH = re.compile(rf"^(?:{'|'.join(PATH_ROOTS)})/[\w./-]*$")
_FILE_NAME = re.compile(r"^\w+\.py$")
_DOTTED = re.compile(r"^(?:healthd|probes)(?:\.[A-Za-z_]\w*)+$")


def module_table() -> list[tuple[str, str]]:
    """The README's "How it works" table as (module cell, owns cell) rows."""
    lines = README.read_text().splitlines()
    start = lines.index(TABLE_HEADER)
    rows: list[tuple[str, str]] = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        assert len(cells) == 2, f"a module table row has {len(cells)} cells, not 2: {line}"
        rows.append((cells[0], cells[1]))
    assert rows, "the README has no module table"
    return rows


def code_spans(text: str) -> list[str]:
    return _CODE.findall(text)


def is_path(token: str) -> bool:
    return "<" not in token and bool(_PATH.match(token))


def exists(path: str) -> bool:
    target = ROOT / path
    return target.is_dir() if path.endswith("/") else target.is_file()


def table_paths() -> set[str]:
    return {t for module, _ in module_table() for t in code_spans(module)}


def architecture_paths() -> set[str]:
    return {t for t in code_spans(ARCHITECTURE.read_text()) if is_path(t)}


def test_the_module_cells_name_only_paths_that_exist() -> None:
    named = table_paths()
    assert {t for t in named if not is_path(t)} == set(), "the Module column names only paths"
    assert {t for t in named if not exists(t)} == set()


def test_the_files_a_row_names_exist() -> None:
    missing = []
    for module, owns in module_table():
        dirs = [t for t in code_spans(module) if t.endswith("/")]
        for token in code_spans(owns):
            if is_path(token):
                if not exists(token):
                    missing.append(token)
            elif _FILE_NAME.match(token) and not any((ROOT / d / token).is_file() for d in dirs):
                missing.append(f"{token} in {', '.join(dirs) or '(no package in its row)'}")
    assert missing == []


def test_the_readme_links_the_architecture_page() -> None:
    assert "(docs/architecture.md)" in README.read_text()


def test_the_architecture_page_names_only_paths_that_exist() -> None:
    assert {p for p in architecture_paths() if not exists(p)} == set()


def resolve(dotted: str) -> object:
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj: object = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for attr in parts[cut:]:
            obj = getattr(obj, attr)
        return obj
    raise ModuleNotFoundError(dotted)


def dotted_names() -> list[str]:
    """Dotted names of modules, classes and functions (not files such as ``healthd.example.toml``)."""
    return sorted({t for t in code_spans(ARCHITECTURE.read_text()) if _DOTTED.match(t) and not (ROOT / t).exists()})


@pytest.mark.parametrize("dotted", dotted_names())
def test_the_architecture_page_names_what_the_code_has(dotted: str) -> None:
    resolve(dotted)


def top_level() -> list[str]:
    """Every module and package directly under ``healthd/``, as the docs would name it."""
    found = []
    for entry in sorted((ROOT / "healthd").iterdir()):
        if entry.name in UNLISTED:
            continue
        if entry.is_file() and entry.suffix == ".py":
            found.append(f"healthd/{entry.name}")
        elif entry.is_dir() and (entry / "__init__.py").is_file():
            found.append(f"healthd/{entry.name}/")
    assert "healthd/daemon.py" in found and "healthd/store/" in found
    return found


def test_every_top_level_module_is_documented() -> None:
    named = table_paths() | architecture_paths()

    def documented(module: str) -> bool:
        if module.endswith("/"):
            return any(p.startswith(module) for p in named)
        return module in named

    assert [m for m in top_level() if not documented(m)] == []
