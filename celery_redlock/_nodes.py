"""Redis nodes and the one scatter-gather helper every quorum operation uses.

Each node gets its own connection pool with fail-fast settings: a small
socket and connect timeout and **no client-side retries** (redis-py 8 retries
ten times by default, which turns a dead node into a multi-second stall and
re-sends commands that are not idempotent).

:func:`gather` writes one command to every node, then reads the replies
against a single deadline: the nodes work in parallel, no thread is created,
and a hung node costs at most the deadline, never more.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Sequence
from typing import Any, Union
from urllib.parse import urlsplit

import redis
from redis.exceptions import NoScriptError, RedisError, ResponseError

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

    __slots__ = ("name", "pool", "_identity", "_idle", "_pid")

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
    parallel; the replies are then read in turn, each read bounded by what is
    left of the one deadline. A hung node therefore costs at most ``timeout``
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
    sent: list[tuple[int, Node, Any, bool]] = []
    checked_out = [(i, node, *node.connection()) for i, node in enumerate(nodes)]
    packed = checked_out[0][2].pack_command(*args) if checked_out else b""
    # Connected nodes first: a new connection may wait on a handshake (AUTH,
    # SELECT) with a hung node, and meanwhile the others are already working.
    checked_out.sort(key=lambda item: not item[3])
    for i, node, conn, reused in checked_out:
        try:
            if not reused:
                _connect_within(conn, deadline)
            conn.send_packed_command(packed, check_health=False)
            sent.append((i, node, conn, reused))
        except (RedisError, OSError) as exc:
            node.discard(conn)
            replies[i] = _resend(node, packed, deadline) if reused else _as_redis_error(exc)
    for i, node, conn, reused in sent:
        reply = _read(node, conn, deadline)
        if reused and _closed_by_server(reply):
            reply = _resend(node, packed, deadline)
        replies[i] = reply
    return replies


def _read(node: Node, conn: Any, deadline: float) -> Any:
    """One reply, or the exception standing for it; the connection goes back or is closed."""
    try:
        # A reply already buffered is read even past the deadline.
        reply = conn.read_response(timeout=max(deadline - time.monotonic(), _LAST_LOOK))
    except ResponseError as exc:  # the server answered: the connection is fine
        reply = exc
    except (RedisError, OSError) as exc:
        node.discard(conn)
        return _as_redis_error(exc)
    node.put_back(conn)
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


def _resend(node: Node, packed: Any, deadline: float) -> Any:
    """Send once more on a new connection: every command we send is idempotent."""
    conn = node.new_connection()
    try:
        _connect_within(conn, deadline)
        conn.send_packed_command(packed, check_health=False)
    except (RedisError, OSError) as exc:
        node.discard(conn)
        return _as_redis_error(exc)
    return _read(node, conn, deadline)


#: Seconds a read may still wait once the deadline has passed.
_LAST_LOOK = 0.001


def _as_redis_error(exc: BaseException) -> RedisError:
    if isinstance(exc, RedisError):
        return exc
    return redis.exceptions.ConnectionError(str(exc) or type(exc).__name__)


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
