"""What a rated start does (``lock_rate``, and rates named in ``lock_also``).

At publish (:func:`publish`), a rated call books the first instant its rates
admit and is sent due a lead of ``min(T, 0.5 s)`` before it (T the shortest
interval of its windows) with the ``redlock_rate_at`` header naming it: a burst
of calls reaches the broker spread over the schedule, so nothing queues behind
it. At the start of an execution without such a booking (a call sent by name,
with its own countdown, in a canvas, of a task with claims, or whose booking
failed at publish), the run lock's own round books it, together with the rates
the task shares through ``lock_also``, and records the start where it is due:
a rated start costs no round more than an unrated one (a second round only
when concurrent bookings left the nodes disagreeing). The lock comes first
there: a start the lock (or a receipt, a claim, a throttle) turns away books
nothing.

* Due now: the execution runs, holding its run lock.
* Due later: the lock is let go at once, and the message is re-published
  with the countdown to the lead before the booked instant and the
  ``redlock_rate_at`` header naming it; it holds no worker slot meanwhile
  (the broker, or the worker's ETA timer, keeps it). Due within the lead, the
  worker holds it instead. A delivery that arrives early sleeps to its
  instant (a worker whose clock is behind by more than the lead re-publishes
  it); one that arrives no later than the instant plus a grace of
  ``min(T / 2, 0.25 s)`` starts on its booking, and its lock round only
  records the start; a later arrival (a busy pool, a broker backlog) books
  again.
* Key held, ``lock_on_duplicate="retry"``: the start books its place in the
  schedule when the schedule is full (:func:`place`) instead of bouncing on
  the lock's backoff; else the lock's retry applies.
* No quorum: the message is re-published with the lock's backoff (jittered,
  capped at :data:`RATE_OUTAGE_MAX`, 2 s), for as long as the outage lasts:
  nothing is dropped and nothing starts unbooked. Logged at WARNING, counted
  (``rate_outage``).
* Concurrent callers split the nodes for every round: re-published after a
  short jittered pause (``rate_split``).

In eager mode the call sleeps until its instant; an outage raises.
"""

from __future__ import annotations

import logging
import math
import time
from datetime import datetime, timezone
from typing import Any, NamedTuple, NoReturn

from celery.exceptions import Retry

from . import enqueue, metrics, outage, republish, tracing
from .core import (
    RateKey,
    RateSlot,
    full_jitter,
    paced,
    peek_rate,
    reserve_place,
    reserve_rates,
    resolve_rate,
)
from .exceptions import QuorumUnavailable
from .headers import ATTEMPT, RATE_AT, RATE_WAITS, attempt_of, header
from .plan import LockPlan

__all__ = [
    "Start",
    "applies",
    "booking",
    "grace",
    "later",
    "outage_countdown",
    "place",
    "publish",
    "start",
    "status",
    "unavailable",
]

logger = logging.getLogger("celery_redlock.rates")

#: Longest lead of a booked start's message before its instant (the grace is half the lead).
MAX_LEAD = 0.5
#: Pause before a start on its booking that found its key held tries it again.
POLL = 0.002
#: Longest pause before a start whose reservation split the nodes asks again.
SPLIT_PAUSE = 0.2
#: Longest and shortest countdown of a rated start waiting out an outage: it asks
#: again soon, whatever ``redlock_retry_backoff_max`` says (the starts it holds
#: back must resume promptly), but never in a tight loop.
RATE_OUTAGE_MAX = 2.0
RATE_OUTAGE_MIN = 0.1


def outage_countdown(waits: int, settings: Any, rng: Any) -> float:
    """When a rated start that met an outage asks again: the lock's backoff, jittered,
    but capped at :data:`RATE_OUTAGE_MAX` and never below :data:`RATE_OUTAGE_MIN`, so the
    starts waiting out an outage resume within seconds of a quorum's return."""
    base = min(settings.retry_backoff, RATE_OUTAGE_MAX / 4)
    cap = min(settings.retry_backoff_max, RATE_OUTAGE_MAX)
    return max(RATE_OUTAGE_MIN, full_jitter(waits, base, cap, rng))


def applies(plan: LockPlan) -> bool:
    """Whether executions of the plan's task book a rate (free for tasks without one)."""
    return plan.settings.rate is not None or bool(plan.also_rates)


