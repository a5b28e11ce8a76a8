"""``bench/scale.py`` on a CI-sized fleet: it runs through the real code paths and prints every key
(nothing is asserted about time: the figures for 1,000 to 10,000 nodes are in bench/RESULTS.md)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from bench.scale import KEYS

REPO = Path(__file__).resolve().parents[2]


def test_scale_bench_prints_every_key(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, str(REPO / "bench" / "scale.py"), "--nodes", "60", "--rounds", "1", "--days", "9",
         "--day-rounds", "1", "--store-results", "500", "--json", "--workdir", str(tmp_path)],
        capture_output=True, text=True, timeout=600, check=True, cwd=REPO,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
    )
    figures = json.loads(out.stdout.strip().splitlines()[-1])
    assert set(KEYS) <= set(figures)
    assert figures["nodes"] == 60 and figures["series"] > 0 and figures["scrape_bytes"] > 0
    assert all(isinstance(figures[k], int | float) and figures[k] >= 0 for k in KEYS)
