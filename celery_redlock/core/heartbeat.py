"""Keep held leases alive: one renewal thread per process, for every lease.

Design
======

A task holds its lease for as long as its body runs, which may be far longer
than the TTL. The TTL is kept short on purpose, because it bounds how long a
crashed holder blocks everyone else; so something must renew the lease while the
body runs. That is this module.

* **One daemon thread per process** (``celery_redlock-heartbeat``) renews every
  held lease, of any :class:`~celery_redlock.core.Redlock` client. A threads
  or solo worker runs many tasks per process; one thread per lock would not
  scale, and a thread per lock is what python-redis-lock regrets.
* **Batching:** each round groups the due leases by client and calls
  ``Redlock.extend_many`` once per client: one call per node per round,
  whatever the number of leases.
* **Each lease has its own interval**, measured from its last successful
  renewal. The thread sleeps on a :class:`threading.Event` until the earliest due
  time; :meth:`Heartbeat.hold` and :meth:`Heartbeat.stop` wake it. No polling, so
  it also behaves when gevent or eventlet have monkeypatched ``threading``
  (where a CPU-bound greenlet still starves it: the task layer warns).
* **Why renew at ttl/3** (the task layer's choice): a renewal can fail
  transiently or be delayed by a GIL-holding C call or a slow node; at ttl/3 the
  lease survives one missed round with a third of its TTL to spare.
  python-redis-lock renews at 2/3 of the TTL, which leaves no room for a miss.
* **Lost** means the lease may no longer be ours: a renewal reached fewer than
  a quorum of nodes, raised, came too late (the validity had run out, so
  another client may already have the lock; renewing then would be unsafe), or
  the nodes answered that the key no longer holds its owner (an operator
  freed it): each its own reason, ``lease.lost_reason``. The
  lease is marked lost (``lease.lost``, ``lease.check()`` raises ``LockLost``), it
  is no longer renewed, one WARNING gives the reason and ``on_lost(lease)`` is called
  in the heartbeat thread. Nothing raises in the thread: errors are logged.
* **Fork:** threads do not survive ``fork()``. In the child every heartbeat is
  reset: its locks are recreated (one may have been held at fork time) and it
  starts empty, since the inherited leases belong to the parent, which keeps
  renewing them. The child starts its own thread when it first holds a lease.
* **Probe:** a lease held with ``probe`` has it called, in the heartbeat
  thread, after each of its renewals that reached a quorum: a holder that must
  hear of something on the nodes (a newer call asking it to stop) hears of it
  within one renewal interval. A probe that raises is logged.
* Only weak references to leases are kept, so a dropped lease is never kept
  alive by the heartbeat, and a lease collected without :meth:`~Heartbeat.drop`
  simply stops being renewed.

This module imports no Celery.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # only for annotations: the core stays import-light
    from .lease import Lease

__all__ = ["THREAD_NAME", "Heartbeat", "default", "drop", "held", "hold", "renew_once", "stop"]

logger = logging.getLogger("celery_redlock.heartbeat")

THREAD_NAME = "celery_redlock-heartbeat"

# held.NO_QUORUM's and held.LAPSED's texts: this module imports nothing of the core at load
_NO_QUORUM = "the renewal reached fewer than a quorum of nodes"
_LAPSED = "its validity ran out before it was renewed"

OnLost = Callable[["Lease"], None]


class _Entry:
    """One held lease: a weak reference, its schedule and its callback."""

    __slots__ = ("ref", "interval", "on_lost", "due", "probe")

    def __init__(
        self,
        lease: Lease,
        interval: float,
        on_lost: OnLost | None,
        due: float,
        probe: OnLost | None = None,
    ):
        self.ref = weakref.ref(lease)
        self.interval = interval
        self.on_lost = on_lost
        self.due = due
        self.probe = probe


class Heartbeat:
    """Renews held leases in one daemon thread, started lazily.

    Args:
        clock: monotonic clock in seconds, for the schedule (injectable for tests).
        autostart: start the thread on the first :meth:`hold`. With False,
            rounds run only when :meth:`renew_once` is called (for tests).
        name: the thread's name.
    """

    def __init__(
        self,
        clock: Callable[[], float] = time.monotonic,
        *,
        autostart: bool = True,
        name: str = THREAD_NAME,
    ) -> None:
        self.clock = clock
        self.autostart = autostart
        self.name = name
        self._reset()
        _instances.add(self)

    def _reset(self) -> None:
        """(Re)create all state: at construction, and in a forked child."""
        self._lock = threading.Lock()
        self._wake = threading.Event()
        # When the thread will wake next (None: not waiting, or waiting for ever),
        # and how long it naps with nothing held: the shortest interval seen, so
        # that a new lease is never due before the nap ends and hold() need not
        # wake it (a wake per task costs more than the renewal it schedules).
        self._planned: float | None = None
        self._idle_nap: float | None = None
        self._entries: dict[int, _Entry] = {}  # id(lease) -> entry
        self._thread: threading.Thread | None = None  # the one thread allowed to run
        finalizer = getattr(self, "_finalizer", None)
        if finalizer is not None:
            finalizer.detach()
        self._finalizer: weakref.finalize | None = None

    def hold(
        self,
        lease: Lease,
        interval: float,
        on_lost: OnLost | None = None,
        probe: OnLost | None = None,
    ) -> None:
        """Renew ``lease`` every ``interval`` seconds until :meth:`drop`; call ``probe(lease)``
        after each renewal that reached a quorum.

        Holding a lease already held updates its interval and callback; its
        schedule still counts from its last renewal.

        Raises:
            ValueError: ``interval`` is not a positive number below the lease's TTL.
            TypeError: ``on_lost`` is not callable.
        """
        if isinstance(interval, bool) or not isinstance(interval, (int, float)) or not interval > 0:
            raise ValueError(f"heartbeat interval must be positive seconds, got {interval!r}")
        if interval >= lease.ttl:  # the lease would lapse between renewals
            raise ValueError(f"heartbeat interval {interval}s must be below the TTL {lease.ttl}s")
        if on_lost is not None and not callable(on_lost):
            raise TypeError(f"on_lost must be callable, got {on_lost!r}")
        now = self.clock()
        with self._lock:
            entry = self._entries.get(id(lease))
            if entry is not None and entry.ref() is lease:  # updated in place: a round may be
                entry.due += interval - entry.interval  # in flight with this very entry
                entry.interval, entry.on_lost, entry.probe = float(interval), on_lost, probe
            else:
                entry = _Entry(lease, float(interval), on_lost, now + interval, probe)
                self._entries[id(lease)] = entry
            if self._idle_nap is None or interval < self._idle_nap:
                self._idle_nap = float(interval)
            if self.autostart:
                self._ensure_thread()
            due_first = self._planned is None or now + interval < self._planned
        if due_first:  # the new lease is due before the thread's next wake-up
            self._wake.set()

    def drop(self, lease: Lease) -> None:
        """Stop renewing ``lease`` (call it before releasing). Idempotent."""
        with self._lock:
            entry = self._entries.get(id(lease))
            if entry is not None and entry.ref() is lease:
                del self._entries[id(lease)]

    def held(self) -> list[Lease]:
        """The leases being renewed, in the order they were first held."""
        with self._lock:
            leases = [entry.ref() for entry in self._entries.values()]
        return [lease for lease in leases if lease is not None]

    def renew_once(self, now: float | None = None) -> None:
        """Run one round: renew every lease due at ``now`` (default: the clock). Never raises."""
        now = self.clock() if now is None else now
        groups: dict[int, tuple[Any, list[tuple[Lease, _Entry]]]] = {}
        with self._lock:
            for key, entry in list(self._entries.items()):
                lease = entry.ref()
                if lease is None:  # collected without drop(): nothing left to renew
                    del self._entries[key]
                elif entry.due <= now:
                    # Reschedule first, so that no error can leave a lease due
                    # (the thread would spin); a failure removes the entry anyway.
                    entry.due = now + entry.interval
                    client = lease.redlock
                    groups.setdefault(id(client), (client, []))[1].append((lease, entry))
        lost: list[tuple[Lease, _Entry, str]] = []
        for client, items in groups.values():
            live = []
            for lease, entry in items:
                try:
                    lapsed = lease.lost  # marked lost elsewhere, or validity <= 0
                    reason = (
                        _LAPSED
                        if lease.remaining() <= 0
                        else lease.lost_reason or "it was marked lost elsewhere"
                    )
                except Exception as exc:  # a broken clock: treat as lost
                    lapsed, reason = True, f"its validity could not be read ({exc!r})"
                if lapsed:
                    lost.append((lease, entry, reason))
                else:
                    live.append((lease, entry))
            if not live:
                continue
            failure = None
            try:
                results = client.extend_many([lease for lease, _ in live])
            except Exception as exc:  # one client's outage must not touch the others
                results, failure = [False] * len(live), f"the renewal failed ({exc!r})"
            lost += [
                # the renewal's own reason (held.NO_QUORUM, held.FREED...), else the
                # usual one; this module loads alone, so it imports none of them
                (lease, entry, failure or lease.lost_reason or _NO_QUORUM)
                for (lease, entry), ok in zip(live, results)
                if not ok
            ]
            for (lease, entry), ok in zip(live, results):
                if ok and entry.probe is not None:
                    try:
                        entry.probe(lease)
                    except Exception:
                        logger.exception("probe of lock %r raised", lease.key)
        if lost:
            self._report(lost)

    def _report(self, lost: list[tuple[Lease, _Entry, str]]) -> None:
        with self._lock:
            # A lease dropped while its renewal was in flight is being released:
            # that is no loss to report.
            still = [item for item in lost if self._entries.get(id(item[0])) is item[1]]
            for lease, _, _ in still:
                del self._entries[id(lease)]
        for lease, entry, reason in still:
            lease.mark_lost(reason)
            logger.warning("lock %r lost: %s; no longer renewed", lease.key, reason)
            if entry.on_lost is not None:
                try:
                    entry.on_lost(lease)
                except Exception:
                    logger.exception("on_lost callback for lock %r raised", lease.key)

    def stop(self, timeout: float | None = None) -> None:
        """Stop the thread and wait for it (``timeout`` seconds at most). Idempotent.

        Held leases stay registered but are no longer renewed; a later
        :meth:`hold` starts a new thread.
        """
        with self._lock:
            thread, self._thread = self._thread, None
        self._wake.set()
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    def _ensure_thread(self) -> None:
        """Start the thread if this process has none (called with the lock held)."""
        if self._thread is not None and self._thread.is_alive():
            return
        thread = threading.Thread(
            target=_run, args=(weakref.ref(self), self._wake), name=self.name, daemon=True
        )
        self._thread = thread
        # If this heartbeat is collected, wake the thread so that it exits.
        if self._finalizer is not None:
            self._finalizer.detach()
        self._finalizer = weakref.finalize(self, self._wake.set)
        thread.start()

    def _delay(self) -> float | None:
        """Seconds until the next lease is due (or the idle nap ends); None: wait for a wake."""
        with self._lock:
            now = self.clock()
            due = min((entry.due for entry in self._entries.values()), default=None)
            if due is None and self._idle_nap is not None:
                due = now + self._idle_nap
            self._planned = due
        return None if due is None else max(0.0, due - now)


def _run(ref: weakref.ref[Heartbeat], wake: threading.Event) -> None:
    """The thread's loop. Holds the heartbeat only weakly, and never while asleep."""
    while True:
        heartbeat = ref()
        if heartbeat is None or heartbeat._thread is not threading.current_thread():
            return  # collected, stopped, or replaced (reset after fork)
        wake.clear()  # before the round: a hold() during it makes the wait return at once
        try:
            heartbeat.renew_once()
            delay = heartbeat._delay()
        except Exception:  # pragma: no cover - renew_once never raises; belt and braces
            logger.exception("heartbeat round failed")
            delay = 1.0
        del heartbeat
        wake.wait(delay)


_instances: weakref.WeakSet[Heartbeat] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for heartbeat in list(_instances):
        heartbeat._reset()


os.register_at_fork(after_in_child=_after_fork_in_child)

#: The process's heartbeat; the functions below delegate to it.
default = Heartbeat()


def hold(
    lease: Lease, interval: float, on_lost: OnLost | None = None, probe: OnLost | None = None
) -> None:
    """Renew ``lease`` every ``interval`` seconds in this process's heartbeat thread."""
    default.hold(lease, interval, on_lost, probe)


def drop(lease: Lease) -> None:
    """Stop renewing ``lease``. Idempotent."""
    default.drop(lease)


def renew_once(now: float | None = None) -> None:
    """Run one renewal round of the default heartbeat, synchronously."""
    default.renew_once(now)


def held() -> list[Lease]:
    """The leases the default heartbeat renews."""
    return default.held()


def stop(timeout: float | None = None) -> None:
    """Stop the default heartbeat's thread (at worker process shutdown). Idempotent."""
    default.stop(timeout)
