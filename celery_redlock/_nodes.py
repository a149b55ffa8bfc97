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
the round trip on a fast network. Other nodes (``rediss://``, ``sentinel://``,
``redis.Redis`` clients with settings of their own, test doubles) go through
redis-py's ``send_packed_command`` / ``read_response``.

A ``sentinel://`` node (grammar: :func:`sentinel_options`) is a client from
redis-py's public ``redis.sentinel.Sentinel.master_for``: each new connection
asks the sentinels (all at once) where the master is, so after a failover the
connection that fails is dropped and the next one reaches the new master.

New connections are opened in background threads, all at once, each within
the round's timeout of its own (:class:`_Opening`); a node whose connects time
out is skipped for a while, but for a probe (:meth:`Node.skips_connects`).

With ``min_replicas``, :func:`run_script` pipelines ``WAIT`` behind the
scripts a lease or a claim rests on (:data:`CONFIRMED`) in the same round.

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
* ``Connection._sock`` (the connected socket: ``setblocking``, ``fileno``,
  ``send``, ``recv``) and ``Connection._host_error()`` (``host:port`` or the
  socket path, for error messages).

The one public difference between the majors that matters here, how to turn
off ``CLIENT SETINFO`` on connect, is settled once in ``_NO_CLIENT_SETINFO``.
"""

from __future__ import annotations

import inspect
import os
import re
import select
import threading
import time
from collections.abc import Sequence
from typing import Any, Union
from urllib.parse import parse_qsl, unquote, urlsplit

import redis
import redis.sentinel
from redis._parsers import BaseParser, Encoder
from redis._parsers.socket import SERVER_CLOSED_CONNECTION_ERROR
from redis.exceptions import InvalidResponse, NoScriptError, RedisError, ResponseError

from ._connect import Sentinels, connector
from .core.exceptions import ConfigurationError
from .core.scripts import Script

__all__ = ["Node", "NotReplicated", "gather", "run_script", "mask_url", "NodeSpec"]

NodeSpec = Union[str, "redis.Redis"]

# "Send no CLIENT SETINFO on connect": redis-py 8 spells it driver_info=None
# (and deprecates lib_name/lib_version), 5 to 7 only know lib_name/lib_version.
_NO_CLIENT_SETINFO: dict[str, Any] = (
    {"driver_info": None}
    if "driver_info" in inspect.signature(redis.connection.AbstractConnection.__init__).parameters
    else {"lib_name": None, "lib_version": None}
)

_SCHEMES = ("redis", "rediss", "unix", "sentinel")

#: Seconds, at most, that a node whose connects time out is skipped before a probe.
BREAKER_MAX = 1.0


class Node:
    """One independent Redis master.

    Args:
        spec: a URL (``redis://``, ``rediss://``, ``unix://``, ``sentinel://``:
            see :func:`sentinel_options`) or a ``redis.Redis``. A client is used
            as given: its own timeouts and retries apply.
        timeout: socket and connect timeout in seconds for a node built from a URL.
        min_replicas: how many of the node's replicas must confirm a grant, a
            renewal or a fence write (``WAIT``, pipelined in the same round)
            before it counts; 0 sends no ``WAIT``.
    """

    __slots__ = (
        "name", "pool", "lean", "min_replicas", "_identity", "_idle", "_pid",
        "_backoff", "_retry_at", "_probing",
    )  # fmt: skip

    def __init__(self, spec: NodeSpec, timeout: float, min_replicas: int = 0):
        self.min_replicas = min_replicas
        if isinstance(spec, str):
            scheme = urlsplit(spec).scheme
            if scheme not in _SCHEMES:
                raise ConfigurationError(
                    f"Redis node URL {mask_url(spec)!r} must start with one of "
                    + ", ".join(f"{s}://" for s in _SCHEMES)
                )
            fail_fast = dict(
                socket_timeout=timeout,
                socket_connect_timeout=timeout,
                retry=None,
                health_check_interval=0,
                # RESP2 and no CLIENT SETINFO: a new connection costs no
                # extra round trip, so a hung node cannot stall a connect.
                protocol=2,
                **_NO_CLIENT_SETINFO,
            )
            try:
                if scheme == "sentinel":
                    client = _sentinel_master(spec, fail_fast)
                else:
                    client = redis.Redis.from_url(spec, **fail_fast)
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
        if isinstance(self.pool, redis.sentinel.SentinelConnectionPool):
            sentinels = self.pool.sentinel_manager.sentinels
            self._identity = (
                "sentinel",
                frozenset(_address(s.connection_pool.connection_kwargs) for s in sentinels),
                self.pool.service_name,
                kw.get("db", 0),
            )
        # Idle connections of this process. A plain list, not the pool's
        # checkout (its lock and bookkeeping cost more than the round trip on
        # loopback); list.pop and list.append are atomic, so threads may share it.
        self._idle: list[Any] = []
        self._pid = os.getpid()
        self._backoff = self._retry_at = 0.0  # the circuit breaker: see skips_connects
        self._probing = False

    def idle_connection(self) -> Any:
        """An idle connection of this process, or None."""
        if self._pid != os.getpid():  # after fork: the parent's sockets are not ours
            self._forget_parent()
        try:
            return self._idle.pop()
        except IndexError:
            return None

    def _forget_parent(self) -> None:
        self._idle = []
        self._backoff, self._retry_at, self._probing = 0.0, 0.0, False
        self._pid = os.getpid()

    # The circuit breaker: a node whose connects time out (a blackholed
    # address, a half-dead host) is not sent new connects for a while that
    # grows from one timeout to BREAKER_MAX, but for one probe in the
    # background when the while is over; the probe's connection, if it
    # connects, is kept for the next round, and any outcome but a timeout
    # closes the breaker. Per node and per process.

    def skips_connects(self, budget: float) -> RedisError | None:
        """None if a new connection may be opened now; else the error that stands
        for this node's reply (and the probe is started, when due)."""
        if not self._backoff:
            return None
        now = time.monotonic()
        if now >= self._retry_at and not self._probing:
            self._probing = True
            connector().submit(_open_connection, self, self.new_connection(), budget, None, -1)
        return redis.exceptions.ConnectionError(
            f"{self.name}: not connecting for now: its connects timed out "
            f"(next try within {max(self._retry_at - now, 0.0):.2f}s)"
        )

    def connected(self, error: RedisError | None, budget: float, probe: bool = False) -> None:
        """Record how a connect ended (called by the thread that made it)."""
        if probe:
            self._probing = False
        if isinstance(error, redis.exceptions.TimeoutError):
            if probe or not self._backoff:  # connects of one outage grow the while once
                self._backoff = min(max(2 * self._backoff, budget), BREAKER_MAX)
                self._retry_at = time.monotonic() + self._backoff
        else:
            self._backoff = 0.0

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


