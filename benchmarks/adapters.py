"""Lock adapters with one interface, shared by ``benchmarks/locks.py`` and the
shared anchors harness (``bench/anchors_bench.py --candidate adapters:adapters``).

The adapter protocol (``bench/README.md`` section 4): an adapter has

``label``       human-readable name for the tables
``key``         unique id (used in spec strings such as ``cand:adapters:adapters:KEY``)
``n_nodes``     how many Redis nodes it locks on
``new(key)``    -> a handle for the lock called ``key`` (one handle may be re-used)
``acquire(handle, timeout=None)`` -> bool, blocking; ``timeout`` in seconds (None: no limit)
``release(handle)``
``extend(handle)``  reset the lease to its full TTL (or ``extend = None``)

:func:`adapters` gives celery_redlock at 1, 3 and 5 nodes (as many as it is
handed), with fencing on and with fencing off. :func:`reference_adapters`
gives the libraries ``locks.py`` compares against (redis-py ``Lock``, pottery
``Redlock``); their construction mirrors ``anchors_bench.py`` so that the two
scripts measure the same thing.

:func:`celery_task` is the harness's ``--celery-candidate`` entry point: a
``LockedTask`` on the Redis nodes named by the environment variable
``CELERY_REDLOCK_BENCH_NODES`` (:data:`NODES_ENV`). ``celery_tasks.py`` builds
its celery_redlock tasks with the same :func:`locked_task`.

This module must stay importable in spawned child processes and without
Celery being set up: it imports only redis, celery_redlock.core and, lazily,
pottery and (in :func:`locked_task`) celery_redlock's task layer.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from typing import Any

#: Lease TTL in seconds, as in anchors_bench.py.
TTL = 10.0
#: Node counts measured for celery_redlock, when that many nodes are given.
NODE_COUNTS = (1, 3, 5)

#: Environment variable naming the Redis nodes of :func:`celery_task`'s lock:
#: URLs separated by commas or spaces. Both the harness's own process (the
#: producer) and its worker subprocess read it (the worker inherits the
#: harness's environment).
NODES_ENV = "CELERY_REDLOCK_BENCH_NODES"
#: Used when :data:`NODES_ENV` is unset: the first three nodes of the harness
#: (``anchors_bench.py nodes start``, ports 7001-7005).
DEFAULT_CELERY_NODES = (
    "redis://127.0.0.1:7001/0",
    "redis://127.0.0.1:7002/0",
    "redis://127.0.0.1:7003/0",
)


def _plural(n: int) -> str:
    return f"{n} node{'s' if n != 1 else ''}"


class _Handle:
    """A celery_redlock lock handle: the name, and the lease while held."""

    __slots__ = ("name", "lease")

    def __init__(self, name: str) -> None:
        self.name = name
        self.lease: Any = None


class CeleryRedlockAdapter:
    """celery_redlock ``Redlock`` over the given nodes.

    Args:
        nodes: ``(host, port)`` pairs (or Redis URLs).
        fencing: hand out fencing tokens (one more round trip per acquire).
        ttl: lease TTL in seconds.
        retry_delay: base of the blocking back-off (full jitter), seconds.
        key_prefix: Redis key prefix (``{prefix}:lock:{name}``).
    """

    def __init__(
        self,
        nodes: Sequence[Any],
        *,
        fencing: bool = True,
        ttl: float = TTL,
        retry_delay: float = 0.05,
        key_prefix: str = "anchors",
    ) -> None:
        from celery_redlock.core import Redlock

        urls = [n if isinstance(n, str) else f"redis://{n[0]}:{n[1]}/0" for n in nodes]
        self.redlock = Redlock(urls, fencing=fencing, key_prefix=key_prefix, sleep=self._sleep)
        #: acquire_retries: back-off sleeps inside acquire (0 when uncontended and
        #: every node answers in time); extend_failures: extends that lost the lease.
        self.stats = {"acquire_retries": 0, "extend_failures": 0}
        self.ttl = ttl
        self.retry_delay = retry_delay
        self.fencing = fencing
        self.n_nodes = len(urls)
        self.key = f"celery_redlock-{self.n_nodes}" + ("" if fencing else "-nofence")
        self.label = (
            f"celery_redlock ({_plural(self.n_nodes)}, fencing {'on' if fencing else 'off'})"
        )

    def new(self, key: str) -> _Handle:
        return _Handle("cr:" + key)

    def acquire(self, h: _Handle, timeout: float | None = None) -> bool:
        h.lease = self.redlock.acquire(
            h.name, ttl=self.ttl, blocking=True, timeout=timeout, retry_delay=self.retry_delay
        )
        return h.lease is not None

    def release(self, h: _Handle) -> None:
        lease, h.lease = h.lease, None
        if lease is not None:
            self.redlock.release(lease)

    def extend(self, h: _Handle) -> None:
        if not self.redlock.extend(h.lease, self.ttl):
            # A node missed the round deadline (node_timeout) and the lease is
            # marked lost: count it and take the lock again so the run goes on.
            self.stats["extend_failures"] += 1
            self.release(h)
            if not self.acquire(h):
                raise RuntimeError(
                    f"{self.label}: could not re-take {h.name!r} after a failed extend"
                )

    def _sleep(self, seconds: float) -> None:
        self.stats["acquire_retries"] += 1
        time.sleep(seconds)

    def close(self) -> None:
        for node in self.redlock.nodes:
            node.close()


def adapters(nodes: Sequence[tuple[str, int]]) -> list[CeleryRedlockAdapter]:
    """The ``--candidate`` entry point: celery_redlock at 1/3/5 nodes, fencing on and off."""
    out = []
    for n in NODE_COUNTS:
        if n <= len(nodes):
            for fencing in (True, False):
                out.append(CeleryRedlockAdapter(list(nodes[:n]), fencing=fencing))
    return out


# --------------------------------------------------------------------------- #
# reference libraries (same construction as bench/anchors_bench.py)
# --------------------------------------------------------------------------- #
class RedisPyLockAdapter:
    """redis-py ``Lock`` on one node, default client and default ``sleep`` (0.1 s)."""

    extend_kind = "Lock.extend(ttl, replace_ttl=True)"

    def __init__(self, node: tuple[str, int], *, ttl: float = TTL) -> None:
        import redis

        self.r = redis.Redis(host=node[0], port=node[1])
        self.ttl = ttl
        self.n_nodes = 1
        self.key = "redispy"
        self.label = "redis-py Lock (1 node)"

    def new(self, key: str) -> Any:
        return self.r.lock("anchors:redispy:" + key, timeout=self.ttl)

    def acquire(self, h: Any, timeout: float | None = None) -> bool:
        return h.acquire(blocking=True, blocking_timeout=timeout)

    def release(self, h: Any) -> None:
        h.release()

    def extend(self, h: Any) -> None:
        # redis-py ADDS to the remaining TTL unless replace_ttl=True.
        h.extend(self.ttl, replace_ttl=True)

    def close(self) -> None:
        self.r.close()


class PotteryRedlockAdapter:
    """pottery ``Redlock`` (default clients, ``num_extensions`` lifted as in the harness)."""

    def __init__(self, nodes: Sequence[tuple[str, int]], *, ttl: float = TTL) -> None:
        import redis
        from pottery import Redlock

        self.cls = Redlock
        self.masters = frozenset(redis.Redis(host=h, port=p) for h, p in nodes)
        self.ttl = ttl
        self.n_nodes = len(nodes)
        self.key = f"pottery-{self.n_nodes}"
        self.label = f"pottery Redlock ({_plural(self.n_nodes)})"

    def new(self, key: str) -> Any:
        return self.cls(
            key="anchors:pottery:" + key,
            masters=self.masters,
            auto_release_time=self.ttl,
            num_extensions=10**9,
        )

    def acquire(self, h: Any, timeout: float | None = None) -> bool:
        return h.acquire(blocking=True, timeout=-1 if timeout is None else timeout)

    def release(self, h: Any) -> None:
        h.release()

    def extend(self, h: Any) -> None:
        h.extend()

    def close(self) -> None:
        for m in self.masters:
            m.close()


def reference_adapters(nodes: Sequence[tuple[str, int]]) -> list[Any]:
    """redis-py Lock (first node), pottery Redlock on 3 and 5 nodes (if given)."""
    out: list[Any] = [RedisPyLockAdapter(nodes[0])]
    for n in (3, 5):
        if n <= len(nodes):
            out.append(PotteryRedlockAdapter(list(nodes[:n])))
    return out


# --------------------------------------------------------------------------- #
# Celery: a LockedTask for the harness's --celery-candidate (and celery_tasks.py)
# --------------------------------------------------------------------------- #
def celery_nodes() -> list[str]:
    """The nodes listed in ``$CELERY_REDLOCK_BENCH_NODES``, else :data:`DEFAULT_CELERY_NODES`."""
    value = os.environ.get(NODES_ENV, "").replace(",", " ").split()
    return value or list(DEFAULT_CELERY_NODES)


def locked_task(
    app: Any,
    body: Callable[[], None],
    *,
    name: str,
    nodes: Sequence[str],
    token: bool = True,
    **options: Any,
) -> Any:
    """Register a ``LockedTask`` called ``name`` whose ``run(i)`` calls ``body()``.

    Default settings except the nodes: fencing on, heartbeat on (ttl / 3),
    TTL 10 s, ``drop`` on contention. ``lock_on="i"``, so every distinct
    argument is its own lock key. With ``token`` (the default) ``run`` declares
    ``fencing_token=None``, so the token is written back and passed in before
    the body; a missing one raises, and the task then does not count as
    executed. Without it the body never reads the token, so none is written
    (lazy fencing: the cost of a task that does not use it). Further
    ``options`` are task options (e.g. ``lock_enqueue="until_finished"``).
    """
    from celery_redlock import LockedTask

    if token:

        def run(i: Any, fencing_token: Any = None) -> None:
            if fencing_token is None:
                raise RuntimeError(f"{name}: no fencing token was passed")
            body()

    else:

        def run(i: Any) -> None:
            body()

    run.__name__ = run.__qualname__ = name.replace(".", "_").replace("-", "_")
    return app.task(name=name, base=LockedTask, lock_on="i", lock_nodes=list(nodes), **options)(run)


def celery_task(app: Any, body: Callable[[], None]) -> Any:
    """The ``--celery-candidate`` entry point: ``anchors.candidate`` as a celery_redlock task.

    A ``LockedTask`` on the nodes of ``$CELERY_REDLOCK_BENCH_NODES`` (all the
    nodes listed; give three to compare with ``celery_tasks.py``'s 3-node
    figures), fencing and heartbeat on, one lock key per argument.
    """
    return locked_task(app, body, name="anchors.candidate", nodes=celery_nodes())


class PostgresFloorAdapter:
    """The raw floor of a PostgreSQL lease: one lease-table row per name, taken
    with one ``INSERT ... ON CONFLICT ... WHERE expired`` (a row back: granted,
    with its fence) and freed with one ``UPDATE``, two commits, through psycopg
    with nothing of ours in between. ``flushed_release=False``: the release
    commits without waiting for its WAL flush, as the node's own does (on a
    connection of its own with ``synchronous_commit = off``)."""

    key = "pg-floor"
    label = "raw lease table (PostgreSQL, 2 statements)"
    n_nodes = 1
    fencing = True

    def __init__(self, url: str, *, ttl: float = TTL, flushed_release: bool = True) -> None:
        import psycopg

        self.conn = psycopg.connect(url, autocommit=True)
        self.release_conn = self.conn
        if not flushed_release:
            self.release_conn = psycopg.connect(url, autocommit=True)
            self.release_conn.execute("SET synchronous_commit = off")
        self.conn.execute(
            "CREATE TABLE IF NOT EXISTS bench_lease (name text PRIMARY KEY, owner text NOT NULL,"
            " fence bigint NOT NULL, expires_at timestamptz NOT NULL)"
        )
        self.ms = int(ttl * 1000)

    def new(self, key: str) -> str:
        return key

    def acquire(self, h: str, timeout: float | None = None) -> bool:
        row = self.conn.execute(
            "INSERT INTO bench_lease AS l (name, owner, fence, expires_at) VALUES"
            " (%s, 'me', 1, clock_timestamp() + %s * interval '1 millisecond')"
            " ON CONFLICT (name) DO UPDATE SET owner = EXCLUDED.owner, fence = l.fence + 1,"
            " expires_at = EXCLUDED.expires_at WHERE l.expires_at < clock_timestamp()"
            " RETURNING fence",
            (h, self.ms),
        ).fetchone()
        return row is not None

    def release(self, h: str) -> None:
        self.release_conn.execute(
            "UPDATE bench_lease SET expires_at = '-infinity' WHERE name = %s AND owner = 'me'",
            (h,),
        )

    def extend(self, h: str) -> None:
        self.conn.execute(
            "UPDATE bench_lease SET expires_at = clock_timestamp() + %s * interval '1 millisecond'"
            " WHERE name = %s AND owner = 'me'",
            (self.ms, h),
        )

    def close(self) -> None:
        self.conn.close()
        self.release_conn.close()


def postgres_adapters(url: str, durable: bool = True) -> list[Any]:
    """celery_redlock on one PostgreSQL node, and the raw lease-table floor beside it.

    ``durable``: the server flushes each commit to disk (``fsync`` on, as a lock
    node runs: a grant, and the fence it raised, survive a crash of the machine).
    Otherwise its keys end in ``-nofsync``: commits cost no flush, and what is left
    is the statements' and the clients' own cost."""
    tag, how = ("", "fsync on") if durable else ("-nofsync", "fsync off")
    node = CeleryRedlockAdapter([url], fencing=True)
    node.key = "celery_redlock-1pg" + tag
    node.label = f"celery_redlock (1 PostgreSQL node, {how}, fencing on)"
    floor = PostgresFloorAdapter(url)
    floor.key += tag
    floor.label = f"raw lease table (PostgreSQL, {how}, 2 statements)"
    if not durable:  # no flush to skip
        return [node, floor]
    like = PostgresFloorAdapter(url, flushed_release=False)
    like.key += "-unflushed-release"
    like.label = f"raw lease table (PostgreSQL, {how}, 2 statements, release unflushed)"
    return [node, floor, like]


class EtcdLockServiceAdapter:
    """etcd's own lock service (``/v3/lock/lock`` + ``/v3/lock/unlock``, what
    ``etcdctl lock`` uses) on one lease granted once, as etcd's concurrency
    Session does, through etcd3gw: the same HTTP/JSON gateway and the same
    transport (requests) as celery_redlock's etcd node; extend is the lease's
    keep-alive."""

    key = "etcd-lock"
    label = "etcd lock service (v3lock, etcd3gw)"
    n_nodes = 1
    fencing = True  # the lock key's revision serves as one

    def __init__(self, url: str, *, ttl: float = TTL) -> None:
        import etcd3gw

        host, port = url.split("://", 1)[1].split(",")[0].rsplit(":", 1)
        self.client = etcd3gw.Etcd3Client(host=host, port=int(port), timeout=5)
        self.lease = self.client.post(self.client.get_url("/lease/grant"), json={"TTL": int(ttl)})[
            "ID"
        ]

    def new(self, key: str) -> dict:
        import base64

        return {"name": base64.b64encode(f"bench/{key}".encode()).decode(), "key": None}

    def acquire(self, h: dict, timeout: float | None = None) -> bool:
        got = self.client.post(
            self.client.get_url("/lock/lock"), json={"name": h["name"], "lease": self.lease}
        )
        h["key"] = got["key"]
        return True

    def release(self, h: dict) -> None:
        self.client.post(self.client.get_url("/lock/unlock"), json={"key": h["key"]})

    def extend(self, h: dict) -> None:
        self.client.post(self.client.get_url("/lease/keepalive"), json={"ID": self.lease})

    def close(self) -> None:
        self.client.post(self.client.get_url("/lease/revoke"), json={"ID": self.lease})
        self.client.session.close()


def etcd_adapters(url: str) -> list[Any]:
    """celery_redlock on one etcd node, and etcd's own lock service beside it."""
    node = CeleryRedlockAdapter([url], fencing=True)
    node.key = "celery_redlock-1etcd"
    node.label = "celery_redlock (1 etcd node, fencing on)"
    return [node, EtcdLockServiceAdapter(url)]


