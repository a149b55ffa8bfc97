"""A Redis node's calls from an event loop: one pipelined RESP2 connection per node and loop.

Each call writes its command and waits for the future queued behind the ones
before it: Redis answers a connection's commands in order, so a reply is
the oldest waiting future's. A call that timed out leaves its future in the
queue, cancelled: its late reply is read and dropped, and the connection
stays in step (no reconnect after a timeout). A connection that closes fails
every waiting call, and the next call opens a new one (``connect_timeout``,
then ``AUTH`` and ``SELECT`` pipelined before the first command).

The shapes served here, as the sync node has them:

* ``redis://`` and ``unix://`` masters;
* ``rediss://``: TLS with an :class:`ssl.SSLContext` made from the node's own
  ``ssl_*`` settings, as redis-py makes it; a failed certificate check is the
  sync path's error that cannot heal (:func:`.wire.as_redis_error`);
* ``min_replicas``: ``WAIT`` written in the same packet behind the scripts a
  lease or a claim rests on (:func:`.replicas.wait_after`), the pair of
  replies read as the sync round reads them (:func:`.replicas.confirmed`);
* ``sentinel://``: each new connection first asks every sentinel at once
  (``SENTINEL MASTER``, over connections of this module) where the master is,
  the first valid answer winning as in
  :class:`~celery_redlock.core.nodes.redis.sentinels.Sentinels`; the
  connection is the address's cache: when it closes (a killed master, or one
  a failover demoted and whose clients the sentinels killed) or the master
  answers ``READONLY``, it is dropped and the next call asks again.

A Redis Cluster's one-name call goes straight to the shard master of its
slot, on that shard's connection (:func:`call_shard`), as the sync round's
fast path sends it; what that round does in threads or in more steps is left
to it (:data:`CARRY`): a slot map not read yet, a batch over several slots
(a batch on one slot goes here), a ``MOVED`` or ``ASK`` to follow, a shard
given as a ``redis.Redis`` client.
"""

from __future__ import annotations

import asyncio
import inspect
import ssl
import weakref
from collections import deque
from collections.abc import Sequence
from typing import Any

import redis
import redis.sentinel
from redis.crc import key_slot
from redis.exceptions import AskError, ClusterDownError, NoScriptError, TryAgainError

from .redis.cluster import BATCHES, Part, combine, same_slot
from .redis.replicas import confirmed, wait_after
from .redis.wire import Partial, as_redis_error, demoted, pack, parse

__all__ = ["CARRY", "call_script", "call_shard", "served", "tls_served"]

#: What :func:`call_shard` returns for a call the sync round makes instead.
CARRY: Any = object()

# event loop -> node (or sentinel) -> its connection (or the task opening it)
_conns: weakref.WeakKeyDictionary[Any, dict[int, Any]] = weakref.WeakKeyDictionary()

# redis-py's own defaults of its TLS settings (ssl_check_hostname changed in 6.0)
_TLS_DEFAULTS = {
    name: p.default
    for name, p in inspect.signature(redis.SSLConnection.__init__).parameters.items()
    if name.startswith("ssl_")
}
_CERT_REQS = {"none": ssl.CERT_NONE, "optional": ssl.CERT_OPTIONAL, "required": ssl.CERT_REQUIRED}
# TLS settings an SSLContext alone does not carry out: such a node stays carried
_NOT_SERVED = ("ssl_validate_ocsp", "ssl_validate_ocsp_stapled", "ssl_ocsp_context")


class Connection(asyncio.Protocol):
    """One node's pipelined connection on one loop."""

    def __init__(self) -> None:
        self.buf = bytearray()
        self.waiting: deque[asyncio.Future[Any]] = deque()
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.used = False  # a call went on it: a failure may be the server's old hang-up

    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        buf = self.buf
        buf += data
        whole, pos = bytes(buf), 0  # the sync node's parser reads bytes
        try:
            while self.waiting:
                value, pos = parse(whole, pos)
                future = self.waiting.popleft()
                if not future.done():
                    future.set_result(value)
        except Partial:  # the rest of the reply is still to come
            pass
        except Exception as exc:  # a reply out of step, or one redis-py counts as the
            self._fail(exc)  # connection's failure (LOADING): this connection is done for
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
        return self.send_all([args])[0]

    def send_all(self, commands: Sequence[Sequence[Any]]) -> list[asyncio.Future[Any]]:
        """Write ``commands`` in one packet: a future for each reply."""
        loop = asyncio.get_running_loop()
        futures = [loop.create_future() for _ in commands]
        self.waiting.extend(futures)
        assert self.transport is not None
        self.transport.write(b"".join(pack(args) for args in commands))
        return futures


