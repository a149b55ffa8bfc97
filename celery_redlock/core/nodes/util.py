"""Text and timing helpers every kind and the tools share: a node URL with its
password masked, a ``SCAN`` glob as a regular expression, a node's latency."""

from __future__ import annotations

import re
import time
from typing import Any

__all__ = ["glob_regex", "mask_url", "ping_latency"]

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
