"""
Redlock: a lease on a majority of N independent Redis masters, with fencing tokens.

The guarantee
=============

While the timing assumptions below hold, at most one owner holds a lease on a
given name at any moment. When they do not hold, the **fencing token** is what
keeps the protected resource safe: every grant of a name carries a token
strictly larger than every earlier grant's, so a resource that remembers the
largest token it has seen can reject a write from a stale holder.

Assumptions:

* Clocks on the client and the nodes advance at about the same rate: drift is
  bounded by ``drift_factor`` (1 % of the TTL by default, plus 2 ms).
* A holder does not pause (GC, SIGSTOP, swap) for longer than the validity it
  has left. If it does, its lease lapses silently; the token is the backstop.
* A node that restarts keeps its keys (fsync'd AOF), or stays down for at least
  the longest TTL before rejoining. Fencing tokens survive even a node that
  comes back empty, through the time floor described in :mod:`.fencing`.
* Quorum is ``N // 2 + 1`` **of all configured nodes**, never of the reachable
  ones, so two partitions can never both hold a majority.

The parts
=========

:class:`Redlock` is a facade over one part per primitive, each in a module of
its own:

* :mod:`.quorum`: the nodes, one scatter-gather round, quorum and validity;
  under it the nodes themselves: :mod:`.nodes` (a node, its idle connections
  and circuit breaker), :mod:`.urls` (``redis://`` ... ``sentinel://``),
  :mod:`.rounds` (one round; a script's round), :mod:`.replicas` (the
  ``WAIT`` behind a write with ``min_replicas``), :mod:`.unwaited` (a
  deletion whose reply is read later), :mod:`.opening` and
  :mod:`.connect` (new connections and sentinels asked in the background),
  :mod:`.wire` (RESP on the sockets: redis-py's private names, only there);
* :mod:`.lease`: acquire, extend and release of a name's lock key;
* :mod:`.fencing`: the fencing tokens and their write-back (phase 2);
* :mod:`.permits`: K holders of a name, and several names taken together;
* :mod:`.claims`: claims on a name's next holder, debounce and throttle;
* :mod:`.queues`: a name's calls waiting in publish order, and the hand-over;
* :mod:`.inspect`: read-only views for the tools, and the force release;
* :mod:`.rates`: rate reservations, at most N starts per window (GCRA on the quorum);
* :mod:`.nodes`: the node seam: typed operations to every kind, and under it the
  Lua of the Redis kind (also run by the kinds of :mod:`.nodes.virtual`);
* :mod:`.settings`: every setting and option, declared once.

Each operation is one round trip (one script call per node, sent to every
node at once), plus the fence write-back when the nodes disagree, and the
release of a failed attempt.

Keys
====

``{prefix}:lock:{name}`` and ``{prefix}:fence:{name}``; with permits, also
``{prefix}:permit:{name}:{i}`` for i = 1 .. K-1 (see :mod:`.keyspace`); a rated
name's ``{prefix}:rate:{name}`` (see :mod:`.rates`).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Generic, TypeVar, overload

from . import settings
from .claims import Claims
from .exceptions import ConfigurationError, LockNotAcquired
from .fencing import Fencing
from .inspect import Inspection
from .keyspace import KeySpace
from .lease import NOBODY, Caller, Lease, Leases
from .nodes import Node, NodeSpec
from .permits import Permits
from .queues import Queues
from .quorum import Quorum
from .rates import Rates
from .records import Claim, Finished, Holder, RateSlot, TooEarly, make_owner
from .steps import Steps, carried, dressed, drive, driven
from .values import checked, positive
from .windows import RateKey

__all__ = ["Redlock"]

T = TypeVar("T")
R = TypeVar("R")


class _Handed:
    """A facade method that is one part's own method, bound to that part when
    read on a Redlock: the part's signature and docstring, and no extra call."""

    def __init__(self, part: str, function: Callable[..., Any]):
        self.part, self.function = part, function
        self.__doc__ = function.__doc__

    def __get__(self, obj: object, owner: type | None = None) -> Any:
        if obj is None:
            return self.function
        return self.function.__get__(getattr(obj, self.part))


