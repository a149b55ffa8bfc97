"""Every setting and lock option, declared once: the declarations live in
:mod:`celery_redlock.core.settings`, beside the core that takes its defaults
from them; this is their documented import path.
"""

from __future__ import annotations

from .core import settings as _declared
from .core.settings import *  # noqa: F403

__all__ = _declared.__all__
