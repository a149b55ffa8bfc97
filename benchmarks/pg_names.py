#!/usr/bin/env python3
"""What names used once cost a PostgreSQL node: rows, size and the cycle's time.

Starts a throwaway PostgreSQL server (``celery_redlock.testing.postgres``: the
distribution's binaries, a free loopback port, fsync off), locks and releases
``--n`` distinct names once each, then reports the table's rows (one fence row
per name stays, for ``redlock_fence_retention``), its size with its indexes,
and the mean cycle::

    python benchmarks/pg_names.py              # 100,000 names, about 1.5 min
    python benchmarks/pg_names.py --n 20000
"""

from __future__ import annotations

import argparse
import time

from celery_redlock import Redlock
from celery_redlock.testing.postgres import PostgresServers


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=100_000, help="names, each locked once")
    n = ap.parse_args().n
    with PostgresServers(1) as servers:
        server = servers[0]
        client = Redlock([server.url], node_timeout=2.0, key_prefix="names")
        started = time.perf_counter()
        for i in range(n):
            client.release(client.acquire(f"job:{i}", ttl=30))
        took = time.perf_counter() - started
        client.close()
        (rows,) = server.sql("SELECT count(*) FROM redlock.kv")[0]
        total, heap, indexes = server.sql(
            "SELECT pg_total_relation_size('redlock.kv'), pg_relation_size('redlock.kv'), "
            "pg_indexes_size('redlock.kv')"
        )[0]
    print(
        f"{n} names in {took:.1f} s ({took / n * 1e3:.3f} ms a cycle): {rows} rows, "
        f"{total / 1e6:.1f} MB (table {heap / 1e6:.1f}, indexes {indexes / 1e6:.1f}), "
        f"{total / n:.0f} B a name"
    )


if __name__ == "__main__":
    main()
