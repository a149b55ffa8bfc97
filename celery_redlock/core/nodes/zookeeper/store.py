"""The store verbs (:mod:`..virtual.store`) over kazoo: one znode per key.

A key is a child of the node's root znode (its name percent-encoded), its data
the entry as :func:`~..virtual.keyspace.encode` writes it, its version the
znode's data version plus one (0: absent). ``read`` is the cache, as etcd's;
``commit`` is one ``multi``: per key read, a ``check`` of its version or the
write on it (a key read as absent: a create, and a delete where it is only
read), and last a write of the root, whose ``mtime`` is the ensemble's clock.

Expiry is a deadline in the key on the ensemble's clock, never a session: a
write stamps it on the clock's later end (the last commit's ``mtime``, plus the
time since on this process's monotonic clock, plus that commit's round trip),
and a key is taken as absent once the earlier end (without the round trip) has
passed it. So no key expires before its TTL, and a dead or paused holder's lock
is free within its TTL plus two round trips (the ZooKeeper page of the docs).
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import quote, unquote_to_bytes

from ...exceptions import NodeError as _NodeError
from .. import glob_regex
from ..virtual.keyspace import Entry, decode, encode
from ..virtual.store import Cache, Store, Version

__all__ = ["NodeError", "ZookeeperStore", "znode_name"]

#: The keys one commit may touch (a multi is one request, under ``jute.maxbuffer``).
MAX_KEYS = 1000


class NodeError(_NodeError):
    """A ZooKeeper node's error (refused, misconfigured, an error reply), naming the node."""


def znode_name(key: bytes) -> str:
    """``key`` as a znode's name: percent-encoded, never ``.`` or ``..``."""
    name = quote(key, safe=":@")
    return "%2E" + name[1:] if name.startswith(".") else name


