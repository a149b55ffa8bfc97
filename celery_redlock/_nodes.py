"""Redis nodes and the one scatter-gather helper every quorum operation uses.

Each node gets its own connection pool with fail-fast settings: a small
socket and connect timeout and **no client-side retries** (redis-py 8 retries
ten times by default, which turns a dead node into a multi-second stall and
re-sends commands that are not idempotent).

:func:`gather` writes one command to every node, then reads the replies
against a single deadline: the nodes work in parallel, no thread is created,
and a hung node costs at most the deadline, never more.

redis-py opens every connection (connect, AUTH, SELECT), but for a node built
from a ``redis://`` or ``unix://`` URL the round itself bypasses it: this
module packs the command once, writes it to each non-blocking socket, waits on
all of them with one ``poll`` and parses the RESP2 replies itself. redis-py's
per-command path (a timeout set, a poll and a send per node, then a poll and a
recv per reply, plus its parser) costs more client CPU and system calls than
the round trip on a fast network. Other nodes (``rediss://``, ``redis.Redis``
clients with settings of their own, test doubles) go through redis-py's
``send_packed_command`` / ``read_response``.
"""

from __future__ import annotations

import os
import re
import select
import time
from collections.abc import Sequence
from typing import Any, Union
from urllib.parse import urlsplit

import redis
from redis._parsers import BaseParser, Encoder
from redis._parsers.socket import SERVER_CLOSED_CONNECTION_ERROR
from redis.exceptions import InvalidResponse, NoScriptError, RedisError, ResponseError

from ._scripts import Script
from .exceptions import ConfigurationError

__all__ = ["Node", "gather", "run_script", "mask_url", "NodeSpec"]

NodeSpec = Union[str, "redis.Redis"]

_SCHEMES = ("redis", "rediss", "unix")


class Node:
    """One independent Redis master.

    Args:
        spec: a URL (``redis://``, ``rediss://``, ``unix://``) or a ``redis.Redis``.
            A client is used as given: its own timeouts and retries apply.
        timeout: socket and connect timeout in seconds for a node built from a URL.
    """

    __slots__ = ("name", "pool", "lean", "_identity", "_idle", "_pid")

    def __init__(self, spec: NodeSpec, timeout: float):
        if isinstance(spec, str):
            scheme = urlsplit(spec).scheme
            if scheme not in _SCHEMES:
                raise ConfigurationError(
                    f"Redis node URL {mask_url(spec)!r} must start with one of "
                    + ", ".join(f"{s}://" for s in _SCHEMES)
                )
            try:
                client = redis.Redis.from_url(
                    spec,
                    socket_timeout=timeout,
                    socket_connect_timeout=timeout,
                    retry=None,
                    health_check_interval=0,
                    # RESP2 and no CLIENT SETINFO: a new connection costs no
                    # extra round trip, so a hung node cannot stall a connect.
                    protocol=2,
                    driver_info=None,
                )
            except (ValueError, TypeError) as exc:
                raise ConfigurationError(f"Redis node URL {mask_url(spec)!r}: {exc}") from exc
            self.name = mask_url(spec)
        elif isinstance(spec, redis.Redis):
            client = spec
            self.name = _describe(client)
        else:
            raise ConfigurationError(
                f"a Redis node must be a URL or a redis.Redis client, not {type(spec).__name__}"
            )
        self.pool = client.connection_pool
        kw = self.pool.connection_kwargs
        #: Whether :func:`gather` talks to this node's sockets itself: only for
        #: plain sockets whose replies redis-py would hand over undecoded (a
        #: URL's query string may still ask for RESP3 or decoding), and only
        #: where ``select.poll`` exists (not on Windows).
        self.lean = (
            isinstance(spec, str)
            and self.pool.connection_class in (redis.Connection, redis.UnixDomainSocketConnection)
            and str(kw.get("protocol", 2)) == "2"
            and not kw.get("decode_responses")
            and kw.get("encoding", "utf-8") == "utf-8"
            and hasattr(select, "poll")
        )
        # redis-py's defaults (localhost:6379) filled in, so "redis://h" and
        # "redis://h:6379/0" are seen as the same server.
        self._identity: tuple[Any, ...]
        if kw.get("path"):
            self._identity = (kw["path"], None, kw.get("db", 0))
        else:
            host, port = kw.get("host") or "localhost", int(kw.get("port") or 6379)
            self._identity = (host, port, kw.get("db", 0))
        if isinstance(spec, redis.Redis) and "server" in kw:  # fakeredis: one server per node
            self._identity = ("fake", id(kw["server"]), kw.get("db", 0))
        # Idle connections of this process. A plain list, not the pool's
        # checkout (its lock and bookkeeping cost more than the round trip on
        # loopback); list.pop and list.append are atomic, so threads may share it.
        self._idle: list[Any] = []
        self._pid = os.getpid()

    def connection(self) -> tuple[Any, bool]:
        """An idle connection of this process (and True), or a new one (and False).

        A new one connects on its first send.
        """
        if self._pid != os.getpid():  # after fork: the parent's sockets are not ours
            self._idle = []
            self._pid = os.getpid()
        try:
            return self._idle.pop(), True
        except IndexError:
            return self.new_connection(), False

    def new_connection(self) -> Any:
        return self.pool.connection_class(**self.pool.connection_kwargs)

    def put_back(self, conn: Any) -> None:
        self._idle.append(conn)

    def discard(self, conn: Any) -> None:
        """Close a connection that may hold an unread or half-read reply: it is never reused."""
        try:
            conn.disconnect()
        except (RedisError, OSError):
            pass

    def close(self) -> None:
        """Close this process's idle connections."""
        idle, self._idle = self._idle, []
        for conn in idle:
            self.discard(conn)

    @property
    def identity(self) -> tuple:
        """What makes two nodes the same Redis database (for duplicate detection)."""
        return self._identity

    def __repr__(self) -> str:
        return f"<Node {self.name}>"


