"""The lease on one name: acquire and extend (its release: :mod:`.release`).

Acquire
=======

One Lua call per node, sent to all nodes at once: if the key holds my owner
value its TTL is refreshed (so a re-sent acquire is harmless); if it holds
another, the node reports the holder and its PTTL; otherwise it sets the key
with the TTL. The lease is granted when a quorum granted it **and** validity
is left (:meth:`Quorum.expires`). Otherwise the key is released on every node,
including the ones that did not answer, because their reply may only have
been lost. The fencing token comes back in the same round (:mod:`.fencing`).

The same round can look at the caller's id (the gates of ``scripts.shared``):
a receipt that it already finished, the name's claim, a throttle period.
With none of these and no fence value to move (fencing off, or a lazy
lease), the Redis kind sends the round to plain masters as a bare ``SET NX
PX``, the script's own first step, without the script's cost on the nodes; a
node that refuses it runs the script in a second round, to report the holder
(or, mine already, to refresh a re-sent acquire): :mod:`.nodes.redis.first`.

Extend *sets* the TTL (never adds), for every lease of the client in one call
per node; release deletes the key only where it still holds my owner value.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .exceptions import QuorumUnavailable
from .fencing import Fencing
from .held import FREED, NO_QUORUM, TOO_LATE, Client, Lease
from .keyspace import KeySpace
from .ops import Acquire, Extend, Extended, Gates, Granted
from .quorum import Quorum
from .records import (
    Claim,
    Finished,
    Holder,
    TooEarly,
    full_jitter,
    in_the_way,
    split,
    stopped_early,
)
from .release import Releasing
from .steps import Pause, Steps, drive, driven
from .values import ms

if TYPE_CHECKING:
    from .rates import RatedRound
    from .records import RateSlot

__all__ = [
    "SPLIT_RETRIES",
    "Client",
    "Lease",
    "Leases",
    "granted_on",
    "not_renewed",
]

#: Attempts made again when contenders split the nodes and nobody holds a quorum
#: (the Redlock algorithm's "retry after a random delay").
SPLIT_RETRIES = 2


def granted_on(replies: Sequence[Any]) -> list[int]:
    """The indexes of the nodes whose reply to an acquire granted it."""
    return [i for i, r in enumerate(replies) if isinstance(r, Granted)]


def not_renewed(votes: int, refused: int, total: int, needed: int) -> str:
    """Why a renewal that ``votes`` of ``total`` nodes granted, and ``refused``
    answered "not this owner", did not keep its lease."""
    if votes >= needed:
        return TOO_LATE
    # so many nodes said the key holds another owner (or none) that no quorum is
    # left to hold it: the key changed there, it is no outage
    return FREED if refused > total - needed else NO_QUORUM


@dataclass(frozen=True)
class Caller:
    """Who asks for a lock and the gates its acquire passes (see
    :meth:`Redlock.try_acquire`): one value from the client down to the round."""

    task_id: str | None = None
    receipts: bool = False
    claim: str | None = None
    own_claim: bool = False
    throttle: float | None = None
    slot: str | None = None

    def gates(self, space: KeySpace, name: str, stand_in: str | None = None) -> Gates | None:
        """The gates of an acquire of ``name``; None where none applies. A plain lock's
        has gates only where one is asked for; a permit's call names ``stand_in`` for
        the keys of the gates not asked for (its keys keep their places)."""
        ask = self.receipts or self.claim or self.throttle or stand_in is not None
        if self.task_id is None or not ask:
            return None
        unused = "" if stand_in is None else stand_in
        return Gates(
            self.task_id,
            space.receipt_key(name, self.task_id) if self.receipts or not unused else unused,
            space.claim_key(name) if self.claim or not unused else unused,
            self.receipts,
            self.claim,
            self.own_claim,
            ms(self.throttle) if self.throttle else None,
            space.coalesce_key(name, "throttle") if self.throttle else unused,
            time.time_ns() // 1_000_000 if self.throttle else 0,
            self.slot or "",
        )


#: The caller of an acquire that names no task: no gate applies.
NOBODY = Caller()


class Leases(Releasing):
    """The lease's operations on a plain lock (one key per name)."""

    __slots__ = ("redlock", "quorum", "keyspace", "fencing")

    def __init__(self, redlock: Client, quorum: Quorum, keyspace: KeySpace, fencing: Fencing):
        self.redlock = redlock  # what a Lease names as its client
        self.quorum = quorum
        self.keyspace = keyspace
        self.fencing = fencing

    def acquiring(
        self,
        name: str,
        ttl: float,
        owner: str,
        fence: bool,
        caller: Caller,
        rated: RatedRound | None = None,
        splits: int = SPLIT_RETRIES,
    ) -> Steps[Lease | Holder | Claim | Finished | TooEarly | RateSlot]:
        """One attempt on a plain lock (see :meth:`Redlock.try_acquire`), as steps
        (:mod:`.steps`); ``rated`` books a rated start in the same round (see
        :class:`.rates.RatedRound`): its bookings are the sync client's own calls.

        An attempt that no gate and no rate applies to, and that fails with
        nobody holding a quorum (concurrent contenders split the nodes), is made
        again after a random pause, up to ``splits`` times: reported as held,
        a split would have every contender drop its work while none runs."""
        op = self._acquire_op(name, ttl, owner, fence, caller)
        start = self.quorum.clock()
        replies = (yield op) if rated is None else rated.run(op, (op.key,))
        outcome = self._concluding(name, op, ttl, fence, caller, start, replies, rated, splits)
        return (yield from outcome)

    def acquire(
        self, name: str, ttl: float, owner: str, fence: bool
    ) -> Lease | Holder | Claim | Finished | TooEarly | RateSlot:
        """:meth:`acquiring` with no gate and no rate, in this thread: its round run here
        and, when the replies grant the lease as they stand (the rule), the lease
        made at once; any other outcome is the steps' to settle, from that round."""
        q = self.quorum
        op = self._acquire_op(name, ttl, owner, fence, NOBODY)
        start = q.clock()
        replies = q.run(op)
        lease = self._standing(name, op, ttl, fence, start, replies)
        if lease is not None:
            return lease
        return drive(q, self._concluding(name, op, ttl, fence, NOBODY, start, replies))

    def _acquire_op(
        self, name: str, ttl: float, owner: str, fence: bool, caller: Caller
    ) -> Acquire:
        key, fence_key = self.keyspace.keys(name)
        gates = None if caller.task_id is None else caller.gates(self.keyspace, name)
        # A lazy lease moves no fence value: its token is issued on the first read.
        fencing = self.fencing.arg if fence else ""
        return Acquire(key, fence_key, owner, ms(ttl), fencing, time.time_ns() // 1000, gates)

    def _standing(
        self, name: str, op: Acquire, ttl: float, fence: bool, start: float, replies: list[Any]
    ) -> Lease | None:
        """The lease an acquire round started at ``start`` grants as its replies stand: a
        quorum granted it in time and agrees on its token (or the token is lazy, or
        fencing off); else None."""
        q = self.quorum
        first = replies[0]
        alike = first.__class__ is Granted and replies.count(first) == len(replies)  # the rule
        granted = range(len(replies)) if alike else granted_on(replies)
        expires = q.expires(start, ttl)
        if len(granted) < q.needed or q.clock() >= expires:
            return None
        key, fence_key, owner = op.key, op.fence_key, op.owner
        fencing = self.fencing
        if not fence and fencing.fencing:  # lazy: issued on the first read of its token
            pending = tuple(granted)
            return Lease(
                self.redlock, name, key, fence_key, owner, ttl, None, expires, pending, fencing
            )
        if alike:  # every node granted at one fence value: the token stands
            token = None if first.fence is None else int(first.fence)
        else:
            token, stands = fencing.settled([replies[i].fence for i in granted])
            if not stands:  # the nodes disagree: phase 2 writes the token back
                return None
        return Lease(self.redlock, name, key, fence_key, owner, ttl, token, expires)

    def _concluding(
        self,
        name: str,
        op: Acquire,
        ttl: float,
        fence: bool,
        caller: Caller,
        start: float,
        replies: list[Any],
        rated: RatedRound | None = None,
        splits: int = SPLIT_RETRIES,
    ) -> Steps[Lease | Holder | Claim | Finished | TooEarly | RateSlot]:
        """What an acquire round started at ``start`` that answered ``replies`` comes
        to (see :meth:`acquiring`)."""
        q = self.quorum
        key, owner, gates = op.key, op.owner, op.gates
        # Only the gates answer "finished" or "too early".
        stop = None if gates is None else stopped_early(replies, caller.task_id, q.needed)
        if stop is not None:
            yield from self._let_go(key, owner, rated, replies)
            return stop
        expires = q.expires(start, ttl)
        if rated is not None and q.has_quorum(rated.free(replies)) and q.clock() < expires:
            booked = rated.settle()
            if not booked.due:  # booked for later (or the bookings split): hold nothing now
                rated.unstart([key], owner, replies)
                return booked
            if booked.wait > 0:
                yield Pause(booked.wait)
        lease = self._standing(name, op, ttl, fence, start, replies)
        if lease is not None:
            return lease
        granted = granted_on(replies)
        if len(granted) >= q.needed and q.clock() < expires:
            # the nodes disagree on the token: phase 2 writes the largest back
            token, _ = self.fencing.settled([replies[i].fence for i in granted])
            assert token is not None  # fencing on: the largest value seen
            written = yield from self.fencing.writing_back(
                granted, token, key, op.fence_key, owner, expires
            )
            if written is not None:
                return Lease(self.redlock, name, key, op.fence_key, owner, ttl, token, expires)
        yield from self._let_go(key, owner, rated, replies)
        q.check(replies)
        # a quorum granted too late to stand (a first call's connects, a stalled
        # host): nobody holds the name, so never "held", and tried again like a split
        late = len(granted) >= q.needed
        if splits and rated is None and gates is None and (late or split(replies, q.needed)):
            yield Pause(q.rng() * q.node_timeout)  # out of step with the other contenders
            return (yield from self.acquiring(name, ttl, owner, fence, caller, rated, splits - 1))
        if late:
            raise q.too_late(granted, start)
        return in_the_way(replies, caller.task_id)

    def _let_go(
        self, key: str, owner: str, rated: RatedRound | None, replies: list[Any]
    ) -> Steps[None]:
        """Free what an attempt that did not stand may hold; a rated one also takes back
        its bookings and the starts it recorded."""
        if rated is None:
            yield from self.releasing_everywhere(key, owner, granted=granted_on(replies))
        else:
            rated.let_go([key], owner, replies)

    def retrying(
        self,
        attempt: Callable[[], Steps[object]],
        timeout: float | None,
        retry_delay: float,
        retry_delay_max: float,
    ) -> Steps[Lease | None]:
        """``attempt()`` (steps) until it returns a lease, with backoff; None after
        ``timeout`` seconds (see :meth:`Redlock.acquire` with ``blocking``)."""
        q = self.quorum
        start = q.clock()
        tries = 0
        while True:
            try:
                result = yield from attempt()
            except QuorumUnavailable:
                if timeout is not None and q.clock() - start >= timeout:
                    raise
                result = None
            if isinstance(result, Lease):
                return result
            delay = full_jitter(tries, retry_delay, retry_delay_max, q.rng)
            if timeout is not None:
                left = timeout - (q.clock() - start)
                if left <= 0:
                    return None
                delay = min(delay, left)
            yield Pause(delay)
            tries += 1

    def extending(self, leases: Sequence[Lease], ttl: float | None) -> Steps[list[bool]]:
        """Renew leases and the names held with them, in one call per node."""
        if not any(lease.also for lease in leases):
            return (yield from self._extend(leases, ttl))
        flat = [one for lease in leases for one in (lease, *lease.also)]
        renewals = yield from self._extend(flat, ttl)
        done = dict(zip(map(id, flat), renewals))
        out = []
        for lease in leases:
            group = (lease, *lease.also)
            renewed = all(done[id(one)] for one in group)
            if not renewed:
                why = next((one.lost_reason for one in group if one.lost_reason), None)
                for one in group:
                    one.mark_lost(why)
            out.append(renewed)
        return out

    def _extend(self, leases: Sequence[Lease], ttl: float | None) -> Steps[list[bool]]:
        q = self.quorum
        live = [lease for lease in leases if not lease.lost]
        results = {id(lease): False for lease in leases}
        why: dict[int, str] = {}
        if live:
            op = Extend(tuple((one.key, one.owner, ms(ttl or one.ttl)) for one in live))
            start = q.clock()
            replies = yield op
            for j, lease in enumerate(live):
                votes = sum(1 for r in replies if isinstance(r, Extended) and r.renewed[j])
                expires = q.expires(start, ttl or lease.ttl)
                if votes >= q.needed and q.clock() < expires:
                    lease._renewed(expires)
                    results[id(lease)] = True
                    continue
                refused = sum(1 for r in replies if isinstance(r, Extended) and not r.renewed[j])
                why[id(lease)] = not_renewed(votes, refused, len(q.nodes), q.needed)
        for lease in leases:
            if not results[id(lease)]:
                lease.mark_lost(why.get(id(lease)))
        return [results[id(lease)] for lease in leases]

    extend_many = driven(extending)
