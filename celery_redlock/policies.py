"""What an execution does when it cannot take its lock.

Contention (another holder has the key; with ``lock_limit`` K, all K permits
are held, or with ``lock_also`` a named limit is full), by ``lock_on_duplicate``
(``retry`` is the natural choice for a limit):

``drop`` (default)
    The duplicate does not run. Its result is stored as ``REVOKED`` with a
    reason naming the holder task, so ``AsyncResult.get()`` raises
    ``TaskRevokedError`` at once instead of waiting for ever. As for a task
    Celery revokes at the worker, a chain stops there and a chord whose header
    holds the call fails at once; a chord holding it deeper (in a chain of its
    header, before the chain's last task, or in a nested chord's header) waits
    for its timeout, as plain Celery's does for such a part. Logged at INFO
    and counted.
``retry``
    The message is published again with a countdown of
    ``min(lock_retry_backoff_max, lock_retry_backoff * 2**n)`` with full jitter.
    It does **not** use the task's own ``max_retries``: the attempt number
    travels in the ``redlock_attempt`` header. After
    ``lock_retry_max_attempts`` it gives up as ``lock_on_exhausted`` says.
``raise``
    The task fails with :class:`~celery_redlock.exceptions.LockContended`
    (holder, seconds left on its lease).
``queue``
    Every call runs, one at a time, in publish order: a call of a held key
    waits in the key's queue, holding no worker slot, until the holder's
    release hands it the key (see :mod:`celery_redlock.queues`).
``supersede``
    The newest call wins: it replaces the calls waiting (REVOKED at once) and
    asks the running one to stop at its next ``check()`` (see
    :mod:`celery_redlock.supersede`).
``wait``
    The worker polls, with jittered backoff, for up to ``lock_wait_timeout``
    seconds, then gives up as ``lock_on_exhausted`` says. It keeps a worker
    slot busy meanwhile; prefer ``retry`` for long waits.

A *copy* is a delivery of a task id (same retry count) that finds the key
held by that very id: a redelivery, or another delivery while the first still
runs. It watches the holder for 1.5 TTL. A first delivery that still runs
keeps renewing its key, and a copy that sees the same holder for that long is
ignored (the work is already running). A holder that died with its worker
process, or a leftover of an attempt that never ran (an acquire that landed
after its release round, a release whose reply was lost), lapses within one
TTL: then the copy takes the key and runs, or, if another task took it
meanwhile, is an ordinary contender and ``lock_on_duplicate`` decides.

A copy, and a message the broker flags as redelivered
(``delivery_info["redelivered"]``), also reads the id's receipt
(``lock_receipt_ttl``): a task id that finished successfully is not run again.
An ignored copy neither runs the body nor stores any state for that id: the
first delivery's result stands. A *new* publish of a finished id (a re-applied
frozen canvas, ``apply_async(task_id=...)``) runs, as in plain Celery, unless
the task sets ``lock_idempotent_ids`` (its id is then an idempotency key and
every delivery reads the receipt).

With enqueue claims (``lock_enqueue``, see :mod:`celery_redlock.enqueue`):

* The execution the key's claim names is the designated next run, never
  dropped for contention: whatever ``lock_on_duplicate`` says, it is
  re-published with backoff (its claim kept alive) until it takes the lock.
* An execution claimed at publish whose claim now names another task (or
  the mark another claimed run left when it started) was replaced: it is
  dropped as superseded, REVOKED with a reason naming its successor. One
  whose claim is gone (it lapsed at ``lock_enqueue_ttl``, or was written on
  other nodes than this worker's) was replaced by nothing: it contends as an
  unclaimed execution, and ``lock_on_duplicate`` decides. A message claimed
  on other nodes or under another key prefix is said at ERROR (the
  ``redlock_claimed_on`` header names where the producer wrote it).
* An execution that was never claimed (``send_task`` by name, a message
  published before the claim) while the claim names another task is a
  duplicate of that task: ``lock_on_duplicate`` decides.

An outage (fewer than a quorum of nodes answer) is never mistaken for
contention and never drops work: the task is retried with the same backoff,
and fails with :class:`~celery_redlock.exceptions.QuorumUnavailable` only once
its attempts are spent. Nodes that cannot heal without a fix are no outage:
the task is kept, without spending attempts (see :mod:`celery_redlock.outage`).

In eager mode (``task_always_eager`` or ``.apply()``) nothing can be
published, so ``retry`` waits like ``wait`` does, an outage raises at once, and
a dropped duplicate fails with ``TaskRevokedError`` (there is no stored state).
An eager call is never a copy and reads no receipt: the caller asked for the
body here and now, so it runs it (or fails with an error), and never returns
a result it did not compute.
"""

