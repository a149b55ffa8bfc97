"""The threads of a process that open connections in the background.

:func:`~celery_redlock.core.nodes.redis.rounds.gather` opens a round's new connections all
at once, each in a thread of :func:`connector` with a timeout of its own
(:mod:`~celery_redlock.core.nodes.redis.opening`), and a ``sentinel://`` node asks its
sentinels all at once (:mod:`~celery_redlock.core.nodes.redis.sentinels`): a hung
node or sentinel then costs its own timeout, never the others' time.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any

from .nodes.guard import ProcessLocal

__all__ = ["Connector", "connector"]


class Connector:
    """The threads of this process that open connections in the background.

    No thread per round: a thread waits for the next connect, and ends after
    :data:`_THREAD_IDLE` seconds without one; there are as many as connects
    were in flight at once (a hung node holds one for its connect timeout).
    Created at first use; a forked child starts with none (:func:`connector`).
    """

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._idle = 0

    def submit(self, fn: Callable[..., None], *args: Any) -> None:
        with self._lock:
            spawn = not self._idle
            if not spawn:
                self._idle -= 1
        self._jobs.put((fn, args))
        if spawn:
            threading.Thread(target=self._work, name="redlock-connect", daemon=True).start()

    def _work(self) -> None:
        while True:
            try:
                fn, args = self._jobs.get(timeout=_THREAD_IDLE)
            except queue.Empty:
                with self._lock:
                    if self._idle:
                        self._idle -= 1
                        return
                continue
            try:
                fn(*args)
            except Exception:  # pragma: no cover - the jobs catch their own errors
                pass
            with self._lock:
                self._idle += 1


#: Seconds a connecting thread waits for work before it ends.
_THREAD_IDLE = 30.0


@ProcessLocal
def connector() -> Connector:
    """This process's :class:`Connector`, created at first use."""
    return Connector()
