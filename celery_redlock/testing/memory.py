"""In-memory lock nodes for tests: ``memory://`` nodes with the verbs of the other fleets.

:class:`MemoryNodes` hands out N memory nodes (``.urls``) of this process, with
``kill(i)`` (down: calls are refused at once), ``pause(i)`` / ``resume(i)``
(hung: calls wait for their deadline), ``restart(i)`` (up again, empty),
``heal()``, ``keys()`` and ``flushall()``, as
:class:`~celery_redlock.testing.RedisNodes` has them; a node (``[i]``) also
has ``slow(seconds)``, ``lose_replies()`` and ``clock_offset(seconds)``, and
``client()``: its keys with the calls of a decoded redis-py client that
tests use. A memory node lives in the process that uses it: a Celery worker
in another process does not see it.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator
from typing import Any

# the one module of the package a test helper imports: a memory node's store
# lives in this process, and only its kind reaches it
from ..core.nodes.memory import KIND, MemoryStore, store_of
from .fleet import ServerFleet

__all__ = ["MemoryKeys", "MemoryNode", "MemoryNodes"]

_names = itertools.count()


def _text(value: Any) -> Any:
    return value.decode() if isinstance(value, bytes) else value


class MemoryKeys:
    """A memory node's keys with the calls of a decoded redis-py client that tests
    use (``get``, ``set``, ``pttl``, ``exists``, ``delete``, ``keys``,
    ``scan_iter``, ``zrange``, ``zcard``, ``time``, ``set_many``), sent as the
    kind's plain commands: a node down or hung fails them as it fails a client."""

    def __init__(self, name: str) -> None:
        self.node = KIND.make(f"memory://{name}", 5.0)

    def __enter__(self) -> MemoryKeys:
        return self

    def __exit__(self, *exc_info: object) -> None:
        pass

    def _cmd(self, *cmd: Any) -> Any:
        reply = KIND.command([self.node], cmd, self.node.timeout)[0]
        if isinstance(reply, Exception):
            raise reply
        return reply

    def get(self, key: str) -> str | None:
        return _text(self._cmd("GET", key))

    def pttl(self, key: str) -> int:
        return int(self._cmd("PTTL", key))

    def exists(self, *keys: str) -> int:
        return sum(self._cmd("TYPE", key) != b"none" for key in keys)

    def set(self, key: str, value: Any, px: int | None = None, nx: bool = False) -> bool | None:
        opts = ["NX"] * nx + (["PX", px] if px is not None else [])
        return True if self._cmd("SET", key, str(value), *opts) else None

    def set_many(self, values: dict[str, Any], px: int) -> None:
        for key, value in values.items():
            self.set(key, value, px=px)

    def delete(self, *keys: str) -> int:
        return int(self._cmd("DEL", *keys))

    def keys(self, pattern: str = "*") -> list[str]:
        store = self.node.store
        _, names = store.scan(pattern, 0, len(store.keys) + 1, 0.0)
        return sorted(n.decode() for n in names)

    def scan_iter(self, match: str = "*", count: int = 0) -> Iterator[str]:
        return iter(self.keys(match))

    def zrange(self, key: str, start: int, end: int) -> list[str]:
        pairs = self._cmd("ZRANGE", key, 0, -1, "WITHSCORES")
        members = [m.decode() for m in pairs[::2]]
        return members[start : None if end == -1 else end + 1]

    def zcard(self, key: str) -> int:
        return len(self.zrange(key, 0, -1))

    def time(self) -> tuple[int, int]:
        now = self.node.store.clock()
        return int(now), int((now % 1) * 1_000_000)


class MemoryNode:
    """One memory node (``memory://NAME``) and its fault hooks."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.url = f"memory://{name}"

    def __repr__(self) -> str:
        return f"<MemoryNode {self.url}>"

    @property
    def store(self) -> MemoryStore:
        return store_of(self.name)

    @property
    def is_running(self) -> bool:
        return not self.store.faults.down

    @property
    def is_paused(self) -> bool:
        return self.store.faults.hung

    @property
    def connected(self) -> bool:
        """fakeredis's switch: False is :meth:`kill` (its keys kept), True up again."""
        return self.is_running

    @connected.setter
    def connected(self, up: bool) -> None:
        self.store.faults.down = not up

    def client(self) -> MemoryKeys:
        return MemoryKeys(self.name)

    def kill(self) -> None:
        """Down: calls are refused at once (its keys are lost, as a server's without AOF)."""
        self.store.faults.down = True
        self.store.flush()

    def pause(self) -> None:
        """Hung: calls wait for their deadline, until :meth:`resume`."""
        self.store.faults.hang(True)

    def resume(self) -> None:
        self.store.faults.hang(False)

    def restart(self) -> None:
        """Up again, empty, its faults cleared."""
        self.store.flush()
        self.store.faults.clear()

    def slow(self, seconds: float) -> None:
        """Each call waits ``seconds`` before it runs (0: no more)."""
        self.store.faults.slow = seconds

    def lose_replies(self, lost: bool = True) -> None:
        """Each call is done, and its reply lost: the caller times out."""
        self.store.faults.lost = lost

    def clock_offset(self, seconds: float) -> None:
        """The node's clock runs ``seconds`` ahead (behind, if negative): its keys
        expire by it."""
        self.store.faults.offset = seconds

    def keys(self, pattern: str = "*") -> list[str]:
        return self.client().keys(pattern)


class MemoryNodes(ServerFleet[MemoryNode]):
    """N memory nodes of fresh names, each one lock node (``.urls``), with the
    verbs of :class:`~celery_redlock.testing.RedisNodes`."""

    def __init__(self, n: int = 3, *, nodes: list[MemoryNode] | None = None) -> None:
        tag = f"t{os.getpid()}-{next(_names)}"
        self.members = nodes if nodes is not None else [MemoryNode(f"{tag}-{i}") for i in range(n)]

    @property
    def nodes(self) -> list[MemoryNode]:
        return self.members

    def heal(self) -> None:
        """Every node up and answering, its keys kept, its faults cleared."""
        for node in self.nodes:
            node.store.faults.clear()

    def flushall(self) -> None:
        for node in self.nodes:
            node.store.flush()

    def close(self) -> None:
        self.heal()
        self.flushall()
