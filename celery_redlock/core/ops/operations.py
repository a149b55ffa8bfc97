"""The operations the core asks of the nodes: one value per call on one node.

Each names everything its call needs (keys, owner, TTL in ms, gates...); the
codec under the seam (:mod:`celery_redlock.core.nodes.codec`) turns it into what
a kind runs. Every operation is atomic on the keys of one name (a hash slot).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .base import value

if TYPE_CHECKING:
    from ..windows import RateKey

__all__ = [
    "Acquire",
    "AcquirePermit",
    "Claim",
    "ClaimNext",
    "Debounce",
    "Delete",
    "Extend",
    "Fence",
    "Gates",
    "Get",
    "Inspect",
    "Issue",
    "Op",
    "Peek",
    "Ping",
    "QueueNext",
    "QueuePark",
    "QueuePeek",
    "Rate",
    "Rated",
    "Read",
    "ReadHash",
    "ReadScores",
    "ReadTtl",
    "ReadType",
    "Release",
    "ReleasePrefix",
    "Scan",
    "Throttle",
    "Unstart",
]


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
class ReadType:
    """Read what a key holds: :class:`KeyType` (``"none"``: no such key)."""

    key: str


@value
class ReadTtl:
    """Read a key's remaining time to live: :class:`Remaining`."""

    key: str


@value
class Scan:
    """One step of a scan of the node's keys matching the glob ``match``: :class:`Page`."""

    cursor: str
    match: str
    count: int


Read = Ping | Get | Delete | ReadHash | ReadScores | ReadType | ReadTtl | Scan

Op = (
    Acquire | AcquirePermit | Rate | Rated | Unstart | Extend | Release | ReleasePrefix | Issue
    | Fence | Inspect | Peek | Claim | ClaimNext | Debounce | Throttle | QueuePark | QueueNext
    | QueuePeek | Read
)  # fmt: skip