def grace(keys: list[RateKey]) -> float:
    """How late after its booked instant a delivery may still start on it, ``min(T / 2,
    0.25 s)``: half the lead, so the grace plus the run lock's round stays under T."""
    return lead(keys) / 2


def lead(keys: list[RateKey]) -> float:
    """How long before its booked instant a start's message is due, ``min(T, 0.5 s)``:
    the worker holds an early delivery (or a booking due that soon) until its
    instant, so a delivery late by up to the lead plus the grace still starts
    on its booking, at the cost of a pool process held about T per start."""
    return min(MAX_LEAD, min(w.interval for k in keys for w in k.windows))


class Start(NamedTuple):
    """A rated execution's rate keys, and whether this delivery's start was booked
    before (the lock round then only records it)."""

    keys: list[RateKey]
    booked: bool


def start(
    task: Any, plan: LockPlan, name: str, request: Any, booked_at: float | None = None
) -> Start | None:
    """What the lock round books for this execution (None: no rate for this call).

    A delivery that carries its booking (the ``redlock_rate_at`` header, or
    ``booked_at`` in eager mode) and comes within the grace of it starts on it;
    one that comes early sleeps up to the grace, else is re-published (raises
    ``Retry``); one that comes, or wakes from that sleep, later than the grace
    books again.
    """
    keys = _keys(plan, name, request.args or (), request.kwargs or {})
    if not keys:
        return None
    if booked_at is not None:
        return Start(keys, _in_grace(booked_at, keys))
    booked = _booked(request)
    if booked is not None:
        slack, ahead = grace(keys), lead(keys)
        early = booked - time.time()
        if -slack <= early <= ahead + slack:
            if early > 0:
                plan.redlock.sleep(early)
            return Start(keys, _in_grace(booked, keys))
        if early > ahead + slack:  # this worker's clock is behind the booking's: not yet
            _republish(task, request, early, {RATE_AT: _rate_at(booked, request)}, "rate: early")
    return Start(keys, False)


def _in_grace(instant: float, keys: list[RateKey]) -> bool:
    """Whether a start on ``instant`` may still take it: a loaded host may wake from the
    sleep up to it later than its grace, and such a start books again (its slot is
    wasted, never exceeded), so a start is never more than g + d after its instant."""
    return time.time() <= instant + grace(keys)


def unavailable(
    task: Any, plan: LockPlan, name: str, request: Any, exc: QuorumUnavailable
) -> NoReturn:
    """No quorum for a rated start: it waits (re-published on the outage backoff) until
    one answers, however long; it never starts unbooked. Eager mode raises."""
    metrics.count("rate_outage", plan.lock_name)
    outage.failed(plan.redlock, exc)  # the nodes' errors, once per outage
    if request.is_eager:
        raise exc
    waits = _int(header(request, RATE_WAITS))
    countdown = outage_countdown(waits, plan.settings, plan.redlock.rng)
    logger.warning(
        "%s[%s]: rate of %r not booked, lock nodes unavailable; again in %.2fs (wait %d)",
        task.name, request.id, name, countdown, waits + 1,
    )  # fmt: skip
    _republish(task, request, countdown, {RATE_WAITS: waits + 1}, f"rate: {exc}")


def later(task: Any, plan: LockPlan, name: str, request: Any, slot: RateSlot) -> float | None:
    """A start booked for later (or whose bookings split the nodes): re-published with
    the countdown to the lead before its instant (raises ``Retry``). Eager mode, and
    a booking due within the lead, sleep instead and return the instant to start
    on (None: book again)."""
    redlock = plan.redlock
    if not slot.reserved:
        metrics.count("rate_split", plan.lock_name)
        if request.is_eager:
            redlock.sleep(redlock.rng() * SPLIT_PAUSE)
            return None
        countdown = redlock.rng() * SPLIT_PAUSE
        _republish(task, request, countdown, {}, "rate: concurrent bookings split the nodes")
    wait = slot.start_at - time.time()
    metrics.count("rate_delayed", plan.lock_name)
    metrics.observe_rate_delay(wait, plan.lock_name)
    tracing.rate_delayed(plan.lock_name, wait, slot.start_at)
    ahead = lead(_keys(plan, name, request.args or (), request.kwargs or {}))
    if request.is_eager or wait <= ahead:
        # due within the lead: a re-publish might not come back on time, so the
        # worker holds the start (at most the lead) and it starts on its booking
        redlock.sleep(max(0.0, wait))
        return slot.start_at
    logger.debug("%s[%s]: rate of %r: starts in %.3fs", task.name, request.id, name, wait)
    extra = {RATE_AT: _rate_at(slot.start_at, request), RATE_WAITS: 0}
    # due the lead before its instant: a delivery that comes late by up to the lead
    # plus the grace still starts on its booking; one that comes early sleeps the rest
    _republish(task, request, wait - ahead, extra, f"rate: starts in {wait:.3f}s")


