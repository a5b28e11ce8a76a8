"""The judge's cost of a passive poll at fleet scale (issue 29): ``--nodes`` 8-GPU nodes, ``--throttled`` of
them with a thermal-throttle level on every GPU (a hot machine room: the worst steady load of signals), and a
handful of new XID 79s each poll. Prints the seconds per ``Judge.observe``.

    .venv/bin/python bench/passive_judge.py [--nodes 10000] [--throttled 0.4] [--polls 5]
"""

from __future__ import annotations

import argparse
import time

from healthd.config import JudgeSettings
from healthd.judge.engine import Judge
from healthd.model import Node
from healthd.passive.model import PassivePoll, PassiveSignal, Strength


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=10_000)
    parser.add_argument("--throttled", type=float, default=0.4)
    parser.add_argument("--polls", type=int, default=5)
    args = parser.parse_args()
    nodes = [Node(f"n{i:05d}", "idle", gpus=8, gpu_type="h100", node_class="h100x8") for i in range(args.nodes)]
    names = frozenset(n.name for n in nodes)
    judge = Judge(JudgeSettings())
    t = 1000.0
    judge.observe(PassivePoll(t, True, (), names), nodes, now=t)
    hot = nodes[: int(args.throttled * len(nodes))]
    for k in range(args.polls):
        t += 60
        signals = tuple(PassiveSignal(n.name, "throttle", "throttle_thermal", Strength.HINT, t, 64.0, "level", str(g),
                                      None, "thermal") for n in hot for g in range(8))
        signals += tuple(PassiveSignal(nodes[i].name, "xid", "xid_79", Strength.FAULT, t, 79.0, "event", "3", None,
                                       "xid 79") for i in range(5 * k, 5 * k + 5))
        start = time.perf_counter()
        out = judge.observe(PassivePoll(t, True, signals, names), nodes, now=t)
        print(f"poll {k + 1}: {len(signals):,} signals on {len(nodes):,} nodes: {time.perf_counter() - start:.2f} s "
              f"({len(out.verdicts):,} verdicts changed, {len(out.requests)} re-probes asked)", flush=True)


if __name__ == "__main__":
    main()
