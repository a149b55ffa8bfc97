"""Run several ``celery beat`` processes; each periodic slot is sent once, by one of them.

Celery expects exactly one beat. Run two and every periodic task is sent twice;
run one and a crashed host means no periodic tasks until someone notices.
:class:`RedlockScheduler` lets you run a beat on every host you like::

    celery -A proj beat -S celery_redlock.beat:RedlockScheduler

Before publishing a due entry, each beat claims the entry's current **slot**
(:mod:`celery_redlock.slots` names it) on the Redlock quorum, with the nodes and
settings the tasks use. The first beat to claim it sends the task; the others
skip the publish and move their own schedule on, exactly as if they had sent
it. Only the sender logs Celery's "Sending due task"; the others log (at INFO)
that they skipped the slot and which beat sent it. A beat that dies leaves
nothing to clean up. A slot is sent at most once, never twice: a beat killed
(SIGKILL, a crash) between its claim and its publish, the length of one round
trip, takes that one slot with it, and the next slot goes out as usual. A
beat told to stop (SIGTERM, SIGINT) in that moment stops right after the
publish: the signal waits for it. Whether a run may start while the previous
one is still running is the task lock's business: make the task a
``LockedTask``.

The mixin composes with any scheduler that publishes through
``Scheduler.apply_async``::

    from django_celery_beat.schedulers import DatabaseScheduler
    from celery_redlock.beat import RedlockSchedulerMixin

    class Scheduler(RedlockSchedulerMixin, DatabaseScheduler): pass

(With RedBeat, set ``redbeat_lock_key = None`` to run all beats active, or keep
its lock and let the mixin cover the fail-over gap, where two beats can both
believe they lead.)

The claim's value is ``{task id}|{host}|{pid}`` of the beat that sent the slot.
The task is published with that task id and a ``redlock_beat_slot`` header
holding the slot label (``self.request.redlock_beat_slot`` in the task).
``apply_async`` returns the ``AsyncResult`` when this beat sent the slot, and a
falsy :class:`SlotSkipped` (``id`` None, since RedBeat logs ``result.id``) when
it did not.

When fewer than a majority of nodes answer, beat neither skips the slot
silently nor sends it without a claim: it logs an ERROR, counts it in
:attr:`~RedlockSchedulerMixin.redlock_outages`, holds the slot back and claims
it again with the same task id until a quorum answers, **as long as the slot is
still due**; a slot that passes meanwhile is logged and counted in
:attr:`~RedlockSchedulerMixin.redlock_missed`. When racing beats split the
nodes so that none holds a majority, each withdraws and retries after a random
pause (three attempts), then holds the slot back likewise. While a node hangs,
every claim waits ``redlock_node_timeout`` for it, and a losing beat about
three times that: keep the node timeout small. Clock skew between beat hosts
shifts which beat wins, never duplicates a slot, as long as it stays well below
the claim TTL.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from typing import Any

from celery.beat import PersistentScheduler, SchedulingError
from celery.schedules import schedstate
from kombu.utils.uuid import uuid

from . import metrics, settings
from .conf import redlock_for, resolve, resolve_beat
from .core import OWNER_SEP, Redlock
from .exceptions import ConfigurationError, QuorumUnavailable
from .slot_claims import HeldSlot, SlotSkipped, claim_slot, claimant_text, stop_deferred
from .slots import Slot, claim_key, compute_slot, grid_aligned, schedule_now, until_next_cell

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
#: Celery's beat logger: "Sending due task" is said there, by the beat that sends.
celery_logger = logging.getLogger("celery.beat")

#: Message header carrying the slot (``self.request.redlock_beat_slot`` in the task).
HEADER = "redlock_beat_slot"


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
    redlock_retry_interval: float = settings.default("redlock_beat_retry_interval")
    #: Publish without a claim when the quorum is down (``redlock_beat_publish_on_outage``).
    redlock_publish_on_outage: bool = settings.default("redlock_beat_publish_on_outage")
    #: Floor of a claim's TTL in seconds (``redlock_beat_min_ttl``).
    redlock_min_ttl: float = settings.default("redlock_beat_min_ttl")
    #: Claim attempts when racing beats split the nodes so that none won.
    redlock_claim_attempts: int = 3

    app: Any

    def __init__(self, app: Any, *args: Any, **kwargs: Any) -> None:
        self.redlock_sent = 0
        self.redlock_skipped = 0
        self.redlock_outages = 0
        self.redlock_missed = 0
        self._redlock: Redlock | None = None
        self._redlock_held: dict[str, HeldSlot] = {}
        #: The entry last reserved and the slot it was reserved for.
        self._redlock_reserved: tuple[Any, Slot | None] | None = None
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
            raise type(exc)(f"{_WHO}: {str(exc).removeprefix('beat: ')}") from exc
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

    def reserve(self, entry: Any) -> Any:
        """Advance ``entry`` as the base class does; an interval entry stays on the
        epoch grid its slots are cut from (see :func:`~celery_redlock.slots.grid_aligned`).

        The slot is taken here, at the same instant: a tick that crosses a cell
        boundary before it publishes still sends the slot of the cell it
        advanced from, and is due again in the next one (not in the cell it
        already sent).
        """
        try:
            slot: Slot | None = self.redlock_slot(entry)
        except Exception:  # computed again, and reported, when the entry is applied
            slot = None
        self._redlock_reserved = (entry, slot)
        advanced = super().reserve(entry)  # type: ignore[misc]
        if advanced.last_run_at is not None:
            cell = slot.due if slot is not None and slot.kind == "interval" else None
            advanced.last_run_at = grid_aligned(advanced.schedule, advanced.last_run_at, cell)
        return advanced

    def is_due(self, entry: Any) -> Any:
        """The base class's answer, but a due interval entry is next checked at the
        start of its next cell, not a period after this tick: otherwise each run's
        latency (a slow claim round) adds up until a cell is skipped."""
        state = super().is_due(entry)  # type: ignore[misc]
        wait = until_next_cell(entry.schedule) if state[0] else None
        return state if wait is None else schedstate(True, wait)

    # -- publishing -----------------------------------------------------------

    def apply_entry(self, entry: Any, producer: Any = None) -> None:
        """``Scheduler.apply_entry`` without its "Sending due task" line up front.

        Celery says it before publishing; here only the beat that won the slot
        says it (in :meth:`_redlock_publish`), and the others log the skip.
        """
        try:
            result = self.apply_async(entry, producer=producer, advance=False)
        except Exception as exc:  # as Scheduler.apply_entry: log, never stop beat
            celery_logger.error("Message Error: %s", exc, exc_info=True)
        else:
            if result:
                celery_logger.debug("%s sent. id->%s", entry.task, result.id)

    def apply_async(
        self, entry: Any, producer: Any = None, advance: bool = True, **kwargs: Any
    ) -> Any:
        """Claim the entry's slot, then publish it (winner) or skip it (loser).

        Returns:
            The ``AsyncResult`` when this beat sent the slot, else a falsy
            :class:`SlotSkipped`.
        """
        with stop_deferred():
            return self._redlock_apply_async(entry, producer, advance)

    def _redlock_apply_async(self, entry: Any, producer: Any, advance: bool) -> Any:
        # Advance first, as the base class does, so an error cannot make the
        # entry due forever. The slot comes from the entry as it was.
        outgoing = self.reserve(entry) if advance else entry
        reserved, self._redlock_reserved = self._redlock_reserved, None
        try:
            if reserved is not None and reserved[0] is entry and reserved[1] is not None:
                slot = reserved[1]
            else:
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
        logger.debug("beat: claiming slot %s of entry %r", slot.label, entry.name)
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
            self._redlock_hold(HeldSlot(outgoing, slot, key, task_id, value, "split"))
            return SlotSkipped(entry.name, slot.label, "split")
        self._redlock_count("skipped", entry.name)
        logger.info(
            "beat: skipped slot %s of entry %r (%s): already sent by the beat on %s",
            slot.label,
            entry.name,
            entry.task,
            claimant_text(holder),
        )
        return SlotSkipped(entry.name, slot.label, "taken", holder)

    def _redlock_claim(self, key: str, value: str, slot: Slot) -> tuple[bool, str | None]:
        """Claim ``key``: (True, value) if ours, (False, holder) if not, (False, None) if
        undecided (see :func:`~celery_redlock.slot_claims.claim_slot`)."""
        ttl = slot.ttl(self.redlock_min_ttl)
        return claim_slot(self.redlock, key, value, ttl, self.redlock_claim_attempts)

    def _redlock_publish(self, entry: Any, slot: Slot, task_id: str, producer: Any) -> Any:
        """Publish ``entry`` through the base class, with our task id and the slot header."""
        options = dict(entry.options or {})
        options["task_id"] = task_id
        options["headers"] = {**(options.get("headers") or {}), HEADER: slot.label}
        celery_logger.info("Scheduler: Sending due task %s (%s)", entry.name, entry.task)
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
        self._redlock_hold(HeldSlot(entry, slot, key, task_id, value, "outage"))
        return SlotSkipped(entry.name, slot.label, "outage")

    def _redlock_hold(self, held: HeldSlot) -> None:
        held.plan_retry(self.redlock_retry_interval, self.redlock_min_ttl)
        self._redlock_held[held.entry.name] = held

    def _redlock_count(self, counter: str, entry_name: str) -> None:
        """Count in the scheduler's attribute and in :mod:`celery_redlock.metrics`."""
        setattr(self, f"redlock_{counter}", getattr(self, f"redlock_{counter}") + 1)
        metrics.count(_METRIC[counter], entry_name)

    def _redlock_give_up(self, held: HeldSlot, why: str) -> None:
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
            with stop_deferred():
                self._redlock_retry_held()
        delay = super().tick(*args, **kwargs)  # type: ignore[misc]
        if self._redlock_held:
            wait = max(0.0, min(h.next_try for h in self._redlock_held.values()) - time.monotonic())
            if delay is None or delay > wait:
                delay = wait
        return delay

    def _redlock_retry_held(self) -> None:
        for name, held in list(self._redlock_held.items()):
            now = schedule_now(held.entry.schedule)
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
                    claimant_text(holder),
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
