"""Claims: who is meant to take a name next, one-shot decisions, and the
schedules of coalesced calls (debounce, throttle).

A claim is a key beside the name's lock key, set on a quorum in one round.
Its value is an id (a task id); ``~<id>`` marks a claimed run that started
(see ``scripts.shared.GATES``) and counts as no claim. Claims are never
released by their holder: they expire, or are withdrawn by the acquire that
honours them (``claim="take"``) or by :meth:`Claims.withdraw_claim`. A claim
that fell short of a quorum is withdrawn at once where it was written.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

from .keyspace import KeySpace
from .lease import Leases
from .nodes import NotReplicated
from .ops import Claim as ClaimOp
from .ops import (
    Claimed,
    ClaimNext,
    Count,
    Debounce,
    Done,
    Peek,
    Peeked,
    Release,
    Scheduled,
    Taken,
    Throttle,
)
from .quorum import Quorum
from .records import STARTED_MARK, Claim, Schedule, agree
from .steps import On, Steps, driven
from .values import ms, positive

__all__ = ["Claims"]


class Claims:
    """The claim operations of a client (see the :class:`Redlock` methods of the same names)."""

    __slots__ = ("quorum", "keyspace", "leases")

    def __init__(self, quorum: Quorum, keyspace: KeySpace, leases: Leases):
        self.quorum = quorum
        self.keyspace = keyspace
        self.leases = leases  # a short claim is withdrawn with the lease's release

    def claiming(self, key: str, value: str, *, ttl: float) -> Steps[bool]:
        """Set ``{prefix}:{key}`` to ``value`` on a quorum unless another value is there.

        The claim is never released: it expires. Used for one-shot decisions
        such as "this beat slot was sent". Returns True if the claim is ours
        (also when re-sent), False if another value won. A claim that fell
        short of a quorum is withdrawn everywhere.

        Raises:
            QuorumUnavailable: fewer than a quorum of nodes answered.
        """
        positive("ttl", ttl)
        q = self.quorum
        full_key = self.keyspace.full(key)
        replies = yield ClaimOp(full_key, value, ms(ttl))
        if q.has_quorum(sum(1 for r in replies if r == Done(True))):
            return True
        # logged only where it was set: a node that never answered is an outage
        granted = _where(replies, Done(True))
        yield from self.leases.releasing_everywhere(full_key, value, granted=granted)
        q.check(replies)
        return False

    def claiming_next(
        self, name: str, claimant: str, *, ttl: float, replace: bool = False
    ) -> Steps[Claim]:
        """Point ``name``'s claim at ``claimant`` on a quorum, for ``ttl`` seconds.

        A claim says which id is meant to take the name next (an enqueued
        task); :meth:`try_acquire` with ``claim=`` honours it. A claim that
        already names ``claimant`` keeps it, its TTL raised to ``ttl``.
        Another claimant's claim stays unless ``replace``, which takes it over.

        Returns the :class:`Claim`: ours when ``claim.claimant == claimant``;
        otherwise the other claimant a quorum agrees on, or ``claimant=None``
        when the nodes are split (concurrent claims: try again).

        Raises:
            QuorumUnavailable: fewer than a quorum of nodes answered.
        """
        positive("ttl", ttl)
        q = self.quorum
        key = self.keyspace.claim_key(name)
        replies = yield ClaimNext(key, claimant, ms(ttl), replace)
        ours = [r for r in replies if isinstance(r, Taken)]
        if q.has_quorum(len(ours)):
            # Only a previous claimant a quorum agrees on was taken over: a node
            # where its execution took the lock first answers without it.
            previous = agree([(r.previous, 0) for r in ours if r.previous], q.needed).owner
            renewed = sum(1 for r in ours if r.renewed) >= q.needed
            return Claim(claimant, ttl, previous, renewed)
        # Withdrawn only where this call wrote it (its replicas unconfirmed too: the
        # write stands on the primary): a claim that already named the claimant (a
        # re-publish renewing its task's claim) stays, and so does what a node that
        # did not answer holds (the claimant's run withdraws it, or its TTL ends it).
        # A renewal during an outage must not free the task's key.
        written = [
            (node, r.reply if isinstance(r, NotReplicated) else r)
            for node, r in zip(q.nodes, replies)
        ]
        wrote = [node for node, r in written if isinstance(r, Taken) and not r.renewed]
        if wrote:
            yield On(Release(key, claimant), wrote)
        q.check(replies)
        seen = [(r.claimant, r.pttl_ms) for r in replies if isinstance(r, Claimed)]
        other = agree(seen, q.needed)
        if other.owner is None or (
            len(seen) == len(q.nodes) and {o for o, _ in seen} == {other.owner}
        ):
            return Claim(other.owner, other.remaining)
        # The nodes answer at different moments: a claimant split by a third and
        # trying again can show on a majority across two of its own attempts (the
        # first withdrawn before the second was written) without ever holding one.
        # Unless every node named it, a second read confirms it, so that a
        # duplicate is never handed the id of a call that did not win.
        confirmed = yield from self.reading_claimant(name)
        if confirmed.claimant != other.owner:
            return Claim(None, None)  # split after all: the caller tries again
        return confirmed

    def debouncing(
        self, name: str, claimant: str, *, delay: float, max_delay: float | None, ttl: float
    ) -> Steps[Schedule]:
        """Take ``name``'s claim over for a call due ``delay`` seconds from now.

        A burst is the calls made while the name is claimed; none is due later
        than ``max_delay`` after the burst's first call. The claim outlives the
        due time by ``ttl``.

        Raises:
            QuorumUnavailable: fewer than a quorum of nodes answered.
        """
        positive("delay", delay)
        cap = "" if max_delay is None else str(ms(max_delay))
        return (
            yield from self._schedule(
                Debounce, name, "burst", claimant, str(ms(delay)), cap, ttl=ttl
            )
        )

    def throttling(
        self, name: str, claimant: str, *, period: float, trailing: bool, ttl: float
    ) -> Steps[Schedule]:
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
        positive("period", period)
        return (
            yield from self._schedule(
                Throttle, name, "throttle", claimant, str(ms(period)), trailing, ttl=ttl
            )
        )

    def _schedule(
        self,
        kind: Callable[..., Debounce | Throttle],
        name: str,
        tag: str,
        claimant: str,
        *params: Any,
        ttl: float,
    ) -> Steps[Schedule]:
        """Run a ``kind`` of planning on ``name``'s claim and its ``tag`` key, with
        ``params`` between the time now and the ``ttl``."""
        space = self.keyspace
        now = time.time_ns() // 1_000_000
        keys = (space.claim_key(name), space.coalesce_key(name, tag))
        op = kind(*keys, claimant, now, *params, str(ms(ttl)))
        q = self.quorum
        replies = yield op
        answers = [r for r in replies if isinstance(r, Scheduled)]
        if not q.has_quorum(len(answers)):
            yield from self.leases.releasing_everywhere(
                op.claim_key, op.claimant, granted=_where(replies, Scheduled)
            )
            q.check(replies)
        states = Counter(r.state for r in answers)
        state, votes = states.most_common(1)[0]
        if votes < q.needed:
            state = "now"  # the nodes disagree: run now; the start itself is throttled
        agreed = [r for r in answers if r.state == state]
        slot = Counter(r.slot for r in agreed).most_common(1)[0][0] if agreed else None
        due = max(int(r.slot) for r in agreed) / 1000.0 if agreed else op.now_ms / 1000.0
        other = agree([(r.other, 0) for r in agreed if r.other], q.needed)
        return Schedule(state, due, other.owner, slot)

    def withdrawing_claim(self, name: str, claimant: str) -> Steps[int]:
        """Withdraw ``name``'s claim where it names ``claimant``. Never raises.

        Returns how many nodes withdrew it.
        """
        replies = yield Release(self.keyspace.claim_key(name), claimant)
        return sum(1 for r in replies if r == Count(1))

    def reading_claimant(self, name: str) -> Steps[Claim]:
        """The claim of ``name`` a quorum agrees on (``claimant=None`` if none).

        Raises:
            QuorumUnavailable: fewer than a quorum of nodes answered.
        """
        q = self.quorum
        replies = yield Peek(self.keyspace.claim_key(name))
        q.check(replies)
        found = [(r.value, r.pttl_ms) for r in replies if isinstance(r, Peeked) and r.value]
        seen = agree(found, q.needed)
        if seen.owner is not None and seen.owner.startswith(STARTED_MARK):
            return Claim(None, None)  # its run started: no claim is pending
        return Claim(seen.owner, seen.remaining)

    # The sync methods; an AsyncRedlock drives the same steps on its event loop.
    claim = driven(claiming)
    claim_next = driven(claiming_next)
    debounce = driven(debouncing)
    throttle = driven(throttling)
    withdraw_claim = driven(withdrawing_claim)
    claimant = driven(reading_claimant)


def _where(replies: Sequence[Any], granted: Any) -> list[int]:
    """The indexes of the nodes whose reply is ``granted`` (a value, or a type)."""
    if isinstance(granted, type):
        return [i for i, r in enumerate(replies) if isinstance(r, granted)]
    return [i for i, r in enumerate(replies) if r == granted]
