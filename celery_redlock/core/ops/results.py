"""What a node answers an operation (:mod:`.operations`): one value per answer.

The codec under the seam (:mod:`celery_redlock.core.nodes.codec`) builds them
from a kind's reply; the core reads their fields. Times are whole ms.
"""

from __future__ import annotations

from .base import value

__all__ = [
    "AllHeld",
    "Booked",
    "Claimed",
    "Count",
    "Done",
    "Empty",
    "Extended",
    "Fields",
    "Finished",
    "Full",
    "Granted",
    "GrantedPermit",
    "GrantedRated",
    "HandPending",
    "Handed",
    "Held",
    "InQueue",
    "Inspected",
    "Issued",
    "KeyType",
    "Later",
    "Page",
    "Peeked",
    "QueueFull",
    "QueueHead",
    "QueueStep",
    "Remaining",
    "Scheduled",
    "Scores",
    "Sooner",
    "Taken",
    "TakenOut",
    "TooEarly",
    "Value",
]


@value
class Granted:
    """The key is set to the caller's owner value (or was already: a re-sent acquire)."""

    #: The node's fence value, moved on by this grant; None with fencing off (or lazy).
    fence: str | None = None


@value
class GrantedPermit(Granted):
    """A permit is granted (and one of each name held together)."""

    #: The index of the permit granted (0-based).
    index: int = 0
    #: Other names held together: (fence, index) per other name.
    also: tuple[tuple[str | None, int], ...] = ()


@value
class GrantedRated(GrantedPermit):
    """A rated acquire's grant (a lock's: ``index`` 0, no ``also``)."""

    #: Phase 1's booking of the start (None: booked before).
    booking: Booked | None = None


@value
class Held:
    """Another owner holds the key (of permits: the one that frees first)."""

    holder: str | None
    pttl_ms: int
    #: The name's claim seen beside it (a started mark as kept), when a gate read it.
    claim: str | None = None


@value
class Finished:
    """A receipt says the caller's id already finished."""


@value
class Claimed:
    """A claim (or a throttled slot) names another id."""

    claimant: str | None
    pttl_ms: int


@value
class TooEarly:
    """A throttled name was granted less than a period ago."""

    wait_ms: int


@value
class Full:
    """A name held together with the caller's (``other``, 1-based) has no permit free."""

    other: int
    holder: str | None
    pttl_ms: int


@value
class Later:
    """A rated grant whose booked instant is not due: the key was let go at once."""

    booking: Booked | None = None


@value
class Booked:
    """A rate's phase 1: the instant booked, each hash's new version, each window's
    TAT before (``"-"`` where it had none)."""

    at_ms: int
    versions: tuple[str, ...]
    tats: tuple[str, ...]


@value
class Sooner:
    """A rate's phase 1 with a floor: a start is admitted sooner; nothing was booked."""

    at_ms: int


@value
class Done:
    """A yes-or-no step: the claim is mine, the token recorded, the phase stood."""

    ok: bool


@value
class Count:
    """How many keys a deletion took."""

    n: int


@value
class Extended:
    """Per key of an extend, in order: renewed (the key held its owner)."""

    renewed: tuple[bool, ...]


@value
class Issued:
    """A lazy lease's fence value; None where the node no longer holds the owner."""

    fence: str | None


@value
class Inspected:
    """A lock key and its fence key as one node holds them."""

    holder: str | None
    pttl_ms: int
    fence: str | None


@value
class Peeked:
    """Any key's value and PTTL on one node."""

    value: str | None
    pttl_ms: int


@value
class Taken:
    """A claim names the caller now: ``previous`` it took over, ``renewed`` it already did."""

    previous: str | None = None
    renewed: bool = False


@value
class Scheduled:
    """A coalesced call's schedule: ``"later"``, ``"now"`` or ``"dropped"``."""

    state: str
    #: The id it took over from (``later``), or that holds the period (``dropped``).
    other: str | None
    #: The due time, in ms since the epoch, as the node keeps it (a throttle's slot).
    slot: str


@value
class InQueue:
    """A parked id waits: its place (1: next), its ticket, and the ids taken out first."""

    position: int
    ticket: int
    superseded: tuple[str, ...] = ()


@value
class QueueFull:
    """The queue already holds its most ids."""

    waiting: int


@value
class QueueStep:
    """A queue's next step on one node; ``removed``: the id to drop was taken out."""

    removed: bool


@value
class HandPending(QueueStep):
    """A hand-over is pending: the claim names a waiting id."""

    claimant: str | None = None
    pttl_ms: int = 0


@value
class Empty(QueueStep):
    """Nobody waits."""


@value
class AllHeld(QueueStep):
    """Every lock key (or permit) is held."""

    held: int = 0


@value
class Handed(QueueStep):
    """The claim now names ``id``, the first waiting (``waiting`` counts it)."""

    id: str | None = None
    call: str | None = None
    ticket: str | None = None
    waiting: int = 0


@value
class TakenOut(QueueStep):
    """The id was taken out; no hand-over was asked for."""


@value
class QueueHead:
    """A queue as one node holds it: how many wait, the first id and its call."""

    waiting: int
    first: str | None
    call: str | None


# -- the plain reads' answers ----------------------------------------------------


@value
class Value:
    """A key's value (None: no such key)."""

    value: str | None


@value
class Fields:
    """A hash's (field, value) pairs."""

    items: tuple[tuple[str, str], ...]


@value
class Scores:
    """A sorted set's (member, score) pairs, lowest score first."""

    items: tuple[tuple[str, float], ...]


@value
class KeyType:
    """What a key holds: ``"string"``, ``"hash"``, ``"zset"``, or ``"none"`` (no such key)."""

    name: str


@value
class Remaining:
    """A key's remaining time to live in ms: -1 no TTL, -2 no such key."""

    pttl_ms: int


@value
class Page:
    """A scan's keys, and the cursor to go on from ("0": done)."""

    cursor: str
    keys: tuple[str, ...]
