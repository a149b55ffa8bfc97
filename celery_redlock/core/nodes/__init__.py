"""Kinds of lock node, and the one protocol the core speaks to all of them.

A lock node is anything that runs the primitives' operations atomically on the
names of one key. The core (quorum, lease, fencing, permits, claims, rates,
the heartbeat, inspection) never sees a kind: it names an operation and gets
one reply, or the node's error, per node.

**Operations.** An operation is a :class:`~celery_redlock.core.scripts.Script`
record. Its *name* (``"acquire"``, ``"extend"``, ``"release"``, ...) is what
every kind dispatches on, and its contract (the keys, the arguments and the
reply, written above each one in :mod:`celery_redlock.core.scripts`) is what
every kind implements; the record's Lua text is the Redis kind's own
implementation. A reply is built from ints, bytes, ``None`` and lists, so every
kind answers an operation with the same values and the decoders above the
seam (:mod:`~celery_redlock.core.records`) serve them all. A few plain reads
go as commands (``PING``, ``GET``, ``DEL``, ``HGETALL``, ``ZRANGE ...
WITHSCORES``, ``SCAN``, ``SET ... NX PX``), with Redis's reply shapes.

**A kind** is a subpackage (:mod:`.redis`, :mod:`.postgres`, :mod:`.etcd`,
:mod:`.zookeeper`, :mod:`.memory`) whose ``KIND`` is an instance of a subclass of
:class:`~.kind.Kind`, the protocol mypy checks every kind against: ``schemes``
(the URL schemes it takes, which :data:`KINDS` maps to it, as kombu maps URL
schemes to transports), ``make``, ``accepts``, ``run``, ``command``, ``send``
and ``node_info``, and where they apply ``ddl``/``install`` (the SQL a node
needs before use, ``celery redlock schema``), ``check_ttl`` (refuse a TTL its
nodes cannot honour: etcd's minimum lease TTL) and ``check_together`` (refuse
names held together that its nodes cannot take in one call: a Redis Cluster's
hash slots). A kind is imported at its first node, so a kind's client library
is needed only where its nodes are used. Kinds that can only read and
conditionally write (etcd, ZooKeeper, memory) share the primitives' semantics in
:mod:`.virtual`. A kind's ``node_timeout`` and ``connect_timeout`` are its
defaults, in seconds, where ``redlock_node_timeout`` / ``redlock_connect_timeout``
are not set: what one call costs there (:func:`default_timeouts`).

A round (``run``, ``command``) given ``needed`` is decided once that many nodes
answered: the others get as long again as that took or a quarter of
``timeout`` (:func:`cut_at`), then a node still connecting or unanswered gets a
"not answering" error, so a dead minority never holds a round its quorum
decided (what was sent there is released by the protocol or left to its TTL,
as for any node that did not answer).

A node has ``name`` (its URL, password masked), ``identity`` (equal for two
specs of one server), ``kind`` (its kind's name, a key of :data:`KINDS`), ``cluster`` (True for
a Redis Cluster: its keys route by hash slot), ``timeout`` and ``connect_timeout``
(its effective ones), ``members()`` (the servers a
``SCAN`` visits: itself, or a cluster's shard masters) and ``close()``. Every kind fails
fast the same way: ``timeout`` bounds a call, a new connection gets its
``connect_timeout`` first, nothing retries in the client, a node that keeps
timing out is skipped for a while, and an unanswered call is "not answering",
never "free". A write that stands on the node but that its replicas did not
confirm (``redlock_min_replicas``) is answered as a :class:`NotReplicated`
error carrying the node's reply.

:func:`scatter` is the one scatter-gather across kinds: a quorum of one kind
(the common case) is a call of that kind's ``run``; a mixed one runs each
kind's round at once, the others in threads of
:func:`~celery_redlock.core.connect.connector`.
"""

from __future__ import annotations

import difflib
import functools
import queue
import re
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import urlsplit

from ..exceptions import ConfigurationError
from . import codec
from .util import glob_regex, mask_url, ping_latency

if TYPE_CHECKING:
    from .kind import Kind

__all__ = [
    "KINDS",
    "SCHEMES",
    "Node",
    "NodeSpec",
    "NotReplicated",
    "check_together",
    "check_ttl",
    "command",
    "cut_at",
    "default_timeouts",
    "glob_regex",
    "kind_of",
    "kind_timeouts",
    "mask_url",
    "node_for",
    "perform",
    "ping_latency",
    "scatter",
    "send",
]


@functools.cache
def _redis() -> Kind:
    from .redis import KIND

    return KIND


