"""Lifecycle receivers, and the ``lock_lost`` and ``lock_superseded`` signals.

:func:`install` connects them once per app; a :class:`~celery_redlock.LockedTask`
calls it when it binds, so there is nothing to do by hand.

In each worker process (pool child):

* ``worker_process_shutdown``: stop the heartbeat thread and close connections.
  (After a fork the heartbeat starts empty by itself: it is fork-aware.)

In the worker's main process, where the pool reports children that died:

* ``task_failure`` with ``WorkerLostError`` (the child was killed, e.g. by
  SIGKILL or the OOM killer) or ``TimeLimitExceeded`` (hard time limit), and
  ``task_revoked`` with ``terminated=True``: the lock of that task (with
  ``lock_limit``, its permit, whatever its index; with ``lock_also``, those
  names' permits too) is released at once, matched on the task id in the
  owner value, instead of staying until its TTL. The next execution of the
  key does not wait for it. Its enqueue claim, if it still names that task,
  is withdrawn in the same breath.

In the worker's main process, once the worker is ready:

* ``worker_ready``: one INFO line naming the lock nodes; a single node (the
  broker's Redis when ``redlock_nodes`` is not set) is said to be one. Each
  node is then asked how it is (:data:`START_CHECK_TIMEOUT` to connect and
  answer), and a node that does not answer is asked once more: the nodes that
  fail both are named in a WARNING, with how many more failures the quorum
  now tolerates.

With ``redlock_metrics_port`` set, in the worker's main process:

* ``worker_init`` (before the pool forks): start a
  :class:`~celery_redlock.metrics.Exporter` serving ``/metrics`` on
  ``redlock_metrics_host:redlock_metrics_port`` for the main process and
  every pool child (logged on ``worker_ready``); ``worker_shutdown``: stop it
  and remove its directory.
  Each child tells it that it is gone on ``worker_process_shutdown``.

In each worker process, after every task:

* ``task_postrun``: a LockedTask's retry that ``on_retry`` did not publish
  (storing RETRY failed) is published (see :mod:`celery_redlock.republish`).

And where the worker discards a message (see :mod:`celery_redlock.enqueue`):

* ``task_revoked`` (a revoked or expired message), ``task_rejected`` and
  ``task_unknown``: the enqueue claim the message was published with is
  withdrawn, so a later call is not turned away by a task that will never run.

Receivers never raise: Celery would only log it.
"""

from __future__ import annotations

import functools
import logging
import os
import weakref
from typing import Any

from billiard.exceptions import WorkerLostError
from celery import signals as celery_signals
from celery.exceptions import TimeLimitExceeded
from celery.utils.dispatch import Signal

from . import conf, metrics, queues, republish, startup
from ._format import nodes_text, spare_text
from .core import Redlock, heartbeat
from .core.exceptions import named_once
from .enqueue import withdraw
from .headers import CLAIM, QUEUED, header
from .plan import plan_of

__all__ = ["install", "lock_lost", "lock_superseded"]

logger = logging.getLogger("celery_redlock.signals")

#: Sent (by the heartbeat thread) when a held lease lost its quorum, lapsed, or was
#: freed on the nodes (an operator's release). Arguments: ``sender`` (the task),
#: ``lease``, ``reason`` (why, as the heartbeat's WARNING says it).
lock_lost = Signal(name="lock_lost")

#: Sent (by the heartbeat thread) when a newer call asked a running holder to stop
#: (``lock_on_duplicate="supersede"``). Arguments: ``sender`` (the task), ``lease``,
#: ``successor`` (the newer call's task id).
lock_superseded = Signal(name="lock_superseded")

_installed: weakref.WeakSet = weakref.WeakSet()

#: Seconds each lock node gets, connecting included, to answer the worker's
#: start-up check: well above a node timeout, so a busy host is no false alarm.
START_CHECK_TIMEOUT = 1.0