def served(node: Any) -> bool:
    """Whether a master's calls (not a Cluster's) go through this module: one
    built from its URL, RESP2, replies undecoded."""
    if node.lean:  # redis:// or unix:// (the rule)
        return True
    # Only a node named rediss:// or sentinel:// (or a rediss+cluster:// shard)
    # was built from its URL: a client given as it is keeps its own settings.
    if not node.name.startswith(("rediss://", "sentinel://", "rediss+cluster://")):
        return False
    kw = node.pool.connection_kwargs
    return (
        str(kw.get("protocol", 2)) == "2"
        and not kw.get("decode_responses")
        and kw.get("encoding", "utf-8") == "utf-8"
        and tls_served(kw)
    )


def tls_served(kw: dict[str, Any]) -> bool:
    """Whether a TLS node's settings (connection keyword arguments) are all an
    :class:`ssl.SSLContext` carries out (not OCSP checks)."""
    return not any(kw.get(name) for name in _NOT_SERVED)


def tls_context(kw: dict[str, Any]) -> ssl.SSLContext:
    """The TLS context redis-py's ``SSLConnection`` makes of the same settings."""
    opts = {**_TLS_DEFAULTS, **{k: v for k, v in kw.items() if k.startswith("ssl_")}}
    reqs = opts["ssl_cert_reqs"]
    if reqs is None:
        reqs = ssl.CERT_NONE
    elif isinstance(reqs, str):
        if reqs not in _CERT_REQS:
            raise redis.exceptions.RedisError(f"Invalid SSL Certificate Requirements Flag: {reqs}")
        reqs = _CERT_REQS[reqs]
    context = ssl.create_default_context()
    context.check_hostname = bool(opts["ssl_check_hostname"]) and reqs != ssl.CERT_NONE
    context.verify_mode = reqs
    for flag in opts.get("ssl_include_verify_flags") or ():
        context.verify_flags |= flag
    for flag in opts.get("ssl_exclude_verify_flags") or ():
        context.verify_flags &= ~flag
    if opts["ssl_certfile"] or opts["ssl_keyfile"]:
        context.load_cert_chain(
            certfile=opts["ssl_certfile"],
            keyfile=opts["ssl_keyfile"],
            password=opts["ssl_password"],
        )
    ca = (opts["ssl_ca_certs"], opts["ssl_ca_path"], opts.get("ssl_ca_data"))
    if any(x is not None for x in ca):
        context.load_verify_locations(cafile=ca[0], capath=ca[1], cadata=ca[2])
    if opts.get("ssl_min_version") is not None:
        context.minimum_version = opts["ssl_min_version"]
    if opts.get("ssl_ciphers"):
        context.set_ciphers(opts["ssl_ciphers"])
    return context


def _budget(node: Any) -> float:
    """Seconds a new connection to ``node`` gets to open, as the sync round gives."""
    return node.connect_timeout or node.timeout


