"""What the operations return, and the owner value they write.

The owner value is ``task_id|retries|host|pid|random``: ownership is the whole
value, and the task id comes first so a parent process can free a dead
child's lock by prefix.
"""

from __future__ import annotations

import itertools
import os
import random
import secrets
import socket
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from . import ops
from .values import text
from .windows import Window

__all__ = [
    "NEAR",
    "OWNER_SEP",
    "STARTED_MARK",
    "Claim",
    "Finished",
    "EtcdInfo",
    "Holder",
    "KindWords",
    "NodeInfo",
    "PostgresInfo",
    "RateSlot",
    "RateView",
    "RedisInfo",
    "SPECIFIC",
    "Schedule",
    "TooEarly",
    "agree",
    "claimant_of",
    "full_jitter",
    "in_the_way",
    "make_owner",
    "split",
    "stopped_early",
]

#: Owner value separator; the first field is the task id (or "-").
OWNER_SEP = "|"
#: A booked instant at most this many seconds ahead is due now: a rated grant sleeps it out.
NEAR = 0.005
#: A claim whose run started is marked ``~<id>`` for the rest of its TTL (see ``scripts``).
STARTED_MARK = "~"

_HOST = socket.gethostname()


def _new_process() -> None:
    """This process's part of its owner values: its pid, and a random prefix that a
    counter follows. Renewed in a forked child: no two processes share a value, and
    a value costs no system call (getpid, getrandom) per call."""
    global _PROCESS, _SERIAL
    _PROCESS = OWNER_SEP.join((_HOST, str(os.getpid()), secrets.token_hex(4)))
    _SERIAL = itertools.count()


_PROCESS = ""
_SERIAL = itertools.count()
_new_process()
os.register_at_fork(after_in_child=_new_process)


def make_owner(task_id: str | None = None, retries: int | None = None) -> str:
    """An owner value: ``task_id|retries|host|pid|random``. Ownership is the whole value;
    ``random`` is a random prefix drawn per process and a per-process counter.

    The task id comes first so a parent process can free a dead child's lock by
    prefix; ``retries`` tells a redelivered message from a retry of the same task.
    """
    tried = "-" if retries is None else retries
    serial = next(_SERIAL) & 0xFFFFFFFF
    return f"{task_id or '-'}{OWNER_SEP}{tried}{OWNER_SEP}{_PROCESS}{serial:08x}"


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
    #: The id the name's claim names, when the caller asked to see it (see :class:`Claim`).
    claimant: str | None = None

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


class Claim(NamedTuple):
    """A name's claim: the id (a task id) meant to take the name next.

    Returned by :meth:`Redlock.claim_next` and :meth:`Redlock.claimant`, and by
    :meth:`Redlock.try_acquire` when the name is free but claimed by another id.
    """

    #: The id the claim names on a quorum, or None when no quorum agrees.
    claimant: str | None
    #: Seconds left on the claim (the smallest PTTL among the agreeing nodes).
    remaining: float | None
    #: On a take-over (``replace=True``): the id the claim named before, on a quorum.
    previous: str | None = None
    #: True when the claim already named the caller (its TTL was raised, not set anew).
    renewed: bool = False


class Schedule(NamedTuple):
    """When a coalesced call runs (:meth:`Redlock.debounce`, :meth:`Redlock.throttle`)."""

    #: ``"later"``: the call holds the claim and is due at ``due``; ``"now"``: it
    #: runs at once, unclaimed; ``"dropped"``: it falls inside a period and is not kept.
    kind: str
    #: When the call is due, in seconds since the epoch (the caller's clock).
    due: float
    #: ``"later"``: the claimant it took over from, on a quorum. ``"dropped"``: the
    #: id of the run that holds the period, if known.
    other: str | None = None
    #: A throttled call's slot (its due time in ms, as the nodes keep it):
    #: :meth:`Redlock.try_acquire` takes it as ``slot``.
    slot: str | None = None


class TooEarly(NamedTuple):
    """A throttled name was granted less than a period ago: try again in ``wait`` seconds."""

    wait: float


class Finished(NamedTuple):
    """A receipt says this id already finished: returned by :meth:`Redlock.try_acquire`."""

    id: str


def agree(seen: Sequence[tuple[str | None, int]], quorum: int = 1) -> Holder:
    """The most common value among node answers (value, pttl_ms), if at least
    ``quorum`` agree; ``remaining`` is the smallest TTL among them."""
    if not seen:
        return Holder(None, None)
    owner, votes = Counter(owner for owner, _ in seen).most_common(1)[0]
    if votes < quorum:
        return Holder(None, None)
    pttls = [pttl for o, pttl in seen if o == owner and pttl >= 0]
    return Holder(owner, min(pttls) / 1000.0 if pttls else None)


