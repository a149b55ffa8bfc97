"""Rate limits on the quorum: at most N starts per key in any window of a period.

This module is core: it imports neither celery nor kombu. Its Lua is
:mod:`.nodes.scripts.rates`.

A rate is one or several **windows** ``(count, period)``; a start is admitted
only when every window of every key it names admits it. Each key's state is one
hash per key, ``{prefix}:rate:{name}`` (in the name's hash slot, next to its
lock key), on every node: per window its *theoretical arrival time* (TAT, ms,
the clients' clock) and a version counter ``v``.

With several windows, the one of the shortest interval **paces** the starts
and each other window **counts** them (:func:`.windows.paced`): ``("10/s",
"500/h")`` goes at 10/s until 500 are booked within an hour. The paced window
is GCRA (the generic cell rate algorithm), with the interval ``T = period /
count`` and the burst tolerance ``tau = (burst - 1) * T``. A counted window
keeps the key's bookings in a log beside the hash, ``{prefix}:booked:{name}``
(a sorted set: member the booking's id, the hash's version ``v`` it made;
score its instant), and admits ``s`` only when its ``count``-th latest
booking is at or before ``s - period``: then every window of the period that
holds ``s`` holds at most ``count`` bookings of that node (the bookings after
that one are fewer than ``count``), wherever ``s`` falls among them.
A reservation does not ask "may I start now": it asks for the first instant
every window admits, and books it.

Phase 1, one script call on every node at once: ``s = max(now, max over the
windows of TAT - tau)``; each ``TAT := max(TAT, s) + T``; ``v += 1``; the hash
lives until its latest TAT plus its longest period. The node answers ``(s, v)``.
The client takes the answers (a quorum at least) and ``s*``, the earliest
instant that a quorum of the answers are at or before (the q-th smallest
``s``; with every node agreeing, their common answer). Nodes that answered
``s*`` booked it already. Nodes that answered later than ``s*`` are ahead of
the others (they hold bookings the others do not) and are not needed: their
own booking is taken back (the undo below) unless another came after it, and
then stays, wasting capacity on that node alone, never dragging the quorum's
schedule on. Nodes that answered earlier get a phase-2
compare-and-set: if their version is still the one they answered
(no other reservation came in between), ``TAT := max(TAT - T, s*) + T``
(their booking moved from their ``s`` to ``s*``) and ``v += 1``; otherwise,
if GCRA admits ``s*`` there (``s* >= TAT - tau``), ``s*`` is booked anew
beside their own booking, which stays (wasted). A counted window must admit
``s*`` there in both cases; its log moves the booking (by id). The
reservation stands when ``s*`` is booked on a quorum: then each node that
answered but did not book it takes its own booking back where nothing was
booked after it (the TATs), and its log moves the booking to ``s*``, so every
node that answered counts the reservation where it stands. Otherwise it
failed: its bookings are taken back on every node that answered (the TATs
where nothing was booked after them, the logs always), and the client tries
again after a short jittered pause, a few times, then reports it unreserved.

Why it holds. Each node's bookings, in the order it made them, are a sequence
the paced window's GCRA accepted: phase 1 books an instant GCRA admits, a compare-and-set that
lands replaces the node's last booking with a later instant, which GCRA admits
too, and a booking anew is made only where GCRA admits it. Two reservations
that stand were each booked on a quorum, so both were
booked on some common node, one after the other, and GCRA spaced them there:
the later-booked instant is at least the earlier one plus ``T - tau``. With
``burst = 1`` (``tau = 0``) any two reserved instants are at least ``T`` apart,
so **any window of the period (half-open, of length period) holds at most
``count`` reserved instants**, whichever nodes answered, however the calls
interleaved. With ``burst = B`` one node's sequence holds at most
``count + B - 1`` instants in any window; reservations that raced on
different quorums can each be counted on different nodes, so across the
quorum the bound is ``floor(n / q * (count + B - 1))`` for n nodes and quorum
q (one node alone: ``count + B - 1``). A counted window is the same:
``count`` on each node, ``floor(n / q * count)`` across them in the worst case;
a reservation that stood is in the log of every node that answered, so only
reservations in flight together can each be missed on the other's nodes.
Distinct reservations of a key get
distinct instants (each pushes the TAT on by ``T``): concurrent callers are
handed a schedule, not one next instant to fight over.

Faults. A minority of nodes that do not answer changes nothing (a quorum
answers). Fewer than a quorum: :class:`QuorumUnavailable`, nothing is granted,
and the bookings phase 1 made on the minority that answered are taken back
(an undo that lands only where nothing was booked after them); after such a
round the client books again only once a quorum answers a read (a PING
round), so attempts made all through an outage do not push the schedule
back.
A node that restarts empty (or whose hash expired early through a jump of its
clock) answers ``s = now``; as ``s*`` is the q-th smallest answer, this
matters only when, with it, a quorum of the answering nodes missed the
latest reservations (a node that was down or cut off when they were made):
then the key starts a second GCRA sequence beside the one it
forgot, so a window holds at most twice the bound (``2 * (count + B - 1)``),
and only while the forgotten bookings last (up to the end of the schedule
booked before). A client whose clock is behind by d books instants that are d
late in true time: a window of true time then holds at most the bound plus
``ceil(d / T)``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, cast

from .exceptions import ConfigurationError, QuorumUnavailable
from .keyspace import KeySpace
from .nodes import NotReplicated, check_together
from .ops import (
    Acquire,
    AcquirePermit,
    Booked,
    Done,
    Granted,
    GrantedRated,
    Later,
    Ping,
    Rate,
    Rated,
    Sooner,
    Unstart,
)
from .quorum import Quorum
from .records import NEAR, RateSlot
from .windows import RateKey, checked_burst, checked_rate

__all__ = ["RatedRound", "Rates", "reserve_place", "reserve_rates"]

logger = logging.getLogger("celery_redlock.redlock")

#: Rounds a reservation spends while concurrent callers split the nodes between them.
ROUNDS = 5
#: The most starts a key's sorted set of recorded starts keeps.
MAX_STARTS = 10_000
#: Longest pause, in seconds, before a reservation asks again after a split.
SPLIT_PAUSE = 0.005


class RatedRound:
    """An acquire round that also books a rated start (or records one booked before).

    The lease, plain or permits, sends its acquire through :meth:`run`
    (:func:`.nodes.scripts.rates.rated`: a grant books the start in the same call, a
    contended start books nothing; a node where the booked instant is not due
    lets the key go at once and answers {7}; each grant's booking is popped off
    its reply), and then, the keys found free on a quorum, asks :meth:`settle`
    for the slot: due now, the lease stands; later, it frees what it still
    holds and the start it recorded (:meth:`unstart`) and returns the slot,
    whose booking stands. So a start booked for later stands in no due start's
    way. A round that finds the keys free on no quorum takes its bookings back
    (:meth:`abandon`). So a rated start that is due costs the acquire's one
    round (a second only when concurrent bookings left the nodes disagreeing).
    """

    __slots__ = ("rates", "keys", "booked", "now", "answers", "unconfirmed")

    def __init__(self, rates: Rates, keys: Sequence[RateKey], booked: bool):
        for key in keys:
            if not key.starts:
                raise ConfigurationError(f"rate key {key.key!r} names no key for its starts")
        self.rates = rates
        self.keys = tuple(keys)
        #: The start was booked before (a delivery at its instant): record it only.
        self.booked = booked
        self.now = 0
        self.answers: list[tuple[int, Booked]] = []
        self.unconfirmed: list[tuple[int, Booked]] = []

    def run(self, acquire: Acquire | AcquirePermit, held: Sequence[str]) -> list[Any]:
        """The rated ``acquire`` (``held``: those of its keys a grant sets to its owner),
        on every node: the acquire's results, :class:`.ops.Later` where the grant was
        booked for later and let go, each grant's booking kept in :attr:`answers`."""
        self.now = now = _epoch_ms()
        rated = self.keys
        longest = max(w.period for k in rated for w in k.windows)
        most = max(w.starts for k in rated for w in k.windows) + max(k.burst for k in rated)
        op = Rated(
            acquire,
            rated,
            self.booked,
            now,
            now + _ms(NEAR),
            _ms(longest),
            min(MAX_STARTS, 2 * most),
            tuple(held),
        )
        replies = self.rates.quorum.run(op)
        for i, reply in enumerate(replies):
            into = self.answers
            if isinstance(reply, NotReplicated):
                reply, into = reply.reply, self.unconfirmed
            if isinstance(reply, (GrantedRated, Later)) and reply.booking:
                into.append((i, reply.booking))
        return replies

    def free(self, replies: Sequence[Any]) -> int:
        """How many nodes found the keys free: granted, or booked for later."""
        return sum(1 for r in replies if isinstance(r, (Granted, Later)))

    def settle(self) -> RateSlot:
        """The start's slot once the keys were found free on a quorum."""
        if self.booked:
            return RateSlot(self.now / 1000.0, 0.0)
        return self.rates.settle(self.keys, self.now, self.answers)

    def unstart(
        self, lock_keys: Sequence[str], owner: str, replies: Sequence[Any] | None = None
    ) -> None:
        """Free the lock keys ``owner`` holds among ``lock_keys`` and take back the start
        it recorded, on every node (a start booked for later, or an attempt that did
        not stand). With the round's ``replies``, only where a node granted: a start
        booked for later that every node let go of costs no round more. Never raises."""
        if replies is not None and not any(isinstance(_result(r), Granted) for r in replies):
            return
        op = Unstart(tuple(lock_keys), tuple(k.starts for k in self.keys), owner)
        try:
            self.rates.quorum.run(op)
        except Exception as exc:  # pragma: no cover - defensive, as a release
            logger.warning("release of %r failed: %s", lock_keys[0], exc)

    def let_go(self, lock_keys: Sequence[str], owner: str, replies: Sequence[Any]) -> None:
        """An attempt that did not stand: free its lock keys and the start it recorded
        (:meth:`unstart`), and take its bookings back (:meth:`abandon`)."""
        self.unstart(lock_keys, owner)
        self.abandon(replies)

    def abandon(self, replies: Sequence[Any]) -> None:
        """The acquire did not stand: take its bookings back. A round that fewer than a
        quorum answered also makes the client book nothing more until a quorum
        answers a read."""
        taken = self.answers + self.unconfirmed
        q = self.rates.quorum
        if not q.has_quorum(len(q.nodes) - len(q.errors(replies))):
            self.rates.fell_short(self.keys, self.now, taken)
        elif taken:
            self.rates._undo(self.keys, self.now, taken)
        self.answers, self.unconfirmed = [], []


