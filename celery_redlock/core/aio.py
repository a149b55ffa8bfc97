"""AsyncRedlock: the Redlock API as coroutines, on the same core.

The lease's logic is the sync client's own (:class:`.lease.Leases`, written
as steps: :mod:`.steps`); this client drives those steps with asyncio rounds
(:func:`.nodes.aio.perform_async`) and ``asyncio.sleep``. The keys, owner
values, operations and fencing tokens are the same, so a sync
:class:`~.redlock.Redlock` and an :class:`AsyncRedlock` on the same nodes
exclude each other and share one token sequence.

A plain lock (``try_acquire``, ``acquire``, ``release``, ``extend``,
``extend_many``, ``lock``) and the claims (``claim``, ``claim_next``,
``debounce``, ``throttle``, ``withdraw_claim``, ``claimant``) and the lock
reads (``holder``, ``inspect``, ``inspect_key``, ``read_claim``,
``force_release``) and the queues (``park``, ``queue_next``, ``queue_peek``)
run on the event loop. Permits (``limit``, ``also``), rated starts
(``rates``) and the rest (``rate``, ``release_owned_by``, scans, node info:
:data:`CARRIED`) are the sync client's calls, carried in a bounded thread
pool (:func:`.nodes.aio.carrier`).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import AsyncIterator, Callable, Coroutine, Sequence
from contextlib import asynccontextmanager
from typing import Any, Concatenate, ParamSpec, TypeVar

from .claims import Claims
from .exceptions import LockLost, LockNotAcquired
from .held import Lease
from .inspect import Inspection
from .nodes.aio import carrier, perform_async
from .ops import Op
from .queues import Queues
from .redlock import Redlock
from .steps import Carried, On, Pause, Steps, Unwaited, dressed
from .values import positive

__all__ = ["CARRIED", "AsyncRedlock"]

T = TypeVar("T")
P = ParamSpec("P")

logger = logging.getLogger("celery_redlock.heartbeat")

#: The sync client's calls an AsyncRedlock offers as coroutines carried in threads.
CARRIED = frozenset(
    {
        "agreed", "scan", "node_info", "release_owned_by", "rate",
    }
)  # fmt: skip
#: Plain values and key names, read from the sync client as they are.
SHARED = frozenset(
    {
        "nodes", "quorum", "node_timeout", "connect_timeout", "drift_factor", "min_replicas",
        "clock", "rng", "key_prefix", "fencing", "fence_retention", "keys", "permit_keys",
        "claim_key", "coalesce_key", "receipt_key", "queue_keys", "has_quorum", "check_quorum",
    }
)  # fmt: skip


def _driven(
    steps_of: Callable[Concatenate[Any, P], Steps[T]], part: str = ""
) -> Callable[Concatenate[AsyncRedlock, P], Coroutine[Any, Any, T]]:
    """The coroutine method of the sync client's steps method ``steps_of`` (one of
    its ``part``, if given): its arguments and docstring, its steps driven on the
    event loop."""

    async def call(self: AsyncRedlock, *args: P.args, **kwargs: P.kwargs) -> T:
        owner = getattr(self.sync, part) if part else self.sync
        return await self.drive(steps_of(owner, *args, **kwargs))

    return dressed(call, steps_of, f"AsyncRedlock.driven({steps_of.__qualname__})")


class AsyncRedlock:
    """A Redlock client for asyncio code: :class:`~.redlock.Redlock`'s arguments,
    its methods as coroutines (same names, arguments, results and errors).

    ``AsyncRedlock(redlock=rl)`` shares a sync client's nodes and settings.
    """

    def __init__(self, nodes: Sequence[Any] | None = None, *, redlock: Redlock | None = None,
                 **options: Any):  # fmt: skip
        if redlock is None:
            if nodes is None:
                raise TypeError("AsyncRedlock needs its nodes (or redlock=, a Redlock to share)")
            redlock = Redlock(nodes, **options)
        elif nodes is not None or options:
            raise TypeError("AsyncRedlock takes either nodes and options or redlock=, not both")
        #: The sync client on the same nodes: its logic, its settings.
        self.sync = redlock
        self._leases = redlock._leases
        self._quorum = redlock._quorum

    def __repr__(self) -> str:
        q = self._quorum
        return (
            f"<AsyncRedlock {len(q.nodes)} nodes quorum={q.needed} prefix={self.sync.key_prefix!r}>"
        )

    def __getattr__(self, name: str) -> Any:
        if name in SHARED:
            return getattr(self.sync, name)
        if name in CARRIED:
            return functools.partial(self._carry, getattr(self.sync, name))
        raise AttributeError(f"AsyncRedlock has no attribute {name!r}")

    async def _carry(self, call: Any, *args: Any, **kwargs: Any) -> Any:
        """A sync call of the core, in the carrier threads."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(carrier(), functools.partial(call, *args, **kwargs))

    async def _round(self, op: Op, nodes: Sequence[Any] | None = None,
                     timeout: float | None = None) -> list[Any]:  # fmt: skip
        q = self._quorum
        needed = q.needed if nodes is None else None
        return await perform_async(op, q.nodes if nodes is None else nodes, timeout, needed)

    async def drive(self, steps: Steps[T]) -> T:
        """Run a primitive's steps (:mod:`.steps`) on the event loop."""
        answer: Any = None
        try:
            while True:
                need = steps.send(answer)
                kind = type(need)
                if kind is Pause:
                    await asyncio.sleep(need.seconds)
                    answer = None
                elif kind is On:
                    answer = await self._round(need.op, need.nodes, need.timeout)
                elif kind is Unwaited:  # no unwaited writes here: a round on every node
                    answer = list(range(len(self._quorum.nodes)))
                elif kind is Carried:
                    answer = await self._carry(need.call)
                else:
                    answer = await self._round(need)
        except StopIteration as done:
            return done.value

    try_acquire = _driven(Redlock._trying)
    acquire = _driven(Redlock._acquiring)
    claim = _driven(Claims.claiming, "_claims")
    claim_next = _driven(Claims.claiming_next, "_claims")
    debounce = _driven(Claims.debouncing, "_claims")
    throttle = _driven(Claims.throttling, "_claims")
    withdraw_claim = _driven(Claims.withdrawing_claim, "_claims")
    claimant = _driven(Claims.reading_claimant, "_claims")
    holder = _driven(Inspection.reading_holder, "_inspection")
    inspect = _driven(Inspection.inspecting, "_inspection")
    inspect_key = _driven(Inspection.inspecting_key, "_inspection")
    read_claim = _driven(Inspection.reading_claim, "_inspection")
    force_release = _driven(Inspection.force_releasing, "_inspection")
    park = _driven(Queues.parking, "_queues")
    queue_next = _driven(Queues.handing_over, "_queues")
    queue_peek = _driven(Queues.peeking, "_queues")

    async def release(self, lease: Lease, *, receipt: float | None = None,
                      withdraw_claim: bool = False, wait: bool = True) -> None:  # fmt: skip
        """Delete the lock where it still holds the lease's owner (see
        :meth:`.Redlock.release`; ``wait=False`` is a round all the same here)."""
        await self.drive(
            self._leases.releasing(lease, receipt=receipt, withdraw_claim=withdraw_claim, wait=wait)
        )

    async def extend(self, lease: Lease, ttl: float | None = None) -> bool:
        """Set the lease's TTL (see :meth:`.Redlock.extend`)."""
        return (await self.extend_many([lease], ttl))[0]

    async def extend_many(self, leases: Sequence[Lease], ttl: float | None = None) -> list[bool]:
        """Renew several leases in one call per node (see :meth:`.Redlock.extend_many`)."""
        if ttl is not None:
            positive("ttl", ttl)
        return await self.drive(self._leases.extending(leases, ttl))

    async def fencing_token(self, lease: Lease) -> int | None:
        """The lease's fencing token; a lazy lease's (``fence=False``) is issued here,
        on the loop, once (see :attr:`.Lease.fencing_token`). Raises :class:`LockLost`
        if it can no longer be issued."""
        pending = lease._pending
        if lease._token is not None or pending is None:
            return lease._token
        written = None
        if not lease.lost:
            fencing = self._leases.fencing
            steps = fencing.issuing(pending, lease.key, lease.fence_key, lease.owner,
                                    lease._expires)  # fmt: skip
            written = await self.drive(steps)
        if written is None or lease.lost:
            lease.mark_lost()
            raise LockLost(
                f"lock {lease.name!r} is no longer held: its fencing token could not be issued",
                lease.name,
            )
        if lease._token is None:
            lease._token, lease._pending = written, None
        return lease._token

    @asynccontextmanager
    async def lock(self, name: str, *, ttl: float, timeout: float | None = None,
                   cancel_on_loss: bool = False) -> AsyncIterator[Lease]:  # fmt: skip
        """Hold the lock for the ``async with`` block (blocking; :class:`LockNotAcquired`
        on timeout), renewed every ``ttl / 3`` by an asyncio task. A lost lease is
        ``lease.lost`` (``lease.check()`` raises); with ``cancel_on_loss`` it also
        cancels the task running the block."""
        lease = await self.acquire(name, ttl=ttl, blocking=True, timeout=timeout)
        if lease is None:
            raise LockNotAcquired.of(name, timeout, await self.holder(name))
        body = asyncio.current_task() if cancel_on_loss else None
        beat = asyncio.ensure_future(self._heartbeat(lease, ttl / 3, body))
        try:
            yield lease
        finally:
            beat.cancel()
            await self.release(lease)

    async def _heartbeat(self, lease: Lease, interval: float, body: Any) -> None:
        """Renew ``lease`` every ``interval`` seconds until it is released or lost."""
        while True:
            await asyncio.sleep(interval)
            if lease._lost:  # released
                return
            try:
                renewed = (await self.extend_many([lease]))[0]
            except Exception:  # a bug must not end the renewals unseen: the lease is lost
                logger.exception("renewal of %r failed", lease.name)
                lease.mark_lost()
                renewed = False
            if not renewed:
                logger.warning("lease on %r lost: %s", lease.name, lease.lost_reason)
                if body is not None:
                    body.cancel()
                return

    async def close(self) -> None:
        """Close the idle connections of the sync client (the loop's close with it)."""
        self.sync.close()
