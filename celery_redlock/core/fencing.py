"""Fencing tokens: issued with a lease, strictly larger than every earlier grant's.

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
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from . import scripts
from .quorum import Quorum
from .values import ms

__all__ = ["Fencing", "candidate"]

logger = logging.getLogger("celery_redlock.redlock")


def candidate(granted: Sequence[int], replies: list[Any]) -> tuple[int, int]:
    """The largest fence value among the granting nodes, and how many nodes hold it."""
    values = [int(replies[i][1]) for i in granted]
    token = max(values)
    return token, values.count(token)


class Fencing:
    """Phase 2 of the fencing tokens: the write-back, eager or on the first read.

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

    def write_back(
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
        q = self.quorum
        remaining = expires - q.clock()
        if remaining <= 0:
            return None
        written = q.run(
            scripts.FENCE,
            (key, fence_key),
            (owner, str(token), ms(self.fence_retention), *(("s",) if strict else ())),
            [q.nodes[i] for i in granted],
            min(q.node_timeout, remaining),
        )
        landed = sum(1 for r in written if r == 1)
        if landed >= q.needed and q.clock() < expires:
            return token
        logger.info("fencing token for %r landed on %d nodes, %d needed", key, landed, q.needed)
        return None
