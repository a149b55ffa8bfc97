"""The operations as the kinds run them: a script, its KEYS and its ARGV; and
the kinds' replies (Lua-shaped lists of ints, bytes, None) as typed results.

The one place that knows argument positions, flag letters and reply slots
(the contracts written above each script in :mod:`celery_redlock.core.nodes.scripts`).
Every kind answers with the same Lua-shaped replies, so :func:`decode` serves
them all, applied once where the core runs an operation (:func:`.perform`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from .. import ops
from ..values import readable, text
from ..windows import RateKey
from . import scripts
from .scripts import Script
from .util import node_error

__all__ = ["PLANS", "decode", "decode_all", "decode_each", "encode", "flags", "rate_args"]

#: A rated acquire's reply when the grant was booked for later and let go.
LATER = 7

Call = tuple[Script, Sequence[str], Sequence[Any]]


def flags(gates: ops.Gates) -> str:
    """The gate flags (see ``scripts.shared.GATES``), throttle's ``t`` included."""
    out = ("r" if gates.receipts else "") + {None: "", "check": "c", "take": "cw"}[gates.claim]
    out = out + "s" if gates.claim and gates.own_claim else out
    return out + "t" if gates.throttle_ms else out


def _acquire(op: ops.Acquire) -> Call:
    keys: tuple[str, ...] = (op.key, op.fence_key)
    args: tuple[Any, ...] = (op.owner, op.ttl_ms, op.fence, op.now_us)
    g = op.gates
    if g is not None:
        keys += (g.receipt_key, g.claim_key)
        args += (g.id, flags(g))
        if g.throttle_ms:
            keys += (g.throttle_key,)
            args += (g.throttle_ms, g.now_ms, g.slot)
    return scripts.ACQUIRE, keys, args


def _acquire_permit(op: ops.AcquirePermit) -> Call:
    group, also = op.groups[0], len(op.groups) > 1
    g = op.gates
    key = group[0]
    stand_ins = (key, key, key) if g is None else (g.receipt_key, g.claim_key, g.throttle_key)
    keys = [key, op.fences[0], *stand_ins, *group[1:]]
    for fence_key, other in zip(op.fences[1:], op.groups[1:]):
        keys += [fence_key, *other]
    letters = ("a" if also else "") + ("" if g is None else flags(g))
    throttled = g is not None and bool(g.throttle_ms)
    args: list[Any] = [
        op.owner,
        op.ttl_ms,
        op.fence,
        op.now_us,
        op.task_id or "",
        letters,
        g.throttle_ms if g is not None and throttled else "",
        g.now_ms if g is not None and throttled else "",
        "" if g is None else g.slot,
        op.prefer[0],
    ]
    if also:
        args.append(len(group))
        for other, p in zip(op.groups[1:], op.prefer[1:]):
            args += (len(other), p)
    return scripts.ACQUIRE_PERMIT, keys, args


def rate_args(
    keys: Sequence[RateKey], now_ms: int, phase: str = "1", third: str = "", versions=()
) -> list[Any]:
    """:data:`.scripts.rates.RATE`'s ARGV."""
    args: list[Any] = [phase, str(now_ms), third]
    for i, key in enumerate(keys):
        args += [versions[i] if versions else "", str(len(key.windows))]
        pace = key.pace
        for w in key.windows:
            interval = _ms(w.interval)
            tau = (key.burst - 1) * interval
            counted = 0 if w == pace else w.starts
            args += [w.field, str(interval), str(tau), str(_ms(w.period)), str(counted)]
    return args


def _rate_keys(keys: Sequence[RateKey]) -> list[str]:
    return [*(k.key for k in keys), *(k.log for k in keys)]


def _rate(op: ops.Rate) -> Call:
    return (
        scripts.RATE,
        _rate_keys(op.keys),
        rate_args(op.keys, op.now_ms, op.phase, op.third, op.versions),
    )


