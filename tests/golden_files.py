"""Golden-file comparison: the file is written when missing (commit it), else compared line by line."""

from __future__ import annotations

import os
from pathlib import Path

GOLDEN = Path(__file__).parent / "golden"


def assert_golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if not path.exists() or os.environ.get("HEALTHD_UPDATE_GOLDEN") == "1":
        if os.environ.get("CI") == "true":
            raise AssertionError(f"golden file {path} is missing; generate it locally and commit it")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        return
    expected = path.read_text().splitlines()
    actual = text.splitlines()
    diffs = [f'line #{i + 1}: "{e}" -> "{a}"' for i, (e, a) in enumerate(zip(expected, actual, strict=False)) if e != a]
    if len(expected) != len(actual):
        diffs.append(f"{len(expected)} lines expected, {len(actual)} generated")
    assert not diffs, f"{path} differs (HEALTHD_UPDATE_GOLDEN=1 rewrites it):\n" + "\n".join(diffs)