from __future__ import annotations

import logging
from typing import Any, NoReturn

from celery.exceptions import Ignore, Retry, TaskRevokedError

from . import enqueue, metrics, outage, queues, rates, republish, tracing
from .core import OWNER_SEP, Claim, Finished, Holder, Lease, RateSlot, TooEarly, full_jitter
from .exceptions import LockContended, QuorumUnavailable
from .headers import ATTEMPT, CLAIM, CLAIMED_ON, SLOT, SUPERSEDED_BY, attempt_of, header
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
    if plan.claims:
        _check_claimed_on(task, plan, request)
    result = _attempt(task, plan, name, request)
    if isinstance(result, Lease):
        return result
    metrics.count("contended", plan.lock_name)
    settings = plan.settings
    if result.task_id == request.id:
        if _is_copy(request, result):
            waited = _watch_copy(task, plan, name, request, result)
        else:
            # An earlier run that called retry() and is letting go, or (eager) a
            # delivery of the id the caller runs here: wait for it to let go.
            eager = request.is_eager and not _is_earlier(request, result)
            limit = settings.ttl * 1.5 if eager else settings.wait_timeout
            waited = _wait(task, plan, name, result, limit)
            if not isinstance(waited, Lease) and waited.task_id == request.id:
                _exhausted(task, plan, name, waited, f"after waiting {limit}s")
        if isinstance(waited, Lease):
            return waited
        result = waited  # another task holds the key now, or none: an ordinary contender
    claimant = result.claimant
    looked = plan.claim_mode(request) or header(request, SLOT)
    if claimant not in (None, request.id) and header(request, CLAIM) == name and looked:
        # Claimed at publish, and the claim names another task now: it was
        # replaced, and never runs its body. A claim that is gone (lapsed, or
        # never written on these nodes) replaced nothing: it contends below.
        metrics.count("superseded", plan.lock_name)
        _drop(task, plan, name, result, reason=f"{SUPERSEDED_BY}{claimant}")
    if claimant is not None and claimant == request.id and settings.enqueue is not None:
        # The designated next run: never dropped for contention.
        if not request.is_eager:
            _republish(task, plan, attempt_of(request), f"designated run of {name!r} waits")
        waited = _wait(task, plan, name, result, settings.wait_timeout)
        if isinstance(waited, Lease):
            return waited
        _exhausted(task, plan, name, waited, f"after waiting {settings.wait_timeout}s")
    policy = settings.on_duplicate
    if plan.queued and not request.is_eager:
        return queues.wait_in_line(task, plan, name, request, result, _drop, _republish, _wait)
    if policy == "retry" and not request.is_eager:
        placed = _place(task, plan, name, request) if rates.applies(plan) else None
        if placed is not None:
            return placed
        _retry(task, plan, name, result)
    if policy in ("wait", "retry") or plan.queued:
        waited = _wait(task, plan, name, result, settings.wait_timeout)
        if isinstance(waited, Lease):
            return waited
        _exhausted(task, plan, name, waited, f"after waiting {settings.wait_timeout}s")
    if policy == "raise":
        _raise(plan, name, result)
    _drop(task, plan, name, result)


