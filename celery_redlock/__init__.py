"""Run a Celery task at most once at a time per key, safely.

A Redlock on a majority of N independent Redis nodes, renewed by a heartbeat,
with a fencing token that grows with every grant. See README.rst.

The lock itself (:class:`Redlock`, :class:`Lease`, the errors) is a core that
imports neither celery nor kombu; the Celery layer (:class:`LockedTask`,
:func:`current_lease`, :func:`plan_of`, :func:`result_of`,
:class:`ImproperlyConfigured`) is loaded on first use of one of its names.
"""

import importlib as _importlib

from . import exceptions as _exceptions
from .core import (  # noqa: F401 - in __all__
    AsyncRedlock,
    Claim,
    Finished,
    Holder,
    Lease,
    RateSlot,
    Redlock,
)
from .exceptions import (  # noqa: F401 - in __all__, by exceptions.__all__
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

__version__ = "0.2.0"

# Celery-layer names, imported on first access (PEP 562).
_LAZY = {
    "ImproperlyConfigured": "conf",
    "LockPlan": "plan",
    "LockedTask": "task",
    "current_lease": "task",
    "key_of": "plan",
    "plan_of": "plan",
    "result_of": "enqueue",
    "superseded_by": "enqueue",
}

_CORE = ["AsyncRedlock", "Claim", "Finished", "Holder", "Lease", "RateSlot", "Redlock"]
__all__ = sorted([*_CORE, *_LAZY, *_exceptions.__all__])


def __getattr__(name: str) -> object:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(_importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
