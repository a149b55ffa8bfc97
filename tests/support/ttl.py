"""A TTL read back after it was set, bounded by the event rather than the clock."""

from __future__ import annotations

import time


def left_at_least(since: float, ttl_ms: int) -> int:
    """The least a TTL of ``ttl_ms`` set after ``since`` (``time.monotonic()``) can
    have left now: what a loaded host spent between the write and the read is
    taken off, not guessed (10 ms more: a server reckons an expiry from the time it
    cached for the command, and PTTL rounds down)."""
    return ttl_ms - int((time.monotonic() - since) * 1000) - 10
