"""LockedTask: a Celery task that runs at most once at a time per lock key.

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
   :data:`~celery_redlock.signals.lock_lost` signal is sent.
4. The body gets the lease as ``self.request.redlock`` (or
   :func:`current_lease` in an unbound task), and its fencing token as the
   ``fencing_token`` keyword when ``run`` declares that parameter with a
   default. The token is never written into ``request.kwargs`` or a retry
   message. Usually the acquire itself yields it; when the nodes disagree it
   must be written back in a second round, which waits for the first read
   of ``request.redlock.fencing_token`` if ``run`` does not declare it
   (then cached; that read raises :class:`~celery_redlock.exceptions.LockLost`
   if the lease is gone by then).
5. The lock is released in ``finally``, whatever the outcome: success,
   exception, ``retry()``, ``Ignore``, ``Reject``, soft time limit. If the
   worker process dies, the parent process releases it at once (see
   :mod:`celery_redlock.signals`); if the whole machine dies, the TTL does.

Calling the task function directly (``settle(1, 5)``) is a plain function call:
no lock is taken, and ``fencing_token`` keeps its default. ``.apply()`` and
``task_always_eager`` run through the lock; see :mod:`celery_redlock.policies`
for how the policies behave there.
"""

from __future__ import annotations

import functools
import logging
import sys
from dataclasses import dataclass
from typing import Any

from celery import Task, current_task

from . import conf, heartbeat, metrics, policies
from .exceptions import ConfigurationError, LockLost
from .keys import KeyBuilder
from .redlock import Lease, Redlock, make_owner

__all__ = ["LockedTask", "LockPlan", "current_lease"]

logger = logging.getLogger("celery_redlock.task")


@dataclass(frozen=True)
class LockPlan:
    """Everything a task resolved at bind time to lock its executions."""

    lock_name: str
    settings: conf.LockSettings
    redlock: Redlock
    keys: KeyBuilder
    #: The keyword the fencing token is passed as, or None if ``run`` doesn't take it.
    token_arg: str | None

    def owner(self, request: Any) -> str:
        return make_owner(request.id, request.retries or 0)


class LockedTask(Task):
    """Base class for tasks that must not run concurrently for the same key.

    Options are task attributes (or ``@app.task(...)`` keywords); each
    ``lock_*`` option left as None takes the ``redlock_*`` setting of
    ``app.conf`` (see :mod:`celery_redlock.conf`).
    """

    #: Which arguments make the key: parameter names, dotted paths, a callable,
    #: or ``()`` for one lock per lock name. None: all arguments.
    lock_on: Any = None
    #: Name of the lock (default: the task name). Tasks sharing one exclude each other.
    lock_name: str | None = None
    #: Keyword the fencing token is passed as, when ``run`` declares it with a default.
    lock_token_arg: str | None = "fencing_token"

    #: Setting ``redlock_nodes``.
    lock_nodes: Any = None
    #: Setting ``redlock_ttl``.
    lock_ttl: float | None = None
    #: Setting ``redlock_node_timeout``.
    lock_node_timeout: float | None = None
    #: Setting ``redlock_drift_factor``.
    lock_drift_factor: float | None = None
    #: Setting ``redlock_key_prefix``.
    lock_key_prefix: str | None = None
    #: Setting ``redlock_fencing``.
    lock_fencing: bool | None = None
    #: Setting ``redlock_fence_retention``.
    lock_fence_retention: float | None = None
    #: Setting ``redlock_on_duplicate``: drop, retry, raise or wait.
    lock_on_duplicate: str | None = None
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

    _lock_plan: LockPlan | None = None

    @classmethod
    def on_bound(cls, app: Any) -> None:
        """Resolve and check the lock options; misconfiguration fails here, not at run time."""
        super().on_bound(app)
        if cls.run is Task.run:  # the abstract base itself, or a subclass without a body
            return
        name = cls.name or cls.__name__
        overrides = {s.task_attr: getattr(cls, s.task_attr, None) for s in conf.SETTINGS}
        settings = conf.resolve(app, overrides, owner=name)
        lock_name = cls.lock_name or name
        run = cls.run if _is_plain_function(cls) else functools.partial(cls.run, None)
        keys = KeyBuilder(
            run, cls.lock_on, lock_name=lock_name, token_arg=cls.lock_token_arg, task_name=name
        )
        cls._lock_plan = LockPlan(
            lock_name=lock_name,
            settings=settings,
            redlock=conf.redlock_for(app, settings),
            keys=keys,
            token_arg=_token_arg(keys, cls.lock_token_arg, name),
        )
        _warn_if_cooperative_pool(name)
        from . import signals  # the receivers import this module

        signals.install(app)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        plan = self._lock_plan
        request = self.request
        if plan is None or request.called_directly:
            return self.run(*args, **kwargs)
        name = plan.keys.build(args, kwargs)
        clock = plan.redlock.clock
        started = clock()
        lease = policies.take(self, plan, name, request)
        metrics.observe(clock() - started, plan.lock_name)
        metrics.count("acquired", plan.lock_name)
        try:
            request.redlock = lease
            heartbeat.hold(lease, plan.settings.heartbeat_interval, self._lock_lost)
            if plan.token_arg is not None:
                # This call's own dict (``**kwargs`` always is): request.kwargs stays as sent.
                kwargs[plan.token_arg] = lease.fencing_token
            return self.run(*args, **kwargs)
        finally:
            _release(plan.redlock, lease)

    def _lock_lost(self, lease: Lease) -> None:
        """The heartbeat's ``on_lost``: count it and send the ``lock_lost`` signal."""
        from .signals import lock_lost

        if self._lock_plan is not None:
            metrics.count("lost", self._lock_plan.lock_name)
        lock_lost.send(sender=self, lease=lease)

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


def _release(redlock: Redlock, lease: Lease) -> None:
    # A soft time limit can interrupt the release itself: try once more.
    for _ in range(2):
        try:
            heartbeat.drop(lease)
            redlock.release(lease)
            return
        except Exception:  # noqa: BLE001 - SoftTimeLimitExceeded lands here
            continue


def _is_plain_function(cls: type) -> bool:
    """True when ``run`` takes no ``self`` (a task made from a function without ``bind``)."""
    for klass in cls.__mro__:
        if "run" in klass.__dict__:
            return isinstance(klass.__dict__["run"], staticmethod)
    return False


def _token_arg(keys: KeyBuilder, token_arg: str | None, task_name: str) -> str | None:
    """The token keyword if ``run`` declares it; it must have a default."""
    if not token_arg:
        return None
    param = keys.signature.parameters.get(token_arg)
    if param is None:
        return None
    if param.default is param.empty:
        raise ConfigurationError(
            f"{task_name}: parameter {token_arg!r} receives the fencing token and needs a "
            f"default (e.g. {token_arg}=None), or callers must pass it themselves"
        )
    return token_arg


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
