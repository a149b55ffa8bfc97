"""What an execution does when it cannot take its lock.

Contention (another holder has the key), by ``lock_on_duplicate``:

``drop`` (default)
    The duplicate does not run. Its result is stored as ``REVOKED`` with a
    reason naming the holder task, so ``AsyncResult.get()`` raises
    ``TaskRevokedError`` at once instead of waiting for ever, chains stop and
    chords see the failure. Logged at INFO and counted.
``retry``
    The message is published again with a countdown of
    ``min(lock_retry_backoff_max, lock_retry_backoff * 2**n)`` with full jitter.
    It does **not** use the task's own ``max_retries``: the attempt number
    travels in the ``redlock_attempt`` header. After
    ``lock_retry_max_attempts`` it gives up as ``lock_on_exhausted`` says.
``raise``
    The task fails with :class:`~celery_redlock.exceptions.LockContended`
    (holder, seconds left on its lease).
``wait``
    The worker polls, with jittered backoff, for up to ``lock_wait_timeout``
    seconds, then gives up as ``lock_on_exhausted`` says. It keeps a worker
    slot busy meanwhile; prefer ``retry`` for long waits.

A redelivered message (same task id, same retry count) whose first delivery
holds the key waits up to 1.5 TTL: if the first delivery still runs, it keeps
renewing, and this copy is dropped (the work is already running); if it died
with its worker process, its lease lapses within one TTL and this copy runs.

An outage (fewer than a quorum of nodes answer) is never mistaken for
contention and never drops work: the task is retried with the same backoff,
and fails with :class:`~celery_redlock.exceptions.QuorumUnavailable` only once
its attempts are spent.

In eager mode (``task_always_eager`` or ``.apply()``) nothing can be
published, so ``retry`` waits like ``wait`` does, an outage raises at once, and
a dropped duplicate fails with ``TaskRevokedError`` (there is no stored state).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, NoReturn

from celery.exceptions import Ignore, Retry, TaskRevokedError

from . import metrics
from .exceptions import LockContended, QuorumUnavailable
from .redlock import Holder, Lease, full_jitter

if TYPE_CHECKING:  # pragma: no cover
    from .task import LockPlan

__all__ = ["take", "ATTEMPT_HEADER"]

logger = logging.getLogger("celery_redlock.policies")

#: Message header carrying the lock attempt number of a re-published task.
ATTEMPT_HEADER = "redlock_attempt"


def take(task: Any, plan: LockPlan, name: str, request: Any = None) -> Lease:
    """Take ``name`` for the running execution of ``task``, or apply the policy.

    ``request`` is ``task.request``, if the caller has it at hand (reading it
    costs a thread-local lookup).

    Returns the lease, or raises ``Ignore`` (dropped), ``Retry`` (re-published),
    :class:`LockContended` or :class:`QuorumUnavailable`.
    """
    if request is None:
        request = task.request
    result = _attempt(task, plan, name, request)
    if isinstance(result, Lease):
        return result
    metrics.count("contended", plan.lock_name)
    settings = plan.settings
    if result.task_id == request.id:
        # This very task holds it: an earlier run that called retry() and is
        # letting go, or an earlier delivery of this message. That one either
        # still runs (its heartbeat renews it) or died with its worker process
        # (task_reject_on_worker_lost requeues without telling us), and then its
        # lease lapses within one TTL. Waiting tells them apart.
        redelivery = (result.retries or 0) >= (request.retries or 0)
        limit = settings.ttl * 1.5 if redelivery else settings.wait_timeout
        waited = _wait(task, plan, name, result, limit)
        if isinstance(waited, Lease):
            return waited
        if redelivery:
            _drop(task, plan, name, waited, why="is a redelivery of the running task")
        _exhausted(task, plan, name, waited, f"after waiting {limit}s")
    policy = settings.on_duplicate
    if policy == "retry" and not request.is_eager:
        _retry(task, plan, name, result)
    if policy in ("wait", "retry"):
        waited = _wait(task, plan, name, result, settings.wait_timeout)
        if isinstance(waited, Lease):
            return waited
        _exhausted(task, plan, name, waited, f"after waiting {settings.wait_timeout}s")
    if policy == "raise":
        _raise(plan, name, result)
    _drop(task, plan, name, result)


def _attempt(task: Any, plan: LockPlan, name: str, request: Any) -> Lease | Holder:
    """One try; an outage becomes a retry (or, once attempts are spent, the error)."""
    try:
        # A body that takes the token gets it written before it runs; any other
        # lease writes it on the first read of lease.fencing_token, if ever.
        return plan.redlock.try_acquire(
            name,
            ttl=plan.settings.ttl,
            owner=plan.owner(request),
            fence=plan.token_arg is not None,
        )
    except QuorumUnavailable as exc:
        metrics.count("outage", plan.lock_name)
        attempt = attempt_of(request)
        if request.is_eager or attempt >= plan.settings.retry_max_attempts:
            logger.error(
                "%s[%s]: lock service unavailable, giving up: %s", task.name, request.id, exc
            )
            raise
        logger.warning("%s[%s]: lock service unavailable, retrying: %s", task.name, request.id, exc)
        _republish(task, plan, attempt, reason=f"lock service unavailable: {exc}")


def _drop(task: Any, plan: LockPlan, name: str, holder: Holder, why: str = "") -> NoReturn:
    request = task.request
    reason = f"duplicate of {plan.lock_name!r}: lock held by task {holder.task_id or holder.owner}"
    if why:
        reason += f" ({why})"
    logger.info("%s[%s] dropped: %s", task.name, request.id, reason)
    metrics.count("dropped", plan.lock_name)
    if request.is_eager:  # no message to ack and no stored state: the caller sees the error
        raise TaskRevokedError(reason)
    if not request.ignore_result:
        task.backend.mark_as_revoked(request.id, reason, request=request)
    raise Ignore(reason)


def _raise(plan: LockPlan, name: str, holder: Holder) -> NoReturn:
    metrics.count("raised", plan.lock_name)
    raise LockContended(
        f"lock {name!r} is held by task {holder.task_id or holder.owner}"
        + (f" for {holder.remaining:.1f}s more" if holder.remaining is not None else ""),
        name,
        holder.owner,
        holder.remaining,
    )


def _retry(task: Any, plan: LockPlan, name: str, holder: Holder) -> NoReturn:
    attempt = attempt_of(task.request)
    if attempt >= plan.settings.retry_max_attempts:
        _exhausted(task, plan, name, holder, f"after {attempt} retries")
    metrics.count("retried", plan.lock_name)
    _republish(
        task, plan, attempt, reason=f"lock {name!r} held by task {holder.task_id or holder.owner}"
    )


def _republish(task: Any, plan: LockPlan, attempt: int, reason: str) -> NoReturn:
    """Publish the same message again later, without using the task's own retries."""
    settings = plan.settings
    countdown = full_jitter(
        attempt, settings.retry_backoff, settings.retry_backoff_max, plan.redlock.rng
    )
    request = task.request
    headers = {**(request.headers or {}), ATTEMPT_HEADER: attempt + 1}
    sig = task.signature_from_request(
        request, countdown=countdown, retries=request.retries, headers=headers
    )
    sig.apply_async()
    raise Retry(reason, when=countdown, sig=sig)


