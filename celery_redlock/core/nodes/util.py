"""Text and timing helpers every kind and the tools share: a node URL with its
password masked, a ``SCAN`` glob as a regular expression, a node's latency."""

from __future__ import annotations

import re
import time
from collections.abc import Iterable, Sequence
from typing import Any, TypeVar
from urllib.parse import parse_qsl

from ..exceptions import ConfigurationError, NodeError, RedlockError
from ..values import error_text

__all__ = [
    "node_error",
    "OneNode",
    "glob_regex",
    "host_ports",
    "mask_url",
    "matching",
    "ping_latency",
    "refuse_min_replicas",
    "url_options",
]

T = TypeVar("T")

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


def matching(pattern: str, names: Iterable[bytes]) -> list[bytes]:
    """The ``names`` a ``SCAN ... MATCH`` glob matches, in their order."""
    match = re.compile(glob_regex(pattern), re.DOTALL)
    return [name for name in names if match.fullmatch(name.decode(errors="replace"))]


def host_ports(where: str, netloc: str, port_hint: str) -> list[str]:
    """The ``host:port,...`` of a URL's ``netloc`` (after any ``user:password@``).

    Raises:
        ConfigurationError: one is not host:port (``port_hint`` says which port
            it should be), or there is none; ``where`` names the node.
    """
    hosts = [h for h in netloc.rsplit("@", 1)[-1].split(",") if h]
    for hostport in hosts:
        host, _, port = hostport.rpartition(":")
        if not host or not port.isdigit():
            raise ConfigurationError(f"{where}: {hostport!r} must be host:port ({port_hint})")
    if not hosts:
        raise ConfigurationError(f"{where}: no host:port in the URL")
    return hosts


def url_options(where: str, query: str, known: Sequence[str]) -> dict[str, str]:
    """A URL's query options, refusing one not ``known`` (``where`` names the node)."""
    options = dict(parse_qsl(query))
    unknown = set(options) - set(known)
    if unknown:
        raise ConfigurationError(
            f"{where}: unknown option(s) {', '.join(sorted(unknown))} (known: {', '.join(known)})"
        )
    return options


def refuse_min_replicas(where: str, min_replicas: int, why: str) -> None:
    """Refuse ``redlock_min_replicas`` on a node it cannot apply to, saying ``why``."""
    if min_replicas:
        raise ConfigurationError(f"{where}: redlock_min_replicas does not apply ({why})")


class OneNode:
    """A lock node that is one server or one ensemble, not a cluster's shards:
    the one member a scan visits is itself."""

    name: str
    cluster = False

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name}>"

    def members(self) -> list[Any]:
        return [self]

    def connecting(self) -> bool:
        """Whether its next call opens its connection (or session) first: a round
        gives it its connect budget on top of the call's timeout."""
        return False


def node_error(error: BaseException) -> BaseException:
    """A node's error as the core sees it: the core's own errors (a :class:`NodeError`,
    a node refused as misconfigured) as they are; a kind's client error (redis-py's,
    psycopg's, kazoo's, a timeout) as a :class:`NodeError` of the same text, raised
    from it, so that nothing above the seam names a kind's library."""
    if isinstance(error, RedlockError):
        return error
    wrapped = NodeError(error_text(error))
    wrapped.__cause__ = error
    return wrapped
