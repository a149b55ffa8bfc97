"""LockedTask: a Celery task that runs at most once at a time per lock key
(at most ``lock_limit`` times with permits).

::

    from celery_redlock import LockedTask

    @app.task(base=LockedTask, bind=True, lock_on=("account_id",), lock_on_duplicate="retry")
    def settle(self, account_id, amount, fencing_token=None):
        db.execute(
            "UPDATE accounts SET balance = balance - :amount, fence = :token"
            " WHERE id = :id AND fence < :token",
            amount=amount, token=fencing_token, id=account_id,
        )

How it works, per execution, on the worker:

1. The lock key is derived from the task's ``lock_name`` (default: the task
   name) and the arguments ``lock_on`` selects (see :mod:`celery_redlock.keys`).
2. ``__call__`` takes a Redlock on the key before the body runs. If another
   execution holds it, ``lock_on_duplicate`` decides (see
   :mod:`celery_redlock.policies`): drop, retry, raise or wait.
3. While the body runs, the process's heartbeat thread renews the lease every
   ``lock_heartbeat_interval`` (ttl / 3). If a renewal loses the quorum, the
   lease is marked lost: ``self.request.redlock.lost`` turns True,
   ``check()`` raises :class:`~celery_redlock.exceptions.LockLost`, and the
   :data:`~celery_redlock.signals.lock_lost` signal is sent. Under
   ``lock_on_duplicate="supersede"`` a newer call of the key makes ``check()``
   raise :class:`~celery_redlock.exceptions.LockSuperseded` (a ``LockLost``)
   after the next renewal, and the
   :data:`~celery_redlock.signals.lock_superseded` signal is sent; a body that
   lets it propagate ends REVOKED naming its successor.
4. The body gets the lease as ``self.request.redlock`` (or
   :func:`current_lease` in an unbound task), and its fencing token as the
   ``fencing_token`` keyword when ``run`` declares that parameter with a
   default. The token is never written into ``request.kwargs`` or a retry
   message. Usually the acquire itself yields it (a second round only when
   the nodes disagree). If ``run`` does not declare it, the acquire moves no
   fence value and the token is issued on the first read of
   ``request.redlock.fencing_token`` (one round, then cached; that read
   raises :class:`~celery_redlock.exceptions.LockLost` if the lease is gone
   by then), so a body that never reads it pays nothing for it.
   With ``lock_limit=K`` the lease is one of K permits of the key
   (``self.request.redlock.permit``), with a lease, heartbeat and release of
   its own; with ``lock_also`` the named limits' leases are
   ``self.request.redlock.also``, renewed and released with it (see the
   "Permits" section of :mod:`celery_redlock.redlock`).
5. The lock is released in ``finally``, whatever the outcome: success,
   exception, ``retry()``, ``Ignore``, ``Reject``, soft time limit. If the
   worker process dies, the parent process releases it at once (see
   :mod:`celery_redlock.signals`); if the whole machine dies, the TTL does.

Calling the task directly (``settle(1, 5)``) is Celery's own direct call (the
request, with its ``args``, and ``current_task`` are the task's) and no lock is
taken: ``fencing_token`` keeps its default. ``.apply()`` and
``task_always_eager`` run through the lock; see :mod:`celery_redlock.policies`
for how the policies behave there.
"""

from __future__ import annotations

import logging
import sys
from types import CoroutineType
from typing import Any

from celery import Task, current_task
from celery.exceptions import Ignore, Retry

from . import (
    coroutines,
    enqueue,
    metrics,
    policies,
    queues,
    rates,
    republish,
    signals,
    supersede,
    tracing,
)
from .core import Lease, heartbeat
from .django.base import LockedTaskType
from .exceptions import LockLost, LockSuperseded
from .plan import LockPlan, build_plan, plan_of, set_plan

__all__ = ["LockPlan", "LockedTask", "current_lease"]

logger = logging.getLogger("celery_redlock.task")


