"""One SCAN page per node per key family, and typed reads of keys that are not strings.

``Redlock.scan`` walks a node's key space to the end (or to ``limit``) in one
call; a page that refreshes itself every second must never do that on a large
key space. :class:`Pager` sends exactly one ``SCAN cursor MATCH ... COUNT n``
per node per family and hands back the cursors to continue from, so a
refresh costs one page whatever the size of the key space.

A cursor over N nodes travels as one string, the nodes' cursors joined by
``,``; ``-`` marks a node whose pass has ended. ``"0,0,0"`` (or the empty
string) starts a pass; a pass has ended when every node's cursor is ``-``.
A node that is a Redis Cluster sends one SCAN to each of its shard masters:
its cursor is theirs joined by ``.`` (``"2048.-.96"``).

The reads go through redis-py's public client on each node's own connection
pool (the fail-fast pool ``Redlock`` built: its timeouts, no retries).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import redis
from redis.exceptions import RedisError

from .._format import glob_escape
from ..core import Redlock

__all__ = ["Page", "Pager", "RawKey", "END"]

#: A node's cursor once its pass has ended.
END = "-"
#: Fields of a hash (or members of a sorted set) shown per key, at most.
FIELDS_SHOWN = 20


class Page(NamedTuple):
    """One SCAN page of a family: the names after ``{prefix}:{kind}:``, on any node."""

    names: list[str]
    #: The cursor this page was read from.
    cursor: str
    #: The cursor of the next page, or None when every node's pass has ended.
    next: str | None
    #: Node name -> error of the nodes that failed (skipped or failed now).
    errors: dict[str, str]


class RawKey(NamedTuple):
    """One node's copy of a key of any type."""

    node: str
    type: str = "none"
    pttl_ms: int = -2
    #: A string's value, a hash's fields, a sorted set's (member, score) pairs.
    value: Any = None
    error: str | None = None


def _text(value: Any) -> Any:
    return value.decode("utf-8", "backslashreplace") if isinstance(value, bytes) else value


