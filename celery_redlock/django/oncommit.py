"""``delay_on_commit()`` and ``apply_async_on_commit()`` of a LockedTask in a Django app.

Publishing waits for the transaction to commit, as with Celery's ``DjangoTask``:
a rolled-back transaction publishes nothing. With claims (``lock_enqueue``,
``lock_debounce``, ``lock_throttle``) the whole ``apply_async`` waits, claim
included, so a rolled-back transaction leaves no claim either, and the calls of
one task and key in one transaction publish once, at commit:

* the first call's message under ``lock_enqueue`` with ``lock_on_enqueued``
  ``return`` or ``raise``, and under ``lock_throttle`` without trailing runs
  (a later call would have found the first's claim, or fallen in its period);
* the last call's under ``lock_on_enqueued="replace"``, ``lock_debounce`` and
  ``lock_throttle_trailing`` (the newest arguments win).

Calls inside a nested ``atomic()`` block (a savepoint) are grouped apart from
those outside it, as a rollback of the savepoint discards them alone: each
group publishes once, and the groups then meet at commit as separate calls do
(the claim decides). A call left out that was given a ``task_id`` has that
result stored REVOKED, "superseded by task <id>" (:func:`celery_redlock.result_of`
follows it). There is no caller left at commit to return to or raise at: a call
that finds the key claimed by a task of another transaction is logged at INFO,
as with ``return``.
"""

from __future__ import annotations

import logging
from typing import Any

from django.db import transaction

from ..enqueue import in_canvas
from ..exceptions import AlreadyEnqueued
from ..headers import SUPERSEDED_BY
from ..plan import plan_of

__all__ = ["OnCommit"]

logger = logging.getLogger("celery_redlock.django")


class OnCommit:
    """The on-commit methods of a LockedTask that is a ``DjangoTask`` (a mixin before it)."""

    def delay_on_commit(self, *args: Any, **kwargs: Any) -> None:
        """``delay()`` once the transaction commits."""
        self.apply_async_on_commit(args, kwargs)

    def apply_async_on_commit(self, args: Any = None, kwargs: Any = None, **options: Any) -> None:
        """``apply_async()`` once the transaction commits, claim included."""
        task: Any = self
        task._refuse_if_unbound()
        plan = plan_of(task)
        if plan is None or not plan.claims or in_canvas(options):
            # No claim to take at commit (a canvas member publishes without one)
            super().apply_async_on_commit(args, kwargs, **options)  # type: ignore[misc]
            return
        key = plan.keys.build(args or (), kwargs or {})
        settings = plan.settings
        newest_wins = (
            settings.on_enqueued == "replace"
            or settings.debounce is not None
            or (settings.throttle is not None and bool(settings.throttle_trailing))
        )
        pending = _pending(task, key)
        if pending is not None:
            pending.join(args, kwargs, options)
        else:
            transaction.on_commit(_Publish(task, key, newest_wins, args, kwargs, options))


class _Publish:
    """The on-commit calls of one task and key at one savepoint level: one publish at commit."""

    def __init__(
        self, task: Any, key: str, newest_wins: bool, args: Any, kwargs: Any, options: dict
    ):
        self.task, self.key, self.newest_wins = task, key, newest_wins
        self.args, self.kwargs, self.options = args, kwargs, dict(options)
        #: Task ids given to calls left out: told at commit which task went in their place.
        self.left_out: list[str] = []

    def join(self, args: Any, kwargs: Any, options: dict) -> None:
        """Another call of the key, at this savepoint level, before the commit."""
        given = options.get("task_id")
        if self.newest_wins:
            given = self.options.get("task_id")
            self.args, self.kwargs, self.options = args, kwargs, dict(options)
        if given:
            self.left_out.append(given)

    def __call__(self) -> None:
        try:
            published = self.task.apply_async(self.args, self.kwargs, **self.options).id
        except AlreadyEnqueued as exc:
            logger.info("%s: not enqueued at commit: %s", self.task.name, exc)
            published = exc.task_id
        for task_id in self.left_out:
            logger.info(
                "%s[%s]: one publish per key and transaction: %s went as task %s",
                self.task.name,
                task_id,
                self.key,
                published,
            )
            if not self.task.ignore_result:
                self.task.backend.mark_as_revoked(task_id, SUPERSEDED_BY + published)


def _pending(task: Any, key: str) -> _Publish | None:
    """The call of ``task`` and ``key`` this transaction publishes at commit, at this
    savepoint level (tasks sharing a lock name meet at commit, through the claim).

    Read from what ``transaction.on_commit`` keeps: each callback with the savepoints
    open when it was registered. A call joins a callback registered under the same
    savepoints only: a rollback of one of them discards both, of any other neither.
    """
    connection = transaction.get_connection()
    if not connection.in_atomic_block:
        return None
    savepoints = set(connection.savepoint_ids)
    for entry in connection.run_on_commit:
        call = entry[1]
        if (
            isinstance(call, _Publish)
            and call.task is task
            and call.key == key
            and entry[0] == savepoints
        ):
            return call
    return None
