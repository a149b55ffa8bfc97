"""Lock-node outages as a process sees them: said once when they start, once when they end.

An outage is fewer than a quorum of the nodes answering an acquire. Each
attempt during one logs a short line of its own (see
:mod:`celery_redlock.policies`); this module keeps, per process and per set of
nodes, whether an outage is on, so that its start is logged once, at WARNING,
with each node's error, and its end once, at INFO, with how long it lasted as
this process saw it. In a prefork worker each pool child that meets the outage
says so for itself.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from .exceptions import QuorumUnavailable

__all__ = ["answered", "failed"]

logger = logging.getLogger("celery_redlock.outage")

#: Node names of a Redlock -> (time.monotonic() of the first failed attempt, failed attempts).
_ongoing: dict[tuple[str, ...], list[float]] = {}
_guard = threading.Lock()


def _nodes(redlock: Any) -> tuple[str, ...]:
    return tuple(node.name for node in redlock.nodes)


def failed(redlock: Any, exc: QuorumUnavailable) -> bool:
    """An attempt on ``redlock``'s nodes met an outage; True if it is the first of one."""
    nodes = _nodes(redlock)
    with _guard:
        ongoing = _ongoing.get(nodes)
        if ongoing is not None:
            ongoing[1] += 1
            return False
        _ongoing[nodes] = [time.monotonic(), 1]
    logger.warning(
        "lock nodes unavailable: %d of %d answered, %d needed (%s); tasks are retried "
        "until a quorum answers",
        exc.total - len(exc.errors),
        exc.total,
        exc.quorum,
        exc.detail(),
    )
    return True


def answered(redlock: Any) -> None:
    """An attempt on ``redlock``'s nodes reached a quorum: end the outage, if one is on."""
    if not _ongoing:  # the common case, on every acquire: no lock taken
        return
    with _guard:
        ongoing = _ongoing.pop(_nodes(redlock), None)
    if ongoing is not None:
        since, attempts = ongoing
        logger.info(
            "lock nodes answer again: the outage lasted %.1fs here (%d failed %s)",
            time.monotonic() - since,
            attempts,
            "attempt" if attempts == 1 else "attempts",
        )