class ZookeeperStore:
    """One ensemble's keys under its root znode: a cache, the clock, its multis."""

    max_keys: int | None = MAX_KEYS

    def __init__(self, node: Any) -> None:  # its ZookeeperNode
        self.node, self.name, self.cache = node, node.name, Cache()
        # the last mtime seen (s), when its reply came (monotonic s), its round trip
        self._mtime, self._at, self._rtt = 0.0, 0.0, 0.0
        self._clock_lock = threading.Lock()
        self.conflicts = 0  # commits that found a key changed, and ran again

    def clock(self) -> float:
        """The ensemble's time, never behind it: what a deadline and ``TIME`` take."""
        return self._past() + self._rtt

    def _past(self) -> float:
        """The ensemble's time, never ahead of it: what expiry is judged by."""
        return self._mtime + (time.monotonic() - self._at)

    def _learn_time(self, mtime_ms: int, sent: float) -> None:
        got = time.monotonic()
        with self._clock_lock:
            if mtime_ms / 1000 >= self._past() or not self._at:
                self._mtime, self._at = mtime_ms / 1000, got
            self._rtt = got - sent

    def _sync(self, deadline: float) -> None:
        from kazoo.exceptions import NoNodeError

        client, root = self.node.client(deadline), self.node.root
        sent = time.monotonic()
        try:
            stat = self.node.wait(client.set_async(root, b""), deadline)
        except NoNodeError:  # flushed away: made again
            self.node.wait(client.ensure_path_async(root), deadline)
            sent = time.monotonic()
            stat = self.node.wait(client.set_async(root, b""), deadline)
        self._learn_time(stat.mtime, sent)

    def expire(self, entry: Entry, deadline: float) -> None:
        """The deadline the view stamped on :meth:`clock` is the expiry; marked, so
        a write that keeps the TTL keeps it."""
        entry.lease = 1

    def _live(self, version: Version) -> Version:
        rev, entry = version
        if entry is not None and entry.px is not None:
            if (entry.expire or 0) <= self._past() * 1000:
                return rev, None  # expired: absent, at its version
        return rev, entry

    def read(self, keys: Sequence[bytes], deadline: float) -> dict[bytes, Version]:
        if not self._at:
            self._sync(deadline)
        return {key: self._live(v) for key, v in self.cache.read(keys).items()}

    def _path(self, key: bytes) -> str:
        return f"{self.node.root}/{znode_name(key)}"

    def commit(
        self, reads: Mapping[bytes, int], writes: Mapping[bytes, Entry | None], deadline: float
    ) -> dict[bytes, Version] | None:
        client = self.node.client(deadline)
        txn = client.transaction()
        learned: dict[bytes, Version] = {}
        for key, rev in reads.items():
            path, entry = self._path(key), writes.get(key)
            if entry is None:  # read only, or deleted
                if rev:
                    (txn.delete if key in writes else txn.check)(path, rev - 1)
                else:
                    txn.create(path, b"")
                    txn.delete(path)  # still absent: the create fails if it exists
                if key in writes:
                    learned[key] = (0, None)
                continue
            stored = entry.copy()
            stored.lease = int(stored.px is not None)
            if rev:
                txn.set_data(path, encode(entry), rev - 1)
            else:
                txn.create(path, encode(entry))
            learned[key] = (rev + 1, stored)
        txn.set_data(self.node.root, b"")
        sent = time.monotonic()
        results = self.node.wait(txn.commit_async(), deadline)
        failed = [r for r in results if isinstance(r, Exception)]
        if not failed:
            self._learn_time(results[-1].mtime, sent)
            self.cache.learn(learned)
            return None
        _refusal(self.node, failed)
        self.conflicts += 1
        root = client.exists_async(self.node.root)  # flushed away? asked beside the reads
        fresh = self._fetch(list(reads), deadline)
        if self.node.wait(root, deadline) is None:
            self.node.wait(client.ensure_path_async(self.node.root), deadline)
        self.cache.learn(fresh)
        return {key: self._live(v) for key, v in fresh.items()}

    def _fetch(self, keys: Sequence[bytes], deadline: float) -> dict[bytes, Version]:
        """The keys as the ensemble has them now (one round trip, pipelined)."""
        from kazoo.exceptions import NoNodeError

        client = self.node.client(deadline)
        pending = [(key, client.get_async(self._path(key))) for key in keys]
        out: dict[bytes, Version] = {}
        for key, result in pending:
            try:
                data, stat = self.node.wait(result, deadline)
            except NoNodeError:
                out[key] = (0, None)
                continue
            try:
                entry = decode(data, 0)
            except (ValueError, KeyError):
                raise NodeError(f"{self.name}: {key!r} is not a lock key") from None
            entry.lease = int(entry.px is not None)
            out[key] = (stat.version + 1, entry)
        return out

    def scan(
        self, pattern: str, cursor: int, count: int, deadline: float
    ) -> tuple[int, list[bytes]]:
        """``count`` keys from the cursor's name on (the name as a number, 0: from
        the start, so keys deleted meanwhile move no other out of the scan), the
        live ones matching ``pattern``; an expired key met is deleted."""
        from kazoo.exceptions import NoNodeError

        client = self.node.client(deadline)
        try:
            names = sorted(self.node.wait(client.get_children_async(self.node.root), deadline))
        except NoNodeError:
            return 0, []
        start = cursor.to_bytes((cursor.bit_length() + 7) // 8, "big")[1:].decode()
        names = [n for n in names if n >= start]
        after = names[count:]
        following = int.from_bytes(b"\x01" + after[0].encode(), "big") if after else 0
        match = re.compile(glob_regex(pattern), re.DOTALL)
        page = [unquote_to_bytes(n) for n in names[:count]]
        wanted = [k for k in page if match.fullmatch(k.decode(errors="replace"))]
        out = []
        for key, (rev, entry) in self._fetch(wanted, deadline).items():
            if rev and self._live((rev, entry))[1] is None:
                client.delete_async(self._path(key), rev - 1)  # a race just fails
            elif rev:
                out.append(key)
        return following, out

    def ping(self, deadline: float) -> None:
        self.node.wait(self.node.client(deadline).exists_async(self.node.root), deadline)


def _refusal(node: Any, failed: list[Exception]) -> None:
    """Raise a failed multi's error unless it is a conflict (a stale version)."""
    from kazoo import exceptions as ke

    stale = (ke.BadVersionError, ke.NodeExistsError, ke.NoNodeError, ke.RolledBackError,
             ke.RuntimeInconsistency)  # fmt: skip
    for exc in failed:
        if isinstance(exc, ke.NoAuthError):
            raise NodeError(f"{node.name}: not allowed (the keys' ACL)", node.name, heals=False)
        if not isinstance(exc, stale):
            raise NodeError(f"{node.name}: {type(exc).__name__} {exc}")


def _verbs(store: ZookeeperStore) -> Store:
    return store  # mypy checks here that a ZookeeperStore has the store verbs
