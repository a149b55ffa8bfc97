"""A virtual kind whose ``make`` is its node class: what memory and ZooKeeper share."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from . import VirtualKind
from .scripting import warm

__all__ = ["NodeKind"]


class NodeKind(VirtualKind):
    """A :class:`~.VirtualKind` whose nodes are ``node_class(url, timeout,
    min_replicas, connect_timeout)``, the Lua runtime made with the first."""

    node_class: Callable[..., Any]

    def make(
        self, spec: Any, timeout: float, min_replicas: int = 0, connect_timeout: float | None = None
    ) -> Any:
        node = self.node_class(spec, timeout, min_replicas, connect_timeout)
        warm(node.kind)
        return node