def _rated(op: ops.Rated) -> Call:
    script, keys, args = encode(op.acquire)
    rated = op.keys
    keep = [
        "r" if op.booked else "b",
        str(op.now_ms),
        str(op.due_ms),
        str(op.keep_ms),
        str(op.cap),
        op.acquire.owner,
        " ".join(str(i + 1) for i, key in enumerate(keys) if key in op.held),
        str(len(rated)),
    ]
    if not op.booked:
        keep += rate_args(rated, op.now_ms)
    all_keys = [*keys, *_rate_keys(rated), *(k.starts for k in rated)]
    wrapped = scripts.ACQUIRE_RATED if script is scripts.ACQUIRE else scripts.ACQUIRE_PERMIT_RATED
    return wrapped, all_keys, [len(keys), len(args), *args, *keep]


def _extend(op: ops.Extend) -> Call:
    args: list[Any] = []
    for _, owner, ttl_ms in op.leases:
        args += (owner, ttl_ms)
    return scripts.EXTEND, [key for key, _, _ in op.leases], args


def _release(op: ops.Release) -> Call:
    if op.receipt_key is None or op.claim_key is None:
        return scripts.RELEASE, (op.key,), (op.owner,)
    keys = (op.key, op.receipt_key, op.claim_key)
    return scripts.RELEASE, keys, (op.owner, op.receipt, op.withdraw)


def _fence(op: ops.Fence) -> Call:
    args = (op.owner, op.token, op.fence, *(("s",) if op.strict else ()))
    return scripts.FENCE, (op.key, op.fence_key), args


def _queue_park(op: ops.QueuePark) -> Call:
    args = [op.id, op.call, str(max(0, op.most)), str(op.retention_ms), op.ticket]
    return scripts.QUEUE_PARK, (op.queue_key, op.calls_key), [*args, "1" if op.supersede else ""]


def _queue_next(op: ops.QueueNext) -> Call:
    keys = [op.claim_key, op.queue_key, op.calls_key, *op.lock_keys]
    return scripts.QUEUE_NEXT, keys, [op.drop, op.owner, op.claim_ms, str(op.retention_ms)]


_ENCODERS: dict[type, Callable[[Any], Any]] = {
    ops.Acquire: _acquire,
    ops.AcquirePermit: _acquire_permit,
    ops.Rate: _rate,
    ops.Rated: _rated,
    ops.Unstart: lambda op: (
        scripts.UNSTART, (*op.keys, *op.starts), (op.owner, len(op.keys))
    ),
    ops.Extend: _extend,
    ops.Release: _release,
    ops.ReleasePrefix: lambda op: (scripts.RELEASE_PREFIX, op.keys, (op.prefix,)),
    ops.Issue: lambda op: (
        scripts.ISSUE, (op.key, op.fence_key), (op.owner, "", op.fence, op.now_us)
    ),
    ops.Fence: _fence,
    ops.Inspect: lambda op: (scripts.INSPECT, (op.key, op.fence_key), ()),
    ops.Peek: lambda op: (scripts.PEEK, (op.key,), ()),
    ops.Claim: lambda op: (scripts.CLAIM, (op.key,), (op.value, op.ttl_ms)),
    ops.ClaimNext: lambda op: (
        scripts.CLAIM_NEXT, (op.key,), (op.claimant, op.ttl_ms, "1" if op.replace else "")
    ),
    ops.Debounce: lambda op: (
        scripts.DEBOUNCE,
        (op.claim_key, op.burst_key),
        (op.claimant, str(op.now_ms), op.delay_ms, op.cap_ms, op.ttl_ms),
    ),
    ops.Throttle: lambda op: (
        scripts.THROTTLE,
        (op.claim_key, op.throttle_key),
        (op.claimant, str(op.now_ms), op.period_ms, "1" if op.trailing else "", op.ttl_ms),
    ),
    ops.QueuePark: _queue_park,
    ops.QueueNext: _queue_next,
    ops.QueuePeek: lambda op: (scripts.QUEUE_PEEK, (op.queue_key, op.calls_key), ()),
}  # fmt: skip


