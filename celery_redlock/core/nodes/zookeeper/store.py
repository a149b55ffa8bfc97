"""One ensemble's session in this process and the store verbs (:mod:`..virtual.store`)
over it: a key is a znode under the node's root, its version the znode's data
version plus one (0: absent), its expiry a deadline on the ensemble's clock."""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import quote, unquote_to_bytes

from ...exceptions import NodeError as _NodeError
from ..guard import Breaker
from ..util import matching
from ..virtual.keyspace import Entry, decode, encode
from ..virtual.store import Cache, Store, Version, cursor_after, cursor_start, expired

__all__ = ["NodeError", "ZookeeperStore", "znode_name"]


class NodeError(_NodeError):
    """A ZooKeeper node's error (refused, misconfigured, an error reply), naming the node."""


def znode_name(key: bytes) -> str:
    """``key`` as a znode's name: percent-encoded, never ``.`` or ``..``."""
    name = quote(key, safe=":@")
    return "%2E" + name[1:] if name.startswith(".") else name


def _loop_ended(client: Any) -> bool:
    """kazoo's connection thread ended unasked: it does for good on a reply of an
    unexpected xid (one lost on the way), and the client never connects again."""
    routine = client._connection._connection_routine
    return routine is not None and not routine.is_alive() and not client._stopped.is_set()