class KazooLockAdapter:
    """kazoo's own ``Lock`` recipe (an ephemeral sequential contender node, then
    the children listed; release deletes it) on one session, one Lock object
    per key reused, on the same ensemble as celery_redlock's ZooKeeper node.
    It has no per-lock TTL to renew (its lock lives as long as the session):
    extend is one read of the lock's znode, the least a check of it costs."""

    key = "kazoo-lock"
    label = "kazoo Lock recipe (ephemeral sequential node)"
    n_nodes = 1
    fencing = False  # the sequence suffix restarts with its parent: no token

    def __init__(self, url: str) -> None:
        from kazoo.client import KazooClient

        self.client = KazooClient(hosts=url.split("://", 1)[1], timeout=10.0)
        self.client.start(timeout=10)

    def new(self, key: str) -> Any:
        return self.client.Lock(f"/bench/{key.replace(':', '_')}", "bench")

    def acquire(self, h: Any, timeout: float | None = None) -> bool:
        return bool(h.acquire(timeout=timeout))

    def release(self, h: Any) -> None:
        h.release()

    def extend(self, h: Any) -> None:
        self.client.exists(h.path)

    def close(self) -> None:
        self.client.stop()
        self.client.close()


def zookeeper_adapters(url: str) -> list[Any]:
    """celery_redlock on one ZooKeeper node, and kazoo's Lock recipe beside it."""
    node = CeleryRedlockAdapter([url], fencing=True)
    node.key = "celery_redlock-1zk"
    node.label = "celery_redlock (1 ZooKeeper node, fencing on)"
    return [node, KazooLockAdapter(url)]
