#!/usr/bin/env python3
"""What the shape of a PostgreSQL lease costs, one uncontended cycle of one name.

Starts a throwaway PostgreSQL server (``celery_redlock.testing.postgres``: fsync
off), installs the node's schema, and times four shapes through psycopg, each
on a connection of its own, in interleaved blocks:

* ``floor``: the raw lease table of ``benchmarks/adapters.py`` (one row a name,
  its fence in the row; an upsert takes it, an update frees it);
* ``node``: the node's own two functions (``acquire_plain``, ``release_plain``):
  the lock key and the fence key are two rows of the key table;
* ``no-fence``: the same two functions with no fence written;
* ``one-row``: a lease row that carries its fence, kept and reused (the
  floor's shape), behind the same PL/pgSQL wrapper and advisory lock as
  ``node``.

Each line gives the mean wall time of a cycle, the server backend's CPU time
(``/proc/<pid>/schedstat``, Linux) and both as ratios to ``floor``::

    python benchmarks/pg_shapes.py                # 5 blocks of 2,000 cycles each
    python benchmarks/pg_shapes.py --cycles 500
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import psycopg

from celery_redlock.core.nodes.postgres.schema import install_sql
from celery_redlock.testing.postgres import PostgresServers

ONE_ROW = """
CREATE TABLE shape_lease (key text PRIMARY KEY, holder text, fence bigint NOT NULL,
                          expires_at timestamptz NOT NULL);
CREATE FUNCTION shape_acquire(k text, owner text, px bigint) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    granted bigint;
BEGIN
    IF pg_advisory_xact_lock(hashtextextended(redlock.tag(k), 0)) IS NULL THEN NULL; END IF;
    INSERT INTO shape_lease AS t VALUES (k, owner, 1, clock_timestamp() + px * interval '1 ms')
    ON CONFLICT (key) DO UPDATE
       SET holder = EXCLUDED.holder, fence = t.fence + 1, expires_at = EXCLUDED.expires_at
     WHERE t.expires_at <= clock_timestamp()
    RETURNING t.fence INTO granted;
    RETURN CASE WHEN granted IS NULL THEN '[0]' ELSE '[1,"' || granted || '"]' END;
END $$;
CREATE FUNCTION shape_release(k text, owner text) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    n integer;
BEGIN
    IF pg_advisory_xact_lock(hashtextextended(redlock.tag(k), 0)) IS NULL THEN NULL; END IF;
    UPDATE shape_lease SET expires_at = '-infinity'
     WHERE key = k AND holder = owner AND expires_at > clock_timestamp();
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n::text;
END $$;
"""

Cycle = Callable[[psycopg.Connection], None]


def floor(conn: psycopg.Connection) -> None:
    taken = conn.execute(
        "INSERT INTO bench_lease AS l (name, owner, fence, expires_at) VALUES"
        " (%s, 'me', 1, clock_timestamp() + %s * interval '1 ms')"
        " ON CONFLICT (name) DO UPDATE SET owner = EXCLUDED.owner, fence = l.fence + 1,"
        " expires_at = EXCLUDED.expires_at WHERE l.expires_at < clock_timestamp()"
        " RETURNING fence",
        ("f", 10000),
    ).fetchone()
    assert taken is not None
    conn.execute("UPDATE bench_lease SET expires_at = '-infinity' WHERE name = %s", ("f",))


def node(retention: str) -> Cycle:
    def cycle(conn: psycopg.Connection) -> None:
        now_us = str(time.time_ns() // 1000)
        args = ("s:lock:{n}", "s:fence:{n}", "me", 10000, retention, now_us)
        reply = conn.execute("SELECT redlock.acquire_plain(%s, %s, %s, %s, %s, %s)", args)
        assert reply.fetchone()[0].startswith("[1")
        freed = conn.execute("SELECT redlock.release_plain(%s, %s)", ("s:lock:{n}", "me"))
        assert freed.fetchone()[0] == "1"

    return cycle


def one_row(conn: psycopg.Connection) -> None:
    reply = conn.execute("SELECT shape_acquire(%s, %s, %s)", ("s:lock:{r}", "me", 10000))
    assert reply.fetchone()[0].startswith("[1")
    freed = conn.execute("SELECT shape_release(%s, %s)", ("s:lock:{r}", "me"))
    assert freed.fetchone()[0] == "1"


def backend_cpu_ns(pid: int) -> int:
    with open(f"/proc/{pid}/schedstat") as fh:
        return int(fh.read().split()[0])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cycles", type=int, default=2000, help="cycles of each shape a block")
    ap.add_argument("--blocks", type=int, default=5, help="blocks, the shapes in turn")
    a = ap.parse_args()
    shapes: dict[str, Cycle] = {
        "floor": floor, "node": node("86400000"), "no-fence": node(""), "one-row": one_row,
    }  # fmt: skip
    with PostgresServers(1) as servers:
        url = servers[0].url
        with psycopg.connect(url, autocommit=True) as setup:
            setup.execute(install_sql("redlock"))
            setup.execute(
                "CREATE TABLE bench_lease (name text PRIMARY KEY, owner text NOT NULL,"
                " fence bigint NOT NULL, expires_at timestamptz NOT NULL)"
            )
            setup.execute(ONE_ROW)
        conns = {name: psycopg.connect(url, autocommit=True) for name in shapes}
        pids = {
            name: c.execute("SELECT pg_backend_pid()").fetchone()[0] for name, c in conns.items()
        }
        wall = dict.fromkeys(shapes, 0)
        cpu = dict.fromkeys(shapes, 0)
        for name, cycle in shapes.items():  # warm-up: plans, prepared statements
            for _ in range(200):
                cycle(conns[name])
        for _ in range(a.blocks):
            for name, cycle in shapes.items():
                conn, cpu0, t0 = conns[name], backend_cpu_ns(pids[name]), time.perf_counter_ns()
                for _ in range(a.cycles):
                    cycle(conn)
                wall[name] += time.perf_counter_ns() - t0
                cpu[name] += backend_cpu_ns(pids[name]) - cpu0
        for c in conns.values():
            c.close()
    n = a.blocks * a.cycles
    for name in shapes:
        ratio = wall[name] / wall["floor"]
        print(
            f"{name:9s} {wall[name] / n / 1e3:7.1f} µs a cycle ({ratio:.2f}x), "
            f"server {cpu[name] / n / 1e3:6.1f} µs ({cpu[name] / cpu['floor']:.2f}x)"
        )


if __name__ == "__main__":
    main()