class LockedTask(Task, metaclass=LockedTaskType):
    """Base class for tasks that must not run concurrently for the same key.

    Options are task attributes (or ``@app.task(...)`` keywords); each
    ``lock_*`` option left as None takes the ``redlock_*`` setting of
    ``app.conf`` (see :mod:`celery_redlock.conf`). In a Django project it is a
    ``DjangoTask`` too (see :mod:`celery_redlock.django`).
    """

    #: Which arguments make the key: parameter names, dotted paths, a mapping of
    #: them to functions applied first (``{"order_id": int}``), a callable, or
    #: ``()`` for one lock per lock name. None: all arguments.
    lock_on: Any = None
    #: Name of the lock (default: the task name). Tasks sharing one exclude each other.
    lock_name: str | None = None
    #: Keyword the fencing token is passed as, when ``run`` declares it with a default.
    lock_token_arg: str | None = "fencing_token"
    #: Named limits held together with the task's own key, all or nothing:
    #: ``{"payment-api": 4}`` (name: limit), or names (limit 1 each). A name is
    #: the one a task with that ``lock_name`` and ``lock_on=()`` uses, so the
    #: permits are shared with such tasks. Their leases: ``request.redlock.also``.
    lock_also: Any = None

    #: Setting ``redlock_nodes``.
    lock_nodes: Any = None
    #: Setting ``redlock_ttl``.
    lock_ttl: float | None = None
    #: Setting ``redlock_node_timeout``.
    lock_node_timeout: float | None = None
    #: Setting ``redlock_connect_timeout``.
    lock_connect_timeout: float | None = None
    #: Setting ``redlock_drift_factor``.
    lock_drift_factor: float | None = None
    #: Setting ``redlock_key_prefix``.
    lock_key_prefix: str | None = None
    #: Setting ``redlock_fencing``.
    lock_fencing: bool | None = None
    #: Setting ``redlock_fence_retention``.
    lock_fence_retention: float | None = None
    #: Setting ``redlock_limit``: at most this many executions of a key at once
    #: (permits). With ``lock_on=()`` and one ``lock_name`` shared by several
    #: tasks, a named limit across them.
    lock_limit: int | None = None
    #: Setting ``redlock_min_replicas``.
    lock_min_replicas: int | None = None
    #: Setting ``redlock_on_duplicate``: drop, retry, raise, wait or queue.
    lock_on_duplicate: str | None = None
    #: Setting ``redlock_queue_max``: most calls of a key waiting (queue; 0: no bound).
    lock_queue_max: int | None = None
    #: Setting ``redlock_queue_retention``.
    lock_queue_retention: float | None = None
    #: Setting ``redlock_retry_backoff``.
    lock_retry_backoff: float | None = None
    #: Setting ``redlock_retry_backoff_max``.
    lock_retry_backoff_max: float | None = None
    #: Setting ``redlock_retry_max_attempts``.
    lock_retry_max_attempts: int | None = None
    #: Setting ``redlock_wait_timeout``.
    lock_wait_timeout: float | None = None
    #: Setting ``redlock_on_exhausted``: drop or raise.
    lock_on_exhausted: str | None = None
    #: Setting ``redlock_heartbeat_interval``.
    lock_heartbeat_interval: float | None = None
    #: Setting ``redlock_enqueue``: None, until_started or until_finished.
    lock_enqueue: str | None = None
    #: Setting ``redlock_on_enqueued``: return, raise or replace.
    lock_on_enqueued: str | None = None
    #: Setting ``redlock_enqueue_ttl``.
    lock_enqueue_ttl: float | None = None
    #: Setting ``redlock_debounce``.
    lock_debounce: float | None = None
    #: Setting ``redlock_debounce_max``.
    lock_debounce_max: float | None = None
    #: Setting ``redlock_throttle``.
    lock_throttle: float | None = None
    #: Setting ``redlock_throttle_trailing``.
    lock_throttle_trailing: bool | None = None
    #: Setting ``redlock_receipt_ttl`` (0 turns receipts off).
    lock_receipt_ttl: float | None = None
    #: Setting ``redlock_rate``: at most N starts per key per window ("10/s", ...).
    lock_rate: Any = None
    #: Setting ``redlock_rate_burst``.
    lock_rate_burst: int | None = None
    #: Setting ``redlock_idempotent_ids``: a finished task id never runs again.
    lock_idempotent_ids: bool | None = None

    _lock_plan: LockPlan | None = None
    #: Why the task failed to bind, if it did: publishing it raises this again.
    _lock_bind_error: Exception | None = None

    @classmethod
    def on_bound(cls, app: Any) -> None:
        """Resolve and check the lock options; misconfiguration fails here, not at run time.

        An application that catches the error and goes on still cannot publish
        the task: ``delay()``, ``apply_async()`` and ``apply()`` raise it again,
        instead of sending a message for a task no worker can run as configured.
        """
        super().on_bound(app)
        if cls.run is Task.run:  # the abstract base itself, or a subclass without a body
            return
        try:
            plan = build_plan(cls, app)
        except Exception as exc:
            cls._lock_bind_error = exc
            raise
        try:
            coroutines.check(cls, cls.name or cls.__name__)
        except Exception as exc:
            cls._lock_bind_error = exc
            raise
        cls._lock_bind_error = None
        set_plan(cls, plan)
        _warn_if_cooperative_pool(cls.name or cls.__name__)
        signals.install(app)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        request = self.request
        if request.called_directly:  # a plain call: Celery's own, no lock
            return super().__call__(*args, **kwargs)
        plan = plan_of(self)
        if plan is None:
            # A message of a task that failed to bind (another producer sent it):
            # fail with the bind error rather than run it without its lock.
            self._refuse_if_unbound()
            return self.run(*args, **kwargs)
        name = plan.keys.build(args, kwargs)
        watched = queues.is_watch(plan, request)
        if watched:  # a queue's watch runs no body (see celery_redlock.queues)
            queues.watch(self, plan, watched, request)
        clock = plan.redlock.clock
        started = clock()
        lease = policies.take(self, plan, name, request)
        handed = queues.is_handed(plan, name, request)  # handed the key by its queue
        if handed and not queues.started(self, plan, name, request, lease):
            _release(plan, lease, False, False)
            queues.hand_over(plan, name)
            raise Ignore("a queued call that started already, or was superseded")
        waited = clock() - started
        metrics.observe(waited, plan.lock_name)
        metrics.count("acquired", plan.lock_name)
        tracing.acquired(plan.lock_name, lease, waited)
        succeeded = retrying = False
        try:
            request.redlock = lease
            probe = (
                supersede.probe(self, plan, name, self._superseded) if plan.superseding else None
            )
            heartbeat.hold(lease, plan.settings.heartbeat_interval, self._lock_lost, probe)
            if plan.token_arg is not None:
                # This call's own dict (``**kwargs`` always is): request.kwargs stays as sent.
                kwargs[plan.token_arg] = lease.fencing_token
            result = self.run(*args, **kwargs)
            if isinstance(result, CoroutineType):  # an async def body: run it inside the lease
                result = coroutines.run(result, plan.lock_name)
            succeeded = True
            return result
        except Retry:
            retrying = True
            raise
        except LockSuperseded as exc:
            if exc.successor != lease.superseded_by:
                raise  # not this lease's (another task's, re-raised in this body)
            supersede.superseded(self, plan, request, exc)
        finally:
            lost = tracing.ENABLED and lease.lost
            if plan.queued:  # before letting go: no gap; out of the queue, if it still is
                queues.hand_over(plan, name, lease.owner, request.id if handed else "")
            _release(plan, lease, succeeded, retrying, not request.is_eager)
            tracing.released(plan.lock_name, lease, lost)

    def apply_async(
        self, args: Any = None, kwargs: Any = None, task_id: str | None = None, **options: Any
    ) -> Any:
        """Publish, claiming the key first with ``lock_enqueue``, ``lock_debounce`` or
        ``lock_throttle`` (see :mod:`.enqueue`)."""
        self._refuse_if_unbound()
        if republish.take_held_publish(
            self, task_id, lambda: self.apply_async(args, kwargs, task_id=task_id, **options)
        ):
            return self.AsyncResult(task_id)  # self.retry(): sent once RETRY is stored
        plan = plan_of(self)
        if plan is None or self.app.conf.task_always_eager:
            return super().apply_async(args, kwargs, task_id=task_id, **options)
        publishing = enqueue.Publish(
            self, plan, args, kwargs, task_id, options, super().apply_async
        )
        if plan.queued:
            return queues.publish(publishing)
        if plan.claims:
            return enqueue.publish(publishing)
        if rates.applies(plan):  # its start booked at publish (see rates.publish)
            return rates.publish(publishing)
        return super().apply_async(args, kwargs, task_id=task_id, **options)

    def apply(
        self, args: Any = None, kwargs: Any = None, task_id: str | None = None, **options: Any
    ) -> Any:
        """Run eagerly; with ``lock_enqueue`` the claim is held around the call."""
        self._refuse_if_unbound()
        plan = plan_of(self)
        if plan is None or plan.settings.enqueue is None:
            return super().apply(args, kwargs, task_id=task_id, **options)
        return enqueue.run_eagerly(
            enqueue.Publish(self, plan, args, kwargs, task_id, options, super().apply)
        )

    def retry(self, *args: Any, **kwargs: Any) -> Any:
        """Celery's ``retry``; on a worker the new message is published only once the
        RETRY state is stored, so it never lands over the new execution's state (see
        :mod:`.republish`)."""
        plan = plan_of(self)
        if plan is not None and plan.queued:
            queues.leave_line(self.request)  # a retry goes to the back of the queue
        with republish.held(self.request):
            return super().retry(*args, **kwargs)

    def on_retry(self, exc: Any, task_id: str, args: Any, kwargs: Any, einfo: Any) -> None:
        """Called by Celery right after it stored RETRY: publish the held message now.

        A subclass that overrides it should call ``super().on_retry(...)`` (else the
        message goes out when the execution ends, a moment later)."""
        republish.send_held(self.request)
        super().on_retry(exc, task_id, args, kwargs, einfo)

    def _refuse_if_unbound(self) -> None:
        """Raise the error this task failed to bind with, if it did."""
        error = self._lock_bind_error
        if error is not None:
            raise error

    def _lock_lost(self, lease: Lease) -> None:
        """The heartbeat's ``on_lost``: count it and send the ``lock_lost`` signal."""
        plan = plan_of(self)
        if plan is not None:
            metrics.count("lost", plan.lock_name)
        signals.lock_lost.send(sender=self, lease=lease, reason=lease.lost_reason)

    def _superseded(self, lease: Lease, successor: str) -> None:
        """A newer call asked this holder to stop: send the ``lock_superseded`` signal."""
        signals.lock_superseded.send(sender=self, lease=lease, successor=successor)

    @property
    def redlock(self) -> Lease | None:
        """The lease of the running execution (``self.request.redlock``)."""
        return getattr(self.request, "redlock", None)


