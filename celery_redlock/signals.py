"""Lifecycle receivers, and the ``lock_lost`` signal.

:func:`install` connects them once per app; a :class:`~celery_redlock.LockedTask`
calls it when it binds, so there is nothing to do by hand.

In each worker process (pool child):

* ``worker_process_shutdown``: stop the heartbeat thread and close connections.
  (After a fork the heartbeat starts empty by itself: it is fork-aware.)

In the worker's main process, where the pool reports children that died:

* ``task_failure`` with ``WorkerLostError`` (the child was killed, e.g. by
  SIGKILL or the OOM killer) or ``TimeLimitExceeded`` (hard time limit), and
  ``task_revoked`` with ``terminated=True``: the lock of that task is released
  at once, matched on the task id in the owner value, instead of staying until
  its TTL. The next execution of the key does not wait for it.

Receivers never raise: Celery would only log it.
"""

from __future__ import annotations

import logging
import weakref
from typing import Any

from billiard.exceptions import WorkerLostError
from celery import signals as celery_signals
from celery.exceptions import TimeLimitExceeded
from celery.utils.dispatch import Signal

from . import heartbeat, metrics

__all__ = ["install", "lock_lost"]

logger = logging.getLogger("celery_redlock.signals")

#: Sent (by the heartbeat thread) when a held lease lost its quorum or lapsed.
#: Arguments: ``sender`` (the task), ``lease``.
lock_lost = Signal(name="lock_lost")

_installed: weakref.WeakSet = weakref.WeakSet()


def install(app: Any) -> None:
    """Connect the receivers for ``app`` (idempotent)."""
    if app in _installed:
        return
    _installed.add(app)
    uid = f"celery_redlock:{id(app)}"
    celery_signals.worker_process_shutdown.connect(
        _process_shutdown, weak=False, dispatch_uid=uid + ":shutdown"
    )
    celery_signals.task_failure.connect(_task_failure, weak=False, dispatch_uid=uid + ":failure")
    celery_signals.task_revoked.connect(_task_revoked, weak=False, dispatch_uid=uid + ":revoked")


def _process_shutdown(**_: Any) -> None:
    heartbeat.stop()


def _task_failure(
    sender: Any = None,
    task_id: str = "",
    exception: Any = None,
    args: Any = None,
    kwargs: Any = None,
    **_: Any,
) -> None:
    if isinstance(exception, (WorkerLostError, TimeLimitExceeded)):
        _release_for_dead(sender, task_id, args, kwargs, why=type(exception).__name__)


def _task_revoked(
    sender: Any = None, request: Any = None, terminated: bool = False, **_: Any
) -> None:
    if terminated and request is not None:
        _release_for_dead(
            sender, request.id, request.args, request.kwargs, why="revoked and terminated"
        )


def _release_for_dead(task: Any, task_id: str, args: Any, kwargs: Any, why: str) -> None:
    plan = getattr(task, "_lock_plan", None)
    if plan is None or not task_id:
        return
    try:
        name = plan.keys.build(args or (), kwargs or {})
        freed = plan.redlock.release_owned_by(name, task_id)
    except Exception as exc:  # noqa: BLE001 - a receiver must not raise
        logger.warning(
            "could not release the lock of %s[%s] (%s): %s", task.name, task_id, why, exc
        )
        return
    if freed:
        metrics.count("parent_released", plan.lock_name)
        logger.info("released the lock of %s[%s] on %d nodes: %s", task.name, task_id, freed, why)
