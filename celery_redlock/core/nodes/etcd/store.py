"""The store verbs (:mod:`..virtual.store`) over etcd's HTTP gateway.

``read`` is the node's cache of key -> (mod revision, value): a key not seen
is taken as absent, so in the common case (this process saw the keys last, or
they are absent) an operation is one request. ``commit`` is one Txn: *if*
every key read is still at the revision it was read at, *then* the writes,
*else* a range read of those keys (stale: the run goes again on them).

``expire`` puts a key with a TTL on a lease from :class:`Leases`: one lease per
whole number of seconds, granted with one second more than that and used for
one second after it was asked for, so a key outlives its TTL by up to a second
(plus the lease rounding up to whole seconds, and a leader change's reset: see
the etcd page of the docs), never less. Whether a key is held is etcd's to say,
never a client clock's.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

from ..util import matching
from ..virtual.keyspace import Entry, decode, encode
from ..virtual.store import Cache, Store, Version, cursor_after, cursor_start
from .node import EtcdNode, NodeError, b64, unb64

__all__ = ["EtcdStore", "Leases"]

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


class EtcdStore:
    """One etcd node's keys under its prefix: a cache, its leases, and its Txns."""

    max_keys: int | None = MAX_TXN_OPS

    def __init__(self, node: EtcdNode) -> None:
        self.node = node
        self.name = node.name
        self.cache = Cache()
        self.leases = Leases()
        #: Txns that found a key changed since it was read, and ran again.
        self.conflicts = 0

    def read(self, keys: Sequence[bytes], deadline: float) -> dict[bytes, Version]:
        return self.cache.read(keys)

    def clock(self) -> float:
        return time.time()  # etcd serves no clock: the client's

    def ping(self, deadline: float) -> None:
        probe = {"key": b64(self.node.prefix), "limit": 1, "keys_only": True}
        self.node.post("kv/range", probe, deadline)

    def expire(self, entry: Entry, deadline: float) -> None:
        seconds = max(math.ceil((entry.px or 0) / 1000), self.node.min_ttl)
        entry.lease = self.leases.lease(self.node, seconds, deadline)

    def commit(
        self, reads: Mapping[bytes, int], writes: Mapping[bytes, Entry | None], deadline: float
    ) -> dict[bytes, Version] | None:
        try:
            got = self.node.post("kv/txn", self._txn(reads, writes), deadline)
        except NodeError as exc:
            if "lease not found" not in str(exc):
                raise
            self.leases.forget()  # revoked (a flush): a new one, then once more
            for entry in writes.values():
                if entry is not None and entry.px is not None:
                    self.expire(entry, deadline)
            got = self.node.post("kv/txn", self._txn(reads, writes), deadline)
        if got.get("succeeded"):
            rev = int(got["header"]["revision"])
            self.cache.learn({k: (rev if e is not None else 0, e) for k, e in writes.items()})
            return None
        self.conflicts += 1
        fresh: dict[bytes, Version] = {key: (0, None) for key in reads}
        for response in got.get("responses", []):
            for kv in response.get("response_range", {}).get("kvs", []):
                key = unb64(kv["key"])[len(self.node.prefix) :]
                entry = decode(unb64(kv.get("value")), int(kv.get("lease", 0)))
                fresh[key] = (int(kv.get("mod_revision", 0)), entry)
        self.cache.learn(fresh)
        return fresh

    def _txn(self, reads: Mapping[bytes, int], writes: Mapping[bytes, Entry | None]) -> dict:
        prefix = self.node.prefix
        compare, success, failure = [], [], []
        for key, rev in reads.items():
            full = b64(prefix + key)
            compare.append(
                {"key": full, "target": "MOD", "result": "EQUAL", "mod_revision": str(rev)}
            )
            failure.append({"request_range": {"key": full}})
        for key, entry in writes.items():
            full = b64(prefix + key)
            if entry is None:
                success.append({"request_delete_range": {"key": full}})
                continue
            put: dict[str, Any] = {"key": full, "value": b64(encode(entry))}
            if entry.px is not None:
                put["lease"] = str(entry.lease)
            success.append({"request_put": put})
        return {"compare": compare, "success": success, "failure": failure}

    def scan(
        self, pattern: str, cursor: int, count: int, deadline: float
    ) -> tuple[int, list[bytes]]:
        """One page of at most ``count`` keys matching ``pattern``: a range read from the
        cursor's key on, within the keys that start with the pattern's literal head, so
        a page costs its ``count`` keys, never the whole key space (a dashboard sends
        one page per family per refresh). The cursor is the key to go on from, after
        the head, as a number, as Redis's cursors are (0: from the start; ``0x01``
        before the bytes keeps their leading zero bytes)."""
        prefix = self.node.prefix
        head = prefix + _literal_head(pattern).encode()
        start = head + cursor_start(cursor)
        got = self.node.post(
            "kv/range",
            {"key": b64(start), "range_end": b64(_range_end(head)), "keys_only": True,
             "limit": count + 1},
            deadline,
        )  # fmt: skip
        keys = [unb64(kv["key"]) for kv in got.get("kvs", [])]
        page, after = keys[:count], keys[count:]
        following = cursor_after(after[0][len(head) :]) if after else 0
        return following, matching(pattern, [k[len(prefix) :] for k in page])


def _verbs(store: EtcdStore) -> Store:
    return store  # mypy checks here that an EtcdStore has the store verbs


def _range_end(prefix: bytes) -> bytes:
    """The end of the range of keys starting with ``prefix``."""
    end = bytearray(prefix)
    while end and end[-1] == 0xFF:
        end.pop()
    if not end:
        return b"\0"
    end[-1] += 1
    return bytes(end)


def _literal_head(pattern: str) -> str:
    """What every key ``pattern`` (a ``SCAN ... MATCH`` glob) matches starts with: the
    pattern up to its first wildcard, escapes undone."""
    head, i = [], 0
    while i < len(pattern) and pattern[i] not in "*?[":
        if pattern[i] == "\\" and i + 1 < len(pattern):
            i += 1
        head.append(pattern[i])
        i += 1
    return "".join(head)
