"""A tiny Celery app for the ``celery redlock`` command tests.

The tests build it with :func:`make_app`; a ``python -m celery -A
tests.integration.cli_app redlock ...`` subprocess gets the module-level
``app``, whose lock nodes come from ``CRL_CLI_NODES`` (URLs separated by
commas). Nothing connects to Redis at import.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from celery import Celery

from celery_redlock.task import LockedTask

#: The LockedTask of the app, and a plain task the CLI must refuse.
SETTLE = "cli.settle"
PLAIN = "cli.plain"
#: A rated LockedTask: at most 10 starts per minute per customer.
SYNC = "cli.sync"
#: A queued LockedTask: every call of an order runs, in publish order.
QUEUED = "cli.ticket"


def make_app(nodes: Sequence[str], main: str = "cli_app", **settings: Any) -> Celery:
    """An app whose lock nodes are ``nodes``, with ``settings`` added to ``app.conf``."""
    app = Celery(main, broker="memory://", set_as_current=False)
    if nodes:  # none: the broker is the one lock node
        app.conf.redlock_nodes = list(nodes)
        if any(url.startswith("postgresql://") for url in nodes):
            # a PostgreSQL node's call is a commit: the 500 ms its page advises
            settings.setdefault("redlock_node_timeout", 0.5)
    app.conf.update(**settings)

    # shared=False: a shared task would be registered on every app made later.
    @app.task(
        base=LockedTask, bind=True, shared=False, name=SETTLE, lock_on=("account_id",), lock_ttl=30
    )
    def settle(self: Any, account_id: int, amount: int = 0, fencing_token: Any = None) -> Any:
        return fencing_token

    @app.task(base=LockedTask, shared=False, name=SYNC, lock_on=("customer_id",), lock_rate="10/m")
    def sync(customer_id: int) -> None:
        return None

    # A queue runs every call: it binds only where the app sets no enqueue claims,
    # debounce or throttle for every task.
    coalescing = ("redlock_enqueue", "redlock_debounce", "redlock_throttle")
    if not any(settings.get(name) for name in coalescing):

        @app.task(
            base=LockedTask,
            shared=False,
            name=QUEUED,
            lock_on=("order_id",),
            lock_on_duplicate="queue",
        )
        def queued(order_id: int, step: int = 0) -> None:
            return None

    @app.task(shared=False, name=PLAIN)
    def plain() -> None:
        return None

    return app


app = make_app(os.environ.get("CRL_CLI_NODES", "redis://127.0.0.1:6379/0").split(","))
