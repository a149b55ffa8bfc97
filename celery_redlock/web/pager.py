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

The reads are the core's typed ones (:func:`celery_redlock.core.read`), so they
work on a node of any kind, within the client's node timeout (a new
connection gets its connect timeout first); a key is read on every node at
once.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from .._format import glob_escape
from ..core import Get, ReadHash, ReadScores, ReadTtl, ReadType, Redlock, Scan, read

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


def _error(exc: BaseException) -> str:
    return str(exc) or type(exc).__name__


class Pager:
    """SCAN pages and typed reads on the nodes of one :class:`Redlock`."""

    def __init__(self, client: Redlock, count: int = 1000):
        self.client = client
        self.count = count
        #: SCAN calls sent, per node name (read by tests and the ``/api/state`` timing).
        self.scan_calls = 0

    def split(self, cursor: str | None) -> list[str]:
        """The per-node cursors of ``cursor`` (a fresh pass for a cursor that does not fit)."""
        parts = (cursor or "").split(",")
        ok = len(parts) == len(self.client.nodes) and all(
            all(c == END or c.isdigit() for c in p.split(".")) for p in parts
        )
        return parts if ok else ["0"] * len(self.client.nodes)

    def _scan(self, node: Any, at: str, match: str) -> tuple[str, list[Any]]:
        """One SCAN page of ``node`` from its cursor ``at`` (one per server of a node
        of several, a cluster's shard masters): the next cursor and the keys.

        Raises:
            NodeError: a server that did not answer (or any error listing its servers).
        """
        servers = node.members()
        parts = at.split(".")
        if len(parts) != len(servers):  # a fresh pass (or the map changed since)
            parts = ["0"] * len(servers)
        nexts: list[str] = []
        found: list[Any] = []
        count = max(1, self.count // len(servers))  # a page about as large as one server's
        for server, part in zip(servers, parts):
            if part == END:
                nexts.append(END)
                continue
            self.scan_calls += 1
            page = read(self.client, Scan(part, match, count), [server])[0]
            if isinstance(page, Exception):
                raise page
            found += page.keys
            nexts.append(END if int(page.cursor) == 0 else page.cursor)
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
            except Exception as exc:  # noqa: BLE001 - whatever the kind's error, the node failed
                skip[node.name] = _error(exc)
                nexts.append(at)  # read again from here once the node is back
                continue
            found.update(k[len(base) :] for k in keys)
            nexts.append(after)
        live = [n for node, n in zip(self.client.nodes, nexts) if node.name not in skip]
        ended = all(n == END for n in live)
        errors = {n.name: skip[n.name] for n in self.client.nodes if n.name in skip}
        return Page(sorted(found), ",".join(cursors), None if ended else ",".join(nexts), errors)

    def read(self, keys: Sequence[str], skip: dict[str, str] | None = None) -> list[list[RawKey]]:
        """Per key, each node's copy (type, PTTL, value): three rounds per key, every
        node (not in ``skip``) asked at once; a node that fails is not asked for the
        keys after, so a node lost mid-read costs one timeout, not one per key."""
        skip = dict(skip or {})
        out: list[list[RawKey]] = []
        for key in keys:
            nodes = [node for node in self.client.nodes if node.name not in skip]
            read = {view.node: view for view in self._read(key, nodes)}
            for name, view in read.items():
                if view.error is not None:  # failed now: not asked again for the next keys
                    skip[name] = view.error
            out.append(
                [read.get(node.name) or RawKey(node.name, error=skip[node.name])
                 for node in self.client.nodes]
            )  # fmt: skip
        return out

    def _read(self, key: str, nodes: Sequence[Any]) -> list[RawKey]:
        """Type, PTTL and value of ``key`` on ``nodes``."""
        types = read(self.client, ReadType(key), nodes)
        ttls = read(self.client, ReadTtl(key), nodes)
        views: list[RawKey | None] = [None] * len(nodes)
        wanted: dict[str, list[int]] = {}
        for i, (node, kind, ttl) in enumerate(zip(nodes, types, ttls)):
            failed = kind if isinstance(kind, Exception) else ttl
            if isinstance(failed, Exception):
                views[i] = RawKey(node.name, error=_error(failed))
            else:
                wanted.setdefault(kind.name, []).append(i)
        for kind, at in wanted.items():
            value_of = _VALUE_OF.get(kind)
            values = read(self.client, value_of[0](key), [nodes[i] for i in at]) if value_of else []
            for j, i in enumerate(at):
                value = values[j] if value_of else None
                if isinstance(value, Exception):
                    views[i] = RawKey(nodes[i].name, error=_error(value))
                else:
                    shown = value_of[1](value) if value_of else None
                    views[i] = RawKey(nodes[i].name, kind, ttls[i].pttl_ms, shown)
        return views  # type: ignore[return-value]


#: The read that gives a key's value, by its type, and the value as shown: a
#: string's text, a hash's first fields, a sorted set's first (member, score) pairs.
_VALUE_OF: dict[str, tuple[Callable[[str], Any], Callable[[Any], Any]]] = {
    "string": (Get, lambda got: got.value),
    "hash": (ReadHash, lambda got: dict(got.items[:FIELDS_SHOWN])),
    "zset": (ReadScores, lambda got: [list(pair) for pair in got.items[:FIELDS_SHOWN]]),
}
