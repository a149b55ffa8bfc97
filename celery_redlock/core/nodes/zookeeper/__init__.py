"""The ZooKeeper kind of lock node: ``zookeeper://host:port[,host:port...][/chroot]``.

One ZooKeeper ensemble is one lock node: its members agree among themselves
(a write answers once a majority logged it), so one ensemble alone is the
deployment most users want; several ensembles make a quorum as several Redis
masters do, and a quorum may mix kinds. kazoo is the client
(``pip install 'celery_redlock[zookeeper]'``).

ZooKeeper is a virtual kind (:mod:`..virtual`): the operations' semantics run
in this process over the store verbs of :mod:`.store`, a commit as one
``multi`` on the keys' versions. A key's expiry is a deadline on the
ensemble's own clock (a commit's ``mtime``), not a session: a holder whose
process dies, pauses or loses its session leaves its lock free within the TTL
plus two round trips (see :mod:`.store` and the ZooKeeper page of the docs).
"""

from __future__ import annotations

import socket
import time
from collections.abc import Sequence
from typing import Any

from ...records import NodeInfo, ZookeeperInfo
from ...values import error_text
from .. import ping_latency
from ..kind import Ask
from ..virtual import Call, VirtualKind
from ..virtual.scripting import warm
from .node import NodeError, ZookeeperNode

__all__ = ["KIND", "NodeError", "ZookeeperKind", "ZookeeperNode", "four_letters"]


def four_letters(hostport: str, word: bytes, timeout: float) -> str:
    """A member's answer to a four-letter word (``srvr``, ``mntr``): its text."""
    host, _, port = hostport.rpartition(":")
    with socket.create_connection((host, int(port)), timeout=timeout) as sock:
        sock.sendall(word)
        chunks = []
        while chunk := sock.recv(4096):
            chunks.append(chunk)
    return b"".join(chunks).decode(errors="replace")


class ZookeeperKind(VirtualKind):
    """ZooKeeper ensembles as lock nodes (see the module's docstring)."""

    schemes = ("zookeeper",)
    #: Seconds a call to a ZooKeeper node gets by default: a ``multi`` waits for a
    #: majority's log write, and a leader election with the default tickTime takes
    #: a few seconds, in which calls are "not answering".
    default_timeout = 2.0

    def make(
        self, spec: Any, timeout: float, min_replicas: int = 0, connect_timeout: float | None = None
    ) -> ZookeeperNode:
        node = ZookeeperNode(spec, timeout, min_replicas, connect_timeout)
        warm("zookeeper")
        return node

    def round(self, nodes: Sequence[Any], call: Call, timeout: float) -> list[Any]:
        """A round whose nodes without a session yet get their connect budget first,
        then ``timeout`` for the reply, as a new connection does on every kind."""
        opening = [n.connect_timeout or timeout for n in nodes if not n.has_session()]
        return super().round(nodes, call, timeout + max(opening, default=0.0))

    def on_node(self, node: Any, call: Call, deadline: float) -> Any:
        """The node's call in its session's turn, once the session is open (within
        the connect budget), within the node's timeout from then."""
        node.client(deadline)
        turn = node.session.turn
        if not turn.acquire(timeout=max(deadline - time.monotonic(), 0)):
            raise TimeoutError(f"{node.name}: no reply in time (the process's calls queued)")
        try:
            return call(node, min(deadline, time.monotonic() + node.timeout))
        finally:
            turn.release()

    def node_info(self, node: ZookeeperNode, ask: Ask) -> list[NodeInfo]:
        """How ``node`` is: PING latency, and each member's mode (leader,
        follower, standalone) and version from its ``srvr`` four-letter word
        (where the members allow it: ``4lw.commands.whitelist``)."""
        latency, down = ping_latency(node, ask)
        if down is not None:
            return [NodeInfo(node.name, error_text(down), latency, kind="zookeeper")]
        modes: dict[str, str] = {}
        version = "?"
        for hostport in node.hosts:
            try:
                text = four_letters(hostport, b"srvr", min(node.timeout, 1.0))
            except OSError:
                modes[hostport] = "down"
                continue
            fields = dict(
                line.split(": ", 1) for line in text.splitlines() if ": " in line
            )  # fmt: skip
            modes[hostport] = fields.get("Mode", "?")
            version = fields.get("Zookeeper version", version).split("-", 1)[0]
        leader = next((h for h, m in modes.items() if m in ("leader", "standalone")), None)
        if all(m == "?" for m in modes.values()):
            leader = None  # the members refuse srvr: nothing known of their roles
        return [
            NodeInfo(
                node.name,
                None,
                latency,
                f"zookeeper {version}",
                "ensemble",
                kind="zookeeper",
                specific=ZookeeperInfo(
                    len(node.hosts),
                    sum(m not in ("down", "?") for m in modes.values()),
                    leader,
                    tuple(sorted(modes.items())),
                ),
            )
        ]


#: The ZooKeeper kind.
KIND = ZookeeperKind()
