"""The message headers celery_redlock adds, and reading them back on the worker.

``redlock_attempt``
    The lock attempt number of a message the lock re-published (contention,
    outage, throttle): it never uses the task's own ``retries``.
``redlock_claim``
    The key a message was claimed for at publish (enqueue claims, debounce,
    throttle): on the worker it tells a replaced message from a bypass, and
    lets a receiver withdraw the claim of a message it discards.
``redlock_slot``
    A throttled message's slot (its planned start, in ms): the worker asks the
    nodes whether the slot is still this message's, or was taken over.
``redlock_rate_at``
    A rated message re-published for its booked start: ``"<ms>:<attempt>:<retries>"``,
    the instant (epoch ms) and the delivery it was booked for, so that only
    that delivery starts on it.
``redlock_rate_waits``
    Rounds a rated start has waited out for lack of a quorum (its backoff).
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "ATTEMPT",
    "CLAIM",
    "RATE_AT",
    "RATE_WAITS",
    "SLOT",
    "SUPERSEDED_BY",
    "attempt_of",
    "header",
]

#: Message header carrying the lock attempt number of a re-published task.
ATTEMPT = "redlock_attempt"
#: Message header naming the key a message was claimed for at publish.
CLAIM = "redlock_claim"
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
