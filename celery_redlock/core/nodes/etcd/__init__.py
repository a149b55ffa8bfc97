"""The etcd kind of lock node: ``etcd://host:port[,host:port...]`` (``etcds://`` for TLS).

One etcd cluster is one lock node: its members agree among themselves (a
write answers once a majority committed it), so one cluster alone is the
deployment most users want; three independent clusters make a quorum as
three Redis masters do. The URL's endpoints are members of one cluster,
tried in turn (:mod:`.node`).

Each operation runs its Lua script in this process (:mod:`.scripting`) on the
keys it reads (:mod:`.keyspace`), written back in one compare-on-revision Txn
(:mod:`.store`); a key's expiry is an etcd lease, so whether a key is held is
etcd's to say, never a client clock's. The plain reads are in :mod:`.reads`.
"""

from __future__ import annotations

import queue
import time
from collections.abc import Callable, Sequence
from typing import Any

from ...exceptions import ConfigurationError
from ...records import NodeInfo
from ...values import error_text
from .. import cut_at, ping_latency
from .node import EtcdNode, NodeError
from .reads import plain
from .scripting import run_script, warm
from .store import execute

__all__ = [
    "CONNECT_TIMEOUT",
    "NODE_TIMEOUT",
    "SCHEMES",
    "EtcdNode",
    "NodeError",
    "accepts",
    "check_ttl",
    "command",
    "make",
    "node_info",
    "run",
]

#: The URL schemes of an etcd node.
SCHEMES = ("etcd", "etcds")
#: Leases one Txn renews at most (etcd's --max-txn-ops is 128 by default).
EXTEND_PART = 100
#: Seconds a call gets by default: a call is a raft commit (and a read before
#: it) over HTTP; measured beside two busy loops on a 2-core host
#: (``benchmarks/call_times.py``): 1 ms typical, 176 ms the longest seen in
#: 18,000. 0.5 s leaves a busy host's stalls room, and at etcd's
#: 2 s minimum lease TTL a heartbeat's renewal still fits in its interval.
NODE_TIMEOUT = 0.5
#: Seconds a new connection to a member gets by default (within the call's time).
CONNECT_TIMEOUT = 1.0


def make(
    spec: Any, timeout: float, min_replicas: int = 0, connect_timeout: float | None = None
) -> EtcdNode:
    node = EtcdNode(spec, timeout, min_replicas, connect_timeout)
    warm()
    return node


def accepts(spec: Any) -> bool:
    """No client object: an etcd node is given by its URL."""
    return False


def check_ttl(nodes: Sequence[EtcdNode], ttl: float, option: str = "redlock_ttl") -> None:
    """Refuse a lock TTL below etcd's minimum lease TTL (2 s with etcd's default
    heartbeat and election timeout): etcd would grant the lease longer than asked.

    Raises:
        ConfigurationError: naming the option, the node and the minimum.
    """
    for node in nodes:
        if ttl < node.min_ttl:
            raise ConfigurationError(
                f"{option}={ttl:g}s is below the minimum lease TTL of etcd node {node.name} "
                f"({node.min_ttl} s: etcd grants no lease shorter, "
                "1.5 x its election timeout rounded up); use a TTL of at least "
                f"{node.min_ttl} s"
            )


def _bytes(value: Any) -> bytes:
    if isinstance(value, bytes):
        return value
    return str(value).encode()


