"""How long one call takes on each kind of lock node, beside busy loops: the
figures behind each kind's default ``redlock_node_timeout``.

Times every round of acquire + release cycles on one PostgreSQL node (a private
server with ``fsync`` on, as a lock node runs) and one etcd node (a one-member
cluster), each started here, with timeouts large enough that nothing is cut
short, while ``busy`` processes spin (two: both cores of a 2-core host)::

    python benchmarks/call_times.py [busy] [cycles]
"""

from __future__ import annotations

import multiprocessing
import sys
import time

from celery_redlock.core.redlock import Redlock
from celery_redlock.testing.etcd import EtcdCluster
from celery_redlock.testing.postgres import PostgresServer


def _spin(stop: multiprocessing.synchronize.Event) -> None:
    while not stop.is_set():
        pass


def _rounds(url: str, cycles: int) -> str:
    rl = Redlock([url], node_timeout=5.0, connect_timeout=5.0)
    took = []
    for i in range(cycles):
        started = time.perf_counter()
        lease = rl.try_acquire(f"call-times-{i % 7}", ttl=10)
        took.append(time.perf_counter() - started)
        started = time.perf_counter()
        rl.release(lease)  # type: ignore[arg-type]
        took.append(time.perf_counter() - started)
    rl.close()
    took.sort()

    def ms(q: float) -> str:
        return f"{took[min(int(q * len(took)), len(took) - 1)] * 1000:.1f} ms"

    return (
        f"{len(took)} rounds: p50 {ms(0.5)}, p99 {ms(0.99)}, p99.9 {ms(0.999)}, "
        f"max {took[-1] * 1000:.1f} ms"
    )


def main() -> None:
    busy = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    cycles = int(sys.argv[2]) if len(sys.argv) > 2 else 1500
    pg, etcd = PostgresServer(settings={"fsync": "on"}), EtcdCluster(1)
    stop = multiprocessing.Event()
    spinners = [multiprocessing.Process(target=_spin, args=(stop,)) for _ in range(busy)]
    for p in spinners:
        p.start()
    try:
        for kind, url in (("postgresql", pg.url), ("etcd", etcd.url)) * 2:
            print(f"{kind:10} beside {busy} busy loops: {_rounds(url, cycles)}", flush=True)
    finally:
        stop.set()
        for p in spinners:
            p.join()
        pg.close()
        etcd.close()


if __name__ == "__main__":
    main()