async def _open(
    pool: Any, name: str, budget: float, address: tuple[str, int] | None = None
) -> Connection:
    """A connection to ``address`` (or ``pool``'s own), handshake done, within ``budget``;
    an error as the sync node's connect gives it (:func:`.wire.as_redis_error`)."""
    loop = asyncio.get_running_loop()
    kw = pool.connection_kwargs
    host, port = address or (kw.get("host") or "localhost", int(kw.get("port") or 6379))
    try:
        if kw.get("path") and address is None:
            opening = loop.create_unix_connection(Connection, kw["path"])
        elif issubclass(pool.connection_class, redis.SSLConnection):
            opening = loop.create_connection(
                Connection, host, port, ssl=tls_context(kw), server_hostname=host
            )
        else:
            opening = loop.create_connection(Connection, host, port)
        _, conn = await asyncio.wait_for(opening, budget)
    except asyncio.TimeoutError:
        raise redis.exceptions.TimeoutError(
            f"Timeout connecting to {name} within {budget:g}s"
        ) from None
    except OSError as exc:  # refused, unreachable, TLS refused or unverified
        where = kw["path"] if kw.get("path") and address is None else f"{host}:{port}"
        raise as_redis_error(
            redis.exceptions.ConnectionError(f"Error connecting to {where}. {exc}"), name
        ) from exc
    hello = []
    if kw.get("password"):
        user = kw.get("username")
        auth = ("AUTH", user, kw["password"]) if user else ("AUTH", kw["password"])
        hello.append(conn.send(*auth))
    if kw.get("db"):
        hello.append(conn.send("SELECT", kw["db"]))
    try:
        replies = await asyncio.wait_for(asyncio.gather(*hello), budget)
    except asyncio.TimeoutError:
        conn._fail(ConnectionError("handshake overdue"))
        raise redis.exceptions.TimeoutError(
            f"Timeout connecting to {name} within {budget:g}s"
        ) from None
    for i, reply in enumerate(replies):
        if isinstance(reply, Exception):
            conn._fail(reply)
            if i == 0 and kw.get("password"):  # refused credentials: no outage, a fix
                raise as_redis_error(redis.exceptions.AuthenticationError(str(reply)), name)
            raise reply
    return conn


async def _connection(key: Any, opening: Any) -> Connection:
    """``key``'s connection on this loop; ``opening()`` makes a new one."""
    loop = asyncio.get_running_loop()
    per_loop = _conns.get(loop)
    if per_loop is None:
        per_loop = _conns[loop] = {}
    held = per_loop.get(id(key))
    if isinstance(held, Connection) and not held.closed:
        return held
    failed = (
        isinstance(held, asyncio.Task)
        and held.done()
        and (held.cancelled() or held.exception() is not None)
    )
    if not isinstance(held, asyncio.Task) or failed:
        held = per_loop[id(key)] = asyncio.ensure_future(opening())
    try:
        conn = await asyncio.shield(held)
    except BaseException:
        if per_loop.get(id(key)) is held:
            del per_loop[id(key)]
        raise
    per_loop[id(key)] = conn
    return conn


# -- Sentinel ------------------------------------------------------------------------------------


def _state(reply: list[Any]) -> dict[str, Any]:
    """A ``SENTINEL MASTER`` reply as redis-py's ``check_master_state`` reads it."""
    state = {k.decode(): v.decode() for k, v in zip(reply[::2], reply[1::2])}
    flags = set(state.get("flags", "").split(","))
    state["is_master"] = "master" in flags
    state["is_sdown"] = "s_down" in flags
    state["is_odown"] = "o_down" in flags
    state["port"] = int(state["port"])
    state["num-other-sentinels"] = int(state.get("num-other-sentinels", 0))
    return state


async def _ask(sentinel: Any, service: str, budget: float) -> Any:
    """One sentinel's state of ``service``'s master (an error raised)."""
    pool = sentinel.connection_pool
    name = "sentinel {}:{}".format(*(pool.connection_kwargs.get(k) for k in ("host", "port")))
    conn = await _connection(sentinel, lambda: _open(pool, name, budget))
    reply = await asyncio.wait_for(conn.send("SENTINEL", "MASTER", service), budget)
    if isinstance(reply, BaseException):
        raise reply
    return _state(reply)


