"""The operations the core asks of the nodes, and what a node answers: typed values.

An operation is an immutable value naming everything one call on one node needs
(its keys, its owner, its TTL in ms, its gates...); a result is a frozen value
per answer (:func:`value` classes). They cross the node seam both ways: the core builds operations
and reads results' fields, and the codec under the seam
(:mod:`celery_redlock.core.nodes.codec`) is the one place that turns them
into what a kind runs (today: the scripts' KEYS and ARGV) and a kind's reply
back into a result. Times on the nodes are whole ms; ids and owners are text.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from typing_extensions import dataclass_transform

    from .windows import RateKey
else:

    def dataclass_transform(**_: Any) -> Any:
        return lambda decorator: decorator


_T = TypeVar("_T")


@dataclass_transform(frozen_default=True)
def value(cls: type[_T]) -> type[_T]:
    """A value class: a frozen dataclass to the type checker, which refuses any
    assignment to a field. At run time a slotted dataclass with equality and a hash,
    not frozen: a frozen one pays an ``object.__setattr__`` per field in
    ``__init__`` (3.6 times the cost), and these are built on every lock call."""
    return dataclass(slots=True, unsafe_hash=True)(cls)


__all__ = [
    "Acquire",
    "AcquirePermit",
    "AllHeld",
    "Booked",
    "Claim",
    "ClaimNext",
    "Claimed",
    "Count",
    "Debounce",
    "Delete",
    "Done",
    "Empty",
    "Extend",
    "Extended",
    "Fence",
    "Fields",
    "Finished",
    "Full",
    "Gates",
    "Get",
    "Granted",
    "GrantedPermit",
    "GrantedRated",
    "HandPending",
    "Handed",
    "Held",
    "InQueue",
    "Inspect",
    "Inspected",
    "Issue",
    "Issued",
    "Later",
    "Op",
    "Page",
    "Peek",
    "Peeked",
    "Ping",
    "QueueFull",
    "QueueHead",
    "QueueNext",
    "QueuePark",
    "QueuePeek",
    "QueueStep",
    "Rate",
    "Rated",
    "Read",
    "ReadHash",
    "ReadScores",
    "Release",
    "ReleasePrefix",
    "Scan",
    "Scheduled",
    "Scores",
    "Sooner",
    "Taken",
    "TakenOut",
    "Throttle",
    "TooEarly",
    "Unstart",
    "Value",
]


# -- results ------------------------------------------------------------------


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


# -- operations -----------------------------------------------------------------


@value
class Gates:
    """The checks an acquire makes for its caller's ``id`` (see ``scripts.shared.GATES``).

    Each key is the real one when its check applies; a permit passes its lock key as a
    stand-in for the others (never read without its flag)."""

    id: str
    receipt_key: str
    claim_key: str
    #: The receipt at ``receipt_key`` means the id already finished.
    receipts: bool = False
    #: ``"check"``: another id's claim stops the grant; ``"take"``: so, and mine is withdrawn.
    claim: str | None = None
    #: The caller was claimed at publish: another id's started mark stops it too.
    own_claim: bool = False
    #: At most one grant per this many ms (with ``throttle_key``); None: no throttle.
    throttle_ms: int | None = None
    throttle_key: str = ""
    #: The client's clock in ms, for the throttle.
    now_ms: int = 0
    #: A throttled call's planned slot.
    slot: str = ""


@value
class Acquire:
    """Set ``key`` to ``owner`` for ``ttl_ms`` unless another owner holds it."""

    key: str
    fence_key: str
    owner: str
    ttl_ms: int
    #: The fence value's retention in ms; "" moves no fence value (fencing off, or lazy).
    fence: str
    #: The client's clock in microseconds (a fence value's seed).
    now_us: int
    gates: Gates | None = None


@value
class AcquirePermit:
    """Take one of a name's permits, and one of each name held together, all or nothing."""

    #: Per name (the caller's first): its permit keys, and its fence key.
    groups: tuple[tuple[str, ...], ...]
    fences: tuple[str, ...]
    owner: str
    ttl_ms: int
    fence: str
    now_us: int
    #: The caller's id: a permit held by another copy of it stops the grant.
    task_id: str | None
    gates: Gates | None = None
    #: Per name: the preferred index ("" for none).
    prefer: tuple[str, ...] = ("",)


@value
class Rate:
    """A rate reservation's phase on ``keys``: ``"1"`` book, ``"2"`` compare-and-set at
    ``third`` (s*), ``"0"`` undo (``third``: where the booking goes, then the TATs)."""

    keys: tuple[RateKey, ...]
    phase: str
    now_ms: int
    third: str = ""
    #: Phases 2 and 0: the versions phase 1 answered, one per key.
    versions: tuple[str, ...] = ()


