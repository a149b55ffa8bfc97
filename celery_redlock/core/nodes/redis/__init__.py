"""The Redis kind of lock node: a master (``redis://``, ``rediss://``,
``unix://``), a Sentinel-managed master (``sentinel://``) or a Redis Cluster
(``redis+cluster://``, ``rediss+cluster://``).

Operations run as the Lua scripts of :mod:`celery_redlock.core.nodes.scripts` (by
``EVALSHA``, one round for every node at once: :mod:`.rounds`, bytes on the
wire by :mod:`.wire`; on plain masters an acquire goes as one ``SET NX``
first, :mod:`.first`); a cluster routes by hash slot (:mod:`.cluster`);
``redlock_min_replicas`` pipelines a ``WAIT`` behind a write (:mod:`.replicas`).
"""

from __future__ import annotations

from typing import Any

import redis

from ..kind import Kind
from . import rounds
from .cluster import CLUSTER_SCHEMES, check_together, node_for
from .first import run
from .info import node_info
from .unwaited import send_script
from .urls import SCHEMES as _MASTER_SCHEMES

__all__ = [
    "CONNECT_TIMEOUT",
    "KIND",
    "NODE_TIMEOUT",
    "SCHEMES",
    "RedisKind",
    "accepts",
    "check_together",
    "command",
    "make",
    "node_info",
    "run",
    "send",
]

#: The URL schemes of a Redis node.
SCHEMES = (*_MASTER_SCHEMES, *CLUSTER_SCHEMES)
#: Seconds a call gets by default: a script run in memory on a master of the
#: same network answers in well under a millisecond; 50 ms leaves a busy
#: host's stalls room and a hung node costs little.
NODE_TIMEOUT = 0.05
#: Seconds a new connection gets by default (``benchmarks/connect_times.py``:
#: at most 340 ms seen on a loaded 2-core host; see the settings page).
CONNECT_TIMEOUT = 1.0

make = node_for
send = send_script


def accepts(spec: Any) -> bool:
    """Whether ``spec`` is a redis-py client this kind takes as a node."""
    return isinstance(spec, (redis.Redis, redis.RedisCluster))


def command(nodes: Any, cmd: tuple, timeout: float, needed: int | None = None) -> list[Any]:
    """:func:`.rounds.gather` in the protocol's argument order."""
    return rounds.gather(nodes, cmd, timeout, needed=needed)


class RedisKind(Kind):
    """Redis masters, Sentinel-managed masters and Redis Clusters as lock nodes:
    the module's functions, which mypy checks against :class:`Kind` here."""

    schemes = SCHEMES
    node_timeout = NODE_TIMEOUT
    connect_timeout = CONNECT_TIMEOUT
    make = staticmethod(make)
    accepts = staticmethod(accepts)
    run = staticmethod(run)
    command = staticmethod(command)
    send = staticmethod(send)
    node_info = staticmethod(node_info)
    check_together = staticmethod(check_together)


#: The Redis kind.
KIND = RedisKind()
