"""The Redis keys of a name, all in one hash slot.

``{prefix}:lock:{name}`` and ``{prefix}:fence:{name}``; with permits, also
``{prefix}:permit:{name}:{i}`` for i = 1 .. K-1; a name's claim, its burst or
throttle timing and its receipts beside them. A name with no hash tag is
wrapped in one (``{name}``) so that all its keys live in one slot if a node
is itself a Redis Cluster.
"""

from __future__ import annotations

from .exceptions import ConfigurationError

__all__ = ["KeySpace", "tagged"]


def tagged(name: str) -> str:
    """The name with a Redis Cluster hash tag: its own ``{...}``, or the whole name in braces."""
    if not isinstance(name, str) or not name:
        raise ConfigurationError(f"a lock name must be a non-empty string, got {name!r}")
    return name if ("{" in name and "}" in name.split("{", 1)[1]) else f"{{{name}}}"


class KeySpace:
    """The keys under one prefix."""

    __slots__ = ("key_prefix",)

    def __init__(self, key_prefix: str):
        self.key_prefix = key_prefix

    def keys(self, name: str) -> tuple[str, str]:
        """The lock key and the fence key of a name."""
        tag = tagged(name)
        return f"{self.key_prefix}:lock:{tag}", f"{self.key_prefix}:fence:{tag}"

    def permit_keys(self, name: str, limit: int) -> list[str]:
        """The keys of a name's ``limit`` permits: the lock key, then
        ``{prefix}:permit:{name}:{i}`` for i = 1 .. limit-1, all in the lock key's hash slot."""
        tag = tagged(name)
        first = f"{self.key_prefix}:lock:{tag}"
        return [first] + [f"{self.key_prefix}:permit:{tag}:{i}" for i in range(1, limit)]

    def claim_key(self, name: str) -> str:
        """The key of a name's claim (:meth:`claim_next`), in the lock key's hash slot."""
        return f"{self.key_prefix}:claim:{tagged(name)}"

    def coalesce_key(self, name: str, kind: str) -> str:
        """The key where :meth:`debounce` (``"burst"``) or :meth:`throttle` (``"throttle"``)
        keeps its timing, in the lock key's hash slot."""
        return f"{self.key_prefix}:{kind}:{tagged(name)}"

    def receipt_key(self, name: str, id: str) -> str:
        """The key recording that ``id`` finished holding ``name``, in the lock key's hash slot."""
        return f"{self.key_prefix}:receipt:{tagged(name)}:{id}"

    def full(self, key: str) -> str:
        """``key`` under the prefix (a one-shot claim's key, :meth:`Redlock.claim`)."""
        return f"{self.key_prefix}:{key}"
