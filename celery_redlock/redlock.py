"""Redlock: a lease on a majority of N independent Redis masters, with fencing tokens.

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
  comes back empty, through the time floor described below.
* Quorum is ``N // 2 + 1`` **of all configured nodes**, never of the reachable
  ones, so two partitions can never both hold a majority.

Acquire
=======

One Lua call per node, sent to all nodes at once: if the key holds my owner
value its TTL is refreshed (so a re-sent acquire is harmless); if it holds
another, the node reports the holder and its PTTL; otherwise it sets the key
with the TTL. The lease is granted when a quorum granted it **and** validity
is left: ``validity = ttl - elapsed - (ttl * drift_factor + 2 ms)``.
Otherwise the key is released on every node, including the ones that did not
answer, because their reply may only have been lost.

Fencing tokens
==============

Each node keeps a fence value per name. The acquire call, where it sets my
key, moves that value on to its successor and returns it; a node without one
(a new name, an expired fence key, a node that lost its data) seeds it with
``max(client clock, node clock to the second)`` in microseconds. The token is
the **largest value among the granting nodes**, and it is issued only once a
quorum records it (or more):

* When a quorum of the granting nodes returned that very value, phase 1 has
  already recorded it on a quorum, and the lease is granted after one round.
  This is the usual case: nodes that saw the same grants hold the same value,
  and a new name is seeded alike everywhere, from the client's clock.
* Otherwise (a node was down for some grants, or restarted, or the clocks
  disagreed on a seed) phase 2 writes the token back on the granting nodes,
  only where the node still holds my owner value, and only if it is larger.
  The lease is granted only if that landed on a quorum within validity.

Any later grant needs a majority, which meets the quorum that recorded the
token, so the later phase 1 moves a value at least as large as the token to
its successor, and the later token is strictly larger. The largest value
alone is not enough. With three nodes A, B, C, counters incremented inside the
acquire, token = the largest increment and no write-back::

    t0  client 1 wins A, B       A=1 B=1 C=0    token 1
    t1  lease 1 lapses; client 2 wins B, C      B=2 C=1    token 2
    t2  lease 2 lapses; client 3 wins A, C      A=2 C=2    token 2   <- not larger

Here token 2 sat on B alone at t1, so phase 2 writes it on C, and client 3
reads it and takes 3.

A node that restarts without its data loses its fence values, and a fence key
that was not granted for ``fence_retention`` (7 days by default) expires. The
seed covers both: values grow by one per grant, far slower than a microsecond
clock, so every token stays below the clock it was seeded from, and a value
seeded later from the clock is larger. This relies on the clocks (the
client's that seeds, or the node's) not being behind by more than the time
between the seed and the reseed.

Lazy fencing
------------

``try_acquire(..., fence=False)`` grants the lease after phase 1 alone even
when phase 2 is due, and keeps the granting nodes and the candidate token.
Phase 2 runs on the first read of :attr:`Lease.fencing_token` instead, with
the same checks (owner on each node, only if larger, a quorum within
validity); if it falls short the lease is marked lost and the read raises
:class:`LockLost`. This is as monotonic as the eager path:

* A token is issued only once it is on a majority, and the owner check puts
  each of those writes inside the time my key lived on that node, however
  late in the lease the write comes (owner values are unique per attempt:
  :func:`make_owner`).
* Take two grants that both issued a token. Their majorities share a node,
  and on it the two keys' lives do not overlap: a key is set only where no
  other owner's key is. Whichever key came first, its value on that node was
  written before the other's phase 1 there, so the later grant read a fence
  at least as large as the earlier token and took a larger one. A later grant
  needs a majority where my key is already gone, so once one exists my lazy
  write-back can no longer reach a quorum: the read raises.
* The phase-1 candidate needs no recomputing at read time. While my key is on
  a node, nobody else can write that node's fence value: ACQUIRE writes it
  only where it sets its own key, and FENCE needs the writer's own key there.
  So on every node where the late write can land, the fence value is still
  the one my phase 1 wrote (or my own write-back), and the candidate is at
  least that. If the node lost its data, my key went too and the write does
  not land there.

A failed attempt (no quorum, or no validity left) leaves the fence values its
phase 1 moved on: tokens skip a number, and never go back.

Lua never does number arithmetic on tokens (Lua 5.1 numbers are doubles);
tokens travel as decimal strings, compared and incremented digit-wise.

Permits
=======

``limit=K`` (K > 1) lets up to K owners hold a name at once. Each holds a
**permit**: permit 0 is the name's lock key, permit i > 0 the key
``{prefix}:permit:{name}:{i}``, in the same hash slot.

* Safety: permit i is a Redlock of its own. A lease on permit i is granted
  only when a quorum of nodes set **that same key** for me, with validity
  left, exactly as a plain lock; so, under the assumptions above, each of the
  K keys has at most one holder at any moment, and the name at most K.
  A grant counted across different indexes (node A says 0, node B says 1) is
  never a grant.
* One Lua call per node (ACQUIRE with the ``p`` flag) takes the permit
  already mine (a re-sent call), else the preferred index if free, else the
  lowest free one. Nodes that saw the same grants in the same order pick the
  same index, so the usual grant costs one round, as a plain lock does.
  When concurrent acquirers reach the nodes in different orders, the picks
  split: if one index still has a quorum it is granted and my strays on the
  other nodes are freed (one more call); if none has, everything I took is
  freed and the next round (after a pause of at most
  :attr:`Redlock.PERMIT_SPLIT_PAUSE`) prefers the index most nodes picked,
  for at most :attr:`Redlock.PERMIT_ROUNDS` rounds. Preferring one index
  (rather than re-picking the lowest) makes the next round converge: the nodes
  that picked it hold it for nobody else meanwhile. After the last round the
  caller sees contention, and its policy (retry) tries again later.
* A permit held by another copy of the caller's task id (a redelivery of a
  running task) counts as contention, so a copy never runs beside its original.
* Fencing: **one** fence key for all K permits, so tokens grow across every
  grant of the name whatever the permit. Several holders now move one fence
  value concurrently, which breaks two facts the plain lock relies on: a
  re-sent acquire may no longer return "my" value (another permit's grant
  may have moved it), and phase 2 may find the value it writes already there,
  written by another holder. So permits (1) always move the value on, even
  when re-sent, and (2) in phase 2 write a fresh value, the successor of the
  largest granting value, **strictly**: only on nodes whose value is smaller.
  Then every issued token was written, on each node of a quorum, as a strict
  increase of that node's value; two grants' quorums share a node, where one
  value cannot be a strict increase twice: **tokens are distinct**. A grant
  whose phase 1 starts after another's token is on a quorum reads at least
  that token on the shared node: **tokens grow in grant order**.
  Lazy fencing does not carry over (another holder may move the value while
  mine waits), so a permit's token is always written before it is granted.
* Everything else is the lease's key: the heartbeat renews it with the other
  leases of the process (one EXTEND call per node), ``release`` deletes it,
  :meth:`Redlock.release_owned_by` frees a dead child's permit whatever its
  index. ``limit=1`` is today's lock: the same keys and the same single call.

Several names at once
---------------------

``also=(("payment-api", 4),)`` takes the name and, with it, a permit of each
other name, in the same round: the one ACQUIRE call per node (flag ``a``)
checks every name before it sets any, so on each node an attempt holds all
its names or none. The grant needs, for every name, a quorum on one index of
that name; anything short of that frees everything the attempt took. So no
attempt ever holds one name while it waits for another: there is no wait,
hence no deadlock, whatever the names' order. The names go in one order
(the task's key first, then the others sorted), which keeps the replies and
the keys of every caller alike. Each name keeps its own fence value; the
other names' leases are :attr:`Lease.also`, renewed in the same EXTEND call
and released with the lease.

Redis Cluster: the keys of different names live in different hash slots, and
one script call touching several slots is refused by a node that is itself
a Redis Cluster (CROSSSLOT). ``also`` needs every node to be a plain master
(or a Sentinel-managed one), as the heartbeat's batched renewals do.

Keys
====

``{prefix}:lock:{name}`` and ``{prefix}:fence:{name}``; with permits, also
``{prefix}:permit:{name}:{i}`` for i = 1 .. K-1. A name with no hash tag
is wrapped in one (``{name}``) so that both keys live in one slot if a node is
itself a Redis Cluster.
"""

