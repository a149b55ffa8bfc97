"""One round: a command sent to every node at once, one reply per node.

Every quorum operation reaches the nodes through :func:`gather` (a plain
command) or :func:`run_script` (a script): it writes one command to every
node, then reads the replies against a single deadline, so the nodes work in
parallel, no thread is created, and a hung node costs at most the deadline,
never more (a round that opens a connection waits for it up to the node's
connect timeout, then gives the replies the deadline's length from there),
and once a quorum answered, hardly anything (:mod:`.collect`).
The bytes are exchanged by :mod:`~celery_redlock.core.nodes.redis.wire`
(one ``poll`` over the sockets of the round, in :mod:`.collect`), new
connections are opened by :mod:`~celery_redlock.core.nodes.redis.opening`.

With ``min_replicas``, :func:`run_script` pipelines ``WAIT`` behind the
scripts a lease or a claim rests on in the same round (:mod:`.replicas`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

import redis
from redis.crc import key_slot
from redis.exceptions import AskError, NoScriptError

from .. import codec
from ..scripts import Script
from .cluster import BATCHES, LockNode, Part, combine, cross_call, cross_slot, map_all
from .collect import collect, read_other
from .node import Node
from .opening import Opening
from .replicas import confirmed, wait_after
from .wire import (
    LAST_LOOK,
    RECONNECT,
    Call,
    Command,
    start,
)

__all__ = ["gather", "run_script"]

logger = logging.getLogger("celery_redlock.redlock")


def gather(
    nodes: Sequence[LockNode],
    args: Sequence[Any],
    timeout: float,
    then: Sequence[Any] | None = None,
    needed: int | None = None,
) -> list[Any]:
    """Send one command to every node at once and collect the replies.

    Every command is written before any reply is read, so the nodes work in
    parallel; the replies are then read as they come, each read bounded by what
    is left of the one deadline. A round that opens no connection therefore
    lasts at most ``timeout``, whatever hangs, and meanwhile the replies of the
    others wait in socket buffers.

    A node with no idle connection gets a new one, opened (connect and
    handshake) in the background within the node's connect timeout
    (:class:`~celery_redlock.core.nodes.redis.opening.Opening`): the round does not wait
    for it before sending to the other nodes; it waits up to that connect
    timeout for the connection, and ``timeout`` from then for the replies,
    so a round that opens connections lasts at most connect timeout +
    ``timeout``. A connection that connects after the round ended goes to the
    node's idle connections for the next round. A node whose connects time
    out is skipped for a while (its circuit breaker,
    :meth:`Node.skips_connects <celery_redlock.core.nodes.redis.node.Node.skips_connects>`):
    its reply is an error at once.

    With ``needed``, the round ends once that many nodes answered: a node
    still connecting (its connect goes on in the background, as above) or
    whose reply has not come is "not answering" (:func:`_cut`), so a dead
    minority never holds a round a quorum decided.

    Args:
        nodes: where to send it.
        args: the command, the same for every node (packed once).
        timeout: one deadline for the whole round, in seconds.
        then: a second command, pipelined after the first on the same
            connection (written with it, in the same round trip), or None.
        needed: the answers that decide the round, or None: wait for every node.

    Returns:
        One item per node, in order: the reply, or the exception that stands
        for it (``ResponseError`` from the server, ``ConnectionError`` /
        ``TimeoutError`` for a node that failed or did not answer in time).
        With ``then``, a node's item is the pair of replies, or the first
        reply alone when that is an error.
    """
    if _some_cluster(nodes):
        return spread_command(nodes, args, timeout, then)
    command = Command(args) if then is None else Command(args, then)
    return gather_each(nodes, [command] * len(nodes), timeout, needed)  # type: ignore[arg-type]


def _some_cluster(nodes: Sequence[LockNode]) -> bool:
    """True when a node is a Redis Cluster (a loop: every round asks, and ``any``
    over a generator costs more than the question)."""
    for node in nodes:
        if node.cluster:
            return True
    return False


def gather_each(
    nodes: Sequence[Node],
    commands: Sequence[Command],
    timeout: float,
    needed: int | None = None,
) -> list[Any]:
    """:func:`gather` with a command of its own for each node (a shard master
    of a cluster gets the keys of its slots)."""
    started = time.monotonic()
    deadline = started + timeout
    replies: list[Any] = [None] * len(nodes)
    opening: Opening | None = None  # the round's new connections, if it needs any
    lean: list[Call] = []
    other: list[Call] = []
    for i, node in enumerate(nodes):
        conn = node.idle_connection()
        if conn is None:
            if opening is None:
                opening = Opening(commands, timeout)
            opening.open(i, node, replies)
            continue
        command = commands[i]
        call = Call(
            i, node, conn, True, command.wire if node.lean else command.packed(conn), command.count
        )
        error = start(call)
        if error is None:
            (lean if node.lean else other).append(call)
        elif error is RECONNECT:
            if opening is None:
                opening = Opening(commands, timeout)
            opening.open(i, node, replies)
        else:
            replies[i] = error
    answered = 0
    if other and opening is not None and needed is not None:
        # their answers count before the round decides whether to wait for a connect
        answered = read_other(other, started, deadline, replies, timeout, needed, 0)
        other = []
    if lean or opening is not None:
        deadline, answered = collect(
            lean, other, opening, started, deadline, replies, commands, timeout, needed, answered
        )
    if other:  # the lean calls alone (plain URLs, the rule) leave nothing to read here
        read_other(other, started, deadline, replies, timeout, needed, answered)
    return replies


def run_script(
    call: codec.Call, nodes: Sequence[LockNode], timeout: float, needed: int | None = None
) -> list[Any]:
    """Run ``call`` (a script, its KEYS and ARGV) on every node in one :func:`gather`
    round (ended once ``needed`` nodes answered, if given).

    Sent as EVALSHA; a node that lost its script cache (restart, SCRIPT FLUSH)
    gets EVAL in a second round, with a timeout of its own: a hung node must
    not use up the time of a node that merely restarted.

    On nodes with ``min_replicas``, a write a lease or a claim rests on is
    followed by ``WAIT`` in the same packet (:func:`.replicas.wait_after`);
    a node whose replicas fall short answers with a ``NotReplicated`` error,
    so it counts as a node that did not answer; such a round waits for every
    node (a reply is known to count only once its replicas are checked).
    """
    # nodes share their min_replicas: a plain master's round (the rule) asks no further
    wait = wait_after(call[0], nodes, timeout) if nodes and nodes[0].min_replicas else None
    if wait is not None:
        needed = None
    if _some_cluster(nodes):
        return _spread_script(call, nodes, timeout, wait, needed)
    return _masters_script(call, nodes, timeout, wait, needed)  # type: ignore[arg-type]


def _masters_script(
    call: codec.Call, nodes: Sequence[Node], timeout: float, wait: tuple | None, needed: int | None
) -> list[Any]:
    """:func:`run_script` on masters (plain nodes, or the shard masters of clusters)."""
    script, keys, args = call
    evalsha = ("EVALSHA", script.sha, len(keys), *keys, *args)
    # no cluster among masters: gather_each at once, without gather's look for one
    command = Command(evalsha) if wait is None else Command(evalsha, wait)
    replies = gather_each(nodes, [command] * len(nodes), timeout, needed)
    for reply in replies:  # a loop, not a list: NOSCRIPT is rare, a comprehension is a call
        if isinstance(reply, NoScriptError):
            evaluated = ("EVAL", script.text, len(keys), *keys, *args)
            _resend(nodes, evaluated, timeout, wait, replies)
            break
    if wait is not None:
        replies = [confirmed(node, reply) for node, reply in zip(nodes, replies)]
    return replies


def _resend(
    nodes: Sequence[Node], evaluated: tuple, timeout: float, wait: tuple | None, replies: list[Any]
) -> None:
    """Send the script's EVAL (``evaluated``), in a round of their own, to the nodes whose
    reply in ``replies`` is NOSCRIPT (their script cache was lost), and put their replies
    in its place."""
    missing = [i for i, reply in enumerate(replies) if isinstance(reply, NoScriptError)]
    resent = gather([nodes[i] for i in missing], evaluated, timeout, wait)
    for i, reply in zip(missing, resent):
        replies[i] = reply


# -- nodes that are clusters -------------------------------------------------------------------


def _spread_script(
    call: codec.Call, nodes: Sequence[Any], timeout: float, wait: tuple | None, needed: int | None
) -> list[Any]:
    """:func:`run_script` when some nodes are clusters: each cluster's call goes
    to the shard masters of its keys (one call per shard), every call of every
    node in the same round; a ``MOVED`` or ``ASK`` is followed once, within
    what is left of the round's timeout. A cluster's reply is put together
    from its shards' (:func:`~celery_redlock.core.nodes.redis.cluster.combine`)."""
    script, keys, args = call
    deadline = time.monotonic() + timeout
    replies: list[Any] = [None] * len(nodes)
    map_all(nodes, timeout)
    if script.name not in BATCHES and all(node.mapped for node in nodes if node.cluster):
        # One name, one slot: a plain round on the shard masters of that slot
        # (the lean path, one packing); only a redirect takes the long way.
        slot = key_slot(keys[0].encode())
        shards = [node.at_slot(slot) if node.cluster else node for node in nodes]
        replies = _masters_script(call, shards, timeout, wait, needed)
        every = list(range(len(keys)))
        sent = [
            (i, Part(node, shards[i], keys, args, every, False))
            for i, node in enumerate(nodes)
            if node.cluster and isinstance(replies[i], _REROUTE)
        ]
        for i, reply in _rerouted(script, sent, [replies[i] for i, _ in sent], deadline, wait):
            replies[i] = reply
        return replies
    sent = []
    for i, node in enumerate(nodes):
        if not node.cluster:
            sent.append((i, Part(None, node, keys, args, [], False)))
        elif not node.mapped:
            replies[i] = redis.exceptions.ConnectionError(f"{node.name}: no slot map")
        else:
            sent += [(i, part) for part in node.route(script.name, keys, args)]
    shards_of: dict[int, list[tuple[Part, Any]]] = {}
    got = _send(script, [p for _, p in sent], timeout, wait)
    for i, part, reply in _followed(script, sent, got, deadline, wait):
        shards_of.setdefault(i, []).append((part, reply))
    for i, node in enumerate(nodes):
        if replies[i] is None:
            mine = shards_of[i]
            replies[i] = combine(script.name, len(keys), mine) if node.cluster else mine[0][1]
    return replies


