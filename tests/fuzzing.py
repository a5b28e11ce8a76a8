"""Mutations of the real fixtures for the fuzz tests and ``bench/fuzz.py`` (issue 19).

Every target takes text and may raise ``ParseError`` and nothing else; a mutation is a pure function of
a seeded ``random.Random`` and the fixture text, so any case is reproduced from (target, fixture, seed).
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from healthd.errors import ParseError
from healthd.parsers.expand import expand_result
from healthd.parsers.healthd_json import parse_result
from healthd.parsers.nccl_transport import parse_nccl_debug
from healthd.parsers.tools import TOOLS
from healthd.parsers.topology import parse_show_topology, parse_topology_conf, parse_topology_yaml

FIXTURES = Path(__file__).resolve().parent / "fixtures"
TOOL_DIRS = {"nccl-tests": "nccl_tests", "param-comms": "param", "param-compute": "param",
             "ddp-benchmark": "ddp_benchmark", "horovod": "horovod", "dcgmi": "dcgmi"}
HOSTILE_NUMBERS = ("nan", "NaN", "inf", "-inf", "Infinity", "-Infinity", "1e400", "-1e400", "9" * 400, "-" + "9" * 40,
                   "18446744073709551616", "1e-400", "0", "-0", "0x10", "1_000")
LARGE_FINITE_NUMBERS = ("1e300", "-1e300", "1.7976931348623157e308", "1e200", "9" * 25, "4e-320")
"""Finite as floats, but their products, sums or conversions to int and back leave the float range
(``int too large to convert to float``) or turn into ``inf``."""
HOSTILE_SNIPPETS = ("\\ud800", "\ud800", "\x00", "\x1b[2J", "\u202e", "\ufeff", "\r", "\t" * 50, '"', "\\", "}", "]",
                    "{", "[", ":", "NCCL INFO ", "host:1:2 [0] NCCL INFO ")
MAX_CASE_CHARS = 2_000_000


def _tool_fixtures(tool: str) -> list[str]:
    folder = FIXTURES / "tools" / TOOL_DIRS[tool]
    part = {"param-comms": "comms", "param-compute": "compute"}.get(tool, "")
    return [p.read_text(errors="replace") for p in sorted(folder.iterdir())
            if p.suffix in (".txt", ".json") and part in p.name]


def _result_documents() -> list[str]:
    docs = [p.read_text() for p in sorted((FIXTURES / "promtool" / "probe_results").glob("*.json"))]
    nccl = json.loads((FIXTURES / "nccl_debug" / "probe_nccl_gloo_result.json").read_text())
    docs.append(json.dumps(nccl))
    debug_lines = (FIXTURES / "nccl_debug" / "nccl-1189_ib_gdrdma_cumem.log").read_text().splitlines()[:80]
    nccl["params"]["nccl_debug"] = {"NCCL_DEBUG": "INFO", "ranks": [{"rank": 0, "node": "n1", "lines": debug_lines}]}
    nccl["params"]["expect_transport"] = ["ib"]
    docs.append(json.dumps(nccl))
    output = (FIXTURES / "tools" / "nccl_tests" / "v2.16_all_reduce_2x8_h100_mpirun.txt").read_text()
    docs.append(json.dumps({
        "schema_version": 1, "probe": "nccl_tests", "run_id": "r1", "outcome": "pass", "started_at": 1000.0,
        "finished_at": 1010.0, "nodes": ["n1", "n2"],
        "params": {"tasks": 2, "gpus": 8, "raw_outputs": [
            {"program": "all_reduce_perf", "collective": "all_reduce", "output": output, "error": "", "exit_code": 0}]},
    }))
    return docs


_TOPOLOGY_CONF = """# two leaves under a spine, as scripts/slurm-test-cluster.sh writes it
SwitchName=leaf1 Nodes=node[1-3]
SwitchName=leaf2 \\
    Nodes=node[4-5]  # continued
