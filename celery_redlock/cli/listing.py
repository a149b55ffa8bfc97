"""Listing keys for the ``list`` and ``beat-slots`` commands: SCAN, read, print."""

from __future__ import annotations

from collections.abc import Callable

from .._format import KeyReport, echo_down, glob_escape, outage, table, ttl_text
from .._reading import key_report
from ..core import Redlock

__all__ = ["SCAN_COUNT", "Listing", "remaining_text"]

#: Keys asked for per SCAN call.
SCAN_COUNT = 1000


def remaining_text(report: KeyReport) -> str:
    """The TTL left on the key of the holder a quorum agrees on, for a table cell."""
    remaining = report.holder.remaining
    return ttl_text(None if remaining is None else int(remaining * 1000))


class Listing:
    """The ``{prefix}:{kind}:`` keys matching ``tail`` on every node (SCAN), at most ``limit``."""

    def __init__(self, client: Redlock, kind: str, tail: str, limit: int):
        self.client, self.limit = client, limit
        self.pattern = glob_escape(f"{client.key_prefix}:{kind}:") + tail
        found = client.scan(kind, tail, limit=limit, count=SCAN_COUNT)
        self.names, self.truncated = found.names, found.truncated
        #: Node name -> error of the nodes that failed; not asked again.
        self.down = dict(found.errors)

    def read(self, key: str, fence_key: str | None = None) -> KeyReport:
        """``{prefix}:{key}`` (and ``{prefix}:{fence_key}``) on the nodes still answering."""
        prefix = self.client.key_prefix
        fence = f"{prefix}:{fence_key}" if fence_key else None
        report = key_report(self.client, f"{prefix}:{key}", fence, skip=self.down)
        for name, error in report.down:  # a node that fails now is skipped from now on
            self.down.setdefault(name, error)
        return report

    def report(
        self, echo: Callable, title: str, header: list[str], rows: list[list[str]], summary: str
    ) -> str | None:
        """Print the listing; the error text if fewer than a quorum of nodes answered."""
        client = self.client
        echo(f"{title}: {len(client.nodes)} nodes, quorum {client.quorum}, keys {self.pattern}\n")
        if rows:
            echo(table(rows, header) + "\n")
        if self.truncated:
            summary += f" Stopped at --limit {self.limit}: more keys may exist."
        echo(summary)
        down = [
            (node.name, self.down[node.name]) for node in client.nodes if node.name in self.down
        ]
        echo_down(echo, down)
        return outage(down, len(client.nodes), client.quorum)
