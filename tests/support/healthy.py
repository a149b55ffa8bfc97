"""A ``Redlock`` for tests whose nodes are all healthy."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from celery_redlock.redlock import Redlock

# No test on healthy nodes is about a round's timeout. The library's 50 ms
# default is shorter than a stall of the test process on a loaded machine (a
# garbage collection, two busy cores): a round that misses every reply would
# fail a test about something else.
HEALTHY_NODE_TIMEOUT = 2.0


def healthy(urls: Any, **options: Any) -> Redlock:
    """A ``Redlock`` on healthy nodes: the options given, a generous node timeout,
    and a connect timeout as long (a PostgreSQL node forks a backend for each new
    connection: eight threads connecting at once beside a second test run took
    longer than the 1 s default)."""
    options.setdefault("node_timeout", HEALTHY_NODE_TIMEOUT)
    options.setdefault("connect_timeout", options["node_timeout"])
    return Redlock(urls, **options)


def healthy_under(nodes: Any, key_prefix: str) -> Iterator[Redlock]:
    """A fixture's body: :func:`healthy` on ``nodes`` under ``key_prefix``, whose
    keys are deleted from every node afterwards."""
    yield healthy(nodes.urls, key_prefix=key_prefix)
    for node in nodes:
        with node.client() as c:
            for key in c.scan_iter(f"{key_prefix}:*"):
                c.delete(key)
