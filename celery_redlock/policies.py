"""What an execution does when it cannot take its lock.

Contention (another holder has the key; with ``lock_limit`` K, all K permits
are held, or with ``lock_also`` a named limit is full), by ``lock_on_duplicate``
(``retry`` is the natural choice for a limit):

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
renewing, and this copy is ignored (the work is already running); if it died
with its worker process, its lease lapses within one TTL and this copy runs.
A copy of a task id that finished successfully finds its receipt
(``lock_receipt_ttl``) and is ignored. Neither runs the body nor stores any
state for that id: the first delivery's result stands.

With enqueue claims (``lock_enqueue``, see :mod:`celery_redlock.enqueue`):

* The execution the key's claim names is the designated next run, never
  dropped for contention: whatever ``lock_on_duplicate`` says, it is
  re-published with backoff (its claim kept alive) until it takes the lock.
* An execution claimed at publish whose claim now names another task was
  replaced: it is dropped as superseded, REVOKED with a reason naming its
  successor.
* An execution that was never claimed (``send_task`` by name, a message
  published before the claim) while the claim names another task is a
  duplicate of that task: ``lock_on_duplicate`` decides.

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
from typing import Any, NoReturn

from celery.exceptions import Ignore, Retry, TaskRevokedError

from . import metrics, tracing
from .core import Claim, Finished, Holder, Lease, TooEarly, full_jitter
from .exceptions import LockContended, QuorumUnavailable
from .headers import ATTEMPT, CLAIM, SLOT, SUPERSEDED_BY, attempt_of, header
from .plan import LockPlan

__all__ = ["take"]

logger = logging.getLogger("celery_redlock.policies")


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
            _ignore(task, plan, "it is a copy of the running task")
        _exhausted(task, plan, name, waited, f"after waiting {limit}s")
    claimant = result.claimant
    looked = plan.claim_mode(request) or header(request, SLOT)
    if claimant != request.id and header(request, CLAIM) == name and looked:
        # Claimed at publish, and the claim names another task now (or, past
        # its TTL, none): it was replaced. It never runs its body.
        metrics.count("superseded", plan.lock_name)
        reason = f"{SUPERSEDED_BY}{claimant}" if claimant else f"its claim of {name!r} lapsed"
        _drop(task, plan, name, result, reason=reason)
    if claimant is not None and claimant == request.id and settings.enqueue is not None:
        # The designated next run: never dropped for contention.
        if not request.is_eager:
            _republish(task, plan, attempt_of(request), f"designated run of {name!r} waits")
        waited = _wait(task, plan, name, result, settings.wait_timeout)
        if isinstance(waited, Lease):
            return waited
        _exhausted(task, plan, name, waited, f"after waiting {settings.wait_timeout}s")
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
    """One try: the lease or what is in the way. An outage becomes a retry (or,
    once attempts are spent, the error); a receipt of this task id ends it here."""
    try:
        # A body that takes the token gets it written before it runs; any other
        # lease writes it on the first read of lease.fencing_token, if ever.
        result = plan.redlock.try_acquire(
            name,
            ttl=plan.settings.ttl,
            owner=plan.owner(request),
            fence=plan.token_arg is not None,
            task_id=request.id,
            receipts=plan.settings.receipt_ttl > 0,
            claim=plan.claim_mode(request),
            own_claim=header(request, CLAIM) == name,
            throttle=plan.settings.throttle,
            slot=header(request, SLOT),
            limit=plan.settings.limit,
            also=plan.also,
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
    if isinstance(result, Finished):
        _ignore(task, plan, "it already finished successfully")
    if isinstance(result, TooEarly):  # throttled: its period is not over yet
        metrics.count("throttled", plan.lock_name)
        if request.is_eager:
            plan.redlock.sleep(result.wait)
            return _attempt(task, plan, name, request)
        _republish(task, plan, attempt_of(request), "throttled", countdown=result.wait)
    if isinstance(result, Claim):  # the key is free, but claimed for another task
        return Holder(None, result.remaining, result.claimant)
    return result


def _ignore(task: Any, plan: LockPlan, why: str) -> NoReturn:
    """A copy of a task id that runs or ran: ack it, store nothing, run nothing."""
    request = task.request
    logger.info("%s[%s] not run: %s", task.name, request.id, why)
    metrics.count("copy_ignored", plan.lock_name)
    tracing.outcome("ignored", plan.lock_name, None, None, why)
    raise Ignore(why)


def _drop(
    task: Any, plan: LockPlan, name: str, holder: Holder, why: str = "", reason: str = ""
) -> NoReturn:
    request = task.request
    if not reason:
        reason = f"duplicate of {plan.lock_name!r}: {_who(holder)}"
        if why:
            reason += f" ({why})"
    logger.info("%s[%s] dropped: %s", task.name, request.id, reason)
    metrics.count("dropped", plan.lock_name)
    tracing.outcome("dropped", plan.lock_name, name, holder, reason)
    if request.is_eager:  # no message to ack and no stored state: the caller sees the error
        raise TaskRevokedError(reason)
    if not request.ignore_result:
        task.backend.mark_as_revoked(request.id, reason, request=request)
    raise Ignore(reason)


def _raise(plan: LockPlan, name: str, holder: Holder) -> NoReturn:
    metrics.count("raised", plan.lock_name)
    tracing.outcome("raised", plan.lock_name, name, holder)
    raise LockContended(
        f"lock {name!r}: {_who(holder)}"
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
    tracing.outcome("retried", plan.lock_name, name, holder)
    _republish(task, plan, attempt, reason=f"lock {name!r}: {_who(holder)}")


def _republish(
    task: Any, plan: LockPlan, attempt: int, reason: str, countdown: float | None = None
) -> NoReturn:
    """Publish the same message again later, without using the task's own retries."""
    settings = plan.settings
    if countdown is None:
        countdown = full_jitter(
            attempt, settings.retry_backoff, settings.retry_backoff_max, plan.redlock.rng
        )
    request = task.request
    headers = {**(request.headers or {}), ATTEMPT: attempt + 1}
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
    tracing.waiting(plan.lock_name, holder, timeout)
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


def _who(holder: Holder) -> str:
    if holder.owner is None and holder.claimant is not None:
        return f"claimed by task {holder.claimant}"
    return f"lock held by task {holder.task_id or holder.owner}"
