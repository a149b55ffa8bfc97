"""Values as they cross a PostgreSQL node's connection: arguments as a text[]
literal, JSON replies in Redis's shapes, and results read without blocking."""

from __future__ import annotations

import json
from collections.abc import Sequence
from json.scanner import make_scanner
from typing import Any

__all__ = ["json_value", "redis_shaped", "results_read", "text_array"]


def text_array(items: Sequence[Any]) -> bytes:
    """A PostgreSQL text[] literal of ``items``, each encoded as redis-py would
    send it (bytes as UTF-8, numbers as their repr)."""
    out = []
    for item in items:
        s = (
            item.decode()
            if isinstance(item, bytes)
            else repr(item)
            if isinstance(item, float)
            else str(item)
        )
        out.append('"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"')
    return ("{" + ",".join(out) + "}").encode()


def redis_shaped(value: Any) -> Any:
    """A JSON reply as a Redis reply: strings as bytes, true as 1, false and null as None."""
    kind = value.__class__
    if kind is str:
        return value.encode()
    if kind is list:  # a lock call's reply is a flat list: its items shaped in place
        return [
            v.encode() if v.__class__ is str else v if v.__class__ is int else redis_shaped(v)
            for v in value
        ]
    if kind is bool:
        return 1 if value else None
    return value


#: The C scanner of the ``json`` module: a reply's one value without the four
#: Python calls of ``json.loads`` around it (every lock call reads one).
_scan = make_scanner(json.JSONDecoder())  # type: ignore[arg-type]


def json_value(raw: bytes) -> Any:
    """The JSON value ``raw`` (a column's text)."""
    try:
        return _scan(raw.decode(), 0)[0]
    except StopIteration:
        return json.loads(raw)  # raises the JSON error that says what is wrong


def results_read(conn: Any, results: list[Any]) -> bool:
    """Append to ``results`` what has arrived; True once the last one is read.

    ``get_result`` is only called while a result is ready: once the next one
    is incomplete (a reply cut off part-way), libpq would wait for the rest
    with no timeout, so the caller polls for it instead."""
    conn.consume_input()
    while not conn.is_busy():
        res = conn.get_result()
        if res is None:
            return True
        results.append(res)
    return False
