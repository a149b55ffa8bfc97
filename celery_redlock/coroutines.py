"""``async def`` bodies of a :class:`~celery_redlock.LockedTask`, run inside their lease.

Under Celery's own pools (prefork, threads, solo) a task's ``__call__`` is a
plain call: an ``async def`` body would come back as an un-awaited coroutine,
after the lease was released. A LockedTask runs that coroutine to completion
inside its lease instead, on an event loop of the worker's thread (one per
thread of each process, reused from call to call, made anew after a fork),
while the process's heartbeat thread renews the lease as for a sync body.

Where that cannot be guaranteed the task refuses to bind: under an asyncio
pool of another project (``celery-aio-pool``, ``celery-pool-asyncio``), which
awaits the coroutine itself after ``__call__`` returned, so the lease would
not cover it. A call made from a thread whose event loop is already running
fails with the same message.
"""

from __future__ import annotations

import asyncio
import inspect
import os
import sys
import threading
from collections.abc import Coroutine
from typing import Any

from .conf import ImproperlyConfigured

__all__ = ["check", "is_async", "run"]

#: Modules of pools that await a task's coroutine after ``__call__`` returned.
AWAITING_POOLS = ("celery_aio_pool", "celery_pool_asyncio")

_local = threading.local()


def is_async(task_cls: Any) -> bool:
    """Whether the task's body is an ``async def``."""
    return inspect.iscoroutinefunction(task_cls.run)


def _refusal(name: str, why: str) -> str:
    return (
        f"{name}: an async def body holds its lock only when the worker runs it inside "
        f"__call__ (Celery's prefork, threads or solo pools); {why}"
    )


def check(task_cls: Any, name: str) -> None:
    """Refuse an ``async def`` body where its lease could not cover it.

    Raises:
        ImproperlyConfigured: an asyncio pool that awaits the body itself is loaded.
    """
    if not is_async(task_cls):
        return
    loaded = [m for m in AWAITING_POOLS if m in sys.modules]
    if loaded:
        raise ImproperlyConfigured(
            _refusal(name, f"{loaded[0]} awaits it after the lock is released")
        )


def _loop() -> asyncio.AbstractEventLoop:
    """This thread's loop, made once per process (a forked child makes its own)."""
    loop = getattr(_local, "loop", None)
    if loop is None or loop.is_closed() or getattr(_local, "pid", None) != os.getpid():
        loop = asyncio.new_event_loop()
        _local.loop, _local.pid = loop, os.getpid()
    return loop


def run(coro: Coroutine[Any, Any, Any], name: str) -> Any:
    """Run the body's coroutine to completion on this thread's loop.

    Raises:
        ImproperlyConfigured: an event loop already runs in this thread.
    """
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return _loop().run_until_complete(coro)
    coro.close()
    raise ImproperlyConfigured(_refusal(name, "here an event loop already runs in its thread"))
