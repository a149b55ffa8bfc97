"""What keeps every kind's nodes sane in a process, written once for all kinds:
the circuit breaker (:class:`Breaker`), and the fork guard (:data:`FORKS`,
:class:`PerProcess`, :class:`ProcessLocal`) that keeps a forked child off its
parent's sockets and threads."""

from __future__ import annotations

import functools
import os
import threading
import time
from collections.abc import Callable, Hashable
from typing import Any, Generic, TypeVar

__all__ = ["BREAKER_MAX", "FORKS", "Breaker", "PerProcess", "ProcessLocal"]

T = TypeVar("T")

#: Seconds, at most, that a node whose connects or calls time out is skipped.
BREAKER_MAX = 1.0


class _Forks:
    """How many forks this process descends from: a node that saw another count
    holds its parent's sockets. Compared on every checkout instead of
    ``os.getpid()``, a system call."""

    __slots__ = ("count",)

    def __init__(self) -> None:
        self.count = 0
        os.register_at_fork(after_in_child=self._forked)

    def _forked(self) -> None:
        self.count += 1


#: The fork count every kind's nodes compare with the one they saw.
FORKS = _Forks()


class PerProcess(Generic[T]):
    """What this process's nodes of one server share (a session, a store), by key,
    made at first use. A forked child gets a new lock and passes the table to
    ``forked`` (by default it forgets the parent's: their sockets are the parent's)."""

    def __init__(self, forked: Callable[[dict[Any, T]], None] = dict.clear) -> None:
        self.table: dict[Any, T] = {}
        self.lock = threading.Lock()
        self._forked = forked
        os.register_at_fork(after_in_child=self._after_fork)

    def _after_fork(self) -> None:
        self.lock = threading.Lock()  # a thread of the parent may have held it
        self._forked(self.table)

    def get(self, key: Hashable, make: Callable[[], T]) -> T:
        with self.lock:
            got = self.table.get(key)
            if got is None:
                got = self.table[key] = make()
            return got

    def pop(self, key: Hashable) -> T | None:
        with self.lock:
            return self.table.pop(key, None)


class ProcessLocal(Generic[T]):
    """A function's value, made at its first call in this process (one maker at a
    time); a forked child makes its own (the parent's threads did not come along)."""

    def __init__(self, make: Callable[[], T]) -> None:
        self._make = make
        functools.update_wrapper(self, make)
        #: The value once made, else None.
        self.value: T | None = None
        self._lock = threading.Lock()
        os.register_at_fork(after_in_child=self._forget)

    def __call__(self) -> T:
        value = self.value
        if value is None:
            with self._lock:
                if self.value is None:
                    self.value = self._make()
                value = self.value
        return value

    def _forget(self) -> None:
        self.value, self._lock = None, threading.Lock()


class Breaker:
    """A node's circuit breaker, per node and per process.

    A node whose connects (or calls, where a kind has no connects of its own)
    time out is skipped for a while: its calls fail at once, so the call that
    follows a timed-out one (a failed acquire's release) costs nothing more.
    The while starts at the timed-out budget and doubles, up to
    :data:`BREAKER_MAX`, each time the try after it times out too; a timeout
    of a try made before the breaker opened does not grow it. When the while
    is over, the next call tries again (:meth:`skipping`), or, where a kind
    opens connections in the background, one probe does (:meth:`probe_due`).
    Any outcome but a timeout closes it (:meth:`answered`).
    """

    __slots__ = ("backoff", "retry_at", "probing")

    def __init__(self) -> None:
        self.backoff = self.retry_at = 0.0
        self.probing = False

    def skipping(self) -> bool:
        """Whether calls are skipped now (the while is not over)."""
        return bool(self.backoff) and time.monotonic() < self.retry_at

    def check(self, name: str) -> None:
        """Raises TimeoutError, naming the node, while its calls are skipped."""
        if self.skipping():
            raise TimeoutError(self.why(name))

    def why(self, name: str, what: str = "calls") -> str:
        """What a skipped call answers, naming the node."""
        left = max(self.retry_at - time.monotonic(), 0.0)
        return f"{name}: skipped for a while: its {what} timed out (next try within {left:.2f}s)"

    def probe_due(self) -> bool:
        """True, once, when an open breaker's while is over: the caller then opens
        one connection in the background and reports how it ended with ``probe=True``."""
        if self.probing or time.monotonic() < self.retry_at:
            return False
        self.probing = True
        return True

    def timed_out(self, budget: float, probe: bool = False) -> None:
        """A try that had ``budget`` seconds timed out: open the breaker, or, for a
        try made after its while (the probe), keep it open for twice as long."""
        if probe:
            self.probing = False
        now = time.monotonic()
        if probe or not self.backoff or now >= self.retry_at:
            self.backoff = min(max(2 * self.backoff, budget), BREAKER_MAX)
            self.retry_at = now + self.backoff

    def answered(self, probe: bool = False) -> None:
        """A try ended otherwise than by a timeout: close the breaker."""
        if probe:
            self.probing = False
        self.backoff = 0.0

    def forget(self) -> None:
        """Closed, as in a new process (a forked child starts afresh)."""
        self.backoff = self.retry_at = 0.0
        self.probing = False
