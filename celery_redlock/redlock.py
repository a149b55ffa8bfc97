"""Redlock: a lease on a majority of N independent Redis masters, with fencing tokens.

The guarantee
=============

While the timing assumptions below hold, at most one owner holds a lease on a
given name at any moment. When they do not hold, the **fencing token** is what
keeps the protected resource safe: every grant of a name carries a token
strictly larger than every earlier grant's, so a resource that remembers the
largest token it has seen can reject a write from a stale holder.

Assumptions:

* Clocks on the client and the nodes advance at about the same rate: drift is
  bounded by ``drift_factor`` (1 % of the TTL by default, plus 2 ms).
* A holder does not pause (GC, SIGSTOP, swap) for longer than the validity it
  has left. If it does, its lease lapses silently; the token is the backstop.
* A node that restarts keeps its keys (fsync'd AOF), or stays down for at least
  the longest TTL before rejoining. Fencing tokens survive even a node that
  comes back empty, through the time floor described below.
* Quorum is ``N // 2 + 1`` **of all configured nodes**, never of the reachable
  ones, so two partitions can never both hold a majority.

Acquire
=======

One Lua call per node, sent to all nodes at once: if the key holds my owner
value its TTL is refreshed (so a re-sent acquire is harmless); if it holds
another, the node reports the holder and its PTTL; otherwise it sets the key
with the TTL. The lease is granted when a quorum granted it **and** validity
is left: ``validity = ttl - elapsed - (ttl * drift_factor + 2 ms)``.
Otherwise the key is released on every node, including the ones that did not
answer, because their reply may only have been lost.

Fencing tokens
==============

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

Keys
====

``{prefix}:lock:{name}`` and ``{prefix}:fence:{name}``. A name with no hash tag
is wrapped in one (``{name}``) so that both keys live in one slot if a node is
itself a Redis Cluster.
"""

from __future__ import annotations

import logging
import os
import random
import secrets
import socket
import threading
import time
import warnings
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Callable, NamedTuple

from redis.exceptions import RedisError

from . import _scripts
from ._nodes import Node, NodeSpec, run_script
from .exceptions import (
    ConfigurationError,
    LockContended,
    LockLost,
    LockNotAcquired,
    QuorumUnavailable,
)

__all__ = ["Holder", "Lease", "Redlock", "make_owner", "full_jitter"]

logger = logging.getLogger("celery_redlock.redlock")

#: Fixed part of the drift allowance, in seconds (redis.io distlock).
DRIFT_FLOOR = 0.002
#: Owner value separator; the first field is the task id (or "-").
OWNER_SEP = "|"

_HOST = socket.gethostname()


def make_owner(task_id: str | None = None, retries: int | None = None) -> str:
    """An owner value: ``task_id|retries|host|pid|random``. Ownership is the whole value.

    The task id comes first so a parent process can free a dead child's lock by
    prefix; ``retries`` tells a redelivered message from a retry of the same task.
    """
    return OWNER_SEP.join(
        (
            task_id or "-",
            "-" if retries is None else str(retries),
            _HOST,
            str(os.getpid()),
            secrets.token_hex(8),
        )
    )


def full_jitter(
    attempt: int, base: float, cap: float, rng: Callable[[], float] = random.random
) -> float:
    """Exponential backoff with full jitter: uniform in ``[0, min(cap, base * 2**attempt)]``."""
    return rng() * min(cap, base * (2 ** min(attempt, 62)))


class Holder(NamedTuple):
    """Who holds a name, as the nodes see it."""

    #: The holder's owner value (``task_id|retries|host|pid|random``), or None if
    #: no majority agrees.
    owner: str | None
    #: Seconds left on the holder's key (the smallest PTTL among the agreeing nodes).
    remaining: float | None

    @property
    def task_id(self) -> str | None:
        """The holder's task id, if it was taken by a task."""
        if not self.owner:
            return None
        first = self.owner.split(OWNER_SEP, 1)[0]
        return None if first == "-" else first

    @property
    def retries(self) -> int | None:
        """How many times the holder's task had been retried when it took the lock."""
        fields = (self.owner or "").split(OWNER_SEP)
        return int(fields[1]) if len(fields) > 1 and fields[1].isdigit() else None


