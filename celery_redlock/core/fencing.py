"""Fencing tokens: issued with a lease, strictly larger than every earlier grant's.

Each node keeps a fence value per name. The acquire call, where it sets my
key, moves that value on and returns it: to max(its successor, the node's
clock, the client's clock plus one second), in microseconds (``ADVANCE``; a
node without a value, say a new name, takes the clocks). The token is the
**largest value among the granting nodes**, and it is issued only once a
quorum records it (or more):

* When a quorum of the granting nodes returned that very value, phase 1 has
  already recorded it on a quorum, and the lease is granted after one round.
  This is the usual case: nodes that saw the same grants hold the same value,
  and the client's clock plus a second, one value sent to all of them and
  above their clocks, is the floor they share.
* Otherwise (a node was down for some grants, or restarted, or its clock ran
  more than a second ahead of the client's) phase 2 writes the token back on the granting nodes,
  only where the node still holds my owner value, and only if it is larger.
  The lease is granted only if that landed on a quorum within validity.

Any later grant needs a majority, which meets the quorum that recorded the
token, so the later phase 1 moves a value at least as large as the token to
its successor (or above), and the later token is strictly larger. The largest value
alone is not enough. With three nodes A, B, C, counters incremented inside the
acquire, token = the largest increment and no write-back::

    t0  client 1 wins A, B       A=1 B=1 C=0    token 1
    t1  lease 1 lapses; client 2 wins B, C      B=2 C=1    token 2
    t2  lease 2 lapses; client 3 wins A, C      A=2 C=2    token 2   <- not larger

Here token 2 sat on B alone at t1, so phase 2 writes it on C, and client 3
reads it and takes 3.

A node that restarts without its data loses its fence values, a fence key
that was not granted for ``fence_retention`` (7 days by default) expires, a
lock database is restored from last week, the node list changes and changes
back while the first nodes keep old values. The clock floor covers all of
them: every grant takes at least the clocks, and values move on by one per
grant, far slower than a microsecond clock, so a token stays about the clocks
of its grant, below the clocks of any later grant anywhere. This relies on
the clocks (the node's, the client's) not being set back by more than the
time since the last grant elsewhere; see docs/fencing.rst.

Lazy fencing
------------

``try_acquire(..., fence=False)`` grants the lease with no fence at all: its
phase 1 sets the key and leaves the fence values alone (the acquire of a
lease whose token nobody reads does the least work). The first read of
:attr:`Lease.fencing_token` issues the token in one round (``ISSUE``): on each
granting node that still holds my owner value, the fence value is moved on (or
floored) exactly as a grant moves it, and returned. The token is the largest
of those values; it is issued when a quorum returned it, else written back
(phase 2, as above) where my key still is. Short of a quorum, or past the
validity, the lease is marked lost and the read raises :class:`LockLost`.
This is as monotonic as the eager path:

* Every fence value is written inside the life of the writer's own key on
  that node: ACQUIRE only where it sets its key, ISSUE and FENCE only where
  the node still holds the writer's owner value (owner values are unique per
  attempt: :func:`make_owner`). On one node, the lives of two owners' keys
  never overlap.
* Take two grants that both issued a token. The quorums that recorded them
  share a node, and on it the later key's write came after the earlier key
  was gone, so it moved on a value at least as large as the earlier token:
  the later token is strictly larger. A later grant needs a majority where my
  key is already gone, so once one exists my lazy read can no longer reach a
  quorum: the read raises.
* A lazy lease whose token is never read moves no fence value: the next
  grant's token is still larger than every token issued before it.

A failed attempt (no quorum, or no validity left) leaves the fence values its
phase 1 (or its ISSUE round) moved on: tokens skip a number, and never go back.

Lua never does number arithmetic on tokens (Lua 5.1 numbers are doubles);
tokens travel as decimal strings, compared and incremented digit-wise.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

from .ops import Done, Fence, Issue, Issued
from .quorum import Quorum
from .steps import On, Steps, driven
from .values import ms

__all__ = ["Fencing", "candidate"]

logger = logging.getLogger("celery_redlock.redlock")


def candidate(fences: Sequence[Any]) -> tuple[int, int]:
    """The largest of the granting nodes' fence values, and how many nodes hold it."""
    if fences and fences.count(fences[0]) == len(fences):  # the rule: all alike
        return int(fences[0]), len(fences)
    values = [int(fence) for fence in fences]
    token = max(values)
    return token, values.count(token)


