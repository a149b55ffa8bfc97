"""What a call does under ``lock_on_duplicate="queue"``: it waits its turn.

Every call of a key runs, one at a time (``lock_limit`` K: K at a time), in
publish order: the order the calls' claims on the key reached it (for one
producer, the order it published them).

* ``apply_async`` **parks** the call: its message (the signature, with its
  task id, arguments and options) is written to the key's queue on a quorum
  of the lock nodes, behind every call parked before it (its ticket is its
  place: see :mod:`celery_redlock.core.queues`), and nothing is sent to the
  broker yet; then, if the key is free and no hand-over is pending, the key is
  handed to the first call waiting, which is published. So the broker holds
  at most K runnable messages of a key, and one key's backlog never delays
  another key's calls by more than the work already running.
* A message that reaches a worker without having been parked (sent by name
  with ``send_task``, with a countdown or ETA, a canvas part, a call published
  while no quorum answered) and finds its key held parks there: the same
  write, and only then does the execution end, storing no state (``Ignore``).
  Either way a waiting call holds no worker slot, sends nothing to the broker
  while it waits, and its result stays PENDING. If no quorum answers, the
  worker re-publishes it with the lock's backoff instead, as any outage: it
  is never acknowledged before it is parked.
* When a holder lets go (whatever the body's outcome, ``retry()`` included),
  it first **hands the key over**: in one round on the quorum, the key's
  claim is pointed at the first call waiting, and that call's message is
  published again (header ``redlock_queued``), with its own task id. Its
  acquire honours the claim, so a call arriving meanwhile parks behind it.
  Once it holds the key it takes itself out of the queue.
* A holder whose worker process dies is released by the worker's main process
  at once, which hands the key over the same way (see
  :mod:`celery_redlock.signals`). A holder whose whole worker dies leaves its
  key to lapse at its TTL: the next call of the key that parks, or the next
  holder's release, hands it over then.
* A call handed the key that finds it held anyway (the holder is still letting
  go, a ``lock_also`` limit is full, a call took the key in the gap) keeps its
  place: it polls for the key up to :data:`HANDED_WAIT`, then is re-published
  with the lock's backoff, its claim standing, until it starts.
* ``lock_queue_max`` N: a call that finds N calls already waiting is answered
  at once as REVOKED, with a reason naming the queue.

``self.retry()`` from a queued body goes to the back: the retried message is
a new arrival and parks behind the calls waiting. In eager mode nothing can be
published: ``queue`` waits as ``wait`` does.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, NoReturn

from celery.exceptions import Ignore
from kombu.utils import json, uuid

from . import metrics, supersede
from .core import HandOver, Holder, Lease
from .enqueue import Publish, in_canvas
from .exceptions import QuorumUnavailable
from .headers import ATTEMPT, PARKED_AT, QUEUE_WATCH, QUEUED, attempt_of, header
from .plan import LockPlan

__all__ = [
    "HANDED_WAIT",
    "WATCH_TTLS",
    "hand_over",
    "is_handed",
    "is_watch",
    "leave_line",
    "publish",
    "started",
    "status",
    "wait_in_line",
    "watch",
]

logger = logging.getLogger("celery_redlock.queues")

#: Lock TTLs a watch waits before it looks at its key (see the module docstring).
WATCH_TTLS = 1.5
#: Seconds a handed call that finds its key still held polls for it before it is
#: re-published: the holder hands over just before it lets go.
HANDED_WAIT = 0.5


def publish(call: Publish) -> Any:
    """``apply_async`` of a queued task: the call parks in its key's queue (its
    ticket is its place in publish order) and is published when the key is
    handed to it, at once if the key is free. ``send`` is the plain ``apply_async``.

    Sent as it is (the worker parks it if its key is held when it arrives): a
    message the queue handed over or the lock re-publishes, a call with a
    countdown or ETA (it takes its place when due), a canvas part, and any call
    while no quorum answers (logged at WARNING)."""
    task, plan, args, kwargs, task_id, options, send = call
    headers = options.get("headers") or {}
    plain = options.get("countdown") or options.get("eta") or in_canvas(options)
    if plain or QUEUED in headers or ATTEMPT in headers or QUEUE_WATCH in headers:
        return send(args, kwargs, task_id=task_id, **options)
    name = plan.keys.build(args or (), kwargs or {})
    task_id = task_id or uuid()
    now = time.time()
    marked = {**headers, QUEUED: name, PARKED_AT: now}
    sig = task.signature(args, kwargs, **{**options, "task_id": task_id, "headers": marked})
    entry = json.dumps({"sig": dict(sig), "at": now})
    settings = plan.settings
    try:
        parked = plan.redlock.park(
            name,
            task_id,
            entry,
            most=settings.queue_max,
            retention=settings.queue_retention,
            supersede=plan.superseding,
        )
    except QuorumUnavailable as exc:
        logger.warning("%s[%s]: not parked in the queue of %s: %s", task.name, task_id, name, exc)
        return send(args, kwargs, task_id=task_id, **options)
    if not parked.parked:
        metrics.count("queue_full", plan.lock_name)
        reason = _full(name, parked.waiting, settings.queue_max)
        logger.info("%s[%s] not queued: %s", task.name, task_id, reason)
        if not options.get("ignore_result", task.ignore_result):
            task.backend.mark_as_revoked(task_id, reason)
        return task.AsyncResult(task_id)
    metrics.count("queued", plan.lock_name)
    supersede.replaced(task, plan, name, parked.superseded, task_id)
    _arm(plan, name, sig, hand_over(plan, name))
    return task.AsyncResult(task_id)


def _full(name: str, waiting: int, most: int) -> str:
    """The REVOKED reason of a call a full queue turned away."""
    return f"queue of {name!r} is full: {waiting} calls wait (lock_queue_max={most})"


def is_handed(plan: LockPlan, name: str, request: Any) -> bool:
    """Whether this delivery was handed ``name`` by its queue (it takes the key's claim)."""
    return plan.queued and header(request, QUEUED) == name


def wait_in_line(
    task: Any,
    plan: LockPlan,
    name: str,
    request: Any,
    holder: Holder,
    drop: Callable[..., NoReturn],
    republish: Callable[..., NoReturn],
    wait: Callable[..., Lease | Holder],
) -> Lease:
    """A call of a held key: parked in the key's queue (raises ``Ignore``), answered
    REVOKED when the queue is full (``drop``), or, handed the key but still kept
    out, waits up to :data:`HANDED_WAIT` for it (``wait``: the holder that handed
    it over is letting go), then is re-published with the lock's backoff
    (``republish``). Returns the lease only in that last case."""
    settings = plan.settings
    attempt = attempt_of(request)
    if is_handed(plan, name, request):  # it keeps its place: the claim stands for it
        waited = wait(task, plan, name, holder, HANDED_WAIT)
        if isinstance(waited, Lease):
            return waited
        republish(task, plan, attempt, f"queue of {name!r}: handed the key, still held")
    call = json.dumps({"sig": dict(_signature(task, request, name)), "at": time.time()})
    try:
        parked = plan.redlock.park(
            name,
            request.id,
            call,
            most=settings.queue_max,
            retention=settings.queue_retention,
            supersede=plan.superseding,
        )
    except QuorumUnavailable as exc:
        metrics.count("outage", plan.lock_name)
        republish(task, plan, attempt, f"queue of {name!r}: not parked, {exc}")
    if not parked.parked:
        metrics.count("queue_full", plan.lock_name)
        drop(
            task,
            plan,
            name,
            holder,
            reason=_full(name, parked.waiting, settings.queue_max),
        )
    metrics.count("queued", plan.lock_name)
    supersede.replaced(task, plan, name, parked.superseded, request.id)
    logger.info(
        "%s[%s] waits in the queue of %s, place %d", task.name, request.id, name, parked.position
    )
    # The holder may have let go between this call's acquire and its park, and
    # found nobody to hand the key to: hand it over now.
    _arm(plan, name, _signature(task, request, name), hand_over(plan, name))
    raise Ignore(f"waits in the queue of {name!r}")


def started(task: Any, plan: LockPlan, name: str, request: Any, lease: Lease) -> bool:
    """A handed call that took its key: take it out of the queue (and, with permits,
    hand another free one over). False when it was not in the queue on a quorum:
    a copy of a call that already started (a hand-over published twice), which
    must not run again."""
    try:
        handed = plan.redlock.queue_next(
            name,
            limit=plan.settings.limit,
            drop=request.id,
            claim_ttl=plan.settings.enqueue_ttl,
            retention=plan.settings.queue_retention,
        )
    except QuorumUnavailable as exc:
        logger.warning("%s[%s]: queue of %s not updated: %s", task.name, request.id, name, exc)
        return True  # it started; its release takes it out of the queue
    _dispatch(plan, name, handed)
    parked_at = header(request, PARKED_AT)
    if isinstance(parked_at, (int, float)):
        metrics.observe_queue_wait(max(0.0, time.time() - parked_at), plan.lock_name)
    return handed.removed >= plan.redlock.quorum


def hand_over(plan: LockPlan, name: str, owner: str = "", drop: str = "") -> HandOver | None:
    """Hand ``name`` to the first call waiting, if a lock key of it is free (``owner``'s
    counts as free: a holder about to let go), once ``drop`` (a holder's own id) is
    out of the queue. Never raises: a hand-over that fails is made by the next
    park, release or watch (None then)."""
    settings = plan.settings
    try:
        handed = plan.redlock.queue_next(
            name,
            limit=settings.limit,
            drop=drop,
            owner=owner,
            claim_ttl=settings.enqueue_ttl,
            retention=settings.queue_retention,
        )
    except Exception as exc:  # noqa: BLE001 - the lock's release must go on
        logger.warning("queue of %s not handed over: %s", name, exc)
        return None
    if handed.state == "":  # no quorum agrees (see HandOver.state)
        logger.info("queue of %s not handed over: the nodes agree on no call; a watch tries", name)
    _dispatch(plan, name, handed)
    return handed


def leave_line(request: Any) -> None:
    """``self.retry()`` of a handed call: its retry is a new arrival, which goes to
    the back of the queue, so the message loses the hand-over's headers."""
    for name in (QUEUED, PARKED_AT):
        if getattr(request, name, None) is not None:
            setattr(request, name, None)
        if request.headers and name in request.headers:
            request.headers = {k: v for k, v in request.headers.items() if k != name}


def is_watch(plan: LockPlan, request: Any) -> str | None:
    """The key this delivery watches, if it is a queue's watch (see the module docstring)."""
    if not plan.queued:
        return None
    return header(request, QUEUE_WATCH)


def watch(task: Any, plan: LockPlan, name: str, request: Any) -> NoReturn:
    """A watch of ``name``'s queue: hand the key over if it is free (its holder died
    with its worker), and send itself again while calls may wait. Runs no body
    and stores no state (raises ``Ignore``)."""
    handed = hand_over(plan, name)
    sig = task.signature_from_request(request, retries=request.retries)
    _arm(plan, name, sig, handed, request.id)
    raise Ignore(f"watched the queue of {name!r}")


def _behind(handed: HandOver | None) -> bool:
    """Whether calls may wait behind a holder or a hand-over (a watch has work to do):
    also when the hand-over failed (None) or the nodes agreed on nothing (a node
    restarted empty, another that did not answer), since only a quorum's
    "empty", or the last call handed, says that nobody is left to hand the key to."""
    if handed is None or handed.state in ("held", "pending", ""):
        return True
    return handed.state == "handed" and handed.waiting > 1


def _arm(
    plan: LockPlan, name: str, sig: Any, handed: HandOver | None, watch_id: str | None = None
) -> None:
    """Send a watch of ``name`` due :data:`WATCH_TTLS` TTLs from now, when calls may
    wait behind a holder or a hand-over and the key has no watch yet (or it is
    ``watch_id``'s: a watch sending itself again). Never raises."""
    if not _behind(handed):
        return
    ttl = plan.settings.ttl
    countdown = ttl * WATCH_TTLS
    watch_id = watch_id or uuid()
    try:
        if not plan.redlock.claim(f"qwatch:{name}", watch_id, ttl=countdown + ttl):
            return  # the key has a watch
        options = sig.options
        headers = {k: v for k, v in (options.get("headers") or {}).items() if k != QUEUED}
        sig.clone().apply_async(
            task_id=watch_id, headers={**headers, QUEUE_WATCH: name}, countdown=countdown
        )
    except Exception as exc:  # noqa: BLE001 - the next park arms one
        logger.warning("queue of %s: no watch sent: %s", name, exc)


def _dispatch(plan: LockPlan, name: str, handed: HandOver) -> None:
    """Publish the call the key was handed to."""
    if handed.id is None:
        return
    try:
        sig = plan.app.signature(json.loads(handed.call)["sig"])
        sig.apply_async()
    except Exception as exc:  # noqa: BLE001 - its claim lapses, and it is handed again
        logger.error(
            "queue of %s: could not publish %s, handed the key (%s); it is handed again "
            "once its claim lapses (lock_enqueue_ttl)",
            name,
            handed.id,
            exc,
        )
        return
    metrics.count("handed_over", plan.lock_name)
    logger.debug("queue of %s: handed to %s (%d waiting)", name, handed.id, handed.waiting)


def _signature(task: Any, request: Any, name: str) -> Any:
    """The message that starts this call again: Celery's own for a retry, with its
    lock attempt kept and the ``redlock_queued`` header naming the key."""
    headers = {
        **(request.headers or {}),
        ATTEMPT: attempt_of(request),
        QUEUED: name,
        PARKED_AT: time.time(),
    }
    return task.signature_from_request(request, retries=request.retries, headers=headers)


# -- celery redlock status -----------------------------------------------------


def status(client: Any, settings: Any, name: str) -> tuple[list, Any]:
    """What ``celery redlock status`` shows of a queued key (``queue``, ``supersede``):
    table rows and a JSON value; none for another policy. ``client`` a Redlock."""
    if settings.on_duplicate not in ("queue", "supersede"):
        return [], None
    try:
        view = client.queue_peek(name)
        pending = client.claimant(name)
    except QuorumUnavailable as exc:
        return [["Queue:", f"unknown: {exc}"]], {"error": str(exc)}
    oldest = None
    if view.call:
        try:
            oldest = max(0.0, time.time() - float(json.loads(view.call)["at"]))
        except (ValueError, KeyError, TypeError):
            oldest = None
    rows = [["Queue:", f"{view.waiting} waiting ({settings.on_duplicate})"]]
    if view.next is not None:
        age = "" if oldest is None else f", waiting for {oldest:.1f} s"
        rows.append(["Next call:", f"task {view.next}{age}"])
    if pending.claimant is not None:
        rows.append(["Handed to:", f"task {pending.claimant} (not started yet)"])
    out = {
        "policy": settings.on_duplicate,
        "waiting": view.waiting,
        "next": view.next,
        "oldest_age": oldest,
        "handed_to": pending.claimant,
        "answered": view.answered,
    }
    return rows, out
