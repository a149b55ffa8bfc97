"""A worker whose locks cannot work refuses to start.

On ``worker_init`` (the worker's main process, before its pool starts and
before it consumes a message) every node set the app's LockedTasks use is
resolved and each of its nodes asked once (:data:`START_CHECK_TIMEOUT`). The
worker exits with status 1, naming the node, the cause and the fix, when:

* the app names no lock node: no ``redlock_nodes``, and a broker that is not
  Redis (which could otherwise serve as the one node);
* a node's error cannot heal without a fix (``heals`` False on its
  :class:`~celery_redlock.exceptions.NodeError`): authentication refused, a
  database or schema missing (or of another version), a TLS certificate not
  verified. A node that is merely down is an outage: the worker starts, and
  says so on ``worker_ready`` (see :mod:`celery_redlock.signals`).

Celery catches what a signal receiver raises and only logs it, so the refusal
is a ``SystemExit``: it ends the worker's start-up there, and its message goes
to stderr (logging is not set up yet on ``worker_init``).
"""

from __future__ import annotations

import functools
import sys
import warnings
from typing import Any

from celery import signals as celery_signals

from .core import Redlock, ping
from .core.exceptions import heals
from .exceptions import RedlockError
from .outage import cause_and_fix
from .plan import plan_of

__all__ = ["START_CHECK_TIMEOUT", "install", "problems"]

#: Seconds each node gets, connecting included, to answer the start-up check.
START_CHECK_TIMEOUT = 1.0


def install(app: Any) -> None:
    """Connect the start-up check for ``app`` (idempotent: one receiver per app)."""
    celery_signals.worker_init.connect(
        functools.partial(_refuse_unusable, app),
        weak=False,
        dispatch_uid=f"celery_redlock:{id(app)}:refuse",
    )


def _refuse_unusable(app: Any, sender: Any = None, **_: Any) -> None:
    """``worker_init``: exit the worker when its locks cannot work (see the module)."""
    if getattr(sender, "app", None) is not app:
        return
    found = problems(app)
    if found:
        lines = "\n".join(f"  - {problem}" for problem in found)
        sys.stderr.write(
            f"celery_redlock: ERROR: this worker cannot take its tasks' locks, so it does "
            f"not start (no message was consumed):\n{lines}\n"
        )
        sys.stderr.flush()
        raise SystemExit(1)


def problems(app: Any, timeout: float = START_CHECK_TIMEOUT) -> list[str]:
    """What keeps the app's LockedTasks from taking any lock, one line each (none: they can)."""
    found: list[str] = []
    seen: dict[tuple[str, ...], Any] = {}
    for task in list(app.tasks.values()):
        plan = plan_of(task)
        if plan is None:
            continue
        try:
            names = tuple(node.name for node in plan.redlock.nodes)
        except RedlockError as exc:  # no lock node named (a bad URL failed at bind)
            if str(exc) not in found:
                found.append(str(exc))
            continue
        seen.setdefault(names, plan.resolved)
    for settings in seen.values():
        found += unhealed(settings, timeout)
    return found


def checking_client(settings: Any, timeout: float = START_CHECK_TIMEOUT) -> Redlock:
    """A client of the nodes of ``settings`` for a check at start, with ``timeout``."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the plan's own client gave its warnings
        options = {**settings.redlock_options(), "node_timeout": timeout}
        return Redlock(settings.node_list, **options)


def unhealed(settings: Any, timeout: float = START_CHECK_TIMEOUT) -> list[str]:
    """The nodes of ``settings`` whose error cannot heal, each with its cause and fix."""
    client = checking_client(settings, timeout)
    try:
        replies = ping(client)
        return [
            cause_and_fix(node.name, reply)
            for node, reply in zip(client.nodes, replies)
            if isinstance(reply, Exception) and not heals(reply)
        ]
    finally:
        client.close()