@functools.cache
def _postgres() -> Kind:
    from .postgres import KIND

    return KIND


@functools.cache
def _etcd() -> Kind:
    from .etcd import KIND

    return KIND


@functools.cache
def _zookeeper() -> Kind:
    from .zookeeper import KIND

    return KIND


@functools.cache
def _memory() -> Kind:
    from .memory import KIND

    return KIND


#: URL scheme -> the name of the kind of node it names (a node's ``kind``).
SCHEMES: dict[str, str] = {
    "redis": "redis",
    "rediss": "redis",
    "unix": "redis",
    "sentinel": "redis",
    "redis+cluster": "redis",
    "rediss+cluster": "redis",
    "postgresql": "postgres",
    "postgres": "postgres",
    "etcd": "etcd",
    "etcds": "etcd",
    "zookeeper": "zookeeper",
    "memory": "memory",
}
_LOADERS: dict[str, Callable[[], Kind]] = {
    "redis": _redis,
    "postgres": _postgres,
    "etcd": _etcd,
    "zookeeper": _zookeeper,
    "memory": _memory,
}
#: URL scheme (and a node's ``kind``) -> its kind, imported at first use.
KINDS: dict[str, Callable[[], Kind]] = {scheme: _LOADERS[name] for scheme, name in SCHEMES.items()}


#: What names a lock node: a URL, or a client object a kind accepts (a ``redis.Redis``).
NodeSpec = Any


class Node(Protocol):
    """What the core sees of a node of any kind (see the module's docstring)."""

    name: str
    kind: str
    cluster: bool
    #: Seconds a new connection gets to open; None: the round's timeout.
    connect_timeout: float | None

    @property
    def identity(self) -> Any: ...

    def members(self) -> Sequence[Any]: ...

    def close(self) -> None: ...


class NotReplicated(Exception):
    """A node's write that its replicas did not confirm in time: it does not count.

    Attributes:
        reply: the node's reply to the operation, which stands only on the primary.
        confirmed: how many replicas confirmed it.
    """

    def __init__(self, message: str, reply: Any = None, confirmed: int = 0):
        super().__init__(message)
        self.reply = reply
        self.confirmed = confirmed


def kind_of(node: Any) -> Kind:
    """``node``'s kind."""
    return KINDS[node.kind]()


def _kind_for(spec: Any) -> Kind | None:
    """The kind ``spec`` names (a URL; any other object: Redis), or None for a URL of no kind."""
    if not isinstance(spec, str):
        return _redis()
    scheme = urlsplit(spec).scheme
    return KINDS[scheme]() if scheme in KINDS else None


def kind_timeouts(kind: str) -> tuple[float, float]:
    """The default node timeout and connect timeout of the kind named ``kind``
    (``"redis"``, ``"postgres"``, ``"etcd"``, ...)."""
    found = KINDS[kind]()
    return found.node_timeout, found.connect_timeout


def default_timeouts(specs: Sequence[Any]) -> tuple[float, float]:
    """The longest of the default node timeouts and of the default connect
    timeouts of the kinds of ``specs`` (their nodes each take their own kind's)."""
    kinds = [kind for kind in map(_kind_for, specs) if kind is not None] or [_redis()]
    return max(k.node_timeout for k in kinds), max(k.connect_timeout for k in kinds)


def node_for(
    spec: Any,
    timeout: float | None,
    min_replicas: int = 0,
    connect_timeout: float | None = None,
) -> Any:
    """The node that ``spec`` (a URL, or a client object a kind accepts) names;
    a timeout left None is its kind's default (``node_timeout``, ``connect_timeout``).

    Raises:
        ConfigurationError: the URL's scheme names no kind, or the kind refuses it.
    """
    if isinstance(spec, str):
        scheme = urlsplit(spec).scheme
        if scheme not in KINDS:
            raise ConfigurationError(_unknown_scheme(spec))
        kind = KINDS[scheme]()
    else:
        kind = _redis()
        if not kind.accepts(spec):
            raise ConfigurationError(
                f"a lock node must be a URL or a redis.Redis client, not {type(spec).__name__}"
            )
    if timeout is None:
        timeout = kind.node_timeout
    if connect_timeout is None:
        connect_timeout = kind.connect_timeout
    return kind.make(spec, timeout, min_replicas, connect_timeout)


#: Other projects' spellings of a scheme (kombu's unix socket URL, a Sentinel URL).
_OTHER_SPELLINGS = {"redis+socket": "unix", "socket": "unix", "redis+sentinel": "sentinel"}
# user:password@ at the start of a URL without a scheme ("app:pw@db:5432/x").
_BARE_PASSWORD = re.compile(r"^([^:/@\s]*:)[^\s/]+@")


