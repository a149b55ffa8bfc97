"""Claiming a beat slot on the quorum: the claim and read-back protocol, and what
beat keeps of a slot it skipped or held back.

:mod:`celery_redlock.slots` names the slot; :mod:`celery_redlock.beat` claims it
with :func:`claim_slot` before publishing, and publishes only if it won.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from .core import OWNER_SEP, Redlock
from .slots import Slot, schedule_now

__all__ = ["HeldSlot", "SlotSkipped", "claim_slot", "claimant_text", "stop_deferred"]


def claim_slot(
    redlock: Redlock, key: str, value: str, ttl: float, attempts: int
) -> tuple[bool, str | None]:
    """Claim ``key``: (True, value) if ours, (False, holder) if not, (False, None) if undecided.

    A refused claim is withdrawn (``Redlock.claim`` does that), then the
    nodes are read: a value on a quorum is the winner. Another value on
    fewer nodes is either a winner whose quorum includes nodes this beat
    cannot reach, or a racing beat's claim that is about to be withdrawn;
    after that beat's round must have ended, a second read (without
    claiming, so as not to split the nodes again) tells which. With no
    other value about, the beats split the nodes and all withdrew: retry
    after a random pause, ``attempts`` times in all.

    Raises:
        QuorumUnavailable: fewer than a quorum of the nodes answered.
    """
    for attempt in range(attempts):
        if attempt:
            redlock.sleep(redlock.rng() * 2 * redlock.node_timeout)
        if redlock.claim(key, value, ttl=ttl):
            return True, value
        holder, candidates = redlock.read_claim(key)
        maybe = set(candidates) - {value}
        if holder is None and maybe:
            # One claim round (plus its withdrawal) lasts at most two node timeouts.
            redlock.sleep((2 + redlock.rng()) * redlock.node_timeout)
            holder, again = redlock.read_claim(key)
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


def claimant_text(value: str) -> str:
    """A claim value ``task_id|host|pid`` for people: ``host pid N (task id)``."""
    task_id, _, rest = value.partition(OWNER_SEP)
    host, _, pid = rest.partition(OWNER_SEP)
    return f"{host} pid {pid} (task {task_id})" if pid else value


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


class HeldSlot:
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
        now = schedule_now(self.entry.schedule)
        left = self.slot.ends(floor) - now
        self.next_try = time.monotonic() + min(interval, max(0.05, left / 2))


#: How ``celery beat`` is told to stop: its handler raises SystemExit at once.
_STOP_SIGNALS = {signal.SIGTERM, signal.SIGINT}


@contextmanager
def stop_deferred() -> Iterator[None]:
    """Hold a stop signal back from a slot's claim to its publish.

    ``celery beat`` stops by raising SystemExit from its signal handler
    wherever the main thread is: between a claim and its publish, that would
    leave the slot claimed and never sent (a restart losing a run). Blocked,
    the signal stays pending and is handled the moment the publish is done.
    """
    if not hasattr(signal, "pthread_sigmask") or (
        threading.current_thread() is not threading.main_thread()
    ):
        yield  # signals reach only the main thread (and no mask on Windows)
        return
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)