# user:password@ (greedy: a password may contain "@"; a "/" or a space ends the
# URL), and a password given in the query string.
_URL_PASSWORD = re.compile(r"(://[^:/@\s,]*:)[^\s/]+@")
_QUERY_PASSWORD = re.compile(r"(password=)[^&\s]+", re.IGNORECASE)


def mask_url(text: str) -> str:
    """``text`` with the password of every Redis URL in it replaced by ``***``.

    For messages and logs: ``redis://user:pw@h`` and ``unix:///s?password=pw``
    alike, one URL or a list of them.
    """
    return _QUERY_PASSWORD.sub(r"\1***", _URL_PASSWORD.sub(r"\1***@", text))


def _describe(client: redis.Redis) -> str:
    kw = client.connection_pool.connection_kwargs
    if kw.get("path"):
        return f"unix://{kw['path']}"
    return f"redis://{kw.get('host', '?')}:{kw.get('port', '?')}/{kw.get('db', 0)}"


def gather(nodes: Sequence[Node], args: Sequence[Any], timeout: float) -> list[Any]:
    """Send one command to every node at once and collect the replies.

    Every command is written before any reply is read, so the nodes work in
    parallel; the replies are then read as they come, each read bounded by what
    is left of the one deadline. A hung node therefore costs at most ``timeout``
    in all, and meanwhile the replies of the others wait in socket buffers.

    Args:
        nodes: where to send it.
        args: the command, the same for every node (packed once).
        timeout: one deadline for the whole round, in seconds.

    Returns:
        One item per node, in order: the reply, or the exception that stands
        for it (``ResponseError`` from the server, ``ConnectionError`` /
        ``TimeoutError`` for a node that failed or did not answer in time).
    """
    deadline = time.monotonic() + timeout
    replies: list[Any] = [None] * len(nodes)
    wire = _pack(args)
    packed = None  # redis-py's packing, for the other nodes: their encoding may differ
    calls = []
    for i, node in enumerate(nodes):
        conn, reused = node.connection()
        if not node.lean and packed is None:
            packed = conn.pack_command(*args)
        calls.append(_Call(i, node, conn, reused, wire if node.lean else packed))
    # Connected nodes first: a new connection may wait on a handshake (AUTH,
    # SELECT) with a hung node, and meanwhile the others are already working.
    calls.sort(key=lambda call: not call.reused)
    lean: list[_Call] = []
    other: list[_Call] = []
    for call in calls:
        error = _start(call, deadline)
        if error is not None:
            replies[call.i] = error
        else:
            (lean if call.node.lean else other).append(call)
    if lean:
        _collect(lean, deadline, replies)
    for call in other:
        reply = _read(call, deadline)
        if call.reused and _closed_by_server(reply):
            call.renew()
            reply = _start(call, deadline) or _read(call, deadline)
        replies[call.i] = reply
    return replies


