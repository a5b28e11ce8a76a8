"""Fuzz every parser on the collect path with mutations of the real fixtures (issue 19).

Usage: ``PYTHONPATH=. python bench/fuzz.py [--cases 20000] [--seed 0] [--target NAME]``. Prints the
cases per target, the crashes (anything but ``ParseError``, with the case to reproduce it), the
slowest parse and the cases over one second; exits 1 when there is a crash or a case over 1 s.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter

import structlog

from tests.fuzzing import Case, cases, run_case, targets

SLOW_S = 1.0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=20_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--target", choices=sorted(targets()), default=None)
    args = parser.parse_args(argv)
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(50))
    started = time.monotonic()
    crashes: list[Case] = []
    slow: list[Case] = []
    slowest: Case | None = None
    per_target: Counter[str] = Counter()
    for target, fixture, seed in cases(args.cases, args.seed):
        if args.target is not None and target != args.target:
            continue
        case = run_case(target, fixture, seed)
        per_target[target] += 1
        if case.crash is not None:
            crashes.append(case)
        if case.seconds > SLOW_S:
            slow.append(case)
        if slowest is None or case.seconds > slowest.seconds:
            slowest = case
    total = sum(per_target.values())
    spread = ", ".join(f"{t} {n}" for t, n in sorted(per_target.items()))
    print(f"{total} cases in {time.monotonic() - started:.0f} s: {spread}")
    print(f"crashes: {len(crashes)}")
    for c in crashes[:50]:
        print(f"  {c.target} fixture {c.fixture} seed {c.seed}: {c.crash}")
    if slowest is not None:
        where = f"{slowest.target} fixture {slowest.fixture} seed {slowest.seed}"
        print(f"max parse time: {slowest.seconds:.3f} s ({where})")
    print(f"cases over {SLOW_S:g} s: {len(slow)}")
    for c in slow[:20]:
        print(f"  {c.target} fixture {c.fixture} seed {c.seed}: {c.seconds:.2f} s")
    return 1 if crashes or slow else 0


if __name__ == "__main__":
    sys.exit(main())
