"""A lock node's keys on a ZooKeeper ensemble, read and written as tests read a
Redis node's: each key a znode under ``/redlock`` (its name percent-encoded)
holding a JSON record ``{"t": type, "v": value, "e": expiry ms, "p": ttl ms}``,
the expiry on the ensemble's clock (the ``mtime`` of a write of the root)."""

from __future__ import annotations

import fnmatch
import json
from typing import Any
from urllib.parse import quote, unquote

from .record_keys import RecordKeys

__all__ = ["Keys"]

ROOT = "/redlock"


def _name(key: str) -> str:
    name = quote(key.encode(), safe=":@")
    return "%2E" + name[1:] if name.startswith(".") else name


class Keys(RecordKeys):
    """An ensemble's keys with the calls of a decoded redis-py client that tests use
    (``get``, ``set``, ``pttl``, ``exists``, ``delete``, ``keys``, ``scan_iter``,
    ``zrange``, ``zcard``, ``time``, and ``set_many`` for many keys at once)."""

    def __init__(self, hosts: str) -> None:
        from kazoo.client import KazooClient

        self.client = KazooClient(hosts=hosts, timeout=4.0)
        self.client.start(timeout=10)
        self.client.ensure_path(ROOT)

    def __enter__(self) -> Keys:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.client.stop()
        self.client.close()

    def _now_ms(self) -> int:
        """The ensemble's clock: the mtime of a write of the root."""
        return int(self.client.set(ROOT, b"").mtime)

    def _record(self, key: str) -> dict | None:
        from kazoo.exceptions import NoNodeError

        try:
            data, _ = self.client.get(f"{ROOT}/{_name(key)}")
        except NoNodeError:
            return None
        record = json.loads(data)
        if record.get("p") is not None and record["e"] <= self._now_ms():
            return None  # expired on the ensemble's clock
        return record

    def set(self, key: str, value: Any, px: int | None = None, nx: bool = False) -> bool | None:
        from kazoo.exceptions import NodeExistsError

        if nx and self._record(key) is not None:
            return None
        record: dict[str, Any] = {"t": "s", "v": str(value)}
        if px is not None:
            record["e"], record["p"] = self._now_ms() + px, px
        path, data = f"{ROOT}/{_name(key)}", json.dumps(record).encode()
        try:
            self.client.create(path, data)
        except NodeExistsError:
            self.client.set(path, data)
        return True

    def set_many(self, values: dict[str, Any], px: int) -> None:
        """Absent keys written with a TTL of ``px`` ms, 500 to a multi."""
        expiry = self._now_ms() + px
        items = list(values.items())
        for start in range(0, len(items), 500):
            txn = self.client.transaction()
            for key, value in items[start : start + 500]:
                record = {"t": "s", "v": str(value), "e": expiry, "p": px}
                txn.create(f"{ROOT}/{_name(key)}", json.dumps(record).encode())
            assert not [r for r in txn.commit() if isinstance(r, Exception)]

    def delete(self, *keys: str) -> int:
        from kazoo.exceptions import NoNodeError

        deleted = 0
        for key in keys:
            try:
                self.client.delete(f"{ROOT}/{_name(key)}")
                deleted += 1
            except NoNodeError:
                pass
        return deleted

    def keys(self, pattern: str = "*") -> list[str]:
        names = [unquote(n) for n in self.client.get_children(ROOT)]
        wanted = [n for n in names if fnmatch.fnmatchcase(n, pattern)]
        return sorted(n for n in wanted if self._record(n) is not None)
