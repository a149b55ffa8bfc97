"""Values as they cross a PostgreSQL node's connection: arguments as a text[]
literal, JSON replies in Redis's shapes, and results read without blocking."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["redis_shaped", "results_read", "text_array"]


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
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, list):
        return [redis_shaped(v) for v in value]
    if isinstance(value, bool):
        return 1 if value else None
    return value


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