def _rerouted(
    script: Script,
    sent: list[tuple[int, Part]],
    got: list[Any],
    deadline: float,
    wait: tuple | None,
) -> list[tuple[int, Any]]:
    """The replies of one-name calls that a shard redirected (or failed), each
    cluster's put together again."""
    shards_of: dict[int, list[tuple[Part, Any]]] = {}
    for i, part, reply in _followed(script, sent, got, deadline, wait):
        shards_of.setdefault(i, []).append((part, reply))
    return [(i, combine(script.name, 0, mine)) for i, mine in shards_of.items()]


def _followed(
    script: Script,
    sent: list[tuple[int, Part]],
    got: list[Any],
    deadline: float,
    wait: tuple | None,
) -> list[tuple[int, Part, Any]]:
    """Each call's reply, a ``MOVED`` or ``ASK`` followed once (within what is
    left of the round's timeout); a shard that failed gets its cluster's slot
    map read again in the background."""
    done: list[tuple[int, Part, Any]] = []
    follow: list[tuple[int, Part]] = []
    for (i, part), reply in zip(sent, got):
        if part.node is not None and isinstance(reply, AskError):  # MOVED or ASK
            left = max(deadline - time.monotonic(), LAST_LOOK)
            follow += [(i, new) for new in part.node.redirected(script.name, part, reply, left)]
            continue
        if part.node is not None and isinstance(reply, _SHARD_DOWN):
            part.node.suspect()  # a failover may be under way: read the map again
        done.append((i, part, reply))
    if follow:
        left = max(deadline - time.monotonic(), LAST_LOOK)
        again = _send(script, [p for _, p in follow], left, wait)
        done += [(i, part, reply) for (i, part), reply in zip(follow, again)]
    return done