# -- Sentinel-managed nodes ---------------------------------------------------------------------

#: The port of a sentinel given without one.
SENTINEL_PORT = 26379

#: Query options of a ``sentinel://`` URL: TLS (to the master and the sentinels
#: alike), the sentinels' own AUTH, and redis-py's ``min_other_sentinels``.
_SENTINEL_QUERY = {
    "db": int,
    "ssl": "flag",
    "ssl_ca_certs": str,
    "ssl_ca_path": str,
    "ssl_certfile": str,
    "ssl_keyfile": str,
    "ssl_cert_reqs": str,
    "ssl_check_hostname": "flag",
    "sentinel_username": str,
    "sentinel_password": str,
    "min_other_sentinels": int,
}


def sentinel_options(url: str) -> dict[str, Any]:
    """What a ``sentinel://`` URL says.

    The grammar::

        sentinel://[[username]:password@]host[:port][,host[:port]...]/service[/db][?options]

    * the hosts are the sentinels (port 26379 when omitted), separated by commas;
    * ``service`` is the master's name in the sentinels (``sentinel monitor <service> ...``);
    * ``username``/``password`` and ``db`` are the master's (and its replicas');
    * options: ``db=N``; ``ssl=true`` and redis-py's ``ssl_ca_certs``,
      ``ssl_ca_path``, ``ssl_certfile``, ``ssl_keyfile``, ``ssl_cert_reqs``
      (``none``/``optional``/``required``), ``ssl_check_hostname``, which apply
      to the master and the sentinels alike (any ``ssl_*`` option turns TLS on);
      ``sentinel_username``/``sentinel_password`` for sentinels that require
      AUTH of their own; ``min_other_sentinels``.

    Returns:
        ``{"sentinels": [(host, port), ...], "service": str, "master": {...},
        "sentinel": {...}, "min_other_sentinels": int}``: the connection
        options of the master and of the sentinels.

    Raises:
        ValueError: the URL does not follow the grammar.
    """
    parts = urlsplit(url)
    if parts.scheme != "sentinel":
        raise ValueError("a Sentinel URL starts with sentinel://")
    userinfo, _, hostlist = parts.netloc.rpartition("@")
    sentinels = []
    for item in hostlist.split(","):
        host, port = _host_port(item.strip())
        sentinels.append((host, port))
    path = [unquote(p) for p in parts.path.split("/") if p]
    if not path or len(path) > 2:
        raise ValueError("the path must be /service or /service/db (the master's name)")
    master: dict[str, Any] = {}
    sentinel: dict[str, Any] = {}
    if userinfo:
        username, has_password, password = userinfo.partition(":")
        if username:
            master["username"] = unquote(username)
        if has_password:
            master["password"] = unquote(password)
    if len(path) == 2:
        master["db"] = _integer("db", path[1])
    others = 0
    for name, value in parse_qsl(parts.query, keep_blank_values=True):
        kind = _SENTINEL_QUERY.get(name)
        if kind is None:
            raise ValueError(
                f"unknown option {name!r}; known: " + ", ".join(sorted(_SENTINEL_QUERY))
            )
        if name == "db":
            master["db"] = _integer(name, value)
        elif name == "min_other_sentinels":
            others = _integer(name, value)
        elif name.startswith("sentinel_"):
            sentinel[name[len("sentinel_") :]] = value
        elif kind == "flag":
            flag = value.lower()
            if flag not in ("true", "false", "1", "0", "yes", "no"):
                raise ValueError(f"option {name!r} must be true or false, not {value!r}")
            master[name] = flag in ("true", "1", "yes")
        else:
            master[name] = value
    tls = {k: v for k, v in master.items() if k.startswith("ssl")}
    if any(k != "ssl" for k in tls) and "ssl" not in tls:
        tls["ssl"] = master["ssl"] = True
    if tls.get("ssl"):
        sentinel.update(tls)
    else:
        for k in tls:
            master.pop(k)
    return {
        "sentinels": sentinels,
        "service": path[0],
        "master": master,
        "sentinel": sentinel,
        "min_other_sentinels": others,
    }


