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

**A kind** is a subpackage (:mod:`.redis`, :mod:`.postgres`, :mod:`.etcd`) that provides:

* ``SCHEMES``: the URL schemes it takes (:data:`KINDS` maps them here, as
  kombu maps URL schemes to transports);
* ``make(spec, timeout, min_replicas, connect_timeout)``: a node from a URL
  (or a client object of its own, see ``accepts``), failing fast on bad input;
* ``accepts(spec)``: whether a non-URL ``spec`` is a client of this kind;
* ``run(op, nodes, keys, args, timeout)``: one round of ``op`` on its
  ``nodes``, at once, within ``timeout``; one reply or exception per node;
* ``command(nodes, command, timeout)``: the same for a plain read;
* ``send(op, nodes, keys, args)``: write a deletion without waiting; the
  indexes of the nodes it was not sent to (the caller runs a round there);
* optionally ``ddl(schema)`` and ``install(node)``: the SQL a node of the kind
  needs before use, and applying it (``celery redlock schema``);
* optionally ``check_ttl(nodes, ttl, option)``: refuse, with a
  ``ConfigurationError``, a TTL its nodes cannot honour (etcd: below its
  minimum lease TTL);
* optionally ``check_together(nodes, names, option)``: refuse, with a
  ``ConfigurationError``, names held together in one call that its nodes
  cannot take in one call (a Redis Cluster: keys of several hash slots);
* ``node_info(node, ask)``: how the node is, as
  :class:`~celery_redlock.core.records.NodeInfo` rows (``ask`` sends a plain
  read to some nodes), for ``celery redlock nodes`` and the dashboard.

A node has ``name`` (its URL, password masked), ``identity`` (equal for two
specs of one server), ``kind`` (the subpackage's name), ``cluster`` (True for
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

import importlib
import queue
import re
import time
from collections.abc import Sequence
from types import ModuleType
from typing import Any, Protocol
from urllib.parse import urlsplit

from ..exceptions import ConfigurationError
from . import codec

__all__ = [
    "KINDS",
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
    "perform",
    "ping_latency",
    "scatter",
    "send",
]

#: URL scheme -> the subpackage of the kind of node it names.
KINDS: dict[str, str] = {
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
}


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


def kind_of(node: Any) -> ModuleType:
    """The subpackage of ``node``'s kind."""
    return importlib.import_module(f"{__name__}.{node.kind}")


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
            known = ", ".join(f"{s}://" for s in KINDS)
            shown = spec.split("@")[-1] if "@" in spec else spec
            raise ConfigurationError(f"lock node URL {shown!r} must start with one of {known}")
        kind = importlib.import_module(f"{__name__}.{KINDS[scheme]}")
    else:
        kind = importlib.import_module(f"{__name__}.redis")
        if not kind.accepts(spec):
            raise ConfigurationError(
                f"a lock node must be a URL or a redis.Redis client, not {type(spec).__name__}"
            )
    return kind.make(spec, timeout, min_replicas, connect_timeout)


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


def perform(op: Any, nodes: Sequence[Any], timeout: float, kind: Any = None) -> list[Any]:
    """Run the operation value ``op`` (:mod:`..ops`) on ``nodes`` at once (as one round of
    ``kind`` when given): one typed result, or the node's error, per node; a
    :class:`NotReplicated` error carries the typed result of its node."""
    script, keys, args = codec.ENCODERS[type(op)](op)
    if script is None:  # a plain read: ``keys`` is its command
        replies = command(nodes, tuple(keys), timeout)
    elif kind is not None:
        replies = kind.run(script, nodes, keys, args, timeout)
    else:
        replies = scatter(script, nodes, keys, args, timeout)
    return codec.decode_all(op, replies, NotReplicated)


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
        kind = kind_of(nodes[at[0]])
        check = getattr(kind, "check_together", None)
        if check is not None:
            check([nodes[i] for i in at], names, option)


def check_ttl(nodes: Sequence[Any], ttl: float, option: str = "redlock_ttl") -> None:
    """Refuse a lock TTL (seconds) that some kind among ``nodes`` cannot honour.

    Raises:
        ConfigurationError: naming ``option``, the node and the kind's minimum.
    """
    for at in _groups(nodes).values():
        kind = kind_of(nodes[at[0]])
        check = getattr(kind, "check_ttl", None)
        if check is not None:
            check([nodes[i] for i in at], ttl, option)


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
