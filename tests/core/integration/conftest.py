"""The nodes of the core's integration suites: three plain masters, or three
Redis Clusters of three masters each (each cluster one lock node). A test that
asks for ``nodes3`` runs on both; one that kills or pauses a node keeps
``redis_nodes3``."""

from __future__ import annotations

import pytest


@pytest.fixture(params=["redis_nodes3", "redis_clusters3"], ids=["3masters", "3clusters"])
def nodes3(request):
    """Three lock nodes, empty: plain masters or clusters (``.urls``, ``.keys()``,
    ``[i].client()`` alike)."""
    return request.getfixturevalue(request.param)
