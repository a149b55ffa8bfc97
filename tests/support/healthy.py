"""A ``Redlock`` for tests whose nodes are all healthy."""

from __future__ import annotations

from typing import Any

from celery_redlock.redlock import Redlock

# No test on healthy nodes is about a round's timeout. The library's 50 ms
# default is shorter than a stall of the test process on a loaded machine (a
# garbage collection, two busy cores): a round that misses every reply would
# fail a test about something else.
HEALTHY_NODE_TIMEOUT = 2.0


def healthy(urls: Any, **options: Any) -> Redlock:
    """A ``Redlock`` on healthy nodes: the options given, a generous node timeout."""
    options.setdefault("node_timeout", HEALTHY_NODE_TIMEOUT)
    return Redlock(urls, **options)
