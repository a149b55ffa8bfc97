"""Writes not waited for: a deletion sent to every node, its reply read later.

A worker's release goes this way (``Redlock.release(wait=False)``): the
result is stored while the nodes delete the key. The connection goes back to
its node owing the reply; the next round on it reads that first and sets it
aside (:func:`~celery_redlock.core.nodes.redis.rounds.gather`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..scripts import Script
from .cluster import LockNode
from .node import Node
from .wire import Call, pack, start

__all__ = ["MAX_OWED", "send_script"]

#: Replies a connection may owe before :func:`send_script` waits on it instead.
MAX_OWED = 8


def send_script(
    op: Script, nodes: Sequence[LockNode], keys: Sequence[str], args: Sequence[Any]
) -> list[int]:
    """Write a script to every node and return without waiting for the replies.

    For deletions only: the connection goes back idle owing the reply, and
    the next round on it reads that first and sets it aside (an error there
    is logged; the key is then left to its TTL, as after any release a node
    did not answer). Sent as ``EVAL`` with the text, so a node that lost its
    script cache runs it all the same.

    Returns the indexes of the nodes it was not sent to (not a lean node, no
    idle connection, a write that failed or did not go out whole): the caller
    runs an ordinary round on those.
    """
    wire = pack(("EVAL", op.text, len(keys), *keys, *args))
    missed = []
    for i, node in enumerate(nodes):
        # a Redis Cluster routes by slot and follows redirects: an ordinary round
        if not isinstance(node, Node):
            missed.append(i)
            continue
        conn = node.idle_connection() if node.lean else None
        if conn is None:
            missed.append(i)
            continue
        call = Call(i, node, conn, True, wire)
        if call.skip >= MAX_OWED:  # read what it owes in an ordinary round first
            node.put_back(conn, call.skip)
            missed.append(i)
            continue
        if start(call) is not None:  # the connection is discarded already
            missed.append(i)
        elif call.out:  # half written: this connection can never be read right again
            node.discard(conn)
            missed.append(i)
        else:
            node.put_back(conn, call.skip + 1)
    return missed
