"""Serve a WSGI app with the standard library: one thread per request, quiet logs."""

from __future__ import annotations

import logging
import socketserver
from collections.abc import Callable
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

__all__ = ["ThreadingWSGIServer", "server"]

logger = logging.getLogger("celery_redlock.web")


class ThreadingWSGIServer(socketserver.ThreadingMixIn, WSGIServer):
    """wsgiref's server, a thread per request (the page polls while an action runs)."""

    daemon_threads = True
    allow_reuse_address = True


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base's name
        logger.debug("%s - %s", self.address_string(), format % args)


def server(app: Callable, host: str = "127.0.0.1", port: int = 8089) -> ThreadingWSGIServer:
    """A server bound to ``host:port`` (port 0: any free port); call ``serve_forever()``."""
    return make_server(
        host, port, app, server_class=ThreadingWSGIServer, handler_class=_QuietHandler
    )
