"""Rate windows: ``"10/s"``, ``(count, seconds)`` and several at once, parsed and checked.

The ``redlock_rate`` setting checks its values here, and a :class:`RateKey`
names a key's windows and burst; :mod:`.rates` books starts against them.
"""

from __future__ import annotations

import math
import re
from typing import Any, NamedTuple

from .exceptions import ConfigurationError

__all__ = [
    "RateKey",
    "Window",
    "check_rate",
    "checked_burst",
    "checked_rate",
    "paced",
    "parse_rate",
    "resolve_rate",
]


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


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


_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_RATE_TEXT = re.compile(r"^\s*(\d+)\s*(?:/\s*(\d+(?:\.\d+)?)?\s*([smhd]))?\s*$")
_SHAPE = (
    "must be a rate ('10/s', '100/m', '1000/h', '20/10s', a whole number per second, "
    "or a (count, seconds) pair), several of them, or a callable returning one"
)


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


def _ms(seconds: float) -> int:
    return int(round(seconds * 1000))


def _seconds_text(seconds: float) -> str:
    for unit, size in (("d", 86400.0), ("h", 3600.0), ("m", 60.0)):
        if seconds == size:
            return unit
    if seconds == 1.0:
        return "s"
    return f"{seconds:g}s"


class RateKey(NamedTuple):
    """One key's windows and burst, booked together with the other keys of a reservation.

    ``starts``: the sorted set where rated grants record their starts (see
    :class:`.rates.RatedRound`); '' for a key booked on its own (:meth:`.rates.Rates.rate`).
    """

    key: str
    windows: tuple[Window, ...]
    burst: int = 1
    starts: str = ""

    @property
    def log(self) -> str:
        """The sorted set of the bookings its counted windows count, beside the hash
        (``{prefix}:rate:{name}`` -> ``{prefix}:booked:{name}``, in its hash slot)."""
        head, brace, name = self.key.partition("{")
        family, sep, tail = head.rpartition(":rate:")
        return (family + ":booked:" + tail if sep else head + "booked:") + brace + name

    @property
    def pace(self) -> Window:
        """The window that spaces starts (GCRA, with the burst): the shortest interval."""
        return paced(self.windows)


def paced(windows: tuple[Window, ...]) -> Window:
    """Of several windows, the one that spaces the starts: the shortest interval (then
    the shortest period). Each other window counts its starts instead: ``("10/s",
    "500/h")`` goes at 10/s until an hour's 500 are booked."""
    return min(windows, key=lambda w: (w.interval, w.period))


def resolve_rate(rate: Any, /, *args: Any, **kwargs: Any) -> tuple[Window, ...]:
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


def checked_rate(rate: Any) -> tuple[Window, ...]:
    """The windows of ``rate`` (windows already, or anything :func:`parse_rate` takes)."""
    if isinstance(rate, tuple) and rate and all(isinstance(w, Window) for w in rate):
        return rate
    try:
        return parse_rate(rate)
    except ValueError as exc:
        raise ConfigurationError(f"rate {exc}, got {rate!r}") from None


def checked_burst(burst: Any) -> int:
    """``burst``, a whole number of starts at least 1."""
    if isinstance(burst, bool) or not isinstance(burst, int) or burst < 1:
        raise ConfigurationError(f"burst must be a whole number >= 1, got {burst!r}")
    return burst
