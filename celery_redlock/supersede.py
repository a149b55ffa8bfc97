"""What ``lock_on_duplicate="supersede"`` adds to a queue: the newest call wins.

A key's calls wait in its queue as under ``queue`` (see
:mod:`celery_redlock.queues`), with two differences:

* A call that parks **replaces every call waiting**: they are taken out of the
  queue in the same round and answered at once as ``REVOKED``, with the reason
  ``superseded by task <id>`` (:func:`celery_redlock.superseded_by` reads it
  back), counted as ``superseded``.
* It **asks the running call to stop**. The holder's heartbeat looks at the
  key's queue after each renewal (one read round more per renewal, for
  ``supersede`` tasks only); once a call waits there, the lease is marked
  superseded: ``self.request.redlock.check()`` (and ``current_lease().check()``)
  raises :class:`~celery_redlock.exceptions.LockSuperseded`, a ``LockLost``,
  naming the successor, and the :data:`~celery_redlock.signals.lock_superseded`
  signal is sent (from the heartbeat thread), once. A body that lets the
  error propagate ends as ``REVOKED`` naming its successor; the key is
  handed to the newest call as it lets go.

It is **cooperative on purpose**: nothing is killed mid-write. The lease stays
held and renewed until the body returns, so a body that catches
``LockSuperseded`` can finish (or undo) a write first, and a body that never
calls ``check()`` runs to its end, its result stored as usual; the newest
call runs after it. A holder whose worker dies hands over as under ``queue``
(at worst after its TTL).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any, NoReturn

from celery.exceptions import Ignore

from . import metrics
from .core import Lease
from .exceptions import LockSuperseded, QuorumUnavailable
from .headers import SUPERSEDED_BY
from .plan import LockPlan

__all__ = ["probe", "replaced", "superseded"]

logger = logging.getLogger("celery_redlock.supersede")


def replaced(task: Any, plan: LockPlan, name: str, ids: Iterable[str], successor: str) -> None:
    """Answer the calls a newer one took out of the queue: REVOKED, naming it."""
    reason = f"{SUPERSEDED_BY}{successor}"
    for id in ids:
        metrics.count("superseded", plan.lock_name)
        logger.info(
            "%s[%s] dropped while waiting in the queue of %s: %s", task.name, id, name, reason
        )
        if not task.ignore_result:
            task.backend.mark_as_revoked(id, reason)


def probe(
    task: Any, plan: LockPlan, name: str, told: Callable[[Lease, str], None]
) -> Callable[[Lease], None]:
    """The heartbeat's probe of a ``supersede`` holder: a call waiting in its key's
    queue (other than the holder) asks the holder to stop; ``told(lease, successor)``
    then sends the signal, once."""

    def look(lease: Lease) -> None:
        try:
            view = plan.redlock.queue_peek(name)
        except QuorumUnavailable:
            return  # the renewal reached a quorum; the next round looks again
        successor = view.next
        if successor is None or successor == lease.task_id or not lease.supersede(successor):
            return
        metrics.count("superseded", plan.lock_name)
        logger.info("%s[%s] asked to stop by task %s", task.name, lease.task_id, successor)
        told(lease, successor)

    return look


def superseded(task: Any, plan: LockPlan, request: Any, exc: LockSuperseded) -> NoReturn:
    """A holder's body let :class:`LockSuperseded` propagate: it ends REVOKED naming
    its successor (raises ``Ignore``; the lock is released and handed over)."""
    reason = f"{SUPERSEDED_BY}{exc.successor}"
    logger.info("%s[%s] stopped: %s", task.name, request.id, reason)
    if request.is_eager:
        raise exc
    if not request.ignore_result:
        task.backend.mark_as_revoked(request.id, reason, request=request)
    raise Ignore(reason)
