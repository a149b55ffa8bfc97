"""A lease held: the view of one grant its holder keeps (token, validity,
lost, superseded), renewed by the heartbeat and released by its client
(:mod:`.lease`)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol

from .exceptions import LockLost, LockSuperseded
from .records import Holder

if TYPE_CHECKING:
    from .fencing import Fencing

__all__ = ["FREED", "LAPSED", "NO_QUORUM", "TOO_LATE", "Client", "Lease"]

#: Why a renewal did not keep a lease (its :attr:`Lease.lost_reason`; the heartbeat logs it).
NO_QUORUM = "the renewal reached fewer than a quorum of nodes"
FREED = (
    "the nodes answered that its key no longer holds this owner: it was freed or taken "
    "there while held (an operator's release, or a node that lost its data)"
)
TOO_LATE = "the renewal came after its validity ran out"
#: Why the heartbeat let a lease go without a renewal: it woke too late (a stalled host).
LAPSED = "its validity ran out before it was renewed"


class Client(Protocol):
    """What a lease asks of the client that granted it (a :class:`Redlock`)."""

    clock: Callable[[], float]

    def extend_many(self, leases: Sequence[Lease], ttl: float | None = None) -> list[bool]: ...


class Lease:
    """A granted lock.

    Attributes:
        name: the lock name.
        key: the Redis key of the lock.
        owner: the owner value written on the nodes.
        ttl: the TTL the nodes were given, in seconds.
        permit: the index of the permit held, 0 to K-1 (0 for a plain lock).
        also: the leases of the names taken together with this one (``also=``),
            released with it.
        fencing_token: strictly larger than every earlier grant's (None when
            fencing is off). A lazy lease (``try_acquire(..., fence=False)``)
            issues it on the first read (one round trip; two when the nodes
            disagree), which raises :class:`LockLost` if it no longer lands on
            a quorum.
    """

    __slots__ = (
        "name",
        "key",
        "fence_key",
        "owner",
        "ttl",
        "_token",
        "_pending",
        "_fence_lock",
        "_expires",
        "_lost",
        "_lost_reason",
        "_successor",
        "_redlock",
        "_fencing",
        "permit",
        "also",
        "__weakref__",
    )

    def __init__(
        self,
        redlock: Client,
        name: str,
        key: str,
        fence_key: str,
        owner: str,
        ttl: float,
        fencing_token: int | None,
        expires: float,
        pending: tuple[int, ...] | None = None,
        fencing: Fencing | None = None,
    ):
        self._redlock = redlock
        self._fencing = fencing  # issues a lazy lease's token
        self.name = name
        self.key = key
        self.fence_key = fence_key
        self.owner = owner
        self.ttl = ttl
        self._token = fencing_token
        # Lazy lease: the granting node indexes, until the first read of
        # fencing_token issues the token there.
        self._pending = pending
        self._fence_lock = threading.Lock() if pending else None
        self._expires = expires
        # Set once, by the heartbeat thread or a release; a plain flag is enough.
        self._lost = False
        self._lost_reason: str | None = None
        # Set once, by whoever learns that a newer call asked this holder to stop.
        self._successor: str | None = None
        #: The permit index held (0 for a plain lock; see :meth:`Redlock.permit_keys`).
        self.permit = 0
        #: The leases of the other names held together with this one (``also=``).
        self.also: tuple[Lease, ...] = ()

    @property
    def fencing_token(self) -> int | None:
        """The fencing token; on a lazy lease the first read issues it (may raise LockLost)."""
        token = self._token
        if token is not None or self._pending is None:
            return token
        assert self._fence_lock is not None
        with self._fence_lock:  # concurrent first reads issue it once
            if self._token is None:
                self._token = self._issue()
                self._pending = None
            return self._token

    def _issue(self) -> int:
        """A lazy lease's token, on its first read (see :mod:`.fencing`)."""
        assert self._pending is not None and self._fencing is not None
        written = None
        if not self.lost:
            written = self._fencing.issue(
                self._pending, self.key, self.fence_key, self.owner, self._expires
            )
        # A heartbeat may have marked it lost meanwhile, or shortened it: check again.
        if written is None or self.lost:
            self.mark_lost()
            raise LockLost(
                f"lock {self.name!r} is no longer held: its fencing token could not be issued",
                self.name,
            )
        return written

    @property
    def redlock(self) -> Client:
        """The client that granted the lease."""
        return self._redlock

    @property
    def task_id(self) -> str | None:
        """The id in the owner value (see :func:`make_owner`), if any."""
        return Holder(self.owner, None).task_id

    def remaining(self) -> float:
        """Seconds of validity left (0 or less once it has lapsed)."""
        return self._expires - self._redlock.clock()

    @property
    def lost(self) -> bool:
        """True once a renewal failed to reach a quorum or the validity ran out."""
        return self._lost or self.remaining() <= 0

    def mark_lost(self, reason: str | None = None) -> None:
        """Mark the lease lost; ``reason`` (the first one given) says why."""
        self._lost = True
        if self._lost_reason is None:
            self._lost_reason = reason

    @property
    def lost_reason(self) -> str | None:
        """Why the lease was lost, as its last renewal saw it (None: not known,
        or released by its holder)."""
        return self._lost_reason

    def check(self) -> None:
        """Raise :class:`LockLost` unless the lease is still held, and
        :class:`LockSuperseded` once a newer call asked its holder to stop."""
        if self.lost:
            why = f": {self._lost_reason}" if self._lost_reason else ""
            raise LockLost(f"lock {self.name!r} is no longer held{why}", self.name)
        successor = self._successor
        if successor is not None:
            raise LockSuperseded(
                f"lock {self.name!r}: superseded by task {successor}", self.name, successor
            )

    @property
    def superseded_by(self) -> str | None:
        """The task id of the newer call that asked this holder to stop, if one did."""
        return self._successor

    def supersede(self, successor: str) -> bool:
        """Record that ``successor`` asked this holder to stop; True the first time."""
        if self._successor is not None:
            return False
        self._successor = successor
        return True

    def _renewed(self, expires: float) -> None:
        # Set, not max: a renewal to a shorter TTL shortens the keys on the
        # nodes, so the validity the client trusts must shrink with them.
        self._expires = expires

    def __repr__(self) -> str:
        return (
            f"<Lease {self.name!r} token={'unread' if self._pending else self._token} "
            f"remaining={self.remaining():.3f}s{' LOST' if self.lost else ''}>"
        )
