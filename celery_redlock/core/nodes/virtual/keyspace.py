"""Redis's keys as a virtual node keeps them, and the commands the scripts call on them.

A key is one entry of the kind's store (:mod:`.store`): its type and data
(``s`` a string, ``h`` a hash, ``z`` a sorted set), and for a key with a TTL
its expiry (``e``, ms on the node's clock when it was written) and its TTL
(``p``, ms). Whether a key still exists is the kind's expiry primitive's to
say (etcd: a lease that outlives the TTL; memory: the node's clock), so no two
owners both hold a key while clients' clocks disagree; ``e`` only serves the
remaining TTL a command reads back (``PTTL``), clamped to the TTL written: a
retry's hint and a claim mark's rest, never whether a key is held. A kind that
keeps bytes stores an entry as :func:`encode` writes it, a JSON record
``{"t": type, "v": value, "e": expiry, "p": ttl}``.

:class:`View` is the keys one call reads and writes: the scripts run on it
(:mod:`.scripting`), and :func:`.store.execute` commits its changes on a
compare of every key read against the version it was read at.
"""

from __future__ import annotations

import json
import math
from typing import Any

__all__ = ["Entry", "ScriptError", "View", "decode", "encode", "score_text"]


class ScriptError(Exception):
    """A command's error inside a script (a wrong type, a bad argument), as Redis's."""


WRONGTYPE = "WRONGTYPE Operation against a key holding the wrong kind of value"


class Entry:
    """One key: its type (``s``, ``h``, ``z``), data, expiry (ms, writer's clock) and TTL (ms)."""

    __slots__ = ("expire", "kind", "lease", "px", "value")

    def __init__(self, kind: str, value: Any, expire: int | None, px: int | None, lease: int = 0):
        self.kind, self.value, self.expire, self.px, self.lease = kind, value, expire, px, lease

    def copy(self) -> Entry:
        value = dict(self.value) if self.kind == "h" else (
            list(self.value) if self.kind == "z" else self.value
        )  # fmt: skip
        return Entry(self.kind, value, self.expire, self.px, self.lease)


def encode(entry: Entry) -> bytes:
    if entry.kind == "s":
        value: Any = entry.value.decode("latin-1")
    elif entry.kind == "h":
        value = {k.decode("latin-1"): v.decode("latin-1") for k, v in entry.value.items()}
    else:
        value = [[m.decode("latin-1"), s] for m, s in entry.value]
    record: dict[str, Any] = {"t": entry.kind, "v": value}
    if entry.px is not None:
        record["e"], record["p"] = entry.expire, entry.px
    return json.dumps(record, separators=(",", ":")).encode()


def decode(data: bytes, lease: int) -> Entry:
    record = json.loads(data)
    kind, value = record["t"], record["v"]
    if kind == "s":
        value = value.encode("latin-1")
    elif kind == "h":
        value = {k.encode("latin-1"): v.encode("latin-1") for k, v in value.items()}
    else:
        value = [(m.encode("latin-1"), float(s)) for m, s in value]
    return Entry(kind, value, record.get("e"), record.get("p"), lease)


def score_text(score: float) -> bytes:
    """A score as Redis prints it (``%.17g``)."""
    if score == math.inf:
        return b"inf"
    if score == -math.inf:
        return b"-inf"
    return (str(int(score)) if score.is_integer() else f"{score:.17g}").encode()


def _int(arg: bytes, what: str = "value is not an integer or out of range") -> int:
    try:
        return int(arg)
    except ValueError:
        raise ScriptError(f"ERR {what}") from None


def _bound(arg: bytes) -> tuple[float, bool]:
    """A ZRANGEBYSCORE bound: (value, exclusive)."""
    text = arg.decode()
    exclusive = text.startswith("(")
    text = text[1:] if exclusive else text
    try:
        return float(text.replace("inf", "inf")), exclusive
    except ValueError:
        raise ScriptError("ERR min or max is not a float") from None


