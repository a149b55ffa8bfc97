"""Counters and timings of what the locks do.

Always kept in process (:func:`snapshot`, used by tests and the CLI), and also
exported to Prometheus when ``prometheus_client`` is installed (the
``prometheus`` extra)::

    celery_redlock_events_total{event="acquired", lock="tasks.settle"}
    celery_redlock_acquire_seconds{lock="tasks.settle"}       (histogram)

Events: ``acquired``, ``contended``, ``dropped``, ``retried``, ``raised``,
``waited``, ``exhausted``, ``lost``, ``outage``, ``parent_released``,
``beat_sent``, ``beat_skipped``, ``beat_outage``, ``beat_missed``. The ``lock``
label is the task's ``lock_name`` (the entry name for beat events), never an
argument value, so its cardinality is that of your task list.

In a prefork worker every child process counts for itself; use
``prometheus_client``'s multiprocess mode to add them up.
"""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

__all__ = ["EVENTS", "count", "observe", "snapshot", "reset"]

EVENTS = (
    "acquired",
    "contended",
    "dropped",
    "retried",
    "raised",
    "waited",
    "exhausted",
    "lost",
    "outage",
    "parent_released",
    "beat_sent",
    "beat_skipped",
    "beat_outage",
    "beat_missed",
)

_counts: Counter = Counter()
_lock = threading.Lock()

_prom: Any
try:  # optional export
    import prometheus_client as _prom
except ImportError:  # pragma: no cover - depends on the installed extras
    _prom = None

if _prom is not None:
    _EVENTS = _prom.Counter(
        "celery_redlock_events", "Lock events by kind and lock name", ("event", "lock")
    )
    _ACQUIRE = _prom.Histogram(
        "celery_redlock_acquire_seconds",
        "Time to take a lock (one quorum round, or two with fencing)",
        ("lock",),
        buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0),
    )


# Labelled children, looked up once per label set: ``labels()`` costs more than
# the update itself, and these are updated on every task. Prometheus keeps the
# same child per label set, so a cached one is the one it exports.
_event_children: dict[tuple[str, str], Any] = {}
_acquire_children: dict[str, Any] = {}


def count(event: str, lock: str) -> None:
    """Count one ``event`` of ``lock``."""
    key = (event, lock)
    with _lock:
        _counts[key] += 1
    if _prom is not None:
        child = _event_children.get(key)
        if child is None:
            child = _event_children[key] = _EVENTS.labels(event, lock)
        child.inc()


def observe(seconds: float, lock: str) -> None:
    """Record how long one acquisition took."""
    if _prom is not None:
        child = _acquire_children.get(lock)
        if child is None:
            child = _acquire_children[lock] = _ACQUIRE.labels(lock)
        child.observe(seconds)


def snapshot() -> dict[str, dict[str, Any]]:
    """This process's counts: ``{event: {lock: n}}``."""
    out: dict[str, dict[str, Any]] = {}
    with _lock:
        for (event, lock), n in _counts.items():
            out.setdefault(event, {})[lock] = n
    return out


def reset() -> None:
    """Forget this process's counts (Prometheus counters are monotonic and stay)."""
    with _lock:
        _counts.clear()
