"""The bytes on the wire: the one module that touches redis-py's private names.

redis-py opens every connection (connect, AUTH, SELECT), but for a node built
from a ``redis://`` or ``unix://`` URL (:attr:`Node.lean
<celery_redlock.core.nodes.redis.node.Node.lean>`) a round bypasses it: the command is
packed once (:func:`pack`), written to each non-blocking socket
(:func:`start`), and the RESP2 replies are parsed here (:func:`step`,
:func:`parse`) as the round's one ``poll`` reports them. redis-py's
per-command path (a timeout set, a poll and a send per node, then a poll and
a recv per reply, plus its parser) costs more client CPU and system calls
than the round trip on a fast network. Other nodes (``rediss://``,
``sentinel://``, ``redis.Redis`` clients with settings of their own, test
doubles) go through redis-py's ``send_packed_command`` / ``read_response``
(:func:`read`).

redis-py internals
==================

This is the only module of the package that touches redis-py's private
names, and it is the one to check when ``install_requires`` (``redis<9``) and
the tox matrix (``redis{5,6,7,8}``) move to a new major. It uses, all present
with the same meaning from 5.0 to 8.x:

* ``redis._parsers.Encoder`` (``encode``) to pack values like redis-py does;
* ``redis._parsers.BaseParser.parse_error`` to map an error reply to redis-py's
  exception classes;
* ``redis._parsers.socket.SERVER_CLOSED_CONNECTION_ERROR`` (the message text);
* ``Connection._sock`` (the connected socket: ``setblocking``, ``settimeout``,
  ``fileno``, ``send``, ``recv``) and ``Connection._host_error()``
  (``host:port`` or the socket path, for error messages).

The one public difference between the majors that matters here, how to
read a reply within a timeout, is settled once in :func:`read`; how to turn
off ``CLIENT SETINFO`` on connect is settled in
:mod:`~celery_redlock.core.nodes.redis.urls`.
"""

from __future__ import annotations

import inspect
import ssl
import time
from collections.abc import Sequence
from typing import Any

import redis
from redis._parsers import BaseParser, Encoder
from redis._parsers.socket import SERVER_CLOSED_CONNECTION_ERROR
from redis.exceptions import InvalidResponse, ReadOnlyError, RedisError, ResponseError

from ...exceptions import NodeError
from .node import Node

__all__ = [
    "LAST_LOOK",
    "PENDING",
    "RECONNECT",
    "Call",
    "Command",
    "Partial",
    "as_redis_error",
    "demoted",
    "host_error",
    "pack",
    "parse",
    "read",
    "set_nonblocking",
    "start",
    "step",
]

#: Seconds a read may still wait once the deadline has passed.
LAST_LOOK = 0.001

#: Bytes asked of one recv: a reply of ours fits many times over.
_READ_SIZE = 65536

#: What :func:`step` returns while the reply is still on its way.
PENDING = object()

#: What :func:`start` returns when a reused connection failed: open a new one.
RECONNECT: Any = redis.exceptions.ConnectionError("reconnect")


class Command:
    """What a round sends on one connection: one command, or several
    pipelined (written together, their replies read in order), packed once
    for every node it goes to."""

    __slots__ = ("parts", "wire", "count", "_packed")

    def __init__(self, *parts: Sequence[Any]):
        self.parts = parts
        self.count = len(parts)
        self.wire = pack(parts[0]) if self.count == 1 else b"".join(map(pack, parts))
        self._packed: Any = None

    def packed(self, conn: Any) -> Any:
        """The command as redis-py packs it for ``conn`` (a node it talks to)."""
        if self._packed is None:
            self._packed = conn.pack_commands(list(self.parts))
        return self._packed


