"""What a rated start does (``lock_rate``, and rates named in ``lock_also``).

At the start of an execution, before the run lock, the worker books the
first instant the key's rate admits (:mod:`celery_redlock.core.rates`, one
quorum round, two when concurrent callers split the nodes), together with the
rates the task shares through ``lock_also``:

* Due now: the execution goes on to its run lock.
* Due later: the message is re-published with the countdown to the booked
  instant and the ``redlock_rate_at`` header naming it; it holds no worker slot
  meanwhile (the broker, or the worker's ETA timer, keeps it); its countdown
  ends half a grace before the instant, which it sleeps out. When it arrives
  no later than the instant plus a grace of ``min(T / 2, 0.25 s)`` (T the
  shortest interval of its windows), it starts on that booking; a later
  arrival (a busy pool, a broker backlog) books again. An arrival before the
  instant (a worker whose clock is behind) sleeps up to the grace, else is
  re-published again.
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
from typing import Any, NoReturn

from celery.exceptions import Retry

from . import metrics, outage, tracing
from .core import RateKey, full_jitter, peek_rate, reserve_rates, resolve_rate
from .exceptions import QuorumUnavailable
from .headers import ATTEMPT, RATE_AT, RATE_WAITS, attempt_of, header
from .plan import LockPlan

__all__ = ["admit", "applies", "grace", "outage_countdown", "status"]

logger = logging.getLogger("celery_redlock.rates")

#: A start due within this many seconds sleeps until its instant instead of being re-published.
NEAR = 0.005
#: Longest grace after a booked instant.
MAX_GRACE = 0.25
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
    """How late after its booked instant a re-published start may still use it."""
    return min(MAX_GRACE, min(w.interval for k in keys for w in k.windows) / 2)


def admit(task: Any, plan: LockPlan, name: str, request: Any) -> None:
    """Return when the start is booked for now; otherwise re-publish it (raises ``Retry``)."""
    keys = _keys(plan, name, request.args or (), request.kwargs or {})
    if not keys:
        return
    redlock = plan.redlock
    slack = grace(keys)
    booked = _booked(request)
    if booked is not None:
        early = booked - time.time()
        if -slack <= early <= slack:
            if early > 0:
                redlock.sleep(early)
            return
        if early > slack:  # this worker's clock is behind the booking's: not yet
            _republish(task, request, early, {RATE_AT: _rate_at(booked, request)}, "rate: early")
    try:
        slot = reserve_rates(redlock, keys)
    except QuorumUnavailable as exc:
        metrics.count("rate_outage", plan.lock_name)
        outage.failed(redlock, exc)  # the nodes' errors, once per outage
        if request.is_eager:
            raise
        waits = _int(header(request, RATE_WAITS))
        countdown = outage_countdown(waits, plan.settings, redlock.rng)
        logger.warning(
            "%s[%s]: rate of %r not booked, lock nodes unavailable; again in %.2fs (wait %d)",
            task.name, request.id, name, countdown, waits + 1,
        )  # fmt: skip
        _republish(task, request, countdown, {RATE_WAITS: waits + 1}, f"rate: {exc}")
    outage.answered(redlock)
    if not slot.reserved:
        metrics.count("rate_split", plan.lock_name)
        if request.is_eager:
            redlock.sleep(redlock.rng() * SPLIT_PAUSE)
            return admit(task, plan, name, request)
        countdown = redlock.rng() * SPLIT_PAUSE
        _republish(task, request, countdown, {}, "rate: concurrent bookings split the nodes")
    wait = slot.start_at - time.time()
    if wait <= NEAR:
        if wait > 0:
            redlock.sleep(wait)
        return
    metrics.count("rate_delayed", plan.lock_name)
    metrics.observe_rate_delay(wait, plan.lock_name)
    tracing.rate_delayed(plan.lock_name, wait, slot.start_at)
    if request.is_eager:
        redlock.sleep(wait)
        return
    logger.debug("%s[%s]: rate of %r: starts in %.3fs", task.name, request.id, name, wait)
    extra = {RATE_AT: _rate_at(slot.start_at, request), RATE_WAITS: 0}
    # due a little before its instant (half the grace): a delivery that comes late
    # by up to the whole grace still starts on its booking; one that comes early
    # sleeps the few ms left
    _republish(task, request, wait - slack / 2, extra, f"rate: starts in {wait:.3f}s")


def _keys(plan: LockPlan, name: str, args: Any, kwargs: Any) -> list[RateKey]:
    """The rate keys this call books: its own (if it has a rate) and its ``lock_also`` rates."""
    redlock = plan.redlock
    keys = []
    rate = plan.settings.rate
    if rate is not None:
        windows = resolve_rate(rate, *args, **_without_token(plan, kwargs))
        if windows:
            keys.append(
                RateKey(redlock.coalesce_key(name, "rate"), windows, plan.settings.rate_burst)
            )
    for other, windows in plan.also_rates:
        keys.append(RateKey(redlock.coalesce_key(other, "rate"), windows))
    return keys


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
    sig.apply_async()
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
    for window, booked_to in view.windows:
        starts, ahead = _window_counts(window, booked_to, now)
        until = "" if booked_to is None else f", booked up to {slot_time(booked_to)}"
        rows.append(
            [
                f"  {window}:",
                f"{starts} of {window.starts} booked in the next {window.period:g} s "
                f"({ahead} ahead{until})",
            ]
        )
        out["windows"].append(
            {"window": str(window), "starts": starts, "booked_ahead": ahead, "tat": booked_to}
        )
    wait = max(0.0, view.next_start - now)
    rows.append(["Next start:", f"{slot_time(view.next_start)} (in {wait:.3f} s)"])
    out.update(next_start=view.next_start, wait=wait, answered=view.answered)
    return rows, out


def _window_counts(window: Any, booked_to: float | None, now: float) -> tuple[int, int]:
    """(starts booked in the window of one period from now, starts booked from now on)
    of one window, from its TAT: the bookings still ahead of the clock are back to
    back, one interval apart, up to the TAT (an upper count: a later arrival that
    booked again leaves its first instant unused)."""
    if booked_to is None or booked_to <= now:
        return 0, 0
    ahead = math.ceil((booked_to - now) / window.interval - 1e-9)
    return min(window.starts, ahead), ahead


def slot_time(epoch: float) -> str:
    """An instant as UTC ISO time, to the ms."""
    when = datetime.fromtimestamp(epoch, timezone.utc).replace(tzinfo=None)
    return when.isoformat(timespec="milliseconds") + "Z"
