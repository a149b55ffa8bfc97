"""Writes that replicas must confirm: with ``min_replicas``, a write a lease or a
claim rests on counts on a node only once that many of its replicas have it.

:func:`~celery_redlock.core.nodes.redis.rounds.run_script` pipelines the ``WAIT`` of
:func:`wait_after` behind such a script, in the same packet, and reads the
pair of replies through :func:`confirmed`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .. import NotReplicated
from ..scripts import Script
from .cluster import LockNode

__all__ = ["CONFIRMED", "confirmed", "wait_after"]

#: The scripts whose writes a lease or a claim rests on: a grant, a renewal, a
#: fence write, a beat slot or enqueue claim, a debounce or throttle schedule.
#: On nodes with ``min_replicas``, each is followed by ``WAIT``. Deletions are
#: not: one a failover loses only leaves a key to its TTL.
CONFIRMED = frozenset(
    {
        "acquire",
        "acquire_rated",
        "acquire_permit_rated",
        "extend",
        "fence",
        "claim",
        "claim_next",
        "debounce",
        "throttle",
        "rate",
    }
)


def wait_after(script: Script, nodes: Sequence[LockNode], timeout: float) -> tuple | None:
    """The ``WAIT`` to pipeline behind ``script`` on ``nodes``, or None.

    Written in the same packet as the script, so the round costs no extra
    trip. ``ms`` is half the round's timeout, so that a server answers a
    shortfall while the round still waits (a server notices a WAIT timed out
    at its next tick, every ``1000 / hz`` ms), and the error says so."""
    if nodes and nodes[0].min_replicas and script.name in CONFIRMED:
        return ("WAIT", nodes[0].min_replicas, max(1, int(timeout * 500)))
    return None


def confirmed(node: LockNode, reply: Any) -> Any:
    """A script's reply, if ``WAIT`` (pipelined after it) counted enough replicas."""
    if not isinstance(reply, tuple):
        return reply  # an error: the node did not answer, or the script failed
    reply, acked = reply
    if isinstance(acked, int) and acked >= node.min_replicas:
        return reply
    if isinstance(acked, Exception):
        return NotReplicated(f"{node.name}: WAIT failed: {acked}", reply)
    return NotReplicated(
        f"{node.name}: {acked} of {node.min_replicas} replicas confirmed the write in time",
        reply,
        acked,
    )
