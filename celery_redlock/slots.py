"""Beat slots: how every beat names one scheduled occurrence of an entry.

Pure arithmetic on Celery schedules, with no Redis: the scheduler mixin in
:mod:`celery_redlock.beat` claims ``{prefix}:beat:{entry}:{slot}`` for the slot
computed here. A slot names an occurrence so that beats started at different
times, with different ``last_run_at``, agree on it:

``schedule`` (an interval, ``run_every`` seconds)
    ``floor(now / period) * period`` in epoch seconds: the slot grid is
    aligned on the Unix epoch, not on each beat's start time. The first beat
    whose own timer fires within a grid cell sends it.
``crontab``
    The latest scheduled boundary at or before now (the boundary
    ``remaining_delta(last_run_at)`` gives, moved forward while the next one is
    also past), as the epoch second of its wall-clock time in the app's
    timezone. A beat that was down for a while therefore claims the current
    boundary, not one long gone whose claim has expired.
``solar``
    The latest event at or before now, to the second. The event is recomputed
    from a canonical start 6-7 hours before it, because ``ephem`` returns an
    instant that varies by tens of milliseconds with the start of the search.
anything else (``clocked``, ``rrule``, custom schedules)
    ``now + remaining_estimate(last_run_at)``, rounded to the second: right for
    schedules whose due time does not depend on ``last_run_at``.

A claim lives ``max(redlock_beat_min_ttl, 2 * period)`` seconds, plus the DST
shift for a crontab slot near a transition (:meth:`Slot.ttl`).

Limits of the rule:

* The entry **name** is the identity. Renaming an entry, or running beats with
  different schedules for the same name (a rolling deploy that changes the
  interval from 10 s to 15 s), gives different keys: both versions may run.
* Interval slots follow the epoch grid, and so do the runs: the scheduler
  mixin makes an interval entry due at the start of each cell (not a period
  after the tick that ran it, as plain Celery does, which lets the latency of
  each run add up until a cell is skipped). Every beat therefore claims each
  cell right after it begins; ``relative=True`` is ignored.
* Crontab across DST: on the spring-forward day a boundary in the skipped hour
  (02:30 in Europe/Berlin) is due at the same instant as 03:30 and has one
  slot. On the fall-back day a wall-clock time in the repeated hour has one
  slot, named after its first occurrence, and the claim is kept long enough to
  cover the second: the entry runs once, even on a beat started in the
  repeated hour (which plain Celery would run again).
* Solar events are keyed to the second; in the rare case (about one in
  millions) that two beats round a recomputed event to different seconds, that
  event may run twice.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from typing import Any, NamedTuple

from celery.schedules import crontab, solar
from celery.schedules import schedule as interval
from celery.utils.time import maybe_make_aware

__all__ = ["Slot", "claim_key", "compute_slot", "grid_aligned", "schedule_now", "until_next_cell"]

_HOUR = 3600.0
_DAY = 86400.0
# How far back to look for the latest crontab boundary / solar event before
# falling back to last_run_at: small first, so a frequent schedule costs one
# or two steps, wide last, so a rare one is still found.
_CRON_WINDOWS = (120.0, 2 * _HOUR, 2 * _DAY, 32 * _DAY, 400 * _DAY)
_SOLAR_WINDOWS = (2 * _DAY, 32 * _DAY, 400 * _DAY)
_MAX_STEPS = 10_000
# ephem dates count days from 1899-12-31 12:00 UTC; the Unix epoch is this one.
_EPHEM_UNIX_EPOCH = 25567.5


def claim_key(entry_name: str, label: str) -> str:
    """The claim name of one slot, under the Redlock prefix: ``beat:{entry}:{slot}``."""
    return f"beat:{entry_name}:{label}"


class Slot(NamedTuple):
    """One scheduled occurrence of an entry, as every beat names it."""

    #: ``interval``, ``crontab``, ``solar`` or ``other``.
    kind: str
    #: The slot in the key and the header: epoch seconds as a decimal string.
    label: str
    #: Epoch seconds at which this occurrence became due.
    due: float
    #: Epoch seconds at which the next occurrence is due (None if unknown).
    next_due: float | None
    #: Extra seconds the claim must live (the DST shift, near a transition).
    keep: float = 0.0

    @property
    def period(self) -> float | None:
        """Seconds between this occurrence and the next, if known."""
        if self.next_due is None or self.next_due <= self.due:
            return None
        return self.next_due - self.due

    def ttl(self, floor: float) -> float:
        """Lifetime of the claim: two periods, at least ``floor``, plus the DST keep."""
        return max(floor, 2 * (self.period or 0.0)) + self.keep

    def ends(self, floor: float) -> float:
        """When the next occurrence begins (``floor`` seconds after this one, if unknown)."""
        return self.due + (self.period or floor)

    def still_due(self, now: float, floor: float) -> bool:
        """True until the next occurrence begins (or ``floor`` seconds, if unknown).

        Within that window every other beat's claim of this slot still exists,
        so a late claim cannot duplicate it.
        """
        return now < self.ends(floor)


def compute_slot(schedule: Any, last_run_at: datetime | None) -> Slot:
    """The slot that a due entry with this schedule and ``last_run_at`` sends now.

    Pure apart from the schedule's clock (``schedule.now()``), so it can be
    tested with freezegun. See the module docstring for the rule.
    """
    now = schedule_now(schedule)
    if isinstance(schedule, crontab):
        return _crontab_slot(schedule, _last(schedule, last_run_at, now), now)
    if isinstance(schedule, solar):
        return _solar_slot(schedule, _last(schedule, last_run_at, now), now)
    if isinstance(schedule, interval) and schedule.run_every.total_seconds() > 0:
        return _interval_slot(schedule.run_every.total_seconds(), now)
    return _other_slot(schedule, last_run_at, now)


def grid_aligned(schedule: Any, ran_at: datetime, cell: float | None = None) -> datetime:
    """``ran_at`` moved back to the start of its epoch-aligned cell, for an interval
    schedule (any other schedule keeps ``ran_at``); to ``cell`` (epoch seconds, at or
    before ``ran_at``) when the slot sent for this run is known.

    An interval entry runs ``run_every`` after its ``last_run_at``; set to the
    time a tick ran, a tick made late by a slow round (a hung node) pushes every
    later run off the grid, and each beat may then skip the same cell. Set to
    its cell's start, the next run is due at the next cell's start, whatever the
    latency. Set to the cell of the slot it sent, it is due again in the next
    one even when the tick crossed a boundary between advancing and sending.
    """
    if not isinstance(schedule, interval) or schedule.run_every.total_seconds() <= 0:
        return ran_at
    period = schedule.run_every.total_seconds()
    at = _epoch(schedule, ran_at)
    start = cell if cell is not None and cell <= at else math.floor(at / period) * period
    return ran_at - timedelta(seconds=at - start)


def until_next_cell(schedule: Any) -> float | None:
    """Seconds from now to the start of the next cell of an interval schedule's
    epoch grid (None for any other schedule)."""
    if not isinstance(schedule, interval) or schedule.run_every.total_seconds() <= 0:
        return None
    period = schedule.run_every.total_seconds()
    now = schedule_now(schedule)
    return (math.floor(now / period) + 1) * period - now


def schedule_now(schedule: Any) -> float:
    """The schedule's own clock (``schedule.now()``, in its timezone) as epoch seconds."""
    return _epoch(schedule, schedule.now())


