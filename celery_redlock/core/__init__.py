"""The lock core: a Redlock on N Redis nodes, with fencing tokens, permits,
claims and a heartbeat. It imports neither celery nor kombu: it is usable as
a plain lock library (``from celery_redlock.core import Redlock``).

One module per primitive (see :mod:`.redlock` for the map); :class:`Redlock`
is the facade over them. The tools reach the nodes through :mod:`.node_access`
(typed reads from :mod:`.ops`, a kind's schema and default timeouts).
"""

from __future__ import annotations

from . import exceptions as _exceptions
from .aio import AsyncRedlock
from .exceptions import *  # noqa: F403 - the errors, listed once there
from .inspect import ClaimView, Deletion, NodeInfo, NodeView, ScanResult, mask_url, node_name
from .lease import Lease
from .node_access import (
    default_timeouts,
    has_schema,
    install_schema,
    kind_timeouts,
    open_node,
    ping,
    read,
    schema_sql,
    specific_type,
)
from .nodes import check_together, check_ttl
from .ops import Get, Ping, ReadHash, ReadScores, ReadTtl, ReadType, Scan
from .queues import HandOver, Parked, QueueView
from .quorum import DRIFT_FLOOR
from .rate_view import peek_rate
from .rates import reserve_place, reserve_rates
from .records import (
    OWNER_SEP,
    STARTED_MARK,
    Claim,
    EtcdInfo,
    Finished,
    Holder,
    KindWords,
    PostgresInfo,
    RateSlot,
    RateView,
    RedisInfo,
    Schedule,
    TooEarly,
    ZookeeperInfo,
    full_jitter,
    make_owner,
)
from .redlock import Redlock
from .windows import RateKey, Window, check_rate, paced, parse_rate, resolve_rate

__all__ = [  # and the errors, below
    "DRIFT_FLOOR",
    "OWNER_SEP",
    "STARTED_MARK",
    "AsyncRedlock",
    "Claim",
    "ClaimView",
    "Deletion",
    "EtcdInfo",
    "ZookeeperInfo",
    "Finished",
    "Get",
    "HandOver",
    "Holder",
    "KindWords",
    "Lease",
    "NodeInfo",
    "NodeView",
    "Parked",
    "Ping",
    "PostgresInfo",
    "QueueView",
    "RateKey",
    "RateSlot",
    "RateView",
    "ReadHash",
    "ReadScores",
    "ReadTtl",
    "ReadType",
    "Redlock",
    "RedisInfo",
    "Scan",
    "ScanResult",
    "Schedule",
    "TooEarly",
    "Window",
    "check_rate",
    "check_together",
    "check_ttl",
    "default_timeouts",
    "full_jitter",
    "has_schema",
    "install_schema",
    "kind_timeouts",
    "make_owner",
    "mask_url",
    "node_name",
    "open_node",
    "paced",
    "parse_rate",
    "peek_rate",
    "ping",
    "read",
    "reserve_place",
    "reserve_rates",
    "resolve_rate",
    "schema_sql",
    "specific_type",
]
__all__ += [name for name in _exceptions.__all__ if name[0].isupper()]
