"""Run several ``celery beat`` processes; each periodic slot is sent exactly once.

Celery expects exactly one beat. Run two and every periodic task is sent twice;
run one and a crashed host means no periodic tasks until someone notices.
:class:`RedlockScheduler` lets you run a beat on every host you like: before
publishing a due entry, each beat claims the entry's current **slot** on the
Redlock quorum (``SET NX`` on a majority of the nodes). The first beat to claim
it sends the task; the others skip the publish and move their own schedule on,
exactly as if they had sent it. A beat that dies leaves nothing to clean up:
the next slot is claimed by whichever beat is still running.

Usage
=====

::

    celery -A proj beat -S celery_redlock.beat:RedlockScheduler

on as many hosts as you like, each with its own ``--schedule`` file. Beat uses
the same nodes and settings as the tasks (``redlock_nodes``,
``redlock_key_prefix``, ``redlock_node_timeout``, ...). A missing or invalid
setting stops beat at start with a ``ConfigurationError`` naming it.

This decides which beat *sends* a slot. Whether a run may start while the
previous one is still running is the task lock's business: make the task a
``LockedTask`` (a late run of a long task is then dropped, not run twice).

The de-duplication is a mixin over any scheduler that publishes through
``Scheduler.apply_async``, so it composes with the database-backed ones::

    from django_celery_beat.schedulers import DatabaseScheduler
    from celery_redlock.beat import RedlockSchedulerMixin

    class Scheduler(RedlockSchedulerMixin, DatabaseScheduler): pass

    from redbeat import RedBeatScheduler

    class Scheduler(RedlockSchedulerMixin, RedBeatScheduler): pass

(RedBeat elects one active beat with its own lock; set ``redbeat_lock_key =
None`` to run all beats active, or keep its lock and let the mixin cover the
fail-over gap, where two beats can both believe they lead.)

Slots
=====

A slot names one scheduled occurrence of an entry so that beats started at
different times, with different ``last_run_at``, agree on it:

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

The key is ``{redlock_key_prefix}:beat:{entry name}:{slot}``, its value
``{task id}|{host}|{pid}`` of the beat that sent it, and it expires after
``max(redlock_beat_min_ttl, 2 * period)`` seconds (plus the DST shift for a
crontab slot near a transition). The task is published with that task id and a
``redlock_beat_slot`` header holding the slot as it appears in the key, so a
run can tell which slot it belongs to::

    @app.task(bind=True)
    def report(self):
        slot = self.request.redlock_beat_slot   # "1711861200"

Limits of the rule:

* The entry **name** is the identity. Renaming an entry, or running beats with
  different schedules for the same name (a rolling deploy that changes the
  interval from 10 s to 15 s), gives different keys: both versions may run.
* Interval slots follow the epoch grid, so a beat's own phase decides only
  *which* beat sends a slot, not when the grid ticks; ``relative=True`` is
  ignored for the slot. Celery runs an interval entry every period plus the
  tick's latency (``last_run_at`` is set when it runs), so a lone beat's runs
  drift across the grid and now and then skip a cell: the same number of runs
  plain Celery makes. With several beats a cell is skipped only if every beat
  skips it.
* Clock skew between beat hosts shifts which beat wins, never duplicates a
  slot, as long as it stays well below the claim TTL (60 s by default).
* Crontab across DST: on the spring-forward day a boundary in the skipped hour
  (02:30 in Europe/Berlin) is due at the same instant as 03:30 and has one
  slot. On the fall-back day a wall-clock time in the repeated hour has one
  slot, named after its first occurrence, and the claim is kept long enough to
  cover the second: the entry runs once, even on a beat started in the
  repeated hour (which plain Celery would run again).
* While a node hangs (accepts connections, never answers) every claim waits
  ``redlock_node_timeout`` for it, and a losing beat about three times that
  (claim, withdrawal, read-back): keep the node timeout small.
* Solar events are keyed to the second; in the rare case (about one in
  millions) that two beats round a recomputed event to different seconds, that
  event may run twice.

When the quorum is unavailable
==============================

If fewer than a majority of nodes answer, beat neither skips the slot silently
nor sends it without a claim: it logs an ERROR, counts it in
:attr:`~RedlockSchedulerMixin.redlock_outages`, and holds the slot back. Beat
then tries the claim again with the same task id every
``redlock_beat_retry_interval`` seconds (more often near the end of a short
slot), and sends the slot as soon as a quorum answers, **as long as the slot is
still due**: until the next occurrence of the entry begins. A slot that passes
meanwhile is logged as not sent (ERROR) and counted in
:attr:`~RedlockSchedulerMixin.redlock_missed`. Set
``redlock_beat_publish_on_outage = True`` to publish anyway during an outage
(an ERROR is still logged): every beat then sends the slot.

When beats race for a slot and split the nodes so that none holds a majority,
each withdraws and retries after a random pause of up to ``2 * node_timeout``
(three attempts in all), then holds the slot back as during an outage. A claim
seen on some nodes but not on a majority (its holder won with a node this beat
cannot reach) is told from a racing claim by reading again, without claiming,
once the racing claim would have been withdrawn.

``apply_async`` returns the ``AsyncResult`` when this beat sent the slot, and a
falsy :class:`SlotSkipped` (whose ``id`` is None) when it did not. Not None:
RedBeat logs ``result.id`` of whatever ``apply_async`` returns.

Settings (``app.conf``)
=======================

``redlock_beat_publish_on_outage`` (default ``False``)
    Publish a due slot without a claim when the quorum is unavailable.
``redlock_beat_min_ttl`` (default ``60.0`` seconds)
    Floor of the lifetime of a slot claim.
``redlock_beat_retry_interval`` (default ``1.0`` second)
    Seconds between claim attempts of a slot held back by an outage (less
    when the slot ends sooner).
"""

