"""The plain commands on a virtual node (``PING``, ``GET``, ``PTTL``, ``TYPE``, ``DEL``,
``HGETALL``, ``ZRANGE ... WITHSCORES``, ``SCAN``, ``SET`` with its options), with Redis's
reply shapes, over the store's verbs (a read of a key is a one-key commit that
checks it is current)."""

from __future__ import annotations

from typing import Any

from .keyspace import View, score_text
from .store import Store, execute

__all__ = ["plain"]

_TYPES = {"s": b"string", "h": b"hash", "z": b"zset"}


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _bytes(value: Any) -> bytes:
    return value if isinstance(value, bytes) else str(value).encode()


def _type(view: View, key: bytes) -> bytes:
    entry = view.get(key)
    return _TYPES[entry.kind] if entry is not None else b"none"


def _pairs(view: View, key: bytes) -> list[bytes]:
    h = view._hash(key) or {}
    return [x for f, value in h.items() for x in (f, value)]


def _scored(view: View, key: bytes) -> list[bytes]:
    entry = view._zset(key)
    return [x for m, s in (entry.value if entry else []) for x in (m, score_text(s))]


#: The one-key reads: verb -> what it reads off the view.
_ONE_KEY = {
    "GET": View.c_get,
    "PTTL": View.pttl,
    "TYPE": _type,
    "HGETALL": _pairs,
}


def plain(store: Store, cmd: tuple, deadline: float) -> Any:
    """``cmd`` on ``store``: its reply in Redis's shape.

    Raises:
        ConnectionError: a command this kind does not answer.
    """
    verb, *rest = cmd
    verb = _text(verb).upper()
    words = [_text(r).upper() for r in rest]
    if verb == "PING":
        store.ping(deadline)
        return b"PONG"
    if verb == "ZRANGE" and words[1:] == ["0", "-1", "WITHSCORES"]:
        verb = "ZRANGE WITHSCORES"
    read = _ONE_KEY.get(verb) or (_scored if verb == "ZRANGE WITHSCORES" else None)
    if read is not None:
        key = _bytes(rest[0])
        return execute(store, [key], lambda view: read(view, key), deadline)
    if verb == "DEL":
        keys = [_bytes(k) for k in rest]
        return execute(store, keys, lambda view: view.c_del(*keys), deadline)
    if verb == "SET" and len(rest) >= 2:
        key, value, opts = _bytes(rest[0]), _bytes(rest[1]), [_bytes(r) for r in rest[2:]]
        done = execute(store, [key], lambda view: view.c_set(key, value, *opts), deadline)
        return b"OK" if done else None
    if verb == "SCAN" and len(rest) == 5:
        cursor, pattern, count = int(_text(rest[0])), _text(rest[2]), int(_text(rest[4]))
        following, names = store.scan(pattern, cursor, count, deadline)
        return [str(following).encode(), names]
    raise ConnectionError(f"{store.name}: this node does not answer {verb}")
