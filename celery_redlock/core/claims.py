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
from collections.abc import Sequence
from typing import Any

from . import scripts
from .keyspace import KeySpace
from .lease import Leases
from .nodes import NotReplicated
from .quorum import Quorum
from .records import STARTED_MARK, Claim, Schedule, agree
from .scripts import Script
from .values import ms, positive, text

__all__ = ["Claims"]


class Claims:
    """The claim operations of a client (see the :class:`Redlock` methods of the same names)."""

    __slots__ = ("quorum", "keyspace", "leases")

    def __init__(self, quorum: Quorum, keyspace: KeySpace, leases: Leases):
        self.quorum = quorum
        self.keyspace = keyspace
        self.leases = leases  # a short claim is withdrawn with the lease's release

    def claim(self, key: str, value: str, *, ttl: float) -> bool:
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
        replies = q.run(scripts.CLAIM, (full_key,), (value, ms(ttl)))
        if q.has_quorum(sum(1 for r in replies if r == 1)):
            return True
        # logged only where it was set: a node that never answered is an outage
        self.leases.release_everywhere(full_key, value, granted=_where(replies, 1))
        q.check(replies)
        return False

    def claim_next(self, name: str, claimant: str, *, ttl: float, replace: bool = False) -> Claim:
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
        args = (claimant, ms(ttl), "1" if replace else "")
        if replace:
            replies = q.run(scripts.CLAIM_NEXT, (key,), args)
        else:  # a free name's claim is a bare SET NX: a new claim, none taken over
            replies = q.set_first(scripts.CLAIM_NEXT, (key,), args, [1, None, 0])
        ours = [r for r in replies if isinstance(r, list) and r[0] == 1]
        if q.has_quorum(len(ours)):
            # Only a previous claimant a quorum agrees on was taken over: a node
            # where its execution took the lock first answers without it.
            previous = agree([(text(r[1]), 0) for r in ours if r[1]], q.needed).owner
            renewed = sum(1 for r in ours if r[2] == 1) >= q.needed
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
        wrote = [node for node, r in written if isinstance(r, list) and r[0] == 1 and r[2] != 1]
        if wrote:
            q.run(scripts.RELEASE, (key,), (claimant,), wrote)
        q.check(replies)
        seen = [(text(r[1]), int(r[2])) for r in replies if isinstance(r, list) and r[0] == 0]
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
        confirmed = self.claimant(name)
        if confirmed.claimant != other.owner:
            return Claim(None, None)  # split after all: the caller tries again
        return confirmed

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
        positive("delay", delay)
        cap = "" if max_delay is None else str(ms(max_delay))
        return self._schedule(
            scripts.DEBOUNCE, name, "burst", claimant, (str(ms(delay)), cap, str(ms(ttl)))
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
        positive("period", period)
        return self._schedule(
            scripts.THROTTLE,
            name,
            "throttle",
            claimant,
            (str(ms(period)), "1" if trailing else "", str(ms(ttl))),
        )

    def _schedule(
        self, script: Script, name: str, kind: str, claimant: str, args: tuple[str, ...]
    ) -> Schedule:
        q = self.quorum
        now_ms = time.time_ns() // 1_000_000
        claim_key = self.keyspace.claim_key(name)
        replies = q.run(
            script,
            (claim_key, self.keyspace.coalesce_key(name, kind)),
            (claimant, str(now_ms), *args),
        )
        answers = [r for r in replies if isinstance(r, list)]
        if not q.has_quorum(len(answers)):
            self.leases.release_everywhere(claim_key, claimant, granted=_where(replies, list))
            q.check(replies)
        kinds = Counter(int(r[0]) for r in answers)
        code, votes = kinds.most_common(1)[0]
        if votes < q.needed:
            code = 2  # the nodes disagree: run now; the start itself is throttled
        agreed = [r for r in answers if int(r[0]) == code]
        slot = Counter(text(r[2]) for r in agreed).most_common(1)[0][0] if agreed else None
        due = max(int(r[2]) for r in agreed) / 1000.0 if agreed else now_ms / 1000.0
        other = agree([(text(r[1]), 0) for r in agreed if r[1]], q.needed)
        return Schedule({1: "later", 2: "now", 0: "dropped"}[code], due, other.owner, slot)

    def withdraw_claim(self, name: str, claimant: str) -> int:
        """Withdraw ``name``'s claim where it names ``claimant``. Never raises.

        Returns how many nodes withdrew it.
        """
        replies = self.quorum.run(scripts.RELEASE, (self.keyspace.claim_key(name),), (claimant,))
        return sum(1 for r in replies if r == 1)

    def claimant(self, name: str) -> Claim:
        """The claim of ``name`` a quorum agrees on (``claimant=None`` if none).

        Raises:
            QuorumUnavailable: fewer than a quorum of nodes answered.
        """
        q = self.quorum
        replies = q.run(scripts.PEEK, (self.keyspace.claim_key(name),), ())
        q.check(replies)
        found = [(text(r[0]), int(r[1])) for r in replies if isinstance(r, list) and r[0]]
        seen = agree(found, q.needed)
        if seen.owner is not None and seen.owner.startswith(STARTED_MARK):
            return Claim(None, None)  # its run started: no claim is pending
        return Claim(seen.owner, seen.remaining)


def _where(replies: Sequence[Any], granted: Any) -> list[int]:
    """The indexes of the nodes whose reply is ``granted`` (a value, or a type)."""
    if isinstance(granted, type):
        return [i for i, r in enumerate(replies) if isinstance(r, granted)]
    return [i for i, r in enumerate(replies) if r == granted]
