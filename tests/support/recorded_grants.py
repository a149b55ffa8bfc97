"""The grant loop that the mutual-exclusion and the fencing tests share.

:func:`grant_loop` takes a lock again and again and, while holding it, appends
its fencing token to a list on a recorder node outside the quorum: the lock
orders the appends, so the list is the grant order. It runs in threads and in
forked worker processes alike.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Sequence

import redis

from celery_redlock.exceptions import QuorumUnavailable
from celery_redlock.redlock import Redlock

__all__ = ["grant_loop"]


def grant_loop(
    urls: Sequence[str],
    recorder_url: str,
    name: str,
    target: int,
    seconds: float,
    *,
    ttl: float = 5.0,
    node_timeout: float = 0.05,
    acquire_timeout: float = 0.2,
    retry_delay: float = 0.002,
    retry_delay_max: float = 0.02,
    hold: float = 0.0,
    processes: int = 0,
) -> None:
    """Take ``name`` until the recorder holds ``target`` tokens, or has a ``stop``
    key, or ``seconds`` pass.

    Recorder keys: ``tokens`` (grant order), ``who`` (``pid:thread`` per grant),
    ``occupancy`` / ``overlaps`` (another holder was inside), ``late`` (the
    lease had lapsed by the end of the critical section, so the order of that
    append is not guaranteed), ``quorum_errors``. ``hold`` widens each critical
    section by that many seconds. ``processes``: the target counts once that
    many processes have held ``name`` too (``pids``), so a slow process on a
    busy host is waited for, not missed.
    """
    rl = Redlock(urls, node_timeout=node_timeout)
    rec = redis.Redis.from_url(recorder_url, socket_timeout=5, retry=None)
    who = f"{os.getpid()}:{threading.get_ident()}"

    def enough(count: int) -> bool:
        return count >= target and (not processes or rec.scard("pids") >= processes)

    end = time.monotonic() + seconds
    while time.monotonic() < end:
        try:
            lease = rl.acquire(
                name,
                ttl=ttl,
                blocking=True,
                timeout=acquire_timeout,
                retry_delay=retry_delay,
                retry_delay_max=retry_delay_max,
            )
        except QuorumUnavailable:
            rec.incr("quorum_errors")
            continue
        if lease is None:
            if enough(rec.llen("tokens")) or rec.exists("stop"):
                return
            continue
        try:
            pipe = rec.pipeline(transaction=False)
            pipe.incr("occupancy").rpush("tokens", lease.fencing_token).rpush("who", who)
            inside, count, _, stop = pipe.exists("stop").sadd("pids", os.getpid()).execute()[:4]
            if inside != 1:
                rec.incr("overlaps")
            if hold:
                time.sleep(hold)
            if lease.remaining() <= 0:
                rec.incr("late")
            rec.decr("occupancy")
        finally:
            rl.release(lease)
        if enough(count) or stop:
            return
