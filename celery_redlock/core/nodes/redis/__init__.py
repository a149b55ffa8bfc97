"""The Redis kind of lock node: a master (``redis://``, ``rediss://``,
``unix://``), a Sentinel-managed master (``sentinel://``) or a Redis Cluster
(``redis+cluster://``, ``rediss+cluster://``).

Operations run as the Lua scripts of :mod:`celery_redlock.core.scripts` (by
``EVALSHA``, one round for every node at once: :mod:`.rounds`, bytes on the
wire by :mod:`.wire`; on plain masters an acquire goes as one ``SET NX``
first, :mod:`.first`); a cluster routes by hash slot (:mod:`.cluster`);
``redlock_min_replicas`` pipelines a ``WAIT`` behind a write (:mod:`.replicas`).
"""

from __future__ import annotations

from typing import Any

import redis

from . import rounds
from .cluster import CLUSTER_SCHEMES, check_together, node_for
from .first import run
from .info import node_info
from .unwaited import send_script
from .urls import SCHEMES as _MASTER_SCHEMES

__all__ = ["SCHEMES", "accepts", "check_together", "command", "make", "node_info", "run", "send"]

#: The URL schemes of a Redis node.
SCHEMES = (*_MASTER_SCHEMES, *CLUSTER_SCHEMES)

make = node_for
send = send_script


def accepts(spec: Any) -> bool:
    """Whether ``spec`` is a redis-py client this kind takes as a node."""
    return isinstance(spec, (redis.Redis, redis.RedisCluster))


def command(nodes: Any, cmd: tuple, timeout: float) -> list[Any]:
    """:func:`.rounds.gather` in the protocol's argument order."""
    return rounds.gather(nodes, cmd, timeout)
