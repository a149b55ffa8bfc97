"""One SCAN page per node per key family, and typed reads of keys that are not strings.

``Redlock.scan`` walks a node's key space to the end (or to ``limit``) in one
call; a page that refreshes itself every second must never do that on a large
key space. :class:`Pager` sends exactly one ``SCAN cursor MATCH ... COUNT n``
per node per family and hands back the cursors to continue from, so a
refresh costs one page whatever the size of the key space.

A cursor over N nodes travels as one string, the nodes' cursors joined by
``,``; ``-`` marks a node whose pass has ended. ``"0,0,0"`` (or the empty
string) starts a pass; a pass has ended when every node's cursor is ``-``.

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
        self.clients = [redis.Redis(connection_pool=node.pool) for node in client.nodes]
        #: SCAN calls sent, per node name (read by tests and the ``/api/state`` timing).
        self.scan_calls = 0

    def split(self, cursor: str | None) -> list[str]:
        """The per-node cursors of ``cursor`` (a fresh pass for a cursor that does not fit)."""
        parts = (cursor or "").split(",")
        ok = len(parts) == len(self.clients) and all(p == END or p.isdigit() for p in parts)
        return parts if ok else ["0"] * len(self.clients)

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
        for node, conn, at in zip(self.client.nodes, self.clients, cursors):
            if at == END or node.name in skip:
                nexts.append(at)
                continue
            self.scan_calls += 1
            try:
                after, keys = conn.scan(int(at), match=match, count=self.count)
            except (RedisError, OSError) as exc:
                skip[node.name] = str(exc) or type(exc).__name__
                nexts.append(at)  # read again from here once the node is back
                continue
            found.update(_text(k)[len(base) :] for k in keys)
            nexts.append(END if int(after) == 0 else str(after))
        live = [n for node, n in zip(self.client.nodes, nexts) if node.name not in skip]
        ended = all(n == END for n in live)
        errors = {n.name: skip[n.name] for n in self.client.nodes if n.name in skip}
        return Page(sorted(found), ",".join(cursors), None if ended else ",".join(nexts), errors)

    def read(self, keys: Sequence[str], skip: dict[str, str] | None = None) -> list[list[RawKey]]:
        """Per key, each node's copy (type, PTTL, value), two pipelined round trips per node."""
        skip = skip or {}
        out: list[list[RawKey]] = [[] for _ in keys]
        for node, conn in zip(self.client.nodes, self.clients):
            if node.name in skip:
                for views in out:
                    views.append(RawKey(node.name, error=skip[node.name]))
                continue
            try:
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
            except (RedisError, OSError) as exc:
                for views in out:
                    views.append(RawKey(node.name, error=str(exc) or type(exc).__name__))
                continue
            for views, kind, pttl, value in zip(out, types, replies[1::2], values):
                views.append(RawKey(node.name, kind, int(pttl), _value(kind, value)))
        return out


def _value(kind: str, reply: Any) -> Any:
    if kind == "string":
        return _text(reply)
    if kind == "hash":
        return {_text(k): _text(v) for k, v in reply[1].items()}
    if kind == "zset":
        return [[_text(member), score] for member, score in reply]
    return None