#: A shard's reply that may mean its master changed.
_SHARD_DOWN = (
    redis.exceptions.ConnectionError,
    redis.exceptions.ClusterDownError,
    redis.exceptions.TryAgainError,
)
#: A shard's reply that the long way handles: a redirect, or a shard down.
_REROUTE = (AskError, *_SHARD_DOWN)


def _send(script: Script, parts: Sequence[Part], timeout: float, wait: tuple | None) -> list[Any]:
    """One round of script calls, one per part (a NOSCRIPT gets EVAL in a second
    round, with a timeout of its own, as in :func:`run_script`)."""

    def commands(verb: str) -> list[Command]:
        shared: dict[tuple, Command] = {}  # one packing for the parts alike
        out = []
        for part in parts:
            which = cross_slot(script) if part.cross else script
            handle = which.sha if verb == "EVALSHA" else which.text
            alike = (id(part.keys), id(part.args), part.cross, part.asking)
            command = shared.get(alike)
            if command is None:
                call = (
                    cross_call(verb, handle, part.keys, part.args)
                    if part.cross
                    else (verb, handle, len(part.keys), *part.keys, *part.args)
                )
                pieces = [("ASKING",), call] if part.asking else [call]
                command = shared[alike] = Command(*pieces, *([wait] if wait else []))
            out.append(command)
        return out

    replies = _unask(parts, gather_each([p.shard for p in parts], commands("EVALSHA"), timeout))
    missing = [k for k, reply in enumerate(replies) if isinstance(reply, NoScriptError)]
    if missing:
        again = [parts[k] for k in missing]
        resent = commands("EVAL")
        resent = [resent[k] for k in missing]
        for k, reply in zip(
            missing, _unask(again, gather_each([p.shard for p in again], resent, timeout))
        ):
            replies[k] = reply
    if wait is not None:
        replies = [confirmed(part.shard, reply) for part, reply in zip(parts, replies)]
    return replies


