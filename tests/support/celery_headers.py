"""The headers the installed Celery adds to what its beat sends."""

from __future__ import annotations

import celery

__all__ = ["BEAT_HEADERS"]

#: Celery 5.6 added the ``celery_beat_task: True`` header to every message its
#: beat scheduler sends; Celery 5.5 (still needed with redis-py 5, see tox.ini)
#: sends none. Tests expect exactly the headers the installed Celery sends.
BEAT_HEADERS: dict[str, bool] = (
    {"celery_beat_task": True} if tuple(celery.VERSION[:2]) >= (5, 6) else {}
)