def _epoch(schedule: Any, dt: datetime) -> float:
    make_aware = getattr(schedule, "maybe_make_aware", None)
    return (make_aware(dt) if make_aware else maybe_make_aware(dt)).timestamp()


def _last(schedule: Any, last_run_at: datetime | None, now: float) -> float:
    # RedBeat leaves last_run_at None on a new entry: look back as far as we search.
    return now - _CRON_WINDOWS[-1] if last_run_at is None else _epoch(schedule, last_run_at)


def _label(seconds: float) -> str:
    if float(seconds).is_integer():
        return str(int(seconds))
    return f"{seconds:.6f}".rstrip("0").rstrip(".")


def _interval_slot(period: float, now: float) -> Slot:
    start = math.floor(now / period) * period
    return Slot("interval", _label(start), start, start + period)


def _latest(
    occurrence: Callable[[float], tuple[float, float]],
    last: float,
    now: float,
    windows: tuple[float, ...],
    step: float,
) -> tuple[float, float, float | None]:
    """The latest occurrence at or before ``now`` that follows ``last``.

    ``occurrence(t)`` gives the first occurrence after ``t`` as (instant, identity).
    Returns (instant, identity, instant of the next one). If none is due yet,
    the upcoming one is returned.
    """
    for window in (*windows, None):
        start = last if window is None else max(last, now - window)
        due, ident = occurrence(start)
        if due <= now or start == last:
            break
    nxt: float | None = None
    for _ in range(_MAX_STEPS):
        nxt, nident = occurrence(due + step)
        if nxt <= due:  # not moving forward: stop rather than loop
            nxt = None
            break
        if nxt > now:
            break
        due, ident = nxt, nident
    return due, ident, nxt