_COMMANDS: dict[type, Callable[[Any], tuple]] = {
    ops.Ping: lambda op: ("PING",),
    ops.Get: lambda op: ("GET", op.key),
    ops.Delete: lambda op: ("DEL", op.key),
    ops.ReadHash: lambda op: ("HGETALL", op.key),
    ops.ReadScores: lambda op: ("ZRANGE", op.key, 0, -1, "WITHSCORES"),
    ops.ReadType: lambda op: ("TYPE", op.key),
    ops.ReadTtl: lambda op: ("PTTL", op.key),
    ops.Scan: lambda op: ("SCAN", op.cursor, "MATCH", op.match, "COUNT", op.count),
}


def _plain(build: Callable[[Any], tuple]) -> Callable[[Any], Any]:
    return lambda op: (None, build(op), ())


for _read, _build in _COMMANDS.items():
    _ENCODERS[_read] = _plain(_build)


def encode(op: ops.Op) -> tuple[Script | None, Sequence[Any], Sequence[Any]]:
    """The script that runs ``op``, and its KEYS and ARGV; for a plain read, None and
    the command every kind answers (in Redis's reply shapes)."""
    return _ENCODERS[type(op)](op)


#: Operation type -> its :func:`encode` (looked up directly on every lock call).
ENCODERS = _ENCODERS


# -- replies --------------------------------------------------------------------


# Results are immutable: the common yes/no and counts are shared, not built per reply.
_DONE = {0: ops.Done(False), 1: ops.Done(True)}
_COUNT = {0: ops.Count(0), 1: ops.Count(1)}


def _done(r: Any) -> ops.Done:
    return _DONE[int(r) == 1]


def _count(r: Any) -> ops.Count:
    return _COUNT.get(r) or ops.Count(int(r))


def _counted(op: Any, r: Any) -> ops.Count:
    return _count(r)


def _shown(value: Any) -> str | None:
    """A value read from a key any client may have written: text, whatever bytes it holds."""
    if isinstance(value, bytes):
        return value.decode("utf-8", "backslashreplace")
    return text(value)


