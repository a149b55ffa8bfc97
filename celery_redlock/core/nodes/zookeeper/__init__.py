"""The ZooKeeper kind of lock node: ``zookeeper://host:port[,host:port...][/chroot]``.

One ensemble is one lock node, a virtual kind (:mod:`..virtual`) over kazoo: the
store verbs of :mod:`.store`, a key's expiry a deadline on the ensemble's clock,
never a session (see the ZooKeeper page of the docs).
"""

from __future__ import annotations

import socket
import time
from typing import Any

from ...records import NodeInfo, ZookeeperInfo
from ...values import error_text
from .. import ping_latency
from ..kind import Ask
from ..virtual import Call
from ..virtual.kinds import NodeKind
from .node import NodeError, ZookeeperNode

__all__ = ["KIND", "NodeError", "ZookeeperKind", "ZookeeperNode"]


def _srvr(hostport: str, timeout: float) -> dict[str, str]:
    """A member's answer to ``srvr`` as fields (``Mode: down`` where it does not answer)."""
    host, _, port = hostport.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout) as sock:
            sock.sendall(b"srvr")
            text = b"".join(iter(lambda: sock.recv(4096), b"")).decode(errors="replace")
    except OSError:
        return {"Mode": "down"}
    return dict(line.split(": ", 1) for line in text.splitlines() if ": " in line)


class ZookeeperKind(NodeKind):
    """ZooKeeper ensembles as lock nodes (see the module's docstring)."""

    schemes = ("zookeeper",)
    node_class = ZookeeperNode
    #: Seconds a call gets by default: a multi waits for a majority's log write,
    #: and an election takes a second or more, when calls are "not answering".
    node_timeout = 2.0
    #: Seconds a new session gets to open by default (a handshake with a member).
    connect_timeout = 2.0

    def on_node(self, node: Any, call: Call, deadline: float) -> Any:
        """The call in its session's turn, within the node's timeout from then."""
        store = node.store
        store.client(deadline, node)
        if not store.turn.acquire(timeout=max(deadline - time.monotonic(), 0)):
            raise TimeoutError(f"{node.name}: no reply in time (the process's calls queued)")
        try:
            return call(node, min(deadline, time.monotonic() + node.timeout))
        finally:
            store.turn.release()

    def node_info(self, node: ZookeeperNode, ask: Ask) -> list[NodeInfo]:
        """PING latency, each member's mode and version (``srvr`` where allowed, else ``?``)."""
        latency, down = ping_latency(node, ask)
        if down is not None:
            return [NodeInfo(node.name, error_text(down), latency, kind="zookeeper")]
        modes, version = {}, "?"
        for hostport in node.hosts:
            fields = _srvr(hostport, min(node.timeout, 1.0))
            modes[hostport] = fields.get("Mode", "?")
            version = fields.get("Zookeeper version", version).split("-", 1)[0]
        leader = next((h for h, m in modes.items() if m in ("leader", "standalone")), None)
        answering = sum(m not in ("down", "?") for m in modes.values())
        specific = ZookeeperInfo(len(node.hosts), answering, leader, tuple(sorted(modes.items())))
        return [
            NodeInfo(node.name, None, latency, f"zookeeper {version}", "ensemble",
                     kind="zookeeper", specific=specific)
        ]  # fmt: skip


#: The ZooKeeper kind.
KIND = ZookeeperKind()