class Pager:
    """SCAN pages and typed reads on the nodes of one :class:`Redlock`."""

    def __init__(self, client: Redlock, count: int = 1000):
        self.client = client
        self.count = count
        self._conns: dict[int, redis.Redis] = {}
        #: SCAN calls sent, per node name (read by tests and the ``/api/state`` timing).
        self.scan_calls = 0

    def _conn(self, node: Any) -> redis.Redis:
        """redis-py's client on the pool of ``node`` (a master, or a cluster's shard master)."""
        conn = self._conns.get(id(node))
        if conn is None:
            conn = self._conns[id(node)] = redis.Redis(connection_pool=node.pool)
        return conn

    def split(self, cursor: str | None) -> list[str]:
        """The per-node cursors of ``cursor`` (a fresh pass for a cursor that does not fit)."""
        parts = (cursor or "").split(",")
        ok = len(parts) == len(self.client.nodes) and all(
            all(c == END or c.isdigit() for c in p.split(".")) for p in parts
        )
        return parts if ok else ["0"] * len(self.client.nodes)

    def _scan(self, node: Any, at: str, match: str) -> tuple[str, list[Any]]:
        """One SCAN page of ``node`` from its cursor ``at`` (one per shard master
        of a cluster): the next cursor and the keys."""
        if not node.cluster:
            self.scan_calls += 1
            after, keys = self._conn(node).scan(int(at), match=match, count=self.count)
            return (END if int(after) == 0 else str(after)), keys
        shards = node.masters()
        parts = at.split(".")
        if len(parts) != len(shards):  # a fresh pass (or the map changed since)
            parts = ["0"] * len(shards)
        nexts: list[str] = []
        found: list[Any] = []
        count = max(1, self.count // len(shards))  # a page about as large as a master's
        for shard, part in zip(shards, parts):
            if part == END:
                nexts.append(END)
                continue
            self.scan_calls += 1
            after, keys = self._conn(shard).scan(int(part), match=match, count=count)
            found += keys
            nexts.append(END if int(after) == 0 else str(after))
        return (END if all(n == END for n in nexts) else ".".join(nexts)), found

    def page(
        self, kind: str, tail: str, cursor: str | None, skip: dict[str, str] | None = None
    ) -> Page:
        """One ``SCAN`` per node (that has not ended its pass and is not in ``skip``)."""
        skip = dict(skip or {})
        base = f"{self.client.key_prefix}:{kind}:"
        match = glob_escape(base) + tail
        cursors = self.split(cursor)
        nexts: list[str] = []
        found: set[str] = set()
        for node, at in zip(self.client.nodes, cursors):
            if at == END or node.name in skip:
                nexts.append(at)
                continue
            try:
                after, keys = self._scan(node, at, match)
            except (RedisError, OSError) as exc:
                skip[node.name] = str(exc) or type(exc).__name__
                nexts.append(at)  # read again from here once the node is back
                continue
            found.update(_text(k)[len(base) :] for k in keys)
            nexts.append(after)
        live = [n for node, n in zip(self.client.nodes, nexts) if node.name not in skip]
        ended = all(n == END for n in live)
        errors = {n.name: skip[n.name] for n in self.client.nodes if n.name in skip}
        return Page(sorted(found), ",".join(cursors), None if ended else ",".join(nexts), errors)

    def read(self, keys: Sequence[str], skip: dict[str, str] | None = None) -> list[list[RawKey]]:
        """Per key, each node's copy (type, PTTL, value), two pipelined round trips per node."""
        skip = skip or {}
        out: list[list[RawKey]] = [[] for _ in keys]
        for node in self.client.nodes:
            if node.name in skip:
                for views in out:
                    views.append(RawKey(node.name, error=skip[node.name]))
                continue
            try:
                # a cluster: each key read on its shard master, the views kept in key order
                shards = _servers(node, keys)
                mine: dict[int, RawKey] = {}
                for shard in {id(s): s for s in shards}.values():
                    at = [j for j, s in enumerate(shards) if s is shard]
                    for j, view in zip(at, self._read(node.name, shard, [keys[j] for j in at])):
                        mine[j] = view
            except (RedisError, OSError) as exc:
                for views in out:
                    views.append(RawKey(node.name, error=str(exc) or type(exc).__name__))
                continue
            for j, views in enumerate(out):
                views.append(mine[j])
        return out

    def _read(self, name: str, server: Any, keys: Sequence[str]) -> list[RawKey]:
        """Type, PTTL and value of ``keys`` on one server, two pipelined round trips."""
        conn = self._conn(server)
        head = conn.pipeline(transaction=False)
        for key in keys:
            head.type(key)
            head.pttl(key)
        replies = head.execute()
        types = [_text(t) for t in replies[0::2]]
        body = conn.pipeline(transaction=False)
        for key, kind in zip(keys, types):
            if kind == "string":
                body.get(key)
            elif kind == "hash":
                body.hscan(key, 0, count=FIELDS_SHOWN)
            elif kind == "zset":
                body.zrange(key, 0, FIELDS_SHOWN - 1, withscores=True)
            else:
                body.echo(b"")
        values = body.execute()
        return [
            RawKey(name, kind, int(pttl), _value(kind, value))
            for kind, pttl, value in zip(types, replies[1::2], values)
        ]


def _servers(node: Any, keys: Sequence[str]) -> list[Any]:
    """The server of each key: the node, or the shard master of the key's slot."""
    return [node.slot_master(key) for key in keys] if node.cluster else [node] * len(keys)


def _value(kind: str, reply: Any) -> Any:
    if kind == "string":
        return _text(reply)
    if kind == "hash":
        return {_text(k): _text(v) for k, v in reply[1].items()}
    if kind == "zset":
        return [[_text(member), score] for member, score in reply]
    return None
