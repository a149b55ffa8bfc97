"""What the tools (the CLI, the dashboard, the worker's start-up check) ask of the
nodes, whatever their kind: typed reads (:mod:`.ops`), a kind's schema and its
default timeouts. Nothing above the core names a command, a kind's client
library or a kind's module: a node's failure reaches them as a
:class:`~.exceptions.NodeError` (``heals`` False: it cannot end without a fix).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit

from .exceptions import RedlockError
from .nodes import SCHEMES, default_timeouts, kind_of, kind_timeouts, node_error, node_for, perform
from .ops import Ping, Read
from .records import SPECIFIC, EtcdInfo, PostgresInfo, RedisInfo, ZookeeperInfo

__all__ = [
    "default_timeouts",
    "has_schema",
    "install_schema",
    "kind_timeouts",
    "open_node",
    "ping",
    "read",
    "schema_sql",
    "specific_type",
]


def read(client: Any, op: Read, nodes: Sequence[Any] | None = None) -> list[Any]:
    """``op`` (a plain read: :class:`~.ops.Get`, :class:`~.ops.ReadType`,
    :class:`~.ops.Scan`...) on every node of ``client`` (or on ``nodes``: some of
    them, or the servers of one, a cluster's shard masters) at once, each within
    the client's node timeout: one typed result or :class:`~.exceptions.NodeError`
    per node, in order."""
    return perform(op, client.nodes if nodes is None else nodes, client.node_timeout)


def ping(client: Any, nodes: Sequence[Any] | None = None) -> list[Any]:
    """Ask every node (or ``nodes``) whether it is there: ``Done`` or its error, per node."""
    return read(client, Ping(), nodes)


def specific_type(url: str) -> type[RedisInfo | PostgresInfo | EtcdInfo | ZookeeperInfo]:
    """The record of what only the kind of the node ``url`` names reports
    (:class:`~.records.RedisInfo`, ...): its words for the node (a scheme of
    no kind: Redis's, the broker's)."""
    return SPECIFIC.get(SCHEMES.get(urlsplit(url).scheme, ""), RedisInfo)


def open_node(spec: Any, timeout: float, connect_timeout: float | None = None) -> Any:
    """The node ``spec`` (a URL) names, for a tool's own calls (close it after).

    Raises:
        ConfigurationError: the URL names no kind, or the kind refuses it.
    """
    return node_for(spec, timeout, connect_timeout=connect_timeout)


def has_schema(node: Any) -> bool:
    """Whether ``node``'s kind needs SQL applied before use (PostgreSQL's)."""
    return kind_of(node).has_schema


def schema_sql(node: Any) -> str:
    """The SQL that creates what ``node`` needs (where :func:`has_schema`)."""
    return kind_of(node).ddl(node.schema)


def install_schema(node: Any) -> None:
    """Create (or bring up to date) ``node``'s schema now.

    Raises:
        NodeError: the node refused it (say, its role may not create it), or did
            not answer.
    """
    try:
        kind_of(node).install(node)
    except RedlockError:
        raise
    except Exception as exc:  # noqa: BLE001 - a kind's client error: the node failed
        raise node_error(exc) from exc
