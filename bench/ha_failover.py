"""Failover time of ``[ha]`` on a real MariaDB server (issue 39), measured, not asserted.

A private mariadbd (Debian's mariadb-server, as tests/integration/test_ha_mariadb.py starts it) and two
leases, ``a`` and ``b``, each renewing every ``--renew`` seconds with a ``--ttl`` lease. Each round, ``a``
leads, then stops renewing right after a renewal (``kill -9``); the figure is the time from that last
renewal to ``b`` leading, against the bound ``ttl + renew``. Each round also has ``a`` (paused, its own
clock frozen) try one drain after ``b`` leads: it must be refused (``refused`` counts them; ``doubled``
counts drains that went through twice).

    .venv/bin/python bench/ha_failover.py [--ttl 3] [--renew 1] [--rounds 5]
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import pymysql

from healthd.config import HaSettings
from healthd.errors import PolicyRefused
from healthd.ha.fence import FencedBackend
from healthd.ha.lease import Lease, connect, init_schema, target
from tests.integration.test_ha_mariadb import RecordingBackend, Server, _tool


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ttl", type=float, default=3.0)
    ap.add_argument("--renew", type=float, default=1.0)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    install, mariadbd, admin = _tool("mariadb-install-db"), _tool("mariadbd"), _tool("mariadb-admin")
    if not (install and mariadbd and admin):
        raise SystemExit("needs Debian's mariadb-server and mariadb-client (scripts/install-debian-deps.sh tests)")
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        user = ["--user=root"] if os.geteuid() == 0 else []
        subprocess.run([install, "--no-defaults", f"--datadir={base}/db", "--auth-root-authentication-method=socket",
                        "--skip-test-db", *user], check=True, capture_output=True, timeout=120)
        srv = Server(mariadbd, admin, base, user)
        srv.start()
        try:
            root = pymysql.connect(unix_socket=srv.socket, user="root", autocommit=True)
            with root.cursor() as cur:
                cur.execute("CREATE DATABASE healthd")
                cur.execute("CREATE USER 'healthd'@'127.0.0.1' IDENTIFIED BY 'bench'")
                cur.execute("GRANT ALL ON healthd.* TO 'healthd'@'127.0.0.1'")
            root.close()
            pw = base / "pw"
            pw.write_text("bench\n")
            pw.chmod(0o600)

            def settings(name: str) -> HaSettings:
                return HaSettings(mode="mariadb", url=f"mysql://healthd@127.0.0.1:{srv.port}/healthd",
                                  password_file=pw, instance_id=name, lease_ttl_s=args.ttl,
                                  renew_interval_s=args.renew, fence_margin_s=args.renew / 2, timeout_s=2.0)

            conn = connect(target(settings("a")), 2.0)
            init_schema(conn)
            conn.close()
            times: list[float] = []
            refused = doubled = 0
            for _ in range(args.rounds):
                a = Lease(settings("a"), clock=lambda: 0.0)  # its clock never sees its pause
                b = Lease(settings("b"))
                while not a.leading():
                    a.renew()
                    time.sleep(args.renew)
                b.renew()
                a.renew()
                last = time.monotonic()  # a's last renewal: killed now
                time.sleep(random.uniform(0, args.renew))  # b's renewals at any phase of a's
                b.renew()
                while not b.leading():
                    time.sleep(args.renew)
                    b.renew()
                times.append(time.monotonic() - last)
                backend = RecordingBackend()
                try:
                    FencedBackend(backend, a, "healthd:").drain("n1", "healthd: bench")  # type: ignore[arg-type]
                except PolicyRefused:
                    refused += 1
                FencedBackend(backend, b, "healthd:").drain("n1", "healthd: bench")  # type: ignore[arg-type]
                doubled += len(backend.calls) - 1
                b.release()
                a.close()
                b.close()
            print(f"ttl {args.ttl:g} s, renew {args.renew:g} s, bound ttl + renew = {args.ttl + args.renew:g} s, "
                  f"{args.rounds} rounds")
            print(f"failover: min {min(times):.2f} s, median {statistics.median(times):.2f} s, "
                  f"max {max(times):.2f} s")
            print(f"paused old leader's drain refused: {refused}/{args.rounds}; drains doubled: {doubled}")
        finally:
            srv.stop()


if __name__ == "__main__":
    main()
