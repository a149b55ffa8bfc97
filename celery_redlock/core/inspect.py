"""Inspection: read-only views of the nodes for the tools (cli, beat), and the
operator's force release. Nothing here takes a lock.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import Any, NamedTuple

from . import nodes as kinds
from .keyspace import KeySpace
from .nodes import mask_url, node_for
from .ops import Count, Delete, Get, Inspect, Inspected, Scan, Value
from .quorum import Quorum
from .records import Holder, NodeInfo, agree
from .steps import On, Steps, driven
from .values import error_text

__all__ = [
    "ClaimView",
    "Deletion",
    "Inspection",
    "NodeInfo",
    "NodeView",
    "ScanResult",
    "mask_url",
    "node_name",
]


class NodeView(NamedTuple):
    """One node's copy of one key, or why the node did not answer."""

    #: The node, as named in messages (URL with the password masked).
    node: str
    #: The key's value (the owner value of a lock, a claim's value), or None.
    holder: str | None = None
    #: PTTL of the key in milliseconds: -2 no key, -1 no TTL.
    pttl_ms: int = -2
    #: The fence value, when a fence key was read.
    fence: str | None = None
    #: The node's error, or None when it answered.
    error: str | None = None


class ScanResult(NamedTuple):
    """What :meth:`Redlock.scan` found."""

    #: The names after ``{prefix}:{kind}:``, sorted, at most ``limit``.
    names: list[str]
    #: Node name -> error, for the nodes that failed during the scan.
    errors: dict[str, str]
    #: True when a node had more keys than ``limit``.
    truncated: bool


class ClaimView(NamedTuple):
    """A claim as the nodes hold it (:meth:`Redlock.read_claim`)."""

    #: The value a quorum of the nodes holds, or None.
    value: str | None
    #: The values that may hold a quorum, counting the nodes that did not answer.
    candidates: frozenset[str]


class Deletion(NamedTuple):
    """One node's answer to :meth:`Redlock.force_release`."""

    node: str
    #: True if the node had the key and deleted it.
    deleted: bool
    error: str | None


def node_name(spec: Any) -> str:
    """How a node is named in messages: its URL with any password masked, or a client's address.

    Raises:
        ConfigurationError: ``spec`` is neither a string nor a ``redis.Redis`` client.
    """
    return mask_url(spec) if isinstance(spec, str) else node_for(spec, 1.0).name