def _host_port(item: str) -> tuple[str, int]:
    if not item:
        raise ValueError("an empty sentinel address")
    if item.startswith("["):  # [ipv6]:port
        host, _, rest = item[1:].partition("]")
        port = rest[1:] if rest.startswith(":") else ""
    else:
        host, _, port = item.partition(":")
    if not host:
        raise ValueError(f"sentinel address {item!r} has no host")
    return host, _integer("port", port) if port else SENTINEL_PORT


def _integer(name: str, text: str) -> int:
    if not text.isdigit():
        raise ValueError(f"{name} must be a whole number, not {text!r}")
    return int(text)


def _sentinel_master(url: str, fail_fast: dict[str, Any]) -> redis.Redis:
    """A client of the master that the sentinels of ``url`` name, through redis-py's Sentinel.

    The master is looked up when a connection is opened, so after a failover
    the next new connection reaches the new master. The sentinels are asked
    with the node's fail-fast timeouts, all at once (:class:`~celery_redlock._connect.Sentinels`).
    """
    options = sentinel_options(url)
    sentinel = Sentinels(
        options["sentinels"],
        min_other_sentinels=options["min_other_sentinels"],
        sentinel_kwargs={**fail_fast, **options["sentinel"]},
        **fail_fast,
        **options["master"],
    )
    return sentinel.master_for(options["service"])


def _address(kw: dict[str, Any]) -> tuple[str, int]:
    return kw.get("host") or "localhost", int(kw.get("port") or 6379)


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
    (:class:`_Opening`): the round does not wait for it before sending to
    the other nodes, and a connect that finishes within the round has its
    command sent and its reply collected in the same round. A connection that
    connects after the round ended goes to the node's idle connections for the
    next round. A node whose connects time out is skipped for a while (its
    circuit breaker, :meth:`Node.skips_connects`): its reply is an error at
    once.

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
    wire = _pack(args) if then is None else _pack(args) + _pack(then)
    count = 1 if then is None else 2
    packed = None  # redis-py's packing, for the other nodes: their encoding may differ
    opening: _Opening | None = None  # the round's new connections, if it needs any
    lean: list[_Call] = []
    other: list[_Call] = []
    for i, node in enumerate(nodes):
        conn = node.idle_connection()
        if conn is None:
            if opening is None:
                opening = _Opening(args, then, wire, count, timeout)
            opening.open(i, node, replies)
            continue
        if not node.lean and packed is None:
            packed = conn.pack_commands([args] if then is None else [args, then])
        call = _Call(i, node, conn, True, wire if node.lean else packed, count)
        error = _start(call)
        if error is None:
            (lean if node.lean else other).append(call)
        elif error is _RECONNECT:
            if opening is None:
                opening = _Opening(args, then, wire, count, timeout)
            opening.open(i, node, replies)
        else:
            replies[i] = error
    if lean or opening is not None:
        _collect(lean, other, opening, deadline, replies, args, then, wire, count, timeout)
    for call in other:
        reply = _read(call, deadline)
        if call.reused and _closed_by_server(reply):
            # A node redis-py talks to: its new connection is opened here, within the round.
            call.renew()
            try:
                _connect_within(call.conn, max(deadline - time.monotonic(), _LAST_LOOK))
            except (RedisError, OSError) as exc:
                call.node.discard(call.conn)
                replies[call.i] = _as_redis_error(exc)
                continue
            reply = _start(call) or _read(call, deadline)
        replies[call.i] = reply
    return replies


