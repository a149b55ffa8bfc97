"""Every error celery_redlock raises: the tree is drawn in :mod:`celery_redlock.core.exceptions`.

The errors live in the core, which imports neither celery nor kombu; this
module keeps their documented import path.
"""

from __future__ import annotations

from .core.exceptions import (
    AlreadyEnqueued,
    ConfigurationError,
    LockContended,
    LockError,
    LockKeyError,
    LockLost,
    LockNotAcquired,
    LockSuperseded,
    NodeError,
    QuorumUnavailable,
    RedlockError,
)

__all__ = [
    "AlreadyEnqueued",
    "ConfigurationError",
    "LockContended",
    "LockError",
    "LockKeyError",
    "LockLost",
    "LockNotAcquired",
    "LockSuperseded",
    "NodeError",
    "QuorumUnavailable",
    "RedlockError",
]
