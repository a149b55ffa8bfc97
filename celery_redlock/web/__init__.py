"""A live dashboard of the locks, permits, claims and schedules of a Celery app.

``celery -A proj redlock web`` serves it; :func:`make_app` returns the same
page as a WSGI application to mount in a site of your own (see the manual's
"Dashboard" page). The page is plain HTML, CSS and JavaScript shipped with the
package; it reads ``/api/state`` every second or two.
"""

from __future__ import annotations

from .app import DashboardApp, make_app
from .serve import server

__all__ = ["DashboardApp", "make_app", "server"]
