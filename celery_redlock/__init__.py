"""Run a Celery task at most once at a time per key, safely.

A Redlock on a majority of N independent Redis nodes, renewed by a heartbeat,
with a fencing token that grows with every grant. See README.rst.
"""

from .exceptions import (
    ConfigurationError,
    LockContended,
    LockError,
    LockKeyError,
    LockLost,
    LockNotAcquired,
    QuorumUnavailable,
    RedlockError,
)
from .redlock import Holder, Lease, Redlock
from .task import LockedTask, current_lease

__version__ = "0.1.0"

__all__ = [
    "ConfigurationError",
    "Holder",
    "Lease",
    "LockContended",
    "LockError",
    "LockKeyError",
    "LockLost",
    "LockNotAcquired",
    "LockedTask",
    "QuorumUnavailable",
    "Redlock",
    "RedlockError",
    "current_lease",
]
