"""The plain commands on an etcd node (``PING``, ``GET``, ``PTTL``, ``TYPE``, ``DEL``,
``HGETALL``, ``ZRANGE ... WITHSCORES``, ``SCAN``, ``SET ... NX PX``), with Redis's
reply shapes. Reads are etcd's linearizable reads: a member that lost its
quorum does not answer them."""

from __future__ import annotations

import re
from typing import Any

from .. import glob_regex
from .keyspace import View, score_text
from .node import EtcdNode, NodeError, b64, unb64
from .store import execute

__all__ = ["plain"]

_TYPES = {"s": b"string", "h": b"hash", "z": b"zset"}


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _bytes(value: Any) -> bytes:
    return value if isinstance(value, bytes) else str(value).encode()


def _range_end(prefix: bytes) -> bytes:
    """The end of the range of keys starting with ``prefix``."""
    end = bytearray(prefix)
    while end and end[-1] == 0xFF:
        end.pop()
    if not end:
        return b"\0"
    end[-1] += 1
    return bytes(end)


def _on_view(node: EtcdNode, key: bytes, deadline: float, read: Any) -> Any:
    """A read of one key through a view (a one-key Txn that checks it is current)."""
    return execute(node, [key], lambda view: read(view), deadline)


def plain(node: EtcdNode, cmd: tuple, deadline: float) -> Any:
    verb, *rest = cmd
    verb = _text(verb).upper()
    if verb == "PING":
        node.post("kv/range", {"key": b64(node.prefix), "limit": 1, "keys_only": True}, deadline)
        return b"PONG"
    if verb == "GET":
        return _on_view(node, _bytes(rest[0]), deadline, lambda v: v.c_get(_bytes(rest[0])))
    if verb == "PTTL":
        return _on_view(node, _bytes(rest[0]), deadline, lambda v: v.pttl(_bytes(rest[0])))
    if verb == "TYPE":

        def kind(view: View) -> bytes:
            entry = view.get(_bytes(rest[0]))
            return _TYPES[entry.kind] if entry is not None else b"none"

        return _on_view(node, _bytes(rest[0]), deadline, kind)
    if verb == "DEL":
        keys = [_bytes(k) for k in rest]
        return execute(node, keys, lambda view: view.c_del(*keys), deadline)
    if verb == "HGETALL":

        def pairs(view: View) -> list[bytes]:
            h = view._hash(_bytes(rest[0])) or {}
            return [x for f, value in h.items() for x in (f, value)]

        return _on_view(node, _bytes(rest[0]), deadline, pairs)
    if verb == "ZRANGE" and [_text(r).upper() for r in rest[1:]] == ["0", "-1", "WITHSCORES"]:

        def scored(view: View) -> list[bytes]:
            entry = view._zset(_bytes(rest[0]))
            return [x for m, s in (entry.value if entry else []) for x in (m, score_text(s))]

        return _on_view(node, _bytes(rest[0]), deadline, scored)
    if verb == "SET" and len(rest) == 5 and [_text(r).upper() for r in rest[2:4]] == ["NX", "PX"]:
        key = _bytes(rest[0])
        opts = [b"NX", b"PX", _bytes(rest[4])]
        done = execute(node, [key], lambda view: view.c_set(key, _bytes(rest[1]), *opts), deadline)
        return b"OK" if done else None
    if verb == "SCAN" and len(rest) == 5:
        return _scan(node, int(_text(rest[0])), _text(rest[2]), int(_text(rest[4])), deadline)
    raise NodeError(f"the etcd node does not answer {verb}")


def _literal_head(pattern: str) -> str:
    """What every key ``pattern`` (a ``SCAN ... MATCH`` glob) matches starts with: the
    pattern up to its first wildcard, escapes undone."""
    head, i = [], 0
    while i < len(pattern) and pattern[i] not in "*?[":
        if pattern[i] == "\\" and i + 1 < len(pattern):
            i += 1
        head.append(pattern[i])
        i += 1
    return "".join(head)


def _scan(node: EtcdNode, cursor: int, pattern: str, count: int, deadline: float) -> list[Any]:
    """One page of at most ``count`` keys matching ``pattern``: a range read from the
    cursor's key on, within the keys that start with the pattern's literal head, so
    a page costs its ``count`` keys, never the whole key space (a dashboard sends
    one page per family per refresh). The cursor is the key to go on from, after
    the head, as a number, as Redis's cursors are (0: from the start; ``0x01``
    before the bytes keeps their leading zero bytes)."""
    head = node.prefix + _literal_head(pattern).encode()
    start = head + cursor.to_bytes((cursor.bit_length() + 7) // 8, "big")[1:]
    got = node.post(
        "kv/range",
        {"key": b64(start), "range_end": b64(_range_end(head)), "keys_only": True,
         "limit": count + 1},
        deadline,
    )  # fmt: skip
    keys = [unb64(kv["key"]) for kv in got.get("kvs", [])]
    page, after = keys[:count], keys[count:]
    match = re.compile(glob_regex(pattern), re.DOTALL)
    names = [k[len(node.prefix) :] for k in page]
    names = [n for n in names if match.fullmatch(n.decode(errors="replace"))]
    following = int.from_bytes(b"\x01" + after[0][len(head) :], "big") if after else 0
    return [str(following).encode(), names]