from __future__ import annotations

import logging
import math
import os
import socket
import time
from collections import Counter
from datetime import datetime, timezone
from typing import Any, Callable, NamedTuple

from celery.beat import PersistentScheduler, SchedulingError
from celery.schedules import crontab, solar
from celery.schedules import schedule as interval
from celery.utils.time import maybe_make_aware
from kombu.utils.uuid import uuid

from . import metrics
from ._nodes import gather
from .conf import redlock_for, resolve, resolve_beat
from .exceptions import ConfigurationError, QuorumUnavailable
from .redlock import OWNER_SEP, Redlock

__all__ = [
    "HEADER",
    "RedlockScheduler",
    "RedlockSchedulerMixin",
    "Slot",
    "SlotSkipped",
    "claim_key",
    "compute_slot",
]

logger = logging.getLogger("celery_redlock.beat")

#: Message header carrying the slot (``self.request.redlock_beat_slot`` in the task).
HEADER = "redlock_beat_slot"

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
    now = _epoch(schedule, schedule.now())
    if isinstance(schedule, crontab):
        return _crontab_slot(schedule, _last(schedule, last_run_at, now), now)
    if isinstance(schedule, solar):
        return _solar_slot(schedule, _last(schedule, last_run_at, now), now)
    if isinstance(schedule, interval) and schedule.run_every.total_seconds() > 0:
        return _interval_slot(schedule.run_every.total_seconds(), now)
    return _other_slot(schedule, last_run_at, now)


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


class SlotSkipped:
    """What ``apply_async`` returns when this beat did not send the slot.

    Falsy, with ``id`` None, so callers that test or log the result go on working.

    Attributes:
        entry: the entry name.
        slot: the slot label.
        reason: ``taken`` (another beat sent it), ``outage`` (no quorum: held
            back and retried while due) or ``split`` (no beat won it: retried).
        holder: the claim value of the beat that sent it, when known.
    """

    __slots__ = ("entry", "slot", "reason", "holder")
    id = None

    def __init__(self, entry: str, slot: str, reason: str, holder: str | None = None):
        self.entry = entry
        self.slot = slot
        self.reason = reason
        self.holder = holder

    def __bool__(self) -> bool:
        return False

    @property
    def holder_task_id(self) -> str | None:
        """The id of the message the winning beat sent, when known."""
        return self.holder.split(OWNER_SEP, 1)[0] if self.holder else None

    def __repr__(self) -> str:
        return f"<SlotSkipped {self.entry!r} slot={self.slot} {self.reason} holder={self.holder}>"


