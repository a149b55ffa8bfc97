"""A retried task id is published again only once its RETRY state is stored.

Celery's ``Task.retry`` publishes the new message first and raises ``Retry``
after it; the worker stores RETRY only then (``mark_as_retry`` in the
tracer's ``handle_retry``). A new execution that is quick can store its own
result first, and the old RETRY lands over it: the state goes backwards, and
``AsyncResult.get()`` waits for ever. No result backend Celery ships orders
those writes (the Redis backend keeps only SUCCESS, by a read before the
write; the database backends keep nothing).

So a :class:`~celery_redlock.LockedTask` executing on a worker holds the new
message back: the lock's own re-publish (contention, outage, throttle, rate)
and the body's ``self.retry()`` raise ``Retry`` with the message unsent, and
:meth:`LockedTask.on_retry <celery_redlock.LockedTask.on_retry>` sends it.
Celery calls ``on_retry`` right after it stored RETRY and before the worker
acknowledges the message, so the new execution's state always lands after the
old RETRY. The ``task_retry`` signal, the ``task-retried`` event, ``retries``
and ``max_retries`` are Celery's own, unchanged. In eager mode nothing is held
(nothing is published there).

If something goes wrong in between:

* Publishing fails: the error escapes ``on_retry`` and the worker stores
  FAILURE over the RETRY, as Celery's own ``retry()`` fails (``Reject``) when
  it cannot publish: the caller sees why, nothing waits for ever.
* Storing RETRY fails (the result backend refuses the write): ``on_retry`` is
  never called, and the message is sent when the execution ends
  (``task_postrun``), so the retry is not lost; logged at WARNING. Celery
  then stores that error as FAILURE, which may land after the new
  execution's state: the one case where the order is not kept.
* A subclass's ``on_retry`` that does not call ``super()``: the message is
  sent on ``task_postrun`` too, a moment later.
* The worker process dies between the store and the publish: with
  ``acks_late`` and ``task_reject_on_worker_lost`` the message was not
  acknowledged yet and is delivered again. Otherwise the worker's main
  process stores FAILURE (``WorkerLostError``) over the RETRY: with early
  acknowledgement (Celery's default) the message was acknowledged on receipt
  and the retry is lost with the process, as any such task's is, but not
  quietly.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["held", "hold", "send_held", "send_late", "take_held_publish"]

logger = logging.getLogger("celery_redlock.republish")

#: The request attribute holding the send of the message, until RETRY is stored.
_PENDING = "redlock_republish"
#: The request attribute set while Celery's ``Task.retry`` runs (see :func:`held`).
_HOLDING = "redlock_holding"


def hold(request: Any, send: Callable[[], Any]) -> None:
    """Send the re-publish ``send()`` once the RETRY of ``request`` is stored.

    Outside a worker's execution (eager mode) it is sent at once.
    """
    if request.is_eager or request.called_directly:
        send()
        return
    setattr(request, _PENDING, send)


@contextmanager
def held(request: Any) -> Iterator[None]:
    """While Celery's ``Task.retry`` runs: its publish of this task id is held (see
    :func:`take_held_publish`)."""
    setattr(request, _HOLDING, True)
    try:
        yield
    finally:
        setattr(request, _HOLDING, False)


def take_held_publish(task: Any, task_id: str | None, send: Callable[[], Any]) -> bool:
    """``apply_async`` of ``task_id`` from inside :func:`held`: hold ``send``; True if held."""
    request = task.request
    if not getattr(request, _HOLDING, False) or task_id != request.id or request.is_eager:
        return False
    setattr(request, _PENDING, send)
    return True


def send_held(request: Any) -> None:
    """``on_retry``: send the message held for ``request``, if any. An error is raised:
    the worker then stores FAILURE, as when Celery's ``retry()`` cannot publish."""
    send = getattr(request, _PENDING, None)
    if send is not None:
        setattr(request, _PENDING, None)
        send()


def send_late(request: Any, state: str | None) -> None:
    """``task_postrun``: send a message ``on_retry`` did not (see the module docstring)."""
    send = getattr(request, _PENDING, None)
    if send is None:
        return
    setattr(request, _PENDING, None)
    if state != "RETRY":
        logger.warning(
            "task %s: RETRY was not stored (the execution ended %s); its retry is published now",
            request.id,
            state or "with an internal error",
        )
    try:
        send()
    except Exception as exc:  # noqa: BLE001 - a signal receiver; Celery would only log it
        logger.error("task %s: could not publish its retry, it is lost: %r", request.id, exc)