class _Call:
    """One node's command in flight: its connection and, on the lean path, the
    bytes still to send and the reply bytes received so far."""

    __slots__ = ("i", "node", "conn", "reused", "command", "out", "buf", "count")

    def __init__(self, i: int, node: Node, conn: Any, reused: bool, command: Any, count: int = 1):
        self.i, self.node, self.conn, self.reused, self.command = i, node, conn, reused, command
        self.out = self.buf = b""
        self.count = count  # replies expected: 2 when a command is pipelined after the first

    def renew(self) -> None:
        """Go on with a new connection, not yet connected (the server closed the reused one)."""
        self.conn, self.reused, self.buf = self.node.new_connection(), False, b""


#: How a round ends a connect it waited for in vain (for the circuit breaker).
_OVERDUE = redis.exceptions.TimeoutError("connect overdue")

#: What :func:`_start` returns when a reused connection failed: open a new one.
_RECONNECT: Any = redis.exceptions.ConnectionError("reconnect")


def _start(call: _Call) -> Any:
    """Send the call's command on its connected connection.

    Returns None, the error that stands for the reply, or ``_RECONNECT``: a
    reused connection that fails is replaced once (the server may have closed
    it meanwhile, and every command we send is idempotent).
    """
    try:
        if call.node.lean:
            call.out = call.command
            _write(call)
        else:
            call.conn.send_packed_command(call.command, check_health=False)
    except (RedisError, OSError) as exc:
        call.node.discard(call.conn)
        return _RECONNECT if call.reused else _as_redis_error(exc)
    return None


