"""Lock-node outages as a process sees them: said once when they start, once when they end.

An outage is fewer than a quorum of the nodes answering an acquire. Each
attempt during one logs a short line of its own (see
:mod:`celery_redlock.policies`); this module keeps, per process and per set of
nodes, whether an outage is on, so that its start is logged once, at WARNING,
with each node's error, and its end once, at INFO, with how long it lasted as
this process saw it. In a prefork worker each pool child that meets the outage
says so for itself.

A node whose error cannot heal (``heals`` False on its
:class:`~celery_redlock.exceptions.NodeError`: credentials refused, a database
or schema missing, a TLS certificate not verified) is no outage: when such
nodes leave fewer than a quorum, every attempt says so at ERROR, naming each
node, its cause and the fix (:func:`unhealed`), and the task is kept for when
it is fixed (see :mod:`celery_redlock.policies`).
"""

from __future__ import annotations

import logging
import re
import threading
import time
from typing import Any

from . import metrics
from .exceptions import QuorumUnavailable

__all__ = ["answered", "cause_and_fix", "failed", "unhealed"]

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


def unhealed(task: Any, plan: Any, name: str, exc: QuorumUnavailable) -> float:
    """An attempt met nodes that cannot heal and leave fewer than a quorum: said at
    ERROR, each time (nothing changes until someone fixes them); the seconds until
    the task is published again: about ``redlock_retry_backoff_max``."""
    later: float = plan.settings.retry_backoff_max * (0.5 + plan.redlock.rng() / 2)
    metrics.count("unhealed", plan.lock_name)
    logger.error(
        "%s[%s]: lock %s cannot be taken until a lock node is fixed: %s; the task is kept, "
        "published again in %.1fs (its retries are not spent)",
        task.name,
        task.request.id,
        name,
        "; ".join(cause_and_fix(node, error) for node, error in exc.unhealed.items()),
        later,
    )
    return later


#: What to do about a node's error that cannot heal, by what the error says.
_FIXES = (
    (
        r"schema --apply|celery redlock schema",
        "",  # the error names its fix
    ),
    (
        r"password|authenticat|WRONGPASS|NOAUTH|\bAUTH\b|user name",
        "set the right user and password in the node's URL (redlock_nodes), or on the server",
    ),
    (
        r'database "[^"]*" does not exist',
        "create that database, or name an existing one in the node's URL",
    ),
    (r'role "[^"]*" does not exist', "create that role, or name an existing one in the URL"),
    (r"pg_hba", "allow this host and user in the server's pg_hba.conf"),
    (
        r"certif|TLS|SSL",
        "give the CA that signed the server's certificate in the URL (PostgreSQL: sslrootcert=, "
        "Redis: ssl_ca_certs=, etcd: ca=), or name the host the certificate was issued for",
    ),
    (r"/v3/", "point the URL at an etcd member's client port"),
)


def cause_and_fix(node: str, error: BaseException | str) -> str:
    """``node: cause (fix: ...)``, the node named once."""
    text = str(error)
    cause = text if text.startswith(node) or node in text else f"{node}: {text}"
    for pattern, fix in _FIXES:
        if re.search(pattern, text, re.IGNORECASE):
            return f"{cause} (fix: {fix})" if fix else cause
    return f"{cause} (fix: correct the node's URL in redlock_nodes, or the server)"
