"""Every error celery_redlock raises: the tree is drawn in :mod:`celery_redlock.core.exceptions`.

The errors live in the core, which imports neither celery nor kombu; this
module keeps their documented import path.
"""

from __future__ import annotations

from .core import exceptions as _core
from .core.exceptions import *  # noqa: F403 - the errors, listed once in the core

#: The error classes (the core's helpers stay there).
__all__ = [name for name in _core.__all__ if name[0].isupper()]
