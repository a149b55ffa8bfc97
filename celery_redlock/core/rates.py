"""Rate limits on the quorum: at most N starts per key in any window of a period.

This module is core: it imports neither celery nor kombu.

A rate is one or several **windows** ``(count, period)``; a start is admitted
only when every window of every key it names admits it. Each key's state is one
hash per key, ``{prefix}:rate:{name}`` (in the name's hash slot, next to its
lock key), on every node: per window its *theoretical arrival time* (TAT, ms,
the clients' clock) and a version counter ``v``.

The algorithm is GCRA (the generic cell rate algorithm) per window, with the
interval ``T = period / count`` and the burst tolerance ``tau = (burst - 1) * T``.
A reservation does not ask "may I start now": it asks for the first instant
every window admits, and books it.

Phase 1, one script call on every node at once: ``s = max(now, max over the
windows of TAT - tau)``; each ``TAT := max(TAT, s) + T``; ``v += 1``; the hash
lives until its latest TAT plus its longest period. The node answers ``(s, v)``.
The client takes the answers (a quorum at least) and ``s*``, the **largest**
``s`` among them. Nodes that answered ``s*`` booked it already. The others get
a phase-2 compare-and-set: if their version is still the one they answered
(no other reservation came in between), ``TAT := max(TAT - T, s*) + T``
(their booking moved from their ``s`` to ``s*``) and ``v += 1``; otherwise,
if GCRA admits ``s*`` there (``s* >= TAT - tau`` in every window), ``s*`` is
booked anew beside their own booking, which stays (wasted). The
reservation stands when ``s*`` is booked on a quorum; otherwise it failed
(bookings left on some nodes waste capacity there, never add any), and the
client tries again after a short jittered pause, a few times, then reports it
unreserved.

Why it holds. Each node's bookings, in the order it made them, are a sequence
GCRA accepted: phase 1 books an instant GCRA admits, a compare-and-set that
lands replaces the node's last booking with a later instant, which GCRA admits
too, and a booking anew is made only where GCRA admits it. Two reservations
that stand were each booked on a quorum, so both were
booked on some common node, one after the other, and GCRA spaced them there:
the later-booked instant is at least the earlier one plus ``T - tau``. With
``burst = 1`` (``tau = 0``) any two reserved instants are at least ``T`` apart,
so **any window of the period (half-open, of length period) holds at most
``count`` reserved instants**, whichever nodes answered, however the calls
interleaved. With ``burst = B`` one node's sequence holds at most
``count + B - 1`` instants in any window; reservations that raced on
different quorums can each be counted on different nodes, so across the
quorum the bound is ``floor(n / q * (count + B - 1))`` for n nodes and quorum
q (one node alone: ``count + B - 1``). Distinct reservations of a key get
distinct instants (each pushes the TAT on by ``T``): concurrent callers are
handed a schedule, not one next instant to fight over.

Faults. A minority of nodes that do not answer changes nothing (a quorum
answers). Fewer than a quorum: :class:`QuorumUnavailable`, nothing is granted.
A node that restarts empty (or whose hash expired early through a jump of its
clock) answers ``s = now``; as ``s*`` is the largest answer, this matters only
when every other answering node missed the reservations that node alone held
for the quorum: then the key starts a second GCRA sequence beside the one it
forgot, so a window holds at most twice the bound (``2 * (count + B - 1)``),
and only while the forgotten bookings last (up to the end of the schedule
booked before). A client whose clock is behind by d books instants that are d
late in true time: a window of true time then holds at most the bound plus
``ceil(d / T)``.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Callable, NamedTuple

from .._nodes import gather, run_script
from .._scripts import Script
from ..exceptions import ConfigurationError, QuorumUnavailable

if TYPE_CHECKING:
    from ..redlock import Redlock

__all__ = [
    "RATE",
    "RateKey",
    "RateSlot",
    "RateView",
    "Window",
    "check_rate",
    "parse_rate",
    "peek",
    "reserve",
    "reserve_named",
]

#: Rounds a reservation spends while concurrent callers split the nodes between them.
ROUNDS = 3
#: Longest pause, in seconds, before a reservation asks again after a split.
SPLIT_PAUSE = 0.005


class Window(NamedTuple):
    """At most ``starts`` starts in any window of ``period`` seconds."""

    starts: int
    period: float

    @property
    def interval(self) -> float:
        """Seconds between two starts at the steady rate (GCRA's T)."""
        return self.period / self.starts

    @property
    def field(self) -> str:
        """The hash field of this window's TAT: ``count/period_ms``."""
        return f"{self.starts}/{_ms(self.period)}"

    def __str__(self) -> str:
        return f"{self.starts}/{_seconds_text(self.period)}"


class RateKey(NamedTuple):
    """One key's windows and burst, booked together with the other keys of a reservation."""

    key: str
    windows: tuple[Window, ...]
    burst: int = 1


class RateSlot(NamedTuple):
    """What a reservation got.

    ``reserved``: the start at ``start_at`` (epoch seconds, the client's clock)
    is booked on a quorum; ``wait`` is the seconds from the call to it (0: start
    now). Not ``reserved``: concurrent callers split the nodes for every round;
    nothing was granted, ask again (``start_at`` is the latest instant seen).
    """

    start_at: float
    wait: float
    reserved: bool = True

    @property
    def now(self) -> bool:
        """Reserved, and due now."""
        return self.reserved and self.wait <= 0


# -- parsing ------------------------------------------------------------------

_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_RATE_TEXT = re.compile(r"^\s*(\d+)\s*(?:/\s*(\d+(?:\.\d+)?)?\s*([smhd]))?\s*$")
_SHAPE = (
    "must be a rate ('10/s', '100/m', '1000/h', '20/10s', a whole number per second, "
    "or a (count, seconds) pair), several of them, or a callable returning one"
)


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _one(value: Any) -> Window:
    if isinstance(value, str):
        match = _RATE_TEXT.match(value)
        if not match:
            raise ValueError(_SHAPE)
        count, amount, unit = match.groups()
        period = float(amount or 1) * _UNITS[unit or "s"]
        return _window(int(count), period)
    if _number(value):
        if value != int(value):
            raise ValueError(_SHAPE)
        return _window(int(value), 1.0)
    if _is_pair(value):
        count, seconds = value
        if count != int(count):
            raise ValueError(_SHAPE)
        return _window(int(count), float(seconds))
    raise ValueError(_SHAPE)


def _window(count: int, period: float) -> Window:
    if count < 1 or not 0 < period < math.inf or _ms(period / count) < 1:
        raise ValueError(_SHAPE + " (at least 1 start, at most 1 per ms)")
    return Window(count, period)


def _is_pair(value: Any) -> bool:
    return isinstance(value, (tuple, list)) and len(value) == 2 and all(map(_number, value))


def parse_rate(value: Any) -> tuple[Window, ...]:
    """A rate as its windows, sorted by period (one order for every caller).

    Accepts Celery's rate syntax (``"10/s"``, ``"100/m"``, ``"1000/h"``; a
    whole number, or its text, is per second), ``"20/10s"`` for other periods,
    a ``(count, seconds)`` pair, or a list or tuple of those (every window
    holds). A pair of two numbers is always one ``(count, seconds)`` window.

    Raises:
        ValueError: the value is none of those.
    """
    if isinstance(value, (tuple, list)) and not _is_pair(value):
        if not value:
            raise ValueError(_SHAPE)
        windows = {_one(item) for item in value}
    else:
        windows = {_one(value)}
    return tuple(sorted(windows, key=lambda w: (w.period, w.starts)))


def check_rate(value: Any) -> Any:
    """The ``redlock_rate`` check: None, a callable (resolved per call), or windows."""
    if value is None or callable(value):
        return value
    return parse_rate(value)


def resolve_rate(rate: Any, *args: Any, **kwargs: Any) -> tuple[Window, ...]:
    """The windows of a checked rate; a callable is called with the arguments
    (its None or empty result: no rate for this call).

    Raises:
        ConfigurationError: the callable returned something that is not a rate.
    """
    if not callable(rate):
        return rate or ()
    value = rate(*args, **kwargs)
    if value is None:
        return ()
    try:
        return parse_rate(value)
    except ValueError as exc:
        raise ConfigurationError(f"the rate callable returned {value!r}: {exc}") from None


# -- the script ---------------------------------------------------------------

# KEYS the rate hashes of the keys booked together.
# ARGV[1] '1' (phase 1: book the first admitted instant) or '2' (phase 2:
# compare-and-set); ARGV[2] the client's clock in ms; ARGV[3] s* in ms (phase
# 2) or ''; then per key: the version phase 1 answered (phase 2) or '', the
# count m of its windows, then m times: field, T ms, tau ms, period ms.
# Phase 1 returns {1, s, v_1, v_2, ...}: the instant booked and each hash's new
# version. Phase 2 returns {1} when every hash still had the version given,
# and then moves this node's last booking from its own instant to s*; or, a
# booking came in between, when GCRA admits s* here, booked anew beside it;
# else {0}.
RATE = Script(
    "rate",
    """
local phase, now = ARGV[1], tonumber(ARGV[2])
local keys, a = {}, 4
for i, key in ipairs(KEYS) do
  local k = {key = key, version = ARGV[a], windows = {}}
  local m = tonumber(ARGV[a + 1])
  a = a + 2
  for j = 1, m do
    k.windows[j] = {ARGV[a], tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3])}
    a = a + 4
  end
  keys[i] = k
end
local function tat(key, field) return tonumber(redis.call('HGET', key, field) or '0') end
local start
if phase == '1' then
  start = now
  for _, k in ipairs(keys) do
    for _, w in ipairs(k.windows) do start = math.max(start, tat(k.key, w[1]) - w[3]) end
  end
else
  start = tonumber(ARGV[3])
  for _, k in ipairs(keys) do
    if (redis.call('HGET', k.key, 'v') or '') ~= k.version then phase = '3' end
  end
  if phase == '3' then
    -- another booking came in between: keep mine where it is, and book s* anew
    -- only if GCRA admits it here
    for _, k in ipairs(keys) do
      for _, w in ipairs(k.windows) do
        if tat(k.key, w[1]) - w[3] > start then return {0} end
      end
    end
  end
end
local out = {1, string.format('%d', start)}
for _, k in ipairs(keys) do
  local horizon, longest = start, 0
  for _, w in ipairs(k.windows) do
    local t = tat(k.key, w[1])
    if phase == '2' then t = t - w[2] end
    t = math.max(t, start) + w[2]
    redis.call('HSET', k.key, w[1], string.format('%d', t))
    horizon, longest = math.max(horizon, t), math.max(longest, w[4])
  end
  out[#out + 1] = redis.call('HINCRBY', k.key, 'v', 1)
  redis.call('PEXPIRE', k.key, string.format('%d', math.max(1, horizon - now + longest)))
end
if phase ~= '1' then return {1} end
return out
""",
)


# -- reserving ----------------------------------------------------------------


def _args(keys: Sequence[RateKey], now_ms: int, best: str = "", versions: Sequence[Any] = ()):
    args: list[Any] = ["2" if best else "1", str(now_ms), best]
    for i, key in enumerate(keys):
        args += [str(versions[i]) if versions else "", str(len(key.windows))]
        for w in key.windows:
            interval = _ms(w.interval)
            args += [w.field, str(interval), str((key.burst - 1) * interval), str(_ms(w.period))]
    return args


def reserve(
    redlock: Redlock,
    keys: Sequence[RateKey],
    *,
    now_ms: int | None = None,
    rounds: int = ROUNDS,
) -> RateSlot:
    """Book the first instant every window of every key admits, on a quorum.

    ``now_ms`` is the client's clock (epoch ms; default: ``time.time()``).

    Raises:
        QuorumUnavailable: fewer than a quorum of nodes answered.
    """
    if not keys:
        raise ConfigurationError("a reservation needs at least one rated key")
    names = [k.key for k in keys]
    best = 0
    for attempt in range(rounds):
        now = time.time_ns() // 1_000_000 if now_ms is None else int(now_ms)
        replies = run_script(RATE, redlock.nodes, names, _args(keys, now), redlock.node_timeout)
        answers = [(i, r) for i, r in enumerate(replies) if _answer(r)]
        if not redlock.has_quorum(len(answers)):
            errors = {
                redlock.nodes[i].name: r if isinstance(r, BaseException) else f"answered {r!r}"
                for i, r in enumerate(replies)
                if not _answer(r)
            }
            raise QuorumUnavailable(errors, redlock.quorum, len(redlock.nodes))
        best = max(int(r[1]) for _, r in answers)
        booked = sum(1 for _, r in answers if int(r[1]) == best)
        behind = [(i, r) for i, r in answers if int(r[1]) < best]
        if behind:
            # Move the behind nodes' bookings to s*, where nothing came in between.
            for i, r in behind:
                reply = run_script(
                    RATE,
                    [redlock.nodes[i]],
                    names,
                    _args(keys, now, str(best), r[2:]),
                    redlock.node_timeout,
                )[0]
                booked += 1 if _answer(reply) else 0
        if redlock.has_quorum(booked):
            return RateSlot(best / 1000.0, max(0, best - now) / 1000.0)
        if attempt + 1 < rounds:
            redlock.sleep(redlock.rng() * SPLIT_PAUSE)
    now = time.time_ns() // 1_000_000 if now_ms is None else int(now_ms)
    return RateSlot(best / 1000.0, max(0, best - now) / 1000.0, reserved=False)


def reserve_named(
    redlock: Redlock,
    name: str,
    rate: Any,
    *,
    burst: int = 1,
    also: Mapping[str, Any] | Iterable[tuple[str, Any]] | None = None,
    now: float | None = None,
) -> RateSlot:
    """:meth:`Redlock.rate`: ``name``'s rate (and the rates of ``also``, names
    with their rates, burst 1) booked together. ``now``: epoch seconds."""
    keys = [RateKey(redlock.coalesce_key(name, "rate"), _checked(rate), _burst(burst))]
    pairs = also.items() if isinstance(also, Mapping) else (also or ())
    for other, other_rate in pairs:
        keys.append(RateKey(redlock.coalesce_key(other, "rate"), _checked(other_rate)))
    now_ms = None if now is None else int(now * 1000)
    return reserve(redlock, keys, now_ms=now_ms)


def _checked(rate: Any) -> tuple[Window, ...]:
    if isinstance(rate, tuple) and rate and all(isinstance(w, Window) for w in rate):
        return rate
    try:
        return parse_rate(rate)
    except ValueError as exc:
        raise ConfigurationError(f"rate {exc}, got {rate!r}") from None


def _burst(burst: Any) -> int:
    if isinstance(burst, bool) or not isinstance(burst, int) or burst < 1:
        raise ConfigurationError(f"burst must be a whole number >= 1, got {burst!r}")
    return burst


# -- looking -------------------------------------------------------------------


class RateView(NamedTuple):
    """A rated key as a quorum sees it (:func:`peek`)."""

    key: str
    #: Per window: (window, its latest TAT in epoch seconds or None: the window is
    #: booked up to that instant, and admits a start again once it comes).
    windows: tuple[tuple[Window, float | None], ...]
    #: The first instant a new start would get (epoch seconds; with burst 1).
    next_start: float
    #: Nodes that answered.
    answered: int


def peek(
    redlock: Redlock, name: str, rate: Any, *, now: float | None = None, key: str | None = None
) -> RateView:
    """How ``name``'s rate stands: per window the instant it is booked up to, and
    the next admissible start (burst 1), the latest the answering nodes know. Read-only.

    Raises:
        QuorumUnavailable: fewer than a quorum of nodes answered.
    """
    windows = _checked(rate)
    full_key = key or redlock.coalesce_key(name, "rate")
    replies = gather(redlock.nodes, ("HGETALL", full_key), redlock.node_timeout)
    redlock.check_quorum(replies)
    now_s = time.time() if now is None else now
    rows = []
    nxt = now_s
    for w in windows:
        tats = [_tat(r, w.field) for r in replies if not isinstance(r, BaseException)]
        latest = max((t for t in tats if t is not None), default=None)
        if latest is not None:
            nxt = max(nxt, latest)
        rows.append((w, latest))
    answered = sum(1 for r in replies if not isinstance(r, BaseException))
    return RateView(full_key, tuple(rows), nxt, answered)


def _tat(reply: Any, field: str) -> float | None:
    if isinstance(reply, dict):
        pairs = list(reply.items())
    elif isinstance(reply, list):
        pairs = list(zip(reply[::2], reply[1::2]))
    else:
        return None
    for k, v in pairs:
        k = k.decode() if isinstance(k, bytes) else k
        if k == field:
            return int(v) / 1000.0
    return None


def _answer(reply: Any) -> bool:
    return isinstance(reply, list) and bool(reply) and int(reply[0]) == 1


def _ms(seconds: float) -> int:
    return int(round(seconds * 1000))


def _seconds_text(seconds: float) -> str:
    for unit, size in (("d", 86400.0), ("h", 3600.0), ("m", 60.0)):
        if seconds == size:
            return unit
    if seconds == 1.0:
        return "s"
    return f"{seconds:g}s"


#: For type checkers: what a rate callable looks like.
RateCallable = Callable[..., Any]
