"""What a Redis node says of itself: PING latency, ``INFO`` fields, fsync policy
(:meth:`celery_redlock.core.Redlock.node_info`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ...records import NodeInfo, RedisInfo
from ...values import error_text, readable
from .. import ping_latency

__all__ = ["node_info"]

#: :meth:`Quorum.gather <celery_redlock.core.quorum.Quorum.gather>`: a command to some nodes.
Ask = Callable[[tuple, Sequence[Any]], list[Any]]


def node_info(node: Any, ask: Ask) -> list[NodeInfo]:
    """How ``node`` is: one row, or one per shard master of a Redis Cluster (each
    judged on its own). The second PING is timed (the first pays for
    connecting); ``appendfsync`` comes from ``CONFIG GET``, which managed Redis
    may rename or deny (then None)."""
    if not node.cluster:
        return [_one(node, ask)]
    try:
        shards = node.masters()
    except Exception as exc:  # noqa: BLE001 - no slot map, whatever the reason
        return [NodeInfo(node.name, f"no slot map: {error_text(exc)}")]
    return [_one(shard, ask)._replace(cluster=node.name) for shard in shards]


def _one(node: Any, ask: Ask) -> NodeInfo:
    latency, down = ping_latency(node, ask)
    if down is not None:
        return NodeInfo(node.name, error_text(down), latency)
    info = ask(("INFO",), [node])[0]
    if isinstance(info, Exception):
        return NodeInfo(node.name, f"INFO failed: {error_text(info)}", latency)
    lines = (line.partition(":") for line in readable(info).splitlines())
    fields = {k: v.strip() for k, sep, v in lines if sep and not k.startswith("#")}
    version = fields.get("redis_version", "?")
    if "valkey_version" in fields:
        version = f"valkey {fields['valkey_version']}"
    aof = fields.get("aof_enabled") == "1" if "aof_enabled" in fields else None
    fsync = None
    if aof:
        reply = ask(("CONFIG", "GET", "appendfsync"), [node])[0]
        if isinstance(reply, list) and len(reply) == 2:
            fsync = readable(reply[1])
    replicas = fields.get("connected_slaves", "")
    return NodeInfo(
        node.name,
        None,
        latency,
        version,
        fields.get("role", "?"),
        int(replicas) if replicas.isdigit() else None,
        server_id=fields.get("run_id"),
        specific=RedisInfo(
            fields.get("maxmemory_policy", "?"),
            int(fields.get("maxmemory", "0") or 0),
            aof,
            fsync,
        ),
    )