SwitchName=spine Switches=leaf[1-2]
"""


def _topology_yaml(text: str) -> object:
    return parse_topology_yaml(text)


def _read_result(text: str) -> None:
    expand_result(parse_result(text))


@cache
def targets() -> dict[str, tuple[Callable[[str], object], list[str]]]:
    """Target name → (function of text, the real fixtures it is fed mutations of)."""
    out: dict[str, tuple[Callable[[str], object], list[str]]] = {
        tool: (lambda text, t=tool: TOOLS[t].results(text, node="n1", at=1000.0), _tool_fixtures(tool))
        for tool in TOOLS
    }
    out["nccl-debug"] = (parse_nccl_debug, [p.read_text() for p in sorted((FIXTURES / "nccl_debug").glob("*.log"))])
    out["result-document"] = (_read_result, _result_documents())
    shown = [p.read_text() for p in sorted((FIXTURES / "slurm").glob("*/topology.*.txt")) if p.read_text().strip()]
    out["scontrol-show-topology"] = (parse_show_topology, [t for t in shown if not t.startswith("%YAML")])
    out["topology-yaml"] = (_topology_yaml, [t for t in shown if t.startswith("%YAML")])
    out["topology-conf"] = (parse_topology_conf, [_TOPOLOGY_CONF])
    return out


def _splice(text: str, rng: random.Random, insert: str) -> str:
    at = rng.randrange(len(text) + 1)
    return text[:at] + insert + text[at:]


def _numbers(text: str, rng: random.Random) -> str:
    import re

    spots = [m.span() for m in re.finditer(r"-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?", text[:200_000])]
    if not spots:
        return _splice(text, rng, rng.choice(HOSTILE_NUMBERS))
    for _ in range(rng.randint(1, 4)):
        start, end = rng.choice(spots)
        if end <= len(text):
            text = text[:start] + rng.choice(HOSTILE_NUMBERS + LARGE_FINITE_NUMBERS) + text[end:]
    return text


def _long_line(text: str, rng: random.Random) -> str:
    unit = rng.choice(["a", " ", "#", "9", "x:", "[", "|", "-", "1.0 ", "NCCL ", "a" * 7 + ":"])
    return _splice(text, rng, unit * (rng.choice([10_000, 200_000, MAX_CASE_CHARS]) // len(unit)))


def _deep(text: str, rng: random.Random) -> str:
    depth = rng.choice([100, 1_000, 5_000, 50_000])
    opener = rng.choice(["[", '{"a":'])
    closer = "]" if opener == "[" else "}"
    return _splice(text, rng, opener * depth + "1" + closer * depth)


def _repeats(line: str) -> int:
    return max(1, MAX_CASE_CHARS // (len(line) + 1))


def _lines(text: str, rng: random.Random) -> str:
    lines = text.splitlines()
    if not lines:
        return text
    kind = rng.randrange(4)
    if kind == 0:
        rng.shuffle(lines)
    elif kind == 1:
        i = rng.randrange(len(lines))
        lines[i:i] = [lines[i]] * min(rng.randint(2, 2_000), _repeats(lines[i]))
    elif kind == 2:
        i = rng.randrange(len(lines))
        del lines[i:i + rng.randint(1, 20)]
    else:
        i = rng.randrange(len(lines))
        lines[i] = lines[i] * min(rng.randint(2, 500), _repeats(lines[i]))
    return "\n".join(lines)


def _bytes(text: str, rng: random.Random) -> str:
    for _ in range(rng.randint(1, 20)):
        if not text:
            break
        at = rng.randrange(len(text))
        op = rng.randrange(3)
        if op == 0:
            text = text[:at] + chr(rng.choice([rng.randrange(32, 127), rng.randrange(0, 0x110000)])) + text[at + 1:]
        elif op == 1:
            text = text[:at] + text[at + rng.randint(1, 50):]
        else:
            text = text[:at] + rng.choice(HOSTILE_SNIPPETS) + text[at:]
    return text


def _truncate(text: str, rng: random.Random) -> str:
    return text[: rng.randrange(len(text) + 1)]


MUTATIONS: tuple[Callable[[str, random.Random], str], ...] = (_numbers, _long_line, _deep, _lines, _bytes, _truncate)


def mutate(text: str, seed: int) -> str:
    """One to three mutations of ``text``, chosen by ``seed``; at most ``MAX_CASE_CHARS``."""
    rng = random.Random(seed)
    for _ in range(rng.randint(1, 3)):
        text = rng.choice(MUTATIONS)(text, rng)[:MAX_CASE_CHARS]
    return text


@dataclass(frozen=True)
class Case:
    target: str
    fixture: int
    seed: int
    seconds: float
    crash: str | None


def run_case(target: str, fixture: int, seed: int) -> Case:
    """Parse one mutation; ``crash`` is the exception other than ``ParseError`` it raised, if any;
    ``seconds`` the CPU time the parse took (a loaded machine does not make it slower)."""
    fn, fixtures = targets()[target]
    text = mutate(fixtures[fixture % len(fixtures)], seed)
    started = time.process_time()
    crash = None
    try:
        fn(text)
    except ParseError:
        pass
    except Exception as exc:
        crash = f"{type(exc).__name__}: {str(exc)[:200]}"
    return Case(target, fixture % len(fixtures), seed, time.process_time() - started, crash)


def cases(total: int, seed: int = 0) -> Iterator[tuple[str, int, int]]:
    """``total`` (target, fixture, seed) triples spread over every target, reproducible from ``seed``."""
    rng = random.Random(seed)
    names = sorted(targets())
    for i in range(total):
        target = names[i % len(names)]
        yield target, rng.randrange(1 << 16), rng.randrange(1 << 62)
