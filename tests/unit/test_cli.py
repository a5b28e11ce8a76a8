from __future__ import annotations

import subprocess
import sys

import pytest

from healthd.cli import parse_args


@pytest.mark.parametrize("argv", [
    ["probe", "nccl", "--json", "--sizes", "1M"],
    ["probe", "--json", "nccl", "--sizes", "1M"],
    ["probe", "nccl", "--sizes", "1M", "--json"],
    ["probe", "nccl", "--json", "--", "--sizes", "1M"],
])
def test_probe_options_in_any_order(argv: list[str]) -> None:
    args = parse_args(argv)
    assert args.name == "nccl" and args.json is True
    assert [a for a in args.probe_args if a != "--"] == ["--sizes", "1M"]


def test_other_commands_refuse_unknown_options(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        parse_args(["check-config", "--sizes", "1M"])
    assert exc.value.code == 2
    assert "unrecognized arguments: --sizes 1M" in capsys.readouterr().err


def test_a_closed_pipe_ends_quietly() -> None:
    code = (
        "import argparse, sys\n"
        "from healthd import cli\n"
        "def flood(args):\n"
        "    for i in range(200000):\n"
        "        print('line', i)\n"
        "    return 0\n"
        "cli.parse_args = lambda argv=None: argparse.Namespace(func=flood)\n"
        "sys.exit(cli.main([]))\n"
    )
    pipeline = subprocess.run(
        ["bash", "-o", "pipefail", "-c", f'"{sys.executable}" -c "$CODE" | head -2'],
        env={"CODE": code, "PATH": "/usr/bin:/bin"}, capture_output=True, text=True, timeout=60, check=False)
    assert pipeline.stdout == "line 0\nline 1\n"
    assert "Traceback" not in pipeline.stderr and "BrokenPipeError" not in pipeline.stderr, pipeline.stderr
    assert pipeline.returncode == 0, pipeline.stderr