def current_lease() -> Lease:
    """The lease of the LockedTask execution running in this thread.

    Raises:
        LockLost: no locked execution is running here.
    """
    task = current_task
    lease = getattr(task.request, "redlock", None) if task else None
    if lease is None:
        raise LockLost("no LockedTask execution holds a lock in this thread", "")
    return lease


def _release(
    plan: LockPlan, lease: Lease, succeeded: bool, retrying: bool, early: bool = False
) -> None:
    """Release the lease; in the same round record a success's receipt and, under
    ``until_finished``, withdraw the claim unless the task retries (it keeps it).

    ``early`` (a worker's execution): the release is written to the nodes and
    not waited for (``Redlock.release(wait=False)``), so the result is stored
    while the nodes delete the key; the replies are read by the next round."""
    settings = plan.settings
    receipt = settings.receipt_ttl if succeeded and settings.receipt_ttl else None
    withdraw = settings.enqueue == "until_finished" and not retrying
    # A soft time limit can interrupt the release itself: try once more.
    for _ in range(2):
        try:
            heartbeat.drop(lease)
            plan.redlock.release(lease, receipt=receipt, withdraw_claim=withdraw, wait=not early)
            return
        except Exception:  # noqa: BLE001 - SoftTimeLimitExceeded lands here
            continue


def _warn_if_cooperative_pool(task_name: str) -> None:
    """The heartbeat is a thread: under gevent/eventlet it only runs when the task yields."""
    patched = False
    gevent_monkey = sys.modules.get("gevent.monkey")
    if gevent_monkey is not None and gevent_monkey.is_module_patched("threading"):
        patched = True
    eventlet_patcher = sys.modules.get("eventlet.patcher")
    if eventlet_patcher is not None and eventlet_patcher.is_monkey_patched("thread"):
        patched = True
    if patched:
        logger.warning(
            "%s: threads are green here (gevent/eventlet): the lock heartbeat only runs when "
            "the task yields. Keep lock_ttl above the longest stretch that does not yield, "
            "and protect the resource with the fencing token.",
            task_name,
        )