class Lease:
    """A granted lock.

    Attributes:
        name: the lock name.
        key: the Redis key of the lock.
        owner: the owner value written on the nodes.
        ttl: the TTL the nodes were given, in seconds.
        fencing_token: strictly larger than every earlier grant's (None when
            fencing is off). On a lazy lease (``try_acquire(..., fence=False)``)
            whose nodes disagreed, the first read writes the token back (one
            round trip) and raises :class:`LockLost` if that no longer lands
            on a quorum.
    """

    __slots__ = (
        "name",
        "key",
        "fence_key",
        "owner",
        "ttl",
        "_token",
        "_pending",
        "_fence_lock",
        "_expires",
        "_lost",
        "_redlock",
        "__weakref__",
    )

    def __init__(
        self,
        redlock: Redlock,
        name: str,
        key: str,
        fence_key: str,
        owner: str,
        ttl: float,
        fencing_token: int | None,
        expires: float,
        pending: tuple[tuple[int, ...], int] | None = None,
    ):
        self._redlock = redlock
        self.name = name
        self.key = key
        self.fence_key = fence_key
        self.owner = owner
        self.ttl = ttl
        self._token = fencing_token
        # Lazy lease: (granting node indexes, phase-1 candidate token) until the
        # first read of fencing_token writes the token back.
        self._pending = pending
        self._fence_lock = threading.Lock() if pending else None
        self._expires = expires
        # Set once, by the heartbeat thread or a release; a plain flag is enough.
        self._lost = False

    @property
    def fencing_token(self) -> int | None:
        """The fencing token; on a lazy lease the first read writes it back (may raise LockLost)."""
        token = self._token
        if token is not None or self._pending is None:
            return token
        assert self._fence_lock is not None
        with self._fence_lock:  # concurrent first reads write it once
            if self._token is None:
                self._token = self._redlock._fence_lazy(self)
                self._pending = None
            return self._token

    @property
    def redlock(self) -> Redlock:
        return self._redlock

    def remaining(self) -> float:
        """Seconds of validity left (0 or less once it has lapsed)."""
        return self._expires - self._redlock.clock()

    @property
    def lost(self) -> bool:
        """True once a renewal failed to reach a quorum or the validity ran out."""
        return self._lost or self.remaining() <= 0

    def mark_lost(self) -> None:
        self._lost = True

    def check(self) -> None:
        """Raise :class:`LockLost` unless the lease is still held."""
        if self.lost:
            raise LockLost(f"lock {self.name!r} is no longer held", self.name)

    def _renewed(self, expires: float) -> None:
        # Set, not max: a renewal to a shorter TTL shortens the keys on the
        # nodes, so the validity the client trusts must shrink with them.
        self._expires = expires

    def __repr__(self) -> str:
        return (
            f"<Lease {self.name!r} token={'unread' if self._pending else self._token} "
            f"remaining={self.remaining():.3f}s{' LOST' if self.lost else ''}>"
        )


