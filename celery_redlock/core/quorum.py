"""The nodes and the majority rule: one scatter-gather round, quorum and validity.

Quorum is ``N // 2 + 1`` **of all configured nodes**, never of the reachable
ones, so two partitions can never both hold a majority. A lease is valid for
``ttl - elapsed - (ttl * drift_factor + DRIFT_FLOOR)`` after the start of the
round that granted it: the drift allowance covers clocks that advance at
slightly different rates on the client and the nodes.

Every operation of the core reaches the nodes through :meth:`Quorum.run` (an
operation value of :mod:`.ops`) or :meth:`Quorum.gather` (a plain read): one
round, sent to every node at once, with one typed result (or the node's
error) per node, whatever the nodes' kind (:mod:`celery_redlock.core.nodes`).
A round of every node ends once a quorum answered: a node still connecting or
unanswered then is "not answering", as a node down is, so a dead minority
never holds a round.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import Any

from . import nodes as kinds
from .exceptions import ConfigurationError, QuorumUnavailable
from .ops import Op

__all__ = ["DRIFT_FLOOR", "Quorum"]

#: Fixed part of the drift allowance, in seconds (redis.io distlock).
DRIFT_FLOOR = 0.002

_OURS = object()


class Quorum:
    """N independent lock nodes, the quorum among them, and the client's clock.

    Args:
        specs: the nodes, as URLs (of any kind: :data:`.nodes.KINDS`) or
            ``redis.Redis`` clients.
        node_timeout: seconds each node gets to answer, per round; None:
            each node's kind's default (:func:`.nodes.default_timeouts`).
        connect_timeout: seconds a new connection gets to open, before
            ``node_timeout`` starts for its reply; None: each kind's default.
        drift_factor: clock drift allowed, as a fraction of the TTL.
        min_replicas: replicas of each node that must confirm a write.
        clock: monotonic clock, seconds.
        sleep: sleep function.
        rng: ``random()`` function for jitter.
    """

    __slots__ = (
        "nodes",
        "needed",
        "decides",
        "node_timeout",
        "connect_timeout",
        "drift_factor",
        "min_replicas",
        "kind",
        "clock",
        "sleep",
        "rng",
    )

    def __init__(
        self,
        specs: Sequence[Any],
        node_timeout: float | None,
        drift_factor: float,
        min_replicas: int,
        clock: Callable[[], float],
        sleep: Callable[[float], None],
        rng: Callable[[], float],
        connect_timeout: float | None = None,
    ):
        self.nodes = [
            kinds.node_for(spec, node_timeout, min_replicas, connect_timeout) for spec in specs
        ]
        seen: dict[tuple, Any] = {}
        for node in self.nodes:
            if node.identity in seen:
                raise ConfigurationError(
                    f"lock node {node.name} is listed twice (same as {seen[node.identity].name}); "
                    "Redlock nodes must be independent masters"
                )
            seen[node.identity] = node
        if len(self.nodes) > 1 and len(self.nodes) % 2 == 0:
            warnings.warn(
                f"{len(self.nodes)} Redlock nodes tolerate no more failures than "
                f"{len(self.nodes) - 1}; use an odd number",
                RuntimeWarning,
                stacklevel=3,  # the caller of Redlock(...)
            )
        self.needed = len(self.nodes) // 2 + 1
        #: The answers that end a round early: none where the quorum is every node.
        self.decides = self.needed if self.needed < len(self.nodes) else None
        #: The longest of the nodes' own timeouts (a mixed quorum's kinds may
        #: differ): what the pauses and the checks that stand for a round use.
        self.node_timeout = max(float(node.timeout) for node in self.nodes)
        self.connect_timeout = max(float(node.connect_timeout) for node in self.nodes)
        self.drift_factor = float(drift_factor)
        self.min_replicas = min_replicas
        #: The nodes' kind when they are all of one (:mod:`.nodes`), else None.
        one = len({n.kind for n in self.nodes}) == 1
        self.kind = kinds.kind_of(self.nodes[0]) if one else None
        self.clock = clock
        self.sleep = sleep
        self.rng = rng

    def run(
        self,
        op: Op,
        nodes: Sequence[Any] | None = None,
        timeout: float | None = None,
        kind: Any = _OURS,
    ) -> list[Any]:
        """Run the operation ``op`` on every node (or on ``nodes``: of the nodes'
        kind, or with ``kind=None`` any servers, a cluster's shard masters too) at
        once: one typed result (:mod:`.ops`) or error per node, each node within its
        timeout (no longer than ``timeout``, if given). A round of every node ends
        once a quorum answered (:attr:`needed`); one of some nodes waits for each."""
        if nodes is None and timeout is None and kind is _OURS:  # every lock call: no choices
            kind = self.kind
            limit = self.node_timeout if kind is not None else None
            return kinds.perform(op, self.nodes, limit, kind, self.decides)
        needed = self.decides if nodes is None else None
        nodes = self.nodes if nodes is None else nodes
        kind = self.kind if kind is _OURS else kind  # one kind: its own round, nothing between
        limit = self.node_timeout if timeout is None else min(timeout, self.node_timeout)
        return kinds.perform(op, nodes, limit if kind is not None else timeout, kind, needed)

    def send(self, op: Op) -> list[int]:
        """Write ``op`` to every node without waiting for the replies (deletions only);
        the indexes of the nodes it was not sent to (see :func:`.nodes.send`)."""
        script, keys, args = kinds.codec.encode(op)
        assert script is not None, "a plain read is never sent unwaited"
        return kinds.send(script, self.nodes, keys, args)

    def gather(
        self, command: tuple, nodes: Sequence[Any] | None = None, needed: int | None = None
    ) -> list[Any]:
        """Send one command to every node (or to ``nodes``) at once: one reply or error
        per node; with ``needed``, the round ends once that many answered."""
        nodes = self.nodes if nodes is None else nodes
        if self.kind is not None:
            return self.kind.command(nodes, command, self.node_timeout, needed)
        return kinds.command(nodes, command, None, needed)

    def has_quorum(self, answered: int) -> bool:
        """True when ``answered`` nodes (of all configured nodes) make a quorum."""
        return answered >= self.needed

    def errors(self, replies: Sequence[Any]) -> dict[str, BaseException]:
        """Node name -> error, for the nodes whose reply is an error."""
        return {node.name: r for node, r in zip(self.nodes, replies) if isinstance(r, Exception)}

    def check(self, replies: Sequence[Any]) -> None:
        """Raise :class:`QuorumUnavailable` unless a quorum of nodes answered.

        Args:
            replies: one reply per node, in the order of :attr:`nodes`; an
                exception instance is a node that did not answer.
        """
        errors = self.errors(replies)
        if not self.has_quorum(len(self.nodes) - len(errors)):
            raise QuorumUnavailable(errors, self.needed, len(self.nodes))

    def too_late(self, granted: Sequence[int], started: float) -> QuorumUnavailable:
        """The error of a round started at ``started`` whose grants, on the nodes of
        indexes ``granted`` (a quorum), came too late to stand (the round outlasted
        the lease's validity, or its token could not be written back in time): they
        are let go, nobody holds the name, and it is no contention but an outage."""
        took = self.clock() - started
        why = f"granted too late to stand (the round took {took:.2f}s)"
        late = {self.nodes[i].name: TimeoutError(f"{self.nodes[i].name}: {why}") for i in granted}
        return QuorumUnavailable(late, self.needed, len(self.nodes))

    def expires(self, start: float, ttl: float) -> float:
        """When a lease granted by a round started at ``start`` stops being valid."""
        return start + ttl - (ttl * self.drift_factor + DRIFT_FLOOR)
