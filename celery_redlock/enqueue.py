"""Enqueue-time claims: a duplicate ``.delay()`` is never queued.

With ``lock_enqueue`` set, ``apply_async`` (so ``.delay()``, signatures and beat
entries) claims the task's key on the quorum before publishing: the claim
names the task id meant to run the key next, for ``lock_enqueue_ttl`` seconds
plus the message's countdown or ETA. A call that finds the key claimed by
another id does what ``lock_on_enqueued`` says:

``return`` (default)
    Nothing is published; the caller gets the ``AsyncResult`` of the claimed
    task. Logged at INFO and counted.
``raise``
    :class:`~celery_redlock.exceptions.AlreadyEnqueued` (``task_id``, ``remaining``).
``replace``
    The new message is published and the claim points at it. The message it
    replaced is dropped as superseded when it reaches a worker (REVOKED, with
    a reason naming its successor): the newest arguments win.

The claim lasts until the claimed execution takes the run lock
(``until_started``: one running, one waiting) or ends (``until_finished``: one
in the system, queued or running). It is withdrawn when publishing fails, when
a worker discards the message (revoked, expired, rejected, unknown), and when
a worker process dies under it (see :mod:`celery_redlock.signals`); a message
lost without a trace leaves a claim that lapses at its TTL. A message still
queued when its claim lapses was replaced by nothing: it runs, as an unclaimed
execution (see :mod:`celery_redlock.policies`). The ``redlock_claimed_on``
header says where the claim was written, so a worker on other nodes says so
at ERROR rather than dropping anything.

A re-publish of the same task id (``self.retry()``, and the lock's own
contention retries) is always published, and keeps the claim: its TTL is
raised to cover the new countdown (a renewal the nodes do not answer leaves
the claim as it was). Under ``until_started`` a task's own
``self.retry()`` comes after its start, so it neither re-claims nor is held
back by the claim of the task waiting behind it.

Messages that are part of a canvas (a group or chord member, a chain, a task
with ``link``/``link_error`` callbacks) are published without a claim: the
canvas waits for their very ids, so returning another task's result would
break it. Their executions still honour the claim of the key at the worker.

When the quorum cannot be reached the message is published anyway (the run
lock still guards its execution), logged at WARNING and counted: an outage
never loses work.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any, NamedTuple

from celery import states
from kombu.utils.uuid import uuid

from . import metrics
from .core import Claim, Redlock, full_jitter
from .exceptions import AlreadyEnqueued, QuorumUnavailable
from .headers import ATTEMPT, CLAIM, CLAIMED_ON, SLOT, SUPERSEDED_BY, header
from .plan import LockPlan

__all__ = [
    "Publish",
    "in_canvas",
    "publish",
    "replaced_at_publish",
    "result_of",
    "run_eagerly",
    "superseded_by",
    "withdraw",
]

logger = logging.getLogger("celery_redlock.enqueue")

#: Options that make a message part of a canvas (see the module docstring).
_CANVAS = ("group_id", "chord", "chain", "link", "link_error")

#: Attempts at a claim while concurrent callers split the nodes between them.
_SPLIT_ATTEMPTS = 20


class Publish(NamedTuple):
    """One ``apply_async`` (or eager ``apply``) of a locked task, as the task received
    it; ``send`` is Celery's own, which publishes (or runs) it as it is."""

    task: Any
    plan: LockPlan
    args: Any
    kwargs: Any
    task_id: str | None
    options: dict[str, Any]
    send: Callable[..., Any]


def publish(call: Publish) -> Any:
    """``apply_async`` with the enqueue claim; ``send`` is the plain ``apply_async``."""
    task, plan, args, kwargs, task_id, options, send = call
    settings = plan.settings
    if in_canvas(options):
        return send(args, kwargs, task_id=task_id, **options)
    name = plan.keys.build(args or (), kwargs or {})
    task_id = task_id or uuid()
    headers = dict(options.pop("headers", None) or {})
    if plan.coalesce and _is_republish(headers, options):
        return send(args, kwargs, task_id=task_id, headers=headers, **options)
    if plan.coalesce:
        return _coalesce(call, name, task_id, headers)
    ttl = settings.enqueue_ttl + _delay(options, task.app)
    if _is_republish(headers, options):
        if settings.enqueue == "until_finished" or not options.get("retries"):
            _claim(task, plan, name, task_id, ttl)  # the claim follows its task id
        return send(args, kwargs, task_id=task_id, headers=headers, **options)
    claim = _claim(task, plan, name, task_id, ttl, replace=settings.on_enqueued == "replace")
    if claim is not None:
        if claim.claimant != task_id:
            return _already(task, plan, name, claim)
        if claim.renewed:  # this very id is already claimed: its message is on its way
            return task.AsyncResult(task_id)
        headers[CLAIM], headers[CLAIMED_ON] = name, plan.claimed_on
    try:
        result = send(args, kwargs, task_id=task_id, headers=headers, **options)
    except BaseException:
        if claim is not None:
            withdraw(plan.redlock, plan.lock_name, name, task_id, "publishing failed")
        raise
    if claim is not None and claim.previous:
        _replaced(task, plan, name, claim.previous, task_id)
    return result


