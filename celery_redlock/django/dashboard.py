"""The dashboard in a Django site, behind Django's login and CSRF protection.

In the project's ``urls.py``::

    from celery_redlock.django import dashboard_urls

    urlpatterns = [
        ...,
        path("locks/", dashboard_urls()),
    ]

A user who is not logged in is sent to ``settings.LOGIN_URL``; a logged-in user
``allow`` refuses (by default: not an active staff member) gets 403. The
dashboard's own authentication is off: Django's session is the login, and with
``actions=True`` every action is a POST checked by Django's CSRF protection
(the page sends Django's token in the header ``CSRF_HEADER_NAME`` names).
"""

from __future__ import annotations

import io
import threading
from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.middleware.csrf import get_token
from django.urls import re_path
from django.views.decorators.csrf import csrf_protect

from ..web.app import DashboardApp

__all__ = ["dashboard_urls", "is_staff"]

#: The environ key carrying Django's CSRF token and its header to the page.
CSRF = "celery_redlock.django.csrf"


def is_staff(user: Any) -> bool:
    """The default ``allow``: an active staff member."""
    return bool(user.is_active and user.is_staff)


def dashboard_urls(
    celery_app: Any = None,
    *,
    actions: bool = False,
    allow: Callable[[Any], bool] = is_staff,
    timeout: float = 0.5,
    refresh: float = 1.5,
    scan_count: int = 1000,
) -> tuple[list, str, str]:
    """The dashboard's URL patterns, for ``path("locks/", dashboard_urls())``.

    Args:
        celery_app: the Celery app (default: the current app, as the project's
            ``celery.py`` sets it).
        actions: offer "release" and "withdraw" (owner-checked, one key at a time).
        allow: who may see the page, given ``request.user`` (default: :func:`is_staff`).
        timeout, refresh, scan_count: as for :func:`celery_redlock.web.make_app`.

    Returns:
        What ``include()`` returns: the patterns, in the namespace ``celery_redlock``.
    """
    view = _View(celery_app, actions, allow, (timeout, refresh, scan_count))
    patterns = [re_path(r"^(?P<rest>.*)\Z", csrf_protect(view), name="dashboard")]
    return patterns, "celery_redlock", "celery_redlock"


class _HostedDashboard(DashboardApp):
    """The dashboard app with Django as its authentication and CSRF check."""

    def __init__(self, celery_app: Any, actions: bool, options: tuple) -> None:
        super().__init__(celery_app, False, None, *options)
        self.actions = actions  # the site's login guards them, not a token of the dashboard

    def _session_info(self, environ: dict) -> dict[str, Any]:
        info = super()._session_info(environ)
        if self.actions:
            info["csrf"], info["csrf_header"] = environ[CSRF]
        return info

    def _require_action(self, environ: dict) -> None:
        """Nothing more: the view let only allowed users in, and csrf_protect checked the POST."""


class _View:
    """The Django view: checks the user, then hands the request to the dashboard app."""

    def __init__(self, celery_app: Any, actions: bool, allow: Callable, options: tuple) -> None:
        self.celery_app, self.actions, self.allow = celery_app, actions, allow
        self.options = options
        self._app: _HostedDashboard | None = None
        self._lock = threading.Lock()

    def __call__(self, request: HttpRequest, rest: str = "") -> HttpResponse:
        user = request.user  # set by AuthenticationMiddleware
        if not user.is_authenticated:
            from django.contrib.auth.views import redirect_to_login  # needs the apps ready

            return redirect_to_login(request.get_full_path())
        if not self.allow(user):
            raise PermissionDenied("the lock dashboard is for staff")
        environ = dict(request.META)
        environ["SCRIPT_NAME"] = request.path[: len(request.path) - len(rest)].rstrip("/")
        environ["PATH_INFO"] = "/" + rest
        environ["wsgi.input"] = io.BytesIO(request.body)
        header = settings.CSRF_HEADER_NAME.removeprefix("HTTP_").replace("_", "-")
        environ[CSRF] = (get_token(request), header)
        replies: list = []
        body = b"".join(self._dashboard()(environ, lambda *reply: replies.append(reply)))
        status, headers = replies[0][:2]
        code, _, reason = status.partition(" ")
        response = HttpResponse(body, status=int(code), reason=reason)
        for name, value in headers:
            response[name] = value
        return response

    def _dashboard(self) -> _HostedDashboard:
        with self._lock:
            if self._app is None:
                if self.celery_app is None:
                    from celery import current_app

                    self.celery_app = current_app._get_current_object()
                self._app = _HostedDashboard(self.celery_app, self.actions, self.options)
            return self._app
