"""One round: a command sent to every node at once, one reply per node.

Every quorum operation reaches the nodes through :func:`gather` (a plain
command) or :func:`run_script` (a script): it writes one command to every
node, then reads the replies against a single deadline, so the nodes work in
parallel, no thread is created, and a hung node costs at most the deadline,
never more. The bytes are exchanged by :mod:`~celery_redlock.core.wire`
(one ``poll`` over the sockets of the round, here), new connections are
opened by :mod:`~celery_redlock.core.opening`.

With ``min_replicas``, :func:`run_script` pipelines ``WAIT`` behind the
scripts a lease or a claim rests on (:data:`CONFIRMED`) in the same round.
"""

from __future__ import annotations

import logging
import select
import time
from collections.abc import Sequence
from typing import Any

import redis
from redis.exceptions import NoScriptError, RedisError

from .nodes import Node
from .opening import Opening, connect_within
from .scripts import Script
from .wire import (
    LAST_LOOK,
    PENDING,
    RECONNECT,
    Call,
    as_redis_error,
    host_error,
    pack,
    read,
    start,
    step,
)

__all__ = ["CONFIRMED", "MAX_OWED", "NotReplicated", "gather", "run_script", "send_script"]

logger = logging.getLogger("celery_redlock.redlock")


def gather(
    nodes: Sequence[Node],
    args: Sequence[Any],
    timeout: float,
    then: Sequence[Any] | None = None,
) -> list[Any]:
    """Send one command to every node at once and collect the replies.

    Every command is written before any reply is read, so the nodes work in
    parallel; the replies are then read as they come, each read bounded by what
    is left of the one deadline. A hung node therefore costs at most ``timeout``
    in all, and meanwhile the replies of the others wait in socket buffers.

    A node with no idle connection gets a new one, opened (connect and
    handshake) in the background with a budget of ``timeout`` of its own
    (:class:`~celery_redlock.core.opening.Opening`): the round does not wait
    for it before sending to the other nodes, and a connect that finishes
    within the round has its command sent and its reply collected in the
    same round. A connection that connects after the round ended goes to the
    node's idle connections for the next round. A node whose connects time
    out is skipped for a while (its circuit breaker,
    :meth:`Node.skips_connects <celery_redlock.core.nodes.Node.skips_connects>`):
    its reply is an error at once.

    Args:
        nodes: where to send it.
        args: the command, the same for every node (packed once).
        timeout: one deadline for the whole round, in seconds.
        then: a second command, pipelined after the first on the same
            connection (written with it, in the same round trip), or None.

    Returns:
        One item per node, in order: the reply, or the exception that stands
        for it (``ResponseError`` from the server, ``ConnectionError`` /
        ``TimeoutError`` for a node that failed or did not answer in time).
        With ``then``, a node's item is the pair of replies, or the first
        reply alone when that is an error.
    """
    deadline = time.monotonic() + timeout
    replies: list[Any] = [None] * len(nodes)
    wire = pack(args) if then is None else pack(args) + pack(then)
    count = 1 if then is None else 2
    packed = None  # redis-py's packing, for the other nodes: their encoding may differ
    opening: Opening | None = None  # the round's new connections, if it needs any
    lean: list[Call] = []
    other: list[Call] = []
    for i, node in enumerate(nodes):
        conn = node.idle_connection()
        if conn is None:
            if opening is None:
                opening = Opening(args, then, wire, count, timeout)
            opening.open(i, node, replies)
            continue
        if not node.lean and packed is None:
            packed = conn.pack_commands([args] if then is None else [args, then])
        call = Call(i, node, conn, True, wire if node.lean else packed, count)
        error = start(call)
        if error is None:
            (lean if node.lean else other).append(call)
        elif error is RECONNECT:
            if opening is None:
                opening = Opening(args, then, wire, count, timeout)
            opening.open(i, node, replies)
        else:
            replies[i] = error
    if lean or opening is not None:
        _collect(lean, other, opening, deadline, replies, args, then, wire, count, timeout)
    for call in other:
        reply = read(call, deadline)
        if call.reused and _closed_by_server(reply):
            # A node redis-py talks to: its new connection is opened here, within the round.
            call.renew()
            try:
                connect_within(call.conn, max(deadline - time.monotonic(), LAST_LOOK))
            except (RedisError, OSError) as exc:
                call.node.discard(call.conn)
                replies[call.i] = as_redis_error(exc)
                continue
            reply = start(call) or read(call, deadline)
        replies[call.i] = reply
    return replies


