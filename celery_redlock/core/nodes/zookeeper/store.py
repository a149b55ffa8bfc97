"""The store verbs (:mod:`..virtual.store`) over kazoo: one znode per key.

A key is a child of the node's root znode (its name percent-encoded), its
data the entry as :func:`~..virtual.keyspace.encode` writes it; its version
for the shared layer is the znode's data version plus one (0: absent).
``read`` is the node's cache, as etcd's; ``commit`` is one ``multi``: per
key read, a ``check`` of its version (a key read as absent: a create and a
delete, which fail if it exists), or the write on that version (create, set,
delete), and last a set of the root's data, whose ``mtime`` is the ensemble's
clock at the commit. A failed ``multi`` wrote nothing; the keys read are read
again and the run goes again on them.

**Expiry is a deadline stored in the key, on the ensemble's clock.** No
session or ephemeral znode holds a lock: a key with a TTL stores when it
expires (``e``), stamped on the ensemble's clock as its leader gave it in the
last commit's ``mtime`` (plus the time since, on this process's monotonic
clock, plus that commit's round trip: never behind the ensemble's time), and
a key is taken as absent once this process's view of that clock (the same,
without the round trip: never ahead of it) has passed it. So a lock is free
within its TTL plus two round trips of the ensemble's time, whatever became
of its holder's process or session. What is left to assume: the ensemble's
members' wall clocks agree (the leader stamps ``mtime``; a leader change
reads another member's clock), and run at the rate of this process's
monotonic clock. An expired znode stays until it is written again or a scan
meets it (which deletes it on its version).
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Mapping, Sequence
from urllib.parse import quote, unquote_to_bytes

from .. import glob_regex
from ..virtual.keyspace import Entry, decode, encode
from ..virtual.store import Cache, Store, Version
from .node import NodeError, ZookeeperNode

__all__ = ["ZookeeperStore", "znode_name"]

#: The keys one commit may touch: a ``multi`` is one request, bounded by the
#: servers' ``jute.maxbuffer`` (1 MB by default).
MAX_KEYS = 1000


def znode_name(key: bytes) -> str:
    """``key`` as a znode's name: percent-encoded, never ``.`` or ``..``."""
    name = quote(key, safe=":@")
    return "%2E" + name[1:] if name.startswith(".") else name


def _key(name: str) -> bytes:
    return unquote_to_bytes(name)