class _Call:
    """One node's command in flight: its connection and, on the lean path, the
    bytes still to send and the reply bytes received so far."""

    __slots__ = ("i", "node", "conn", "reused", "command", "out", "buf")

    def __init__(self, i: int, node: Node, conn: Any, reused: bool, command: Any):
        self.i, self.node, self.conn, self.reused, self.command = i, node, conn, reused, command
        self.out = self.buf = b""

    def renew(self) -> None:
        """Go on with a new connection (the server closed the reused one)."""
        self.conn, self.reused, self.buf = self.node.new_connection(), False, b""


def _start(call: _Call, deadline: float) -> RedisError | None:
    """Send the call's command, connecting first if its connection is new.

    Returns None, or the error that stands for the reply. A reused connection
    that fails is replaced once: the server may have closed it meanwhile, and
    every command we send is idempotent.
    """
    node, conn = call.node, call.conn
    try:
        if not call.reused:
            _connect_within(conn, deadline)
            if node.lean:  # from now on only poll says when it is ready
                conn._sock.setblocking(False)
        if node.lean:
            call.out = call.command
            _write(call)
        else:
            conn.send_packed_command(call.command, check_health=False)
    except (RedisError, OSError) as exc:
        node.discard(conn)
        if call.reused:
            call.renew()
            return _start(call, deadline)
        return _as_redis_error(exc)
    return None


def _collect(calls: list[_Call], deadline: float, replies: list[Any]) -> None:
    """Finish the lean calls: one poll over all their sockets, until the deadline."""
    poller = select.poll()
    waiting: dict[int, _Call] = {}

    def watch(call: _Call) -> None:
        fd = call.conn._sock.fileno()
        poller.register(fd, select.POLLOUT if call.out else select.POLLIN)
        waiting[fd] = call

    for call in calls:
        watch(call)
    while waiting:
        left = deadline - time.monotonic()
        # A reply already buffered is read even past the deadline.
        events = poller.poll(max(left, _LAST_LOOK) * 1000)
        for fd, _ in events:
            call = waiting.pop(fd)
            reply = _step(call)
            if reply is _PENDING:
                watch(call)
                continue
            poller.unregister(fd)
            if call.reused and _closed_by_server(reply):
                call.renew()
                reply = _start(call, deadline)
                if reply is None:
                    watch(call)
                    continue
            replies[call.i] = reply
        if left <= 0 or not events:
            break
    for call in waiting.values():
        call.node.discard(call.conn)
        where = "writing to" if call.out else "reading from"
        replies[call.i] = redis.exceptions.TimeoutError(
            f"Timeout {where} {call.conn._host_error()}"
        )


def _write(call: _Call) -> None:
    """Send what the socket takes now of the rest of the command."""
    try:
        call.out = call.out[call.conn._sock.send(call.out) :]
    except BlockingIOError:
        pass


def _step(call: _Call) -> Any:
    """Go on with a lean call whose socket poll reported: write or read.

    Returns ``_PENDING``, or the reply (or the error standing for it) once it
    is complete, the connection then put back or closed.
    """
    conn = call.conn
    try:
        if call.out:
            _write(call)
            return _PENDING
        chunk = conn._sock.recv(_READ_SIZE)
        if not chunk:
            raise redis.exceptions.ConnectionError(SERVER_CLOSED_CONNECTION_ERROR)
        call.buf += chunk
        reply = _parse(call.buf, 0)[0]
    except (_Partial, BlockingIOError):
        return _PENDING
    except (RedisError, OSError) as exc:
        call.node.discard(conn)
        return _as_redis_error(exc)
    except ValueError as exc:  # a length or an integer that is not one
        call.node.discard(conn)
        return InvalidResponse(f"Protocol error: {exc}")
    call.node.put_back(conn)
    return reply


def _read(call: _Call, deadline: float) -> Any:
    """One reply through redis-py, or the exception standing for it; the
    connection goes back or is closed."""
    try:
        # A reply already buffered is read even past the deadline.
        reply = call.conn.read_response(timeout=max(deadline - time.monotonic(), _LAST_LOOK))
    except ResponseError as exc:  # the server answered: the connection is fine
        reply = exc
    except (RedisError, OSError) as exc:
        call.node.discard(call.conn)
        return _as_redis_error(exc)
    call.node.put_back(call.conn)
    return reply