# -- reserving ----------------------------------------------------------------


def _booking_keys(keys: Sequence[RateKey]) -> list[str]:
    """The keys a reservation books: the rate hashes, then their logs."""
    return [*(k.key for k in keys), *(k.log for k in keys)]


def _epoch_ms() -> int:
    return time.time_ns() // 1_000_000


class Rates:
    """The rate reservations of a client (see :meth:`Redlock.rate`)."""

    __slots__ = ("quorum", "keyspace", "unsure")

    #: Rounds a reservation spends while concurrent callers split the nodes between them.
    ROUNDS = ROUNDS
    #: Longest pause, in seconds, before a reservation asks again after a split.
    SPLIT_PAUSE = SPLIT_PAUSE

    def __init__(self, quorum: Quorum, keyspace: KeySpace):
        self.quorum = quorum
        self.keyspace = keyspace
        #: The last round fell short of a quorum: ask the nodes before booking again.
        self.unsure = False

    def rate_key(self, name: str, rate: Any, burst: int = 1) -> RateKey:
        """``name``'s rate hash with its checked windows and burst, and its starts' key."""
        space = self.keyspace
        return RateKey(
            space.coalesce_key(name, "rate"),
            checked_rate(rate),
            checked_burst(burst),
            space.coalesce_key(name, "starts"),
        )

    def rate(
        self,
        name: str,
        rate: Any,
        *,
        burst: int = 1,
        also: Mapping[str, Any] | Iterable[tuple[str, Any]] | None = None,
        now: float | None = None,
    ) -> RateSlot:
        """Book a start of ``name`` under ``rate`` on a quorum: a :class:`RateSlot`,
        due now (``slot.now``) or at ``slot.start_at``.

        ``rate``: ``"10/s"``, ``"100/m"``, ``"1000/h"``, ``"20/10s"``, a
        ``(count, seconds)`` pair, or several (every window holds). ``burst``:
        starts that may go back to back before the spacing applies. ``also``:
        other names and their rates (burst 1), booked in the same round, all
        or nothing. ``now``: the caller's clock, epoch seconds (default: ``time.time()``).

        Raises:
            QuorumUnavailable: fewer than a quorum of nodes answered.
        """
        keys = [self.rate_key(name, rate, burst)]
        pairs = also.items() if isinstance(also, Mapping) else (also or ())
        keys += [self.rate_key(other, other_rate) for other, other_rate in pairs]
        return self.reserve(keys, now_ms=None if now is None else int(now * 1000))

    def booking(self, name: str, keys: Sequence[RateKey], booked: bool) -> RatedRound | RateSlot:
        """The round that books a rated start of ``name``; or, when the last rated
        round fell short of a quorum, the start booked on its own first (after a
        read of the nodes): its slot when it is for later."""
        check_together(self.quorum.nodes, [name, *(k.key for k in keys)], "rates")
        if self.unsure and not booked:
            slot = self.reserve(keys)
            if not slot.due:
                return slot
            if slot.wait > 0:
                self.quorum.sleep(slot.wait)
            booked = True
        return RatedRound(self, keys, booked)

    def reserve(
        self, keys: Sequence[RateKey], *, now_ms: int | None = None, rounds: int | None = None
    ) -> RateSlot:
        """Book the first instant every window of every key admits, on a quorum.

        ``now_ms`` is the client's clock (epoch ms; default: ``time.time()``).

        Raises:
            QuorumUnavailable: fewer than a quorum of nodes answered.
        """
        return cast(RateSlot, self._book(keys, now_ms, rounds, None))  # None only with after

    def reserve_after(self, keys: Sequence[RateKey], after: float) -> RateSlot | None:
        """Book a place in a full schedule: as :meth:`reserve`, but only an instant more
        than ``after`` seconds from now; None, and nothing booked, when a quorum
        admits one sooner (the schedule is not full).

        Raises:
            QuorumUnavailable: fewer than a quorum of nodes answered.
        """
        return self._book(keys, None, None, after)

    def _book(
        self,
        keys: Sequence[RateKey],
        now_ms: int | None,
        rounds: int | None,
        after: float | None,
    ) -> RateSlot | None:
        if not keys:
            raise ConfigurationError("a reservation needs at least one rated key")
        q = self.quorum
        names = _booking_keys(keys)
        check_together(q.nodes, names)
        if self.unsure:
            # Every round during an outage would book on the minority that answers,
            # and an undo can lose to a concurrent booking: until a quorum answers a
            # read, book nothing (one round more, only after a round fell short).
            q.check(q.run(Ping()))
            self.unsure = False
        best = 0
        for attempt in range(rounds or self.ROUNDS):
            now = _epoch_ms() if now_ms is None else int(now_ms)
            floor = "" if after is None else str(now + _ms(after))
            replies = q.run(Rate(tuple(keys), "1", now, floor))
            answers = [(i, r) for i, r in enumerate(replies) if isinstance(r, Booked)]
            sooner = sum(1 for r in replies if isinstance(_result(r), Sooner))
            if sooner and not q.has_quorum(len(answers)) and q.has_quorum(len(answers) + sooner):
                self._undo(keys, now, answers + _unconfirmed(replies))
                return None
            if not q.has_quorum(len(answers)):
                self.fell_short(keys, now, answers + _unconfirmed(replies))
                errors = {
                    q.nodes[i].name: r if isinstance(r, BaseException) else f"answered {r!r}"
                    for i, r in enumerate(replies)
                    if not isinstance(r, Booked)
                }
                raise QuorumUnavailable(errors, q.needed, len(q.nodes))
            slot = self.settle(keys, now, answers)
            if slot.reserved:
                return slot
            best = int(slot.start_at * 1000)
            if attempt + 1 < (rounds or self.ROUNDS):
                q.sleep(q.rng() * self.SPLIT_PAUSE)
        now = _epoch_ms() if now_ms is None else int(now_ms)
        return RateSlot(best / 1000.0, max(0, best - now) / 1000.0, reserved=False)

    def settle(
        self, keys: Sequence[RateKey], now: int, answers: Sequence[tuple[int, Booked]]
    ) -> RateSlot:
        """The instant phase 1's answers (a quorum of them) agree on, booked on a quorum.

        s*: the earliest instant a quorum of answers is at or before. Nodes that
        answered later (ahead of the others: bookings they alone hold) are not
        needed and keep their own booking; the others move to s* (phase 2, one
        call per such node). Not ``reserved`` when s* did not land on a quorum.
        """
        q = self.quorum
        best = sorted(r.at_ms for _, r in answers)[q.needed - 1]
        booked: list[tuple[int, Booked]] = []
        missed: list[tuple[int, Booked]] = []
        for i, r in answers:
            if r.at_ms < best:  # move this node's booking to s*: phase 2
                op = Rate(tuple(keys), "2", now, str(best), r.versions)
                moved = q.run(op, nodes=[q.nodes[i]])[0] == Done(True)
                (booked if moved else missed).append((i, r))
            else:
                (booked if r.at_ms == best else missed).append((i, r))
        wait = max(0, best - now) / 1000.0
        if q.has_quorum(len(booked)):
            # The nodes that did not book s* (ahead of it: bookings they alone hold)
            # take their own back where nothing was booked after it, so concurrent
            # callers leave no stray bookings to drift on; their logs count it at s*.
            self._undo(keys, now, missed, at=best)
            return RateSlot(best / 1000.0, wait)
        # the attempt did not stand: its bookings go where they can (from the logs
        # always), so a counted window does not count a start twice
        self._undo(keys, now, booked + missed)
        return RateSlot(best / 1000.0, wait, reserved=False)

    def fell_short(
        self, keys: Sequence[RateKey], now: int, answers: Sequence[tuple[int, Booked]]
    ) -> None:
        """A round whose bookings did not stand: take them back (a minority's, or
        ones the replicas did not confirm), and book nothing more until a quorum
        answers a read."""
        self.unsure = True
        self._undo(keys, now, answers)

    def _undo(
        self,
        keys: Sequence[RateKey],
        now: int,
        answers: Sequence[tuple[int, Booked]],
        at: int | None = None,
    ) -> None:
        """Take phase 1's bookings back where nothing was booked after them; in the
        logs, out, or (``at``: the reservation stood there) moved to ``at``."""
        q = self.quorum
        for i, r in answers:
            before = " ".join(["-" if at is None else str(at), *r.tats])
            q.run(Rate(tuple(keys), "0", now, before, r.versions), [q.nodes[i]])


def reserve_rates(redlock: Any, keys: Sequence[RateKey], *, now_ms: int | None = None) -> RateSlot:
    """:meth:`Rates.reserve` on ``redlock``'s nodes: several keys, each with its own burst."""
    return redlock._rates.reserve(keys, now_ms=now_ms)


def reserve_place(redlock: Any, keys: Sequence[RateKey], after: float = NEAR) -> RateSlot | None:
    """:meth:`Rates.reserve_after` on ``redlock``'s nodes: a place in a full schedule."""
    return redlock._rates.reserve_after(keys, after)


def _unconfirmed(replies: Sequence[Any]) -> list[tuple[int, Booked]]:
    """(index, booking) of the nodes that booked but whose replicas did not confirm it."""
    return [
        (i, r.reply)
        for i, r in enumerate(replies)
        if isinstance(r, NotReplicated) and isinstance(r.reply, Booked)
    ]


def _result(reply: Any) -> Any:
    """A node's result, its replicas confirmed or not."""
    return reply.reply if isinstance(reply, NotReplicated) else reply


def _ms(seconds: float) -> int:
    return int(round(seconds * 1000))
