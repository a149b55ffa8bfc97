"""One Redis node of a quorum: its client, its idle connections, its circuit breaker
(:class:`~celery_redlock.core.nodes.guard.Breaker`, on its connects).

A node is built from a URL (:mod:`~celery_redlock.core.nodes.redis.urls`, failing fast)
or given as a ``redis.Redis`` (used as it is). Its connections are opened by
the rounds (:mod:`~celery_redlock.core.nodes.redis.opening`) and kept here between them;
the bytes are exchanged by :mod:`~celery_redlock.core.nodes.redis.wire`.
"""

from __future__ import annotations

import select
from typing import Any, Union

import redis
import redis.sentinel
from redis.exceptions import RedisError

from ...exceptions import ConfigurationError
from .. import mask_url
from ..guard import FORKS, Breaker
from .urls import address, client_for, describe

__all__ = ["BaseNode", "Node", "NodeSpec"]

NodeSpec = Union[str, "redis.Redis"]


class BaseNode:
    """What a Redis node (a master, a cluster) is made with, its kind's ``make``
    arguments: the timeouts and replicas set here, the rest of ``spec`` read by
    the node's own ``_from_spec``."""

    __slots__ = ("min_replicas", "timeout", "connect_timeout")

    def __init__(
        self,
        spec: Any,
        timeout: float,
        min_replicas: int = 0,
        connect_timeout: float | None = None,
    ):
        self.min_replicas = min_replicas
        self.timeout = timeout
        self.connect_timeout = connect_timeout
        self._from_spec(spec)

    def _from_spec(self, spec: Any) -> None:
        raise NotImplementedError


class Node(BaseNode):
    """One independent Redis master.

    Args:
        spec: a URL (``redis://``, ``rediss://``, ``unix://``, ``sentinel://``:
            see :func:`~celery_redlock.core.nodes.redis.urls.sentinel_options`) or a
            ``redis.Redis``. A client is used as given: its own timeouts and
            retries apply.
        timeout: socket timeout in seconds for a node built from a URL.
        min_replicas: how many of the node's replicas must confirm a grant, a
            renewal or a fence write (``WAIT``, pipelined in the same round)
            before it counts; 0 sends no ``WAIT``.
        connect_timeout: seconds a new connection gets to open (connect and
            handshake), before the round's timeout starts for its reply; None:
            the round's timeout bounds the connect too.
    """

    #: The kind of lock node (:mod:`celery_redlock.core.nodes`).
    kind = "redis"
    #: A Redis Cluster routes by hash slot (:mod:`~celery_redlock.core.nodes.redis.cluster`).
    cluster = False

    __slots__ = (
        "name", "pool", "lean", "_identity", "_idle", "owed",
        "_forks", "breaker",
    )  # fmt: skip

    def _from_spec(self, spec: NodeSpec) -> None:
        if isinstance(spec, str):
            client = client_for(spec, self.timeout, self.connect_timeout)
            self.name = mask_url(spec)
        elif isinstance(spec, redis.Redis):
            client = spec
            self.name = describe(client)
        else:
            raise ConfigurationError(
                f"a Redis node must be a URL or a redis.Redis client, not {type(spec).__name__}"
            )
        self.pool = client.connection_pool
        kw = self.pool.connection_kwargs
        #: Whether a round talks to this node's sockets itself
        #: (:mod:`~celery_redlock.core.nodes.redis.wire`): only for plain sockets whose
        #: replies redis-py would hand over undecoded (a URL's query string may
        #: still ask for RESP3 or decoding), and only where ``select.poll``
        #: exists (not on Windows).
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
                frozenset(address(s.connection_pool.connection_kwargs) for s in sentinels),
                self.pool.service_name,
                kw.get("db", 0),
            )
        # Idle connections of this process. A plain list, not the pool's
        # checkout (its lock and bookkeeping cost more than the round trip on
        # loopback); list.pop and list.append are atomic, so threads may share it.
        self._idle: list[Any] = []
        #: Idle connection -> replies it still owes: commands sent without
        #: waiting (:func:`~celery_redlock.core.nodes.redis.unwaited.send_script`). The
        #: round that takes the connection pops its count and reads those
        #: replies first (:class:`~celery_redlock.core.nodes.redis.wire.Call`).
        self.owed: dict[Any, int] = {}
        self._forks = FORKS.count
        self.breaker = Breaker()  # on its connects: see skips_connects

    def members(self) -> list[Node]:
        """The servers a scan visits: this one."""
        return [self]

    def idle_connection(self) -> Any:
        """An idle connection of this process, or None."""
        if self._forks != FORKS.count:  # after fork: the parent's sockets are not ours
            self._forget_parent()
        try:
            return self._idle.pop()
        except IndexError:
            return None

    def _forget_parent(self) -> None:
        self._idle, self.owed = [], {}
        self.breaker.forget()
        self._forks = FORKS.count

    # The breaker's probe opens in the background: until it connects, every
    # round skips the node (a blackholed address, a half-dead host).

    def skips_connects(self) -> RedisError | None:
        """None if a new connection may be opened now; else the error that
        stands for this node's reply."""
        if not self.breaker.backoff:
            return None
        return redis.exceptions.ConnectionError(self.breaker.why(self.name, "connects"))

    def probe_due(self) -> bool:
        """True, once, when a skipped node's while is over: the caller then
        opens one connection in the background, the probe, and reports how it
        ended to :meth:`connected` with ``probe=True``."""
        return self.breaker.probe_due()

    def connected(self, error: Exception | None, budget: float, probe: bool = False) -> None:
        """Record how a connect ended (called by the thread that made it)."""
        if isinstance(error, redis.exceptions.TimeoutError):
            self.breaker.timed_out(budget, probe)
        else:
            self.breaker.answered(probe)

    def new_connection(self) -> Any:
        return self.pool.connection_class(**self.pool.connection_kwargs)

    def put_back(self, conn: Any, owed: int = 0) -> None:
        """Make ``conn`` idle again; ``owed``: replies still on their way on it."""
        if owed:
            self.owed[conn] = owed  # before it is idle: whoever takes it reads them first
        self._idle.append(conn)

    def discard(self, conn: Any) -> None:
        """Close a connection that may hold an unread or half-read reply: it is never reused."""
        self.owed.pop(conn, None)
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
