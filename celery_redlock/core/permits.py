"""Permits: up to K holders of a name at once, and several names taken together.


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
a Redis Cluster (CROSSSLOT); the all-or-nothing check of one call per node
needs every name on one shard. So on a cluster node, ``also`` takes only
names that share one hash tag (``"order-1:{pay}"`` with ``"payment-api:{pay}"``):
any other is refused with :class:`ConfigurationError` naming the option
(:func:`~celery_redlock.core.nodes.check_together`).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from . import settings
from .lease import Caller, Lease, Leases, granted_on
from .nodes import check_together
from .ops import AcquirePermit, Granted, GrantedPermit, ReleasePrefix
from .records import Claim, Finished, Holder, TooEarly, in_the_way, stopped_early
from .steps import On, Pause, Steps
from .values import checked, ms

if TYPE_CHECKING:
    from .rates import RatedRound
    from .records import RateSlot

__all__ = ["Permits"]


class Permits:
    """Acquires of one of K permits of a name, with the names ``also`` held together.

    Args:
        leases: the plain lock's operations, whose keys, fencing and releases
            the permits share.
    """

    __slots__ = ("leases", "quorum", "keyspace", "fencing")

    def __init__(self, leases: Leases):
        self.leases = leases
        self.quorum = leases.quorum
        self.keyspace = leases.keyspace
        self.fencing = leases.fencing

    def trying(
        self,
        name: str,
        ttl: float,
        owner: str,
        caller: Caller,
        limit: int,
        also: Sequence[tuple[str, int]],
        rounds: tuple[int, float],
        rated: RatedRound | None = None,
    ) -> Steps[Lease | Holder | Claim | Finished | TooEarly | RateSlot]:
        """One attempt, of up to ``rounds`` = (:attr:`Redlock.PERMIT_ROUNDS`,
        :attr:`Redlock.PERMIT_SPLIT_PAUSE`) rounds on a split (see :meth:`Redlock.try_acquire`),
        as steps (:mod:`.steps`); ``rated`` books a rated start in the same round (see
        :class:`.rates.RatedRound`): its bookings are the sync client's own calls."""
        q, space = self.quorum, self.keyspace
        count, pause = rounds
        limit = checked("limit", settings.check_limit, limit)
        names = [(name, limit)] + [
            (other, checked("limit", settings.check_limit, k)) for other, k in also
        ]
        groups = [space.permit_keys(n, k) for n, k in names]
        fences = [space.keys(n)[1] for n, _ in names]
        every = [key for group in groups for key in group]  # what a failed attempt frees
        if also:
            check_together(q.nodes, [n for n, _ in names])
        key = groups[0][0]
        gates, task_id = caller.gates(space, name, key), caller.task_id
        prefer = ("",) * len(names)
        for round_ in range(count):
            if gates is not None and caller.throttle:  # the throttle's clock, per round
                gates = replace(gates, now_ms=time.time_ns() // 1_000_000)
            op = AcquirePermit(
                tuple(map(tuple, groups)),
                tuple(fences),
                owner,
                ms(ttl),
                self.fencing.arg,
                time.time_ns() // 1000,
                task_id,
                gates,
                prefer,
            )
            start = q.clock()
            replies = (yield op) if rated is None else rated.run(op, every)
            stop = stopped_early(replies, task_id, q.needed)
            if stop is not None:
                yield from self._let_go(every, owner, rated, replies)
                return stop
            ok = [r if isinstance(r, Granted) else None for r in replies]
            chosen = [_most_granted(ok, g) for g in range(len(names))]
            expires = q.expires(start, ttl)
            if rated is not None and q.has_quorum(rated.free(replies)) and q.clock() < expires:
                booked = rated.settle()
                if not booked.due:  # booked for later (or the bookings split)
                    rated.unstart(every, owner, replies)
                    return booked
                if booked.wait > 0:
                    yield Pause(booked.wait)
            if all(len(at) >= q.needed for _, at in chosen) and q.clock() < expires:
                lease = yield from self._granting(
                    names, groups, fences, chosen, ok, owner, ttl, expires
                )
                if lease is not None:
                    return lease
                yield from self.leases.releasing_prefix(every, owner)
                break
            yield from self._let_go(every, owner, rated, replies)
            q.check(replies)
            if not any(ok) or round_ + 1 == count:
                break
            # Split: free permits exist, but the nodes picked different indexes
            # (concurrent acquirers seen in different orders). Ask for the
            # index most of them picked, after a short jittered pause.
            prefer = tuple(str(index) for index, _ in chosen)
            yield Pause(q.rng() * pause)
        q.check(replies)
        if all(len(at) >= q.needed for _, at in chosen):  # too late to stand: nobody holds it
            raise q.too_late(sorted({i for _, at in chosen for i in at}), start)
        return in_the_way(replies, task_id)

    def _let_go(
        self, every: list[str], owner: str, rated: RatedRound | None, replies: list[Any]
    ) -> Steps[None]:
        """Free what a round that did not stand may hold (see :meth:`Leases._let_go`)."""
        if rated is None:
            yield from self.leases.releasing_prefix(every, owner, granted_on(replies))
        else:
            rated.let_go(every, owner, replies)

    def _granting(
        self,
        names: list[tuple[str, int]],
        groups: list[list[str]],
        fences: list[str],
        chosen: list[tuple[int, list[int]]],
        ok: list[Any],
        owner: str,
        ttl: float,
        expires: float,
    ) -> Steps[Lease | None]:
        """The leases of a permit attempt that every name won on a quorum: the first
        name's, the others in its ``also``. None if a token could not be issued."""
        q = self.quorum
        everywhere = set(range(len(q.nodes)))
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
            others = [n for i, n in enumerate(q.nodes) if i not in granted_all]
            if strays:
                yield On(ReleasePrefix(tuple(strays), owner), others)
        leases = []
        for g, ((name, _), group, fence_key, (index, at)) in enumerate(
            zip(names, groups, fences, chosen)
        ):
            fences_seen = [None if r is None else _pick(r, g)[0] for r in ok]
            lease = yield from self._leasing(
                name, group[index], fence_key, owner, ttl, expires, at, fences_seen
            )
            if lease is None:
                return None
            lease.permit = index
            leases.append(lease)
        leases[0].also = tuple(leases[1:])
        return leases[0]

    def _leasing(
        self,
        name: str,
        key: str,
        fence_key: str,
        owner: str,
        ttl: float,
        expires: float,
        granted: list[int],
        fences: list[Any],
    ) -> Steps[Lease | None]:
        """The lease of a permit granted on a quorum, its token issued eagerly; None if
        the token could not be written on a quorum within validity."""
        token, stands = self.fencing.settled([fences[i] for i in granted])
        if not stands:
            # A fresh value, written only where it is larger than the node's: two
            # holders can never both land one value on a quorum (module docstring).
            assert token is not None  # fencing on: the largest value seen
            token += 1
            written = yield from self.fencing.writing_back(
                granted, token, key, fence_key, owner, expires, strict=True
            )
            if written is None:
                return None
        redlock = self.leases.redlock
        return Lease(redlock, name, key, fence_key, owner, ttl, token, expires)


def _pick(granted: Granted, g: int) -> tuple[str | None, int]:
    """The g-th name's (fence value, permit index) in a grant."""
    if not isinstance(granted, GrantedPermit):  # not a permit's reply: the lock key
        return granted.fence, 0
    return (granted.fence, granted.index) if g == 0 else granted.also[g - 1]


def _most_granted(ok: list[Any], g: int) -> tuple[int, list[int]]:
    """For the g-th name: the index most nodes granted (the lowest of equals), and where."""
    picks = Counter(_pick(r, g)[1] for r in ok if r is not None)
    index, _ = min(picks.items(), key=lambda kv: (-kv[1], kv[0]), default=(0, 0))
    return index, [i for i, r in enumerate(ok) if r is not None and _pick(r, g)[1] == index]
