"""The in-memory kind of lock node: ``memory://NAME``, for tests and examples.

A memory node keeps its keys in this process: every node of one name (in any
``Redlock`` of the process) shares one store, as clients of one server do, and
nothing outlives the process. It is a virtual kind (:mod:`..virtual`): the
store verbs over a dict and a lock, a key's expiry on the node's own clock.

For tests, each store has fault hooks (:class:`Faults`, through
:func:`store_of` or :class:`celery_redlock.testing.memory.MemoryNodes`): down
(a call fails at once, as on a refused connection), hung (a call waits for its
deadline), slow (each call waits some seconds first), reply lost (the
operation is done, its reply never comes) and a clock offset.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit

from ...exceptions import ConfigurationError
from ...records import NodeInfo
from ...values import error_text
from .. import ping_latency
from ..guard import PerProcess
from ..kind import Ask
from ..util import OneNode, matching, refuse_min_replicas
from ..virtual import Call
from ..virtual.keyspace import Entry
from ..virtual.kinds import NodeKind
from ..virtual.store import Store, Version, expired

__all__ = ["KIND", "Faults", "MemoryKind", "MemoryNode", "MemoryStore", "NodeError", "store_of"]


class NodeError(ConnectionError):
    """A memory node's error (down, or a command it does not answer), naming the node."""


class Faults:
    """What a memory node's calls meet (the test hooks; all off by default)."""

    def __init__(self) -> None:
        self.down = False
        self.hung = False
        self.slow = 0.0  # seconds each call waits before it runs
        self.lost = False  # the call is done, its reply is lost
        self.offset = 0.0  # seconds the node's clock is ahead
        self.resumed = threading.Event()
        self.resumed.set()

    def hang(self, hung: bool = True) -> None:
        self.hung = hung
        (self.resumed.clear if hung else self.resumed.set)()

    def clear(self) -> None:
        self.down = self.lost = False
        self.slow = self.offset = 0.0
        self.hang(False)

    @property
    def blocking(self) -> bool:
        """Whether a call may wait (a round then runs its nodes at once)."""
        return self.hung or self.lost or self.slow > 0


class MemoryStore:
    """One memory node's keys: key -> (version, entry), under one lock."""

    max_keys: int | None = None

    def __init__(self, name: str) -> None:
        self.name = name
        self.keys: dict[bytes, tuple[int, Entry]] = {}
        self.version = 0
        self.lock = threading.Lock()
        self.faults = Faults()

    def clock(self) -> float:
        return time.time() + self.faults.offset

    def _live(self, key: bytes, now_ms: float) -> Version:
        got = self.keys.get(key)
        if got is not None and expired(got[1], now_ms):
            del self.keys[key]  # expired on the node's clock
            return 0, None
        return got or (0, None)

    def read(self, keys: Sequence[bytes], deadline: float) -> dict[bytes, Version]:
        now_ms = self.clock() * 1000
        with self.lock:
            return {key: self._live(key, now_ms) for key in keys}

    def commit(
        self, reads: Mapping[bytes, int], writes: Mapping[bytes, Entry | None], deadline: float
    ) -> dict[bytes, Version] | None:
        now_ms = self.clock() * 1000
        with self.lock:
            now = {key: self._live(key, now_ms) for key in reads}
            if any(now[key][0] != rev for key, rev in reads.items()):
                return now
            self.version += 1
            for key, entry in writes.items():
                if entry is None:
                    self.keys.pop(key, None)
                else:
                    self.keys[key] = (self.version, entry.copy())
        return None

    def expire(self, entry: Entry, deadline: float) -> None:
        """Nothing to do: a read drops a key whose expiry passed on the node's clock."""

    def scan(
        self, pattern: str, cursor: int, count: int, deadline: float
    ) -> tuple[int, list[bytes]]:
        """``count`` keys from the ``cursor``-th (in key order), those matching ``pattern``."""
        now_ms = self.clock() * 1000
        with self.lock:
            names = sorted(k for k in list(self.keys) if self._live(k, now_ms)[1] is not None)
        following = cursor + count if cursor + count < len(names) else 0
        return following, matching(pattern, names[cursor : cursor + count])

    def ping(self, deadline: float) -> None:
        """Always answers (the faults are met before a call)."""

    def flush(self) -> None:
        with self.lock:
            self.keys.clear()


def _verbs(store: MemoryStore) -> Store:
    return store  # mypy checks here that a MemoryStore has the store verbs


def _new_locks(stores: dict[str, MemoryStore]) -> None:
    """A forked child keeps a copy of the keys, and new locks (a thread of the
    parent may have held one at the fork)."""
    for store in stores.values():
        store.lock = threading.Lock()


_stores: PerProcess[MemoryStore] = PerProcess(_new_locks)


def store_of(name: str) -> MemoryStore:
    """The store of the memory node ``name`` in this process (made at first use)."""
    return _stores.get(name, lambda: MemoryStore(name))


class MemoryNode(OneNode):
    """A handle on the memory node its URL names (``memory://NAME``)."""

    kind = "memory"

    def __init__(
        self, url: str, timeout: float, min_replicas: int = 0, connect_timeout: float | None = None
    ):
        parts = urlsplit(url)
        if not parts.netloc or parts.path.strip("/") or parts.query or parts.fragment:
            raise ConfigurationError(
                f"memory node URL {url!r} must be memory://NAME (a name, no path or options)"
            )
        refuse_min_replicas(f"memory node {url}", min_replicas, "it has no replicas")
        self.name = url
        self.identity = ("memory", parts.netloc)
        self.timeout = timeout
        self.connect_timeout = connect_timeout
        self.store = store_of(parts.netloc)

    def close(self) -> None:
        """Nothing to close: the store stays for the other nodes of its name."""


class MemoryKind(NodeKind):
    """Memory nodes (see the module's docstring)."""

    schemes = ("memory",)
    node_class = MemoryNode
    # a call is a dict's read and write under a lock: Redis's defaults suit it
    node_timeout = 0.05
    connect_timeout = 1.0

    def inline(self, nodes: Sequence[Any]) -> bool:
        """One after another, unless a node's call may wait (a fault)."""
        return not any(node.store.faults.blocking for node in nodes)

    def on_node(self, node: Any, call: Call, deadline: float) -> Any:
        """The node's call, through its faults."""
        faults = node.store.faults
        if faults.down:
            raise NodeError("down (connection refused)")
        if faults.slow:
            time.sleep(max(min(faults.slow, deadline - time.monotonic()), 0))
        if not faults.resumed.wait(max(deadline - time.monotonic(), 0)) or (
            time.monotonic() >= deadline
        ):
            raise TimeoutError("no reply in time")
        reply = call(node, deadline)
        if faults.lost:
            time.sleep(max(deadline - time.monotonic(), 0))
            raise TimeoutError("no reply in time (the reply was lost)")
        return reply

    def node_info(self, node: MemoryNode, ask: Ask) -> list[NodeInfo]:
        """How ``node`` is: PING latency and how many keys it keeps."""
        latency, down = ping_latency(node, ask)
        if down is not None:
            return [NodeInfo(node.name, error_text(down), latency, kind="memory")]
        count = len(node.store.keys)
        return [
            NodeInfo(node.name, None, latency, f"memory, {count} keys", "primary", kind="memory")
        ]


#: The memory kind.
KIND = MemoryKind()
