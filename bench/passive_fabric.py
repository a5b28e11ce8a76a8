"""The cost of issue 41's passive evidence at fleet scale: ``--nodes`` nodes of ``--hcas`` InfiniBand ports and 8
GPUs each; every poll, ``--flapping`` of the nodes have a port counter rising, every port's rate is read, every
GPU's activity and PCIe link, and 3% of the nodes hold a power brake on a busy GPU. Prints, per poll, the seconds
of ``FabricTracker.observe`` (the counters to increases) and of ``Judge.observe`` (every source of the seam,
passive included).

    .venv/bin/python bench/passive_fabric.py [--nodes 10000] [--hcas 8] [--polls 5]
"""

from __future__ import annotations

import argparse
import time

from healthd.config import JudgeSettings
from healthd.judge.engine import Judge
from healthd.model import Node
from healthd.passive.fabric import COUNTERS, FabricAnswers, FabricTracker
from healthd.passive.model import PassivePoll, PassiveSignal, Strength
from healthd.passive.names import Located
from healthd.passive.pcie import PcieLink


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=10_000)
    parser.add_argument("--hcas", type=int, default=8)
    parser.add_argument("--flapping", type=float, default=0.01)
    parser.add_argument("--polls", type=int, default=5)
    args = parser.parse_args()
    nodes = [Node(f"n{i:05d}", "idle", gpus=8, gpu_type="h100", node_class="h100x8") for i in range(args.nodes)]
    names = frozenset(n.name for n in nodes)
    devices = [f"mlx5_{d}" for d in range(args.hcas)]
    present = [Located(n.name, None, None, {"counter": c}, float(args.hcas)) for n in nodes for c in COUNTERS]
    links = [Located(n.name, None, None, {"device": d, "port": "1"}, 50e9 if i % 997 else 25e9)
             for i, n in enumerate(nodes) for d in devices]
    boot = [Located(n.name, None, None, {}, 1.7e9) for n in nodes]
    pcie = tuple(PcieLink(n.name, str(g), None, 16, 16, 5, 5) for n in nodes for g in range(8))
    braked = nodes[:: 33]
    busy = {(n.name, str(g)): (True, "graphics engine active 0.90") for n in nodes for g in range(8)}
    tracker = FabricTracker()
    judge = Judge(JudgeSettings())
    flapping = nodes[: int(args.flapping * len(nodes))]
    t = 1000.0
    for k in range(args.polls + 1):
        counters = [Located(n.name, None, None, {"__name__": "node_infiniband_link_downed_total", "device": "mlx5_0",
                                                 "port": "1"}, float(k + 1)) for n in flapping]
        start = time.perf_counter()
        fabric = tracker.observe(FabricAnswers(counters, present, links, None, boot), t)
        tracked = time.perf_counter() - start
        signals = tuple(PassiveSignal(n.name, "throttle", "throttle_power_brake", Strength.HINT, t, 136.0, "level", "2",
                                      None, "clock event reasons 0x88") for n in braked)
        poll = PassivePoll(t, True, signals, names, busy=busy, pcie=pcie, fabric=fabric)
        start = time.perf_counter()
        out = judge.observe(poll, nodes, now=t)
        judged = time.perf_counter() - start
        if k:
            print(f"poll {k}: {len(links):,} ports, {len(counters):,} rising, {len(pcie):,} GPU links, "
                  f"{len(signals)} brakes on {len(nodes):,} nodes: increases {tracked * 1000:.0f} ms, judge "
                  f"{judged * 1000:.0f} ms ({len(out.verdicts):,} verdicts changed, {len(out.recommendations)} "
                  "recommendations)", flush=True)
        t += 60


if __name__ == "__main__":
    main()