class Redlock:
    """A Redlock client over N independent Redis masters.

    Args:
        nodes: URLs (``redis://``, ``rediss://``, ``unix://``) or ``redis.Redis``
            clients; each must be an independent master. One node is allowed
            (a plain single-node lock).
        node_timeout: seconds each node gets to answer, per round.
        drift_factor: clock drift allowed, as a fraction of the TTL.
        key_prefix: first part of every key written.
        fencing: hand out fencing tokens (a second round trip only when the
            granting nodes disagree on the fence value; see the module docstring).
        fence_retention: seconds a fence value is kept after its last grant.
        clock: monotonic clock, seconds (injectable for tests).
        sleep: sleep function (injectable for tests).
        rng: ``random()`` function for jitter.
    """

    def __init__(
        self,
        nodes: Sequence[NodeSpec],
        *,
        node_timeout: float = 0.05,
        drift_factor: float = 0.01,
        key_prefix: str = "redlock",
        fencing: bool = True,
        fence_retention: float = 7 * 86400,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        rng: Callable[[], float] = random.random,
    ):
        if isinstance(nodes, (str, bytes)) or not isinstance(nodes, Iterable):
            raise ConfigurationError("nodes must be a list of Redis URLs or clients")
        nodes = list(nodes)
        if not nodes:
            raise ConfigurationError("Redlock needs at least one Redis node")
        _positive("node_timeout", node_timeout)
        _positive("fence_retention", fence_retention)
        if not isinstance(drift_factor, (int, float)) or not 0 <= drift_factor < 1:
            raise ConfigurationError(f"drift_factor must be in [0, 1), got {drift_factor!r}")
        if (
            not isinstance(key_prefix, str)
            or not key_prefix
            or "{" in key_prefix
            or "}" in key_prefix
        ):
            raise ConfigurationError(
                f"key_prefix must be a non-empty string without braces, got {key_prefix!r}"
            )
        self.nodes = [Node(spec, node_timeout) for spec in nodes]
        seen: dict[tuple, Node] = {}
        for node in self.nodes:
            if node.identity in seen:
                raise ConfigurationError(
                    f"Redis node {node.name} is listed twice (same as {seen[node.identity].name}); "
                    "Redlock nodes must be independent masters"
                )
            seen[node.identity] = node
        if len(self.nodes) > 1 and len(self.nodes) % 2 == 0:
            warnings.warn(
                f"{len(self.nodes)} Redlock nodes tolerate no more failures than "
                f"{len(self.nodes) - 1}; use an odd number",
                RuntimeWarning,
                stacklevel=2,
            )
        self.quorum = len(self.nodes) // 2 + 1
        self.node_timeout = float(node_timeout)
        self.drift_factor = float(drift_factor)
        self.key_prefix = key_prefix
        self.fencing = bool(fencing)
        self.fence_retention = float(fence_retention)
        # ACQUIRE's fence argument: the retention in ms, or empty with fencing off.
        self._fence_arg = str(_ms(self.fence_retention)) if self.fencing else ""
        self.clock = clock
        self.sleep = sleep
        self.rng = rng

    def __repr__(self) -> str:
        return f"<Redlock {len(self.nodes)} nodes quorum={self.quorum} prefix={self.key_prefix!r}>"

    # -- keys ---------------------------------------------------------------

    def keys(self, name: str) -> tuple[str, str]:
        """The lock key and the fence key of a name."""
        if not isinstance(name, str) or not name:
            raise ConfigurationError(f"a lock name must be a non-empty string, got {name!r}")
        tagged = name if ("{" in name and "}" in name.split("{", 1)[1]) else f"{{{name}}}"
        return f"{self.key_prefix}:lock:{tagged}", f"{self.key_prefix}:fence:{tagged}"

    # -- acquire ------------------------------------------------------------

    def try_acquire(
        self, name: str, *, ttl: float, owner: str | None = None, fence: bool = True
    ) -> Lease | Holder:
        """One attempt: the :class:`Lease`, or the :class:`Holder` in the way.

        With ``fence=False`` (and fencing on) the lease is granted after phase 1;
        if the nodes disagree, the token is written back on the first read of
        ``lease.fencing_token``.

        Raises:
            QuorumUnavailable: fewer than a quorum of nodes answered.
        """
        _positive("ttl", ttl)
        key, fence_key = self.keys(name)
        owner = owner or make_owner()
        ttl_ms = _ms(ttl)
        start = self.clock()
        replies = run_script(
            _scripts.ACQUIRE,
            self.nodes,
            (key, fence_key),
            (owner, ttl_ms, self._fence_arg, time.time_ns() // 1000),
            self.node_timeout,
        )
        granted = [i for i, r in enumerate(replies) if _is_list(r) and r[0] == 1]
        expires = start + ttl - (ttl * self.drift_factor + DRIFT_FLOOR)
        if len(granted) >= self.quorum and self.clock() < expires:
            if not self.fencing:
                return Lease(self, name, key, fence_key, owner, ttl, None, expires)
            token, agreed = self._candidate(granted, replies)
            if agreed >= self.quorum:  # already on a quorum: phase 2 has nothing to add
                return Lease(self, name, key, fence_key, owner, ttl, token, expires)
            if not fence:
                pending = (tuple(granted), token)
                return Lease(self, name, key, fence_key, owner, ttl, None, expires, pending)
            if self._write_back(granted, token, key, fence_key, owner, expires) is not None:
                return Lease(self, name, key, fence_key, owner, ttl, token, expires)
        self._release_everywhere(key, owner)
        errors = self._errors(replies)
        if len(self.nodes) - len(errors) < self.quorum:
            raise QuorumUnavailable(errors, self.quorum, len(self.nodes))
        return _holder([(_text(r[1]), int(r[2])) for r in replies if _is_list(r) and r[0] == 0])

    @staticmethod
    def _candidate(granted: Sequence[int], replies: list[Any]) -> tuple[int, int]:
        """The largest fence value among the granting nodes, and how many nodes hold it."""
        values = [int(replies[i][1]) for i in granted]
        token = max(values)
        return token, values.count(token)

    def _fence_lazy(self, lease: Lease) -> int:
        """Phase 2 of a lazy lease, on the first read of its token (the lease's lock is held)."""
        assert lease._pending is not None  # only lazy leases get here
        granted, token = lease._pending
        written = None
        if not lease.lost:
            written = self._write_back(
                granted, token, lease.key, lease.fence_key, lease.owner, lease._expires
            )
        # A heartbeat may have marked it lost meanwhile, or shortened it: check again.
        if written is None or lease.lost:
            lease.mark_lost()
            raise LockLost(
                f"lock {lease.name!r} is no longer held: its fencing token could not be written",
                lease.name,
            )
        return written

    def _write_back(
        self,
        granted: Sequence[int],
        token: int,
        key: str,
        fence_key: str,
        owner: str,
        expires: float,
    ) -> int | None:
        """Write ``token`` where the granting nodes still hold ``owner``; None short of a quorum."""
        remaining = expires - self.clock()
        if remaining <= 0:
            return None
        written = run_script(
            _scripts.FENCE,
            [self.nodes[i] for i in granted],
            (key, fence_key),
            (owner, str(token), _ms(self.fence_retention)),
            min(self.node_timeout, remaining),
        )
        landed = sum(1 for r in written if r == 1)
        if landed >= self.quorum and self.clock() < expires:
            return token
        logger.info("fencing token for %r landed on %d nodes, %d needed", key, landed, self.quorum)
        return None

    def acquire(
        self,
        name: str,
        *,
        ttl: float,
        blocking: bool = False,
        timeout: float | None = None,
        owner: str | None = None,
        retry_delay: float = 0.05,
        retry_delay_max: float = 1.0,
        fence: bool = True,
    ) -> Lease | None:
        """Take the lock on a quorum.

        Args:
            name: the lock name.
            ttl: lease time in seconds; the lock frees itself after it.
            blocking: keep trying (exponential backoff, full jitter) while contended.
            timeout: with ``blocking``, give up after this many seconds (None: never).
            owner: the owner value to write (default: :func:`make_owner`).
            fence: write the fencing token back before returning the lease; with
                False it is written on the first read of ``lease.fencing_token``.

        Returns:
            The :class:`Lease`, or None if another owner holds the lock.

        Raises:
            QuorumUnavailable: fewer than a quorum of nodes answered (on the
                last attempt, when blocking).
        """
        if timeout is not None:
            _positive("timeout", timeout, zero_ok=True)
        _positive("ttl", ttl)
        start = self.clock()
        attempt = 0
        while True:
            try:
                result = self.try_acquire(name, ttl=ttl, owner=owner, fence=fence)
            except QuorumUnavailable:
                if not blocking or (timeout is not None and self.clock() - start >= timeout):
                    raise
                result = None
            if isinstance(result, Lease):
                return result
            if not blocking:
                return None
            delay = full_jitter(attempt, retry_delay, retry_delay_max, self.rng)
            if timeout is not None:
                left = timeout - (self.clock() - start)
                if left <= 0:
                    return None
                delay = min(delay, left)
            self.sleep(delay)
            attempt += 1

    @contextmanager
    def lock(self, name: str, *, ttl: float, timeout: float | None = None) -> Iterator[Lease]:
        """Hold the lock for the ``with`` block (blocking; :class:`LockNotAcquired` on timeout)."""
        lease = self.acquire(name, ttl=ttl, blocking=True, timeout=timeout)
        if lease is None:
            holder = self.holder(name)
            if holder.owner:
                raise LockContended(
                    f"lock {name!r} is held by {holder.owner}", name, holder.owner, holder.remaining
                )
            raise LockNotAcquired(f"lock {name!r} not acquired within {timeout}s", name)
        try:
            yield lease
        finally:
            self.release(lease)

    # -- extend and release -------------------------------------------------

    def extend(self, lease: Lease, ttl: float | None = None) -> bool:
        """Set the lease's TTL to ``ttl`` (default: its own) on every node; never adds.

        Returns False, and marks the lease lost, when it had already lapsed or
        fewer than a quorum of nodes still hold it.
        """
        return self.extend_many([lease], ttl)[0]

    def extend_many(self, leases: Sequence[Lease], ttl: float | None = None) -> list[bool]:
        """Renew several leases of this client: one call per node, whatever their number."""
        if ttl is not None:
            _positive("ttl", ttl)
        live = [lease for lease in leases if not lease.lost]
        results = {id(lease): False for lease in leases}
        if live:
            keys = [lease.key for lease in live]
            args: list[Any] = []
            for lease in live:
                args += (lease.owner, _ms(ttl or lease.ttl))
            start = self.clock()
            replies = run_script(_scripts.EXTEND, self.nodes, keys, args, self.node_timeout)
            for j, lease in enumerate(live):
                votes = sum(1 for r in replies if _is_list(r) and int(r[j]) == 1)
                lease_ttl = ttl or lease.ttl
                expires = start + lease_ttl - (lease_ttl * self.drift_factor + DRIFT_FLOOR)
                if votes >= self.quorum and self.clock() < expires:
                    lease._renewed(expires)
                    results[id(lease)] = True
        for lease in leases:
            if not results[id(lease)]:
                lease.mark_lost()
        return [results[id(lease)] for lease in leases]

    def release(self, lease: Lease) -> None:
        """Delete the lock on every node where it still holds the lease's owner. Never raises."""
        lease.mark_lost()
        self._release_everywhere(lease.key, lease.owner)

    def release_owned_by(self, name: str, task_id: str) -> int:
        """Free ``name`` if its holder is the task ``task_id``, whatever its random part.

        For a parent process cleaning up after a child that died mid-task.
        Returns how many nodes deleted the key. Never raises.
        """
        key, _ = self.keys(name)
        prefix = task_id + OWNER_SEP
        try:
            replies = run_script(
                _scripts.RELEASE_PREFIX, self.nodes, (key,), (prefix,), self.node_timeout
            )
        except (RedisError, OSError):  # pragma: no cover - gather returns errors, never raises them
            return 0
        return sum(1 for r in replies if r == 1)

    def _release_everywhere(self, key: str, owner: str) -> None:
        try:
            replies = run_script(_scripts.RELEASE, self.nodes, (key,), (owner,), self.node_timeout)
        except (RedisError, OSError) as exc:  # pragma: no cover - defensive: release never raises
            logger.warning("release of %r failed: %s", key, exc)
            return
        failed = [node.name for node, r in zip(self.nodes, replies) if isinstance(r, Exception)]
        if failed:
            logger.info(
                "release of %r did not reach %s; the TTL will free it there", key, ", ".join(failed)
            )

    # -- inspection and one-shot claims ---------------------------------------

    def holder(self, name: str) -> Holder:
        """The owner a quorum of nodes agrees on, and its remaining TTL.

        Raises:
            QuorumUnavailable: fewer than a quorum of nodes answered.
        """
        key, fence_key = self.keys(name)
        replies = run_script(_scripts.INSPECT, self.nodes, (key, fence_key), (), self.node_timeout)
        errors = self._errors(replies)
        if len(self.nodes) - len(errors) < self.quorum:
            raise QuorumUnavailable(errors, self.quorum, len(self.nodes))
        return _holder(
            [(_text(r[0]), int(r[1])) for r in replies if _is_list(r) and r[0]], self.quorum
        )

    def inspect(self, name: str) -> list[dict[str, Any]]:
        """Per node: holder, PTTL (ms) and fence value of ``name``, or the node's error."""
        key, fence_key = self.keys(name)
        replies = run_script(_scripts.INSPECT, self.nodes, (key, fence_key), (), self.node_timeout)
        out: list[dict[str, Any]] = []
        for node, r in zip(self.nodes, replies):
            if isinstance(r, Exception):
                out.append({"node": node.name, "error": str(r)})
            else:
                out.append(
                    {
                        "node": node.name,
                        "holder": _text(r[0]),
                        "pttl_ms": int(r[1]),
                        "fence": _text(r[2]),
                    }
                )
        return out

    def claim(self, key: str, value: str, *, ttl: float) -> bool:
        """Set ``{prefix}:{key}`` to ``value`` on a quorum unless another value is there.

        The claim is never released: it expires.

        Used for one-shot decisions such as "this beat slot was sent". Returns
        True if the claim is ours (also when re-sent), False if another value
        won. A claim that fell short of a quorum is withdrawn everywhere.

        Raises:
            QuorumUnavailable: fewer than a quorum of nodes answered.
        """
        _positive("ttl", ttl)
        full_key = f"{self.key_prefix}:{key}"
        replies = run_script(
            _scripts.CLAIM, self.nodes, (full_key,), (value, _ms(ttl)), self.node_timeout
        )
        errors = self._errors(replies)
        if sum(1 for r in replies if r == 1) >= self.quorum:
            return True
        self._release_everywhere(full_key, value)
        if len(self.nodes) - len(errors) < self.quorum:
            raise QuorumUnavailable(errors, self.quorum, len(self.nodes))
        return False

    def _errors(self, replies: list[Any]) -> dict[str, BaseException]:
        return {node.name: r for node, r in zip(self.nodes, replies) if isinstance(r, Exception)}


def _holder(seen: list[tuple[str | None, int]], quorum: int = 1) -> Holder:
    """The most common holder among node answers, if at least ``quorum`` agree."""
    if not seen:
        return Holder(None, None)
    owner, votes = Counter(owner for owner, _ in seen).most_common(1)[0]
    if votes < quorum:
        return Holder(None, None)
    pttls = [pttl for o, pttl in seen if o == owner and pttl >= 0]
    return Holder(owner, min(pttls) / 1000.0 if pttls else None)


def _positive(name: str, value: Any, zero_ok: bool = False) -> None:
    # Durations must be finite (they become PX milliseconds); a timeout may be inf (no limit).
    ok = (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and (value >= 0 if zero_ok else 0 < value < float("inf"))
    )
    if not ok:
        raise ConfigurationError(
            f"{name} must be a {'non-negative' if zero_ok else 'positive'} "
            f"number of seconds, got {value!r}"
        )


def _ms(seconds: float) -> int:
    return max(1, int(seconds * 1000))


def _is_list(reply: Any) -> bool:
    return isinstance(reply, list)


def _text(value: Any) -> str | None:
    if value is None or value is False:
        return None
    return value.decode() if isinstance(value, bytes) else str(value)