def _unask(parts: Sequence[Part], replies: list[Any]) -> list[Any]:
    """The replies without ``ASKING``'s own."""
    for k, part in enumerate(parts):
        reply = replies[k]
        if part.asking and isinstance(reply, tuple):
            rest = reply[1:]
            replies[k] = rest[0] if len(rest) == 1 or isinstance(rest[0], Exception) else rest
    return replies


#: The commands whose second argument is their one key: sent to its shard.
_KEYED = frozenset({"GET", "DEL", "HGETALL", "PTTL", "EXISTS", "TYPE", "UNLINK", "ZRANGE"})


def spread_command(
    nodes: Sequence[Any], args: Sequence[Any], timeout: float, then: Sequence[Any] | None
) -> list[Any]:
    """:func:`gather` when some nodes are clusters: a command about a key goes
    to its shard; any other (``PING``) to every shard, and the cluster answers
    only if every shard does (with the first shard's reply)."""
    map_all(nodes, timeout)
    replies: list[Any] = [None] * len(nodes)
    targets: list[Node] = []
    owners: list[int] = []
    keyed = str(args[0]).upper() in _KEYED
    for i, node in enumerate(nodes):
        if not node.cluster:
            shards = [node]
        elif not node.mapped:
            replies[i] = redis.exceptions.ConnectionError(f"{node.name}: no slot map")
            continue
        else:
            shards = [node.slot_master(args[1])] if keyed else node.masters()
        targets += shards
        owners += [i] * len(shards)
    command = Command(args) if then is None else Command(args, then)
    got = gather_each(targets, [command] * len(targets), timeout)
    for i, reply in zip(owners, got):
        if nodes[i].cluster and isinstance(reply, _REROUTE):
            nodes[i].suspect()  # a reshard or a failover: read the map again
        if replies[i] is None or (
            isinstance(reply, Exception) and not isinstance(replies[i], Exception)
        ):
            replies[i] = reply
    return replies
