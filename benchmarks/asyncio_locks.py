#!/usr/bin/env python3
"""The asyncio client beside the sync one, in ONE run, on 3 Redis masters and
on one PostgreSQL node.

* **Uncontended cycle**: one key, acquire + release, again and again:
  ``Redlock`` in this thread, ``AsyncRedlock`` on one event loop. The two take
  turns in blocks of ``--block`` cycles, so background load falls on both
  alike; the figure is the median of the per-rep means. On PostgreSQL a third
  takes its turns too: the async client with its rounds carried in the
  thread pool, as they were before the native transport.
* **Many keys at once**: ``--keys`` callers, each on a key of its own, for
  ``--seconds``: as many coroutines on one loop, against as many threads
  of the sync client. The figure is cycles per second, all callers together.

It starts its own redis-server and PostgreSQL nodes on free loopback ports and
stops them (``--kinds`` picks which).

Usage::

    python benchmarks/asyncio_locks.py            # 5 reps x 1000 cycles, 100 keys
    python benchmarks/asyncio_locks.py --quick    # a smoke run
    python benchmarks/asyncio_locks.py --kinds postgres --pg-max-open 1
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from celery_redlock import AsyncRedlock, Redlock
from celery_redlock.core.nodes import aio
from celery_redlock.testing import RedisNodes


def sync_block(rl: Redlock, n: int) -> float:
    start = time.perf_counter()
    for _ in range(n):
        lease = rl.acquire("bench-async-cycle", ttl=10)
        assert lease is not None
        rl.release(lease)
    return (time.perf_counter() - start) / n


async def async_block(rl: AsyncRedlock, n: int) -> float:
    start = time.perf_counter()
    for _ in range(n):
        lease = await rl.acquire("bench-async-cycle", ttl=10)
        assert lease is not None
        await rl.release(lease)
    return (time.perf_counter() - start) / n


def many_sync(rl: Redlock, keys: int, seconds: float) -> float:
    done = [0] * keys
    stop = time.monotonic() + seconds

    def one(i: int) -> None:
        while time.monotonic() < stop:
            lease = rl.acquire(f"bench-many-{i}", ttl=10)
            if lease is not None:
                rl.release(lease)
                done[i] += 1

    threads = [threading.Thread(target=one, args=(i,)) for i in range(keys)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(done) / seconds


async def many_async(rl: AsyncRedlock, keys: int, seconds: float) -> float:
    done = [0] * keys
    stop = time.monotonic() + seconds

    async def one(i: int) -> None:
        while time.monotonic() < stop:
            lease = await rl.acquire(f"bench-many-{i}", ttl=10)
            if lease is not None:
                await rl.release(lease)
                done[i] += 1

    await asyncio.gather(*(one(i) for i in range(keys)))
    return sum(done) / seconds


@contextmanager
def carried() -> Iterator[None]:
    """The async client's rounds carried in the thread pool, every kind's."""
    native, aio.native = aio.native, lambda node: False
    try:
        yield
    finally:
        aio.native = native


def cycles(label: str, sync: Redlock, arl: AsyncRedlock, a: argparse.Namespace,
           also_carried: bool = False) -> None:  # fmt: skip
    """Print the uncontended cycles and the many keys' rates on ``label``'s nodes."""
    loop = asyncio.new_event_loop()
    try:
        ways = ["sync", "async"] + (["carried"] if also_carried else [])
        per_rep: dict[str, list[float]] = {which: [] for which in ways}
        sync_block(sync, 50)
        loop.run_until_complete(async_block(arl, 50))  # warm: connections, scripts
        if also_carried:
            with carried():  # and the carrier threads
                loop.run_until_complete(async_block(arl, 50))
        for rep in range(a.reps):
            got: dict[str, list[float]] = {which: [] for which in ways}
            for b in range(a.cycles // a.block):
                shift = (rep + b) % len(ways)
                for which in ways[shift:] + ways[:shift]:
                    if which == "sync":
                        got[which].append(sync_block(sync, a.block))
                    elif which == "async":
                        got[which].append(loop.run_until_complete(async_block(arl, a.block)))
                    else:
                        with carried():
                            got[which].append(loop.run_until_complete(async_block(arl, a.block)))
            for which, values in got.items():
                per_rep[which].append(statistics.mean(values))
        s = statistics.median(per_rep["sync"]) * 1e6
        x = statistics.median(per_rep["async"]) * 1e6
        line = f"uncontended cycle, {label}: sync {s:.0f} us, async {x:.0f} us"
        line += f", async/sync {x / s:.2f}x"
        if also_carried:
            c = statistics.median(per_rep["carried"]) * 1e6
            line += f"; carried in threads {c:.0f} us ({c / s:.2f}x)"
        print(line)
        t = many_sync(sync, a.keys, a.seconds)
        c = loop.run_until_complete(many_async(arl, a.keys, a.seconds))
        print(f"{a.keys} keys at once, {label}: sync threads {t:.0f} cycles/s, "
              f"asyncio coroutines {c:.0f} cycles/s ({c / t:.2f}x)")  # fmt: skip
    finally:
        loop.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--cycles", type=int, default=1000, help="cycles per rep and client")
    ap.add_argument("--block", type=int, default=100)
    ap.add_argument("--keys", type=int, default=100)
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--kinds", default="redis,postgres", help="of redis, postgres")
    ap.add_argument("--pg-max-open", type=int, help="connections per PostgreSQL node and loop")
    ap.add_argument("--quick", action="store_true", help="2 reps x 200 cycles, 1 s of many keys")
    a = ap.parse_args(argv)
    if a.quick:
        a.reps, a.cycles, a.block, a.seconds = 2, 200, 50, 1.0
    kinds = a.kinds.split(",")
    if "redis" in kinds:
        with RedisNodes(3) as nodes:
            sync = Redlock(nodes.urls, node_timeout=0.5)
            cycles("3 Redis masters", sync, AsyncRedlock(redlock=sync), a)
    if "postgres" in kinds:
        from celery_redlock.core.nodes.postgres import aio as pg_aio
        from celery_redlock.testing.postgres import PostgresServers

        if a.pg_max_open:
            pg_aio.MAX_OPEN = a.pg_max_open
        with PostgresServers(1) as servers:
            # a hundred threads' backends start at once: room for a busy host
            sync = Redlock(servers.urls, node_timeout=2.0, connect_timeout=10.0)
            label = f"1 PostgreSQL node ({pg_aio.MAX_OPEN} async connections at most)"
            cycles(label, sync, AsyncRedlock(redlock=sync), a, also_carried=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