class Call:
    """One node's command in flight: its connection and, on the lean path, the
    bytes still to send, the reply bytes received so far and the socket's
    file descriptor (for the round's poll)."""

    __slots__ = (
        "i", "node", "conn", "reused", "command", "out", "buf", "count", "fd", "skip", "late",
    )  # fmt: skip

    def __init__(self, i: int, node: Node, conn: Any, reused: bool, command: Any, count: int = 1):
        self.i, self.node, self.conn, self.reused, self.command = i, node, conn, reused, command
        self.out = self.buf = b""
        self.fd = -1
        self.count = count  # replies expected: more than 1 when commands are pipelined
        # Replies the connection owed before this command (sent without waiting,
        # see Node.owed): read first and set aside; ``late`` keeps their errors.
        owed = node.owed
        self.skip = owed.pop(conn, 0) if reused and owed else 0
        self.late: tuple[Any, ...] = ()

    def renew(self) -> None:
        """Go on with a new connection, not yet connected (the server closed the reused one)."""
        self.conn, self.reused, self.buf = self.node.new_connection(), False, b""


def start(call: Call) -> Any:
    """Send the call's command on its connected connection.

    Returns None, the error that stands for the reply, or ``RECONNECT``: a
    reused connection that fails is replaced once (the server may have closed
    it meanwhile, and every command we send is idempotent).
    """
    try:
        if call.node.lean:
            call.fd = call.conn._sock.fileno()
            call.out = call.command
            _write(call)
        else:
            call.conn.send_packed_command(call.command, check_health=False)
    except (RedisError, OSError) as exc:
        call.node.discard(call.conn)
        return RECONNECT if call.reused else as_redis_error(exc, call.node.name)
    return None


def _write(call: Call) -> None:
    """Send what the socket takes now of the rest of the command."""
    try:
        call.out = call.out[call.conn._sock.send(call.out) :]
    except BlockingIOError:
        pass


def step(call: Call) -> Any:
    """Go on with a lean call whose socket poll reported: write or read.

    Returns :data:`PENDING`, or the reply (or the error standing for it) once it
    is complete, the connection then put back or closed.
    """
    conn = call.conn
    try:
        if call.out:
            _write(call)
            return PENDING
        chunk = conn._sock.recv(_READ_SIZE)
        if not chunk:
            raise redis.exceptions.ConnectionError(SERVER_CLOSED_CONNECTION_ERROR)
        call.buf += chunk
        pos = 0
        while call.skip:  # an earlier command's reply: set aside, then ours
            late, pos = parse(call.buf, pos)
            call.buf, pos = call.buf[pos:], 0
            call.skip -= 1
            if isinstance(late, Exception):
                call.late += (late,)
        reply, pos = parse(call.buf, pos)
        if call.count > 1:
            got = [reply]
            while len(got) < call.count:
                reply, pos = parse(call.buf, pos)
                got.append(reply)
            reply = _group(got)
    except (Partial, BlockingIOError):
        return PENDING
    except (RedisError, OSError) as exc:
        call.node.discard(conn)
        return as_redis_error(exc, call.node.name)
    except ValueError as exc:  # a length or an integer that is not one
        call.node.discard(conn)
        return InvalidResponse(f"Protocol error: {exc}")
    call.node.put_back(conn)
    return reply


def read(call: Call, deadline: float) -> Any:
    """One reply through redis-py, or the exception standing for it; the
    connection goes back or is closed."""
    got: list[Any] = []
    try:
        while len(got) < call.count:
            try:
                # A reply already buffered is read even past the deadline.
                got.append(_read_response(call.conn, max(deadline - time.monotonic(), LAST_LOOK)))
            except ResponseError as exc:  # the server answered: the connection is fine
                got.append(exc)
    except (RedisError, OSError) as exc:
        call.node.discard(call.conn)
        return as_redis_error(exc, call.node.name)
    if isinstance(got[0], ResponseError) and demoted(got[0]):  # (no call on every reply)
        # The master we are connected to is a replica now (a failover demoted
        # it; a script's write reports it as ERR on Redis 6): drop the
        # connection, so the next one asks the sentinels where the master is.
        call.node.discard(call.conn)
        return redis.exceptions.ConnectionError(f"the node is a replica now: {got[0]}")
    call.node.put_back(call.conn)
    return got[0] if call.count == 1 else _group(got)


def _read_response(conn: Any, timeout: float) -> Any:
    """``conn.read_response`` within ``timeout`` seconds.

    redis-py 6+ takes the timeout as an argument; redis-py 5's connections
    (and its Sentinel-managed ones) do not, so there the socket's own timeout
    is set for the read and put back after it.
    """
    if _takes_timeout(type(conn)):
        return conn.read_response(timeout=timeout)
    sock = conn._sock
    sock.settimeout(timeout)
    try:
        return conn.read_response()
    finally:
        if conn._sock is sock:  # still connected: back to its own timeout
            sock.settimeout(conn.socket_timeout)