def publish(call: enqueue.Publish) -> Any:
    """``apply_async`` of a rated call: its start is booked here, at publish, and the
    message goes out due at that instant (half a grace early) with the booking in
    ``redlock_rate_at``, so the worker receives it once, when it is due, and does
    not re-publish it: a burst of calls reaches the broker already spread over the
    schedule, and the re-publishes of the earliest bookings do not queue behind
    it (they came back too late for their instants). ``send`` is the plain
    ``apply_async``. A call published with its own countdown or ETA, a canvas
    part, a re-publish, or a booking that fails (no quorum, split nodes, a key
    that cannot be built) is sent as it is: the worker books it on arrival."""
    task, plan, args, kwargs, task_id, options, send = call
    headers = options.get("headers") or {}
    plain = options.get("countdown") or options.get("eta") or options.get("retries")
    if plain or ATTEMPT in headers or enqueue.in_canvas(options):
        return send(args, kwargs, task_id=task_id, **options)
    try:
        keys = _keys(plan, plan.keys.build(args or (), kwargs or {}), args or (), kwargs or {})
        slot = reserve_rates(plan.redlock, keys) if keys else None
    except Exception as exc:  # noqa: BLE001 - the worker books it, and reports what fails
        logger.debug("%s: rate not booked at publish: %s", task.name, exc)
        slot = None
    if slot is None or not slot.reserved:
        return send(args, kwargs, task_id=task_id, **options)
    wait, ahead = slot.start_at - time.time(), lead(keys)
    booked = {**headers, RATE_AT: f"{int(round(slot.start_at * 1000))}:0:0"}
    due = {"countdown": wait - ahead} if wait > ahead else {}
    return send(args, kwargs, task_id=task_id, **{**options, "headers": booked, **due})


def place(
    task: Any, plan: LockPlan, name: str, request: Any, on: float | None, book: bool = True
) -> float | None:
    """A rated start that met the key held (``lock_on_duplicate="retry"``): the
    instant to try the key again on. Still within the grace of the booking it
    tried (``on``), the same instant after a short pause (the holder is nearly
    done: the start stays within its grace). Else it books its place in the
    rate's schedule instead of bouncing on the lock's backoff: re-published for
    that instant (raises ``Retry``), or, due within the lead, held here and the
    instant returned. None, without ``book``, or when the schedule admits a
    start sooner (the lock, not the rate, holds this one back): nothing is
    booked, and the lock's policy applies."""
    keys = _keys(plan, name, request.args or (), request.kwargs or {})
    if not keys:
        return None
    if on is not None and time.time() + POLL < on + grace(keys):
        plan.redlock.sleep(POLL)
        return on
    if not book:
        return None
    try:
        slot = reserve_place(plan.redlock, keys)
    except QuorumUnavailable as exc:
        unavailable(task, plan, name, request, exc)
    if slot is None:
        return None
    return later(task, plan, name, request, slot)


def booking(request: Any) -> float | None:
    """The instant this very delivery was booked for (``redlock_rate_at``), if any."""
    return _booked(request)


def _keys(plan: LockPlan, name: str, args: Any, kwargs: Any) -> list[RateKey]:
    """The rate keys this call books: its own (if it has a rate) and its ``lock_also`` rates."""
    redlock = plan.redlock
    keys = []
    rate = plan.settings.rate
    if rate is not None:
        windows = resolve_rate(rate, *args, **_without_token(plan, kwargs))
        if windows:
            keys.append(_rate_key(redlock, name, windows, plan.settings.rate_burst))
    for other, windows in plan.also_rates:
        keys.append(_rate_key(redlock, other, windows))
    return keys


def _rate_key(redlock: Any, name: str, windows: Any, burst: int = 1) -> RateKey:
    """A name's rate hash and the sorted set of its recorded starts."""
    return RateKey(
        redlock.coalesce_key(name, "rate"), windows, burst, redlock.coalesce_key(name, "starts")
    )