def _attempt(
    task: Any,
    plan: LockPlan,
    name: str,
    request: Any,
    copy: bool = False,
    booked_at: float | None = None,
) -> Lease | Holder:
    """One try: the lease or what is in the way. An outage becomes a retry (or,
    once attempts are spent, the error); where the receipt is read (see
    :func:`_reads_receipt`), a receipt of this task id ends it here.

    A rated start is booked in the same round (see :mod:`celery_redlock.rates`):
    one the rate moves back takes no lock now and is re-published for its
    instant; during an outage it waits for a quorum, never starting unbooked."""
    rated = rates.start(task, plan, name, request, booked_at) if rates.applies(plan) else None
    try:
        # A body that takes the token gets it issued before it runs; any other
        # lease has it issued on the first read of lease.fencing_token, if ever.
        result = plan.redlock.try_acquire(
            name,
            ttl=plan.settings.ttl,
            owner=plan.owner(request),
            fence=plan.token_arg is not None,
            task_id=request.id,
            receipts=_reads_receipt(plan, request, copy),
            claim=plan.claim_mode(request),
            own_claim=header(request, CLAIM) == name,
            throttle=plan.settings.throttle,
            slot=header(request, SLOT),
            limit=plan.settings.limit,
            also=plan.also,
            rates=rated.keys if rated is not None else (),
            booked=rated is not None and rated.booked,
        )
    except QuorumUnavailable as exc:
        if not exc.heals and not request.is_eager:  # no outage: kept until it is fixed
            later = outage.unhealed(task, plan, name, exc)
            _republish(task, plan, attempt_of(request), "lock nodes need a fix", later, spend=False)
        if rated is not None:
            rates.unavailable(task, plan, name, request, exc)
        if exc.heals:
            metrics.count("outage", plan.lock_name)
            outage.failed(plan.redlock, exc)  # the nodes' errors, once per outage
        replaced = None if request.is_eager else enqueue.replaced_at_publish(task, request)
        if replaced is not None:  # the call that replaced it said so: nothing to retry
            metrics.count("superseded", plan.lock_name)
            _drop(task, plan, name, None, reason=replaced)
        attempt = attempt_of(request)
        of = plan.settings.retry_max_attempts
        if request.is_eager or attempt >= of:
            if not request.is_eager:
                metrics.count("gave_up", plan.lock_name)
            after = "in eager mode" if request.is_eager else f"after {attempt} retries"
            logger.error(
                "%s[%s]: lock nodes unavailable, giving up on %s %s: %s",
                task.name,
                request.id,
                name,
                after,
                exc,
            )
            raise
        logger.warning(
            "%s[%s]: lock nodes unavailable, retry %d of %d", task.name, request.id, attempt + 1, of
        )
        _republish(
            task, plan, attempt, reason=f"lock nodes unavailable (retry {attempt + 1} of {of})"
        )
    outage.answered(plan.redlock)
    if isinstance(result, RateSlot):  # booked for later: re-published (eager: slept)
        instant = rates.later(task, plan, name, request, result)
        return _attempt(task, plan, name, request, copy, instant)
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


def _check_claimed_on(task: Any, plan: LockPlan, request: Any) -> None:
    """A message claimed on other lock nodes (or under another key prefix) than this
    worker's: said at ERROR, once per pair of places and process. Its claim is not
    seen here, so it runs as an unclaimed message would; nothing is dropped for it."""
    theirs = header(request, CLAIMED_ON)
    if theirs is None or theirs == plan.claimed_on or (theirs, plan.claimed_on) in _told:
        return
    _told.add((theirs, plan.claimed_on))
    logger.error(
        "%s[%s]: claimed on other lock nodes than this worker's: the producer wrote its "
        "claim on %s, this worker looks on %s. Claims are not seen here: such messages "
        "run as unclaimed ones (lock_on_duplicate decides), and duplicates are not kept "
        "out of the queue. Give producers and workers the same redlock_nodes and "
        "redlock_key_prefix.",
        task.name,
        request.id,
        theirs,
        plan.claimed_on,
    )


#: The (producer's, worker's) places of claims said to differ (see _check_claimed_on).
_told: set[tuple[str, str]] = set()


def _place(task: Any, plan: LockPlan, name: str, request: Any) -> Lease | None:
    """A rated start that met the key held tries it again within its booking's grace,
    then books its place in the rate's schedule instead of bouncing (see
    :func:`rates.place`), once here: the lease when it starts here; None when the
    schedule has room sooner, or the key is still held then (the lock's retry)."""
    on, places = rates.booking(request), 0
    while (instant := rates.place(task, plan, name, request, on, places == 0)) is not None:
        result = _attempt(task, plan, name, request, booked_at=instant)
        if isinstance(result, Lease):
            return result
        places += instant != on
        on = instant
    return None


def _is_copy(request: Any, holder: Holder) -> bool:
    """Whether a delivery that finds its own task id holding the key is a copy of
    that holder (same retry count or later): never an eager call, which is no delivery."""
    return not request.is_eager and not _is_earlier(request, holder)


def _is_earlier(request: Any, holder: Holder) -> bool:
    """Whether ``holder`` is an earlier run of the request's task id (before a ``retry()``)."""
    return (holder.retries or 0) < (request.retries or 0)


def _is_redelivery(request: Any) -> bool:
    """Whether the broker flags the message as redelivered (AMQP; kombu's Redis
    transport on restoring an unacked message)."""
    return bool((request.delivery_info or {}).get("redelivered"))


def _reads_receipt(plan: LockPlan, request: Any, copy: bool) -> bool:
    """Only a copy of a task id consults the id's receipt, unless the task treats
    ids as idempotency keys; an eager call never does (it always runs)."""
    settings = plan.settings
    if settings.receipt_ttl <= 0 or request.is_eager:
        return False
    return copy or settings.idempotent_ids or _is_redelivery(request)


