"""Result backends whose RETRY store comes as late as the worker lets it.

Celery stores an execution's RETRY after the execution raised ``Retry``. If
the retried message is already on the broker by then, a new execution can
run and store its own (terminal) state first, and the RETRY lands over it.
These backends make that happen every time it can happen, instead of hoping
for load: :meth:`mark_as_retry` of a watched task id waits, when that id was
published again since the execution started, until a later execution stored
a terminal state.
Where the new message is published only after the RETRY store (as it must
be), nothing waits.

Used in-process (a threads-pool worker in the test's process): the gates
live in this module, and the publish is seen through ``before_task_publish``.

``result_backend = "tests.support.late_retry:LateRedisBackend+redis://..."``,
or ``"tests.support.late_retry:LateDatabaseBackend+sqlite:///..."``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from celery import signals, states
from celery.backends.database import DatabaseBackend
from celery.backends.redis import RedisBackend

__all__ = ["Gate", "LateDatabaseBackend", "LateRedisBackend", "watch"]


class Gate:
    """What happened to one watched task id."""

    def __init__(self, on_republish: Callable[[], Any] | None, fail_retry: bool) -> None:
        self.on_republish = on_republish
        #: Whether storing RETRY fails (the result backend is down for that write).
        self.fail_retry = fail_retry
        self.publishes = 0
        #: Set when the id is published again (its first publish is the test's).
        self.republished = threading.Event()
        #: Set when a terminal state of the id is stored.
        self.terminal = threading.Event()
        #: Set when the RETRY store returned; ``held`` says whether it had to wait.
        self.retry_stored = threading.Event()
        self.held = False
        self.states: list[str] = []


_gates: dict[str, Gate] = {}


def watch(
    task_id: str, on_republish: Callable[[], Any] | None = None, fail_retry: bool = False
) -> Gate:
    """Watch ``task_id``; ``on_republish()`` runs as it is published again, before it is
    sent; with ``fail_retry`` its RETRY store raises ``ConnectionError``."""
    gate = _gates[task_id] = Gate(on_republish, fail_retry)
    return gate


def _published(headers: Any = None, **_: Any) -> None:
    gate = _gates.get((headers or {}).get("id"))
    if gate is None:
        return
    gate.publishes += 1
    if gate.publishes > 1 and not gate.republished.is_set():
        if gate.on_republish is not None:
            gate.on_republish()
        gate.republished.set()


#: Per worker thread: how many times the id of its execution was published when it began.
_began = threading.local()


def _started(task_id: str | None = None, **_: Any) -> None:
    gate = _gates.get(task_id or "")
    if gate is not None:
        _began.publishes = gate.publishes


signals.before_task_publish.connect(_published, weak=False, dispatch_uid="late_retry")
signals.task_prerun.connect(_started, weak=False, dispatch_uid="late_retry")


class _Late:
    """The hook, over any backend: RETRY as late as the worker lets it."""

    def mark_as_retry(self, task_id: str, *args: Any, **kwargs: Any) -> Any:
        gate = _gates.get(task_id)
        # The id published again since this execution started: its successor is out.
        began = getattr(_began, "publishes", 0)
        if gate is not None and gate.publishes > began and not gate.terminal.is_set():
            gate.held = True
            gate.terminal.wait(60)  # the new execution runs meanwhile, and ends
        try:
            if gate is not None and gate.fail_retry:
                raise ConnectionError("the result backend refused the RETRY (test)")
            return super().mark_as_retry(task_id, *args, **kwargs)  # type: ignore[misc]
        finally:
            if gate is not None:
                gate.retry_stored.set()

    def store_result(self, task_id: str, result: Any, state: str, *args: Any, **kw: Any) -> Any:
        stored = super().store_result(task_id, result, state, *args, **kw)  # type: ignore[misc]
        gate = _gates.get(task_id)
        if gate is not None:
            gate.states.append(state)
            if state in states.READY_STATES:
                gate.terminal.set()
        return stored


class LateRedisBackend(_Late, RedisBackend):
    """Celery's Redis result backend, its RETRY stores late (see the module docstring)."""


class LateDatabaseBackend(_Late, DatabaseBackend):
    """Celery's SQLAlchemy result backend, its RETRY stores late."""