class _Held:
    """A slot held back (no quorum, or no winner), retried while it is due."""

    __slots__ = (
        "entry",
        "slot",
        "key",
        "task_id",
        "value",
        "reason",
        "attempts",
        "logged",
        "next_try",
    )

    def __init__(self, entry: Any, slot: Slot, key: str, task_id: str, value: str, reason: str):
        self.entry = entry
        self.reason = reason
        self.slot = slot
        self.key = key
        self.task_id = task_id
        self.value = value
        self.attempts = 1
        self.logged = self.next_try = time.monotonic()

    def plan_retry(self, interval: float, floor: float) -> None:
        """Next attempt in ``interval`` seconds, or sooner so that a short slot gets retries."""
        now = _epoch(self.entry.schedule, self.entry.schedule.now())
        left = self.slot.ends(floor) - now
        self.next_try = time.monotonic() + min(interval, max(0.05, left / 2))


#: Scheduler counter -> metrics event.
_METRIC = {
    "sent": "beat_sent",
    "skipped": "beat_skipped",
    "outages": "beat_outage",
    "missed": "beat_missed",
}

#: Named in configuration errors.
_WHO = "celery_redlock beat de-duplication"


class RedlockSchedulerMixin:
    """Send each slot of each periodic entry once, whatever the number of beats.

    Put it first among the bases of a scheduler class. It overrides
    ``apply_async`` (claim the slot, then publish or skip) and ``tick`` (retry
    slots held back by an outage).

    Attributes:
        redlock_sent: slots this beat claimed and published.
        redlock_skipped: slots another beat had claimed.
        redlock_outages: claim attempts that found no quorum.
        redlock_missed: held-back slots (no quorum, or no winner) that passed unsent.
    """

    #: Seconds between claim attempts of a held-back slot (``redlock_beat_retry_interval``).
    redlock_retry_interval: float = 1.0
    #: Publish without a claim when the quorum is down (``redlock_beat_publish_on_outage``).
    redlock_publish_on_outage: bool = False
    #: Floor of a claim's TTL in seconds (``redlock_beat_min_ttl``).
    redlock_min_ttl: float = 60.0
    #: Claim attempts when racing beats split the nodes so that none won.
    redlock_claim_attempts: int = 3

    app: Any

    def __init__(self, app: Any, *args: Any, **kwargs: Any) -> None:
        self.redlock_sent = 0
        self.redlock_skipped = 0
        self.redlock_outages = 0
        self.redlock_missed = 0
        self._redlock: Redlock | None = None
        self._redlock_held: dict[str, _Held] = {}
        self._redlock_host = socket.gethostname()
        if not kwargs.get("lazy", False):
            # Fail at beat start, before any schedule file is opened.
            self._redlock_setup(app)
        super().__init__(app, *args, **kwargs)  # type: ignore[call-arg]

    # -- configuration --------------------------------------------------------

    def _redlock_setup(self, app: Any) -> Redlock:
        values = resolve_beat(app, owner=_WHO)
        self.redlock_publish_on_outage = values["redlock_beat_publish_on_outage"]
        self.redlock_min_ttl = values["redlock_beat_min_ttl"]
        self.redlock_retry_interval = values["redlock_beat_retry_interval"]
        try:
            self._redlock = redlock_for(app, resolve(app, owner="beat"))
        except ConfigurationError as exc:
            raise ConfigurationError(f"{_WHO}: {str(exc).removeprefix('beat: ')}") from exc
        return self._redlock

    @property
    def redlock(self) -> Redlock:
        """The Redlock client beat claims slots on (the tasks' nodes and settings)."""
        return self._redlock or self._redlock_setup(self.app)

    @property
    def info(self) -> str:
        """Beat's start-up banner lines: the base scheduler's, then the de-duplication's."""
        base = super().info  # type: ignore[misc]
        lines = [base] if base else []
        try:
            redlock = self.redlock
        except ConfigurationError as exc:
            lines.append(f"    . redlock -> NOT CONFIGURED: {exc}")
            return "\n".join(lines)
        outage = "publish anyway" if self.redlock_publish_on_outage else "hold back and retry"
        lines.append(
            f"    . redlock -> one send per slot, quorum {redlock.quorum} of "
            f"{len(redlock.nodes)}: {', '.join(node.name for node in redlock.nodes)}"
        )
        lines.append(
            f"    . redlock keys -> {redlock.key_prefix}:{claim_key('<entry>', '<slot>')} "
            f"(ttl >= {self.redlock_min_ttl:g}s); on outage: {outage}"
        )
        return "\n".join(lines)

    # -- the slot of an entry -------------------------------------------------

    def redlock_slot(self, entry: Any) -> Slot:
        """The slot ``entry`` is due for, computed before it is advanced.

        Override to name slots differently (say, for a custom schedule whose
        due time depends on ``last_run_at``).
        """
        return compute_slot(entry.schedule, entry.last_run_at)

    # -- publishing -----------------------------------------------------------

    def apply_async(
        self, entry: Any, producer: Any = None, advance: bool = True, **kwargs: Any
    ) -> Any:
        """Claim the entry's slot, then publish it (winner) or skip it (loser).

        Returns:
            The ``AsyncResult`` when this beat sent the slot, else a falsy
            :class:`SlotSkipped`.
        """
        # Advance first, as the base class does, so an error cannot make the
        # entry due forever. The slot comes from the entry as it was.
        outgoing = self.reserve(entry) if advance else entry  # type: ignore[attr-defined]
        try:
            slot = self.redlock_slot(entry)
        except Exception as exc:
            raise SchedulingError(
                f"Couldn't compute the beat slot of entry {entry.name!r}: {exc!r}"
            ) from exc
        held = self._redlock_held.pop(entry.name, None)
        if held is not None and held.slot.label != slot.label:
            self._redlock_give_up(held, f"entry {entry.name!r} moved on to slot {slot.label}")
            held = None
        task_id = held.task_id if held else uuid()  # a retried claim keeps its value
        value = OWNER_SEP.join((task_id, self._redlock_host, str(os.getpid())))
        key = claim_key(entry.name, slot.label)
        try:
            won, holder = self._redlock_claim(key, value, slot)
        except QuorumUnavailable as exc:
            return self._redlock_outage(outgoing, slot, key, task_id, value, producer, exc)
        if won:
            return self._redlock_publish(outgoing, slot, task_id, producer)
        if holder is None:
            logger.warning(
                "beat: no beat won slot %s of entry %r on a quorum (racing beats split the "
                "nodes); retrying while it is due",
                slot.label,
                entry.name,
            )
            self._redlock_hold(_Held(outgoing, slot, key, task_id, value, "split"))
            return SlotSkipped(entry.name, slot.label, "split")
        self._redlock_count("skipped", entry.name)
        logger.info(
            "beat: slot %s of entry %r already sent by %s", slot.label, entry.name, _who(holder)
        )
        return SlotSkipped(entry.name, slot.label, "taken", holder)

    def _redlock_claim(self, key: str, value: str, slot: Slot) -> tuple[bool, str | None]:
        """Claim ``key``: (True, value) if ours, (False, holder) if not, (False, None) if undecided.

        A refused claim is withdrawn (``Redlock.claim`` does that), then the
        nodes are read: a value on a quorum is the winner. Another value on
        fewer nodes is either a winner whose quorum includes nodes this beat
        cannot reach, or a racing beat's claim that is about to be withdrawn;
        after that beat's round must have ended, a second read (without
        claiming, so as not to split the nodes again) tells which. With no
        other value about, the beats split the nodes and all withdrew: retry
        after a random pause.
        """
        redlock = self.redlock
        ttl = slot.ttl(self.redlock_min_ttl)
        for attempt in range(self.redlock_claim_attempts):
            if attempt:
                redlock.sleep(redlock.rng() * 2 * redlock.node_timeout)
            if redlock.claim(key, value, ttl=ttl):
                return True, value
            holder, maybe = self._redlock_read(key)
            maybe.discard(value)
            if holder is None and maybe:
                # One claim round (plus its withdrawal) lasts at most two node timeouts.
                redlock.sleep((2 + redlock.rng()) * redlock.node_timeout)
                holder, again = self._redlock_read(key)
                stayed = maybe & again
                if holder is None and stayed:
                    holder = sorted(stayed)[0]
            if holder == value:
                # Our claim landed on a quorum though its replies were lost, and
                # the withdrawal did not reach those nodes: the slot is ours.
                return True, value
            if holder is not None:
                return False, holder
        return False, None

    def _redlock_read(self, key: str) -> tuple[str | None, set[str]]:
        """Read claim ``key`` on every node.

        Returns:
            The value a quorum of nodes holds (or None), and the values that
            may hold a quorum counting the nodes that did not answer.
        """
        redlock = self.redlock
        replies = gather(
            redlock.nodes, ("GET", f"{redlock.key_prefix}:{key}"), redlock.node_timeout
        )
        silent = sum(1 for r in replies if isinstance(r, Exception))
        votes = Counter(
            r.decode() if isinstance(r, bytes) else r
            for r in replies
            if isinstance(r, (bytes, str))
        )
        for value, count in votes.items():
            if count >= redlock.quorum:
                return value, {value}
        return None, {value for value, count in votes.items() if count + silent >= redlock.quorum}

    def _redlock_publish(self, entry: Any, slot: Slot, task_id: str, producer: Any) -> Any:
        """Publish ``entry`` through the base class, with our task id and the slot header."""
        options = dict(entry.options or {})
        options["task_id"] = task_id
        options["headers"] = {**(options.get("headers") or {}), HEADER: slot.label}
        result = super().apply_async(  # type: ignore[misc]
            _with_options(entry, options), producer=producer, advance=False
        )
        self._redlock_count("sent", entry.name)
        return result

    def _redlock_outage(
        self,
        entry: Any,
        slot: Slot,
        key: str,
        task_id: str,
        value: str,
        producer: Any,
        exc: Exception,
    ) -> Any:
        self._redlock_count("outages", entry.name)
        if self.redlock_publish_on_outage:
            logger.error(
                "beat: Redlock quorum unavailable, publishing slot %s of entry %r WITHOUT a claim "
                "(redlock_beat_publish_on_outage); other beats may send it too: %s",
                slot.label,
                entry.name,
                exc,
            )
            return self._redlock_publish(entry, slot, task_id, producer)
        logger.error(
            "beat: Redlock quorum unavailable, slot %s of entry %r NOT sent; retrying while it "
            "is due: %s",
            slot.label,
            entry.name,
            exc,
        )
        self._redlock_hold(_Held(entry, slot, key, task_id, value, "outage"))
        return SlotSkipped(entry.name, slot.label, "outage")

    def _redlock_hold(self, held: _Held) -> None:
        held.plan_retry(self.redlock_retry_interval, self.redlock_min_ttl)
        self._redlock_held[held.entry.name] = held

    def _redlock_count(self, counter: str, entry_name: str) -> None:
        """Count in the scheduler's attribute and in :mod:`celery_redlock.metrics`."""
        setattr(self, f"redlock_{counter}", getattr(self, f"redlock_{counter}") + 1)
        metrics.count(_METRIC[counter], entry_name)

    def _redlock_give_up(self, held: _Held, why: str) -> None:
        self._redlock_count("missed", held.entry.name)
        cause = "no Redlock quorum" if held.reason == "outage" else "no beat won it on a quorum"
        logger.error(
            "beat: slot %s of entry %r was NOT sent: %s while it was due (%s, %d attempts)",
            held.slot.label,
            held.entry.name,
            cause,
            why,
            held.attempts,
        )

    # -- retrying held-back slots ---------------------------------------------

    def tick(self, *args: Any, **kwargs: Any) -> Any:
        """Retry held-back slots, run the scheduler's tick, wake up for the next retry."""
        if self._redlock_held:
            self._redlock_retry_held()
        delay = super().tick(*args, **kwargs)  # type: ignore[misc]
        if self._redlock_held:
            wait = max(0.0, min(h.next_try for h in self._redlock_held.values()) - time.monotonic())
            if delay is None or delay > wait:
                delay = wait
        return delay

    def _redlock_retry_held(self) -> None:
        for name, held in list(self._redlock_held.items()):
            now = _epoch(held.entry.schedule, held.entry.schedule.now())
            if not held.slot.still_due(now, self.redlock_min_ttl):
                del self._redlock_held[name]
                self._redlock_give_up(held, "its time passed")
                continue
            # Once per retry interval: the base tick may return 0 many times in a row.
            if time.monotonic() < held.next_try:
                continue
            held.plan_retry(self.redlock_retry_interval, self.redlock_min_ttl)
            held.attempts += 1
            try:
                won, holder = self._redlock_claim(held.key, held.value, held.slot)
            except QuorumUnavailable as exc:
                self._redlock_count("outages", name)
                held.reason = "outage"
                if time.monotonic() - held.logged >= 60:
                    held.logged = time.monotonic()
                    logger.error(
                        "beat: still no Redlock quorum for slot %s of entry %r "
                        "after %d attempts: %s",
                        held.slot.label,
                        name,
                        held.attempts,
                        exc,
                    )
                continue
            if holder is None:
                continue  # split again: next tick
            del self._redlock_held[name]
            if not won:
                self._redlock_count("skipped", name)
                logger.info(
                    "beat: slot %s of entry %r was sent by %s meanwhile",
                    held.slot.label,
                    name,
                    _who(holder),
                )
                continue
            logger.info(
                "beat: Redlock quorum back, sending held-back slot %s of entry %r (attempt %d)",
                held.slot.label,
                name,
                held.attempts,
            )
            try:
                self._redlock_publish(held.entry, held.slot, held.task_id, self.producer)  # type: ignore[attr-defined]
            except Exception as exc:  # as Scheduler.apply_entry: log, never stop beat
                logger.error("beat: Message Error: %s", exc, exc_info=True)


def _who(value: str) -> str:
    """A claim value ``task_id|host|pid`` for people: ``host pid N (task id)``."""
    task_id, _, rest = value.partition(OWNER_SEP)
    host, _, pid = rest.partition(OWNER_SEP)
    return f"{host} pid {pid} (task {task_id})" if pid else value


def _with_options(entry: Any, options: dict) -> Any:
    """A shallow copy of ``entry`` with other options.

    Built without calling ``__init__`` or ``__reduce__``: ``ScheduleEntry``'s
    would re-bind the shared schedule object to no app.
    """
    clone = object.__new__(type(entry))
    try:
        clone.__dict__.update(vars(entry))
    except TypeError:  # pragma: no cover - an entry class with __slots__
        import copy

        clone = copy.copy(entry)
    clone.options = options
    return clone


class RedlockScheduler(RedlockSchedulerMixin, PersistentScheduler):
    """Celery's default ``PersistentScheduler``, sending each slot once across all beats.

    ``celery -A proj beat -S celery_redlock.beat:RedlockScheduler``
    """