class ZookeeperStore:
    """One ensemble's keys under its root znode: a cache, the clock, and its multis."""

    max_keys: int | None = MAX_KEYS

    def __init__(self, node: ZookeeperNode) -> None:
        self.node = node
        self.name = node.name
        self.cache = Cache()
        #: The last ensemble time seen (s, an mtime), when its reply came
        #: (monotonic s) and its round trip (s).
        self._mtime, self._at, self._rtt = 0.0, 0.0, 0.0
        self._clock_lock = threading.Lock()
        #: Commits that found a key changed since it was read, and ran again.
        self.conflicts = 0

    # -- the ensemble's clock -------------------------------------------------------------

    def clock(self) -> float:
        """The ensemble's time, never behind it (seconds): what a write stamps
        its deadline with, and what ``TIME`` (a fence's floor) reads."""
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

        client = self.node.client(deadline)
        sent = time.monotonic()
        try:
            stat = self.node.wait(client.set_async(self.node.root, b""), deadline)
        except NoNodeError:  # flushed away: made again
            self.node.wait(client.ensure_path_async(self.node.root), deadline)
            sent = time.monotonic()
            stat = self.node.wait(client.set_async(self.node.root, b""), deadline)
        self._learn_time(stat.mtime, sent)

    def expire(self, entry: Entry, deadline: float) -> None:
        """Nothing to put it on: the key's deadline, as the view stamped it on
        :meth:`clock`, is its expiry (marked, so a write that keeps the TTL keeps it)."""
        entry.lease = 1

    # -- reads and commits ----------------------------------------------------------------

    def _live(self, version: Version) -> Version:
        rev, entry = version
        if entry is not None and entry.px is not None:
            if (entry.expire or 0) <= self._past() * 1000:
                return rev, None  # expired on the ensemble's clock: absent, at its version
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
            path = self._path(key)
            entry = writes.get(key)
            if key not in writes:
                if rev:
                    txn.check(path, rev - 1)
                else:
                    txn.create(path, b"")
                    txn.delete(path)
                continue
            if entry is None:
                if rev:
                    txn.delete(path, rev - 1)
                else:
                    txn.create(path, b"")
                    txn.delete(path)
                learned[key] = (0, None)
                continue
            stored = entry.copy()
            stored.lease = 1 if stored.px is not None else 0
            if rev:
                txn.set_data(path, encode(entry), rev - 1)
                learned[key] = (rev + 1, stored)
            else:
                txn.create(path, encode(entry))
                learned[key] = (1, stored)
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
        root = client.exists_async(self.node.root)  # gone (a flush)? sent beside the reads
        fresh = self._fetch(list(reads), deadline)
        if self.node.wait(root, deadline) is None:
            self.node.wait(client.ensure_path_async(self.node.root), deadline)
        self.cache.learn(fresh)
        return {key: self._live(v) for key, v in fresh.items()}

    def _fetch(self, keys: Sequence[bytes], deadline: float) -> dict[bytes, Version]:
        """The keys as the ensemble has them now."""
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
            out[key] = (stat.version + 1, _decode(self.node, key, data))
        return out

    def scan(
        self, pattern: str, cursor: int, count: int, deadline: float
    ) -> tuple[int, list[bytes]]:
        """``count`` keys from the cursor's name on (in name order), the live ones
        matching ``pattern``; an expired key met is deleted (on its version). The
        cursor is the name to go on from, as a number (0: from the start), so keys
        deleted or added meanwhile move no other key out of the scan."""
        from kazoo.exceptions import NoNodeError

        client = self.node.client(deadline)
        try:
            names = sorted(self.node.wait(client.get_children_async(self.node.root), deadline))
        except NoNodeError:
            return 0, []  # no root: no key yet
        start = cursor.to_bytes((cursor.bit_length() + 7) // 8, "big")[1:].decode()
        names = [n for n in names if n >= start]
        page = [_key(n) for n in names[:count]]
        after = names[count:]
        following = int.from_bytes(b"\x01" + after[0].encode(), "big") if after else 0
        match = re.compile(glob_regex(pattern), re.DOTALL)
        wanted = [k for k in page if match.fullmatch(k.decode(errors="replace"))]
        out = []
        for key, (rev, entry) in self._fetch(wanted, deadline).items():
            if rev and self._live((rev, entry))[1] is None:
                client.delete_async(self._path(key), rev - 1)  # garbage; a race just fails
            elif rev:
                out.append(key)
        return following, out

    def ping(self, deadline: float) -> None:
        client = self.node.client(deadline)
        self.node.wait(client.exists_async(self.node.root), deadline)


def _refusal(node: ZookeeperNode, failed: list[Exception]) -> None:
    """Raise a failed multi's error unless it is a stale version (a conflict)."""
    from kazoo import exceptions as ke

    stale = (
        ke.BadVersionError, ke.NodeExistsError, ke.NoNodeError, ke.RolledBackError,
        ke.RuntimeInconsistency,
    )  # fmt: skip
    for exc in failed:
        if not isinstance(exc, stale):
            if isinstance(exc, ke.NoAuthError):
                raise NodeError(f"{node.name}: not allowed (the keys' ACL)", node.name, heals=False)
            raise NodeError(f"{node.name}: {type(exc).__name__} {exc}")


def _decode(node: ZookeeperNode, key: bytes, data: bytes) -> Entry:
    try:
        entry = decode(data, 0)
    except (ValueError, KeyError):
        raise NodeError(f"{node.name}: {key!r} is not a lock key (foreign data)") from None
    entry.lease = 1 if entry.px is not None else 0
    return entry


def _verbs(store: ZookeeperStore) -> Store:
    return store  # mypy checks here that a ZookeeperStore has the store verbs