def claimant_of(value: Any) -> str | None:
    """A claim value as an id: a started mark (``~id``) names the run that started."""
    found = text(value)
    return found[1:] if found and found.startswith(STARTED_MARK) else found


def in_the_way(replies: Sequence[Any], task_id: str | None) -> Holder | Claim:
    """What stopped an acquire: the holder a node reported (with the claimant it saw
    beside it), the holder of another name held together (``also=``), or the claim
    naming another id."""
    held = [r for r in replies if isinstance(r, ops.Held)]
    full = [r for r in replies if isinstance(r, ops.Full)]
    if held or (task_id is None and not full):
        holder = agree([(r.holder, r.pttl_ms) for r in held])
        claimants = [claimant_of(r.claim) for r in held if r.claim]
        if claimants:
            holder = holder._replace(claimant=Counter(claimants).most_common(1)[0][0])
        return holder
    if full:  # my name had a permit, another name held together had none
        return agree([(r.holder, r.pttl_ms) for r in full])
    claimed = agree(
        [(claimant_of(r.claimant), r.pttl_ms) for r in replies if isinstance(r, ops.Claimed)]
    )
    return Claim(claimed.owner, claimed.remaining)


def split(replies: Sequence[Any], needed: int) -> bool:
    """A failed attempt that met other owners, none of them on ``needed`` nodes:
    contenders split the nodes (and each let go). Nobody holds the name."""
    held = Counter(r.holder for r in replies if isinstance(r, ops.Held))
    return bool(held) and max(held.values()) < needed


def stopped_early(
    replies: Sequence[Any], task_id: str | None, needed: int
) -> Finished | TooEarly | None:
    """A receipt (one node is proof: it is only written after the fact), or a grant less
    than a throttle period ago on a quorum: the attempt is over, nothing is held."""
    if task_id is not None and any(isinstance(r, ops.Finished) for r in replies):
        return Finished(task_id)
    early = [r.wait_ms for r in replies if isinstance(r, ops.TooEarly)]
    if len(early) >= needed:
        return TooEarly(max(early) / 1000.0)
    return None


class RateSlot(NamedTuple):
    """What a reservation got.

    ``reserved``: the start at ``start_at`` (epoch seconds, the client's clock)
    is booked on a quorum; ``wait`` is the seconds from the call to it (0: start
    now). Not ``reserved``: concurrent callers split the nodes for every round;
    nothing was granted, ask again (``start_at`` is the latest instant seen).
    """

    start_at: float
    wait: float
    reserved: bool = True

    @property
    def now(self) -> bool:
        """Reserved, and due now."""
        return self.reserved and self.wait <= 0

    @property
    def due(self) -> bool:
        """Reserved, and due within :data:`NEAR`: the start sleeps out the rest."""
        return self.reserved and self.wait <= NEAR


class RateView(NamedTuple):
    """A rated key as a quorum sees it (:func:`.rate_view.peek_rate`)."""

    key: str
    #: Per window: (window, its latest TAT in epoch seconds or None: the window is
    #: booked up to that instant, and admits a start again once it comes).
    windows: tuple[tuple[Window, float | None], ...]
    #: The first instant a new start would get (epoch seconds; with burst 1).
    next_start: float
    #: Nodes that answered.
    answered: int
    #: The recorded starts of the longest period, oldest first (epoch seconds,
    #: the starting clients' clocks): every start a node that answered recorded.
    starts: tuple[float, ...] = ()

    def started(self, period: float, now: float) -> int:
        """How many recorded starts fall in the window of ``period`` seconds up to ``now``."""
        return sum(1 for t in self.starts if now - period < t <= now)


class KindWords(NamedTuple):
    """A kind's words for the tools (``words()`` of its record of what only it reports)."""

    #: What a copy of a node is called.
    copy: str = "replica"
    #: What waiting for a copy (``redlock_min_replicas=1``) does to each grant.
    copy_wait: str = "makes each grant wait for one to confirm it"
    #: What a server's identity (:attr:`NodeInfo.server_id`) is called.
    identity: str = "id"
    #: What one node alone promises (after "ONE node, ").
    alone: str = ""


class RedisInfo(NamedTuple):
    """What only a Redis server reports of itself (:attr:`NodeInfo.specific`)."""

    maxmemory_policy: str = "-"
    maxmemory: int = 0
    #: Whether AOF is on (None if INFO does not say).
    aof: bool | None = None
    #: ``appendfsync`` when AOF is on and CONFIG GET is allowed.
    appendfsync: str | None = None

    @classmethod
    def words(cls, url: str = "") -> KindWords:
        """The kind's words for a node (``url``: a cluster is said to be one)."""
        server = "Redis Cluster" if "+cluster://" in url else "Redis server"
        alone = (
            f"so the locks are only as safe as this one {server}; set redlock_nodes to 3 "
            "or 5 independent masters (or clusters) for a quorum"
        )
        return KindWords(identity="run_id", alone=alone)