def _unknown_scheme(url: str) -> str:
    """Why ``url`` names no kind of node: the URL itself (password masked), the
    scheme it most likely meant, and the schemes there are."""
    shown = mask_url(url) if "://" in url else _BARE_PASSWORD.sub(r"\1***@", url)
    known = ", ".join(f"{s}://" for s in SCHEMES)
    if "://" not in url:
        return f"lock node URL {shown!r} has no scheme: it must start with one of {known}"
    scheme, rest = url.split("://", 1)
    parts = scheme.lower().split("+")
    # SQLAlchemy's postgresql+psycopg://, Celery's db+postgresql://: a driver or a
    # backend named beside the database. A node takes libpq's URL (it speaks
    # through psycopg 3 whatever the name), so one spelling names one node in
    # every log line and in `celery redlock nodes`.
    if len(parts) > 1 and {SCHEMES.get(part) for part in parts} - {None} == {"postgres"}:
        return (
            f"lock node URL {shown!r} names a driver or a backend ({scheme}://): a "
            f"PostgreSQL lock node takes libpq's URL, write {mask_url('postgresql://' + rest)!r}"
        )
    near = _OTHER_SPELLINGS.get(scheme.lower()) or next(
        iter(difflib.get_close_matches(scheme.lower(), list(SCHEMES), n=1, cutoff=0.6)), None
    )
    meant = f": unknown scheme {scheme}://, did you mean {near}://? It" if near else ""
    return f"lock node URL {shown!r}{meant} must start with one of {known}"


_MISSING = object()

#: Seconds, at least, a decided round still waits for its other nodes: a busy
#: host's healthy node a few scheduler slices behind the others still answers.
GRACE = 0.02


def cut_at(started: float, now: float, timeout: float) -> float:
    """When a round started at ``started``, of ``timeout`` seconds per node, and
    decided (a quorum answered) at ``now`` stops waiting for its other nodes:
    after as long again as the quorum took, or a quarter of the timeout (the
    lateness its user allows a healthy node), at least :data:`GRACE`; never
    after the round's own deadline (the caller's). A dead node then costs the
    round nothing like a connect budget, and the healthy ones, answering
    together, are all heard."""
    return now + max(now - started, timeout / 4, GRACE)


def _groups(nodes: Sequence[Any]) -> dict[str, list[int]]:
    groups: dict[str, list[int]] = {}
    for i, node in enumerate(nodes):
        groups.setdefault(node.kind, []).append(i)
    return groups


def _timeout(nodes: Sequence[Any], at: Sequence[int], timeout: float | None) -> float:
    """The round's timeout for the nodes ``at`` of one kind: their own (the
    setting, or their kind's default), no longer than ``timeout`` if given."""
    own = max(nodes[i].timeout for i in at)
    return own if timeout is None else min(own, timeout)