def _each(
    nodes: Sequence[EtcdNode],
    call: Callable[[EtcdNode, float], Any],
    timeout: float,
    needed: int | None = None,
) -> list:
    """``call(node, deadline)`` on every node at once: its reply or exception each.
    One node runs in this thread, several in the connector's threads. Once
    ``needed`` nodes answered, a node that has not is "not answering" (its
    call goes on in its thread, its reply unread), once they had until
    :func:`.cut_at`."""
    started = time.monotonic()
    deadline = started + timeout

    def one(node: EtcdNode) -> Any:
        try:
            return call(node, deadline)
        except Exception as exc:  # noqa: BLE001 - a node's failure is its reply
            return exc

    if len(nodes) == 1:
        return [one(nodes[0])]
    from ...connect import connector

    done: queue.SimpleQueue = queue.SimpleQueue()
    for i, node in enumerate(nodes):
        connector().submit(lambda i=i, node=node: done.put((i, one(node))))
    replies: list[Any] = [None] * len(nodes)
    pending = set(range(len(nodes)))
    answered, until = 0, deadline + 0.5
    while pending:
        now = time.monotonic()
        if needed is not None and answered >= needed:
            until = min(until, cut_at(started, now, timeout))
        try:
            i, reply = done.get(timeout=max(until - now, 0.001))
        except queue.Empty:
            break
        replies[i] = reply
        pending.discard(i)
        answered += not isinstance(reply, Exception)
    decided = needed is not None and answered >= needed
    for i in pending:
        replies[i] = TimeoutError(
            f"{nodes[i].name}: no reply by the time a quorum answered"
            if decided
            else f"{nodes[i].name}: no reply in {timeout:g}s"
        )
    return replies


def run(
    op: Any,
    nodes: Sequence[EtcdNode],
    keys: Sequence[str],
    args: Sequence[Any],
    timeout: float,
    needed: int | None = None,
) -> list[Any]:
    """One round of ``op`` on ``nodes``, all at once (ended once ``needed`` answered).
    A heartbeat's renewal of more leases than one Txn may touch goes in parts
    (each key's renewal stands alone)."""
    k = [_bytes(key) for key in keys]
    a = [_bytes(arg) for arg in args]
    if op.name == "extend" and len(k) > EXTEND_PART:
        parts = [(k[i : i + EXTEND_PART], a[2 * i : 2 * (i + EXTEND_PART)])
                 for i in range(0, len(k), EXTEND_PART)]  # fmt: skip
    else:
        parts = [(k, a)]

    def call(node: EtcdNode, deadline: float) -> Any:
        out: list[Any] = []
        for keys_, args_ in parts:

            def body(view: Any, ks: list = keys_, ar: list = args_) -> Any:
                return run_script(op, view, ks, ar)

            got = execute(node, keys_, body, deadline)
            if len(parts) == 1:
                return got
            out += got
        return out

    return _each(nodes, call, timeout, needed)


def send(op: Any, nodes: Sequence[EtcdNode], keys: Any, args: Any) -> list[int]:
    """Nothing goes unwaited to etcd (a write is a read-compare-write): every
    node is left to an ordinary round."""
    return list(range(len(nodes)))


def command(
    nodes: Sequence[EtcdNode], cmd: tuple, timeout: float, needed: int | None = None
) -> list[Any]:
    """The plain read ``cmd`` on ``nodes``, with Redis's reply shapes."""
    return _each(nodes, lambda node, deadline: plain(node, cmd, deadline), timeout, needed)


def node_info(node: EtcdNode, ask: Callable[[tuple, Sequence[Any]], list[Any]]) -> list[NodeInfo]:
    """How ``node`` is: PING latency (the second one), etcd's version and how
    many members the cluster has."""
    latency, down = ping_latency(node, ask)
    if down is not None:
        return [NodeInfo(node.name, error_text(down), latency, kind="etcd")]
    try:
        deadline = time.monotonic() + node.timeout
        status = node.post("maintenance/status", {}, deadline)
        members = node.post("cluster/member/list", {}, deadline).get("members", [])
    except Exception as exc:  # noqa: BLE001 - shown as the node's error
        return [NodeInfo(node.name, error_text(exc), latency, kind="etcd")]
    # the cluster takes writes as a whole (its members agree among themselves): a
    # primary with no replicas in the Redis sense, whichever member answered
    count = len(members)
    return [
        NodeInfo(
            node.name,
            None,
            latency,
            f"etcd {status.get('version', '?')}, {count} member{'s' if count != 1 else ''}",
            "primary",
            kind="etcd",
        )
    ]