async def _master(node: Any) -> tuple[str, int]:
    """Where ``node``'s sentinels say its master is: all asked at once, the first
    valid answer wins (as the sync node's :class:`.redis.sentinels.Sentinels`)."""
    manager, service = node.pool.sentinel_manager, node.pool.service_name
    budget = _budget(node)
    asks = [asyncio.ensure_future(_ask(s, service, budget)) for s in manager.sentinels]
    errors = []
    try:
        for next_answer in asyncio.as_completed(asks):
            try:
                state = await next_answer
            except (Exception, asyncio.TimeoutError) as exc:
                errors.append(repr(exc))
                continue
            if manager.check_master_state(state, service):
                return state["ip"], state["port"]
    finally:
        for ask in asks:
            ask.cancel()
    detail = f" : {', '.join(errors)}" if errors else ""
    raise redis.sentinel.MasterNotFoundError(f"No master found for {service!r}{detail}")


async def _open_node(node: Any) -> Connection:
    if isinstance(node.pool, redis.sentinel.SentinelConnectionPool):
        address = await _master(node)
        return await _open(node.pool, node.name, _budget(node), address)
    return await _open(node.pool, node.name, _budget(node))


# -- a script's call -----------------------------------------------------------------------------


async def _sent(conn: Connection, command: tuple, wait: tuple | None, limit: float) -> Any:
    """``command``'s reply; with ``wait``, the pair (reply, WAIT's), or the first error."""
    if wait is None:
        return await asyncio.wait_for(conn.send(*command), limit)
    reply, acked = await asyncio.wait_for(asyncio.gather(*conn.send_all([command, wait])), limit)
    if isinstance(reply, BaseException):
        return reply
    if isinstance(acked, ConnectionError):  # the connection closed before WAIT answered
        return acked
    return reply, acked


async def call_script(node: Any, script: Any, keys: Any, args: Any, limit: float) -> Any:
    """``script`` on ``node`` (EVALSHA, EVAL on NOSCRIPT): its reply or error, within
    ``limit`` seconds once connected; a write its replicas did not confirm is a
    :class:`~celery_redlock.core.nodes.NotReplicated` reply."""
    conn = await _connection(node, lambda: _open_node(node))
    wait = wait_after(script, [node], limit) if node.min_replicas else None
    evalsha = ("EVALSHA", script.sha, len(keys), *keys, *args)
    reused, conn.used = conn.used, True
    reply = await _sent(conn, evalsha, wait, limit)
    if reused and isinstance(reply, ConnectionError):
        # closed while idle (a killed or demoted master, a server timeout), its
        # hang-up not yet read: replaced once, as the sync round does (our
        # scripts are idempotent); a Sentinel node's new one asks again
        conn = await _connection(node, lambda: _open_node(node))
        conn.used = True
        reply = await _sent(conn, evalsha, wait, limit)
    if isinstance(reply, NoScriptError):
        reply = await _sent(conn, ("EVAL", script.text, len(keys), *keys, *args), wait, limit)
    if demoted(reply) and not node.lean:
        # a failover demoted the master under this connection: the next one asks again
        conn._fail(reply)
        raise redis.exceptions.ConnectionError(f"the node is a replica now: {reply}")
    if isinstance(reply, BaseException):
        raise reply
    return reply if wait is None else confirmed(node, reply)


async def call_shard(cluster: Any, script: Any, keys: Any, args: Any, limit: float) -> Any:
    """A one-name script call on a Redis Cluster: on its slot's shard master, as
    :func:`call_script`; :data:`CARRY` when the sync round must make it. A shard
    that fails gets its cluster's slot map read again in the background, as in
    the sync round (a failover may be under way)."""
    batch = script.name in BATCHES
    if not cluster.mapped or not keys or (batch and not same_slot(keys)):
        return CARRY
    shard = cluster.at_slot(key_slot(keys[0].encode()))
    if not served(shard):
        return CARRY
    try:
        reply = await call_script(shard, script, keys, args, limit)
        if not batch:
            return reply
        # a batch on one slot: one part, its reply read as the sync round reads it
        part = Part(cluster, shard, keys, args, list(range(len(keys))), False)
        return combine(script.name, len(keys), [(part, reply)])
    except AskError:  # MOVED or ASK
        return CARRY  # followed there once, the map read again
    except (ClusterDownError, TryAgainError):
        cluster.suspect()
        raise
    except (ConnectionError, redis.exceptions.ConnectionError):
        cluster.suspect()
        raise