def _watch_copy(
    task: Any, plan: LockPlan, name: str, request: Any, holder: Holder
) -> Lease | Holder:
    """A copy of the task id holding the key: the lease once the key is free, or,
    once another task holds it (or none), that holder. Ignored only while the
    holder is proven live or the id's receipt shows up.

    A holder of this id that still runs renews its key; one that died, or the
    leftover of an attempt that never ran, lapses within one TTL of its last
    write. So the same owner value seen for 1.5 TTL is being renewed. Another
    owner value of this id (a further delivery that took the key meanwhile) is
    watched anew from when it shows up.
    """
    redlock = plan.redlock
    settings = plan.settings
    limit = settings.ttl * 1.5
    metrics.count("waited", plan.lock_name)
    tracing.waiting(plan.lock_name, holder, limit)
    watched, since = holder.owner, redlock.clock()
    attempt = 0
    while True:
        base = min(0.05, settings.retry_backoff)
        delay = full_jitter(attempt, base, settings.retry_backoff_max, redlock.rng)
        redlock.sleep(min(delay, max(0.0, since + limit - redlock.clock())))
        attempt += 1
        result = _attempt(task, plan, name, request, copy=True)
        if isinstance(result, Lease):
            return result
        if result.task_id != request.id or not _is_copy(request, result):
            return result
        if result.owner != watched:
            watched, since = result.owner, redlock.clock()
        elif redlock.clock() - since >= limit:
            _ignore(task, plan, "it is a copy of the running task")


def _ignore(task: Any, plan: LockPlan, why: str) -> NoReturn:
    """A copy of a task id that runs or ran: ack it, store nothing, run nothing."""
    request = task.request
    logger.info("%s[%s] not run: %s", task.name, request.id, why)
    metrics.count("copy_ignored", plan.lock_name)
    tracing.outcome("ignored", plan.lock_name, None, None, why)
    raise Ignore(why)


def _drop(
    task: Any,
    plan: LockPlan,
    name: str,
    holder: Holder | None,
    why: str = "",
    reason: str = "",
    logged: bool = False,
) -> NoReturn:
    """Drop the execution: REVOKED with ``reason``; logged at INFO unless ``logged`` already."""
    request = task.request
    if not reason:
        assert holder is not None, "a drop names its holder or its reason"
        reason = f"duplicate of {plan.lock_name!r}: {_who(holder)}"
        if why:
            reason += f" ({why})"
    if not logged:
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
    of = plan.settings.retry_max_attempts
    _republish(
        task, plan, attempt, reason=f"lock {name!r}: {_who(holder)} (retry {attempt + 1} of {of})"
    )


def _republish(
    task: Any, plan: LockPlan, attempt: int, reason: str, countdown: float | None = None, spend=True
) -> NoReturn:
    """Publish the same message again later, without using the task's own retries
    (nor, with ``spend`` False, one of its lock attempts)."""
    settings = plan.settings
    if countdown is None:
        countdown = full_jitter(
            attempt, settings.retry_backoff, settings.retry_backoff_max, plan.redlock.rng
        )
    request = task.request
    headers = {**(request.headers or {}), ATTEMPT: attempt + spend}
    sig = task.signature_from_request(
        request, countdown=countdown, retries=request.retries, headers=headers
    )
    republish.hold(request, sig.apply_async)  # sent once RETRY is stored
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
    """Retry or wait ran out: the work does not run. A task that chose to retry or
    wait chose not to lose it, so this is said at ERROR and counted as ``gave_up``."""
    metrics.count("exhausted", plan.lock_name)
    metrics.count("gave_up", plan.lock_name)
    raising = plan.settings.on_exhausted == "raise"
    logger.error(
        "%s[%s] gave up on lock %s %s: %s; %s",
        task.name,
        task.request.id,
        name,
        after,
        _who(holder, detail=True),
        "failing with LockContended" if raising else "dropped (REVOKED), lock_on_exhausted='drop'",
    )
    if raising:
        _raise(plan, name, holder)
    _drop(task, plan, name, holder, why=f"gave up {after}", logged=True)


def _who(holder: Holder, detail: bool = False) -> str:
    """The holder for people; with ``detail``, where it runs and how long it keeps the key."""
    if holder.owner is None and holder.claimant is not None:
        return f"claimed by task {holder.claimant}"
    who = f"lock held by task {holder.task_id or holder.owner}"
    if detail and holder.owner:
        where = holder.owner.split(OWNER_SEP)
        if len(where) >= 4:
            who += f" on {where[2]} pid {where[3]}"
        if holder.remaining is not None:
            who += f", {holder.remaining:.1f}s left on its lease"
    return who
