"""The read-only scripts: one key's copy on a node, with its TTL."""

from __future__ import annotations

from .shared import Script

__all__ = ["INSPECT", "PEEK"]

# KEYS[1] lock key, KEYS[2] fence key. Returns {holder or false, pttl_ms, fence or false}.
INSPECT = Script(
    "inspect",
    """
return {redis.call('GET', KEYS[1]), redis.call('PTTL', KEYS[1]), redis.call('GET', KEYS[2])}
""",
)

# KEYS[1] any key. Returns {value or false, pttl_ms}.
PEEK = Script(
    "peek",
    """
return {redis.call('GET', KEYS[1]), redis.call('PTTL', KEYS[1])}
""",
)
