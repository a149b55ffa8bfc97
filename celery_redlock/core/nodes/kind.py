"""What a kind of lock node provides: :class:`Kind`, the protocol mypy checks every kind against.

A kind is one object (``KIND`` in its subpackage) of a class that subclasses
:class:`Kind`: a class that leaves out one of the required operations cannot
be instantiated, and ``mypy celery_redlock`` says so. The optional ones have
defaults here (no schema, no TTL limit, any names together).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from ..records import NodeInfo

if TYPE_CHECKING:
    from .codec import Call

__all__ = ["Ask", "Kind"]

#: Sends a plain read to some nodes, one reply or error each (``node_info``'s ``ask``).
Ask = Callable[[tuple, Sequence[Any]], list[Any]]


class Kind(Protocol):
    """One kind of lock node (see :mod:`celery_redlock.core.nodes`)."""

    #: The URL schemes it takes (:data:`~celery_redlock.core.nodes.KINDS` maps them here).
    schemes: tuple[str, ...]
    #: Whether its nodes need SQL applied before use (``ddl``, ``install``).
    has_schema: bool = False
    #: Seconds a call gets where ``redlock_node_timeout`` is not set: what one costs there.
    node_timeout: float
    #: Seconds a new connection gets where ``redlock_connect_timeout`` is not set.
    connect_timeout: float

    def make(
        self, spec: Any, timeout: float, min_replicas: int = 0, connect_timeout: float | None = None
    ) -> Any:
        """A node from a URL (or a client object of its own, see ``accepts``),
        failing fast on bad input."""
        ...

    def run(
        self, call: Call, nodes: Sequence[Any], timeout: float, needed: int | None = None
    ) -> list[Any]:
        """One round of ``call`` (a script, its KEYS and ARGV: :data:`.codec.Call`)
        on ``nodes``, at once, within ``timeout``: one reply or exception per node;
        decided once ``needed`` answered, if given."""
        ...

    def command(
        self, nodes: Sequence[Any], cmd: tuple, timeout: float, needed: int | None = None
    ) -> list[Any]:
        """The same for a plain read."""
        ...

    def node_info(self, node: Any, ask: Ask) -> list[NodeInfo]:
        """How ``node`` is, for ``celery redlock nodes`` and the dashboard."""
        ...

    def accepts(self, spec: Any) -> bool:
        """Whether a non-URL ``spec`` is a client of this kind."""
        return False

    def send(self, op: Any, nodes: Sequence[Any], keys: Any, args: Any) -> list[int]:
        """Write ``op`` (a deletion) without waiting: the indexes of the nodes it
        was not sent to (the caller runs a round there). By default: none sent."""
        return list(range(len(nodes)))

    def ddl(self, schema: str) -> str:
        """The SQL a node of the kind needs before use (where ``has_schema``)."""
        return ""

    def install(self, node: Any) -> None:
        """Apply :meth:`ddl` to ``node`` (``celery redlock schema --apply``)."""
        return None

    def check_ttl(self, nodes: Sequence[Any], ttl: float, option: str = "redlock_ttl") -> None:
        """Refuse, with a ``ConfigurationError``, a TTL its nodes cannot honour."""
        return None

    def check_together(
        self, nodes: Sequence[Any], names: Sequence[str], option: str = "also"
    ) -> None:
        """Refuse, with a ``ConfigurationError``, names held together in one call
        that its nodes cannot take in one call."""
        return None
