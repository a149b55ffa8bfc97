"""``celery redlock nodes``: the health of the lock nodes."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from .. import conf
from .._format import ms_text, nodes_text, outage, plural, spare_text, table
from .._health import HEADER, findings, node_row
from .._reading import connect
from ..core import kind_timeouts, ping
from ..core.exceptions import heals
from ..outage import cause_and_fix
from .base import TASK, Degraded, NeedsFix, Unavailable, command
from .targets import target_settings

__all__ = ["nodes"]

_TIMED_OUT = re.compile(r"timeout|timed out|no reply in|no connect in|skipped for a while", re.I)


@command("nodes", TASK)
def nodes(app: Any, echo: Callable, task: str | None, timeout: float, **kwargs: Any) -> None:
    """Check every lock node: latency, version, role, and what its durability rests on.

    Uses the app's redlock_* settings, or TASK's when given. Warns about what
    can break a lock, in each kind's terms. Redis: a maxmemory-policy other
    than noeviction (volatile-* policies evict exactly the keys with a TTL,
    that is every lock), a replica instead of a master, no AOF. PostgreSQL:
    fsync, full_page_writes or synchronous_commit off, a standby instead of
    the primary. etcd: a cluster of one member, no leader. Any kind: fewer
    replicas than redlock_min_replicas, two URLs reaching one server.

    A health check: exits with 0 when every node answers, 3 when a node is
    down but a quorum answers (locks work, with fewer failures to spare), 2
    when fewer than a quorum answer (no lock can be taken), 4 when a node's
    error cannot heal without a fix (a password refused, a database or schema
    missing, a TLS certificate not verified): workers refuse to start then.
    """
    label, settings = target_settings(app, task)
    with connect(settings, timeout) as (client, notes):
        infos = client.node_info()
        # The refused nodes' errors themselves (node_info keeps their text), asked
        # once more; a node that timed out is down, and asking it would cost a timeout.
        failed = {i.lock_node for i in infos if i.error and not _TIMED_OUT.search(i.error)}
        asked = [node for node in client.nodes if node.name in failed]
        fixes = [
            cause_and_fix(node.name, error)
            for node, error in zip(asked, ping(client, asked) if asked else [])
            if isinstance(error, Exception) and not heals(error)
        ]
    quorum, total = client.quorum, len(client.nodes)
    echo(
        f"Lock nodes of {label} (prefix {settings.key_prefix!r}, quorum {quorum} of {total}, "
        f"redlock_node_timeout {_timeout_text(settings, client.nodes)})"
    )
    if total == 1:
        from_broker = conf.nodes_from_broker(app, app.tasks[task] if task else None)
        echo(nodes_text([node.name for node in client.nodes], quorum, from_broker))
    echo("")
    echo(table([node_row(info) for info in infos], HEADER))
    lines = [f"WARNING {note}" for note in notes] + findings(
        infos, settings.node_timeout, settings.min_replicas
    )
    if lines:
        echo("\n" + "\n".join(lines))
    # A cluster with a shard down counts as a node down: that shard's keys have no answer there.
    down = list({info.lock_node: info.error for info in infos if info.error is not None}.items())
    answered = total - len(down)
    problem = outage(down, total, quorum)
    spare = spare_text(answered, quorum)
    reachable = "UNREACHABLE" if problem else "reachable"
    degraded = f"; DEGRADED: {spare}" if down and not problem else ""
    echo(f"\nQuorum: {reachable} ({answered} of {total} nodes answered, {quorum} needed){degraded}")
    if fixes:
        raise NeedsFix(
            f"{plural(len(fixes), 'lock node')} cannot answer until fixed: {'; '.join(fixes)}"
        )
    if problem:
        raise Unavailable(problem)
    if down:
        names = "; ".join(f"{name} ({error})" for name, error in down)
        raise Degraded(f"{answered} of {total} lock nodes answered, {spare}; down: {names}")


def _timeout_text(settings: conf.LockSettings, nodes: Any) -> str:
    """The node timeout set, or each kind's default among the nodes."""
    if settings.node_timeout is not None:
        return ms_text(settings.node_timeout)
    kinds = sorted({node.kind for node in nodes})
    defaults = ", ".join(f"{kind} {ms_text(kind_timeouts(kind)[0])}" for kind in kinds)
    return f"unset: each kind's default, {defaults}"
