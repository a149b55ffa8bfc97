"""The reading half of a round (:func:`~celery_redlock.core.nodes.redis.rounds.gather_each`):
its replies collected against one deadline, its new connections taken as they
open, and, once a quorum answered, the others waited for no longer than
:func:`~celery_redlock.core.nodes.cut_at`: a node still connecting or
unanswered then counts as not answering.
"""

from __future__ import annotations

import logging
import select
import time
from collections.abc import Sequence
from typing import Any

import redis
from redis.exceptions import NoScriptError, RedisError

from .. import cut_at
from .opening import Opening, connect_budget, connect_within
from .unwaited import MAX_OWED
from .wire import LAST_LOOK, PENDING, Call, Command, as_redis_error, host_error, read, start, step

__all__ = ["closed_by_server", "collect", "read_other"]

logger = logging.getLogger("celery_redlock.redlock")


def read_other(
    other: list[Call],
    started: float,
    deadline: float,
    replies: list[Any],
    timeout: float,
    needed: int | None,
    answered: int,
) -> int:
    """Read the replies of the calls redis-py talks to; once ``needed`` answered,
    the others until :func:`.cut_at` at most. Returns the answers counted."""
    decided = False
    for call in other:
        if needed is not None and answered >= needed and not decided:
            decided = True  # what has not come by then is "not answering"
            deadline = min(deadline, cut_at(started, time.monotonic(), timeout))
        reply = read(call, deadline)
        if call.reused and closed_by_server(reply):
            # A node redis-py talks to: its new connection is opened here, within
            # the round's bound (its connect budget from the round's start).
            call.renew()
            budget = started + connect_budget(call.node, timeout) - time.monotonic()
            try:
                connect_within(call.conn, max(budget, LAST_LOOK))
            except (RedisError, OSError) as exc:
                call.node.discard(call.conn)
                replies[call.i] = as_redis_error(exc, call.node.name)
                continue
            deadline = max(deadline, time.monotonic() + timeout)
            reply = start(call) or read(call, deadline)
        replies[call.i] = reply
        answered += _answer(reply)
    return answered


def collect(
    calls: list[Call],
    other: list[Call],
    opening: Opening | None,
    started: float,
    deadline: float,
    replies: list[Any],
    commands: Sequence[Command],
    timeout: float,
    needed: int | None = None,
    answered: int = 0,
) -> tuple[float, int]:
    """Finish the lean calls and the round's new connections: one poll over the
    lean sockets and the wake-up pipe of the connections being opened, until
    the deadline. A new connection that connects in time has its command sent:
    a lean one is then watched here, another one joins ``other``.

    While a connect is under way the round waits for it (up to its budget,
    ``Opening.until``), and a connection taken moves the deadline to
    ``timeout`` from then; but once ``needed`` nodes answered (``answered``
    before this), the others are waited for until :func:`.cut_at` at most, a
    connect no longer. Returns the deadline, for the replies of ``other``, and
    the answers.
    """
    poller = select.poll()
    waiting: dict[int, Call] = {}

    def watch(call: Call) -> None:
        poller.register(call.fd, select.POLLOUT if call.out else select.POLLIN)
        waiting[call.fd] = call

    for call in calls:  # watch(call), inline: a call per node
        poller.register(call.fd, select.POLLOUT if call.out else select.POLLIN)
        waiting[call.fd] = call
    wake = -1
    if opening is not None:
        wake = opening.wake
        poller.register(wake, select.POLLIN)
    until: float | None = None  # when the others stop being waited for, once decided
    try:
        while waiting or (opening is not None and opening.pending):
            now = time.monotonic()
            if until is None and needed is not None and answered >= needed:
                until = cut_at(started, now, timeout)
                deadline = min(deadline, until)
            if opening is None:  # the rule: nothing to connect, the deadline (cut) alone
                left = deadline - now
            else:
                end = deadline if not opening.pending else opening.until
                end = max(end, deadline) if until is None else min(end, until)
                left = end - now
            # A reply already buffered is read even past the deadline.
            events = poller.poll(max(left, LAST_LOOK) * 1000)
            for fd, _ in events:
                if fd == wake and opening is not None:  # connections opened meanwhile
                    taken = opening.take(replies)
                    if taken and until is None:
                        deadline = max(deadline, time.monotonic() + timeout)
                    for i, node, conn in taken:
                        command = opening.command_for(i, node, conn)
                        call = Call(i, node, conn, False, command, commands[i].count)
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
                # an answer (:func:`_answer`) counted inline, one check for a reply: the rule
                if not isinstance(reply, Exception):
                    answered += 1
                elif call.reused and closed_by_server(reply):
                    if opening is None:
                        opening = Opening(commands, timeout)
                        wake = opening.wake
                        poller.register(wake, select.POLLIN)
                    opening.open(call.i, call.node, replies)
                    continue
                elif isinstance(reply, NoScriptError):
                    answered += 1
                replies[call.i] = reply
            if left <= 0 or not events:
                break
    finally:
        if opening is not None:
            opening.close(replies, until is not None)
    for call in waiting.values():
        replies[call.i] = _cut(call) if until is not None else _timed_out(call)
    return deadline, answered


def _answer(reply: Any) -> bool:
    """Whether ``reply`` is a node's answer, for deciding a round: a reply, or
    NOSCRIPT (the node is there; :func:`run_script` sends it EVAL next)."""
    return not isinstance(reply, Exception) or isinstance(reply, NoScriptError)


def _timed_out(call: Call) -> Exception:
    call.node.discard(call.conn)
    where = "writing to" if call.out else "reading from"
    return redis.exceptions.TimeoutError(f"Timeout {where} {host_error(call.conn)}")


def _cut(call: Call) -> Exception:
    """A call whose node had not answered when the round was decided: its
    connection goes back owing the reply (the next round on it reads that first
    and sets it aside) when the command went out whole and nothing of the reply
    came yet, and not too many are owed already; otherwise it is closed."""
    owed = call.skip + call.count
    if call.out or call.buf or owed > MAX_OWED:
        call.node.discard(call.conn)
    else:
        call.node.put_back(call.conn, owed)
    return redis.exceptions.TimeoutError(
        f"no reply from {host_error(call.conn)} by the time a quorum answered"
    )


def _log_late(call: Call) -> None:
    for error in call.late:
        logger.info(
            "a command sent earlier to %s without waiting failed: %s; a key it was to "
            "delete is freed there by its TTL",
            call.node.name,
            error,
        )


def closed_by_server(reply: Any) -> bool:
    # An idle connection the server closed meanwhile (a restart, a client
    # timeout) fails at once on reuse, not by timing out.
    return isinstance(reply, redis.exceptions.ConnectionError) and not isinstance(
        reply, redis.exceptions.TimeoutError
    )
