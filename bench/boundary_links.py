"""The cost of reading the links at job boundaries (issue 41): the node check's ``links`` step on a FAKE sysfs tree
of an 8-GPU, 8-HCA node (tests/fakes/sysfs.py: the kernel's layouts), and the daemon's judgement of boundary
documents carrying them (``Judge.evaluate``: the ``fabric`` and ``pcie`` sources read each document like a poll of
its node). Prints the step's median and worst time, the document's measurements, and the seconds per collect
tick of ``--per-tick`` documents (the collector's ``BOUNDARY_PER_TICK``, 200) on a fleet of ``--nodes``.

    .venv/bin/python bench/boundary_links.py [--nodes 10000] [--per-tick 200] [--ticks 5] [--reads 50]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import probes.boundary as b
from healthd.config import JudgeSettings
from healthd.judge.engine import Judge
from healthd.judge.model import MeasurementInput, RunInput
from healthd.model import Node, Outcome, RunKind
from tests.fakes import sysfs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=10_000)
    parser.add_argument("--per-tick", type=int, default=200)
    parser.add_argument("--ticks", type=int, default=5)
    parser.add_argument("--reads", type=int, default=50)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = sysfs.write(Path(tmp), sysfs.Node())
        s = b.Setup(context="prolog", node="n00000", job_id=1, job_uid=1000, expect_gpus=8, expect_uuids=(),
                    proc_root=Path(tmp) / "proc", sys_root=root)
        times, f = [], b.Findings()
        for _ in range(args.reads):
            f = b.Findings()
            t0 = time.perf_counter()
            b.check_links(s, b.Budget(5.0), f, None)
            times.append(time.perf_counter() - t0)
    print(f"links step: median {statistics.median(times) * 1e3:.1f} ms, worst {max(times) * 1e3:.1f} ms over "
          f"{args.reads} reads; {len(f.measurements)} measurements a document (8 HCAs, 8 GPUs)")
    template = [(m.name, m.value, dict(m.labels)) for m in f.measurements]
    nodes = [Node(f"n{i:05d}", "idle", gpus=8, gpu_type="h100", node_class="h100x8") for i in range(args.nodes)]
    judge = Judge(JudgeSettings())
    t, k = 10_000.0, 0
    for tick in range(args.ticks):
        runs = []
        for _ in range(args.per_tick):
            node = nodes[k % len(nodes)].name
            k += 1
            ms = tuple(MeasurementInput(name, value + (k // len(nodes) if name == "ib_port_counter" else 0), labels,
                                        node) for name, value, labels in template)
            runs.append(RunInput(f"boundary-{node}-epilog-{k}-1", "boundary", (node,), Outcome.PASS, "", t, ms,
                                 kind=RunKind.BOUNDARY))
        t0 = time.perf_counter()
        judge.evaluate(runs, nodes if tick == 0 else (), now=t)
        print(f"tick {tick}: {len(runs)} boundary documents judged in {time.perf_counter() - t0:.3f} s")
        t += 60.0


if __name__ == "__main__":
    main()
