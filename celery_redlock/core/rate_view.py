"""A rated key's schedule as the nodes hold it: read-only (``celery redlock status``).

This module is core: it imports neither celery nor kombu. What the schedule
means is in :mod:`.rates`.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from .ops import Fields, ReadHash, ReadScores, Scores
from .records import RateView
from .windows import RateKey, Window, checked_rate, paced

__all__ = ["peek_rate"]


def peek_rate(
    redlock: Any, name: str, rate: Any, *, now: float | None = None, key: str | None = None
) -> RateView:
    """How ``name``'s rate stands on ``redlock``'s nodes: per window the instant it is
    booked up to, and the next admissible start (burst 1), the latest the answering
    nodes know. Read-only.

    Raises:
        QuorumUnavailable: fewer than a quorum of nodes answered.
    """
    windows = checked_rate(rate)
    q, keyspace = redlock._rates.quorum, redlock._rates.keyspace
    full_key = key or keyspace.coalesce_key(name, "rate")
    replies = q.run(ReadHash(full_key))
    q.check(replies)
    starts = keyspace.coalesce_key(name, "starts") if key is None else _starts_key(key)
    recorded = q.run(ReadScores(starts))
    pace = paced(windows)
    logs: list[tuple[float, ...]] = [()] * len(replies)
    if len(windows) > 1:
        log = RateKey(full_key, windows).log
        logs = [_scores(r) for r in q.run(ReadScores(log))]
    rows = []
    nxt = time.time() if now is None else now
    for w in windows:
        ats = [
            _admits(r, log, w, w != pace)
            for r, log in zip(replies, logs)
            if not isinstance(r, BaseException)
        ]
        latest = max((t for t in ats if t is not None), default=None)
        if latest is not None:
            nxt = max(nxt, latest)
        rows.append((w, latest))
    answered = sum(1 for r in replies if not isinstance(r, BaseException))
    return RateView(full_key, tuple(rows), nxt, answered, _union(recorded))


def _starts_key(rate_key: str) -> str:
    """The sorted set of starts beside a rate hash given by its key (``{prefix}:rate:{name}``
    -> ``{prefix}:starts:{name}``: the family follows the prefix, before the name's braces)."""
    head, brace, name = rate_key.partition("{")
    return head.replace(":rate:", ":starts:") + brace + name


def _union(replies: Sequence[Any]) -> tuple[float, ...]:
    """The starts every answering node recorded, each once (its earliest score)."""
    seen: dict[str, float] = {}
    for reply in replies:
        if isinstance(reply, Scores):
            for member, score in reply.items:
                seen[member] = min(score, seen.get(member, score))
    return tuple(sorted(score / 1000.0 for score in seen.values()))


def _admits(reply: Any, log: Sequence[float], window: Window, counted: bool) -> float | None:
    """When ``window`` admits a start again on the node that answered ``reply`` (its
    rate hash) and ``log`` (its bookings' instants, epoch ms, oldest first): the
    paced window's TAT, a full counted window's N-th latest booking plus the period
    (see :data:`.nodes.scripts.rates.RATE`); None when it admits one now."""
    if counted:
        if len(log) < window.starts:
            return None
        return (log[-window.starts] + _ms(window.period)) / 1000.0
    if not isinstance(reply, Fields):
        return None
    for field, value in reply.items:
        if field == window.field:
            return int(value) / 1000.0
    return None


def _scores(reply: Any) -> tuple[float, ...]:
    """A sorted set's scores, in order (none for a node that failed)."""
    return tuple(score for _, score in reply.items) if isinstance(reply, Scores) else ()


def _ms(seconds: float) -> int:
    return int(round(seconds * 1000))
