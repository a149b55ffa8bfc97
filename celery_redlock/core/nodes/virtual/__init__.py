"""The primitives' semantics once, for every kind that can only read and conditionally write.

etcd, the in-memory node (and ZooKeeper next) cannot run an operation where
their keys are. Each provides a :class:`~.store.Store` of a few verbs (read
with versions, commit on a compare of what was read, an expiry primitive, a
scan, a clock), and :class:`VirtualKind` does the rest once, as kombu's
virtual ``Channel`` does over a transport's ``_get``/``_put``: it runs the
operation's own Lua (:mod:`.scripting`) on the keys it reads
(:mod:`.keyspace`), commits its writes on a compare of those keys' versions
and runs again on a stale commit (:func:`.store.execute`), answers the plain
reads in Redis's shapes (:mod:`.reads`), and runs a round on several nodes at
once within one deadline.
"""

from __future__ import annotations

import queue
import time
from collections.abc import Callable, Sequence
from typing import Any

from .. import codec
from ..kind import Kind
from .reads import plain
from .scripting import run_script
from .store import Store, execute

__all__ = ["Call", "Store", "VirtualKind", "each"]

#: A node's part of a round: ``call(node, deadline)``, its reply.
Call = Callable[[Any, float], Any]


def _bytes(value: Any) -> bytes:
    return value if isinstance(value, bytes) else str(value).encode()


def each(
    nodes: Sequence[Any],
    call: Call,
    timeout: float,
    inline: bool = False,
    needed: int | None = None,
) -> list[Any]:
    """``call(node, deadline)`` on every node at once: its reply or exception each.
    One node (or every node, ``inline``) runs in this thread, several in the
    connector's threads; one that has not answered by the deadline is a timeout.
    Once ``needed`` nodes answered, a node that has not is "not answering" (its
    call goes on in its thread, its reply unread), once they had until
    :func:`~celery_redlock.core.nodes.cut_at`."""
    started = time.monotonic()
    deadline = started + timeout

    def one(node: Any) -> Any:
        try:
            return call(node, deadline)
        except Exception as exc:  # noqa: BLE001 - a node's failure is its reply
            return exc

    if inline or len(nodes) == 1:
        return [one(node) for node in nodes]
    from ...connect import connector
    from .. import next_reply

    done: queue.SimpleQueue = queue.SimpleQueue()
    for i, node in enumerate(nodes):
        connector().submit(lambda i=i, node=node: done.put((i, one(node))))
    replies: list[Any] = [None] * len(nodes)
    pending = set(range(len(nodes)))
    answered, until = 0, deadline + 0.5
    while pending:
        item, until = next_reply(
            done, started, until, needed is not None and answered >= needed, timeout
        )
        if item is None:
            break
        i, reply = item
        replies[i] = reply
        pending.discard(i)
        answered += not isinstance(reply, Exception)
    decided = needed is not None and answered >= needed
    for i in pending:
        replies[i] = TimeoutError(
            f"{nodes[i].name}: no reply by the time a quorum answered"
            if decided
            else f"{nodes[i].name}: no reply in {timeout:g}s"
        )
    return replies


class VirtualKind(Kind):
    """A kind whose nodes each have a ``store`` (:class:`~.store.Store`): the
    operations and plain reads over its verbs. A subclass provides ``make``
    and ``node_info``, and may wrap each node's call (:meth:`on_node`)."""

    def on_node(self, node: Any, call: Call, deadline: float) -> Any:
        """``call(node, deadline)``: a kind's hook around each node's call."""
        return call(node, deadline)

    def inline(self, nodes: Sequence[Any]) -> bool:
        """Whether a round runs its nodes one after another in this thread."""
        return False

    def round(
        self, nodes: Sequence[Any], call: Call, timeout: float, needed: int | None = None
    ) -> list[Any]:
        """``call`` on each node; a node still to connect gets its connect budget, then
        ``timeout`` (as a Redis or PostgreSQL node's new connection does)."""

        def guarded(node: Any, deadline: float) -> Any:
            return self.on_node(node, call, deadline)

        opening = [n.connect_timeout or timeout for n in nodes if n.connecting()]
        timeout += max(opening, default=0.0)
        return each(nodes, guarded, timeout, self.inline(nodes), needed)

    def run(
        self, call: codec.Call, nodes: Sequence[Any], timeout: float, needed: int | None = None
    ) -> list[Any]:
        """One round of ``call`` on ``nodes`` (decided once ``needed`` answered). A
        heartbeat's renewal of more keys than one commit may touch goes in parts
        (each key's renewal stands alone)."""
        script, keys, args = call
        k = [_bytes(key) for key in keys]
        a = [_bytes(arg) for arg in args]

        def body(ks: list[bytes], ar: list[bytes]) -> Callable[[Any], Any]:
            return lambda view: run_script(script, view, ks, ar)

        def one(node: Any, deadline: float) -> Any:
            store: Store = node.store
            part = store.max_keys
            if script.name != "extend" or part is None or len(k) <= part:
                return execute(store, k, body(k, a), deadline)
            out: list[Any] = []
            for i in range(0, len(k), part):
                ks, ar = k[i : i + part], a[2 * i : 2 * (i + part)]
                out += execute(store, ks, body(ks, ar), deadline)
            return out

        return self.round(nodes, one, timeout, needed)

    def command(
        self, nodes: Sequence[Any], cmd: tuple, timeout: float, needed: int | None = None
    ) -> list[Any]:
        """The plain read ``cmd`` on ``nodes``, with Redis's reply shapes."""

        def call(node: Any, deadline: float) -> Any:
            return plain(node.store, cmd, deadline)

        return self.round(nodes, call, timeout, needed)