def _without_token(plan: LockPlan, kwargs: Any) -> dict:
    kwargs = dict(kwargs or {})
    if plan.token_arg is not None:
        kwargs.pop(plan.token_arg, None)
    return kwargs


def _rate_at(start_at: float, request: Any) -> str:
    return f"{int(round(start_at * 1000))}:{attempt_of(request)}:{request.retries or 0}"


def _booked(request: Any) -> float | None:
    """The booked instant this very delivery carries, if any (epoch seconds)."""
    value = header(request, RATE_AT)
    if not isinstance(value, str):
        return None
    try:
        ms, attempt, retries = (int(part) for part in value.split(":"))
    except ValueError:
        return None
    if attempt != attempt_of(request) or retries != (request.retries or 0):
        return None  # booked for an earlier delivery (a lock retry, self.retry())
    return ms / 1000.0


def _int(value: Any) -> int:
    try:
        return int(value or 0)
    except (TypeError, ValueError):
        return 0


def _republish(task: Any, request: Any, countdown: float, extra: dict, reason: str) -> NoReturn:
    """Publish the same message again in ``countdown`` seconds; its lock attempt is kept
    (a rate delay is no lock retry), which also tells ``apply_async`` it is a re-publish."""
    headers = {**(request.headers or {}), ATTEMPT: attempt_of(request), **extra}
    sig = task.signature_from_request(
        request, countdown=max(0.0, countdown), retries=request.retries, headers=headers
    )
    republish.hold(request, sig.apply_async)  # sent once RETRY is stored
    raise Retry(reason, when=countdown, sig=sig)


# -- celery redlock status ----------------------------------------------------


def status(client: Any, settings: Any, name: str, args: Any, kwargs: Any) -> tuple[list, Any]:
    """What ``celery redlock status`` shows of a rated key: table rows and a JSON
    value (None and no rows for a key without a rate). ``client`` a Redlock."""
    rate = settings.rate
    if rate is None:
        return [], None
    if callable(rate) and args is None and kwargs is None:
        return [["Rate:", "depends on the arguments (give --args/--kwargs)"]], {"rate": None}
    windows = resolve_rate(rate, *(args or ()), **(kwargs or {}))
    if not windows:
        return [["Rate:", "none for these arguments"]], {"rate": None}
    try:
        view = peek_rate(client, name, windows)
    except QuorumUnavailable as exc:
        return [["Rate:", f"unknown: {exc}"]], {
            "rate": [str(w) for w in windows],
            "error": str(exc),
        }
    now = time.time()
    rows = [
        ["Rate:", f"{', '.join(map(str, windows))}, burst {settings.rate_burst}"],
        ["Rate key:", view.key],
    ]
    out: dict = {"rate": [str(w) for w in windows], "burst": settings.rate_burst, "windows": []}
    pace = paced(windows)
    for window, booked_to in view.windows:
        started = view.started(window.period, now)
        if window == pace:
            ahead = _booked_ahead(window, booked_to, now)
            until = "" if booked_to is None else f", booked up to {slot_time(booked_to)}"
            state = f"{ahead} booked ahead{until}"
        else:  # a counted window: its bookings are a log, not a spacing
            ahead = None
            again = "now" if booked_to is None else f"at {slot_time(booked_to)}"
            state = f"counted; admits a start {again}"
        rows.append(
            [
                f"  {window}:",
                f"{started} of {window.starts} started in the last {window.period:g} s ({state})",
            ]
        )
        out["windows"].append(
            {"window": str(window), "starts": started, "booked_ahead": ahead, "tat": booked_to}
        )
    wait = max(0.0, view.next_start - now)
    rows.append(["Next start:", f"{slot_time(view.next_start)} (in {wait:.3f} s)"])
    out.update(next_start=view.next_start, wait=wait, answered=view.answered)
    return rows, out


def _booked_ahead(window: Any, booked_to: float | None, now: float) -> int:
    """Starts booked after now in one window, from its TAT: the bookings still
    ahead of the clock are back to back, one interval apart, the last one
    interval before the TAT (an upper count: a later arrival that booked again
    leaves its first instant unused)."""
    if booked_to is None or booked_to <= now:
        return 0
    return max(0, math.ceil((booked_to - now) / window.interval - 1e-9) - 1)


def slot_time(epoch: float) -> str:
    """An instant as UTC ISO time, to the ms."""
    when = datetime.fromtimestamp(epoch, timezone.utc).replace(tzinfo=None)
    return when.isoformat(timespec="milliseconds") + "Z"