class View:
    """The keys one call sees: ``base`` as read (key -> Entry or None), ``keys``
    as the script leaves them, ``ttl_set`` the keys whose TTL it set."""

    def __init__(self, base: dict[bytes, Entry | None], missing: Any, now: float) -> None:
        self.base = base
        self.keys: dict[bytes, Entry | None] = {}
        self.ttl_set: set[bytes] = set()
        self.missing = missing  # key -> Entry | None for a key not read beforehand
        self.now = now  # the node's clock (seconds): what TIME answers
        self.now_ms = int(now * 1000)
        self.now_us = int(now * 1_000_000)

    # -- keys -------------------------------------------------------------------------------

    def get(self, key: bytes) -> Entry | None:
        if key not in self.keys:
            if key not in self.base:
                self.base[key] = self.missing(key)
            entry = self.base[key]
            self.keys[key] = entry.copy() if entry is not None else None
        return self.keys[key]

    def typed(self, key: bytes, kind: str) -> Entry | None:
        entry = self.get(key)
        if entry is not None and entry.kind != kind:
            raise ScriptError(WRONGTYPE)
        return entry

    def put(self, key: bytes, entry: Entry | None) -> None:
        self.get(key)
        self.keys[key] = entry

    def changed(self) -> dict[bytes, Entry | None]:
        """The keys the script wrote (to write back)."""
        out = {}
        for key, entry in self.keys.items():
            before = self.base.get(key)
            if key in self.ttl_set or _differs(before, entry):
                out[key] = entry
        return out

    def expire_in(self, key: bytes, ms: int) -> None:
        entry = self.get(key)
        if entry is None:
            return
        if ms <= 0:
            self.put(key, None)
            return
        entry.expire, entry.px, entry.lease = self.now_ms + ms, ms, 0
        self.ttl_set.add(key)

    def pttl(self, key: bytes) -> int:
        entry = self.get(key)
        if entry is None:
            return -2
        if entry.px is None:
            return -1
        left = (entry.expire or 0) - self.now_ms
        return max(1, min(left, entry.px))

    # -- commands ---------------------------------------------------------------------------

    def call(self, name: bytes, args: list[bytes]) -> Any:
        verb = name.decode().upper()
        method = getattr(self, f"c_{verb.lower()}", None)
        if method is None:
            raise ScriptError(f"ERR this node does not implement {verb}")
        return method(*args)

    def c_time(self) -> list[bytes]:
        # the store's clock (etcd lends scripts none: this process's), in whole microseconds
        seconds, micros = divmod(self.now_us, 1_000_000)
        return [str(seconds).encode(), str(micros).encode()]

    def c_get(self, key: bytes) -> bytes | None:
        entry = self.typed(key, "s")
        return entry.value if entry is not None else None

    def c_set(self, key: bytes, value: bytes, *opts: bytes) -> Any:
        flags, px, i = set(), None, 0
        while i < len(opts):
            opt = opts[i].decode().upper()
            if opt in ("PX", "EX"):
                px = _int(opts[i + 1]) * (1000 if opt == "EX" else 1)
                if px <= 0:
                    raise ScriptError("ERR invalid expire time in 'set' command")
                i += 2
                continue
            flags.add(opt)
            i += 1
        entry = self.get(key)
        if ("NX" in flags and entry is not None) or ("XX" in flags and entry is None):
            return None
        new = Entry("s", value, None, None)
        if px is not None:
            new.expire, new.px = self.now_ms + px, px
            self.ttl_set.add(key)
        elif "KEEPTTL" in flags and entry is not None:
            new.expire, new.px, new.lease = entry.expire, entry.px, entry.lease
        else:
            self.ttl_set.discard(key)
        self.put(key, new)
        return {"ok": b"OK"}

    def c_del(self, *keys: bytes) -> int:
        out = 0
        for key in keys:
            if self.get(key) is not None:
                self.put(key, None)
                out += 1
        return out

    def c_exists(self, *keys: bytes) -> int:
        return sum(self.get(key) is not None for key in keys)

    def c_pttl(self, key: bytes) -> int:
        return self.pttl(key)

    def c_pexpire(self, key: bytes, ms: bytes) -> int:
        if self.get(key) is None:
            return 0
        self.expire_in(key, _int(ms))
        return 1

    def _hash(self, key: bytes, create: bool = False) -> dict[bytes, bytes] | None:
        entry = self.typed(key, "h")
        if entry is None and create:
            entry = Entry("h", {}, None, None)
            self.put(key, entry)
        return entry.value if entry is not None else None

    def c_hget(self, key: bytes, field: bytes) -> bytes | None:
        return (self._hash(key) or {}).get(field)

    def c_hmget(self, key: bytes, *fields: bytes) -> list[bytes | None]:
        h = self._hash(key) or {}
        return [h.get(f) for f in fields]

    def c_hset(self, key: bytes, *pairs: bytes) -> int:
        if not pairs or len(pairs) % 2:
            raise ScriptError("ERR wrong number of arguments for 'hset' command")
        h = self._hash(key, create=True)
        assert h is not None
        added = 0
        for field, value in zip(pairs[::2], pairs[1::2]):
            added += field not in h
            h[field] = value
        return added

    def c_hdel(self, key: bytes, *fields: bytes) -> int:
        h = self._hash(key)
        if h is None:
            return 0
        out = sum(h.pop(f, None) is not None for f in fields)
        if not h:
            self.put(key, None)
        return out

    def c_hincrby(self, key: bytes, field: bytes, by: bytes) -> int:
        h = self._hash(key, create=True)
        assert h is not None
        value = _int(h.get(field, b"0"), "hash value is not an integer") + _int(by)
        h[field] = str(value).encode()
        return value

    def _zset(self, key: bytes) -> Entry | None:
        return self.typed(key, "z")

    def c_zadd(self, key: bytes, *pairs: bytes) -> int:
        entry = self._zset(key)
        if entry is None:
            entry = Entry("z", [], None, None)
            self.put(key, entry)
        members = dict(entry.value)
        added = 0
        for score, member in zip(pairs[::2], pairs[1::2]):
            try:
                value = float(score)
            except ValueError:
                raise ScriptError("ERR value is not a valid float") from None
            added += member not in members
            members[member] = value
        entry.value = sorted(((m, s) for m, s in members.items()), key=lambda p: (p[1], p[0]))
        return added

    def _store_z(self, key: bytes, entry: Entry, kept: list) -> None:
        if kept:
            entry.value = kept
        else:
            self.put(key, None)

    def c_zrem(self, key: bytes, *members: bytes) -> int:
        entry = self._zset(key)
        if entry is None:
            return 0
        kept = [p for p in entry.value if p[0] not in members]
        out = len(entry.value) - len(kept)
        self._store_z(key, entry, kept)
        return out

    def _range(self, n: int, start: int, stop: int) -> range:
        start, stop = start + n if start < 0 else start, stop + n if stop < 0 else stop
        return range(max(start, 0), min(stop, n - 1) + 1)

    def c_zremrangebyrank(self, key: bytes, start: bytes, stop: bytes) -> int:
        entry = self._zset(key)
        if entry is None:
            return 0
        gone = set(self._range(len(entry.value), _int(start), _int(stop)))
        kept = [p for i, p in enumerate(entry.value) if i not in gone]
        self._store_z(key, entry, kept)
        return len(gone)

    def c_zremrangebyscore(self, key: bytes, low: bytes, high: bytes) -> int:
        entry = self._zset(key)
        if entry is None:
            return 0
        (lo, lo_x), (hi, hi_x) = _bound(low), _bound(high)

        def inside(s: float) -> bool:
            return (s > lo if lo_x else s >= lo) and (s < hi if hi_x else s <= hi)

        kept = [p for p in entry.value if not inside(p[1])]
        out = len(entry.value) - len(kept)
        self._store_z(key, entry, kept)
        return out

    def c_zrange(self, key: bytes, start: bytes, stop: bytes, *opts: bytes) -> list[bytes]:
        entry = self._zset(key)
        return self._ranged(entry.value if entry else [], start, stop, opts)

    def c_zrevrange(self, key: bytes, start: bytes, stop: bytes, *opts: bytes) -> list[bytes]:
        entry = self._zset(key)
        return self._ranged(entry.value[::-1] if entry else [], start, stop, opts)

    def _ranged(self, pairs: list, start: bytes, stop: bytes, opts: tuple) -> list[bytes]:
        scores = any(o.upper() == b"WITHSCORES" for o in opts)
        out: list[bytes] = []
        for i in self._range(len(pairs), _int(start), _int(stop)):
            out.append(pairs[i][0])
            if scores:
                out.append(score_text(pairs[i][1]))
        return out

    def c_zcard(self, key: bytes) -> int:
        entry = self._zset(key)
        return len(entry.value) if entry else 0

    def c_zscore(self, key: bytes, member: bytes) -> bytes | None:
        entry = self._zset(key)
        found = [s for m, s in (entry.value if entry else []) if m == member]
        return score_text(found[0]) if found else None

    def c_zrank(self, key: bytes, member: bytes) -> int | None:
        entry = self._zset(key)
        ranks = [i for i, (m, _) in enumerate(entry.value if entry else []) if m == member]
        return ranks[0] if ranks else None


def _differs(before: Entry | None, after: Entry | None) -> bool:
    if before is None or after is None:
        return before is not after
    return (before.kind, before.value, before.px, before.expire) != (
        after.kind,
        after.value,
        after.px,
        after.expire,
    )