def _collect(
    calls: list[_Call],
    other: list[_Call],
    opening: _Opening | None,
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
    waiting: dict[int, _Call] = {}

    def watch(call: _Call) -> None:
        fd = call.conn._sock.fileno()
        poller.register(fd, select.POLLOUT if call.out else select.POLLIN)
        waiting[fd] = call

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
            events = poller.poll(max(left, _LAST_LOOK) * 1000)
            for fd, _ in events:
                if fd == wake and opening is not None:  # connections opened meanwhile
                    for i, node, conn in opening.take(replies):
                        command = opening.command_for(node, conn)
                        call = _Call(i, node, conn, False, command, opening.count)
                        error = _start(call)
                        if error is not None:
                            replies[i] = error
                        elif node.lean:
                            watch(call)
                        else:
                            other.append(call)
                    continue
                call = waiting.pop(fd)
                reply = _step(call)
                if reply is _PENDING:
                    watch(call)
                    continue
                poller.unregister(fd)
                if call.reused and _closed_by_server(reply):
                    if opening is None:
                        opening = _Opening(args, then, wire, count, timeout)
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
        reply, pos = _parse(call.buf, 0)
        if call.count == 2:
            reply = _pair(reply, _parse(call.buf, pos)[0])
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
    got: list[Any] = []
    try:
        while len(got) < call.count:
            try:
                # A reply already buffered is read even past the deadline.
                got.append(_read_response(call.conn, max(deadline - time.monotonic(), _LAST_LOOK)))
            except ResponseError as exc:  # the server answered: the connection is fine
                got.append(exc)
    except (RedisError, OSError) as exc:
        call.node.discard(call.conn)
        return _as_redis_error(exc)
    if isinstance(got[0], ResponseError) and "READONLY" in str(got[0]):
        # The master we are connected to is a replica now (a failover demoted
        # it; a script's write reports it as ERR on Redis 6): drop the
        # connection, so the next one asks the sentinels where the master is.
        call.node.discard(call.conn)
        return redis.exceptions.ConnectionError(f"the node is a replica now: {got[0]}")
    call.node.put_back(call.conn)
    return got[0] if call.count == 1 else _pair(*got)


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


class _Opening:
    """The new connections of one round, each opened (connect and handshake) in
    a background thread of :func:`connector`, all at once, each within the
    round's timeout of its own.

    A thread that connects in time hands its connection over to the round and
    wakes it through a pipe that the round polls with its sockets; one that
    connects after the round ended puts its connection among the node's idle
    ones. Only rounds that open connections pay for this.
    """

    __slots__ = (
        "args", "then", "wire", "count", "timeout", "packed",
        "lock", "live", "done", "pending", "wake", "_write_end",
    )  # fmt: skip

    def __init__(self, args: Sequence[Any], then: Any, wire: bytes, count: int, timeout: float):
        self.args, self.then, self.wire, self.count, self.timeout = args, then, wire, count, timeout
        self.packed: Any = None
        self.lock = threading.Lock()
        self.live = True
        self.done: list[tuple[int, Node, Any, RedisError | None]] = []
        self.pending: dict[int, Node] = {}
        self.wake, self._write_end = os.pipe()
        os.set_blocking(self.wake, False)

    def open(self, i: int, node: Node, replies: list[Any]) -> None:
        """Start opening a connection to ``node`` (item ``i`` of the round), or
        set its reply to an error at once if its circuit breaker skips it."""
        skipped = node.skips_connects(self.timeout)
        if skipped is not None:
            replies[i] = skipped
            return
        self.pending[i] = node
        connector().submit(_open_connection, node, node.new_connection(), self.timeout, self, i)

    def finished(self, i: int, conn: Any, error: RedisError | None) -> bool:
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

    def command_for(self, node: Node, conn: Any) -> Any:
        if node.lean:
            return self.wire
        if self.packed is None:
            args, then = self.args, self.then
            self.packed = conn.pack_commands([args] if then is None else [args, then])
        return self.packed

    def close(self, replies: list[Any]) -> None:
        """End the round: what is still connecting goes on in the background,
        its connection then kept; its reply is a timeout."""
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
            node.connected(_OVERDUE, self.timeout)  # the next round need not wait for it again
            replies[i] = redis.exceptions.TimeoutError(
                f"Timeout connecting to {node.name} within {self.timeout:g}s"
            )


def _open_connection(
    node: Node, conn: Any, budget: float, opening: _Opening | None, i: int
) -> None:
    """Connect ``conn`` (in a thread of :func:`connector`) and hand it to the
    round, or to the node's idle connections if the round has ended (or if
    this is the circuit breaker's probe, ``opening`` None)."""
    error: RedisError | None = None
    try:
        _connect_within(conn, budget)
        if node.lean:  # from now on only poll says when it is ready
            conn._sock.setblocking(False)
    except Exception as exc:  # whatever it is, the round must hear back
        node.discard(conn)
        error = _as_redis_error(exc)
    node.connected(error, budget, probe=opening is None)
    if opening is None or not opening.finished(i, conn, error):
        if error is None:
            node.put_back(conn)


def _connect_within(conn: Any, budget: float) -> None:
    """Connect, handshake included, within ``budget`` seconds (or the node's shorter timeouts)."""
    for attr in ("socket_connect_timeout", "socket_timeout"):
        configured = getattr(conn, attr, None)
        if configured is None or configured > budget:
            setattr(conn, attr, budget)
    conn.connect()


def _closed_by_server(reply: Any) -> bool:
    # An idle connection the server closed meanwhile (a restart, a client
    # timeout) fails at once on reuse, not by timing out.
    return isinstance(reply, redis.exceptions.ConnectionError) and not isinstance(
        reply, redis.exceptions.TimeoutError
    )


def _pair(first: Any, second: Any) -> Any:
    """The replies of a pipelined pair: the first alone when it is an error."""
    return first if isinstance(first, Exception) else (first, second)


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


#: The scripts whose writes a lease or a claim rests on: a grant, a renewal, a
#: fence write, a beat slot or enqueue claim, a debounce or throttle schedule.
#: On nodes with ``min_replicas``, each is followed by ``WAIT``. Deletions are
#: not: one a failover loses only leaves a key to its TTL.
CONFIRMED = frozenset({"acquire", "extend", "fence", "claim", "claim_next", "debounce", "throttle"})
CONFIRMED |= {"rate"}  # a rate booking (celery_redlock.core.rates) is one too


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