class PostgresInfo(NamedTuple):
    """What only a PostgreSQL server reports of itself (:attr:`NodeInfo.specific`):
    the settings its crash promise rests on, as the node's own session sees them."""

    fsync: str = "?"
    synchronous_commit: str = "?"
    full_page_writes: str = "?"
    #: ``synchronous_standby_names`` ("" when none).
    synchronous_standbys: str = ""

    @classmethod
    def words(cls, url: str = "") -> KindWords:
        return _POSTGRES_WORDS


_POSTGRES_WORDS = KindWords(
    copy="standby",
    copy_wait="makes each grant wait for a synchronous standby to apply it",
    identity="system identifier",
    alone="a PostgreSQL database: the locks are as safe as its commits (each grant is on "
    "disk before its task runs, with fsync on); a failover to an asynchronous standby may "
    "lose the last grants (redlock_min_replicas=1 waits for a synchronous one)",
)


class EtcdInfo(NamedTuple):
    """What only an etcd cluster reports of itself (:attr:`NodeInfo.specific`)."""

    #: The cluster's members (the node is the whole cluster).
    members: int = 0
    #: The leader's member name (or id), None when the cluster has none.
    leader: str | None = None

    @property
    def quorum(self) -> int:
        """How many members must agree for a write: a majority."""
        return self.members // 2 + 1

    @classmethod
    def words(cls, url: str = "") -> KindWords:
        return KindWords(identity="cluster id", alone=_agreeing_members("an etcd cluster"))


class ZookeeperInfo(NamedTuple):
    """What only a ZooKeeper ensemble reports of itself (:attr:`NodeInfo.specific`),
    from its members' ``srvr`` four-letter word."""

    #: The ensemble's members in the node's URL (the node is the whole ensemble).
    members: int = 0
    #: The members that told their mode (the others are down or refuse ``srvr``).
    answering: int = 0
    #: The member that leads (host:port; ``standalone`` counts), None when unknown.
    leader: str | None = None
    #: Each member's mode: ``leader``, ``follower``, ``standalone``, ``down``, ``?``.
    modes: tuple[tuple[str, str], ...] = ()

    @property
    def quorum(self) -> int:
        """How many members must agree for a write: a majority."""
        return self.members // 2 + 1

    @classmethod
    def words(cls, url: str = "") -> KindWords:
        return KindWords(alone=_agreeing_members("a ZooKeeper ensemble"))


def _agreeing_members(what: str) -> str:
    """One node of members that agree among themselves (a quorum of its own)."""
    return (
        f"{what}: the locks are as safe as its members' quorum (a minority of members "
        "down changes nothing)"
    )


#: A kind's name (a node's ``kind``) -> the record of what only it reports.
SPECIFIC: dict[str, type[RedisInfo | PostgresInfo | EtcdInfo | ZookeeperInfo]] = {
    "redis": RedisInfo,
    "postgres": PostgresInfo,
    "etcd": EtcdInfo,
    "zookeeper": ZookeeperInfo,
}


class NodeInfo(NamedTuple):
    """How one node is (:meth:`Redlock.node_info`); "-" or None where unknown.

    The fields are every kind's; :attr:`specific` holds what only its kind has
    (:class:`RedisInfo`, :class:`PostgresInfo`, :class:`EtcdInfo`,
    :class:`ZookeeperInfo`)."""

    node: str
    #: Why the node could not be asked, or None.
    error: str | None = None
    #: Seconds the second PING took.
    latency: float = 0.0
    #: ``7.2.4`` on Redis (``valkey X`` on Valkey), ``postgresql X``, ``etcd X``.
    version: str = "-"
    #: ``master`` or ``slave`` on Redis, ``primary`` or ``standby`` on PostgreSQL,
    #: ``cluster`` on etcd, ``ensemble`` on ZooKeeper (their members elect a leader).
    role: str = "-"
    #: The replicas (standbys) attached to a primary, None where the kind has none.
    replicas: int | None = None
    #: The lock node this is a shard master of, when that node is a Redis Cluster.
    cluster: str | None = None
    #: The kind of lock node (:mod:`celery_redlock.core.nodes`): which checks apply.
    kind: str = "redis"
    #: The server's identity (Redis's ``run_id``, PostgreSQL's system identifier,
    #: etcd's cluster id): two nodes with one are one server counted twice.
    server_id: str | None = None
    #: What only this kind reports, or None when the node did not answer.
    specific: RedisInfo | PostgresInfo | EtcdInfo | ZookeeperInfo | None = None

    @property
    def lock_node(self) -> str:
        """The name of the lock node this row is about (the cluster, for a shard)."""
        return self.cluster or self.node