_TAKES_TIMEOUT: dict[Any, bool] = {}


def _takes_timeout(cls: Any) -> bool:
    known = _TAKES_TIMEOUT.get(cls)
    if known is None:
        params = inspect.signature(cls.read_response).parameters
        known = _TAKES_TIMEOUT[cls] = "timeout" in params or any(
            p.kind is p.VAR_KEYWORD for p in params.values()
        )
    return known


def _group(got: list[Any]) -> Any:
    """The replies of pipelined commands: a tuple, or the first alone when it is an error."""
    return got[0] if isinstance(got[0], Exception) else tuple(got)


#: Refusals that waiting does not cure: the credentials (or a username sent to a
#: server without ACLs).
_NO_HEALING = (
    redis.exceptions.AuthenticationError,
    redis.exceptions.AuthenticationWrongNumberOfArgsError,
)


def as_redis_error(exc: BaseException, node: str | None = None) -> Exception:
    """``exc`` as the ``RedisError`` that stands for a node's reply; one that
    cannot heal (authentication refused, TLS verification failed) as a
    :class:`~celery_redlock.core.exceptions.NodeError` with ``heals`` False."""
    if isinstance(exc, _NO_HEALING) or _unverified(exc):
        where = f"{node}: " if node else ""
        return NodeError(f"{where}{exc or type(exc).__name__}", node, heals=False)
    if isinstance(exc, RedisError):
        return exc
    return redis.exceptions.ConnectionError(str(exc) or type(exc).__name__)


def _unverified(exc: BaseException | None) -> bool:
    """Whether ``exc`` (or an error it was raised from) is a failed TLS certificate check."""
    for _ in range(4):  # redis-py wraps the socket's error once or twice
        if exc is None:
            return False
        if isinstance(exc, ssl.SSLCertVerificationError) or "CERTIFICATE_VERIFY_FAILED" in str(exc):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def set_nonblocking(conn: Any) -> None:
    """Make a lean node's new connection non-blocking: from now on only the
    round's poll says when it is ready."""
    conn._sock.setblocking(False)


def host_error(conn: Any) -> str:
    """``host:port`` or the socket path of ``conn``, for error messages."""
    return conn._host_error()


# -- RESP2 on the wire -------------------------------------------------------------------------

_ENCODER = Encoder("utf-8", "strict", False)


def pack(args: Sequence[Any]) -> bytes:
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


def demoted(reply: Any) -> bool:
    """Whether ``reply`` says the node is a replica now (a script's write reports
    it inside an ``ERR`` on Redis 6)."""
    return isinstance(reply, ReadOnlyError) or (
        isinstance(reply, ResponseError) and "READONLY" in str(reply)
    )


class Partial(Exception):
    """The buffer ends before the reply does: wait for more bytes."""


def parse(buf: bytes, pos: int) -> tuple[Any, int]:
    """The RESP2 reply at ``buf[pos:]`` and the position after it.

    Returns what redis-py's RESP2 parser returns without decoding: bytes for
    strings, int, list, None for nil, and a ``ResponseError`` (the subclass
    redis-py picks) for a server error. An error that redis-py counts as a
    connection failure (``LOADING``, too many clients) is raised instead, as
    redis-py does. Raises :class:`Partial` if the reply is not all in ``buf``.
    """
    end = buf.find(b"\r\n", pos)
    if end < 0:
        raise Partial
    kind, line, pos = buf[pos : pos + 1], buf[pos + 1 : end], end + 2
    if kind == b":":
        return int(line), pos
    if kind == b"$":
        size = int(line)
        if size < 0:
            return None, pos
        if len(buf) < pos + size + 2:
            raise Partial
        return buf[pos : pos + size], pos + size + 2
    if kind == b"*":
        count = int(line)
        if count < 0:
            return None, pos
        items = []
        for _ in range(count):
            item, pos = parse(buf, pos)
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
