"""Rounds from asyncio code: :func:`perform_async`, the counterpart of :func:`.perform`.

The same operation values go through the same codec (:mod:`.codec`) and, on
Redis, the same Lua scripts; only the carrying differs:

* **Redis, native**: a node built from a ``redis://``, ``unix://``,
  ``rediss://`` (TLS) or ``sentinel://`` URL (RESP2, replies undecoded), with
  or without ``min_replicas``, gets one pipelined connection per event loop
  (:mod:`.resp`), with the node's own timeouts and no retries, and each
  script goes as ``EVALSHA`` (``EVAL`` on ``NOSCRIPT``), followed by ``WAIT``
  where the sync round sends it. A Redis Cluster's call about one name (or a
  batch on one slot) goes so to its slot's shard master, once the slot map
  is read; the rest of a Cluster's calls (the map's first read, a batch over
  several slots, a ``MOVED`` or ``ASK`` to follow) are its sync round, carried
  as below.
* **memory, native**: a memory node runs in this process; its call is made
  in the loop's thread, unless a fault hook makes it wait.
* **PostgreSQL, native**: a few connections per node and event loop
  (:mod:`.postgres.aio`), the sync node's statements and errors.
* **every other node** (etcd, ZooKeeper, a ``redis.Redis`` or ``RedisCluster``
  client given as it is, TLS with OCSP checks, and plain reads): the sync
  kind's own round, carried whole in a bounded thread pool (:data:`CARRIERS`
  threads), so no call blocks the event loop.

One deadline covers the round's nodes, and a round of a quorum is decided as
the sync one is: once ``needed`` nodes answered, the others get until
:func:`.cut_at`, then are "not answering". Errors are results: a round never
raises.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from . import NotReplicated, codec, cut_at, kind_of, perform
from .guard import ProcessLocal

__all__ = ["CARRIERS", "carrier", "native", "perform_async"]

#: Threads that carry the rounds of nodes without a native asyncio transport.
CARRIERS = 8


@ProcessLocal
def carrier() -> ThreadPoolExecutor:
    """The bounded thread pool that carries the other kinds' rounds."""
    return ThreadPoolExecutor(CARRIERS, thread_name_prefix="redlock-aio")


def native(node: Any) -> bool:
    """Whether ``node``'s calls go natively from the event loop."""
    if node.kind in ("memory", "postgres"):
        return True
    if node.kind != "redis":
        return False
    if node.cluster or getattr(node, "lean", False):  # a Cluster: per call (_redis)
        return True
    from . import resp  # with the Redis kind: imported at its first node

    return resp.served(node)


async def _redis(node: Any, script: Any, keys: Any, args: Any, limit: float) -> Any:
    """A script's reply on a Redis node, or its error: never raises."""
    from . import resp  # with the Redis kind: imported at its first node

    try:
        if not node.cluster:
            return await resp.call_script(node, script, keys, args, limit)
        reply = await resp.call_shard(node, script, keys, args, limit)
        if reply is not resp.CARRY:
            return reply
        # the sync round's own steps (a slot map to read, a batch, a redirect)
        call = asyncio.get_running_loop().run_in_executor(
            carrier(), kind_of(node).run, (script, keys, args), [node], limit
        )
        replies = await _bounded(node, call, limit + (node.connect_timeout or limit) + 1.0)
        return replies if isinstance(replies, Exception) else replies[0]
    except asyncio.TimeoutError:
        return TimeoutError(f"{node.name}: no reply in {limit:g}s")
    except Exception as exc:  # an error is the node's reply
        return exc


async def _postgres(node: Any, script: Any, keys: Any, args: Any, limit: float) -> Any:
    from .postgres import aio  # with the PostgreSQL kind (psycopg): imported at its first node

    return await aio.call_script(node, script, keys, args, limit)


async def _bounded(node: Any, call: Awaitable[Any], limit: float) -> Any:
    """``call``'s reply, or its error (a timeout named for ``node``): never raises."""
    try:
        return await asyncio.wait_for(call, limit)
    except asyncio.TimeoutError:
        return TimeoutError(f"{node.name}: no reply in {limit:g}s")
    except Exception as exc:  # an error is the node's reply
        return exc


async def _memory(node: Any, script: Any, keys: Any, args: Any, limit: float) -> Any:
    kind = kind_of(node)
    if node.store.faults.blocking:  # a hook that waits: not in the loop's thread
        call = asyncio.get_running_loop().run_in_executor(
            carrier(), kind.run, (script, keys, args), [node], limit
        )
        return await _bounded(node, call, limit + 1.0)
    return kind.run((script, keys, args), [node], limit)[0]


async def _decided(calls: Sequence[Awaitable[Any]], nodes: Sequence[Any], needed: int | None,
                   timeout: float) -> list[Any]:  # fmt: skip
    """The replies of ``calls`` (one per node, none raises); with ``needed``, the
    round ends at :func:`.cut_at` once that many answered."""
    loop = asyncio.get_running_loop()
    tasks = [asyncio.ensure_future(call) for call in calls]
    started = loop.time()
    pending: set[asyncio.Future[Any]] = set(tasks)
    answered, until = 0, None
    try:
        while pending:
            left = None if until is None else max(until - loop.time(), 0.0)
            done, pending = await asyncio.wait(
                pending, timeout=left, return_when=asyncio.FIRST_COMPLETED
            )
            if not done:
                break
            answered += sum(not isinstance(t.result(), Exception) for t in done)
            if needed is not None and until is None and answered >= needed:
                until = cut_at(started, loop.time(), timeout)
    finally:
        for task in pending:
            task.cancel()
    return [
        t.result() if t.done() and not t.cancelled()
        else TimeoutError(f"{node.name}: not answering")
        for t, node in zip(tasks, nodes)
    ]  # fmt: skip


async def perform_async(
    op: Any, nodes: Sequence[Any], timeout: float | None, needed: int | None = None
) -> list[Any]:
    """Run the operation value ``op`` on ``nodes`` at once from asyncio code: one
    typed result, or the node's error, per node (see :func:`.perform`)."""
    script, keys, args = codec.encode(op)
    if script is None or not all(map(native, nodes)):
        one = len({node.kind for node in nodes}) == 1
        kind = kind_of(nodes[0]) if one else None
        limit = max(n.timeout for n in nodes) if timeout is None else timeout
        call = asyncio.get_running_loop().run_in_executor(
            carrier(), perform, op, nodes, limit if kind is not None else timeout, kind, needed
        )
        budget = limit + max(n.connect_timeout for n in nodes) + 1.0
        replies = await _bounded(nodes[0], call, budget)
        if isinstance(replies, Exception):  # the carried round itself failed
            return [replies] * len(nodes)
        return replies
    calls: list[Awaitable[Any]] = []
    longest = 0.0
    for node in nodes:
        limit = node.timeout if timeout is None else min(node.timeout, timeout)
        longest = max(longest, limit)
        if node.kind == "memory":
            calls.append(_memory(node, script, keys, args, limit))
        elif node.kind == "postgres":
            calls.append(_postgres(node, script, keys, args, limit))
        else:
            calls.append(_redis(node, script, keys, args, limit))
    replies = await _decided(calls, nodes, needed, longest)
    return codec.decode_all(op, replies, NotReplicated)
