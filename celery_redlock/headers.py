"""The message headers celery_redlock adds, and reading them back on the worker.

``redlock_attempt``
    The lock attempt number of a message the lock re-published (contention,
    outage, throttle): it never uses the task's own ``retries``.
``redlock_claim``
    The key a message was claimed for at publish (enqueue claims, debounce,
    throttle): on the worker it tells a replaced message from a bypass, and
    lets a receiver withdraw the claim of a message it discards.
``redlock_claimed_on``
    Where that claim was written: the producer's lock nodes and key prefix
    (see :func:`where`). A worker that looks elsewhere cannot see the claim;
    it says so at ERROR and runs the message as an unclaimed one.
``redlock_slot``
    A throttled message's slot (its planned start, in ms): the worker asks the
    nodes whether the slot is still this message's, or was taken over.
``redlock_rate_at``
    A rated message re-published for its booked start: ``"<ms>:<attempt>:<retries>"``,
    the instant (epoch ms) and the delivery it was booked for, so that only
    that delivery starts on it.
``redlock_rate_waits``
    Rounds a rated start has waited out for lack of a quorum (its backoff).
``redlock_queued``
    The key a message was handed over for (``lock_on_duplicate="queue"``): the
    call waited in that key's queue, and its acquire takes the key's claim.
``redlock_parked_at``
    When a queued call was parked (epoch seconds): its start observes how long
    it waited (the ``celery_redlock_queue_wait_seconds`` histogram).
``redlock_queue_watch``
    The key a *watch* looks after: a message that runs no body, sent a while
    after a call parked behind a holder, which hands the key over if its holder
    died with its whole worker (see :mod:`celery_redlock.queues`).
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "ATTEMPT",
    "CLAIM",
    "CLAIMED_ON",
    "PARKED_AT",
    "QUEUED",
    "QUEUE_WATCH",
    "RATE_AT",
    "RATE_WAITS",
    "SLOT",
    "SUPERSEDED_BY",
    "attempt_of",
    "header",
    "where",
]

#: Message header carrying the lock attempt number of a re-published task.
ATTEMPT = "redlock_attempt"
#: Message header naming the key a message was claimed for at publish.
CLAIM = "redlock_claim"
#: Message header saying where the claim was written (see :func:`where`).
CLAIMED_ON = "redlock_claimed_on"
#: Message header naming the key whose queue handed a message over.
QUEUED = "redlock_queued"
#: Message header naming the key a queue's watch looks after.
QUEUE_WATCH = "redlock_queue_watch"
#: Message header carrying when a queued call was parked.
PARKED_AT = "redlock_parked_at"
#: Message header carrying a throttled message's slot.
SLOT = "redlock_slot"
#: Message header carrying a rated message's booked start (see the module docstring).
RATE_AT = "redlock_rate_at"
#: Message header counting a rated start's waits for a quorum.
RATE_WAITS = "redlock_rate_waits"
#: How a superseded execution's REVOKED reason begins; the successor's task id follows.
SUPERSEDED_BY = "superseded by task "


def header(request: Any, name: str) -> Any:
    """A custom header of a task request (Celery also sets them as attributes); None if absent."""
    value = getattr(request, name, None)
    if value is None:
        value = (getattr(request, "headers", None) or {}).get(name)
    return value


def attempt_of(request: Any) -> int:
    """The lock attempt number carried by the message (0 for a first delivery)."""
    try:
        return int(header(request, ATTEMPT) or 0)
    except (TypeError, ValueError):
        return 0


def where(redlock: Any) -> str:
    """The key prefix and lock nodes of ``redlock``, as ``prefix@node,node,...``.

    Each node is spelt from its identity (host, port and database, a socket
    path, a Sentinel service, a cluster's seeds), never from its URL: it holds
    no password, and ``redis://h`` and ``redis://h:6379/0`` are one node.
    """
    nodes = sorted(_spell(node.identity) for node in redlock.nodes)
    return f"{redlock.key_prefix}@{','.join(nodes)}"


def _spell(part: Any) -> str:
    if isinstance(part, (frozenset, set)):
        return "+".join(sorted(_spell(p) for p in part))
    if isinstance(part, tuple):
        return ":".join(_spell(p) for p in part if p is not None)
    return str(part)