def run_eagerly(call: Publish) -> Any:
    """``apply`` (eager mode) with the claim taken before the call and withdrawn after it."""
    task, plan, args, kwargs, task_id, options, run = call
    headers = options.get("headers") or {}
    if _is_republish(headers, options) or in_canvas(options):
        return run(args, kwargs, task_id=task_id, **options)
    name = plan.keys.build(args or (), kwargs or {})
    task_id = task_id or uuid()
    replace = plan.settings.on_enqueued == "replace"
    claim = _claim(task, plan, name, task_id, plan.settings.enqueue_ttl, replace=replace)
    if claim is not None and claim.claimant != task_id:
        return _already(task, plan, name, claim)
    try:
        return run(args, kwargs, task_id=task_id, **options)
    finally:
        if claim is not None:
            withdraw(plan.redlock, plan.lock_name, name, task_id, "")


def _coalesce(call: Publish, name: str, task_id: str, headers: dict) -> Any:
    """Publish a debounced or throttled call (``task_id``, its ``headers``) at the time
    its key's schedule says."""
    task, plan, args, kwargs, _, options, send = call
    settings = plan.settings
    redlock = plan.redlock
    delay = _delay(options, task.app)  # a caller's own countdown or ETA is a floor
    try:
        if settings.debounce is not None:
            schedule = redlock.debounce(
                name,
                task_id,
                delay=settings.debounce,
                max_delay=settings.debounce_max,
                ttl=settings.enqueue_ttl,
            )
        else:
            assert settings.throttle is not None  # plan.coalesce is one or the other
            schedule = redlock.throttle(
                name,
                task_id,
                period=settings.throttle,
                trailing=settings.throttle_trailing,
                ttl=settings.enqueue_ttl,
            )
    except QuorumUnavailable as exc:
        metrics.count("enqueue_outage", plan.lock_name)
        logger.warning(
            "%s[%s]: could not plan %s (%s); publishing without a claim, the run lock "
            "still guards its execution",
            task.name,
            task_id,
            name,
            exc,
        )
        options["countdown"] = max(delay, settings.debounce or 0.0)
        options.pop("eta", None)
        return send(args, kwargs, task_id=task_id, headers=headers, **options)
    if schedule.kind == "dropped":
        metrics.count("throttled", plan.lock_name)
        logger.info("%s[%s]: dropped inside the throttle period of %s", task.name, task_id, name)
        if not task.ignore_result:
            task.backend.mark_as_revoked(
                task_id, f"throttled: {name} ran less than {settings.throttle}s ago"
            )
        return task.AsyncResult(schedule.other or task_id)
    options["countdown"] = max(delay, schedule.due - time.time())
    options.pop("eta", None)
    claimed = schedule.kind == "later" and settings.debounce is not None
    headers[CLAIM], headers[CLAIMED_ON] = name, plan.claimed_on
    if schedule.slot is not None and settings.throttle is not None:
        headers[SLOT] = schedule.slot
    try:
        result = send(args, kwargs, task_id=task_id, headers=headers, **options)
    except BaseException:
        if claimed:
            withdraw(redlock, plan.lock_name, name, task_id, "publishing failed")
        raise
    if schedule.other and schedule.kind == "later":
        _replaced(task, plan, name, schedule.other, task_id)
    return result


def withdraw(redlock: Redlock, lock_name: str, name: str, task_id: str, why: str) -> None:
    """Withdraw the claim of ``name`` if it names ``task_id``. Never raises."""
    try:
        withdrawn = redlock.withdraw_claim(name, task_id)
    except Exception as exc:  # noqa: BLE001 - the claim's TTL is the backstop
        logger.warning(
            "could not withdraw the claim of %s for %s (%s): %s", name, task_id, why, exc
        )
        return
    if withdrawn and why:
        metrics.count("claim_withdrawn", lock_name)
        logger.info("withdrew the claim of %s for task %s: %s", name, task_id, why)


def _claim(
    task: Any, plan: LockPlan, name: str, task_id: str, ttl: float, replace: bool = False
) -> Claim | None:
    """The claim as the quorum settles it; None when the quorum cannot be reached."""
    redlock = plan.redlock
    try:
        for attempt in range(_SPLIT_ATTEMPTS):
            claim = redlock.claim_next(name, task_id, ttl=ttl, replace=replace)
            if claim.claimant is not None:
                metrics.count(
                    "claimed" if claim.claimant == task_id else "enqueued_found", plan.lock_name
                )
                return claim
            # Concurrent callers split the nodes: each withdrew; try again, jittered.
            redlock.sleep(full_jitter(attempt, 0.002, 0.05, redlock.rng))
        raise QuorumUnavailable({"claim": f"no claimant won a quorum of {name}"}, 0, 0)
    except QuorumUnavailable as exc:
        metrics.count("enqueue_outage", plan.lock_name)
        logger.warning(
            "%s[%s]: could not claim %s (%s); publishing without a claim, the run lock "
            "still guards its execution",
            task.name,
            task_id,
            name,
            exc,
        )
        return None