def _shares(needed: int | None, sizes: Sequence[int]) -> list[int | None]:
    """The answers that end each kind's part of a mixed round: the nodes allowed
    not to answer (total - ``needed``) shared out in proportion, rounded down,
    so that the parts ending on their own still add up to ``needed``."""
    if needed is None:
        return [None] * len(sizes)
    total = sum(sizes)
    spare = total - needed
    return [size - spare * size // total for size in sizes]


def _spread(
    nodes: Sequence[Any], timeout: float | None, needed: int | None, call: Any
) -> list[Any]:
    """``call(kind, nodes, timeout, needed)`` for each kind among ``nodes`` at
    once, replies in the order of ``nodes``: the first kind in this thread, the
    others in threads of the connector. Each kind gets its nodes' own timeout
    (no longer than ``timeout``) and its share of ``needed``; once the kinds
    done have ``needed`` answers, a kind still running past :func:`cut_at`
    (or one that has not answered by the deadline: it never should, each
    bounds its own round) is "not answering" on its nodes."""
    from ..connect import connector

    groups = _groups(nodes)
    if len(groups) == 1:
        return call(kind_of(nodes[0]), nodes, _timeout(nodes, range(len(nodes)), timeout), needed)
    replies: list[Any] = [_MISSING] * len(nodes)
    done: queue.SimpleQueue = queue.SimpleQueue()

    def one(at: list[int], share: int | None) -> None:
        try:
            some = [nodes[i] for i in at]
            got = call(kind_of(some[0]), some, _timeout(nodes, at, timeout), share)
        except Exception as exc:  # a kind's bug must not hang the round
            got = [exc] * len(at)
        done.put((at, got))

    started = time.monotonic()
    first, *rest = groups.values()
    shares = _shares(needed, [len(at) for at in groups.values()])
    for at, share in zip(rest, shares[1:]):
        connector().submit(one, at, share)
    one(first, shares[0])
    # each kind bounds its round by a new connection's budget plus its timeout
    budget = max(node.connect_timeout for node in nodes)
    longest = max(_timeout(nodes, at, timeout) for at in groups.values())
    deadline = time.monotonic() + budget + longest + 1.0
    answered, until = 0, deadline
    for _ in groups:
        now = time.monotonic()
        if needed is not None and answered >= needed:
            until = min(until, cut_at(started, now, longest))
        try:
            at, got = done.get(timeout=max(until - now, 0.001))
        except queue.Empty:
            break
        for i, reply in zip(at, got):
            replies[i] = reply
            answered += not isinstance(reply, Exception)
    for i, node in enumerate(nodes):
        if replies[i] is _MISSING:
            limit = _timeout(nodes, [i], timeout)
            replies[i] = TimeoutError(f"{node.name}: no reply in {limit:g}s")
    return replies


def scatter(
    op: Any,
    nodes: Sequence[Any],
    keys: Sequence[str],
    args: Sequence[Any],
    timeout: float | None = None,
    needed: int | None = None,
) -> list[Any]:
    """Run ``op`` on ``nodes`` at once: one reply or exception per node. Each
    node's kind gets its nodes' timeout (no longer than ``timeout``, if given);
    ``needed``: the answers that end the round (see the module's docstring)."""
    return _spread(
        nodes, timeout, needed, lambda kind, some, t, n: kind.run(op, some, keys, args, t, n)
    )


def perform(
    op: Any,
    nodes: Sequence[Any],
    timeout: float | None,
    kind: Any = None,
    needed: int | None = None,
) -> list[Any]:
    """Run the operation value ``op`` (:mod:`..ops`) on ``nodes`` at once (as one round of
    ``kind`` when given): one typed result, or the node's error, per node; a
    :class:`NotReplicated` error carries the typed result of its node. ``timeout``
    None: each node's own; ``needed``: the answers that decide the round."""
    encode, decode = codec.PLANS[type(op)]  # one look-up per call: both halves
    script, keys, args = encode(op)
    if script is None:  # a plain read: ``keys`` is its command
        replies = command(nodes, tuple(keys), timeout, needed)
    elif kind is not None:
        limit = timeout if timeout is not None else max(node.timeout for node in nodes)
        replies = kind.run(script, nodes, keys, args, limit, needed)
    else:
        replies = scatter(script, nodes, keys, args, timeout, needed)
    try:
        return decode(op, replies, NotReplicated)
    except (TypeError, ValueError, IndexError, KeyError):  # one reply is not op's: each alone
        return codec.decode_each(op, replies, NotReplicated)


def command(
    nodes: Sequence[Any], cmd: tuple, timeout: float | None = None, needed: int | None = None
) -> list[Any]:
    """Send the plain read ``cmd`` to ``nodes`` at once: one reply or exception per node."""
    return _spread(nodes, timeout, needed, lambda kind, some, t, n: kind.command(some, cmd, t, n))


def send(op: Any, nodes: Sequence[Any], keys: Sequence[str], args: Sequence[Any]) -> list[int]:
    """Write ``op`` (a deletion) to ``nodes`` without waiting; the indexes of the
    nodes it was not sent to, for the caller to run a round on."""
    missed: list[int] = []
    for at in _groups(nodes).values():
        some = [nodes[i] for i in at]
        missed += [at[j] for j in kind_of(some[0]).send(op, some, keys, args)]
    return sorted(missed)


def check_together(nodes: Sequence[Any], names: Sequence[str], option: str = "also") -> None:
    """Refuse names held together in one call (``also``, ``lock_also``, a rate's
    windows) that some kind among ``nodes`` cannot take in one call.

    Raises:
        ConfigurationError: naming ``option``, the node and the fix.
    """
    for at in _groups(nodes).values():
        kind_of(nodes[at[0]]).check_together([nodes[i] for i in at], names, option)


def check_ttl(nodes: Sequence[Any], ttl: float, option: str = "redlock_ttl") -> None:
    """Refuse a lock TTL (seconds) that some kind among ``nodes`` cannot honour.

    Raises:
        ConfigurationError: naming ``option``, the node and the kind's minimum.
    """
    for at in _groups(nodes).values():
        kind_of(nodes[at[0]]).check_ttl([nodes[i] for i in at], ttl, option)
