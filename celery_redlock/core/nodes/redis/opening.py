"""A round's new connections: opened in the background, all at once.

:func:`~celery_redlock.core.nodes.redis.rounds.gather` does not wait for a node's new
connection before it sends to the others: each one is opened (connect and
handshake) in a thread of :func:`~celery_redlock.core.connect.connector`,
within the node's connect timeout (``redlock_connect_timeout``), and handed
over to the round through a pipe that the round polls with its sockets
(:class:`Opening`). The round waits for it that long, and for its reply the
round's timeout from when it connected: a slow connect on a busy host is not
an outage, and a round lasts at most connect timeout + round timeout; but a
round that a quorum of nodes has answered does not wait for it at all. A
connection that connects after its round ended is kept for the next one. A
node whose connects time out is skipped for a while but for one background
probe (:meth:`Node.skips_connects <celery_redlock.core.nodes.redis.node.Node.skips_connects>`).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Sequence
from typing import Any

import redis

from ...connect import connector
from .node import Node
from .wire import Command, as_redis_error, set_nonblocking

__all__ = ["Opening", "connect_budget", "connect_within", "open_connection"]

#: How a round ends a connect it waited for in vain (for the circuit breaker).
_OVERDUE = redis.exceptions.TimeoutError("connect overdue")


class Opening:
    """The new connections of one round, each opened (connect and handshake) in
    a background thread of :func:`connector`, all at once, each within its
    node's connect timeout (:func:`connect_budget`).

    A thread that connects in time hands its connection over to the round and
    wakes it through a pipe that the round polls with its sockets; one that
    connects after the round ended puts its connection among the node's idle
    ones. Only rounds that open connections pay for this.
    """

    __slots__ = (
        "commands", "timeout", "until", "lock", "live", "done", "pending", "wake", "_write_end",
    )  # fmt: skip

    def __init__(self, commands: Sequence[Command], timeout: float):
        self.commands, self.timeout = commands, timeout
        #: When the budget of the last connect started ends: the round waits that long.
        self.until = 0.0
        self.lock = threading.Lock()
        self.live = True
        self.done: list[tuple[int, Node, Any, Exception | None]] = []
        self.pending: dict[int, Node] = {}
        self.wake, self._write_end = os.pipe()
        os.set_blocking(self.wake, False)

    def open(self, i: int, node: Node, replies: list[Any]) -> None:
        """Start opening a connection to ``node`` (item ``i`` of the round), or
        set its reply to an error at once if its circuit breaker skips it."""
        allowed = connect_budget(node, self.timeout)
        skipped = node.skips_connects()
        if skipped is not None:
            if node.probe_due():
                connector().submit(open_connection, node, node.new_connection(), allowed, None, -1)
            replies[i] = skipped
            return
        self.pending[i] = node
        self.until = max(self.until, time.monotonic() + allowed)
        connector().submit(open_connection, node, node.new_connection(), allowed, self, i)

    def finished(self, i: int, conn: Any, error: Exception | None) -> bool:
        """From a connecting thread: hand the outcome over; False if the round has ended."""
        with self.lock:
            if not self.live:
                return False
            self.done.append((i, self.pending[i], conn, error))
            os.write(self._write_end, b".")
            return True

    def take(self, replies: list[Any]) -> list[tuple[int, Node, Any]]:
        """The connections opened since the last call; the failed ones get their error as reply."""
        with self.lock:
            done, self.done = self.done, []
            try:
                os.read(self.wake, 4096)
            except BlockingIOError:
                pass
        ready = []
        for i, node, conn, error in done:
            del self.pending[i]
            if error is None:
                ready.append((i, node, conn))
            else:
                replies[i] = error
        return ready

    def command_for(self, i: int, node: Node, conn: Any) -> Any:
        command = self.commands[i]
        return command.wire if node.lean else command.packed(conn)

    def close(self, replies: list[Any], decided: bool = False) -> None:
        """End the round: what is still connecting goes on in the background,
        its connection then kept; its reply is a timeout. ``decided``: the round
        ended because a quorum answered, before the connect's budget ran out;
        the node is skipped until that connect ends (the circuit breaker), so
        the next round does not open another one meanwhile."""
        with self.lock:
            self.live = False
            done, self.done = self.done, []
        os.close(self.wake)
        os.close(self._write_end)
        for i, node, conn, error in done:  # connected in the last instant: kept for the next round
            del self.pending[i]
            if error is None:
                node.put_back(conn)
                error = redis.exceptions.TimeoutError(f"Connected to {node.name} too late")
            replies[i] = error
        for i, node in self.pending.items():
            allowed = connect_budget(node, self.timeout)
            node.connected(_OVERDUE, allowed)  # the next round need not wait for it again
            replies[i] = redis.exceptions.TimeoutError(
                f"not connected to {node.name} by the time a quorum answered"
                if decided
                else f"Timeout connecting to {node.name} within {allowed:g}s"
            )


def open_connection(node: Node, conn: Any, budget: float, opening: Opening | None, i: int) -> None:
    """Connect ``conn`` (in a thread of
    :func:`~celery_redlock.core.connect.connector`) and hand it to the round,
    or to the node's idle connections if the round has ended (or if this is
    the circuit breaker's probe, ``opening`` None)."""
    error: Exception | None = None
    try:
        connect_within(conn, budget)
        if node.lean:
            set_nonblocking(conn)
    except Exception as exc:  # whatever it is, the round must hear back
        node.discard(conn)
        error = as_redis_error(exc, node.name)
    node.connected(error, budget, probe=opening is None)
    if opening is None or not opening.finished(i, conn, error):
        if error is None:
            node.put_back(conn)


def connect_budget(node: Node, timeout: float) -> float:
    """Seconds a new connection to ``node`` gets to open, in a round of ``timeout``."""
    return node.connect_timeout or timeout


def connect_within(conn: Any, budget: float) -> None:
    """Connect, handshake included, within ``budget`` seconds (or the
    connection's shorter connect timeout: a client given as it is keeps its
    own); the handshake's replies get that time too, later replies the
    connection's socket timeout (no longer than ``budget``) again."""
    limit = conn.socket_connect_timeout
    if limit is None or limit > budget:
        limit = budget
    kept = conn.socket_timeout
    conn.socket_connect_timeout = conn.socket_timeout = limit
    try:
        conn.connect()
    finally:
        conn.socket_timeout = kept if kept is not None and kept < limit else limit