def _connect_within(conn: Any, deadline: float) -> None:
    """Connect, handshake included, within what is left of the round's deadline."""
    left = max(deadline - time.monotonic(), _LAST_LOOK)
    for attr in ("socket_connect_timeout", "socket_timeout"):
        configured = getattr(conn, attr, None)
        if configured is None or configured > left:
            setattr(conn, attr, left)
    conn.connect()


def _closed_by_server(reply: Any) -> bool:
    # An idle connection the server closed meanwhile (a restart, a client
    # timeout) fails at once on reuse, not by timing out.
    return isinstance(reply, redis.exceptions.ConnectionError) and not isinstance(
        reply, redis.exceptions.TimeoutError
    )


#: Seconds a read may still wait once the deadline has passed.
_LAST_LOOK = 0.001

#: Bytes asked of one recv: a reply of ours fits many times over.
_READ_SIZE = 65536

#: What :func:`_step` returns while the reply is still on its way.
_PENDING = object()


def _as_redis_error(exc: BaseException) -> RedisError:
    if isinstance(exc, RedisError):
        return exc
    return redis.exceptions.ConnectionError(str(exc) or type(exc).__name__)


# -- RESP2 on the wire -------------------------------------------------------------------------

_ENCODER = Encoder("utf-8", "strict", False)


def _pack(args: Sequence[Any]) -> bytes:
    """``args`` as one RESP command, as redis-py packs them with its default encoding."""
    out = [b"*%d\r\n" % len(args)]
    for arg in args:
        if isinstance(arg, str):
            arg = arg.encode()
        elif type(arg) is int:
            arg = b"%d" % arg
        elif not isinstance(arg, bytes):
            arg = _ENCODER.encode(arg)  # redis-py's rules for the rest (floats; bool refused)
        out.append(b"$%d\r\n%s\r\n" % (len(arg), arg))
    return b"".join(out)


class _Partial(Exception):
    """The buffer ends before the reply does: wait for more bytes."""


def _parse(buf: bytes, pos: int) -> tuple[Any, int]:
    """The RESP2 reply at ``buf[pos:]`` and the position after it.

    Returns what redis-py's RESP2 parser returns without decoding: bytes for
    strings, int, list, None for nil, and a ``ResponseError`` (the subclass
    redis-py picks) for a server error. An error that redis-py counts as a
    connection failure (``LOADING``, too many clients) is raised instead, as
    redis-py does. Raises ``_Partial`` if the reply is not all in ``buf``.
    """
    end = buf.find(b"\r\n", pos)
    if end < 0:
        raise _Partial
    kind, line, pos = buf[pos : pos + 1], buf[pos + 1 : end], end + 2
    if kind == b":":
        return int(line), pos
    if kind == b"$":
        size = int(line)
        if size < 0:
            return None, pos
        if len(buf) < pos + size + 2:
            raise _Partial
        return buf[pos : pos + size], pos + size + 2
    if kind == b"*":
        count = int(line)
        if count < 0:
            return None, pos
        items = []
        for _ in range(count):
            item, pos = _parse(buf, pos)
            items.append(item)
        return items, pos
    if kind == b"+":
        return line, pos
    if kind == b"-":
        error = BaseParser.parse_error(line.decode("utf-8", errors="replace"))
        if isinstance(error, redis.exceptions.ConnectionError):
            raise error
        return error, pos
    raise InvalidResponse(f"Protocol Error: {kind + line!r}")


def run_script(
    script: Script, nodes: Sequence[Node], keys: Sequence[str], args: Sequence[Any], timeout: float
) -> list[Any]:
    """Run a script on every node in one :func:`gather` round.

    Sent as EVALSHA; a node that lost its script cache (restart, SCRIPT FLUSH)
    gets EVAL in a second round, with a timeout of its own: a hung node must
    not use up the time of a node that merely restarted.
    """
    replies = gather(nodes, ("EVALSHA", script.sha, len(keys), *keys, *args), timeout)
    missing = [i for i, reply in enumerate(replies) if isinstance(reply, NoScriptError)]
    if missing:
        resent = gather(
            [nodes[i] for i in missing], ("EVAL", script.text, len(keys), *keys, *args), timeout
        )
        for i, reply in zip(missing, resent):
            replies[i] = reply
    return replies
