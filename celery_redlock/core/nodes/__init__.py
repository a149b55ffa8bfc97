"""Kinds of lock node, and the one seam the core speaks to all of them.

A lock node is anything that runs the primitives' operations atomically on the
names of one key. The core (quorum, lease, fencing, permits, claims, rates,
the heartbeat, inspection) never sees a kind: it builds an operation value
(:mod:`celery_redlock.core.ops`), hands it to :func:`perform` with the nodes,
and gets one typed result, or the node's error, per node.

**Under the seam.** The codec (:mod:`.codec`) is the one place that turns an
operation into what the kinds run, a Lua script of :mod:`.scripts` with its
KEYS and ARGV (a plain read: a Redis command), and the kinds' Lua-shaped
replies back into results, so every kind answers with the same values.

**A kind** is a subpackage (:mod:`.redis`, :mod:`.postgres`, :mod:`.etcd`,
:mod:`.zookeeper`, :mod:`.memory`) whose ``KIND`` implements the protocol of
:mod:`.kind`, which mypy checks: ``schemes`` (mapped by :data:`SCHEMES` and
:data:`KINDS`), ``make``, ``accepts``, ``run``, ``command``, ``send``,
``node_info`` and, where they apply, ``ddl``/``install``, ``check_ttl`` and
``check_together``. A kind is imported at its first node, so its client library
is needed only where its nodes are used. Redis runs the scripts itself,
PostgreSQL runs them rewritten as SQL functions, and the kinds that can only
read and conditionally write (etcd, ZooKeeper, memory) run the same Lua over a
few store verbs in :mod:`.virtual`. A kind's ``node_timeout`` and
``connect_timeout`` are its defaults where the settings are not given
(:func:`default_timeouts`).

**Rounds.** A round (``run``, ``command``) given ``needed`` is decided once
that many nodes answered: the others get until :func:`cut_at`, then are "not
answering", so a dead minority never holds a round its quorum decided. A
quorum of one kind is one ``run`` of that kind; a mixed one runs each kind's
part at once (:func:`scatter`).

**Fail-fast.** ``timeout`` bounds a call, a new connection gets its
``connect_timeout`` first, nothing retries in the client, a node that keeps
timing out is skipped for a while, and an unanswered call is "not answering",
never "free". A write its replicas did not confirm (``redlock_min_replicas``)
is a :class:`NotReplicated` error carrying the node's reply.
"""

from __future__ import annotations

import difflib
import functools
import importlib
import queue
import re
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import urlsplit

from ..exceptions import ConfigurationError
from . import codec
from .util import glob_regex, mask_url, node_error, ping_latency

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
    "next_reply",
    "node_error",
    "node_for",
    "perform",
    "ping_latency",
    "scatter",
    "send",
]


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


def _loader(name: str) -> Callable[[], Kind]:
    """The kind named ``name`` (its subpackage's ``KIND``), imported at the first call."""
    return functools.cache(lambda: importlib.import_module(f"{__name__}.{name}").KIND)


_LOADERS = {name: _loader(name) for name in dict.fromkeys(SCHEMES.values())}
#: URL scheme (and a node's ``kind``) -> its kind, imported at first use.
KINDS: dict[str, Callable[[], Kind]] = {scheme: _LOADERS[name] for scheme, name in SCHEMES.items()}


#: What names a lock node: a URL, or a client object a kind accepts (a ``redis.Redis``).
NodeSpec = Any


class Node(Protocol):
    """What the core sees of a node of any kind: ``name`` (its URL, password
    masked), ``identity`` (equal for two specs of one server), ``kind`` (a key of
    :data:`KINDS`), ``cluster`` (a Redis Cluster: its keys route by hash slot),
    ``timeout`` and ``connect_timeout`` (its effective ones), ``members()`` (the
    servers a ``SCAN`` visits: itself, or a cluster's shard masters), ``close()``."""

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
        return KINDS["redis"]()
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
    kinds = [kind for kind in map(_kind_for, specs) if kind is not None] or [KINDS["redis"]()]
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
        kind = KINDS["redis"]()
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


def next_reply(
    done: queue.SimpleQueue, started: float, until: float, decided: bool, timeout: float
) -> tuple[Any, float]:
    """The next item put on ``done`` by a round's threads, waited for until ``until``
    or, once the round is ``decided``, until :func:`cut_at` if that is sooner: the
    item (None if none came in time) and the wait's end, for the next call."""
    now = time.monotonic()
    if decided:
        until = min(until, cut_at(started, now, timeout))
    try:
        return done.get(timeout=max(until - now, 0.001)), until
    except queue.Empty:
        return None, until


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
        item, until = next_reply(
            done, started, until, needed is not None and answered >= needed, longest
        )
        if item is None:
            break
        at, got = item
        for i, reply in zip(at, got):
            replies[i] = reply
            answered += not isinstance(reply, Exception)
    for i, node in enumerate(nodes):
        if replies[i] is _MISSING:
            limit = _timeout(nodes, [i], timeout)
            replies[i] = TimeoutError(f"{node.name}: no reply in {limit:g}s")
    return replies


def scatter(
    call: codec.Call, nodes: Sequence[Any], timeout: float | None = None, needed: int | None = None
) -> list[Any]:
    """Run ``call`` (a script, its KEYS and ARGV) on ``nodes`` at once: one reply or
    exception per node. Each node's kind gets its nodes' timeout (no longer than
    ``timeout``, if given); ``needed``: the answers that end the round (see the
    module's docstring)."""
    return _spread(nodes, timeout, needed, lambda kind, some, t, n: kind.run(call, some, t, n))


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
    call = encode(op)
    if call[0] is None:  # a plain read: the KEYS' place holds its command
        replies = command(nodes, tuple(call[1]), timeout, needed)
    elif kind is not None:
        limit = timeout if timeout is not None else max(node.timeout for node in nodes)
        replies = kind.run(call, nodes, limit, needed)
    else:
        replies = scatter(call, nodes, timeout, needed)
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
