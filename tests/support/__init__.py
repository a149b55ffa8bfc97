"""Support code shared by the tests: the test app, the process harness, helpers.

Nothing here is a test; nothing here edits ``sys.path``.
"""

from __future__ import annotations

import celery

#: Celery 5.6 added the ``celery_beat_task: True`` header to every message its
#: beat scheduler sends; Celery 5.5 (still needed with redis-py 5, see tox.ini)
#: sends none. Tests expect exactly the headers the installed Celery sends.
BEAT_HEADERS: dict[str, bool] = (
    {"celery_beat_task": True} if tuple(celery.VERSION[:2]) >= (5, 6) else {}
)