def _crontab_slot(sched: crontab, last: float, now: float) -> Slot:
    tz = sched.tz

    def occurrence(t: float) -> tuple[float, float]:
        start, delta, _ = sched.remaining_delta(datetime.fromtimestamp(t, tz))
        at = start + delta
        # The instant decides when it is due; the identity is the wall-clock
        # time read as its first occurrence, so both passes of a repeated hour
        # share one slot (and a time in a skipped hour maps to one instant).
        return at.timestamp(), at.replace(fold=0).timestamp()

    due, ident, nxt = _latest(occurrence, last, now, _CRON_WINDOWS, 0.0)
    return Slot("crontab", _label(ident), due, nxt, _dst_shift(tz, due, 2 * _HOUR))


def _dst_shift(tz: Any, at: float, horizon: float) -> float:
    """How much the UTC offset of ``tz`` changes within ``horizon`` seconds after ``at``."""
    before = datetime.fromtimestamp(at, tz).utcoffset()
    after = datetime.fromtimestamp(at + horizon, tz).utcoffset()
    if before is None or after is None:
        return 0.0
    return abs((after - before).total_seconds())


def _solar_slot(sched: solar, last: float, now: float) -> Slot:
    def event_after(t: float) -> float:
        start = sched.ephem.Date(t / _DAY + _EPHEM_UNIX_EPOCH)
        if hasattr(sched, "_next_event"):  # celery >= 5.5 skips circumpolar days
            event = sched._next_event(start)
        else:  # pragma: no cover - older celery
            kwargs = {"use_center": sched.use_center}
            event = getattr(sched.cal, sched.method)(sched.ephem.Sun(), start=start, **kwargs)
        return (float(event) - _EPHEM_UNIX_EPOCH) * _DAY

    def occurrence(t: float) -> tuple[float, float]:
        at = event_after(t)
        # ephem's answer moves by milliseconds with the start of the search:
        # search again from a start every beat derives alike (an hour boundary
        # 6-7 h earlier; one event of a kind per day, so it finds the same one).
        canonical = math.floor((at - 6 * _HOUR) / _HOUR) * _HOUR
        return at, float(math.floor(event_after(canonical)))

    due, ident, nxt = _latest(occurrence, last, now, _SOLAR_WINDOWS, _HOUR)
    return Slot("solar", _label(ident), due, nxt)


def _other_slot(sched: Any, last_run_at: datetime | None, now: float) -> Slot:
    def occurrence(last: Any) -> float:
        return float(round(now + sched.remaining_estimate(last).total_seconds()))

    due = occurrence(last_run_at if last_run_at is not None else sched.now())
    try:
        nxt: float | None = occurrence(datetime.fromtimestamp(due, timezone.utc))
    except Exception:  # the next one is only used to size the TTL
        nxt = None
    return Slot("other", _label(due), due, nxt)