def install(app: Any) -> None:
    """Connect the receivers for ``app`` (idempotent)."""
    if app in _installed:
        return
    conf.resolve_worker(app)  # a bad redlock_metrics_* value fails at bind, like the rest
    _installed.add(app)
    startup.install(app)  # a worker whose locks cannot work refuses to start
    uid = f"celery_redlock:{id(app)}"
    celery_signals.worker_init.connect(
        functools.partial(_start_metrics, app), weak=False, dispatch_uid=uid + ":metrics"
    )
    celery_signals.worker_shutdown.connect(
        _stop_metrics, weak=False, dispatch_uid="celery_redlock:metrics-stop"
    )
    celery_signals.worker_ready.connect(
        _announce_metrics, weak=False, dispatch_uid="celery_redlock:metrics-ready"
    )
    celery_signals.worker_ready.connect(
        functools.partial(_announce_nodes, app), weak=False, dispatch_uid=uid + ":nodes"
    )
    celery_signals.worker_process_shutdown.connect(
        _process_shutdown, weak=False, dispatch_uid=uid + ":shutdown"
    )
    celery_signals.task_postrun.connect(
        _task_postrun, weak=False, dispatch_uid="celery_redlock:republish"
    )
    celery_signals.task_failure.connect(_task_failure, weak=False, dispatch_uid=uid + ":failure")
    celery_signals.task_revoked.connect(_task_revoked, weak=False, dispatch_uid=uid + ":revoked")
    celery_signals.task_rejected.connect(
        _message_discarded, weak=False, dispatch_uid=uid + ":rejected"
    )
    celery_signals.task_unknown.connect(
        _message_discarded, weak=False, dispatch_uid=uid + ":unknown"
    )


def _process_shutdown(**_: Any) -> None:
    heartbeat.stop()
    exporter = _exporter
    if exporter is not None and _exporter_pid != os.getpid():  # a pool child of its worker
        try:
            exporter.mark_dead(os.getpid())
        except Exception:  # noqa: BLE001 - a receiver must not raise
            pass


# The metrics endpoint of this worker (main process), and the pid that started it:
# pool children inherit both, and must not close it.
_exporter: metrics.Exporter | None = None
_exporter_pid = 0


def _start_metrics(app: Any, sender: Any = None, **_: Any) -> None:
    """``worker_init``: serve ``/metrics`` for this worker if ``redlock_metrics_port`` is set."""
    global _exporter, _exporter_pid
    if getattr(sender, "app", None) is not app or _exporter is not None:
        return
    try:
        values = conf.resolve_worker(app)
        port = values["redlock_metrics_port"]
        if port is None:
            return
        _exporter = metrics.Exporter(port, values["redlock_metrics_host"])
        _exporter_pid = os.getpid()
    except Exception as exc:  # noqa: BLE001 - Celery would only log it, without context
        logger.error("celery_redlock: cannot serve the lock metrics: %s", exc)


def _announce_metrics(**_: Any) -> None:
    """``worker_ready``: log the endpoint (logging is not set up yet on ``worker_init``)."""
    exporter = _exporter
    if exporter is not None and _exporter_pid == os.getpid():
        logger.info(
            "lock metrics of every worker process: http://%s:%d/metrics",
            exporter.host,
            exporter.port,
        )


def _announce_nodes(app: Any, sender: Any = None, **_: Any) -> None:
    """``worker_ready`` (main process, once per worker): the nodes the locks live on.

    One line per node set the app's LockedTasks use (usually one). A single
    node says that it is one: without ``redlock_nodes`` the locks live on the
    broker's Redis alone, convenient but only as safe as that one server.
    """
    if not hasattr(sender, "app") or sender.app is not app:
        return
    try:
        seen: dict[tuple[str, ...], tuple[int, bool, conf.LockSettings]] = {}
        for task in list(app.tasks.values()):
            plan = plan_of(task)
            if plan is None:
                continue
            redlock = plan.redlock
            names = tuple(node.name for node in redlock.nodes)
            from_broker = (names in seen and seen[names][1]) or conf.nodes_from_broker(app, task)
            seen[names] = (redlock.quorum, from_broker, plan.resolved)
    except Exception as exc:  # noqa: BLE001 - a receiver must not raise
        logger.warning("celery_redlock: cannot resolve the lock nodes: %s", exc)
        return
    for names, (quorum, from_broker, settings) in seen.items():
        logger.info("%s", nodes_text(names, quorum, from_broker))
        try:
            _warn_unanswered(settings)
        except Exception as exc:  # noqa: BLE001 - a receiver must not raise
            logger.warning("celery_redlock: cannot check the lock nodes: %s", exc)


def _unanswered(client: Redlock) -> dict[str, str]:
    """Node name -> error of the nodes that do not answer now. A cluster with a shard
    down counts as a node down, as in ``celery redlock nodes``."""
    return {info.lock_node: info.error for info in client.node_info() if info.error is not None}


