"""The reads a test makes of a lock node whose keys are JSON records (etcd,
ZooKeeper), as it makes them of a Redis node: ``get``, ``pttl``, ``exists``,
``scan_iter``, ``zrange``, ``zcard``, ``time``."""

from __future__ import annotations

from collections.abc import Iterator


class RecordKeys:
    """A subclass provides ``_record(key)`` (the live record or None),
    ``_now_ms()`` (the clock its keys expire by) and ``keys(pattern)``."""

    def _record(self, key: str) -> dict | None:
        raise NotImplementedError

    def _now_ms(self) -> float:
        raise NotImplementedError

    def keys(self, pattern: str = "*") -> list[str]:
        raise NotImplementedError

    def get(self, key: str) -> str | None:
        record = self._record(key)
        return record["v"] if record is not None else None

    def pttl(self, key: str) -> int:
        record = self._record(key)
        if record is None:
            return -2
        if record.get("p") is None:
            return -1
        return max(1, min(int(record["e"] - self._now_ms()), record["p"]))

    def exists(self, *keys: str) -> int:
        return sum(self._record(k) is not None for k in keys)

    def scan_iter(self, match: str = "*", count: int = 0) -> Iterator[str]:
        return iter(self.keys(match))

    def zrange(self, key: str, start: int, end: int) -> list[str]:
        record = self._record(key)
        members = [m for m, _ in record["v"]] if record is not None else []
        return members[start : None if end == -1 else end + 1]

    def zcard(self, key: str) -> int:
        return len(self.zrange(key, 0, -1))

    def time(self) -> tuple[int, int]:
        """The clock the node's keys read."""
        now = self._now_ms() / 1000
        return int(now), int((now % 1) * 1_000_000)
