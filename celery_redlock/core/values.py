"""Values at the boundary: arguments checked, seconds to milliseconds, replies as text."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from . import settings
from .exceptions import ConfigurationError

__all__ = ["checked", "error_text", "ms", "positive", "readable", "text"]

_INF = float("inf")


def checked(name: str, check: Callable[[Any], Any], value: Any) -> Any:
    """``check(value)``, its ValueError raised as a ConfigurationError naming ``name``."""
    try:
        return check(value)
    except ValueError as exc:
        raise ConfigurationError(f"{name} {exc}, got {value!r}") from None


def positive(name: str, value: Any) -> None:
    """Refuse a duration that is not a positive finite number of seconds."""
    # Durations must be finite: they become PX milliseconds. The test inline is
    # only a fast path for plain numbers; the rule is settings.check_seconds.
    if (value.__class__ is float or value.__class__ is int) and 0 < value < _INF:
        return
    checked(name, settings.check_seconds, value)


def ms(seconds: float) -> int:
    """Seconds as whole milliseconds, at least 1 (a PX of 0 is refused)."""
    return max(1, int(seconds * 1000))


def text(value: Any) -> str | None:
    """A reply value as a string; None (and Lua's false) stay None."""
    if value is None or value is False:
        return None
    return value.decode() if isinstance(value, bytes) else str(value)


def readable(value: Any) -> Any:
    """A reply as text, whatever bytes it holds (None stays None)."""
    return value.decode("utf-8", "backslashreplace") if isinstance(value, bytes) else value


def error_text(exc: BaseException) -> str:
    return str(exc) or type(exc).__name__
