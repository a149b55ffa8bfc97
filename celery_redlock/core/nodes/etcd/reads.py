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
        cursor, count = int(_text(rest[0])), int(_text(rest[4]))
        match = re.compile(glob_regex(_text(rest[2])), re.DOTALL)
        got = node.post(
            "kv/range",
            {"key": b64(node.prefix), "range_end": b64(_range_end(node.prefix)), "keys_only": True},
            deadline,
        )
        names = [unb64(kv["key"])[len(node.prefix) :] for kv in got.get("kvs", [])]
        names = [n for n in names if match.fullmatch(n.decode(errors="replace"))]
        page = names[cursor : cursor + count]
        after = cursor + len(page) if cursor + len(page) < len(names) else 0
        return [str(after).encode(), page]
    raise NodeError(f"the etcd node does not answer {verb}")
