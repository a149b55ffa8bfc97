#!/usr/bin/env python3
"""Which Python client an etcd lock node speaks through: one lock cycle each.

Starts a throwaway one-member etcd cluster (``celery_redlock.testing.etcd``:
Debian's ``etcd`` binary, free loopback ports) and times, over ``--n``
uncontended cycles, the lock cycle an etcd node needs (a Txn that creates the
lock key if absent on a lease, a Txn that deletes it if its create revision is
still mine: 2 requests) and a single read, through each client that installs::

    python benchmarks/etcd_clients.py            # 500 cycles each, about 15 s
    pip install etcd-sdk-python protobuf         # to time the gRPC client too

etcd3gw speaks the HTTP/JSON gateway (``/v3/...``) through requests;
etcd-sdk-python (``pyetcd``) speaks gRPC.
"""

from __future__ import annotations

import argparse
import base64
import statistics
import time
from collections.abc import Callable

from celery_redlock.testing.etcd import EtcdCluster


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def gateway(endpoint: str) -> tuple[Callable[[int], None], Callable[[], None]]:
    import etcd3gw

    host, port = endpoint.split(":")
    client = etcd3gw.Etcd3Client(host=host, port=int(port), timeout=2)
    lease = client.post(client.get_url("/lease/grant"), json={"TTL": 60})["ID"]
    url = client.get_url("/kv/txn")

    def cycle(i: int) -> None:
        key = _b64(f"bench/gw/{i % 7}")
        got = client.post(url, json={
            "compare": [{"key": key, "target": "CREATE", "create_revision": 0}],
            "success": [{"request_put": {"key": key, "value": _b64("me"), "lease": lease}}],
            "failure": [{"request_range": {"key": key}}],
        })  # fmt: skip
        assert got.get("succeeded")
        rev = got["header"]["revision"]
        client.post(url, json={
            "compare": [{"key": key, "target": "CREATE", "create_revision": rev}],
            "success": [{"request_delete_range": {"key": key}}],
        })  # fmt: skip

    def read() -> None:
        client.post(client.get_url("/kv/range"), json={"key": _b64("bench/gw/0")})

    return cycle, read


def grpc(endpoint: str) -> tuple[Callable[[int], None], Callable[[], None]]:
    import pyetcd

    host, port = endpoint.split(":")
    client = pyetcd.Etcd3Client(host=host, port=int(port), timeout=2)
    lease = client.lease(60)

    def cycle(i: int) -> None:
        key = f"bench/grpc/{i % 7}"
        ok, _ = client.transaction(
            compare=[client.transactions.create(key) == 0],
            success=[client.transactions.put(key, "me", lease=lease)],
            failure=[client.transactions.get(key)],
        )
        assert ok
        client.transaction(  # pyetcd's Txn reply has no header: compare the value
            compare=[client.transactions.value(key) == "me"],
            success=[client.transactions.delete(key)],
            failure=[],
        )

    def read() -> None:
        client.get("bench/grpc/0")

    return cycle, read


def _time(call: Callable[[int], None], n: int) -> list[float]:
    out = []
    for i in range(n):
        started = time.perf_counter()
        call(i)
        out.append((time.perf_counter() - started) * 1e6)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=500, help="cycles per client")
    n = ap.parse_args().n
    with EtcdCluster(1) as cluster:
        endpoint = cluster[0].endpoint
        for name, make in (("etcd3gw (HTTP/JSON)", gateway), ("etcd-sdk-python (gRPC)", grpc)):
            try:
                cycle, read = make(endpoint)
            except ImportError as exc:
                print(f"{name:24} not installed ({exc})")
                continue
            _time(cycle, 20)
            cycles = sorted(_time(cycle, n))
            reads = sorted(_time(lambda i, read=read: read(), n))
            print(
                f"{name:24} cycle mean {statistics.fmean(cycles):7.0f} µs  "
                f"p50 {cycles[n // 2]:7.0f}  p99 {cycles[int(n * 0.99)]:7.0f}   "
                f"read p50 {reads[n // 2]:6.0f} µs"
            )


if __name__ == "__main__":
    main()