def _warn_unanswered(settings: conf.LockSettings) -> None:
    """One WARNING naming the nodes that do not answer now, and what that leaves."""
    client = startup.checking_client(settings, START_CHECK_TIMEOUT)
    try:
        down = _unanswered(client)
        if down:  # asked again: a stall of this process or of the host at start is no outage
            again = _unanswered(client)
            down = {name: error for name, error in again.items() if name in down}
        quorum, total = client.quorum, len(client.nodes)
    finally:
        client.close()
    if not down:
        return
    answered = total - len(down)
    leaves = (
        spare_text(answered, quorum)
        if answered >= quorum
        else f"{quorum} needed: no lock can be taken until more answer"
    )
    logger.warning(
        "lock node%s not answering at start: %s; %d of %d answered, %s",
        "s" if len(down) > 1 else "",
        "; ".join(named_once(name, error) for name, error in down.items()),
        answered,
        total,
        leaves,
    )


def _stop_metrics(**_: Any) -> None:
    """``worker_shutdown``: stop the endpoint and remove its directory."""
    global _exporter
    exporter = _exporter
    if exporter is None or _exporter_pid != os.getpid():
        return
    _exporter = None
    try:
        exporter.close()
    except Exception as exc:  # noqa: BLE001 - a receiver must not raise
        logger.warning("celery_redlock: closing the metrics endpoint failed: %s", exc)


def _task_postrun(sender: Any = None, state: str | None = None, **_: Any) -> None:
    """A retry that ``on_retry`` did not publish (see :mod:`celery_redlock.republish`)."""
    request = getattr(sender, "request", None)
    if request is not None:
        republish.send_late(request, state)


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
    if request is None:
        return
    if terminated:
        _release_for_dead(
            sender, request.id, request.args, request.kwargs, why="revoked and terminated"
        )
    else:
        _withdraw(sender, request.id, header(request, CLAIM), "revoked or expired")
        _leave_queue(sender, request.id, header(request, QUEUED))


def _message_discarded(sender: Any = None, message: Any = None, **_: Any) -> None:
    """``task_rejected`` / ``task_unknown``: the consumer dropped a message it cannot run."""
    headers = getattr(message, "headers", None) or {}
    name, task_id = headers.get(CLAIM), headers.get("id")
    if not name or not task_id:
        return
    app = getattr(sender, "app", None)
    if app is None:
        return
    _withdraw(app.tasks.get(headers.get("task")), task_id, name, "message discarded", app=app)


def _withdraw(task: Any, task_id: str, name: str | None, why: str, app: Any = None) -> None:
    """Withdraw the claim ``name`` holds for ``task_id``: through the task's nodes, or the
    app's default nodes when the task is not known here."""
    if not name or not task_id:
        return
    plan = plan_of(task)
    if plan is not None:
        withdraw(plan.redlock, plan.lock_name, name, task_id, why)
        return
    try:
        redlock = conf.redlock_for(app, conf.resolve(app, owner="celery_redlock.signals"))
    except Exception as exc:  # noqa: BLE001 - a receiver must not raise
        logger.warning(
            "could not withdraw the claim of %s for %s (%s): %s", name, task_id, why, exc
        )
        return
    withdraw(redlock, "-", name, task_id, why)


def _release_for_dead(task: Any, task_id: str, args: Any, kwargs: Any, why: str) -> None:
    plan = plan_of(task)
    if plan is None or not task_id:
        return
    try:
        name = plan.keys.build(args or (), kwargs or {})
        freed = plan.redlock.release_owned_by(name, task_id, plan.settings.limit)
        for other, limit in plan.also:
            freed += plan.redlock.release_owned_by(other, task_id, limit)
        if plan.settings.enqueue is not None:
            withdraw(plan.redlock, plan.lock_name, name, task_id, why)
        if plan.queued:
            queues.hand_over(plan, name)  # the next call waiting, now, not at the TTL
    except Exception as exc:  # noqa: BLE001 - a receiver must not raise
        logger.warning(
            "could not release the lock of %s[%s] (%s): %s", task.name, task_id, why, exc
        )
        return
    if freed:
        metrics.count("parent_released", plan.lock_name)
        logger.info("released the lock of %s[%s] on %d nodes: %s", task.name, task_id, freed, why)


def _leave_queue(task: Any, task_id: str, name: str | None) -> None:
    """A call handed its key by the queue, revoked or expired before it started: it
    leaves the queue, its claim is withdrawn, and the key goes to the next call."""
    plan = plan_of(task)
    if not name or plan is None or not plan.queued:
        return
    try:
        plan.redlock.queue_next(name, drop=task_id, retention=plan.settings.queue_retention)
        plan.redlock.withdraw_claim(name, task_id)
    except Exception as exc:  # noqa: BLE001 - a receiver must not raise
        logger.warning("could not take %s out of the queue of %s: %s", task_id, name, exc)
        return
    queues.hand_over(plan, name)
