"""A PostgreSQL node's calls from an event loop: a few connections per node and loop.

Each connection is a :class:`psycopg.AsyncConnection` (opened without blocking
the loop, the host resolved on it) whose libpq object is then driven as the
sync node drives its own: the same statements of :func:`.statements`, prepared
under the same names, with the same parameters, read with the same helpers of
:mod:`.node`, so a reply, an error and its ``heals`` are the sync node's. The
loop waits on the socket; nothing runs in a thread.

A call takes an idle connection of its node on its loop, or opens one (at most
:data:`MAX_OPEN` at once, ``connect_timeout``, the schema checked and the
statements prepared as the sync node does); it gets the node's ``timeout`` for
its reply, and nothing retries it, except as the sync node does: an idle
connection the server closed meanwhile is opened anew, once. A connection left
mid-call (timed out, or cut once a quorum answered) is closed, never reused.
After a fork, the child opens its own.
"""

from __future__ import annotations

import asyncio
import time
import weakref
from collections import deque
from typing import Any

import psycopg
from psycopg import pq

from ..guard import FORKS
from . import statements
from .node import (
    UNPREPARED,
    NodeError,
    PostgresNode,
    last_value,
    refused,
    reply_of,
)
from .wire import redis_shaped, results_read

__all__ = ["MAX_OPEN", "call_script"]

#: Connections open at once per node and event loop; a call beyond them waits
#: for one, within its timeout. Measured with ``benchmarks/asyncio_locks.py``.
MAX_OPEN = 4

# event loop -> node's id -> its connections there
_pools: weakref.WeakKeyDictionary[Any, dict[int, _Pool]] = weakref.WeakKeyDictionary()


def _wake(ready: asyncio.Future[bool], value: bool) -> None:
    if not ready.done():
        ready.set_result(value)


async def _ready(fd: int, writing: bool, deadline: float) -> bool:
    """Whether ``fd`` became readable (writable) before ``deadline``."""
    loop = asyncio.get_running_loop()
    ready: asyncio.Future[bool] = loop.create_future()
    if writing:
        loop.add_writer(fd, _wake, ready, True)
    else:
        loop.add_reader(fd, _wake, ready, True)
    timer = loop.call_later(deadline - time.monotonic(), _wake, ready, False)
    try:
        return await ready
    finally:
        timer.cancel()
        if writing:
            loop.remove_writer(fd)
        else:
            loop.remove_reader(fd)


async def _exchange(pg: Any, deadline: float) -> list[Any] | None:
    """Flush what was sent on ``pg``, then read each of its results (a reply cut
    off part-way is waited for, never blocked on); None once ``deadline`` passed."""
    while pg.flush() != 0:
        if not await _ready(pg.socket, True, deadline):
            return None
    results: list[Any] = []
    while not results_read(pg, results):
        if not await _ready(pg.socket, False, deadline):
            return None
    return results


async def _execute(pg: Any, sql: str, deadline: float) -> Any:
    """:func:`.node.execute` from the loop: the last value as JSON, or the error."""
    try:
        pg.send_query(sql.encode())
        results = await _exchange(pg, deadline)
    except Exception as exc:  # noqa: BLE001 - the connection broke
        return NodeError(str(exc))
    return TimeoutError("no reply in time") if results is None else last_value(results)


async def _statement(node: PostgresNode, pg: Any, sql: bytes, params: list[bytes | None],
                     deadline: float, limit: float) -> Any:  # fmt: skip
    """One statement's reply (its value, or the server's error); raises TimeoutError
    past ``deadline``, or psycopg's error where the connection broke."""
    name = node.statements.get(sql) if node.prepares else None
    if name is None:
        pg.send_query_params(sql, params)
    else:
        pg.send_query_prepared(name, params)
    results = await _exchange(pg, deadline)
    if results is None:
        raise TimeoutError(f"{node.name}: no reply in {limit:g}s")
    reply = reply_of(results[0] if results else None, node.name)
    if reply is UNPREPARED:  # nothing ran (a pooler's server connection): unprepared from now on
        node.prepares = False
        return await _statement(node, pg, sql, params, deadline, limit)
    return reply