from __future__ import annotations

import logging
import os
import random
import secrets
import socket
import threading
import time
import warnings
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Callable, NamedTuple

from redis.exceptions import RedisError

from . import _scripts, settings
from ._nodes import Node, NodeSpec, gather, mask_url, run_script
from .exceptions import (
    ConfigurationError,
    LockContended,
    LockLost,
    LockNotAcquired,
    QuorumUnavailable,
)

__all__ = [
    "Claim",
    "Finished",
    "Holder",
    "Lease",
    "Redlock",
    "Schedule",
    "TooEarly",
    "full_jitter",
    "make_owner",
]

logger = logging.getLogger("celery_redlock.redlock")

#: Fixed part of the drift allowance, in seconds (redis.io distlock).
DRIFT_FLOOR = 0.002
#: Owner value separator; the first field is the task id (or "-").
OWNER_SEP = "|"
#: A claim whose run started is marked ``~<id>`` for the rest of its TTL (see ``_scripts``).
STARTED_MARK = "~"

_HOST = socket.gethostname()


def make_owner(task_id: str | None = None, retries: int | None = None) -> str:
    """An owner value: ``task_id|retries|host|pid|random``. Ownership is the whole value.

    The task id comes first so a parent process can free a dead child's lock by
    prefix; ``retries`` tells a redelivered message from a retry of the same task.
    """
    return OWNER_SEP.join(
        (
            task_id or "-",
            "-" if retries is None else str(retries),
            _HOST,
            str(os.getpid()),
            secrets.token_hex(8),
        )
    )


def full_jitter(
    attempt: int, base: float, cap: float, rng: Callable[[], float] = random.random
) -> float:
    """Exponential backoff with full jitter: uniform in ``[0, min(cap, base * 2**attempt)]``."""
    return rng() * min(cap, base * (2 ** min(attempt, 62)))


class Holder(NamedTuple):
    """Who holds a name, as the nodes see it."""

    #: The holder's owner value (``task_id|retries|host|pid|random``), or None if
    #: no majority agrees.
    owner: str | None
    #: Seconds left on the holder's key (the smallest PTTL among the agreeing nodes).
    remaining: float | None
    #: The id the name's claim names, when the caller asked to see it (see :class:`Claim`).
    claimant: str | None = None

    @property
    def task_id(self) -> str | None:
        """The holder's task id, if it was taken by a task."""
        if not self.owner:
            return None
        first = self.owner.split(OWNER_SEP, 1)[0]
        return None if first == "-" else first

    @property
    def retries(self) -> int | None:
        """How many times the holder's task had been retried when it took the lock."""
        fields = (self.owner or "").split(OWNER_SEP)
        return int(fields[1]) if len(fields) > 1 and fields[1].isdigit() else None


class Claim(NamedTuple):
    """A name's claim: the id (a task id) meant to take the name next.

    Returned by :meth:`Redlock.claim_next` and :meth:`Redlock.claimant`, and by
    :meth:`Redlock.try_acquire` when the name is free but claimed by another id.
    """

    #: The id the claim names on a quorum, or None when no quorum agrees.
    claimant: str | None
    #: Seconds left on the claim (the smallest PTTL among the agreeing nodes).
    remaining: float | None
    #: On a take-over (``replace=True``): the id the claim named before, on a quorum.
    previous: str | None = None
    #: True when the claim already named the caller (its TTL was raised, not set anew).
    renewed: bool = False


class Schedule(NamedTuple):
    """When a coalesced call runs (:meth:`Redlock.debounce`, :meth:`Redlock.throttle`)."""

    #: ``"later"``: the call holds the claim and is due at ``due``; ``"now"``: it
    #: runs at once, unclaimed; ``"dropped"``: it falls inside a period and is not kept.
    kind: str
    #: When the call is due, in seconds since the epoch (the caller's clock).
    due: float
    #: ``"later"``: the claimant it took over from, on a quorum. ``"dropped"``: the
    #: id of the run that holds the period, if known.
    other: str | None = None
    #: A throttled call's slot (its due time in ms, as the nodes keep it):
    #: :meth:`Redlock.try_acquire` takes it as ``slot``.
    slot: str | None = None


class TooEarly(NamedTuple):
    """A throttled name was granted less than a period ago: try again in ``wait`` seconds."""

    wait: float


class Finished(NamedTuple):
    """A receipt says this id already finished: returned by :meth:`Redlock.try_acquire`."""

    id: str


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
            fencing is off). On a lazy lease (``try_acquire(..., fence=False)``)
            whose nodes disagreed, the first read writes the token back (one
            round trip) and raises :class:`LockLost` if that no longer lands
            on a quorum.
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
        "_redlock",
        "permit",
        "also",
        "__weakref__",
    )

    def __init__(
        self,
        redlock: Redlock,
        name: str,
        key: str,
        fence_key: str,
        owner: str,
        ttl: float,
        fencing_token: int | None,
        expires: float,
        pending: tuple[tuple[int, ...], int] | None = None,
    ):
        self._redlock = redlock
        self.name = name
        self.key = key
        self.fence_key = fence_key
        self.owner = owner
        self.ttl = ttl
        self._token = fencing_token
        # Lazy lease: (granting node indexes, phase-1 candidate token) until the
        # first read of fencing_token writes the token back.
        self._pending = pending
        self._fence_lock = threading.Lock() if pending else None
        self._expires = expires
        # Set once, by the heartbeat thread or a release; a plain flag is enough.
        self._lost = False
        #: The permit index held (0 for a plain lock; see :meth:`Redlock.permit_keys`).
        self.permit = 0
        #: The leases of the other names held together with this one (``also=``).
        self.also: tuple[Lease, ...] = ()

    @property
    def fencing_token(self) -> int | None:
        """The fencing token; on a lazy lease the first read writes it back (may raise LockLost)."""
        token = self._token
        if token is not None or self._pending is None:
            return token
        assert self._fence_lock is not None
        with self._fence_lock:  # concurrent first reads write it once
            if self._token is None:
                self._token = self._redlock._fence_lazy(self)
                self._pending = None
            return self._token

    @property
    def redlock(self) -> Redlock:
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

    def mark_lost(self) -> None:
        self._lost = True

    def check(self) -> None:
        """Raise :class:`LockLost` unless the lease is still held."""
        if self.lost:
            raise LockLost(f"lock {self.name!r} is no longer held", self.name)

    def _renewed(self, expires: float) -> None:
        # Set, not max: a renewal to a shorter TTL shortens the keys on the
        # nodes, so the validity the client trusts must shrink with them.
        self._expires = expires

    def __repr__(self) -> str:
        return (
            f"<Lease {self.name!r} token={'unread' if self._pending else self._token} "
            f"remaining={self.remaining():.3f}s{' LOST' if self.lost else ''}>"
        )


