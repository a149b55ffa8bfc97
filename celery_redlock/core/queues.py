"""Queues: a name's calls waiting in publish order, and the hand-over of the
name to the first of them.

A call that finds its name held *parks*: its id and the call itself (whatever
the caller needs to start it again; opaque here) are written to the name's
queue on a quorum, behind every call parked before it. When the holder lets
go it *hands the name over* (:meth:`Queues.next`): the name's claim is pointed
at the first call waiting, and the caller publishes that call; its acquire
honours the claim (``claim="take"``), so nobody else takes the name meanwhile,
and its start takes it out of the queue (``drop=``).

The order is one on every node: a park's ticket is the node's next number,
and when the nodes' tickets differ the largest is written back to all of
them (as a fence value is: :mod:`.fencing`), so a quorum holds one order (equal
tickets of concurrent parks fall back to the ids' order, the same on every
node). A node that restarted empty lacks the calls parked before; the
others still make a quorum for them, and its tickets catch up on the next
park's write-back.

Keys, in the name's hash slot: ``{prefix}:queue:{name}`` (the ids, by
ticket) and ``{prefix}:qcalls:{name}`` (the calls, and the last ticket), each
kept ``retention`` seconds after its last change.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from typing import NamedTuple

from .keyspace import KeySpace
from .ops import (
    AllHeld,
    Empty,
    Handed,
    HandPending,
    InQueue,
    QueueFull,
    QueueHead,
    QueueNext,
    QueuePark,
    QueuePeek,
    QueueStep,
    Release,
)
from .quorum import Quorum
from .records import agree
from .steps import On, Pause, Steps, driven
from .values import ms, positive

__all__ = ["HandOver", "Parked", "QueueView", "Queues"]

#: Rounds a hand-over spends when concurrent hand-overs split the nodes.
NEXT_ROUNDS = 3


class Parked(NamedTuple):
    """What :meth:`Queues.park` did."""

    #: True when the id waits in the queue on a quorum; False when the queue was full.
    parked: bool
    #: The id's place in the queue (1: next), as the quorum saw it.
    position: int = 0
    #: The id's ticket, agreed by a quorum (its order in the queue).
    ticket: int = 0
    #: When full: how many calls wait.
    waiting: int = 0
    #: With ``supersede``: the ids that waited before and were taken out.
    superseded: tuple[str, ...] = ()


class QueueView(NamedTuple):
    """What :meth:`Queues.peek` saw of a queue."""

    #: How many calls wait (the most any answering node holds).
    waiting: int
    #: The first id waiting, as a quorum sees it (None: nobody, or no agreement).
    next: str | None = None
    #: Its call, as parked.
    call: str | None = None
    #: How many nodes answered.
    answered: int = 0


class HandOver(NamedTuple):
    """What :meth:`Queues.next` did."""

    #: The id the name's claim now names (a quorum agrees): publish its call. None: no one.
    id: str | None = None
    #: That id's call, as parked.
    call: str | None = None
    #: How many calls wait, counting ``id``.
    waiting: int = 0
    #: An id a hand-over already points at (it has not started yet), if any.
    pending: str | None = None
    #: Seconds left on that pending hand-over's claim.
    pending_for: float | None = None
    #: How many nodes took ``drop`` out of the queue.
    removed: int = 0
    #: What a quorum answered: ``"handed"``, ``"pending"`` (a hand-over is), ``"held"``
    #: (every lock key is), ``"empty"`` (nobody waits), or ``""`` (no quorum agrees).
    state: str = ""


class Queues:
    """The queue operations of a client (see the :class:`Redlock` methods of the same names)."""

    __slots__ = ("quorum", "keyspace")

    def __init__(self, quorum: Quorum, keyspace: KeySpace):
        self.quorum = quorum
        self.keyspace = keyspace

    def queue_keys(self, name: str) -> tuple[str, str]:
        """The queue's two keys: the ids by ticket, and the calls."""
        return self.keyspace.coalesce_key(name, "queue"), self.keyspace.coalesce_key(name, "qcalls")

    def parking(
        self,
        name: str,
        id: str,
        call: str,
        *,
        most: int,
        retention: float,
        supersede: bool = False,
    ) -> Steps[Parked]:
        """Put ``id`` (and ``call``, to start it again) at the back of ``name``'s queue.

        An id already waiting keeps its place. With ``most`` > 0, a queue that
        already holds ``most`` ids takes no more: ``Parked(False, waiting=n)``,
        and the id is taken out wherever it went in. With ``supersede``, every
        other id waiting is taken out first (the newest call wins): they are
        :attr:`Parked.superseded`.

        Raises:
            QuorumUnavailable: fewer than a quorum of nodes answered.
        """
        positive("retention", retention)
        q = self.quorum
        op = QueuePark(*self.queue_keys(name), id, call, most, ms(retention), "", supersede)
        replies = yield op
        parked = [r for r in replies if isinstance(r, InQueue)]
        taken = tuple(sorted({i for r in parked for i in r.superseded}))
        if q.has_quorum(len(parked)):
            ticket = max(r.ticket for r in parked)
            if sum(1 for r in parked if r.ticket == ticket) < q.needed:
                # write the largest back: one order on a quorum (taking out nobody
                # now: a call parked since is newer, and stays)
                replies = yield replace(op, ticket=str(ticket), supersede=False)
                parked = [r for r in replies if isinstance(r, InQueue)]
                agreed = [r for r in parked if r.ticket == ticket]
                if not q.has_quorum(len(agreed)):
                    q.check(replies)
            return Parked(True, max(r.position for r in parked), ticket, superseded=taken)
        wrote = [n for n, r in zip(q.nodes, replies) if isinstance(r, InQueue)]
        if wrote:
            yield On(self._next(name, 1, id, "", "", 1), wrote)  # kept 1 ms more
        q.check(replies)
        full = [r.waiting for r in replies if isinstance(r, QueueFull)]
        return Parked(False, waiting=max(full, default=0))

    def handing_over(
        self,
        name: str,
        *,
        limit: int = 1,
        drop: str = "",
        owner: str = "",
        claim_ttl: float | None = None,
        retention: float = 1.0,
    ) -> Steps[HandOver]:
        """Hand ``name`` to the first call waiting, if it can have it now.

        First takes ``drop`` (an id that started) out of the queue. Then, with
        ``claim_ttl``, when no hand-over is pending, one of the name's ``limit``
        lock keys is free (``owner``'s counts as free: a holder handing over
        before it lets go) and a call waits: the name's claim names that call
        for ``claim_ttl`` seconds, and it is returned for the caller to start.
        Nodes that pointed their claim at another call than a quorum did take
        it back; concurrent hand-overs that split the nodes try again.

        Raises:
            QuorumUnavailable: fewer than a quorum of nodes answered.
        """
        q = self.quorum
        claim = "" if claim_ttl is None else str(ms(claim_ttl))
        op = self._next(name, limit, drop, owner, claim, ms(retention))
        removed = 0
        for attempt in range(NEXT_ROUNDS):
            replies = yield op
            q.check(replies)
            answers = [r for r in replies if isinstance(r, QueueStep)]
            removed = max(removed, sum(1 for r in answers if r.removed))
            op = replace(op, drop="")  # taken out: a second round only hands over
            handed = [(node, r) for node, r in zip(q.nodes, replies) if isinstance(r, Handed)]
            ids = Counter(r.id for _, r in handed)
            chosen, votes = ids.most_common(1)[0] if ids else (None, 0)
            stray = [n for n, r in handed if votes < q.needed or r.id != chosen]
            for node, r in handed:
                if node in stray:
                    yield On(Release(op.claim_key, r.id or ""), [node])
            if votes >= q.needed:
                mine = [r for _, r in handed if r.id == chosen]
                call = next((r.call for r in mine if r.call), None)
                waiting = max(r.waiting for r in mine)
                return HandOver(chosen, call, waiting, removed=removed, state="handed")
            if not handed:
                break
            yield Pause(q.rng() * 0.005 * (attempt + 1))
        pending = agree(
            [(r.claimant, r.pttl_ms) for r in replies if isinstance(r, HandPending)], q.needed
        )
        codes = Counter(_STATES[type(r)] for r in replies if type(r) in _STATES)
        state, votes = codes.most_common(1)[0] if codes else ("", 0)
        state = state if votes >= q.needed else ""
        return HandOver(
            pending=pending.owner, pending_for=pending.remaining, removed=removed, state=state
        )

    def peeking(self, name: str) -> Steps[QueueView]:
        """How many calls wait in ``name``'s queue, and the first of them. Read only.

        Raises:
            QuorumUnavailable: fewer than a quorum of nodes answered.
        """
        q = self.quorum
        replies = yield QueuePeek(*self.queue_keys(name))
        q.check(replies)
        answers = [r for r in replies if isinstance(r, QueueHead)]
        heads = Counter(r.first for r in answers if r.first)
        first, votes = heads.most_common(1)[0] if heads else (None, 0)
        if votes < q.needed:
            first = None
        call = next((r.call for r in answers if r.first and r.first == first), None)
        waiting = max((r.waiting for r in answers), default=0)
        return QueueView(waiting, first, call, len(answers))

    # The sync methods; an AsyncRedlock drives the same steps on its event loop.
    park = driven(parking)
    next = driven(handing_over)
    peek = driven(peeking)

    def _next(
        self, name: str, limit: int, drop: str, owner: str, claim: str, retention_ms: int
    ) -> QueueNext:
        return QueueNext(
            self.keyspace.claim_key(name),
            *self.queue_keys(name),
            tuple(self.keyspace.permit_keys(name, limit)),
            drop,
            owner,
            claim,
            retention_ms,
        )


#: What a quorum of nodes answering a hand-over that did not hand over may agree on.
_STATES = {HandPending: "pending", AllHeld: "held", Empty: "empty"}
