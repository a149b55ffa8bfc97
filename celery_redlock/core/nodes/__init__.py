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
:mod:`.virtual`.

A node has ``name`` (its URL, password masked), ``identity`` (equal for two
specs of one server), ``kind`` (its kind's name, a key of :data:`KINDS`), ``cluster`` (True for
a Redis Cluster: its keys route by hash slot), ``connect_timeout``, ``members()`` (the servers a
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
    "glob_regex",
    "kind_of",
    "mask_url",
    "node_for",
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


# user:password@ (greedy: a password may contain "@"; a "/" or a space ends the
# URL), and a password given in the query string.
_URL_PASSWORD = re.compile(r"(://[^:/@\s,]*:)[^\s/]+@")
_QUERY_PASSWORD = re.compile(r"(password=)[^&\s]+", re.IGNORECASE)


def glob_regex(pattern: str) -> str:
    """A ``SCAN ... MATCH`` glob (``*``, ``?``, ``[...]``, ``[^...]``, backslash
    escapes) as a regular expression that Python's ``re`` and PostgreSQL's
    ``~`` read alike, to be matched against a whole key."""
    out, i = [], 0
    while i < len(pattern):
        c = pattern[i]
        if c == "\\" and i + 1 < len(pattern):
            out.append(re.escape(pattern[i + 1]))
            i += 1
        elif c == "*":
            out.append(".*")
        elif c == "?":
            out.append(".")
        elif c == "[" and "]" in pattern[i + 1 :]:
            end = pattern.index("]", i + 2 if pattern[i + 1 : i + 2] == "]" else i + 1)
            body = pattern[i + 1 : end]
            negate = body.startswith("^")
            body = "".join("\\" + ch if ch in "\\]^" else ch for ch in body[negate:])
            out.append("[" + ("^" if negate else "") + body + "]")
            i = end
        else:
            out.append(re.escape(c))
        i += 1
    return "".join(out)


def mask_url(text: str) -> str:
    """``text`` with the password of every lock node URL in it replaced by ``***``.

    For messages and logs: ``redis://user:pw@h``, ``unix:///s?password=pw`` and
    ``postgresql://user:pw@h/db`` alike, one URL or a list of them.
    """
    return _QUERY_PASSWORD.sub(r"\1***", _URL_PASSWORD.sub(r"\1***@", text))


def kind_of(node: Any) -> Kind:
    """``node``'s kind."""
    return KINDS[node.kind]()


def node_for(
    spec: Any, timeout: float, min_replicas: int = 0, connect_timeout: float | None = None
) -> Any:
    """The node that ``spec`` (a URL, or a client object a kind accepts) names.

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


def _groups(nodes: Sequence[Any]) -> dict[str, list[int]]:
    groups: dict[str, list[int]] = {}
    for i, node in enumerate(nodes):
        groups.setdefault(node.kind, []).append(i)
    return groups


def _spread(nodes: Sequence[Any], timeout: float, call: Any) -> list[Any]:
    """``call(kind, nodes)`` for each kind among ``nodes`` at once, replies in
    the order of ``nodes``: the first kind in this thread, the others in
    threads of the connector; a kind that has not answered by the deadline
    (it never should: each bounds its own round) is a timeout on its nodes."""
    from ..connect import connector

    groups = _groups(nodes)
    if len(groups) == 1:
        return call(kind_of(nodes[0]), nodes)
    replies: list[Any] = [_MISSING] * len(nodes)
    done: queue.SimpleQueue = queue.SimpleQueue()

    def one(at: list[int]) -> None:
        try:
            got = call(kind_of(nodes[at[0]]), [nodes[i] for i in at])
        except Exception as exc:  # a kind's bug must not hang the round
            got = [exc] * len(at)
        done.put((at, got))

    first, *rest = groups.values()
    for at in rest:
        connector().submit(one, at)
    one(first)
    # each kind bounds its round by a new connection's budget plus ``timeout``
    budget = max((node.connect_timeout or timeout) for node in nodes)
    deadline = time.monotonic() + budget + timeout + 1.0
    for _ in groups:
        try:
            at, got = done.get(timeout=max(deadline - time.monotonic(), 0.001))
        except queue.Empty:
            break
        for i, reply in zip(at, got):
            replies[i] = reply
    for i, node in enumerate(nodes):
        if replies[i] is _MISSING:
            replies[i] = TimeoutError(f"{node.name}: no reply in {timeout:g}s")
    return replies


def scatter(
    op: Any, nodes: Sequence[Any], keys: Sequence[str], args: Sequence[Any], timeout: float
) -> list[Any]:
    """Run ``op`` on ``nodes`` at once: one reply or exception per node."""
    return _spread(nodes, timeout, lambda kind, some: kind.run(op, some, keys, args, timeout))


def command(nodes: Sequence[Any], cmd: tuple, timeout: float) -> list[Any]:
    """Send the plain read ``cmd`` to ``nodes`` at once: one reply or exception per node."""
    return _spread(nodes, timeout, lambda kind, some: kind.command(some, cmd, timeout))


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


def ping_latency(node: Any, ask: Any) -> tuple[float, Exception | None]:
    """The seconds a ``PING`` of ``node`` took (the second one: the first pays for
    connecting), and its error if it failed; ``ask`` as in ``node_info``."""
    latency = 0.0
    for _ in range(2):
        started = time.perf_counter()
        pong = ask(("PING",), [node])[0]
        latency = time.perf_counter() - started
        if isinstance(pong, Exception):
            return latency, pong
    return latency, None