class Redlock:
    """A Redlock client over N independent Redis masters.

    Args:
        nodes: URLs (``redis://``, ``rediss://``, ``unix://``, ``sentinel://``
            for a Sentinel-managed master: README, "Deployments") or
            ``redis.Redis`` clients; each must be an independent master. One
            node is allowed (a plain single-node lock).
        node_timeout: seconds each node gets to answer, per round.
        drift_factor: clock drift allowed, as a fraction of the TTL.
        key_prefix: first part of every key written.
        fencing: hand out fencing tokens (a second round trip only when the
            granting nodes disagree on the fence value; see the module docstring).
        fence_retention: seconds a fence value is kept after its last grant.
        min_replicas: replicas of each node that must confirm (``WAIT``, in the
            same round trip) a grant, a renewal, a fence write or a claim before
            that node counts; for nodes that are a primary with replicas (README,
            "Deployments"). 0 sends no ``WAIT``.
        clock: monotonic clock, seconds (injectable for tests).
        sleep: sleep function (injectable for tests).
        rng: ``random()`` function for jitter.
    """

    def __init__(
        self,
        nodes: Sequence[NodeSpec],
        *,
        node_timeout: float = settings.default("redlock_node_timeout"),
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
            raise ConfigurationError("nodes must be a list of Redis URLs or clients")
        nodes = list(nodes)
        if not nodes:
            raise ConfigurationError("Redlock needs at least one Redis node")
        node_timeout = _checked("node_timeout", settings.check_seconds, node_timeout)
        fence_retention = _checked("fence_retention", settings.check_seconds, fence_retention)
        drift_factor = _checked("drift_factor", settings.check_drift_factor, drift_factor)
        key_prefix = _checked("key_prefix", settings.check_key_prefix, key_prefix)
        min_replicas = _checked("min_replicas", settings.check_count, min_replicas)
        self.min_replicas = min_replicas
        self.nodes = [Node(spec, node_timeout, min_replicas) for spec in nodes]
        seen: dict[tuple, Node] = {}
        for node in self.nodes:
            if node.identity in seen:
                raise ConfigurationError(
                    f"Redis node {node.name} is listed twice (same as {seen[node.identity].name}); "
                    "Redlock nodes must be independent masters"
                )
            seen[node.identity] = node
        if len(self.nodes) > 1 and len(self.nodes) % 2 == 0:
            warnings.warn(
                f"{len(self.nodes)} Redlock nodes tolerate no more failures than "
                f"{len(self.nodes) - 1}; use an odd number",
                RuntimeWarning,
                stacklevel=2,
            )
        self.quorum = len(self.nodes) // 2 + 1
        self.node_timeout = float(node_timeout)
        self.drift_factor = float(drift_factor)
        self.key_prefix = key_prefix
        self.fencing = bool(fencing)
        self.fence_retention = float(fence_retention)
        # ACQUIRE's fence argument: the retention in ms, or empty with fencing off.
        self._fence_arg = str(_ms(self.fence_retention)) if self.fencing else ""
        self.clock = clock
        self.sleep = sleep
        self.rng = rng

    #: Rounds a permit acquire spends on a split (nodes granting different indexes).
    PERMIT_ROUNDS = 3
    #: Longest pause, in seconds, before a permit acquire asks again after a split.
    PERMIT_SPLIT_PAUSE = 0.005

    def __repr__(self) -> str:
        return f"<Redlock {len(self.nodes)} nodes quorum={self.quorum} prefix={self.key_prefix!r}>"

    # -- quorum -------------------------------------------------------------

    def has_quorum(self, answered: int) -> bool:
        """True when ``answered`` nodes (of all configured nodes) make a quorum."""
        return answered >= self.quorum

    def check_quorum(self, replies: Sequence[Any]) -> None:
        """Raise :class:`QuorumUnavailable` unless a quorum of nodes answered.

        Args:
            replies: one reply per node, in the order of :attr:`nodes`; an
                exception instance is a node that did not answer.

        Raises:
            QuorumUnavailable: fewer than a quorum of nodes answered.
        """
        errors = self._errors(replies)
        if not self.has_quorum(len(self.nodes) - len(errors)):
            raise QuorumUnavailable(errors, self.quorum, len(self.nodes))

    # -- keys ---------------------------------------------------------------

    def keys(self, name: str) -> tuple[str, str]:
        """The lock key and the fence key of a name."""
        tagged = _tagged(name)
        return f"{self.key_prefix}:lock:{tagged}", f"{self.key_prefix}:fence:{tagged}"

    def permit_keys(self, name: str, limit: int) -> list[str]:
        """The keys of a name's ``limit`` permits: the lock key, then
        ``{prefix}:permit:{name}:{i}`` for i = 1 .. limit-1, all in the lock key's hash slot.

        A family of its own (not a suffix of the lock key) so that no permit key
        of one name can be the lock key of another name that carries its own tag.
        """
        key, _ = self.keys(name)
        tagged = _tagged(name)
        return [key] + [f"{self.key_prefix}:permit:{tagged}:{i}" for i in range(1, limit)]

    def claim_key(self, name: str) -> str:
        """The key of a name's claim (:meth:`claim_next`), in the lock key's hash slot."""
        return f"{self.key_prefix}:claim:{_tagged(name)}"

    def coalesce_key(self, name: str, kind: str) -> str:
        """The key where :meth:`debounce` (``"burst"``) or :meth:`throttle` (``"throttle"``)
        keeps its timing, in the lock key's hash slot."""
        return f"{self.key_prefix}:{kind}:{_tagged(name)}"

    def receipt_key(self, name: str, id: str) -> str:
        """The key recording that ``id`` finished holding ``name``, in the lock key's hash slot."""
        return f"{self.key_prefix}:receipt:{_tagged(name)}:{id}"

    # -- acquire ------------------------------------------------------------

    def try_acquire(
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
    ) -> Lease | Holder | Claim | Finished | TooEarly:
        """One attempt: the :class:`Lease`, or what is in the way.

        With ``limit`` K > 1 the lease is one of K permits of the name (see
        "Permits" in the module docstring); the :class:`Holder` returned when
        all are held is the one whose permit frees first. ``also``: other
        ``(name, limit)`` pairs held together with ``name``, all or nothing, in
        the same round (see "Several names at once" in the module docstring);
        the lease carries their leases in :attr:`Lease.also`.

        With ``fence=False`` (and fencing on) the lease is granted after phase 1;
        if the nodes disagree, the token is written back on the first read of
        ``lease.fencing_token``.

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
          With ``own_claim`` (the caller was claimed at publish), a claim that
          no longer names it, or none, stops the grant too: it was superseded,
          or its claim lapsed (``Claim.claimant`` None).
        * ``throttle`` (seconds): at most one grant per period (see
          :meth:`throttle`); an earlier attempt gets :class:`TooEarly`. With
          ``slot`` (:attr:`Schedule.slot`), a slot taken over by another id
          returns that :class:`Claim`.

        Raises:
            QuorumUnavailable: fewer than a quorum of nodes answered.
        """
        _positive("ttl", ttl)
        if limit != 1 or limit.__class__ is not int or also:  # True == 1, but is no limit
            return self._try_permit(
                name, ttl, owner, task_id, receipts, claim, own_claim, throttle, slot, limit, also
            )
        key, fence_key = self.keys(name)
        owner = owner or make_owner()
        ttl_ms = _ms(ttl)
        keys: tuple[str, ...] = (key, fence_key)
        args: tuple[Any, ...] = (owner, ttl_ms, self._fence_arg, time.time_ns() // 1000)
        if task_id is not None and (receipts or claim or throttle):
            flags = ("r" if receipts else "") + {None: "", "check": "c", "take": "cw"}[claim]
            if claim and own_claim:
                flags += "s"
            keys += (self.receipt_key(name, task_id), self.claim_key(name))
            args += (task_id, flags)
            if throttle:
                keys += (self.coalesce_key(name, "throttle"),)
                now_ms = time.time_ns() // 1_000_000
                args = args[:-1] + (flags + "t", _ms(throttle), now_ms, slot or "")
        start = self.clock()
        replies = run_script(_scripts.ACQUIRE, self.nodes, keys, args, self.node_timeout)
        if task_id is not None and any(_is_list(r) and r[0] == 2 for r in replies):
            # A receipt is only ever written after the fact: one node is proof enough.
            self._release_everywhere(key, owner)
            return Finished(task_id)
        early = [int(r[1]) for r in replies if _is_list(r) and r[0] == 4]
        if len(early) >= self.quorum:  # a quorum saw a grant less than a period ago
            self._release_everywhere(key, owner)
            return TooEarly(max(early) / 1000.0)
        granted = [i for i, r in enumerate(replies) if _is_list(r) and r[0] == 1]
        expires = start + ttl - (ttl * self.drift_factor + DRIFT_FLOOR)
        if len(granted) >= self.quorum and self.clock() < expires:
            if not self.fencing:
                return Lease(self, name, key, fence_key, owner, ttl, None, expires)
            token, agreed = self._candidate(granted, replies)
            if agreed >= self.quorum:  # already on a quorum: phase 2 has nothing to add
                return Lease(self, name, key, fence_key, owner, ttl, token, expires)
            if not fence:
                pending = (tuple(granted), token)
                return Lease(self, name, key, fence_key, owner, ttl, None, expires, pending)
            if self._write_back(granted, token, key, fence_key, owner, expires) is not None:
                return Lease(self, name, key, fence_key, owner, ttl, token, expires)
        self._release_everywhere(key, owner)
        self.check_quorum(replies)
        return _in_the_way(replies, task_id)

    @staticmethod
    def _candidate(granted: Sequence[int], replies: list[Any]) -> tuple[int, int]:
        """The largest fence value among the granting nodes, and how many nodes hold it."""
        values = [int(replies[i][1]) for i in granted]
        token = max(values)
        return token, values.count(token)

    def _try_permit(
        self,
        name: str,
        ttl: float,
        owner: str | None,
        task_id: str | None,
        receipts: bool,
        claim: str | None,
        own_claim: bool,
        throttle: float | None,
        slot: str | None,
        limit: int,
        also: Sequence[tuple[str, int]] = (),
    ) -> Lease | Holder | Claim | Finished | TooEarly:
        """:meth:`try_acquire` of one of ``limit`` permits, with the names ``also`` held
        together (see "Permits" and "Several names at once" in the module docstring)."""
        limit = _checked("limit", settings.check_limit, limit)
        names = [(name, limit)] + [
            (other, _checked("limit", settings.check_limit, k)) for other, k in also
        ]
        groups = [self.permit_keys(n, k) for n, k in names]
        fences = [self.keys(n)[1] for n, _ in names]
        every = [key for group in groups for key in group]  # what a failed attempt frees
        key = groups[0][0]
        owner = owner or make_owner()
        flags = "p" + ("a" if also else "")
        receipt_key = claim_key = throttle_key = key  # stand-ins, never read without their flag
        if task_id is not None:
            if receipts:
                flags += "r"
                receipt_key = self.receipt_key(name, task_id)
            if claim:
                flags += {"check": "c", "take": "cw"}[claim] + ("s" if own_claim else "")
                claim_key = self.claim_key(name)
            if throttle:
                flags += "t"
                throttle_key = self.coalesce_key(name, "throttle")
        keys = [key, fences[0], receipt_key, claim_key, throttle_key, *groups[0][1:]]
        for fence_key, group in zip(fences[1:], groups[1:]):
            keys += [fence_key, *group]
        prefer = [""] * len(names)
        for round_ in range(self.PERMIT_ROUNDS):
            args = [
                owner,
                _ms(ttl),
                self._fence_arg,
                time.time_ns() // 1000,
                task_id or "",
                flags,
                _ms(throttle) if "t" in flags and throttle else "",
                time.time_ns() // 1_000_000 if "t" in flags else "",
                slot or "",
                prefer[0],
            ]
            if also:
                args.append(limit)
                for (_, k), p in zip(names[1:], prefer[1:]):
                    args += (k, p)
            start = self.clock()
            replies = run_script(_scripts.ACQUIRE, self.nodes, keys, args, self.node_timeout)
            if task_id is not None and any(_is_list(r) and r[0] == 2 for r in replies):
                self._release_permits(every, owner)
                return Finished(task_id)
            early = [int(r[1]) for r in replies if _is_list(r) and r[0] == 4]
            if len(early) >= self.quorum:
                self._release_permits(every, owner)
                return TooEarly(max(early) / 1000.0)
            ok = [r if _is_list(r) and r[0] == 1 else None for r in replies]
            # Per name: the index most nodes granted (the lowest of equals), and where.
            chosen: list[tuple[int, list[int]]] = []
            for g in range(len(names)):
                picks = Counter(int(r[2 + 2 * g]) for r in ok if r is not None)
                index, _ = min(picks.items(), key=lambda kv: (-kv[1], kv[0]), default=(0, 0))
                chosen.append(
                    (
                        index,
                        [
                            i
                            for i, r in enumerate(ok)
                            if r is not None and int(r[2 + 2 * g]) == index
                        ],
                    )
                )
            expires = start + ttl - (ttl * self.drift_factor + DRIFT_FLOOR)
            if all(len(at) >= self.quorum for _, at in chosen) and self.clock() < expires:
                lease = self._grant_permits(names, groups, fences, chosen, ok, owner, ttl, expires)
                if lease is not None:
                    return lease
                self._release_permits(every, owner)
                break
            self._release_permits(every, owner)
            self.check_quorum(replies)
            if not any(ok) or round_ + 1 == self.PERMIT_ROUNDS:
                break
            # Split: free permits exist, but the nodes picked different indexes
            # (concurrent acquirers seen in different orders). Ask for the
            # index most of them picked, after a short jittered pause.
            prefer = [str(index) for index, _ in chosen]
            self.sleep(self.rng() * self.PERMIT_SPLIT_PAUSE)
        self.check_quorum(replies)
        return _in_the_way(replies, task_id)

    def _grant_permits(
        self,
        names: list[tuple[str, int]],
        groups: list[list[str]],
        fences: list[str],
        chosen: list[tuple[int, list[int]]],
        ok: list[Any],
        owner: str,
        ttl: float,
        expires: float,
    ) -> Lease | None:
        """The leases of a permit attempt that every name won on a quorum: the first
        name's, the others in its ``also``. None if a token could not be issued."""
        everywhere = set(range(len(self.nodes)))
        granted_all = everywhere.intersection(*(at for _, at in chosen))
        if granted_all != everywhere:
            # Nodes that granted another index (or did not answer) may hold a
            # stray permit of mine: free it there, in one call per node.
            strays = [
                k
                for (index, _), group in zip(chosen, groups)
                for i, k in enumerate(group)
                if i != index
            ]
            others = [n for i, n in enumerate(self.nodes) if i not in granted_all]
            if strays:
                run_script(_scripts.RELEASE_PREFIX, others, strays, (owner,), self.node_timeout)
        leases = []
        for g, ((name, _), group, fence_key, (index, at)) in enumerate(
            zip(names, groups, fences, chosen)
        ):
            view = [None if r is None else (1, r[1 + 2 * g], r[2 + 2 * g]) for r in ok]
            lease = self._permit_lease(name, group[index], fence_key, owner, ttl, expires, at, view)
            if lease is None:
                return None
            lease.permit = index
            leases.append(lease)
        leases[0].also = tuple(leases[1:])
        return leases[0]

    def _permit_lease(
        self,
        name: str,
        key: str,
        fence_key: str,
        owner: str,
        ttl: float,
        expires: float,
        granted: list[int],
        replies: list[Any],
    ) -> Lease | None:
        """The lease of a permit granted on a quorum, its token issued eagerly; None if
        the token could not be written on a quorum within validity."""
        if not self.fencing:
            return Lease(self, name, key, fence_key, owner, ttl, None, expires)
        token, agreed = self._candidate(granted, replies)
        if agreed >= self.quorum:
            return Lease(self, name, key, fence_key, owner, ttl, token, expires)
        # A fresh value, written only where it is larger than the node's: two
        # holders can never both land one value on a quorum (module docstring).
        token += 1
        if self._write_back(granted, token, key, fence_key, owner, expires, strict=True) is None:
            return None
        return Lease(self, name, key, fence_key, owner, ttl, token, expires)

    def _release_permits(self, permit_keys: Sequence[str], owner: str) -> None:
        """Delete ``owner``'s permit, whatever its index, on every node. Never raises."""
        replies = run_script(
            _scripts.RELEASE_PREFIX, self.nodes, permit_keys, (owner,), self.node_timeout
        )
        failed = [node.name for node, r in zip(self.nodes, replies) if isinstance(r, Exception)]
        if failed:
            logger.info(
                "release of %r did not reach %s; the TTL will free it there",
                permit_keys[0],
                ", ".join(failed),
            )

    def _fence_lazy(self, lease: Lease) -> int:
        """Phase 2 of a lazy lease, on the first read of its token (the lease's lock is held)."""
        assert lease._pending is not None  # only lazy leases get here
        granted, token = lease._pending
        written = None
        if not lease.lost:
            written = self._write_back(
                granted, token, lease.key, lease.fence_key, lease.owner, lease._expires
            )
        # A heartbeat may have marked it lost meanwhile, or shortened it: check again.
        if written is None or lease.lost:
            lease.mark_lost()
            raise LockLost(
                f"lock {lease.name!r} is no longer held: its fencing token could not be written",
                lease.name,
            )
        return written

    def _write_back(
        self,
        granted: Sequence[int],
        token: int,
        key: str,
        fence_key: str,
        owner: str,
        expires: float,
        strict: bool = False,
    ) -> int | None:
        """Write ``token`` where the granting nodes still hold ``owner``; None short of a quorum.

        ``strict`` (permits): only where the node's value is smaller, never equal.
        """
        remaining = expires - self.clock()
        if remaining <= 0:
            return None
        written = run_script(
            _scripts.FENCE,
            [self.nodes[i] for i in granted],
            (key, fence_key),
            (owner, str(token), _ms(self.fence_retention), *(("s",) if strict else ())),
            min(self.node_timeout, remaining),
        )
        landed = sum(1 for r in written if r == 1)
        if landed >= self.quorum and self.clock() < expires:
            return token
        logger.info("fencing token for %r landed on %d nodes, %d needed", key, landed, self.quorum)
        return None

    def acquire(
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
    ) -> Lease | None:
        """Take the lock on a quorum (with ``limit`` K > 1, one of its K permits).

        Args:
            name: the lock name.
            ttl: lease time in seconds; the lock frees itself after it.
            blocking: keep trying (exponential backoff, full jitter) while contended.
            timeout: with ``blocking``, give up after this many seconds (None: never).
            owner: the owner value to write (default: :func:`make_owner`).
            fence: write the fencing token back before returning the lease; with
                False it is written on the first read of ``lease.fencing_token``.
                Permits always write it before returning.
            limit: at most this many holders of ``name`` at once (K permits,
                see the module docstring). 1: a plain lock, the same keys.
            also: ``(name, limit)`` pairs taken together with ``name``, all or
                nothing, in the same round; their leases are ``lease.also``.

        Returns:
            The :class:`Lease`, or None if another owner holds the lock.

        Raises:
            QuorumUnavailable: fewer than a quorum of nodes answered (on the
                last attempt, when blocking).
        """
        if timeout is not None:
            _checked("timeout", settings.check_non_negative, timeout)
        _positive("ttl", ttl)
        start = self.clock()
        attempt = 0
        while True:
            try:
                result = self.try_acquire(
                    name, ttl=ttl, owner=owner, fence=fence, limit=limit, also=also
                )
            except QuorumUnavailable:
                if not blocking or (timeout is not None and self.clock() - start >= timeout):
                    raise
                result = None
            if isinstance(result, Lease):
                return result
            if not blocking:
                return None
            delay = full_jitter(attempt, retry_delay, retry_delay_max, self.rng)
            if timeout is not None:
                left = timeout - (self.clock() - start)
                if left <= 0:
                    return None
                delay = min(delay, left)
            self.sleep(delay)
            attempt += 1

    @contextmanager
    def lock(self, name: str, *, ttl: float, timeout: float | None = None) -> Iterator[Lease]:
        """Hold the lock for the ``with`` block (blocking; :class:`LockNotAcquired` on timeout)."""
        lease = self.acquire(name, ttl=ttl, blocking=True, timeout=timeout)
        if lease is None:
            holder = self.holder(name)
            if holder.owner:
                raise LockContended(
                    f"lock {name!r} is held by {holder.owner}", name, holder.owner, holder.remaining
                )
            raise LockNotAcquired(f"lock {name!r} not acquired within {timeout}s", name)
        try:
            yield lease
        finally:
            self.release(lease)

    # -- extend and release -------------------------------------------------

    def extend(self, lease: Lease, ttl: float | None = None) -> bool:
        """Set the lease's TTL to ``ttl`` (default: its own) on every node; never adds.

        Returns False, and marks the lease lost, when it had already lapsed or
        fewer than a quorum of nodes still hold it.
        """
        return self.extend_many([lease], ttl)[0]

    def extend_many(self, leases: Sequence[Lease], ttl: float | None = None) -> list[bool]:
        """Renew several leases of this client: one call per node, whatever their number.

        A lease with names held together (:attr:`Lease.also`) is renewed with
        them, in the same call, and counts as renewed only if they all are.
        """
        if not any(lease.also for lease in leases):
            return self._extend(leases, ttl)
        flat = [one for lease in leases for one in (lease, *lease.also)]
        done = dict(zip(map(id, flat), self._extend(flat, ttl)))
        out = []
        for lease in leases:
            renewed = all(done[id(one)] for one in (lease, *lease.also))
            if not renewed:
                for one in (lease, *lease.also):
                    one.mark_lost()
            out.append(renewed)
        return out

    def _extend(self, leases: Sequence[Lease], ttl: float | None) -> list[bool]:
        if ttl is not None:
            _positive("ttl", ttl)
        live = [lease for lease in leases if not lease.lost]
        results = {id(lease): False for lease in leases}
        if live:
            keys = [lease.key for lease in live]
            args: list[Any] = []
            for lease in live:
                args += (lease.owner, _ms(ttl or lease.ttl))
            start = self.clock()
            replies = run_script(_scripts.EXTEND, self.nodes, keys, args, self.node_timeout)
            for j, lease in enumerate(live):
                votes = sum(1 for r in replies if _is_list(r) and int(r[j]) == 1)
                lease_ttl = ttl or lease.ttl
                expires = start + lease_ttl - (lease_ttl * self.drift_factor + DRIFT_FLOOR)
                if votes >= self.quorum and self.clock() < expires:
                    lease._renewed(expires)
                    results[id(lease)] = True
        for lease in leases:
            if not results[id(lease)]:
                lease.mark_lost()
        return [results[id(lease)] for lease in leases]

    def release(
        self, lease: Lease, *, receipt: float | None = None, withdraw_claim: bool = False
    ) -> None:
        """Delete the lock on every node where it still holds the lease's owner. Never raises.

        In the same round, ``receipt`` (seconds) records that the lease's id
        (:attr:`Lease.task_id`) finished, for :meth:`try_acquire` with
        ``receipts=True``; ``withdraw_claim`` withdraws the name's claim if it
        names that id.
        """
        lease.mark_lost()
        if lease.also:  # the names held together with it: one call per node for all
            for other in lease.also:
                other.mark_lost()
            self._release_permits([other.key for other in lease.also], lease.owner)
        task_id = lease.task_id
        if task_id is None or (not receipt and not withdraw_claim):
            self._release_everywhere(lease.key, lease.owner)
            return
        self._release_everywhere(
            lease.key,
            lease.owner,
            (self.receipt_key(lease.name, task_id), self.claim_key(lease.name)),
            (str(_ms(receipt)) if receipt else "", task_id if withdraw_claim else ""),
        )

    def release_owned_by(self, name: str, task_id: str, limit: int = 1) -> int:
        """Free ``name`` if its holder is the task ``task_id``, whatever its random part.

        For a parent process cleaning up after a child that died mid-task.
        With ``limit`` K, each of the K permits of ``name`` that task holds,
        whatever its index. Returns how many keys were deleted, summed over
        the nodes. Never raises.
        """
        keys = self.permit_keys(name, limit) if limit > 1 else [self.keys(name)[0]]
        prefix = task_id + OWNER_SEP
        try:
            replies = run_script(
                _scripts.RELEASE_PREFIX, self.nodes, keys, (prefix,), self.node_timeout
            )
        except (RedisError, OSError):  # pragma: no cover - gather returns errors, never raises them
            return 0
        return sum(r for r in replies if isinstance(r, int))

    def _release_everywhere(
        self, key: str, owner: str, more_keys: tuple[str, ...] = (), more_args: tuple = ()
    ) -> None:
        try:
            replies = run_script(
                _scripts.RELEASE,
                self.nodes,
                (key, *more_keys),
                (owner, *more_args),
                self.node_timeout,
            )
        except (RedisError, OSError) as exc:  # pragma: no cover - defensive: release never raises
            logger.warning("release of %r failed: %s", key, exc)
            return
        failed = [node.name for node, r in zip(self.nodes, replies) if isinstance(r, Exception)]
        if failed:
            logger.info(
                "release of %r did not reach %s; the TTL will free it there", key, ", ".join(failed)
            )

    # -- inspection and one-shot claims ---------------------------------------

    def holder(self, name: str) -> Holder:
        """The owner a quorum of nodes agrees on, and its remaining TTL.

        Raises:
            QuorumUnavailable: fewer than a quorum of nodes answered.
        """
        key, fence_key = self.keys(name)
        replies = run_script(_scripts.INSPECT, self.nodes, (key, fence_key), (), self.node_timeout)
        self.check_quorum(replies)
        return _holder(
            [(_text(r[0]), int(r[1])) for r in replies if _is_list(r) and r[0]], self.quorum
        )

    def inspect(self, name: str) -> list[dict[str, Any]]:
        """Per node: holder, PTTL (ms) and fence value of ``name``, or the node's error."""
        key, fence_key = self.keys(name)
        replies = run_script(_scripts.INSPECT, self.nodes, (key, fence_key), (), self.node_timeout)
        out: list[dict[str, Any]] = []
        for node, r in zip(self.nodes, replies):
            if isinstance(r, Exception):
                out.append({"node": node.name, "error": str(r)})
            else:
                out.append(
                    {
                        "node": node.name,
                        "holder": _text(r[0]),
                        "pttl_ms": int(r[1]),
                        "fence": _text(r[2]),
                    }
                )
        return out

    def claim(self, key: str, value: str, *, ttl: float) -> bool:
        """Set ``{prefix}:{key}`` to ``value`` on a quorum unless another value is there.

        The claim is never released: it expires.

        Used for one-shot decisions such as "this beat slot was sent". Returns
        True if the claim is ours (also when re-sent), False if another value
        won. A claim that fell short of a quorum is withdrawn everywhere.

        Raises:
            QuorumUnavailable: fewer than a quorum of nodes answered.
        """
        _positive("ttl", ttl)
        full_key = f"{self.key_prefix}:{key}"
        replies = run_script(
            _scripts.CLAIM, self.nodes, (full_key,), (value, _ms(ttl)), self.node_timeout
        )
        if self.has_quorum(sum(1 for r in replies if r == 1)):
            return True
        self._release_everywhere(full_key, value)
        self.check_quorum(replies)
        return False

    # -- claims: the id meant to take a name next ----------------------------

    def claim_next(self, name: str, claimant: str, *, ttl: float, replace: bool = False) -> Claim:
        """Point ``name``'s claim at ``claimant`` on a quorum, for ``ttl`` seconds.

        A claim says which id is meant to take the name next (an enqueued
        task); :meth:`try_acquire` with ``claim=`` honours it. A claim that
        already names ``claimant`` keeps it, its TTL raised to ``ttl``.
        Another claimant's claim stays unless ``replace``, which takes it over.

        Returns the :class:`Claim`: ours when ``claim.claimant == claimant``;
        otherwise the other claimant a quorum agrees on, or ``claimant=None``
        when the nodes are split (concurrent claims: try again). A claim that
        fell short of a quorum is withdrawn everywhere.

        Raises:
            QuorumUnavailable: fewer than a quorum of nodes answered.
        """
        _positive("ttl", ttl)
        key = self.claim_key(name)
        replies = run_script(
            _scripts.CLAIM_NEXT,
            self.nodes,
            (key,),
            (claimant, _ms(ttl), "1" if replace else ""),
            self.node_timeout,
        )
        ours = [r for r in replies if _is_list(r) and r[0] == 1]
        if self.has_quorum(len(ours)):
            # Only a previous claimant a quorum agrees on was taken over: a node
            # where its execution took the lock first answers without it.
            previous = _holder([(_text(r[1]), 0) for r in ours if r[1]], self.quorum).owner
            renewed = sum(1 for r in ours if r[2] == 1) >= self.quorum
            return Claim(claimant, ttl, previous, renewed)
        self._release_everywhere(key, claimant)
        self.check_quorum(replies)
        other = _holder(
            [(_text(r[1]), int(r[2])) for r in replies if _is_list(r) and r[0] == 0], self.quorum
        )
        return Claim(other.owner, other.remaining)

    def debounce(
        self, name: str, claimant: str, *, delay: float, max_delay: float | None, ttl: float
    ) -> Schedule:
        """Take ``name``'s claim over for a call due ``delay`` seconds from now.

        A burst is the calls made while the name is claimed; none is due later
        than ``max_delay`` after the burst's first call. The claim outlives the
        due time by ``ttl``.

        Raises:
            QuorumUnavailable: fewer than a quorum of nodes answered.
        """
        _positive("delay", delay)
        cap = "" if max_delay is None else str(_ms(max_delay))
        return self._schedule(
            _scripts.DEBOUNCE, name, "burst", claimant, (str(_ms(delay)), cap, str(_ms(ttl)))
        )

    def throttle(
        self, name: str, claimant: str, *, period: float, trailing: bool, ttl: float
    ) -> Schedule:
        """Plan a call on a name started at most once per ``period`` seconds.

        A call on a quiet name is due now; a call inside the period of the last
        start is due at its end, and takes that slot over from the trailing
        call planned there (newest wins), or is dropped when not ``trailing``.
        Each slot remembers the id that runs it, so a replaced call learns so
        at :meth:`try_acquire` with ``throttle=period, slot=schedule.slot``,
        which also enforces the period at the start, whatever the callers'
        clocks said.

        Raises:
            QuorumUnavailable: fewer than a quorum of nodes answered.
        """
        _positive("period", period)
        return self._schedule(
            _scripts.THROTTLE,
            name,
            "throttle",
            claimant,
            (str(_ms(period)), "1" if trailing else "", str(_ms(ttl))),
        )

    def _schedule(
        self, script: Any, name: str, kind: str, claimant: str, args: tuple[str, ...]
    ) -> Schedule:
        now_ms = time.time_ns() // 1_000_000
        claim_key = self.claim_key(name)
        replies = run_script(
            script,
            self.nodes,
            (claim_key, self.coalesce_key(name, kind)),
            (claimant, str(now_ms), *args),
            self.node_timeout,
        )
        answers = [r for r in replies if _is_list(r)]
        if not self.has_quorum(len(answers)):
            self._release_everywhere(claim_key, claimant)
            self.check_quorum(replies)
        kinds = Counter(int(r[0]) for r in answers)
        code, votes = kinds.most_common(1)[0]
        if votes < self.quorum:
            code = 2  # the nodes disagree: run now; the start itself is throttled
        agreed = [r for r in answers if int(r[0]) == code]
        slot = Counter(_text(r[2]) for r in agreed).most_common(1)[0][0] if agreed else None
        due = max(int(r[2]) for r in agreed) / 1000.0 if agreed else now_ms / 1000.0
        other = _holder([(_text(r[1]), 0) for r in agreed if r[1]], self.quorum)
        return Schedule({1: "later", 2: "now", 0: "dropped"}[code], due, other.owner, slot)

    def withdraw_claim(self, name: str, claimant: str) -> int:
        """Withdraw ``name``'s claim where it names ``claimant``. Never raises.

        Returns how many nodes withdrew it.
        """
        replies = run_script(
            _scripts.RELEASE, self.nodes, (self.claim_key(name),), (claimant,), self.node_timeout
        )
        return sum(1 for r in replies if r == 1)

    def claimant(self, name: str) -> Claim:
        """The claim of ``name`` a quorum agrees on (``claimant=None`` if none).

        Raises:
            QuorumUnavailable: fewer than a quorum of nodes answered.
        """
        replies = run_script(
            _scripts.PEEK, self.nodes, (self.claim_key(name),), (), self.node_timeout
        )
        self.check_quorum(replies)
        seen = _holder(
            [(_text(r[0]), int(r[1])) for r in replies if _is_list(r) and r[0]], self.quorum
        )
        if seen.owner is not None and seen.owner.startswith(STARTED_MARK):
            return Claim(None, None)  # its run started: no claim is pending
        return Claim(seen.owner, seen.remaining)

    def _errors(self, replies: Sequence[Any]) -> dict[str, BaseException]:
        return {node.name: r for node, r in zip(self.nodes, replies) if isinstance(r, Exception)}

    # -- read-only views for the tools (cli, beat) -----------------------------
    # Everything below, up to the end of the class, serves tools that look at
    # the nodes without taking a lock. The records are defined after the class.

    def inspect_key(
        self, key: str, fence_key: str | None = None, *, skip: dict[str, str] | None = None
    ) -> list[NodeView]:
        """Each node's copy of the Redis key ``key`` (and of ``fence_key``), in one round.

        Takes the full key, as :meth:`keys` or :meth:`scan` give it, so it reads
        claims and keys written by other clients too.

        Args:
            key: the full Redis key.
            fence_key: the full fence key, or None (the views carry no fence).
            skip: node name -> error text: these nodes are not asked and their
                views carry that error (a listing pays for a hung node once).

        Returns:
            One :class:`NodeView` per node, in the order of :attr:`nodes`.
        """
        skip = skip or {}
        live = [node for node in self.nodes if node.name not in skip]
        replies = run_script(_scripts.INSPECT, live, (key, fence_key or key), (), self.node_timeout)
        answers = dict(zip((node.name for node in live), replies))
        views = []
        for node in self.nodes:
            if node.name in skip:
                views.append(NodeView(node.name, error=skip[node.name]))
                continue
            reply = answers[node.name]
            if isinstance(reply, Exception):
                views.append(NodeView(node.name, error=_error_text(reply)))
            else:
                holder, pttl_ms, fence = reply
                fence = _readable(fence) if fence_key else None
                views.append(NodeView(node.name, _readable(holder), int(pttl_ms), fence))
        return views

    def agreed(self, views: Iterable[NodeView]) -> Holder:
        """The holder that a quorum of all the nodes shows in ``views``, if any.

        The one quorum rule of every read: a value counts when at least
        :attr:`quorum` nodes of all those configured hold it, never a majority
        of those that answered. ``remaining`` is the smallest TTL among them.
        """
        return _holder([(v.holder, v.pttl_ms) for v in views if v.holder], self.quorum)

    def scan(
        self, kind: str = "lock", pattern: str = "*", *, limit: int = 100, count: int = 1000
    ) -> ScanResult:
        """The names of the ``{prefix}:{kind}:`` keys on the nodes, found with SCAN, never KEYS.

        Args:
            kind: the key family (``lock``, ``fence``, ``beat``, ``claim``...).
            pattern: a Redis glob matched against the part after ``{prefix}:{kind}:``.
            limit: stop after this many keys per node; at most this many names.
            count: the COUNT hint of each SCAN call (each call is bounded by
                the node timeout; COUNT keeps the number of calls small).

        Returns:
            A :class:`ScanResult`: the names (sorted, each found on at least
            one node), the nodes that failed, and whether ``limit`` cut it short.
        """
        base = f"{self.key_prefix}:{kind}:"
        match = "".join("\\" + c if c in "\\*?[]" else c for c in base) + pattern
        errors: dict[str, str] = {}
        truncated = False
        found: set[bytes] = set()
        for node in self.nodes:
            seen: set[bytes] = set()  # SCAN may return a key twice
            cursor: Any = b"0"
            while True:
                command = ("SCAN", cursor, "MATCH", match, "COUNT", count)
                reply = gather([node], command, self.node_timeout)[0]
                if isinstance(reply, Exception):
                    errors[node.name] = _error_text(reply)
                    break
                cursor, keys = reply
                seen.update(keys)
                if int(cursor) == 0:
                    break
                if len(seen) >= limit:
                    truncated = True
                    break
            found |= seen
        names = [_readable(key)[len(base) :] for key in sorted(found)[:limit]]
        return ScanResult(names, errors, truncated or len(found) > limit)

    def read_claim(self, key: str) -> ClaimView:
        """Read the claim ``{prefix}:{key}`` (see :meth:`claim`) on every node, in one round.

        Returns:
            A :class:`ClaimView`: the value a quorum of the nodes holds (or
            None), and the values that may hold a quorum once the nodes that
            did not answer are counted.
        """
        replies = gather(self.nodes, ("GET", f"{self.key_prefix}:{key}"), self.node_timeout)
        silent = sum(1 for r in replies if isinstance(r, Exception))
        votes = Counter(
            r.decode() if isinstance(r, bytes) else r
            for r in replies
            if isinstance(r, (bytes, str))
        )
        for value, count in votes.items():
            if count >= self.quorum:
                return ClaimView(value, frozenset((value,)))
        maybe = frozenset(value for value, count in votes.items() if count + silent >= self.quorum)
        return ClaimView(None, maybe)

    def force_release(self, name: str) -> list[Deletion]:
        """Delete the lock key of ``name`` on every node, whatever its holder.

        For an operator clearing a stuck lock: a holder still running finds
        its key gone at its next renewal. The fence key is kept, so the next
        token is still larger than the stuck holder's.

        Returns:
            One :class:`Deletion` per node, in the order of :attr:`nodes`.
        """
        key, _ = self.keys(name)
        replies = gather(self.nodes, ("DEL", key), self.node_timeout)
        return [
            Deletion(node.name, False, _error_text(r))
            if isinstance(r, Exception)
            else Deletion(node.name, r == 1, None)
            for node, r in zip(self.nodes, replies)
        ]

    def node_info(self) -> list[NodeInfo]:
        """Ask each node in turn how it is: PING latency, INFO fields, fsync policy.

        One node at a time, so a latency is that node's alone; the second PING
        is timed (the first pays for connecting). ``appendfsync`` comes from
        ``CONFIG GET``, which managed Redis may rename or deny (then None).
        """
        return [_node_info(node, self.node_timeout) for node in self.nodes]

    def close(self) -> None:
        """Close this process's idle connections to the nodes (they reopen on use)."""
        for node in self.nodes:
            node.close()

    def rate(self, name: str, rate: Any, *, burst: int = 1, also: Any = None) -> Any:
        """Book a start of ``name`` under ``rate`` ("10/s", (count, seconds), or several):
        a :class:`~celery_redlock.core.rates.RateSlot`, due now or at ``start_at``.
        ``also``: other names and their rates, booked in the same round.

        Raises:
            QuorumUnavailable: fewer than a quorum of nodes answered.
        """
        from .core.rates import reserve_named

        return reserve_named(self, name, rate, burst=burst, also=also)


def _in_the_way(replies: Sequence[Any], task_id: str | None) -> Holder | Claim:
    """What stopped an acquire: the holder a node reported (with the claimant it saw
    beside it), the holder of another name held together (``also=``), or the claim
    naming another id."""
    held = [r for r in replies if _is_list(r) and r[0] == 0]
    full = [r for r in replies if _is_list(r) and r[0] == 5]
    if held or (task_id is None and not full):
        holder = _holder([(_text(r[1]), int(r[2])) for r in held])
        claimants = [_claimant(r[3]) for r in held if len(r) > 3 and r[3]]
        if claimants:
            holder = holder._replace(claimant=Counter(claimants).most_common(1)[0][0])
        return holder
    if full:  # my name had a permit, another name held together had none
        return _holder([(_text(r[2]), int(r[3])) for r in full])
    claimed = _holder([(_claimant(r[1]), int(r[2])) for r in replies if _is_list(r) and r[0] == 3])
    return Claim(claimed.owner, claimed.remaining)


def _holder(seen: list[tuple[str | None, int]], quorum: int = 1) -> Holder:
    """The most common holder among node answers, if at least ``quorum`` agree."""
    if not seen:
        return Holder(None, None)
    owner, votes = Counter(owner for owner, _ in seen).most_common(1)[0]
    if votes < quorum:
        return Holder(None, None)
    pttls = [pttl for o, pttl in seen if o == owner and pttl >= 0]
    return Holder(owner, min(pttls) / 1000.0 if pttls else None)


def _claimant(value: Any) -> str | None:
    """A claim value as an id: a started mark (``~id``) names the run that started."""
    text = _text(value)
    return text[1:] if text and text.startswith(STARTED_MARK) else text


def _tagged(name: str) -> str:
    """The name with a Redis Cluster hash tag: its own ``{...}``, or the whole name in braces."""
    if not isinstance(name, str) or not name:
        raise ConfigurationError(f"a lock name must be a non-empty string, got {name!r}")
    return name if ("{" in name and "}" in name.split("{", 1)[1]) else f"{{{name}}}"


def _checked(name: str, check: Callable[[Any], Any], value: Any) -> Any:
    """``check(value)``, its ValueError raised as a ConfigurationError naming ``name``."""
    try:
        return check(value)
    except ValueError as exc:
        raise ConfigurationError(f"{name} {exc}, got {value!r}") from None


def _positive(name: str, value: Any) -> None:
    # Durations must be finite: they become PX milliseconds. The test inline is
    # only a fast path for plain numbers; the rule is settings.check_seconds.
    if (value.__class__ is float or value.__class__ is int) and 0 < value < _INF:
        return
    _checked(name, settings.check_seconds, value)


_INF = float("inf")


def _ms(seconds: float) -> int:
    return max(1, int(seconds * 1000))


def _is_list(reply: Any) -> bool:
    return isinstance(reply, list)


def _text(value: Any) -> str | None:
    if value is None or value is False:
        return None
    return value.decode() if isinstance(value, bytes) else str(value)


# -- records of the read-only views (Redlock.inspect_key ... node_info) -------

__all__ += ["ClaimView", "Deletion", "NodeInfo", "NodeView", "ScanResult", "mask_url", "node_name"]


class NodeView(NamedTuple):
    """One node's copy of one key, or why the node did not answer."""

    #: The node, as named in messages (URL with the password masked).
    node: str
    #: The key's value (the owner value of a lock, a claim's value), or None.
    holder: str | None = None
    #: PTTL of the key in milliseconds: -2 no key, -1 no TTL.
    pttl_ms: int = -2
    #: The fence value, when a fence key was read.
    fence: str | None = None
    #: The node's error, or None when it answered.
    error: str | None = None


class ScanResult(NamedTuple):
    """What :meth:`Redlock.scan` found."""

    #: The names after ``{prefix}:{kind}:``, sorted, at most ``limit``.
    names: list[str]
    #: Node name -> error, for the nodes that failed during the scan.
    errors: dict[str, str]
    #: True when a node had more keys than ``limit``.
    truncated: bool


class ClaimView(NamedTuple):
    """A claim as the nodes hold it (:meth:`Redlock.read_claim`)."""

    #: The value a quorum of the nodes holds, or None.
    value: str | None
    #: The values that may hold a quorum, counting the nodes that did not answer.
    candidates: frozenset[str]


class Deletion(NamedTuple):
    """One node's answer to :meth:`Redlock.force_release`."""

    node: str
    #: True if the node had the key and deleted it.
    deleted: bool
    error: str | None


class NodeInfo(NamedTuple):
    """How one node is (:meth:`Redlock.node_info`); "-" or None where unknown."""

    node: str
    #: Why the node could not be asked (PING or INFO failed), or None.
    error: str | None = None
    #: Seconds the second PING took.
    latency: float = 0.0
    #: ``redis_version`` (``valkey X`` on Valkey).
    version: str = "-"
    #: ``master`` or ``slave``.
    role: str = "-"
    maxmemory_policy: str = "-"
    maxmemory: int = 0
    #: Whether AOF is on (None if INFO does not say).
    aof: bool | None = None
    #: ``appendfsync`` when AOF is on and CONFIG GET is allowed.
    appendfsync: str | None = None
    #: The server's ``run_id``: two nodes with one run_id are one server.
    run_id: str | None = None
    #: ``connected_slaves``: the replicas attached to a master (None if INFO does not say).
    replicas: int | None = None


def node_name(spec: NodeSpec) -> str:
    """How a node is named in messages: its URL with any password masked, or a client's address.

    Raises:
        ConfigurationError: ``spec`` is neither a string nor a ``redis.Redis`` client.
    """
    return mask_url(spec) if isinstance(spec, str) else Node(spec, 1.0).name


def _node_info(node: Node, timeout: float) -> NodeInfo:
    latency = 0.0
    for _ in range(2):  # time the second: the first pays for connecting
        started = time.perf_counter()
        pong = gather([node], ("PING",), timeout)[0]
        latency = time.perf_counter() - started
        if isinstance(pong, Exception):
            return NodeInfo(node.name, _error_text(pong), latency)
    info = gather([node], ("INFO",), timeout)[0]
    if isinstance(info, Exception):
        return NodeInfo(node.name, f"INFO failed: {_error_text(info)}", latency)
    lines = (line.partition(":") for line in _readable(info).splitlines())
    fields = {k: v.strip() for k, sep, v in lines if sep and not k.startswith("#")}
    version = fields.get("redis_version", "?")
    if "valkey_version" in fields:
        version = f"valkey {fields['valkey_version']}"
    aof = fields.get("aof_enabled") == "1" if "aof_enabled" in fields else None
    fsync = None
    if aof:
        reply = gather([node], ("CONFIG", "GET", "appendfsync"), timeout)[0]
        if isinstance(reply, list) and len(reply) == 2:
            fsync = _readable(reply[1])
    return NodeInfo(
        node.name,
        None,
        latency,
        version,
        fields.get("role", "?"),
        fields.get("maxmemory_policy", "?"),
        int(fields.get("maxmemory", "0") or 0),
        aof,
        fsync,
        fields.get("run_id"),
        int(fields["connected_slaves"]) if fields.get("connected_slaves", "").isdigit() else None,
    )


def _readable(value: Any) -> Any:
    # A reply as text, whatever bytes it holds (None stays None).
    return value.decode("utf-8", "backslashreplace") if isinstance(value, bytes) else value


def _error_text(exc: BaseException) -> str:
    return str(exc) or type(exc).__name__
