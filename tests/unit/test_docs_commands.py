"""Every ``healthd ...`` command line in README.md and docs/*.md parses with the real command line parser
(``healthd.cli.parse_args``): a runbook that tells an operator, mid-incident, to type a command that does
not exist (``healthd recommendations``) or an option that is not there fails here.

Command lines are taken from shell blocks (a line starting with ``healthd``, ``/opt/healthd/bin/healthd``,
after an optional ``$``/``sudo [-u USER]``) and from inline code spans starting with ``healthd``. Synopses
are made concrete: ``[...]`` is kept without the brackets, ``FILE...`` is one file, ``{a,b}`` the first
choice, and each upper-case placeholder a value of its option's type (``PLACEHOLDERS``). A span that is
only ``healthd COMMAND`` names the command, which must exist.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import pytest

from healthd.cli import build_parser, parse_args

ROOT = Path(__file__).resolve().parents[2]
DOCS = [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md"]
_BLOCK_LINE = re.compile(r"^\s*(?:\$ )?(?:sudo(?: -u \S+)? )?((?:/opt/healthd/bin/)?healthd [^#\n]*)")
_SPAN = re.compile(r"`([^`]+)`")
_COMMAND = re.compile(r"^(?:/opt/healthd/bin/)?healthd (?:-|[a-z])")
_PLACEHOLDER = re.compile(r"^[A-Z][A-Z0-9_]*$")

PLACEHOLDERS = {
    # (the option before it, or "" for a positional) -> value; then by the placeholder's own name
    "--tool": "nccl-tests", "--time": "1714564800", "--timeout": "10", "--rounds": "1", "--limit": "5",
    "--since": "7d", "--until": "1d", "--node": "node1", "--nodes": "node[1-2]", "--context": "epilog",
    "NAME": "nccl", "NODE": "node1", "N2": "node2", "HOSTLIST": "node[1-2]",
}


@dataclass(frozen=True)
class Line:
    where: str
    text: str

    def __str__(self) -> str:
        return f"{self.where}: {self.text}"


def command_lines() -> list[Line]:
    found: list[Line] = []
    for path in DOCS:
        in_block = False
        for number, line in enumerate(path.read_text().splitlines(), 1):
            where = f"{path.relative_to(ROOT)}:{number}"
            if line.lstrip().startswith("```"):
                in_block = not in_block
                continue
            if in_block:
                if m := _BLOCK_LINE.match(line):
                    found.append(Line(where, m.group(1).strip()))
            else:
                found += [Line(where, span) for span in _SPAN.findall(line) if _COMMAND.match(span)]
    return found


def concrete(synopsis: str) -> list[str]:
    """The argv of a command line or synopsis, placeholders replaced (see the module's docstring)."""
    text = re.sub(r"\s*\[-- [^]]*\]", "", synopsis)
    text = text.replace("[", " ").replace("]", " ").replace("…", "x").replace("...", "")
    text = re.sub(r"\{(\w+),[^}]*\}", r"\1", text)
    words = shlex.split(text)[1:]
    for i, word in enumerate(words):  # the shell's part: a redirection, a pipe, a command list
        if word in {">", ">>", "<", "|", "&&", "||", ";", "2>&1"} or word.startswith((">", "2>")):
            words = words[:i]
            break
    argv: list[str] = []
    for word in words:
        if _PLACEHOLDER.match(word) or word.startswith("$"):
            previous = argv[-1] if argv and argv[-1].startswith("-") else ""
            word = PLACEHOLDERS.get(previous) or PLACEHOLDERS.get(word) or word.lower().strip("$")
        argv.append(word)
    return argv


def commands() -> set[str]:
    parser = build_parser()
    [sub] = [a for a in parser._actions if a.dest == "command"]
    return set(sub.choices or ())


LINES = command_lines()


def test_the_docs_have_command_lines() -> None:
    assert len(LINES) > 50
    assert {"status", "recommend", "ingest", "probe", "install-files", "doctor"} <= {
        concrete(line.text)[0] for line in LINES if concrete(line.text)[:1] != ["--version"]}


def problem(text: str) -> str | None:
    """Why the real parser refuses the command line ``text``, or ``None``."""
    argv = concrete(text)
    if len(argv) == 1 and not argv[0].startswith("-"):
        return None if argv[0] in commands() else f"no command {argv[0]!r}"
    try:
        parse_args(argv)
    except SystemExit as exc:
        return None if exc.code == 0 else f"the real parser refuses {argv}"
    return None


@pytest.mark.parametrize("line", LINES, ids=str)
def test_a_documented_command_line_parses(line: Line) -> None:
    assert problem(line.text) is None, f"{line}: {problem(line.text)}"


@pytest.mark.parametrize("text", ["healthd recommendations", "healthd status --bogus", "healthd drain NODE --force",
                                  "healthd probe nosuch --node NODE", "healthd ingest --tool nosuch FILE",
                                  "healthd audit --limit many"])
def test_a_wrong_command_line_is_caught(text: str) -> None:
    assert problem(text) is not None


@pytest.mark.parametrize("path", DOCS, ids=lambda p: p.name)
def test_no_table_is_split_by_a_blank_line(path: Path) -> None:
    """A blank line between two table rows ends the table: the rows after it render as text."""
    lines = path.read_text().splitlines()
    split = [i + 1 for i in range(1, len(lines) - 1)
             if not lines[i].strip() and lines[i - 1].startswith("|") and lines[i + 1].startswith("|")]
    assert split == [], f"{path.name}: blank line(s) inside a table at line(s) {split}"
