"""How long opening a lock node's connection takes: the figure behind the
default of ``redlock_connect_timeout``.

Each sample is a first round (``PING``) to one node over a new connection,
timed from the round's start to its reply, as a worker's first lock after
start-up pays it: in a running process (one new connection after another), and
in fresh processes started four at a time, as a prefork pool starts its
children. Timeouts are large, so nothing is cut short. Run it on a quiet host,
then beside busy loops (``while :; do :; done &``, one per core)::

    python benchmarks/connect_times.py [redis://127.0.0.1:6379/0] [samples]
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time

from celery_redlock.core.nodes.redis.node import Node
from celery_redlock.core.nodes.redis.rounds import gather

FIRST_ROUND = """
import sys, time
from celery_redlock.core.nodes.redis.node import Node
from celery_redlock.core.nodes.redis.rounds import gather
node = Node(sys.argv[1], 5.0)
started = time.perf_counter()
reply = gather([node], ("PING",), 5.0)[0]
assert reply in (b"PONG", True), reply
print(time.perf_counter() - started)
"""


def first_round(url: str) -> float:
    node = Node(url, 5.0)
    started = time.perf_counter()
    reply = gather([node], ("PING",), 5.0)[0]
    took = time.perf_counter() - started
    assert reply in (b"PONG", True), reply
    node.close()
    return took


def fresh_processes(url: str, n: int) -> list[float]:
    took: list[float] = []
    while len(took) < n:
        procs = [
            subprocess.Popen([sys.executable, "-c", FIRST_ROUND, url], stdout=subprocess.PIPE)
            for _ in range(4)
        ]
        took += [float(p.communicate()[0]) for p in procs]
    return took


def report(what: str, took: list[float]) -> None:
    ms = sorted(t * 1000 for t in took)
    q = statistics.quantiles(ms, n=100)
    print(
        f"{what}: {len(ms)} first rounds, median {q[49]:.1f} ms, p90 {q[89]:.1f} ms, "
        f"p99 {q[98]:.1f} ms, max {ms[-1]:.1f} ms"
    )


def main() -> None:
    url = sys.argv[1] if len(sys.argv) > 1 else "redis://127.0.0.1:6379/0"
    samples = int(sys.argv[2]) if len(sys.argv) > 2 else 1000
    running = []
    for _ in range(samples):
        running.append(first_round(url))
        time.sleep(0.01)
    report("a running process", running)
    report("fresh processes", fresh_processes(url, max(samples // 5, 20)))


if __name__ == "__main__":
    main()
