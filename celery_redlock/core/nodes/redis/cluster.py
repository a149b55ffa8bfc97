"""A lock node that is a Redis Cluster: its shard masters and its slot map.

A cluster is **one** node of the quorum, like one master: three independent
clusters make a quorum of three, one cluster alone is a single node with the
single-node guarantee (it fails over like a Sentinel-managed master: a write
acknowledged by a shard master and lost in its failover is lost). Given as a
``redis+cluster://host:port[,host:port...]`` URL (``rediss+cluster://`` for
TLS; the hosts are seeds, any of the cluster's nodes) or as a
``redis.cluster.RedisCluster``.

Each shard master is a :class:`~celery_redlock.core.nodes.redis.node.Node` of its own,
with its own connections (on the lean wire path for a URL), so a round sends a
script call straight to the master of its key's hash slot. The keys of one
name share a slot (their hash tag), so a call about one name goes to one
shard. A call about many names (the heartbeat's renewals, a dead child's
release: :data:`BATCHES`) is split by shard, one call per shard in the same
round, each run as a script flagged ``allow-cross-slot-keys`` (Redis 7), so a
shard takes the keys of all its slots in one call.

The slot map (``CLUSTER SLOTS``) is read on first use and again when a shard
answers ``MOVED`` (the round follows the redirect once; an ``ASK`` is followed
once with ``ASKING``). A shard that does not answer makes the node answer only
for the other shards' keys: its keys count this node as not answering, never
as free.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Sequence
from typing import Any, Union
from urllib.parse import unquote, urlsplit

import redis
from redis.crc import key_slot
from redis.exceptions import RedisError

from ...connect import connector
from ...exceptions import ConfigurationError
from ...keyspace import tagged
from .. import mask_url
from ..guard import FORKS, Breaker
from ..scripts import Script
from .node import BaseNode, Node
from .urls import client_for

__all__ = [
    "BATCHES",
    "CLUSTER_SCHEMES",
    "ClusterNode",
    "check_together",
    "LockNode",
    "Part",
    "combine",
    "cross_call",
    "cross_slot",
    "map_all",
    "node_for",
    "same_slot",
]

#: The URL schemes of a node that is a Redis Cluster.
CLUSTER_SCHEMES = ("redis+cluster", "rediss+cluster")

#: The scripts whose keys may span names (so slots): script name -> how many
#: arguments belong to each key (0: the arguments are shared by all keys), and
#: how the replies of the shards add up (``"each"``: one item per key,
#: ``"sum"``: a count).
BATCHES: dict[str, tuple[int, str]] = {"extend": (2, "each"), "release_prefix": (0, "sum")}

SLOTS = 16384

#: A node of a quorum: one master, or one cluster.
LockNode = Union[Node, "ClusterNode"]


def node_for(
    spec: Any, timeout: float, min_replicas: int = 0, connect_timeout: float | None = None
) -> LockNode:
    """The node that ``spec`` names: a :class:`ClusterNode` for a cluster URL or
    a ``redis.cluster.RedisCluster``, else a :class:`Node`."""
    if isinstance(spec, redis.RedisCluster) or (
        isinstance(spec, str) and urlsplit(spec).scheme in CLUSTER_SCHEMES
    ):
        return ClusterNode(spec, timeout, min_replicas, connect_timeout)
    return Node(spec, timeout, min_replicas, connect_timeout)


def same_slot(keys: Sequence[str]) -> bool:
    """True when every key of ``keys`` hashes to one slot of a Redis Cluster."""
    return len({key_slot(k.encode()) for k in keys}) <= 1


def check_together(nodes: Sequence[Any], names: Sequence[str], option: str = "also") -> None:
    """Refuse names held together (``also``, ``lock_also``) that a cluster node
    cannot take in one call: unless they share one hash slot.

    One call per node checks every name before it takes any (the all-or-nothing
    rule that makes ``also`` deadlock-free); a cluster runs one call on one
    shard, and only keys of one slot are sure to stay together on a shard
    through a reshard. Names share a slot when they carry one hash tag
    (``"order:{pay}"`` and ``"payment-api:{pay}"``).

    Raises:
        ConfigurationError: a node is a cluster and the names' keys fall on
            several slots.
    """
    clusters = [node.name for node in nodes if node.cluster]
    if not clusters or (option != "lock_also" and same_slot([tagged(name) for name in names])):
        return
    if option == "lock_also":  # a task's key is tagged by its arguments' digest
        why = "a task's key is in the hash slot of its arguments' digest, another on each call"
        fix = "use plain masters for tasks with lock_also"
    else:
        why = f"the names {', '.join(map(repr, names))} fall on different hash slots"
        fix = "give them one hash tag (e.g. 'order:{pay}' with 'payment-api:{pay}')"
    raise ConfigurationError(
        f"{option}: {why}, and lock node {clusters[0]} is a Redis Cluster, which takes "
        f"the names held together in one call on one slot only; {fix}"
    )


class Part:
    """What one shard is sent for one node in a round: the keys (and their
    arguments) of that shard, where they sit in the caller's keys, and whether
    it follows an ``ASK`` (``ASKING`` goes first)."""

    __slots__ = ("node", "shard", "keys", "args", "at", "cross", "asking")

    def __init__(
        self,
        node: ClusterNode | None,
        shard: Node,
        keys: Sequence[str],
        args: Sequence[Any],
        at: list[int],
        cross: bool,
        asking: bool = False,
    ):
        self.node, self.shard, self.keys, self.args, self.at = node, shard, keys, args, at
        self.cross, self.asking = cross, asking


class ClusterNode(BaseNode):
    """One Redis Cluster, a single node of a quorum.

    Args:
        spec: ``redis+cluster://[[user]:password@]host:port[,host:port...][?options]``
            (``rediss+cluster://`` for TLS; options as for ``redis://``) or a
            ``redis.cluster.RedisCluster`` (its connection settings are used
            for each shard master).
        timeout: socket and connect timeout in seconds (a URL's shards).
        min_replicas: replicas of each **shard** master that must confirm a
            write (``WAIT`` on that master).
        connect_timeout: a shard's connect budget (see :class:`Node`).
    """

    kind = "redis"
    cluster = True

    def _from_spec(self, spec: Any) -> None:
        self._lock = threading.Lock()
        if isinstance(spec, str):
            self._seeds, self._url = _parse(spec)
            self.name = mask_url(spec)
            self._options: dict[str, Any] | None = None
        elif isinstance(spec, redis.RedisCluster):
            self._seeds = [(n.host, int(n.port)) for n in spec.get_nodes()]
            self._url = ""
            self._options = {
                k: v for k, v in spec.get_connection_kwargs().items() if k not in ("host", "port")
            }
            self.name = "redis+cluster://" + ",".join(f"{h}:{p}" for h, p in self._seeds)
        else:  # pragma: no cover - node_for only builds clusters
            raise ConfigurationError(f"not a Redis Cluster: {type(spec).__name__}")
        if not self._seeds:
            raise ConfigurationError(f"Redis Cluster URL {self.name!r} names no host")
        self.identity: tuple = ("cluster", frozenset(self._seeds))
        #: The shard masters met so far, by address.
        self.shards: dict[tuple[str, int], Node] = {}
        self._slots: list[Node] | None = None
        self._rereading = (0, False)  # (fork count, a background read of the map is under way)
        self.unmapped = Breaker()  # on its slot map reads: see cold

    def __repr__(self) -> str:
        return f"<ClusterNode {self.name}>"

    # -- the shard masters and the slot map -------------------------------------------------------

    def shard(self, host: str, port: int) -> Node:
        """The shard master at ``host:port`` (a node of its own, made at first sight)."""
        found = self.shards.get((host, port))
        if found is None:
            with self._lock:
                found = self.shards.get((host, port))
                if found is None:
                    found = self.shards[(host, port)] = self._make_shard(host, port)
        return found

    def _make_shard(self, host: str, port: int) -> Node:
        if self._options is None:
            url = self._url.replace("\0", f"{host}:{port}")
            node = Node(url, self.timeout, self.min_replicas, self.connect_timeout)
        else:
            client = redis.Redis(host=host, port=port, **self._options)
            node = Node(client, 1, self.min_replicas, self.connect_timeout)
        node.name = f"{self.name} shard {host}:{port}"
        return node

    @property
    def mapped(self) -> bool:
        return self._slots is not None

    def members(self) -> list[Node]:
        """The servers a scan visits: the shard masters (:meth:`masters`)."""
        return self.masters()

    def masters(self) -> list[Node]:
        """The shard masters of the slot map (read now if never read), in slot order."""
        if self._slots is None:
            error = self.refresh(self.timeout + (self.connect_timeout or 0.0))
            if error is not None:
                raise error
        out: list[Node] = []
        for node in self._slots or ():
            if not out or out[-1] is not node:
                if node not in out:
                    out.append(node)
        return out

    def refresh(self, timeout: float, first: tuple[str, int] | None = None) -> RedisError | None:
        """Read the slot map (``CLUSTER SLOTS``) from ``first``, else from the
        shards and seeds in turn, all within ``timeout``. Returns None, or the
        error of the last one asked (and the map is then not read again before
        a while: :meth:`cold`)."""
        error: RedisError | None = None
        asked = [first] if first else []
        asked += [a for a in (*self.shards, *self._seeds) if a not in asked]
        deadline = time.monotonic() + timeout
        for host, port in asked:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            client = self._client(host, port, left)
            try:
                reply = client.execute_command("CLUSTER", "SLOTS")
            except (RedisError, OSError) as exc:
                error = exc if isinstance(exc, RedisError) else redis.ConnectionError(str(exc))
                continue
            finally:
                client.close()
            self._slots = self._map(reply, host)
            self.unmapped.answered()
            return None
        self.unmapped.timed_out(max(timeout, 0.05))
        return error or redis.exceptions.TimeoutError(f"{self.name}: no slot map in {timeout:g}s")

    def cold(self) -> bool:
        """True when the slot map is missing and may be read now (not within a
        while after a failed read: a cluster none of whose nodes answers then
        costs a round nothing, like a node behind its circuit breaker)."""
        return self._slots is None and not self.unmapped.skipping()

    def suspect(self) -> None:
        """A shard master failed: read the slot map again in the background
        (one read at a time per process), so that once a replica has taken
        over, the next round reaches it."""
        forks = FORKS.count  # a forked child rereads on its own
        if self._rereading == (forks, True):
            return
        self._rereading = (forks, True)
        connector().submit(self._reread, forks)

    def _reread(self, forks: int) -> None:
        try:
            self.refresh(self.timeout + (self.connect_timeout or 0.0))
        finally:
            self._rereading = (forks, False)

    def _map(self, reply: Any, asked: str) -> list[Node]:
        slots: list[Any] = [None] * SLOTS
        for start, end, master, *_ in reply:
            host = _text(master[0]) or asked  # an empty host: the one asked
            shard = self.shard(host, int(master[1]))
            slots[int(start) : int(end) + 1] = [shard] * (int(end) - int(start) + 1)
        return slots

    def _client(self, host: str, port: int, timeout: float) -> redis.Redis:
        connect = self.connect_timeout or timeout
        if self._options is None:
            return client_for(self._url.replace("\0", f"{host}:{port}"), timeout, connect)
        options = {**self._options, "socket_timeout": timeout, "socket_connect_timeout": connect}
        return redis.Redis(host=host, port=port, **options)

    def close(self) -> None:
        for shard in list(self.shards.values()):
            shard.close()

    # -- routing ----------------------------------------------------------------------------------

    def at_slot(self, slot: int) -> Node:
        """The shard master of hash slot ``slot``."""
        assert self._slots is not None
        return self._slots[slot]

    def slot_master(self, key: Any) -> Node:
        """The shard master of ``key``'s hash slot."""
        assert self._slots is not None
        return self._slots[key_slot(key.encode() if isinstance(key, str) else key)]

    def route(self, script: str, keys: Sequence[str], args: Sequence[Any]) -> list[Part]:
        """The calls of one script call, one per shard its keys fall on."""
        slots = self._slots
        assert slots is not None
        batch = BATCHES.get(script)
        if batch is None or len(keys) < 2:
            return [Part(self, slots[key_slot(keys[0].encode())], keys, args,
                         list(range(len(keys))), False)]  # fmt: skip
        return self.split(slots, keys, args, batch[0])

    def split(
        self,
        slots: Sequence[Node],
        keys: Sequence[str],
        args: Sequence[Any],
        stride: int,
        at: Sequence[int] | None = None,
    ) -> list[Part]:
        """A batch's keys grouped by the shard master of their slot."""
        groups: dict[int, tuple[Node, list[int]]] = {}
        for j, key in enumerate(keys):
            shard = slots[key_slot(key.encode())]
            groups.setdefault(id(shard), (shard, []))[1].append(j)
        return [self._part(shard, keys, args, js, stride, at) for shard, js in groups.values()]

    def _part(
        self,
        shard: Node,
        keys: Sequence[str],
        args: Sequence[Any],
        js: list[int],
        stride: int,
        at: Sequence[int] | None = None,
        asking: bool = False,
    ) -> Part:
        """The keys ``js`` of a batch (their arguments: ``stride`` a key, or all
        shared) as a call to ``shard``; ``at`` maps them back to the caller's keys."""
        mine = [keys[j] for j in js]
        theirs = [a for j in js for a in args[stride * j : stride * (j + 1)]] if stride else args
        where = [at[j] for j in js] if at is not None else js
        return Part(self, shard, mine, theirs, where, not same_slot(mine), asking)

    def redirected(self, script: str, part: Part, error: Any, timeout: float) -> list[Part]:
        """The calls that follow a ``MOVED`` or ``ASK`` answer to ``part``, once."""
        batch = BATCHES.get(script)
        keys, args, at = part.keys, part.args, part.at
        if isinstance(error, redis.exceptions.MovedError):
            self.refresh(timeout, (error.host, int(error.port)))
            slots = self._slots
            assert slots is not None
            if batch is None:  # one name: its keys stay together
                return [Part(self, slots[key_slot(keys[0].encode())], keys, args, at, False)]
            return self.split(slots, keys, args, batch[0], at)
        # ASK: the keys of the migrating slot go to its new master, after ASKING.
        target = self.shard(error.host, int(error.port))
        if batch is None:
            return [Part(self, target, keys, args, at, False, asking=True)]
        asked = [j for j, k in enumerate(keys) if key_slot(k.encode()) == error.slot_id]
        rest = [j for j in range(len(keys)) if j not in asked]
        return [
            self._part(shard, keys, args, js, batch[0], at, asking)
            for js, shard, asking in ((asked, target, True), (rest, part.shard, False))
            if js
        ]


def map_all(nodes: Sequence[Any], timeout: float) -> None:
    """Read the slot maps of the clusters among ``nodes`` that have none yet,
    all at once (in threads of :func:`~celery_redlock.core.connect.connector`):
    a cold start costs one round trip, not one per cluster. A read opens a new
    connection, so it gets the node's connect budget before ``timeout``, as a
    plain node's new connection does (a busy host's slow first connect is not
    an outage)."""
    cold = [node for node in nodes if node.cluster and node.cold()]
    if not cold:
        return
    budget = timeout + max(node.connect_timeout or 0.0 for node in cold)
    if len(cold) == 1:
        cold[0].refresh(budget)
        return
    done: queue.SimpleQueue = queue.SimpleQueue()
    for node in cold:
        connector().submit(_refresh, node, budget, done)
    deadline = time.monotonic() + budget
    for _ in cold:
        try:
            done.get(timeout=max(deadline - time.monotonic(), 0.001))
        except queue.Empty:
            return


def _refresh(node: ClusterNode, timeout: float, done: queue.SimpleQueue) -> None:
    done.put(node.refresh(timeout))


def combine(script: str, count: int, parts: Sequence[tuple[Part, Any]]) -> Any:
    """One node's reply from the replies of its shards.

    A call about one name has one shard: its reply, or its error. A batch
    (:data:`BATCHES`) adds up the shards that answered; the keys of a shard
    that did not answer count as not done there (0). With no shard answering,
    the node's reply is the first shard's error.
    """
    if len(parts) == 1 and BATCHES.get(script) is None:
        return parts[0][1]
    kind = BATCHES.get(script, (0, "each"))[1]
    errors = [reply for _, reply in parts if isinstance(reply, Exception)]
    if len(errors) == len(parts):
        return errors[0]
    if kind == "sum":
        return sum(reply for _, reply in parts if isinstance(reply, int))
    out: list[Any] = [0] * count
    for part, reply in parts:
        if isinstance(reply, list):
            for j, item in zip(part.at, reply):
                out[j] = item
    return out


def cross_slot(script: Script) -> Script:
    """``script`` for keys of several slots of one shard (Redis 7).

    A cluster refuses a call whose declared keys hash to several slots, even
    for a script flagged ``allow-cross-slot-keys``; that flag lets the script
    reach keys of other slots of the same shard. So this variant declares one
    key (its slot routes the call) and takes all of them in ``ARGV``: called
    with ``1, key_1, n, key_1 .. key_n, arg...``, it runs ``script`` with
    ``KEYS = key_1 .. key_n`` and ``ARGV = arg...`` (:func:`cross_call`).
    """
    found = _CROSS.get(script.sha)
    if found is None:
        found = _CROSS[script.sha] = Script(script.name, _UNPACK + script.text)
    return found


def cross_call(verb: str, handle: str, keys: Sequence[str], args: Sequence[Any]) -> tuple:
    """The call of a :func:`cross_slot` script."""
    return (verb, handle, 1, keys[0], len(keys), *keys, *args)


_UNPACK = """#!lua flags=allow-cross-slot-keys
local KEYS, ARGV = (function(a)
  local n, k, v = tonumber(a[1]), {}, {}
  for i = 1, n do k[i] = a[1 + i] end
  for i = n + 2, #a do v[#v + 1] = a[i] end
  return k, v
end)(ARGV)
"""


_CROSS: dict[str, Script] = {}


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _parse(url: str) -> tuple[list[tuple[str, int]], str]:
    """The seeds of a cluster URL, and the URL of a shard with ``\\0`` for its ``host:port``."""
    parts = urlsplit(url)
    userinfo, _, hostlist = parts.netloc.rpartition("@")
    seeds = []
    for item in hostlist.split(","):
        host, _, port = item.strip().rpartition(":")
        host = host.strip("[]")
        if not host or not port.isdigit():
            raise ConfigurationError(
                f"Redis Cluster URL {mask_url(url)!r}: {unquote(item)!r} is not host:port"
            )
        seeds.append((host, int(port)))
    if parts.path.strip("/") not in ("", "0"):
        raise ConfigurationError(
            f"Redis Cluster URL {mask_url(url)!r}: a cluster has database 0 only"
        )
    scheme = parts.scheme.replace("+cluster", "")
    at = f"{userinfo}@" if userinfo else ""
    query = f"?{parts.query}" if parts.query else ""
    return seeds, f"{scheme}://{at}\0/0{query}"