def _s(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _acquired(op: Any, r: list) -> Any:
    """ACQUIRE's and ACQUIRE_PERMIT's replies (and the gates')."""
    code = int(r[0])
    if code == 1:
        n = len(r)
        if n <= 2:  # the lock: {1, fence} or, fencing off, {1}
            return ops.Granted(text(r[1])) if n == 2 else ops.Granted()
        also = tuple((text(r[i]), int(r[i + 1])) for i in range(3, n - 1, 2))
        return ops.GrantedPermit(text(r[1]), int(r[2]), also)
    if code == 0:
        return ops.Held(text(r[1]), int(r[2]), text(r[3]) if len(r) > 3 else None)
    if code == 2:
        return ops.Finished()
    if code == 3:
        return ops.Claimed(text(r[1]), int(r[2]))
    if code == 4:
        return ops.TooEarly(int(r[1]))
    if code == 5:
        return ops.Full(int(r[1]), text(r[2]), int(r[3]))
    raise ValueError(f"unknown acquire reply {r!r}")


def _booked(r: Any, k: int) -> ops.Booked | None:
    if not isinstance(r, list) or not r:
        return None
    versions, tats = r[2 : 2 + k], r[2 + k :]
    return ops.Booked(int(r[1]), tuple(map(_s, versions)), tuple(map(_s, tats)))


def _rated_reply(op: ops.Rated, r: list) -> Any:
    code = int(r[0]) if r else None
    if code not in (1, LATER):
        return _acquired(op, r)
    booking = _booked(r[-1], len(op.keys))
    if code == LATER:
        return ops.Later(booking)
    got = _acquired(op, r[:-1])
    return ops.GrantedRated(got.fence, getattr(got, "index", 0), getattr(got, "also", ()), booking)


def _rate_reply(op: ops.Rate, r: list) -> Any:
    code = int(r[0])
    if code == 2:
        return ops.Sooner(int(r[1]))
    if code == 1 and op.phase == "1":
        return _booked(r, len(op.keys))
    return _DONE[code == 1]


def _claim_next(r: list) -> Any:
    if int(r[0]) == 1:
        return ops.Taken(text(r[1]), int(r[2]) == 1)
    return ops.Claimed(text(r[1]), int(r[2]))


_SCHEDULES = {1: "later", 2: "now", 0: "dropped"}


def _queue_park_reply(r: list) -> Any:
    if int(r[0]) == 1:
        return ops.InQueue(int(r[1]), int(text(r[2]) or 0), tuple(text(i) or "" for i in r[3:]))
    return ops.QueueFull(int(r[1]))


def _queue_next_reply(r: list) -> Any:
    removed, code = int(r[0]) == 1, int(r[1])
    if code == 0:
        return ops.HandPending(removed, text(r[2]), int(r[3]))
    if code == 1:
        return ops.AllHeld(removed, int(r[2]))
    if code == 2:
        return ops.Empty(removed)
    if code == 3:
        return ops.Handed(removed, text(r[2]), text(r[3]), text(r[4]), int(r[5]))
    return ops.TakenOut(removed)


_DECODERS: dict[type, Callable[[Any, Any], Any]] = {
    ops.Acquire: _acquired,
    ops.AcquirePermit: _acquired,
    ops.Rate: _rate_reply,
    ops.Rated: _rated_reply,
    ops.Unstart: _counted,
    ops.Extend: lambda op, r: ops.Extended(tuple(int(x) == 1 for x in r)),
    ops.Release: _counted,
    ops.ReleasePrefix: _counted,
    ops.Issue: lambda op, r: ops.Issued(text(r)),
    ops.Fence: lambda op, r: _done(r),
    ops.Inspect: lambda op, r: ops.Inspected(_shown(r[0]), int(r[1]), _shown(r[2])),
    ops.Peek: lambda op, r: ops.Peeked(text(r[0]), int(r[1])),
    ops.Claim: lambda op, r: _done(r),
    ops.ClaimNext: lambda op, r: _claim_next(r),
    ops.Debounce: lambda op, r: ops.Scheduled(_SCHEDULES[int(r[0])], text(r[1]), _s(r[2])),
    ops.Throttle: lambda op, r: ops.Scheduled(_SCHEDULES[int(r[0])], text(r[1]), _s(r[2])),
    ops.QueuePark: lambda op, r: _queue_park_reply(r),
    ops.QueueNext: lambda op, r: _queue_next_reply(r),
    ops.QueuePeek: lambda op, r: ops.QueueHead(int(r[0]), text(r[1]), text(r[2])),
}


def _pairs(reply: Any) -> list:
    """A hash's or a ``WITHSCORES`` reply's pairs: RESP2 answers a flat list, RESP3
    [member, score] pairs (a sorted set) or a dict (a hash)."""
    if isinstance(reply, dict):
        return list(reply.items())
    if reply and isinstance(reply[0], list):
        return [tuple(pair) for pair in reply]
    return list(zip(reply[::2], reply[1::2]))


def _page(reply: Any) -> ops.Page:
    cursor, keys = reply
    return ops.Page(_s(cursor), tuple(_shown(k) or "" for k in keys))


_READS: dict[type, Callable[[Any], Any]] = {
    ops.Ping: lambda r: _DONE[1],
    ops.Get: lambda r: ops.Value(_shown(r)),
    ops.Delete: _count,
    ops.ReadHash: lambda r: ops.Fields(tuple((readable(k), readable(v)) for k, v in _pairs(r))),
    ops.ReadScores: lambda r: ops.Scores(tuple((readable(m), float(s)) for m, s in _pairs(r))),
    ops.ReadType: lambda r: ops.KeyType(_s(r)),
    ops.ReadTtl: lambda r: ops.Remaining(int(r)),
    ops.Scan: _page,
}


def _read_only(read: Callable[[Any], Any]) -> Callable[[Any, Any], Any]:
    return lambda op, r: read(r)


for _read, _decode in _READS.items():
    _DECODERS[_read] = _read_only(_decode)


def decode(op: ops.Op, reply: Any) -> Any:
    """A node's reply to ``op`` as its typed result (an error stays an error; a reply
    that is not this operation's becomes a ValueError)."""
    if isinstance(reply, BaseException):
        return reply
    try:
        return _DECODERS[type(op)](op, reply)
    except (TypeError, ValueError, IndexError, KeyError):  # not this operation's reply
        return ValueError(f"{type(op).__name__}: unexpected reply {reply!r}")


def decode_all(op: ops.Op, replies: list[Any], unconfirmed: type) -> list[Any]:
    """:func:`decode` of each reply of a round; an ``unconfirmed`` error (a write its
    replicas did not confirm) gets its ``reply`` decoded too."""
    try:
        return _ROUNDS.get(type(op), _each)(op, replies, unconfirmed)
    except (TypeError, ValueError, IndexError, KeyError):  # one reply is not op's: each alone
        return decode_each(op, replies, unconfirmed)


def decode_each(
    op: ops.Op, replies: list[Any], unconfirmed: type | tuple[type, ...] = ()
) -> list[Any]:
    """:func:`decode` of each reply alone (a round where some reply is not ``op``'s);
    each error as :func:`_error` has it."""
    return [
        decode(op, r) if not isinstance(r, BaseException) else _error(op, r, unconfirmed)
        for r in replies
    ]


def _each(op: ops.Op, replies: list[Any], unconfirmed: type) -> list[Any]:
    one = _DECODERS[type(op)]
    return [
        one(op, r) if not isinstance(r, BaseException) else _error(op, r, unconfirmed)
        for r in replies
    ]


# On every lock call, the round of a fenced grant and of a deletion: decoded inline
# (a call per reply would cost as much as the rest of the decoding).


def _grants(op: ops.Op, replies: list[Any], unconfirmed: type) -> list[Any]:
    first = replies[0]
    if (
        first.__class__ is list
        and len(first) == 2
        and first[0] == 1
        and first[1].__class__ is bytes
        and replies.count(first) == len(replies)
    ):  # every node granted at one fence value (the rule): one result serves them all
        return [ops.Granted(first[1].decode())] * len(replies)
    return [
        ops.Granted(r[1].decode())
        if r.__class__ is list and len(r) == 2 and r[0] == 1 and r[1].__class__ is bytes
        else decode(op, r)
        if not isinstance(r, BaseException)
        else _error(op, r, unconfirmed)
        for r in replies
    ]


def _counts(op: ops.Op, replies: list[Any], unconfirmed: type) -> list[Any]:
    first = replies[0]
    if first.__class__ is int and first in _COUNT and replies.count(first) == len(replies):
        return [_COUNT[first]] * len(replies)  # every node answered alike (the rule)
    return [
        _COUNT[r]
        if r.__class__ is int and r in _COUNT
        else decode(op, r)
        if not isinstance(r, BaseException)
        else _error(op, r, unconfirmed)
        for r in replies
    ]


_ROUNDS = {ops.Acquire: _grants, ops.Release: _counts, ops.ReleasePrefix: _counts}

#: Operation type -> (its encoder, its round's decoder): what :func:`.perform` looks
#: up once per call.
PLANS: dict[type, tuple[Callable[[Any], Any], Callable[[Any, list, type], list]]] = {
    kind: (encode_op, _ROUNDS.get(kind, _each)) for kind, encode_op in _ENCODERS.items()
}


def _error(op: ops.Op, error: BaseException, unconfirmed: type | tuple[type, ...]) -> BaseException:
    if isinstance(error, unconfirmed):
        error.reply = decode(op, error.reply)  # type: ignore[attr-defined]
        return error
    return node_error(error)


def _ms(seconds: float) -> int:
    return int(round(seconds * 1000))
