#!/usr/bin/env python3
"""Cost of a free permit (``limit=5``) next to a plain lock (``limit=1``), in ONE run.

Measures the same-key acquire + release cycle, uncontended (every permit
free), of:

* celery_redlock ``Redlock`` at 3 nodes, ``limit=1`` (the reference: every
  ratio is to it) and ``limit=5``, fencing on;
* dramatiq's ``ConcurrentRateLimiter`` (``limit=5``) on one node, when dramatiq
  is installed: a counter with a TTL, no owners, no quorum.

Target: a free permit costs at most 1.2x a plain lock. The locks take turns in
blocks of ``--block`` cycles, in an order that rotates every block, as in
``benchmarks/locks.py``, whose helpers this reuses. It starts its own
redis-server nodes on loopback ports and stops them at the end.

Usage::

    python benchmarks/permits.py           # 7 reps x 1000 cycles
    python benchmarks/permits.py --quick   # 3 reps x 200
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Any

import locks  # benchmarks/locks.py: its directory is sys.path[0] when run as a script
from adapters import CeleryRedlockAdapter, _Handle

HOST = "127.0.0.1"
LIMIT = 5
TARGET = 1.2


class PermitAdapter(CeleryRedlockAdapter):
    """celery_redlock ``Redlock.acquire(..., limit=K)``."""

    def __init__(self, nodes: Any, limit: int) -> None:
        super().__init__(nodes)
        self.limit = limit
        self.key = f"celery_redlock-{self.n_nodes}-limit{limit}"
        self.label = f"celery_redlock ({self.n_nodes} nodes, limit={limit})"

    def acquire(self, h: _Handle, timeout: float | None = None) -> bool:
        h.lease = self.redlock.acquire(h.name, ttl=self.ttl, limit=self.limit)
        return h.lease is not None


class DramatiqAdapter:
    """dramatiq ``ConcurrentRateLimiter`` (limit ``LIMIT``) on one node."""

    def __init__(self, node: tuple[str, int]) -> None:
        import redis
        from dramatiq.rate_limits import ConcurrentRateLimiter
        from dramatiq.rate_limits.backends import RedisBackend

        self.client = redis.Redis(host=node[0], port=node[1])
        self.backend = RedisBackend(client=self.client)
        self.limiter_class = ConcurrentRateLimiter
        self.key = "dramatiq-1"
        self.label = f"dramatiq ConcurrentRateLimiter (1 node, limit={LIMIT})"

    def new(self, key: str) -> Any:
        return self.limiter_class(self.backend, "dq:" + key, limit=LIMIT, ttl=10_000)

    def acquire(self, limiter: Any, timeout: float | None = None) -> bool:
        self._held = limiter.acquire(raise_on_failure=False)
        return self._held.__enter__()

    def release(self, limiter: Any) -> None:
        self._held.__exit__(None, None, None)

    def close(self) -> None:
        self.client.close()


def bench(nodes: list[tuple[str, int]], reps: int, n: int, block: int) -> dict[str, list[float]]:
    ads: list[Any] = [PermitAdapter(nodes[:3], 1), PermitAdapter(nodes[:3], LIMIT)]
    if locks.versions("dramatiq")["dramatiq"]:
        ads.append(DramatiqAdapter(nodes[0]))
    handles = {ad.key: ad.new(f"cycle:{ad.key}") for ad in ads}
    for ad in ads:
        locks.run_cycles(ad, handles[ad.key], locks.WARMUP_CYCLES, [])
    means: dict[str, list[float]] = {ad.key: [] for ad in ads}
    blocks = [block] * (n // block) + ([n % block] if n % block else [])
    for rep in range(reps):
        samples: dict[str, list[float]] = {ad.key: [] for ad in ads}
        for b, size in enumerate(blocks):
            k = (rep * len(blocks) + b) % len(ads)
            for ad in ads[k:] + ads[:k]:
                locks.run_cycles(ad, handles[ad.key], size, samples[ad.key])
        for ad in ads:
            means[ad.key].append(statistics.fmean(samples[ad.key]))
        locks.log(f"rep {rep + 1}/{reps} (loadavg {locks.loadavg()})")
    labels = {ad.key: ad.label for ad in ads}
    for ad in ads:
        ad.close()
    return {labels[key]: values for key, values in means.items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--n", type=int, default=1000, help="cycles per lock per rep")
    ap.add_argument("--block", type=int, default=100)
    ap.add_argument("--quick", action="store_true", help="3 reps x 200 in blocks of 50")
    ap.add_argument("--strict", action="store_true", help="exit 1 if the target fails")
    a = ap.parse_args(argv)
    if a.quick:
        a.reps, a.n, a.block = 3, 200, 50
    t0 = time.monotonic()
    with locks.start_nodes(3) as nodes:
        raw = bench([(HOST, node.port) for node in nodes], a.reps, a.n, a.block)
    labels = list(raw)
    base = statistics.median(raw[labels[0]])
    print(
        f"\nacquire + release, uncontended, median of {a.reps} rep means x {a.n} cycles "
        f"({time.monotonic() - t0:.0f} s, versions {locks.versions('redis', 'dramatiq')})\n"
    )
    print(f"| {'lock':<50} | {'us/cycle':>9} | {'x limit=1':>9} | per-rep x |")
    print(f"|{'-' * 52}|{'-' * 11}|{'-' * 11}|-----------|")
    for label in labels:
        med = statistics.median(raw[label])
        ratios = [m / b for m, b in zip(raw[label], raw[labels[0]])]
        print(
            f"| {label:<50} | {med:9.1f} | {med / base:9.2f} | "
            f"{min(ratios):.2f}-{max(ratios):.2f} |"
        )
    ratio = statistics.median(raw[labels[1]]) / base
    ok = ratio <= TARGET
    print(
        f"\ntarget: a free permit (limit={LIMIT}) <= {TARGET}x a plain lock: "
        f"{ratio:.2f}x {'PASS' if ok else 'FAIL'}"
    )
    return 1 if a.strict and not ok else 0


if __name__ == "__main__":
    sys.exit(main())
