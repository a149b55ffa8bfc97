"""The few verbs a virtual kind provides, and an operation run atomically over them.

A store that cannot run an operation's logic where its keys are (etcd,
memory; ZooKeeper next) provides five verbs, as a kombu transport provides
``_get``/``_put``/``_purge`` under the virtual ``Channel``:

* ``read(keys)``: each key's version and entry, as far as the store knows
  them without a round trip if it can (a version of 0: absent);
* ``commit(reads, writes)``: *if* every key read is still at its version,
  *then* the writes, atomically (None: done), *else* the current versions of
  the keys read (stale);
* ``expire(entry)``: put an entry with a TTL on the store's expiry primitive
  before it is committed (etcd: a lease), so that the store, never a
  client's clock, decides when the key is gone;
* ``scan(pattern, cursor, count)``: one page of key names;
* ``clock()``: the node's time, what ``TIME`` and ``PTTL`` read;

plus ``ping`` and ``max_keys`` (the keys one commit may touch; None: any).

:func:`execute` runs an operation on a :class:`~.keyspace.View` of the keys
read, and commits what it wrote on a compare of what it read; a stale commit
brings the keys' current versions and the run goes again on them, until the
call's deadline. A conflict is never an answer ("held"): it is a retry; a call
whose deadline passes is "not answering", as on every kind.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from .keyspace import Entry, ScriptError, View

__all__ = ["Cache", "Store", "Version", "cursor_after", "cursor_start", "execute", "expired"]

#: A key's version (0: absent) and entry (None: absent).
Version = tuple[int, "Entry | None"]


class Store(Protocol):
    """The verbs of a virtual kind's store (see the module's docstring)."""

    name: str
    max_keys: int | None

    def read(self, keys: Sequence[bytes], deadline: float) -> dict[bytes, Version]: ...

    def commit(
        self, reads: Mapping[bytes, int], writes: Mapping[bytes, Entry | None], deadline: float
    ) -> Mapping[bytes, Version] | None: ...

    def expire(self, entry: Entry, deadline: float) -> None: ...

    def scan(
        self, pattern: str, cursor: int, count: int, deadline: float
    ) -> tuple[int, list[bytes]]: ...

    def clock(self) -> float: ...

    def ping(self, deadline: float) -> None: ...


class Cache:
    """The versions a store last saw of its most recent ``size`` keys: its
    ``read`` with no round trip (a key not seen is taken as absent; a commit
    on a stale version brings the current one)."""

    def __init__(self, size: int = 20_000) -> None:
        self.size = size
        self.keys: OrderedDict[bytes, Version] = OrderedDict()
        self.lock = threading.Lock()

    def read(self, keys: Sequence[bytes]) -> dict[bytes, Version]:
        out: dict[bytes, Version] = {}
        with self.lock:
            for key in keys:
                got = self.keys.get(key)
                if got is not None:
                    self.keys.move_to_end(key)
                out[key] = got or (0, None)
        return out

    def learn(self, versions: Mapping[bytes, Version]) -> None:
        with self.lock:
            for key, version in versions.items():
                self.keys[key] = version
                self.keys.move_to_end(key)
            while len(self.keys) > self.size:
                self.keys.popitem(last=False)


def execute(
    store: Store, keys: Sequence[bytes], body: Callable[[View], Any], deadline: float
) -> Any:
    """Run ``body`` on a view of ``keys`` (and whatever else it reads) atomically on
    ``store``: its reply, or its :class:`ScriptError`, once its writes stood.

    Raises:
        TimeoutError: the deadline passed first (or the store did not answer).
        ConnectionError: the store refused.
    """
    versions = store.read(keys, deadline)
    revs: dict[bytes, int] = {}

    def missing(key: bytes) -> Entry | None:
        revs[key], entry = store.read([key], deadline)[key]
        return entry

    while True:
        revs.clear()
        revs.update((key, rev) for key, (rev, _) in versions.items())
        base = {key: entry for key, (_, entry) in versions.items()}
        view = View(base, missing, store.clock())
        try:
            reply: Any = body(view)
            changed = view.changed()
        except ScriptError as exc:
            reply, changed = exc, {}
        touched = max(len(view.base), len(changed))
        if store.max_keys is not None and touched > store.max_keys:
            raise ConnectionError(
                f"{store.name}: one call would touch {touched} keys, more than the "
                f"{store.max_keys} one commit may"
            )
        for entry in changed.values():
            if entry is not None and entry.px is not None and not entry.lease:
                store.expire(entry, deadline)
        stale = store.commit({key: revs.get(key, 0) for key in view.base}, changed, deadline)
        if stale is None:
            if isinstance(reply, ScriptError):
                raise reply
            return reply
        versions = dict(stale)
        if time.monotonic() >= deadline:
            raise TimeoutError(f"{store.name}: no reply in time (its keys kept changing)")


def cursor_start(cursor: int) -> bytes:
    """The key name a ``SCAN`` cursor of :func:`cursor_after` goes on from (0: the start)."""
    return cursor.to_bytes((cursor.bit_length() + 7) // 8, "big")[1:]


def cursor_after(name: bytes) -> int:
    """A ``SCAN`` cursor that goes on from ``name``: a number, as Redis's cursors
    are (``0x01`` before the bytes keeps their leading zero bytes; never 0)."""
    return int.from_bytes(b"\x01" + name, "big")


def expired(entry: Entry | None, now_ms: float) -> bool:
    """Whether ``entry`` has a TTL whose deadline ``now_ms`` has reached."""
    return entry is not None and entry.px is not None and (entry.expire or 0) <= now_ms
