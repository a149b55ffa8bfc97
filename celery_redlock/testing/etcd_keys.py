"""A lock node's keys on an etcd cluster, read and written as tests read a Redis node's."""

from __future__ import annotations

import base64
import fnmatch
import json
import time
import urllib.request
from typing import Any

from .record_keys import RecordKeys

__all__ = ["Keys", "api"]


def api(url: str, body: Any = None, timeout: float = 1.0) -> Any:
    """A JSON request to an etcd member (POST with a body, GET without): its JSON reply."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method="GET" if data is None else "POST")
    with urllib.request.urlopen(request, timeout=timeout) as reply:  # noqa: S310 - loopback
        return json.loads(reply.read() or b"null")


class Keys(RecordKeys):
    """A lock node's keys on an etcd cluster, with the calls of a decoded redis-py
    client that tests use (``get``, ``set``, ``pttl``, ``exists``, ``delete``,
    ``keys``, ``scan_iter``, ``zrange``, ``zcard``, ``time``), and ``set_many``
    for the many keys a pipeline writes on Redis: a test of the lock's state
    runs on every kind. Each key is an etcd key under ``prefix``
    holding a JSON record ``{"t": type, "v": value, "e": expiry ms, "p": ttl ms}``
    on a lease (see :mod:`celery_redlock.core.nodes.virtual.keyspace`)."""

    def __init__(self, cluster: Any, prefix: bytes = b"redlock/") -> None:
        self.cluster = cluster
        self.prefix = prefix

    def __enter__(self) -> Keys:
        return self

    def __exit__(self, *exc_info: object) -> None:
        pass

    def _api(self, path: str, body: dict) -> Any:
        for member in self.cluster:
            if member.is_running and not member.is_paused:
                return api(f"http://{member.endpoint}/v3/{path}", body, 5.0)
        raise RuntimeError(f"{self.cluster!r} has no member answering")

    def _now_ms(self) -> float:
        """The clock an etcd node's keys read: the client's (etcd serves none)."""
        return time.time() * 1000

    def _record(self, key: str) -> dict | None:
        got = self._api("kv/range", {"key": _b64(self.prefix + key.encode())})
        kvs = got.get("kvs") or []
        return json.loads(base64.b64decode(kvs[0]["value"])) if kvs else None

    def set(self, key: str, value: Any, px: int | None = None, nx: bool = False) -> bool | None:
        record: dict[str, Any] = {"t": "s", "v": str(value)}
        put: dict[str, Any] = {"key": _b64(self.prefix + key.encode())}
        if px is not None:
            record["e"], record["p"] = int(time.time() * 1000) + px, px
            put["lease"] = self._api("lease/grant", {"TTL": -(-px // 1000) + 1})["ID"]
        put["value"] = _b64(json.dumps(record).encode())
        compare = [{"key": put["key"], "target": "CREATE", "create_revision": "0"}] if nx else []
        got = self._api("kv/txn", {"compare": compare, "success": [{"request_put": put}]})
        return True if got.get("succeeded") else None

    def set_many(self, values: dict[str, Any], px: int) -> None:
        """Write every key of ``values`` with a TTL of ``px`` ms: one lease for them all,
        Txns of 100 puts (etcd refuses a Txn of more than ``--max-txn-ops``, 128)."""
        expiry = int(time.time() * 1000) + px
        lease = self._api("lease/grant", {"TTL": -(-px // 1000) + 1})["ID"]
        puts = [
            {
                "request_put": {
                    "key": _b64(self.prefix + key.encode()),
                    "value": _b64(
                        json.dumps({"t": "s", "v": str(v), "e": expiry, "p": px}).encode()
                    ),
                    "lease": lease,
                }
            }
            for key, v in values.items()
        ]
        for start in range(0, len(puts), 100):
            self._api("kv/txn", {"success": puts[start : start + 100]})

    def delete(self, *keys: str) -> int:
        return sum(
            int(
                self._api("kv/deleterange", {"key": _b64(self.prefix + k.encode())}).get(
                    "deleted", 0
                )
            )
            for k in keys
        )

    def keys(self, pattern: str = "*") -> list[str]:
        end = self.prefix[:-1] + bytes([self.prefix[-1] + 1])
        got = self._api(
            "kv/range", {"key": _b64(self.prefix), "range_end": _b64(end), "keys_only": True}
        )
        names = [
            base64.b64decode(kv["key"])[len(self.prefix) :].decode() for kv in got.get("kvs", [])
        ]
        return sorted(n for n in names if fnmatch.fnmatchcase(n, pattern))


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()
