"""The smallest stage-output damage the pipeline probe's gradient check catches, per stage position (issue 40).

For each layout (``--nproc 2``: two stages; ``--nproc 4 --stages 4``) and each stage position, runs the real
probe (gloo ranks on this host) with ``HEALTHD_PROBE_FAULT=corrupt:<rank>`` and the damage's relative size set
by ``HEALTHD_PROBE_CORRUPT_RELATIVE``: first at ``--probe-size`` (the largest stage gradient error it causes,
``error``, gives the error per unit of damage), then just under and just over the size that error predicts at
the check's tolerance, so the row shows the smallest damage detected bracketed by two real runs.

    .venv/bin/python bench/pipeline_corrupt.py [--layouts 2,4] [--probe-size 1e-3] [--tolerance 1e-3]

Prints one Markdown row per stage position: layout, rank, stage (first / middle / last), the gradient error per
unit of damage, the predicted threshold, the outcome just under and just over it, and the default damage's
(``CORRUPT_RELATIVE``) error.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from probes.pipeline import CORRUPT_RELATIVE, CORRUPT_RELATIVE_ENV

REPO = Path(__file__).resolve().parents[1]
MARGIN = 1.25
"""The runs bracketing the predicted threshold: at threshold / MARGIN and threshold x MARGIN."""


def run_probe(nproc: int, rank: int, relative: float, tolerance: float) -> dict[str, Any]:
    four = ["--stages", str(nproc), "--n-layer", str(max(2, nproc))] if nproc > 2 else []
    env = {**os.environ, "HEALTHD_PROBE_FAULT": f"corrupt:{rank}", CORRUPT_RELATIVE_ENV: repr(relative)}
    done = subprocess.run([sys.executable, "-m", "probes", "pipeline", "--nproc", str(nproc), *four, "--steps", "1",
                           "--warmup", "0", "--no-links", "--tolerance", repr(tolerance)],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=600, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"the probe exited {done.returncode}: {done.stderr[-2000:]}")
    doc: dict[str, Any] = json.loads(done.stdout)
    return doc


def largest_error(doc: dict[str, Any]) -> float:
    return max(float(row["gradient_error"]) for row in doc["params"]["stage_times"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--layouts", default="2,4", help="ranks per run, one stage each (default 2,4)")
    parser.add_argument("--probe-size", type=float, default=1e-3)
    parser.add_argument("--tolerance", type=float, default=1e-3)
    args = parser.parse_args(argv)
    print("| ranks (stages) | rank | stage | gradient error per unit of damage | smallest damage detected "
          f"(predicted) | at it / {MARGIN:g} | at it x {MARGIN:g} | error at the default damage "
          f"{CORRUPT_RELATIVE:g} |")
    print("|---|---|---|---|---|---|---|---|")
    for nproc in (int(n) for n in args.layouts.split(",")):
        for rank in range(nproc):
            where = "first" if rank == 0 else "last" if rank == nproc - 1 else "middle"
            per_unit = largest_error(run_probe(nproc, rank, args.probe_size, args.tolerance)) / args.probe_size
            threshold = args.tolerance / per_unit
            under = run_probe(nproc, rank, threshold / MARGIN, args.tolerance)["outcome"]
            over = run_probe(nproc, rank, threshold * MARGIN, args.tolerance)["outcome"]
            default = largest_error(run_probe(nproc, rank, CORRUPT_RELATIVE, args.tolerance))
            print(f"| {nproc} ({nproc}) | {rank} | {where} | {per_unit:.2f} | {threshold:.2e} | {under} | {over} "
                  f"| {default:.3g} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
