"""What one read of a key cannot tell: how long a holder has been seen, and whether it renews.

A holder's key carries no start time, and a lease that is renewed looks, in
one read, just like one that is not. The dashboard remembers each (key,
owner) between its reads: when it was first seen, and when its time left
last went *up* (a renewal). A holder whose heartbeat works is renewed every
``ttl/3`` (``redlock_heartbeat_interval`` when set), so its time left never
falls below about two thirds of its TTL; every read therefore sees at least
``2/3 * ttl`` left, and the largest time left seen bounds the TTL:
``ttl <= 1.5 * peak``. With no renewal seen for longer than ``peak / 2``
(a full renewal interval at most) plus :data:`GRACE`, the holder is
*suspect*: its worker may be hung or gone, and the key lives only until its
TTL runs out.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import NamedTuple

__all__ = ["GRACE", "Seen", "Watch"]

#: Seconds of slack before a missed renewal counts (a read's own delay, a slow round).
GRACE = 1.5
#: A renewal is a rise of the time left by more than this many seconds.
RISE = 0.05
#: Entries not seen for this many seconds are forgotten.
FORGET_AFTER = 120.0
#: At most this many entries are kept (the oldest reads go first).
MAX_ENTRIES = 50_000


class Seen(NamedTuple):
    """A holder as the reads so far have seen it."""

    #: Seconds since the dashboard first saw this owner on this key (a lower bound of its age).
    age: float
    #: Seconds since the time left last rose (or since first seen).
    since_renewal: float
    #: True when no renewal was seen for longer than a renewal interval plus :data:`GRACE`.
    suspect: bool


class _Entry:
    __slots__ = ("first", "rise", "last", "peak", "seen")

    def __init__(self, now: float, remaining: float):
        self.first = self.rise = self.seen = now
        self.last = self.peak = remaining


class Watch:
    """The (key, owner) pairs of recent reads, shared by every request of one app."""

    def __init__(self, clock: Callable[[], float] = time.monotonic, grace: float = GRACE):
        self.clock = clock
        self.grace = grace
        self._entries: dict[tuple[str, str], _Entry] = {}
        self._lock = threading.Lock()

    def see(self, key: str, owner: str, remaining: float | None) -> Seen:
        """Record one read of ``key`` held by ``owner`` with ``remaining`` seconds left."""
        now = self.clock()
        with self._lock:
            entry = self._entries.get((key, owner))
            if entry is None or remaining is None:
                entry = self._entries[(key, owner)] = _Entry(now, remaining or 0.0)
            elif remaining > entry.last + RISE:
                entry.rise = now
            entry.last, entry.seen = remaining or 0.0, now
            entry.peak = max(entry.peak, entry.last)
            since = now - entry.rise
            suspect = remaining is not None and since > entry.peak / 2 + self.grace
            return Seen(now - entry.first, since, suspect)

    def prune(self) -> None:
        """Forget the pairs not seen lately, and the oldest beyond :data:`MAX_ENTRIES`."""
        now = self.clock()
        with self._lock:
            stale = [k for k, e in self._entries.items() if now - e.seen > FORGET_AFTER]
            for k in stale:
                del self._entries[k]
            if len(self._entries) > MAX_ENTRIES:
                by_age = sorted(self._entries.items(), key=lambda item: item[1].seen)
                for k, _ in by_age[: len(self._entries) - MAX_ENTRIES]:
                    del self._entries[k]