class Fencing:
    """Phase 2 of the fencing tokens (the write-back), and a lazy lease's token.

    Args:
        quorum: the nodes.
        enabled: hand out fencing tokens at all.
        retention: seconds a fence value is kept after its last grant.
    """

    __slots__ = ("quorum", "fencing", "fence_retention", "arg")

    def __init__(self, quorum: Quorum, enabled: bool, retention: float):
        self.quorum = quorum
        self.fencing = bool(enabled)
        self.fence_retention = float(retention)
        #: The acquire's fence argument: the retention in ms, or empty with fencing off.
        self.arg = str(ms(self.fence_retention)) if self.fencing else ""

    def settled(self, fences: Sequence[Any]) -> tuple[int | None, bool]:
        """The token of a grant whose granting nodes sent the fence values ``fences``,
        and whether it stands as it is: None with fencing off; else the largest,
        which stands where a quorum already holds it (else phase 2 writes it back)."""
        if not self.fencing:
            return None, True
        token, agreed = candidate(fences)
        return token, agreed >= self.quorum.needed

    def issuing(
        self, granted: Sequence[int], key: str, fence_key: str, owner: str, expires: float
    ) -> Steps[int | None]:
        """A lazy lease's token, on its first read: moved on where the granting nodes
        still hold ``owner``, written back if they disagree; None short of a quorum.
        As steps (:mod:`.steps`); :meth:`issue` drives them."""
        op = Issue(key, fence_key, owner, self.arg, time.time_ns() // 1000)
        replies = yield from self._on(granted, op, expires)
        held = [(i, int(r.fence)) for i, r in zip(granted, replies) if _issued(r)]
        q = self.quorum
        if len(held) < q.needed:
            logger.info("fencing token for %r: %d nodes still hold it, %d needed",
                        key, len(held), q.needed)  # fmt: skip
            return None
        token = max(value for _, value in held)
        if sum(1 for _, value in held if value == token) >= q.needed:
            return token if q.clock() < expires else None
        return (
            yield from self.writing_back(
                [i for i, _ in held], token, key, fence_key, owner, expires
            )
        )

    def writing_back(
        self,
        granted: Sequence[int],
        token: int,
        key: str,
        fence_key: str,
        owner: str,
        expires: float,
        strict: bool = False,
    ) -> Steps[int | None]:
        """Write ``token`` where the granting nodes still hold ``owner``; None short of a quorum.

        ``strict`` (permits): only where the node's value is smaller, never equal.
        As steps; :meth:`write_back` drives them.
        """
        op = Fence(key, fence_key, owner, str(token), self.arg, strict)
        written = yield from self._on(granted, op, expires)
        q = self.quorum
        landed = sum(1 for r in written if r == Done(True))
        if landed >= q.needed and q.clock() < expires:
            return token
        logger.info("fencing token for %r landed on %d nodes, %d needed", key, landed, q.needed)
        return None

    issue = driven(issuing)
    write_back = driven(writing_back)

    def _on(self, granted: Sequence[int], op: Issue | Fence, expires: float) -> Steps[list[Any]]:
        """``op`` on the granting nodes within the validity left (no reply past it)."""
        q = self.quorum
        remaining = expires - q.clock()
        if remaining <= 0:
            return []
        nodes = [q.nodes[i] for i in granted]
        return (yield On(op, nodes, min(q.node_timeout, remaining)))


def _issued(result: Any) -> bool:
    return isinstance(result, Issued) and result.fence is not None
