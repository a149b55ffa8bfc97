"""``celery redlock web``: serve the live dashboard of :mod:`celery_redlock.web`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from .base import command, option

__all__ = ["web"]


@command(
    "web",
    option(
        "Web Options",
        "--port",
        type=click.IntRange(min=0, max=65535),
        default=8089,
        show_default=True,
        help="The TCP port to listen on (0: any free port).",
    ),
    option(
        "Web Options",
        "--bind",
        default="127.0.0.1",
        show_default=True,
        help="The address to listen on; the default keeps the page on this machine.",
    ),
    option(
        "Web Options",
        "--actions",
        is_flag=True,
        help="Offer release and withdraw on the page (needs --token or --basic-auth).",
    ),
    option(
        "Web Options",
        "--token",
        envvar="CELERY_REDLOCK_WEB_TOKEN",
        help="Require this token to log in (or as Authorization: Bearer); "
        "also read from CELERY_REDLOCK_WEB_TOKEN.",
    ),
    option(
        "Web Options",
        "--basic-auth",
        envvar="CELERY_REDLOCK_WEB_BASIC_AUTH",
        help="Require HTTP basic authentication as USER:PASSWORD; "
        "also read from CELERY_REDLOCK_WEB_BASIC_AUTH.",
    ),
    option(
        "Web Options",
        "--refresh",
        type=click.FloatRange(min=0.5),
        default=1.5,
        show_default=True,
        help="Seconds between the page's reads.",
    ),
)
def web(
    app: Any,
    echo: Callable,
    port: int,
    bind: str,
    actions: bool,
    token: str | None,
    basic_auth: str | None,
    refresh: float,
    timeout: float,
    **kwargs: Any,
) -> None:
    """Serve a live dashboard of the locks, permits, claims, schedules and nodes.

    Read-only unless --actions, which offers release (a lock or a permit) and
    withdraw (a claim), owner-checked and confirmed one key at a time, and
    which needs --token or --basic-auth. Binds 127.0.0.1 unless --bind says
    otherwise; put it behind TLS before binding anything else.
    """
    from ..web import make_app, server

    if token and basic_auth:
        raise click.UsageError("give --token or --basic-auth, not both")
    auth: Any = token or None
    if basic_auth:
        user, sep, password = basic_auth.partition(":")
        if not (sep and user and password):
            raise click.UsageError("--basic-auth takes USER:PASSWORD")
        auth = (user, password)
    dashboard = make_app(app, actions=actions, auth=auth, timeout=timeout, refresh=refresh)
    httpd = server(dashboard, bind, port)
    host, bound = httpd.server_address[:2]
    mode = "actions on" if actions else "read-only"
    echo(f"celery redlock dashboard on http://{host!s}:{bound}/ ({mode}); Ctrl-C stops it")
    try:
        httpd.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        httpd.server_close()
        dashboard.close()