def _already(task: Any, plan: LockPlan, name: str, claim: Claim) -> Any:
    assert claim.claimant is not None
    if plan.settings.on_enqueued == "raise":
        metrics.count("enqueue_raised", plan.lock_name)
        raise AlreadyEnqueued(
            f"{task.name}: task {claim.claimant} is already enqueued for {name}"
            + (f" (claim {claim.remaining:.1f}s more)" if claim.remaining is not None else ""),
            name,
            claim.claimant,
            claim.remaining,
        )
    metrics.count("enqueue_returned", plan.lock_name)
    logger.info(
        "%s: not enqueued, task %s is already on its way for %s", task.name, claim.claimant, name
    )
    return task.AsyncResult(claim.claimant)


def _replaced(task: Any, plan: LockPlan, name: str, previous: str, successor: str) -> None:
    """``previous`` lost the claim to ``successor``: under ``until_started`` it has not
    started (its start would have withdrawn the claim on a quorum), so its result can
    say at once that it was superseded; its message is dropped when it reaches a worker."""
    metrics.count("replaced", plan.lock_name)
    logger.info("%s[%s] replaces %s as the next run of %s", task.name, successor, previous, name)
    if plan.settings.enqueue != "until_finished" and not task.ignore_result:
        task.backend.mark_as_revoked(previous, SUPERSEDED_BY + successor)


def replaced_at_publish(task: Any, request: Any) -> str | None:
    """The reason a later call stored for this one as it replaced it at publish
    (REVOKED, "superseded by task <id>"), if one did. A worker that finds no
    quorum drops such a message on it instead of retrying a call that is not to
    run, whose RETRY would land over the REVOKED. None where the call took no
    claim at publish, nothing says so, or the result backend cannot be read."""
    if task.ignore_result or not header(request, CLAIM):
        return None
    try:
        meta = task.backend.get_task_meta(request.id, cache=False)
    except Exception:  # noqa: BLE001 - unread: the outage's retry goes on
        return None
    return _superseded_reason(meta.get("status"), meta.get("result")) or None


def _superseded_reason(state: str | None, result: Any) -> str:
    """A stored REVOKED's "superseded by task <id>", else ""."""
    text = str(result) if state == states.REVOKED else ""
    return text if text.startswith(SUPERSEDED_BY) else ""


def superseded_by(result: Any) -> Any:
    """The ``AsyncResult`` of the execution that ran in place of a superseded call.

    Follows a chain of replacements (``lock_on_enqueued="replace"``, debounce,
    throttle) to its end: the last task that was not itself superseded. None
    for a call that was not superseded. Reads the result backend.
    """
    successor = None
    seen = set()
    while result.id not in seen:
        seen.add(result.id)
        text = _superseded_reason(result.state, result.result)
        if not text:
            return successor
        successor = result = type(result)(text[len(SUPERSEDED_BY) :].split()[0], app=result.app)
    return successor


def result_of(result: Any) -> Any:
    """The ``AsyncResult`` to wait on for a call: the run that replaced it, or itself.

    A call that was debounced, throttled or replaced (``lock_on_enqueued=
    "replace"``) never runs: its own result is REVOKED with ``"superseded by
    task <id>"``, so its ``.get()`` raises ``TaskRevokedError``. This follows
    that chain of replacements (as :func:`superseded_by` does) to the run that
    did the work, so that ``result_of(rebuild_index.delay("docs")).get()``
    returns what that run returned, whichever call of the burst it was::

        from celery_redlock import result_of

        result = result_of(rebuild_index.delay("docs"))
        result.get(timeout=30)   # the value of the run of the burst

    A call that was not superseded is returned as is. Its successor is known
    only once it was superseded: call this when the burst is over (a debounced
    call is replaced up to ``lock_debounce`` after it was made), or again on
    the result it returns. Reads the result backend; needs one that stores
    REVOKED states (any backend, unless the task has ``ignore_result``).
    """
    return superseded_by(result) or result


def in_canvas(options: dict[str, Any]) -> bool:
    """Whether a call's options make it part of a canvas: published without a claim."""
    return any(options.get(option) for option in _CANVAS)


def _is_republish(headers: dict, options: dict) -> bool:
    """A re-publish of a task id that already ran: ``self.retry()`` or a lock retry."""
    return ATTEMPT in headers or bool(options.get("retries"))


def _delay(options: dict[str, Any], app: Any) -> float:
    """Seconds until the message is due (its countdown or ETA), 0 when it is due now."""
    countdown = options.get("countdown")
    if countdown:
        return max(0.0, float(countdown))
    eta = options.get("eta")
    if isinstance(eta, str):
        eta = datetime.fromisoformat(eta)
    if isinstance(eta, datetime):
        now = datetime.now(eta.tzinfo or timezone.utc) if eta.tzinfo else datetime.now()
        return max(0.0, (eta - now).total_seconds())
    return 0.0
