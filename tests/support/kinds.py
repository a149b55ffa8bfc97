"""What the core suites need to know of the kind of lock nodes they run on."""

from __future__ import annotations

from typing import Any

import pytest

__all__ = ["is_redis", "needs_three"]


def needs_three(nodes: Any) -> None:
    """Skip where the point of the test is a minority of the nodes differing
    from the rest: one lock node alone (``1postgres``) has no minority."""
    if len(nodes.urls) < 3:
        pytest.skip("a minority of the nodes differs here: one lock node has none")


def is_redis(nodes: Any) -> bool:
    """Whether ``nodes`` are Redis nodes (masters or clusters), whose servers
    report Redis's own settings."""
    return all(url.startswith(("redis", "rediss")) for url in nodes.urls)
