"""The one list of lock node sets the parametrised suites run on, and what the
core suites need to know of the kind of lock nodes they run on.

A kind is added to the suites here: a row of :data:`NODE_SETS` (its fixture,
from :mod:`celery_redlock.testing`), and every parametrised fixture that
selects rows by what they are (:func:`params`) takes it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

__all__ = ["NODE_SETS", "NodeSet", "is_redis", "needs_shared", "needs_three", "params"]


@dataclass(frozen=True)
class NodeSet:
    """Some lock nodes of one kind, as a fixture hands them out."""

    id: str
    fixture: str
    kind: str
    count: int
    #: Whether the nodes live in this process only (a worker elsewhere cannot reach them).
    local: bool = False
    #: Whether the core suites (``nodes3``) run on it.
    core: bool = True
    #: Whether its nodes start, stop and restart (empty) at once: the suites that
    #: kill and restart nodes over and over (``quick3``) run on it.
    quick: bool = False


NODE_SETS = [
    NodeSet("3masters", "redis_nodes3", "redis", 3, quick=True),
    NodeSet("5masters", "redis_nodes5", "redis", 5, core=False),
    NodeSet("3clusters", "redis_clusters3", "redis", 3),
    NodeSet("3postgres", "postgres_nodes3", "postgres", 3),
    NodeSet("1postgres", "postgres_node1", "postgres", 1),
    NodeSet("3etcd", "etcd_nodes3", "etcd", 3, core=False),
    NodeSet("1etcd", "etcd_node1", "etcd", 1),
    NodeSet("1zookeeper", "zookeeper_node1", "zookeeper", 1),
    NodeSet("3zookeeper", "zookeeper_nodes3", "zookeeper", 3),
    NodeSet("3memory", "memory_nodes3", "memory", 3, local=True, quick=True),
]


def params(which: Callable[[NodeSet], bool]) -> dict[str, Any]:
    """``pytest.fixture`` arguments for the node sets ``which`` selects: the
    fixture's name as the param, the set's id as its id."""
    chosen = [s for s in NODE_SETS if which(s)]
    return {"params": [s.fixture for s in chosen], "ids": [s.id for s in chosen]}


def needs_three(nodes: Any) -> None:
    """Skip where the point of the test is a minority of the nodes differing
    from the rest: one lock node alone (``1postgres``) has no minority."""
    if len(nodes.urls) < 3:
        pytest.skip("a minority of the nodes differs here: one lock node has none")


def needs_shared(nodes: Any) -> None:
    """Skip where other processes must reach the nodes: memory nodes live in
    the process that uses them."""
    if any(url.startswith("memory://") for url in nodes.urls):
        pytest.skip("other processes reach these nodes: memory nodes live in one process")


def is_redis(nodes: Any) -> bool:
    """Whether ``nodes`` are Redis nodes (masters or clusters), whose servers
    report Redis's own settings."""
    return all(url.startswith(("redis", "rediss")) for url in nodes.urls)