class _Pool:
    """One node's connections on one event loop: the idle ones, and a turn for
    each call beyond :data:`MAX_OPEN` (no lock or semaphore: those would keep
    the loop alive, and its connections open, once the loop is gone)."""

    def __init__(self, node: PostgresNode):
        self.node = node
        self.forks = FORKS.count  # a forked child opens its own
        self.idle: list[psycopg.AsyncConnection[Any]] = []
        self.busy = 0
        self.turns: deque[asyncio.Future[bool]] = deque()

    async def call(self, sql: bytes, params: list[bytes | None], limit: float) -> Any:
        """The reply to one statement; raises the node's error."""
        node = self.node
        deadline = time.monotonic() + limit  # a wait for a turn is part of the call's time
        if not await self._turn(deadline):
            raise TimeoutError(f"{node.name}: no reply in {limit:g}s")
        conn = None
        try:
            reused = bool(self.idle)
            conn = self.idle.pop() if reused else await self._open(limit)
            while True:
                if not reused:  # the reply's timeout starts once connected, as the sync node's
                    deadline = time.monotonic() + limit
                try:
                    reply = await _statement(node, conn.pgconn, sql, params, deadline, limit)
                except psycopg.Error as exc:
                    reply = NodeError(f"{node.name}: {exc}")
                if not isinstance(reply, Exception) or conn.pgconn.status == pq.ConnStatus.OK:
                    break
                _close(conn)  # broken: an idle one the server closed goes again, once
                conn = None
                if not reused:
                    raise reply
                reused = False
                conn = await self._open(limit)
            if conn.pgconn.transaction_status == pq.TransactionStatus.IDLE:
                self.idle.append(conn)
                conn = None
            return reply
        finally:
            if conn is not None:  # left mid-call (timed out, cancelled): never reused
                _close(conn)
            self._pass_turn()

    async def _turn(self, deadline: float) -> bool:
        """Wait for a call's turn (fewer than :data:`MAX_OPEN` under way): False past
        ``deadline``."""
        if self.busy < MAX_OPEN:
            self.busy += 1
            return True
        loop = asyncio.get_running_loop()
        turn: asyncio.Future[bool] = loop.create_future()
        self.turns.append(turn)
        timer = loop.call_later(deadline - time.monotonic(), _wake, turn, False)
        try:
            return await turn  # True: handed over by a call that ended
        except BaseException:  # cancelled: a turn handed over meanwhile goes on
            if turn.done() and not turn.cancelled() and turn.result():
                self._pass_turn()
            raise
        finally:
            timer.cancel()
            if turn in self.turns:
                self.turns.remove(turn)

    def _pass_turn(self) -> None:
        while self.turns:
            turn = self.turns.popleft()
            if not turn.done():
                turn.set_result(True)
                return
        self.busy -= 1

    async def _open(self, limit: float) -> psycopg.AsyncConnection[Any]:
        """A new connection, its schema checked and statements prepared, as the sync node's."""
        node = self.node
        skipped = node.skipped()
        if skipped is not None:
            raise skipped
        budget = node.connect_timeout or limit
        deadline = time.monotonic() + budget
        opening = psycopg.AsyncConnection.connect(
            node.conninfo.decode(), autocommit=True, prepare_threshold=None
        )
        try:
            conn = await asyncio.wait_for(opening, budget)
        except asyncio.TimeoutError:
            node.breaker.timed_out(budget)
            raise TimeoutError(f"{node.name}: no connect in {budget:g}s") from None
        except psycopg.Error as exc:
            raise refused(node.name, str(exc).removeprefix("connection failed: ")) from None
        node.breaker.answered()
        try:
            problem = None if node._checked else await self._checked(conn.pgconn, deadline)
            if problem is None and node.prepares:  # as is preparing the statements
                prepared = await _execute(conn.pgconn, node.prepare_sql, deadline)
                if isinstance(prepared, TimeoutError):
                    problem = TimeoutError(f"{node.name}: no connect in {budget:g}s")
                else:  # refused (a pooler's server connection had them already): unprepared
                    node.prepares = not isinstance(prepared, Exception)
        except BaseException:
            _close(conn)
            raise
        if problem is not None:
            _close(conn)
            raise problem
        return conn

    async def _checked(self, pg: Any, deadline: float) -> Exception | None:
        """:meth:`.PostgresNode.check`'s steps, each statement run from the loop."""
        steps = self.node.checking(pg, deadline)
        answer = None
        while True:
            try:
                sql, until = steps.send(answer)
            except StopIteration as done:
                return done.value
            answer = await _execute(pg, sql, until)


def _close(conn: psycopg.AsyncConnection[Any]) -> None:
    conn.pgconn.finish()  # no reply to wait for: the loop is not held


def _forget(pools: dict[int, _Pool]) -> None:
    """Close a gone loop's connections, unless they are a parent process's."""
    for pool in pools.values():
        if pool.forks == FORKS.count:
            for conn in pool.idle:
                _close(conn)


def _pool(node: PostgresNode) -> _Pool:
    loop = asyncio.get_running_loop()
    pools = _pools.get(loop)
    if pools is None:
        pools = _pools[loop] = {}
        weakref.finalize(loop, _forget, pools)
    pool = pools.get(id(node))
    if pool is None or pool.forks != FORKS.count:  # connections made before a fork: not ours
        pool = pools[id(node)] = _Pool(node)
    return pool


async def call_script(node: PostgresNode, script: Any, keys: Any, args: Any, limit: float) -> Any:
    """``script`` on ``node`` as the sync node runs it: its reply in Redis's shapes,
    or the node's error (returned, never raised)."""
    ((sql, params),) = statements((script, keys, args), [node])
    try:
        return redis_shaped(await _pool(node).call(sql, params, limit))
    except Exception as exc:  # an error is the node's reply
        return exc