if TYPE_CHECKING:  # typed as the part's method with the facade as ``self``
    from typing import Concatenate, ParamSpec

    P = ParamSpec("P")

    def _handed(
        part: str, function: Callable[Concatenate[Any, P], R]
    ) -> Callable[Concatenate[Redlock, P], R]: ...

else:
    _handed = _Handed


class _Kept(Generic[T]):
    """An attribute of the facade kept on one of its parts: one value, read by both."""

    def __init__(self, part: str, attr: str = ""):
        self.part, self.attr = part, attr

    def __set_name__(self, owner: type, name: str) -> None:
        self.attr = self.attr or name

    @overload
    def __get__(self, obj: None, owner: type) -> _Kept[T]: ...
    @overload
    def __get__(self, obj: object, owner: type) -> T: ...
    def __get__(self, obj: object, owner: type) -> Any:
        return self if obj is None else getattr(getattr(obj, self.part), self.attr)

    def __set__(self, obj: object, value: T) -> None:
        setattr(getattr(obj, self.part), self.attr, value)


class Redlock:
    """A Redlock client over N independent Redis masters.

    Args:
        nodes: URLs (``redis://``, ``rediss://``, ``unix://``, ``sentinel://``
            for a Sentinel-managed master: README, "Deployments") or
            ``redis.Redis`` clients; each must be an independent master. One
            node is allowed (a plain single-node lock).
        node_timeout: seconds each node gets to answer, per round; None (the
            default): each node's kind's own (Redis 50 ms, PostgreSQL 250 ms,
            etcd 500 ms: :doc:`settings`).
        connect_timeout: seconds a new connection to a node gets to open
            (connect and handshake), before ``node_timeout`` starts for its
            reply; None (the default): each node's kind's own (1 s).
        drift_factor: clock drift allowed, as a fraction of the TTL.
        key_prefix: first part of every key written.
        fencing: hand out fencing tokens (a second round trip only when the
            granting nodes disagree on the fence value; see :mod:`.fencing`).
        fence_retention: seconds a fence value is kept after its last grant.
        min_replicas: replicas of each node that must confirm (``WAIT``, in the
            same round trip) a grant, a renewal, a fence write or a claim before
            that node counts; for nodes that are a primary with replicas (README,
            "Deployments"). 0 sends no ``WAIT``.
        clock: monotonic clock, seconds (injectable for tests).
        sleep: sleep function (injectable for tests).
        rng: ``random()`` function for jitter.
    """

    #: Rounds a permit acquire spends on a split (nodes granting different indexes).
    PERMIT_ROUNDS = 3
    #: Longest pause, in seconds, before a permit acquire asks again after a split.
    PERMIT_SPLIT_PAUSE = 0.005

    nodes: _Kept[list[Node]] = _Kept("_quorum")
    #: How many nodes make a quorum: ``N // 2 + 1`` of all configured nodes.
    quorum: _Kept[int] = _Kept("_quorum", "needed")
    node_timeout: _Kept[float] = _Kept("_quorum")
    connect_timeout: _Kept[float] = _Kept("_quorum")
    drift_factor: _Kept[float] = _Kept("_quorum")
    min_replicas: _Kept[int] = _Kept("_quorum")
    clock: _Kept[Callable[[], float]] = _Kept("_quorum")
    sleep: _Kept[Callable[[float], None]] = _Kept("_quorum")
    rng: _Kept[Callable[[], float]] = _Kept("_quorum")
    key_prefix: _Kept[str] = _Kept("_keyspace")
    fencing: _Kept[bool] = _Kept("_fencing")
    fence_retention: _Kept[float] = _Kept("_fencing")

    def __init__(
        self,
        nodes: Sequence[NodeSpec],
        *,
        node_timeout: float | None = settings.default("redlock_node_timeout"),
        connect_timeout: float | None = settings.default("redlock_connect_timeout"),
        drift_factor: float = settings.default("redlock_drift_factor"),
        key_prefix: str = settings.default("redlock_key_prefix"),
        fencing: bool = settings.default("redlock_fencing"),
        fence_retention: float = settings.default("redlock_fence_retention"),
        min_replicas: int = settings.default("redlock_min_replicas"),
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        rng: Callable[[], float] = random.random,
    ):
        if isinstance(nodes, (str, bytes)) or not isinstance(nodes, Iterable):
            raise ConfigurationError(
                "nodes must be a list of lock node URLs (redis://, postgresql://, etcd://, ...) "
                "or redis.Redis clients"
            )
        nodes = list(nodes)
        if not nodes:
            raise ConfigurationError("Redlock needs at least one lock node")
        # unset (None) stays None: each node then takes its kind's default
        node_timeout = checked(
            "node_timeout", settings.by_name("redlock_node_timeout").check, node_timeout
        )
        connect_timeout = checked(
            "connect_timeout", settings.by_name("redlock_connect_timeout").check, connect_timeout
        )
        fence_retention = checked("fence_retention", settings.check_seconds, fence_retention)
        drift_factor = checked("drift_factor", settings.check_drift_factor, drift_factor)
        key_prefix = checked("key_prefix", settings.check_key_prefix, key_prefix)
        min_replicas = checked("min_replicas", settings.check_count, min_replicas)
        self._quorum = Quorum(
            nodes, node_timeout, drift_factor, min_replicas, clock, sleep, rng, connect_timeout
        )
        self._keyspace = KeySpace(key_prefix)
        self._fencing = Fencing(self._quorum, fencing, fence_retention)
        self._leases = Leases(self, self._quorum, self._keyspace, self._fencing)
        self._permits = Permits(self._leases)
        self._claims = Claims(self._quorum, self._keyspace, self._leases)
        self._inspection = Inspection(self._quorum, self._keyspace)
        self._rates = Rates(self._quorum, self._keyspace)
        self._queues = Queues(self._quorum, self._keyspace)

    has_quorum = _handed("_quorum", Quorum.has_quorum)
    check_quorum = _handed("_quorum", Quorum.check)
    keys = _handed("_keyspace", KeySpace.keys)
    permit_keys = _handed("_keyspace", KeySpace.permit_keys)
    claim_key = _handed("_keyspace", KeySpace.claim_key)
    coalesce_key = _handed("_keyspace", KeySpace.coalesce_key)
    receipt_key = _handed("_keyspace", KeySpace.receipt_key)
    # The lease's release, and the claims (see celery_redlock.core.claims).
    release = _handed("_leases", Leases.release)
    release_owned_by = _handed("_leases", Leases.release_owned_by)
    claim = _handed("_claims", Claims.claim)
    claim_next = _handed("_claims", Claims.claim_next)
    debounce = _handed("_claims", Claims.debounce)
    throttle = _handed("_claims", Claims.throttle)
    withdraw_claim = _handed("_claims", Claims.withdraw_claim)
    claimant = _handed("_claims", Claims.claimant)
    # Read-only views for the tools, and the operator's force release.
    holder = _handed("_inspection", Inspection.holder)
    inspect = _handed("_inspection", Inspection.inspect)
    inspect_key = _handed("_inspection", Inspection.inspect_key)
    agreed = _handed("_inspection", Inspection.agreed)
    scan = _handed("_inspection", Inspection.scan)
    read_claim = _handed("_inspection", Inspection.read_claim)
    force_release = _handed("_inspection", Inspection.force_release)
    node_info = _handed("_inspection", Inspection.node_info)
    # A name's waiting calls (see celery_redlock.core.queues).
    park = _handed("_queues", Queues.park)
    queue_next = _handed("_queues", Queues.next)
    queue_keys = _handed("_queues", Queues.queue_keys)
    queue_peek = _handed("_queues", Queues.peek)
    # Rate reservations (see celery_redlock.core.rates).
    rate = _handed("_rates", Rates.rate)

    def __repr__(self) -> str:
        return f"<Redlock {len(self.nodes)} nodes quorum={self.quorum} prefix={self.key_prefix!r}>"

    def _trying(
        self,
        name: str,
        *,
        ttl: float,
        owner: str | None = None,
        fence: bool = True,
        task_id: str | None = None,
        receipts: bool = False,
        claim: str | None = None,
        own_claim: bool = False,
        throttle: float | None = None,
        slot: str | None = None,
        limit: int = 1,
        also: Sequence[tuple[str, int]] = (),
        rates: Sequence[RateKey] = (),
        booked: bool = False,
    ) -> Steps[Lease | Holder | Claim | Finished | TooEarly | RateSlot]:
        """One attempt: the :class:`Lease`, or what is in the way.

        On a plain lock with no gate and no rate, an attempt that contenders
        split (nobody holds a quorum) is made again after a random pause of up
        to ``node_timeout``, twice at most, before it counts as contended.

        With ``limit`` K > 1 the lease is one of K permits of the name (see
        :mod:`.permits`); the :class:`Holder` returned when all are held is the
        one whose permit frees first. ``also``: other ``(name, limit)`` pairs
        held together with ``name``, all or nothing, in the same round; the
        lease carries their leases in :attr:`Lease.also`.

        With ``fence=False`` (and fencing on) the acquire moves no fence value:
        the token is issued on the first read of ``lease.fencing_token`` (one
        round, two when the nodes disagree; see :mod:`.fencing`).

        With ``task_id`` (the caller's id; the owner value's first field), the
        same round also looks at:

        * ``receipts=True``: a receipt of ``task_id`` (written by
          :meth:`release` with ``receipt=``) means it already finished:
          :class:`Finished` is returned and nothing is held.
        * ``claim="check"`` or ``"take"``: the name's claim
          (:meth:`claim_next`). A free name claimed by another id is not
          granted: that :class:`Claim` is returned. A :class:`Holder` carries
          the claimant seen beside it. With ``"take"``, a claim naming
          ``task_id`` is withdrawn where the lease is granted.
          With ``own_claim`` (the caller was claimed at publish), the mark
          of another id's claimed run that started stops the grant too: that
          run superseded the caller. No claim at all (it lapsed, or was never
          written on these nodes) stops nothing.
        * ``throttle`` (seconds): at most one grant per period (see
          :meth:`throttle`); an earlier attempt gets :class:`TooEarly`. With
          ``slot`` (:attr:`Schedule.slot`), a slot taken over by another id
          returns that :class:`Claim`.

        ``rates`` (:class:`RateKey` values, see :meth:`rate`): the start is rated,
        and the same round books it where the lock is granted (a contended
        start books nothing) and records it in each key's sorted set of
        starts. Booked for later, nothing is held and the :class:`RateSlot`
        is returned: the booking stands, and the start comes back at
        ``slot.start_at`` with ``booked=True`` (then the round only records
        the start). Not ``slot.reserved``: concurrent bookings split the
        nodes; ask again after a short pause.

        Raises:
            QuorumUnavailable: fewer than a quorum of nodes answered.
        """
        positive("ttl", ttl)
        owner = owner or make_owner()
        plain = limit == 1 and limit.__class__ is int and not also  # True == 1, but is no limit
        caller = NOBODY  # (no task: no gate)
        if task_id is not None:
            caller = Caller(task_id, receipts, claim, own_claim, throttle, slot)
        if not rates and plain:  # the usual call
            return self._leases.acquiring(name, ttl, owner, fence, caller)
        rounds = (self.PERMIT_ROUNDS, self.PERMIT_SPLIT_PAUSE)
        if not rates:
            return self._permits.trying(name, ttl, owner, caller, limit, also, rounds)

        def rated() -> Lease | Holder | Claim | Finished | TooEarly | RateSlot:
            booking = self._rates.booking(name, rates, booked)
            if isinstance(booking, RateSlot):
                return booking
            if plain:
                steps = self._leases.acquiring(name, ttl, owner, fence, caller, booking)
            else:
                steps = self._permits.trying(name, ttl, owner, caller, limit, also, rounds, booking)
            return drive(self._quorum, steps)

        # a rated start's bookings are the sync client's own calls (an asyncio
        # client carries them in a thread)
        return carried(rated)

    def _acquiring(
        self,
        name: str,
        *,
        ttl: float,
        blocking: bool = False,
        timeout: float | None = None,
        owner: str | None = None,
        retry_delay: float = 0.05,
        retry_delay_max: float = 1.0,
        fence: bool = True,
        limit: int = 1,
        also: Sequence[tuple[str, int]] = (),
    ) -> Steps[Lease | None]:
        """Take the lock on a quorum (with ``limit`` K > 1, one of its K permits).

        Args:
            name: the lock name.
            ttl: lease time in seconds; the lock frees itself after it.
            blocking: keep trying (exponential backoff, full jitter) while contended.
            timeout: with ``blocking``, give up after this many seconds (None: never).
            owner: the owner value to write (default: :func:`make_owner`).
            fence: issue the fencing token before returning the lease; with
                False it is issued on the first read of ``lease.fencing_token``.
                Permits always write it before returning.
            limit: at most this many holders of ``name`` at once (K permits,
                see :mod:`.permits`). 1: a plain lock, the same keys.
            also: ``(name, limit)`` pairs taken together with ``name``, all or
                nothing, in the same round; their leases are ``lease.also``.

        Returns:
            The :class:`Lease`, or None if another owner holds the lock.

        Raises:
            QuorumUnavailable: fewer than a quorum of nodes answered (on the
                last attempt, when blocking).
        """
        if timeout is not None:
            checked("timeout", settings.check_non_negative, timeout)

        def attempt() -> Steps[object]:
            return self._trying(name, ttl=ttl, owner=owner, fence=fence, limit=limit, also=also)

        if not blocking:
            return _lease_of(attempt())
        return self._leases.retrying(attempt, timeout, retry_delay, retry_delay_max)

    def _acquire(self, name: str, *, ttl: float, **options: Any) -> Lease | None:
        """:meth:`_acquiring`, in this thread; one attempt on a plain lock (the usual
        call) is :meth:`.Leases.acquire`, its steps driven only past a lease that
        stands as the round granted it."""
        if options.keys() <= _PLAIN and not options.get("blocking"):
            positive("ttl", ttl)
            owner = options.get("owner") or make_owner()
            once = self._leases.acquire(name, ttl, owner, options.get("fence", True))
            return once if isinstance(once, Lease) else None  # as _lease_of reads it
        # any other call: its options are checked by the signature of the steps
        return drive(self._quorum, self._acquiring(name, ttl=ttl, **options))

    try_acquire = driven(_trying, "_quorum")
    acquire = dressed(_acquire, _acquiring, "Redlock.acquire")

    @contextmanager
    def lock(self, name: str, *, ttl: float, timeout: float | None = None) -> Iterator[Lease]:
        """Hold the lock for the ``with`` block (blocking; :class:`LockNotAcquired` on timeout)."""
        lease = self.acquire(name, ttl=ttl, blocking=True, timeout=timeout)
        if lease is None:
            raise LockNotAcquired.of(name, timeout, self.holder(name))
        try:
            yield lease
        finally:
            self.release(lease)

    def extend(self, lease: Lease, ttl: float | None = None) -> bool:
        """Set the lease's TTL to ``ttl`` (default: its own) on every node; never adds.
        False, and the lease marked lost, when it had lapsed or no quorum still holds it."""
        return self.extend_many([lease], ttl)[0]

    def extend_many(self, leases: Sequence[Lease], ttl: float | None = None) -> list[bool]:
        """Renew several leases of this client: one call per node, whatever their number.

        A lease with names held together (:attr:`Lease.also`) is renewed with
        them, in the same call, and counts as renewed only if they all are.
        """
        if ttl is not None:
            positive("ttl", ttl)
        return self._leases.extend_many(leases, ttl)

    def close(self) -> None:
        """Close this process's idle connections to the nodes (they reopen on use)."""
        for node in self.nodes:
            node.close()


#: The options of an acquire that leave it one attempt on a plain lock (not blocking).
_PLAIN = frozenset({"owner", "fence", "blocking"})


def _lease_of(attempt: Steps[object]) -> Steps[Lease | None]:
    """The lease an attempt returns, or None."""
    once = yield from attempt
    return once if isinstance(once, Lease) else None
