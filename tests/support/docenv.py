"""What the manual's examples run against when ``sphinx-build -b doctest`` runs them.

Each page's hidden ``testsetup`` calls :func:`start`: three lock nodes and a
broker node, real redis-server processes on loopback, their URLs put where the
examples read them (``$REDLOCK_NODES``, ``$BROKER_URL``, as a deployment would
give them). A page whose example needs a worker starts one, in a thread of the
build process, once its tasks are defined (:func:`worker`). The page's hidden
``testcleanup`` calls :func:`stop`, which stops the worker and the nodes.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any

from celery_redlock.testing import RedisNodes

_stack: contextlib.ExitStack | None = None


def start() -> RedisNodes:
    """Start the nodes of one page and export their URLs; returns the lock nodes."""
    global _stack
    stop()
    _stack = contextlib.ExitStack()
    nodes = _stack.enter_context(RedisNodes(3))
    broker = _stack.enter_context(RedisNodes(1))[0]
    os.environ["REDLOCK_NODES"] = ",".join(nodes.urls)
    os.environ["BROKER_URL"] = broker.url
    _stack.callback(os.environ.pop, "REDLOCK_NODES", None)
    _stack.callback(os.environ.pop, "BROKER_URL", None)
    return nodes


def worker(app: Any, concurrency: int = 4) -> None:
    """Run a real worker (threads pool) for ``app`` until :func:`stop`."""
    from celery.contrib.testing.worker import start_worker

    assert _stack is not None, "start() first"
    app.conf.worker_hijack_root_logger = False  # leave the logging of the host process alone
    _stack.enter_context(
        start_worker(app, pool="threads", concurrency=concurrency, perform_ping_check=False)
    )


def stop() -> None:
    """Stop the worker and the nodes of the page; idempotent."""
    global _stack
    if _stack is not None:
        stack, _stack = _stack, None
        stack.close()