def _collect(
    calls: list[Call],
    other: list[Call],
    opening: Opening | None,
    deadline: float,
    replies: list[Any],
    args: Sequence[Any],
    then: Sequence[Any] | None,
    wire: bytes,
    count: int,
    timeout: float,
) -> None:
    """Finish the lean calls and the round's new connections: one poll over the
    lean sockets and the wake-up pipe of the connections being opened, until
    the deadline. A new connection that connects in time has its command sent:
    a lean one is then watched here, another one joins ``other``."""
    poller = select.poll()
    waiting: dict[int, Call] = {}

    def watch(call: Call) -> None:
        poller.register(call.fd, select.POLLOUT if call.out else select.POLLIN)
        waiting[call.fd] = call

    for call in calls:
        watch(call)
    wake = -1
    if opening is not None:
        wake = opening.wake
        poller.register(wake, select.POLLIN)
    try:
        while waiting or (opening is not None and opening.pending):
            left = deadline - time.monotonic()
            # A reply already buffered is read even past the deadline.
            events = poller.poll(max(left, LAST_LOOK) * 1000)
            for fd, _ in events:
                if fd == wake and opening is not None:  # connections opened meanwhile
                    for i, node, conn in opening.take(replies):
                        command = opening.command_for(node, conn)
                        call = Call(i, node, conn, False, command, opening.count)
                        error = start(call)
                        if error is not None:
                            replies[i] = error
                        elif node.lean:
                            watch(call)
                        else:
                            other.append(call)
                    continue
                call = waiting.pop(fd)
                reply = step(call)
                if reply is PENDING:
                    watch(call)
                    continue
                poller.unregister(fd)
                if call.late:
                    _log_late(call)
                if call.reused and _closed_by_server(reply):
                    if opening is None:
                        opening = Opening(args, then, wire, count, timeout)
                        wake = opening.wake
                        poller.register(wake, select.POLLIN)
                    opening.open(call.i, call.node, replies)
                    continue
                replies[call.i] = reply
            if left <= 0 or not events:
                break
    finally:
        if opening is not None:
            opening.close(replies)
    for call in waiting.values():
        call.node.discard(call.conn)
        where = "writing to" if call.out else "reading from"
        replies[call.i] = redis.exceptions.TimeoutError(f"Timeout {where} {host_error(call.conn)}")


def _log_late(call: Call) -> None:
    for error in call.late:
        logger.info(
            "a command sent earlier to %s without waiting failed: %s; a key it was to "
            "delete is freed there by its TTL",
            call.node.name,
            error,
        )


#: Replies a connection may owe before :func:`send_script` waits on it instead.
MAX_OWED = 8


def send_script(
    script: Script, nodes: Sequence[Node], keys: Sequence[str], args: Sequence[Any]
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
    wire = pack(("EVAL", script.text, len(keys), *keys, *args))
    missed = []
    for i, node in enumerate(nodes):
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


def _closed_by_server(reply: Any) -> bool:
    # An idle connection the server closed meanwhile (a restart, a client
    # timeout) fails at once on reuse, not by timing out.
    return isinstance(reply, redis.exceptions.ConnectionError) and not isinstance(
        reply, redis.exceptions.TimeoutError
    )


#: The scripts whose writes a lease or a claim rests on: a grant, a renewal, a
#: fence write, a beat slot or enqueue claim, a debounce or throttle schedule.
#: On nodes with ``min_replicas``, each is followed by ``WAIT``. Deletions are
#: not: one a failover loses only leaves a key to its TTL.
CONFIRMED = frozenset(
    {
        "acquire",
        "acquire_rated",
        "acquire_permit_rated",
        "extend",
        "fence",
        "claim",
        "claim_next",
        "debounce",
        "throttle",
        "rate",
    }
)


class NotReplicated(RedisError):
    """A node's write that its replicas did not confirm in time: it does not count.

    Attributes:
        reply: the node's reply to the script, which stands only on the primary.
        confirmed: how many replicas confirmed it.
    """

    def __init__(self, message: str, reply: Any = None, confirmed: int = 0):
        super().__init__(message)
        self.reply = reply
        self.confirmed = confirmed


def run_script(
    script: Script, nodes: Sequence[Node], keys: Sequence[str], args: Sequence[Any], timeout: float
) -> list[Any]:
    """Run a script on every node in one :func:`gather` round.

    Sent as EVALSHA; a node that lost its script cache (restart, SCRIPT FLUSH)
    gets EVAL in a second round, with a timeout of its own: a hung node must
    not use up the time of a node that merely restarted.

    A script in :data:`CONFIRMED`, sent to nodes with ``min_replicas``, is
    followed on the same connection by ``WAIT min_replicas ms``, written in
    the same packet: the round costs no extra trip. ``ms`` is half the round's
    timeout, so that a server answers a shortfall while the round still
    waits (a server notices a WAIT timed out at its next tick, every
    ``1000 / hz`` ms), and the error says so. A node whose ``WAIT`` counts
    fewer replicas answers with a :class:`NotReplicated` error instead of its
    reply, so it counts as a node that did not answer.
    """
    wait = None
    if nodes and nodes[0].min_replicas and script.name in CONFIRMED:
        wait = ("WAIT", nodes[0].min_replicas, max(1, int(timeout * 500)))
    replies = gather(nodes, ("EVALSHA", script.sha, len(keys), *keys, *args), timeout, wait)
    missing = [i for i, reply in enumerate(replies) if isinstance(reply, NoScriptError)]
    if missing:
        resent = gather(
            [nodes[i] for i in missing],
            ("EVAL", script.text, len(keys), *keys, *args),
            timeout,
            wait,
        )
        for i, reply in zip(missing, resent):
            replies[i] = reply
    if wait is not None:
        replies = [_confirmed(node, reply) for node, reply in zip(nodes, replies)]
    return replies


def _confirmed(node: Node, reply: Any) -> Any:
    """A script's reply, if ``WAIT`` (pipelined after it) counted enough replicas."""
    if not isinstance(reply, tuple):
        return reply  # an error: the node did not answer, or the script failed
    reply, acked = reply
    if isinstance(acked, int) and acked >= node.min_replicas:
        return reply
    if isinstance(acked, Exception):
        return NotReplicated(f"{node.name}: WAIT failed: {acked}", reply)
    return NotReplicated(
        f"{node.name}: {acked} of {node.min_replicas} replicas confirmed the write in time",
        reply,
        acked,
    )