class Inspection:
    """The views of a client (see the :class:`Redlock` methods of the same names)."""

    __slots__ = ("quorum", "keyspace")

    def __init__(self, quorum: Quorum, keyspace: KeySpace):
        self.quorum = quorum
        self.keyspace = keyspace

    def reading_holder(self, name: str) -> Steps[Holder]:
        """The owner a quorum of nodes agrees on, and its remaining TTL.

        Raises:
            QuorumUnavailable: fewer than a quorum of nodes answered.
        """
        q = self.quorum
        replies = yield Inspect(*self.keyspace.keys(name))
        q.check(replies)
        return agree(
            [(r.holder, r.pttl_ms) for r in replies if isinstance(r, Inspected) and r.holder],
            q.needed,
        )

    def inspecting(self, name: str) -> Steps[list[dict[str, Any]]]:
        """Per node: holder, PTTL (ms) and fence value of ``name``, or the node's error."""
        q = self.quorum
        # every node's view: the round waits for each (not only for a quorum)
        replies = yield On(Inspect(*self.keyspace.keys(name)), q.nodes)
        out: list[dict[str, Any]] = []
        for node, r in zip(q.nodes, replies):
            if isinstance(r, Exception):
                out.append({"node": node.name, "error": str(r)})
            else:
                out.append(
                    {"node": node.name, "holder": r.holder, "pttl_ms": r.pttl_ms, "fence": r.fence}
                )
        return out

    def inspecting_key(
        self, key: str, fence_key: str | None = None, *, skip: dict[str, str] | None = None
    ) -> Steps[list[NodeView]]:
        """Each node's copy of the Redis key ``key`` (and of ``fence_key``), in one round.

        Takes the full key, as :meth:`keys` or :meth:`scan` give it, so it reads
        claims and keys written by other clients too. ``skip``: node name ->
        error text: these nodes are not asked and their views carry that error
        (a listing pays for a hung node once). One :class:`NodeView` per node,
        in the order of :attr:`nodes`.
        """
        q = self.quorum
        skip = skip or {}
        live = [node for node in q.nodes if node.name not in skip]
        replies = yield On(Inspect(key, fence_key or key), live)
        answers = dict(zip((node.name for node in live), replies))
        views = []
        for node in q.nodes:
            if node.name in skip:
                views.append(NodeView(node.name, error=skip[node.name]))
                continue
            reply = answers[node.name]
            if isinstance(reply, Exception):
                views.append(NodeView(node.name, error=error_text(reply)))
            else:
                fence = reply.fence if fence_key else None
                views.append(NodeView(node.name, reply.holder, reply.pttl_ms, fence))
        return views

    def agreed(self, views: Iterable[NodeView]) -> Holder:
        """The holder that a quorum of all the nodes shows in ``views``, if any.

        The one quorum rule of every read: a value counts when at least
        :attr:`quorum` nodes of all those configured hold it, never a majority
        of those that answered. ``remaining`` is the smallest TTL among them.
        """
        return agree([(v.holder, v.pttl_ms) for v in views if v.holder], self.quorum.needed)

    def scan(
        self, kind: str = "lock", pattern: str = "*", *, limit: int = 100, count: int = 1000
    ) -> ScanResult:
        """The names of the ``{prefix}:{kind}:`` keys on the nodes, found with SCAN, never KEYS.

        ``kind`` is the key family (``lock``, ``fence``, ``beat``, ``claim``...),
        ``pattern`` a Redis glob matched against the part after
        ``{prefix}:{kind}:``; at most ``limit`` keys per node and names;
        ``count`` is the COUNT hint of each SCAN call. Returns the names
        (sorted, each found on at least one node), the nodes that failed, and
        whether ``limit`` cut it short.
        """
        q = self.quorum
        base = f"{self.keyspace.key_prefix}:{kind}:"
        match = "".join("\\" + c if c in "\\*?[]" else c for c in base) + pattern
        errors: dict[str, str] = {}
        truncated = False
        found: set[str] = set()
        for node in q.nodes:
            seen: set[str] = set()  # a scan may return a key twice
            try:  # a node of several servers (a cluster's shard masters): each one's keys
                shards = node.members()
            except Exception as exc:  # noqa: BLE001 - whatever the kind's error, the node failed
                errors[node.name] = error_text(exc)
                continue
            for shard in shards:
                cursor = "0"
                while len(seen) < limit:
                    page = q.run(Scan(cursor, match, count), [shard], kind=None)[0]
                    if isinstance(page, Exception):
                        errors[node.name] = error_text(page)
                        break
                    cursor = page.cursor
                    seen.update(page.keys)
                    if int(cursor) == 0:
                        break
                else:
                    truncated = True
            found |= seen
        names = [key[len(base) :] for key in sorted(found)[:limit]]
        return ScanResult(names, errors, truncated or len(found) > limit)

    def reading_claim(self, key: str) -> Steps[ClaimView]:
        """Read the claim ``{prefix}:{key}`` (see :meth:`claim`) on every node, in one round.

        Returns the value a quorum of the nodes holds (or None), and the values
        that may hold a quorum once the nodes that did not answer are counted.
        """
        q = self.quorum
        replies = yield Get(self.keyspace.full(key))
        silent = sum(1 for r in replies if isinstance(r, Exception))
        votes = Counter(r.value for r in replies if isinstance(r, Value) and r.value is not None)
        for value, count in votes.items():
            if count >= q.needed:
                return ClaimView(value, frozenset((value,)))
        maybe = frozenset(value for value, count in votes.items() if count + silent >= q.needed)
        return ClaimView(None, maybe)

    def force_releasing(self, name: str) -> Steps[list[Deletion]]:
        """Delete the lock key of ``name`` on every node, whatever its holder.

        For an operator clearing a stuck lock: a holder still running finds
        its key gone at its next renewal. The fence key is kept, so the next
        token is still larger than the stuck holder's.
        """
        q = self.quorum
        key, _ = self.keyspace.keys(name)
        replies = yield Delete(key)
        return [
            Deletion(node.name, False, error_text(r))
            if isinstance(r, Exception)
            else Deletion(node.name, r == Count(1), None)
            for node, r in zip(q.nodes, replies)
        ]

    # The sync methods; an AsyncRedlock drives the same steps on its event loop.
    holder = driven(reading_holder)
    inspect = driven(inspecting)
    inspect_key = driven(inspecting_key)
    read_claim = driven(reading_claim)
    force_release = driven(force_releasing)

    def node_info(self) -> list[NodeInfo]:
        """Ask each node in turn how it is (its kind says what it reports:
        :func:`celery_redlock.core.nodes.redis.info.node_info`, ...); a node
        made of several servers (a Redis Cluster) gives one row per server.

        One node at a time, so a latency is that node's alone.
        """
        out: list[NodeInfo] = []
        for node in self.quorum.nodes:
            out += kinds.kind_of(node).node_info(node, self.quorum.gather)
        return out