def _wait(task: Any, plan: LockPlan, name: str, holder: Holder, timeout: float) -> Lease | Holder:
    """Poll with jittered backoff for up to ``timeout`` seconds: the lease, or the last holder."""
    redlock = plan.redlock
    settings = plan.settings
    metrics.count("waited", plan.lock_name)
    request = task.request
    deadline = redlock.clock() + timeout
    attempt = 0
    while True:
        delay = full_jitter(
            attempt, min(0.05, settings.retry_backoff), settings.retry_backoff_max, redlock.rng
        )
        left = deadline - redlock.clock()
        if left <= 0:
            break
        redlock.sleep(min(delay, left))
        result = _attempt(task, plan, name, request)
        if isinstance(result, Lease):
            return result
        holder = result
        attempt += 1
    return holder


def _exhausted(task: Any, plan: LockPlan, name: str, holder: Holder, after: str) -> NoReturn:
    metrics.count("exhausted", plan.lock_name)
    if plan.settings.on_exhausted == "raise":
        _raise(plan, name, holder)
    _drop(task, plan, name, holder, why=f"gave up {after}")


def attempt_of(request: Any) -> int:
    """The lock attempt number carried by the message (0 for a first delivery)."""
    value = getattr(request, ATTEMPT_HEADER, None)
    if value is None:
        value = (request.headers or {}).get(ATTEMPT_HEADER, 0)
    try:
        return int(value)
    except (TypeError, ValueError):
        return 0