class ZookeeperStore(Store):
    """One ensemble's kazoo session in this process, its keys' cache, clock and turn: a
    process's calls to it go one at a time (a conflict on a commit costs two round trips)."""

    #: The keys one commit may touch (a multi is one request, under ``jute.maxbuffer``).
    max_keys: int | None = 1000

    def __init__(self, node: Any) -> None:  # the first ZookeeperNode of the ensemble
        self.node, self.name, self.root, self.cache = node, node.name, node.root, Cache()
        self.session: Any = None  # kazoo's client, started at the first call
        self.breaker, self.lock, self.turn = Breaker(), threading.Lock(), threading.Lock()
        # the last mtime seen (s), when its reply came (monotonic s), its round trip
        self._mtime, self._at, self._rtt, self._clock_lock = 0.0, 0.0, 0.0, threading.Lock()
        self.conflicts = 0  # commits that found a key changed, and ran again

    def client(self, deadline: float, node: Any = None) -> Any:
        """The connected client, a new session getting ``node``'s connect budget
        (TimeoutError: none in time, or the node is skipped for a while)."""
        node = node or self.node
        self.breaker.check(node.name)
        with self.lock:
            if self.session is None or _loop_ended(self.session):  # a dead one: socket closed
                self.session = node.new_client()
                self.session.start_async()
            client = self.session
        until = time.monotonic() + min(deadline - time.monotonic(), node.connect_timeout or 1e9)
        while not client.connected:
            if time.monotonic() >= until:
                self.breaker.timed_out(node.connect_timeout or node.timeout)
                raise TimeoutError(f"{node.name}: no session in time ({client.state})")
            time.sleep(0.005)
        return client

    def wait(self, result: Any, deadline: float) -> Any:
        """kazoo's async ``result`` by ``deadline`` (TimeoutError: no reply in time;
        NodeError: the ensemble refused; kazoo's NoNodeError: the znode is absent)."""
        from kazoo import exceptions as ke
        from kazoo.handlers.threading import KazooTimeoutError

        try:
            reply = result.get(timeout=max(deadline - time.monotonic(), 0.001))
        except KazooTimeoutError:
            self.breaker.timed_out(self.node.timeout)
            raise TimeoutError(f"{self.name}: no reply in time") from None
        except ke.NoNodeError:
            raise
        except ke.KazooException as exc:  # a session lost, or an error reply
            raise self._error(exc) from None
        self.breaker.answered()
        return reply

    def _error(self, exc: Exception) -> NodeError:
        """kazoo's error ``exc`` as the node's (refused for good where waiting won't cure it)."""
        from kazoo import exceptions as ke

        if isinstance(exc, ke.NoAuthError):
            why = "not allowed (the keys' ACL is another user's: user:password@ in the URL)"
            return NodeError(f"{self.name}: {why}", self.name, heals=False)
        if isinstance(exc, ke.AuthFailedError):
            return NodeError(f"{self.name}: authentication failed", self.name, heals=False)
        return NodeError(f"{self.name}: {type(exc).__name__} {exc}".rstrip())

    def clock(self) -> float:
        """The ensemble's time, never behind it, for deadlines and ``TIME``: stamped within
        the round trip, plus a millisecond (``mtime`` drops the stamp's microseconds)."""
        return self._past() + self._rtt + 0.001

    def _past(self) -> float:
        """The ensemble's time, never ahead of it: what expiry is judged by."""
        return self._mtime + (time.monotonic() - self._at)

    def _learn_time(self, mtime_ms: int, sent: float) -> None:
        got = time.monotonic()
        with self._clock_lock:
            if mtime_ms / 1000 >= self._past() or not self._at:
                self._mtime, self._at = mtime_ms / 1000, got
            self._rtt = got - sent

    def expire(self, entry: Entry, deadline: float) -> None:
        """The deadline stamped on :meth:`clock` is the expiry (kept by a write keeping it)."""
        entry.lease = 1

    def _live(self, version: Version) -> Version:
        """``version``, or absent at its version once expired on the ensemble's clock."""
        return (version[0], None) if expired(version[1], self._past() * 1000) else version

    def read(self, keys: Sequence[bytes], deadline: float) -> dict[bytes, Version]:
        while not self._at:  # the ensemble's time first: a commit of the root alone
            self.commit({}, {}, deadline)  # (again if the root was missing: now made)
        return {key: self._live(v) for key, v in self.cache.read(keys).items()}

    def _path(self, key: bytes) -> str:
        return f"{self.root}/{znode_name(key)}"

    def commit(
        self, reads: Mapping[bytes, int], writes: Mapping[bytes, Entry | None], deadline: float
    ) -> dict[bytes, Version] | None:
        """One multi: per key read, a ``check`` of its version or the write on it
        (a key read as absent: a create, and a delete where it is only read), and
        last a write of the root, whose ``mtime`` is the ensemble's clock."""
        client = self.client(deadline)
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
        txn.set_data(self.root, b"")
        sent = time.monotonic()
        results = self.wait(txn.commit_async(), deadline)
        failed = [r for r in results if isinstance(r, Exception)]
        if not failed:
            self._learn_time(results[-1].mtime, sent)
            self.cache.learn(learned)
            return None
        from kazoo import exceptions as ke

        stale = (ke.BadVersionError, ke.NodeExistsError, ke.NoNodeError, ke.RolledBackError,
                 ke.RuntimeInconsistency)  # fmt: skip
        refused = [exc for exc in failed if not isinstance(exc, stale)]
        if refused:  # not a conflict: the ensemble's own error
            raise self._error(refused[0])
        self.conflicts += 1
        root = client.exists_async(self.root)  # flushed away? asked beside the reads
        fresh = self._fetch(list(reads), deadline)
        if self.wait(root, deadline) is None:
            self.wait(client.ensure_path_async(self.root), deadline)
        self.cache.learn(fresh)
        return {key: self._live(v) for key, v in fresh.items()}

    def _fetch(self, keys: Sequence[bytes], deadline: float) -> dict[bytes, Version]:
        """The keys as the ensemble has them now (one round trip, pipelined)."""
        from kazoo.exceptions import NoNodeError

        client = self.client(deadline)
        pending = [(key, client.get_async(self._path(key))) for key in keys]
        out: dict[bytes, Version] = {}
        for key, result in pending:
            try:
                data, stat = self.wait(result, deadline)
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
        """The live keys matching ``pattern`` of ``count`` from the cursor's name on (a key
        deleted meanwhile moves no other out of the scan); an expired key met is deleted."""
        from kazoo.exceptions import NoNodeError

        client = self.client(deadline)
        try:
            names = sorted(self.wait(client.get_children_async(self.root), deadline))
        except NoNodeError:
            return 0, []
        start = cursor_start(cursor).decode()
        names = [n for n in names if n >= start]
        following = cursor_after(names[count].encode()) if len(names) > count else 0
        wanted = matching(pattern, [unquote_to_bytes(n) for n in names[:count]])
        out = []
        for key, (rev, entry) in self._fetch(wanted, deadline).items():
            if rev and self._live((rev, entry))[1] is None:
                client.delete_async(self._path(key), rev - 1)  # a race just fails
            elif rev:
                out.append(key)
        return following, out

    def ping(self, deadline: float) -> None:
        self.wait(self.client(deadline).exists_async(self.root), deadline)
