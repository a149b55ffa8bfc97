"""Releasing a lease: its key deleted on every node where it still holds the
owner value, in one round (or written without waiting for the replies), with
a receipt or a claim's withdrawal in the same call where asked; what a release
did not reach is freed there by its TTL, and logged once."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from .held import Lease
from .keyspace import KeySpace
from .ops import Count, Release, ReleasePrefix
from .quorum import Quorum
from .records import OWNER_SEP
from .steps import On, Steps, Unwaited, dressed, drive, driven
from .values import ms

__all__ = ["Releasing", "log_missed"]

logger = logging.getLogger("celery_redlock.redlock")


def log_missed(
    nodes: Sequence[Any],
    key: str,
    replies: Sequence[Any],
    granted: Sequence[int] | None,
    at: Sequence[int] | None = None,
) -> None:
    """One line naming the nodes (of indexes ``at``) a release of ``key`` did not
    reach, among the ones that ``granted`` it (None: wherever it may be)."""
    for reply in replies:  # every node answered (the rule): no list to build
        if isinstance(reply, Exception):
            break
    else:
        return
    failed = [
        nodes[i].name
        for i, r in zip(at or range(len(replies)), replies)
        if isinstance(r, Exception) and (granted is None or i in granted)
    ]
    if failed:
        logger.info(
            "release of %r did not reach %s; the TTL will free it there", key, ", ".join(failed)
        )


class Releasing:
    """The release of a lease's keys (the base of :class:`.lease.Leases`)."""

    __slots__ = ()
    quorum: Quorum
    keyspace: KeySpace

    def releasing(
        self,
        lease: Lease,
        *,
        receipt: float | None = None,
        withdraw_claim: bool = False,
        wait: bool = True,
    ) -> Steps[None]:
        """Delete the lock on every node where it still holds the lease's owner. Never raises.

        In the same round, ``receipt`` (seconds) records that the lease's id
        (:attr:`Lease.task_id`) finished, for :meth:`try_acquire` with
        ``receipts=True``; ``withdraw_claim`` withdraws the name's claim if it
        names that id.

        With ``wait=False`` the release is written to every node and the call
        returns without waiting for the replies: each node deletes the key as
        soon as it reads the command, and the next round on the same connection
        reads the reply first. A node it cannot be written to at once gets an
        ordinary round. A release that fails on a node leaves the key there to
        its TTL, as when it is waited for.
        """
        lease.mark_lost()
        if not lease.also and not (receipt or withdraw_claim):  # the usual release: one step
            return self.releasing_everywhere(lease.key, lease.owner, wait=wait)
        return self._releasing(lease, receipt, withdraw_claim, wait)

    def _releasing(
        self, lease: Lease, receipt: float | None, withdraw_claim: bool, wait: bool
    ) -> Steps[None]:
        if lease.also:  # the names held together with it: one call per node for all
            for other in lease.also:
                other.mark_lost()
            yield from self.releasing_prefix([other.key for other in lease.also], lease.owner)
        task_id = lease.task_id if receipt or withdraw_claim else None
        if task_id is None:
            yield from self.releasing_everywhere(lease.key, lease.owner, wait=wait)
            return
        space = self.keyspace
        op = Release(
            lease.key,
            lease.owner,
            space.receipt_key(lease.name, task_id),
            space.claim_key(lease.name),
            str(ms(receipt)) if receipt else "",
            task_id if withdraw_claim else "",
        )
        yield from self.releasing_everywhere(lease.key, lease.owner, wait, op)

    def release_owned_by(self, name: str, task_id: str, limit: int = 1) -> int:
        """Free ``name`` if its holder is the task ``task_id``, whatever its random part.

        For a parent process cleaning up after a child that died mid-task.
        With ``limit`` K, each of the K permits of ``name`` that task holds,
        whatever its index. Returns how many keys were deleted, summed over
        the nodes. Never raises.
        """
        space = self.keyspace
        keys = space.permit_keys(name, limit) if limit > 1 else [space.keys(name)[0]]
        try:
            replies = self.quorum.run(ReleasePrefix(tuple(keys), task_id + OWNER_SEP))
        except Exception:  # pragma: no cover - rounds return errors, never raise them
            return 0
        return sum(r.n for r in replies if isinstance(r, Count))

    def releasing_prefix(
        self, keys: Sequence[str], owner: str, granted: Sequence[int] | None = None
    ) -> Steps[None]:
        """Delete the keys that ``owner`` holds among ``keys``, on every node. Never raises.

        ``granted``: see :meth:`release_everywhere`."""
        replies = yield ReleasePrefix(tuple(keys), owner)
        log_missed(self.quorum.nodes, keys[0], replies, granted)

    def releasing_everywhere(
        self,
        key: str,
        owner: str,
        wait: bool = True,
        op: Release | None = None,
        granted: Sequence[int] | None = None,
    ) -> Steps[None]:
        """Delete ``key`` where it holds ``owner`` (``op``: a :class:`.ops.Release` with
        its extras). Never raises.

        ``wait=False``: see :meth:`release`. ``granted``: for the clean-up of an
        attempt that did not stand, the indexes of the nodes that granted it: a
        release that misses another node is not logged, as nothing is left there
        that it knows of (a node that never answered the attempt is an outage,
        logged as one, and its TTL frees whatever it wrote)."""
        q = self.quorum
        op = op or Release(key, owner)
        at = None  # the indexes of the nodes of the round: all of them
        try:
            if not wait:
                at = yield Unwaited(op)
                if not at:
                    return
            replies = yield (op if at is None else On(op, [q.nodes[i] for i in at]))
        except Exception as exc:  # pragma: no cover - defensive: release never raises
            logger.warning("release of %r failed: %s", key, exc)
            return
        log_missed(q.nodes, key, replies, granted, at)

    def _release(self, lease: Lease, **options: Any) -> None:
        """:meth:`releasing`, in this thread."""
        usual = options.get("wait", True) and not options.get("receipt")
        if usual and not lease.also and not options.get("withdraw_claim"):
            # the usual release: its one round run here, no steps to drive
            lease.mark_lost()
            try:
                replies = self.quorum.run(Release(lease.key, lease.owner))
            except Exception as exc:  # pragma: no cover - defensive: release never raises
                logger.warning("release of %r failed: %s", lease.key, exc)
                return
            log_missed(self.quorum.nodes, lease.key, replies, None)
            return
        drive(self.quorum, self.releasing(lease, **options))

    release = dressed(_release, releasing, "Leases.release")

    release_prefix = driven(releasing_prefix)
    release_everywhere = driven(releasing_everywhere)
