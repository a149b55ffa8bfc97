"""The etcd kind of lock node: ``etcd://host:port[,host:port...]`` (``etcds://`` for TLS).

One etcd cluster is one lock node: its members agree among themselves (a
write answers once a majority committed it), so one cluster alone is the
deployment most users want; three independent clusters make a quorum as
three Redis masters do. The URL's endpoints are members of one cluster,
tried in turn (:mod:`.node`).

etcd is a virtual kind (:mod:`..virtual`): the operations' semantics run in
this process over the store verbs of :mod:`.store`, a read from the node's
cache and a commit as one compare-on-revision Txn; a key's expiry is an etcd
lease, so whether a key is held is etcd's to say, never a client clock's.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from ...exceptions import ConfigurationError
from ...records import EtcdInfo, NodeInfo
from ...values import error_text
from .. import ping_latency
from ..kind import Ask
from ..virtual import VirtualKind
from ..virtual.scripting import warm
from .node import EtcdNode, NodeError
from .store import EtcdStore

__all__ = ["CONNECT_TIMEOUT", "KIND", "NODE_TIMEOUT", "EtcdKind", "EtcdNode", "NodeError"]

#: Seconds a call gets by default: a call is a raft commit (and a read before
#: it) over HTTP; measured beside two busy loops on a 2-core host
#: (``benchmarks/call_times.py``): 1 ms typical, 176 ms the longest seen in
#: 18,000. 0.5 s leaves a busy host's stalls room, and at etcd's
#: 2 s minimum lease TTL a heartbeat's renewal still fits in its interval.
NODE_TIMEOUT = 0.5
#: Seconds a new connection to a member gets by default (within the call's time).
CONNECT_TIMEOUT = 1.0


class EtcdKind(VirtualKind):
    """etcd clusters as lock nodes (see the module's docstring)."""

    schemes = ("etcd", "etcds")
    node_timeout = NODE_TIMEOUT
    connect_timeout = CONNECT_TIMEOUT

    def make(
        self, spec: Any, timeout: float, min_replicas: int = 0, connect_timeout: float | None = None
    ) -> EtcdNode:
        node = EtcdNode(spec, timeout, min_replicas, connect_timeout)
        warm("etcd")
        node.store = EtcdStore(node)
        return node

    def check_ttl(self, nodes: Sequence[EtcdNode], ttl: float, option: str = "redlock_ttl") -> None:
        """Refuse a lock TTL below etcd's minimum lease TTL (2 s with etcd's default
        heartbeat and election timeout): etcd would grant the lease longer than asked.

        Raises:
            ConfigurationError: naming the option, the node and the minimum.
        """
        for node in nodes:
            if ttl < node.min_ttl:
                raise ConfigurationError(
                    f"{option}={ttl:g}s is below the minimum lease TTL of etcd node {node.name} "
                    f"({node.min_ttl} s: etcd grants no lease shorter, 1.5 x its election "
                    f"timeout rounded up); use a TTL of at least {node.min_ttl} s"
                )

    def node_info(self, node: EtcdNode, ask: Ask) -> list[NodeInfo]:
        """How ``node`` is: PING latency (the second one), etcd's version, the
        cluster's members and its leader."""
        latency, down = ping_latency(node, ask)
        if down is not None:
            return [NodeInfo(node.name, error_text(down), latency, kind="etcd")]
        try:
            deadline = time.monotonic() + node.timeout
            status = node.post("maintenance/status", {}, deadline)
            members = node.post("cluster/member/list", {}, deadline).get("members", [])
        except Exception as exc:  # noqa: BLE001 - shown as the node's error
            return [NodeInfo(node.name, error_text(exc), latency, kind="etcd")]
        # one node, its members agreeing among themselves: no replicas in the Redis sense
        leader = str(status.get("leader") or "")
        names = {str(m.get("ID")): m.get("name") or str(m.get("ID")) for m in members}
        leader_name = names.get(leader, leader) if leader.strip("0") else None  # 0: none
        return [
            NodeInfo(
                node.name,
                None,
                latency,
                f"etcd {status.get('version', '?')}",
                "cluster",
                kind="etcd",
                server_id=status.get("header", {}).get("cluster_id"),
                specific=EtcdInfo(len(members), leader_name),
            )
        ]


#: The etcd kind.
KIND = EtcdKind()
