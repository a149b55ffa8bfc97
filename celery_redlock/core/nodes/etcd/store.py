"""An operation on an etcd node: read, run, and write back in one compare-on-revision Txn.

etcd cannot run an operation's logic inside a transaction, so a call runs it
here on the keys as this process last saw them (a per-node cache of key ->
(mod revision, value); a key not seen is taken as absent) and sends one Txn:
*if* every key the run read is still at the revision it was read at, *then*
the run's writes, *else* a read of those keys. A Txn that took its writes is
the operation, done atomically (its reply stands); one that did not brings
the keys' current values, and the run goes again on them, until the call's
deadline. A conflict is never an answer ("held"): it is a retry; a call whose
deadline passes is "not answering", as on every kind. In the common case (the
process saw the keys last, or they are absent) an operation is one request.

A key with a TTL goes onto a lease from :class:`Leases`: one lease per whole
number of seconds, granted with one second more than that and used for one
second after it was asked for, so a key outlives its TTL by up to a second (plus
the lease rounding up to whole seconds, and a leader change's reset: see the
etcd page of the docs), never less.
"""

from __future__ import annotations

import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from .keyspace import Entry, ScriptError, View, decode, encode
from .node import EtcdNode, NodeError, b64, unb64

__all__ = ["Leases", "Store", "execute"]

#: Keys (of all names) whose revision and value a node's cache keeps.
CACHE_KEYS = 20_000
#: etcd's default limit on the operations of one Txn branch (``--max-txn-ops``).
MAX_TXN_OPS = 128


class Leases:
    """Leases by whole seconds of TTL, each shared by the keys written within a
    second of asking for it (``grant`` is sent after the time it is stamped with)."""

    def __init__(self) -> None:
        self._by_ttl: dict[int, tuple[int, float]] = {}
        self._lock = threading.Lock()

    def lease(self, node: EtcdNode, seconds: int, deadline: float) -> int:
        now = time.monotonic()
        with self._lock:
            held = self._by_ttl.get(seconds)
            if held is not None and now - held[1] < 1.0:
                return held[0]
        asked = time.monotonic()
        got = node.post("lease/grant", {"TTL": seconds + 1}, deadline)
        if got.get("error"):
            raise NodeError(f"{node.name}: lease grant refused: {got['error']}")
        lease = int(got["ID"])
        with self._lock:
            self._by_ttl[seconds] = (lease, asked)
        return lease

    def forget(self) -> None:
        with self._lock:
            self._by_ttl.clear()


class Store:
    """One node's cache of keys (revision and value) and its leases."""

    def __init__(self) -> None:
        self.cache: OrderedDict[bytes, tuple[int, Entry | None]] = OrderedDict()
        self.lock = threading.Lock()
        self.leases = Leases()
        #: Txns that found a key changed since it was read, and ran again.
        self.conflicts = 0

    def seen(self, key: bytes) -> tuple[int, Entry | None]:
        with self.lock:
            got = self.cache.get(key)
            if got is not None:
                self.cache.move_to_end(key)
                return got
        return 0, None

    def learn(self, key: bytes, rev: int, entry: Entry | None) -> None:
        with self.lock:
            self.cache[key] = (rev, entry)
            self.cache.move_to_end(key)
            while len(self.cache) > CACHE_KEYS:
                self.cache.popitem(last=False)


def _store(node: EtcdNode) -> Store:
    store = getattr(node, "store", None)
    if store is None:
        store = node.store = Store()  # type: ignore[attr-defined]
    return store


def _kv(node: EtcdNode, kv: dict) -> tuple[bytes, int, Entry | None]:
    key = unb64(kv["key"])[len(node.prefix) :]
    return (
        key,
        int(kv.get("mod_revision", 0)),
        decode(unb64(kv.get("value")), int(kv.get("lease", 0))),
    )


def execute(node: EtcdNode, keys: list[bytes], body: Callable[[View], Any], deadline: float) -> Any:
    """Run ``body`` on a view of ``keys`` (and whatever else it reads) atomically on
    ``node``: its reply, or its :class:`ScriptError`, once its writes stood.

    Raises:
        TimeoutError: the deadline passed first. NodeError: the node refused.
    """
    store = _store(node)
    revs: dict[bytes, int] = {}
    base: dict[bytes, Entry | None] = {}

    def missing(key: bytes) -> Entry | None:
        revs[key], entry = store.seen(key)
        return entry

    for key in keys:
        base[key] = missing(key)
    while True:
        view = View(base, missing)
        try:
            reply: Any = body(view)
            changed = view.changed()
        except ScriptError as exc:
            reply, changed = exc, {}
        txn = _txn(node, store, view, revs, changed, deadline)
        try:
            got = node.post("kv/txn", txn, deadline)
        except NodeError as exc:
            if "lease not found" not in str(exc):
                raise
            store.leases.forget()  # revoked (a flush): a new one, then once more
            got = node.post("kv/txn", _txn(node, store, view, revs, changed, deadline), deadline)
        if got.get("succeeded"):
            rev = int(got["header"]["revision"])
            for key, entry in changed.items():
                store.learn(key, rev if entry is not None else 0, entry)
            if isinstance(reply, ScriptError):
                raise reply
            return reply
        store.conflicts += 1
        fresh: dict[bytes, tuple[int, Entry | None]] = {k: (0, None) for k in view.base}
        for response in got.get("responses", []):
            for kv in response.get("response_range", {}).get("kvs", []):
                key, rev, entry = _kv(node, kv)
                fresh[key] = (rev, entry)
        base, revs = {}, {}
        for key, (rev, entry) in fresh.items():
            store.learn(key, rev, entry)
            base[key], revs[key] = entry, rev
        if time.monotonic() >= deadline:
            raise TimeoutError(f"{node.name}: no reply in time (its keys kept changing)")


def _txn(
    node: EtcdNode,
    store: Store,
    view: View,
    revs: dict[bytes, int],
    changed: dict[bytes, Entry | None],
    deadline: float,
) -> dict:
    compare, success, failure = [], [], []
    for key in view.base:
        full = b64(node.prefix + key)
        compare.append(
            {"key": full, "target": "MOD", "result": "EQUAL", "mod_revision": str(revs.get(key, 0))}
        )
        failure.append({"request_range": {"key": full}})
    for key, entry in changed.items():
        full = b64(node.prefix + key)
        if entry is None:
            success.append({"request_delete_range": {"key": full}})
            continue
        put: dict[str, Any] = {"key": full, "value": b64(encode(entry))}
        if entry.px is not None:
            if not entry.lease:
                seconds = max(math.ceil(entry.px / 1000), node.min_ttl)
                entry.lease = store.leases.lease(node, seconds, deadline)
            put["lease"] = str(entry.lease)
        success.append({"request_put": put})
    if max(len(compare), len(success)) > MAX_TXN_OPS:
        raise NodeError(
            f"{node.name}: one call would touch {max(len(compare), len(success))} keys, "
            f"more than etcd's --max-txn-ops ({MAX_TXN_OPS})"
        )
    return {"compare": compare, "success": success, "failure": failure}
