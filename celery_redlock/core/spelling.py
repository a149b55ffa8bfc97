"""Telling a misspelt setting's name from another key: the declared name a
name most likely meant."""

from __future__ import annotations

import difflib
from collections.abc import Iterable

__all__ = ["PREFIX_EDITS", "closest", "misspelt_prefix"]


def closest(name: str, declared: Iterable[str]) -> str | None:
    """The declared name a misspelt ``name`` most likely meant, if any is close."""
    matches = difflib.get_close_matches(name, list(declared), n=1, cutoff=0.6)
    return matches[0] if matches else None


#: Edits, at most, between a misspelt prefix and ``redlock`` (see :func:`misspelt_prefix`).
PREFIX_EDITS = 2


def misspelt_prefix(key: str, declared: Iterable[str]) -> str | None:
    """The declared ``redlock_*`` setting that ``key`` names under a misspelt
    prefix (``redlok_nodes``, ``redis_lock_ttl``), if any.

    Tight, so that other keys of ``app.conf`` never match: what follows the
    prefix must be a setting's own part exactly (``nodes``, ``ttl``), and the
    prefix must start with ``r`` and be :data:`PREFIX_EDITS` edits from
    ``redlock`` at most, once its ``_`` are removed (``redis_lock``: 2;
    ``redis``: 4, so Celery's ``redis_*`` settings are never taken for one).
    """
    if not key.startswith("r") or key.startswith("redlock_"):
        return None
    names = set(declared)
    for i, char in enumerate(key):
        if char != "_":
            continue
        name = "redlock_" + key[i + 1 :]
        if name in names and _edits(key[:i].replace("_", ""), "redlock") <= PREFIX_EDITS:
            return name
    return None


def _edits(a: str, b: str) -> int:
    """Levenshtein distance: insertions, deletions and substitutions from ``a`` to ``b``."""
    row = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        diagonal, row[0] = row[0], i
        for j, y in enumerate(b, 1):
            diagonal, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, diagonal + (x != y))
    return row[-1]
