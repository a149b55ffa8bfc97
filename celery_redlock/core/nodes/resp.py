"""A Redis node's calls from an event loop: one pipelined RESP2 connection per node and loop.

Each call writes its command and waits for the future queued behind the ones
before it: Redis answers a connection's commands in order, so a reply is
the oldest waiting future's. A call that timed out leaves its future in the
queue, cancelled: its late reply is read and dropped, and the connection
stays in step (no reconnect after a timeout). A connection that closes fails
every waiting call, and the next call opens a new one (``connect_timeout``,
then ``AUTH`` and ``SELECT`` pipelined before the first command).
"""

from __future__ import annotations

import asyncio
import weakref
from collections import deque
from typing import Any

from redis.exceptions import NoScriptError, ResponseError

from .redis.wire import pack

__all__ = ["call_script"]

_INCOMPLETE = object()
# event loop -> node -> its connection (or the task opening it)
_conns: weakref.WeakKeyDictionary[Any, dict[int, Any]] = weakref.WeakKeyDictionary()


def _error(text: bytes) -> ResponseError:
    message = text.decode(errors="replace")
    return NoScriptError(message) if message.startswith("NOSCRIPT") else ResponseError(message)


def parse(buf: bytearray, pos: int) -> tuple[Any, int]:
    """One reply from ``buf`` at ``pos``: (value, next position), or (_INCOMPLETE, pos)."""
    end = buf.find(b"\r\n", pos)
    if end < 0:
        return _INCOMPLETE, pos
    kind, line = buf[pos : pos + 1], bytes(buf[pos + 1 : end])
    after = end + 2
    if kind == b":":
        return int(line), after
    if kind == b"$":
        n = int(line)
        if n < 0:
            return None, after
        if len(buf) < after + n + 2:
            return _INCOMPLETE, pos
        return bytes(buf[after : after + n]), after + n + 2
    if kind == b"*":
        n = int(line)
        if n < 0:
            return None, after
        items = []
        for _ in range(n):
            item, after = parse(buf, after)
            if item is _INCOMPLETE:
                return _INCOMPLETE, pos
            items.append(item)
        return items, after
    if kind == b"+":
        return line, after
    if kind == b"-":
        return _error(line), after
    raise ResponseError(f"unexpected reply type {kind!r}")


class Connection(asyncio.Protocol):
    """One node's pipelined connection on one loop."""

    def __init__(self) -> None:
        self.buf = bytearray()
        self.waiting: deque[asyncio.Future[Any]] = deque()
        self.transport: asyncio.Transport | None = None
        self.closed = False

    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        buf = self.buf
        buf += data
        pos = 0
        try:
            while self.waiting:
                value, pos = parse(buf, pos)
                if value is _INCOMPLETE:
                    break
                future = self.waiting.popleft()
                if not future.done():
                    future.set_result(value)
        except Exception as exc:  # a reply out of step: this connection is done for
            self._fail(exc)
            return
        del buf[:pos]

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail(exc or ConnectionError("connection closed"))

    def _fail(self, exc: BaseException) -> None:
        self.closed = True
        waiting, self.waiting = self.waiting, deque()
        for future in waiting:
            if not future.done():
                future.set_result(ConnectionError(str(exc)))
        if self.transport is not None:
            self.transport.abort()

    def send(self, *args: Any) -> asyncio.Future[Any]:
        future = asyncio.get_running_loop().create_future()
        self.waiting.append(future)
        assert self.transport is not None
        self.transport.write(pack(args))
        return future


async def _open(node: Any) -> Connection:
    loop = asyncio.get_running_loop()
    kw = node.pool.connection_kwargs
    if kw.get("path"):
        opening = loop.create_unix_connection(Connection, kw["path"])
    else:
        host, port = kw.get("host") or "localhost", int(kw.get("port") or 6379)
        opening = loop.create_connection(Connection, host, port)
    _, conn = await asyncio.wait_for(opening, node.connect_timeout)
    hello = []
    if kw.get("password"):
        user = kw.get("username")
        auth = ("AUTH", user, kw["password"]) if user else ("AUTH", kw["password"])
        hello.append(conn.send(*auth))
    if kw.get("db"):
        hello.append(conn.send("SELECT", kw["db"]))
    for reply in await asyncio.wait_for(asyncio.gather(*hello), node.connect_timeout):
        if isinstance(reply, Exception):
            conn._fail(reply)
            raise reply
    return conn


async def _connection(node: Any) -> Connection:
    loop = asyncio.get_running_loop()
    per_loop = _conns.get(loop)
    if per_loop is None:
        per_loop = _conns[loop] = {}
    held = per_loop.get(id(node))
    if isinstance(held, Connection) and not held.closed:
        return held
    failed = (
        isinstance(held, asyncio.Task)
        and held.done()
        and (held.cancelled() or held.exception() is not None)
    )
    if not isinstance(held, asyncio.Task) or failed:
        held = per_loop[id(node)] = asyncio.ensure_future(_open(node))
    try:
        conn = await asyncio.shield(held)
    except BaseException:
        if per_loop.get(id(node)) is held:
            del per_loop[id(node)]
        raise
    per_loop[id(node)] = conn
    return conn


async def call_script(node: Any, script: Any, keys: Any, args: Any, limit: float) -> Any:
    """``script`` on ``node`` (EVALSHA, EVAL on NOSCRIPT): its reply or error, within
    ``limit`` seconds once connected."""
    conn = await _connection(node)
    reply = await asyncio.wait_for(conn.send("EVALSHA", script.sha, len(keys), *keys, *args), limit)
    if isinstance(reply, NoScriptError):
        reply = await asyncio.wait_for(
            conn.send("EVAL", script.text, len(keys), *keys, *args), limit
        )
    if isinstance(reply, BaseException):
        raise reply
    return reply