@value
class Rated:
    """An acquire that also books (or, ``booked``, only records) a rated start."""

    acquire: Acquire | AcquirePermit
    keys: tuple[RateKey, ...]
    booked: bool
    now_ms: int
    due_ms: int
    keep_ms: int
    cap: int
    #: The acquire's keys a grant sets to its owner (let go when booked for later).
    held: tuple[str, ...]


@value
class Unstart:
    """Free the lock keys ``owner`` holds among ``keys`` and take its recorded start back."""

    keys: tuple[str, ...]
    starts: tuple[str, ...]
    owner: str


@value
class Extend:
    """Set the TTL of each key that holds its owner: (key, owner, ttl_ms) per lease."""

    leases: tuple[tuple[str, str, int], ...]


@value
class Release:
    """Delete ``key`` where it holds ``owner``; with a receipt and a claim to withdraw."""

    key: str
    owner: str
    receipt_key: str | None = None
    claim_key: str | None = None
    #: The receipt's TTL in ms ("" for none).
    receipt: str = ""
    #: An id whose claim is withdrawn ("" for none).
    withdraw: str = ""


@value
class ReleasePrefix:
    """Delete each of ``keys`` whose owner value starts with ``prefix``."""

    keys: tuple[str, ...]
    prefix: str


@value
class Issue:
    """A lazy lease's token: move the fence value on where ``key`` holds ``owner``."""

    key: str
    fence_key: str
    owner: str
    fence: str
    now_us: int


@value
class Fence:
    """Record ``token`` where ``key`` holds ``owner`` (``strict``: only a larger one)."""

    key: str
    fence_key: str
    owner: str
    token: str
    fence: str
    strict: bool = False


@value
class Inspect:
    """Read a lock key and its fence key."""

    key: str
    fence_key: str


@value
class Peek:
    """Read any key's value and PTTL."""

    key: str


@value
class Claim:
    """Set a claim key to ``value`` unless another value is there."""

    key: str
    value: str
    ttl_ms: int


@value
class ClaimNext:
    """Point a name's claim at ``claimant`` (``replace``: take it over from another)."""

    key: str
    claimant: str
    ttl_ms: int
    replace: bool = False


@value
class Debounce:
    """Take a name's claim over for a call due ``delay_ms`` from ``now_ms``."""

    claim_key: str
    burst_key: str
    claimant: str
    now_ms: int
    delay_ms: str
    cap_ms: str
    ttl_ms: str


@value
class Throttle:
    """Plan a call on a name started at most once per ``period_ms``."""

    claim_key: str
    throttle_key: str
    claimant: str
    now_ms: int
    period_ms: str
    trailing: bool
    ttl_ms: str


@value
class QueuePark:
    """Put ``id`` (and ``call``) at the back of a queue (see :mod:`..queues`)."""

    queue_key: str
    calls_key: str
    id: str
    call: str
    most: int
    retention_ms: int
    ticket: str = ""
    supersede: bool = False


@value
class QueueNext:
    """Take ``drop`` out of a queue, then (with ``claim_ms``) hand the name over."""

    claim_key: str
    queue_key: str
    calls_key: str
    lock_keys: tuple[str, ...]
    drop: str
    owner: str
    claim_ms: str
    retention_ms: int


@value
class QueuePeek:
    """Read a queue's length and its first id."""

    queue_key: str
    calls_key: str


# -- plain reads (and the operator's deletion): no script, one step on one key --------


@value
class Ping:
    """Is the node there: :class:`Done` or the node's error."""


@value
class Get:
    """Read a key's value: :class:`Value`."""

    key: str


@value
class Delete:
    """Delete a key, whatever it holds: :class:`Count`."""

    key: str


@value
class ReadHash:
    """Read a hash's fields: :class:`Fields`."""

    key: str


@value
class ReadScores:
    """Read a sorted set, lowest score first: :class:`Scores`."""

    key: str


@value
class Scan:
    """One step of a scan of the node's keys matching the glob ``match``: :class:`Page`."""

    cursor: str
    match: str
    count: int


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
class Page:
    """A scan's keys, and the cursor to go on from ("0": done)."""

    cursor: str
    keys: tuple[str, ...]


Read = Ping | Get | Delete | ReadHash | ReadScores | Scan

Op = (
    Acquire | AcquirePermit | Rate | Rated | Unstart | Extend | Release | ReleasePrefix | Issue
    | Fence | Inspect | Peek | Claim | ClaimNext | Debounce | Throttle | QueuePark | QueueNext
    | QueuePeek | Read
)  # fmt: skip
