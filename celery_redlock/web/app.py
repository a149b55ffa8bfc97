"""The dashboard's WSGI application: the page, its JSON API and its two actions.

Requests:

* ``GET /`` the page; ``GET /static/...`` its script and style sheet;
* ``GET /api/session``: whether actions are on, how to log in, and (once
  authenticated) the CSRF token of the session;
* ``GET /api/state``: the nodes and one page of every key family;
* ``POST /api/login`` and ``POST /api/logout`` (token authentication);
* ``POST /api/release`` and ``POST /api/withdraw``: only with actions on.

Actions change keys, so with them on the app refuses to start without
authentication, and every action must carry the session's CSRF token in an
``X-CSRF-Token`` header and come from the app's own origin (``Origin``, or
``Referer`` when a browser sends no ``Origin``). A script may instead send
``Authorization: Bearer <token>``, which a browser never adds on its own. A
read-only app has no route that writes: a POST there is refused with 403.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import json
import mimetypes
import secrets
import threading
import time
from collections.abc import Callable, Iterable
from http.cookies import SimpleCookie
from importlib import resources
from typing import Any, Union
from urllib.parse import parse_qs, urlsplit

from ..exceptions import ConfigurationError, NodeError, QuorumUnavailable, RedlockError
from .actions import ActionRefused, release, withdraw
from .reads import FAMILIES, Board

__all__ = ["Auth", "DashboardApp", "make_app"]

#: A token (string) or a (user, password) pair for HTTP basic authentication.
Auth = Union[str, "tuple[str, str]", None]
#: The session cookie's name.
COOKIE = "crl_session"
#: Seconds a session lives after login.
SESSION_TTL = 12 * 3600.0
#: Largest request body read, in bytes.
MAX_BODY = 16 * 1024
STATIC = ("index.html", "dashboard.js", "dashboard.css")

StartResponse = Callable[..., Any]


def make_app(
    celery_app: Any,
    actions: bool = False,
    auth: Auth = None,
    *,
    timeout: float = 0.5,
    refresh: float = 1.5,
    scan_count: int = 1000,
) -> DashboardApp:
    """The dashboard of ``celery_app``'s locks as a WSGI application.

    Args:
        celery_app: the Celery app (its ``redlock_*`` settings and LockedTasks).
        actions: offer "release" and "withdraw" (owner-checked, one key at a
            time); needs ``auth``.
        auth: a token string (log in with it, or send ``Authorization: Bearer``),
            or a ``(user, password)`` pair for HTTP basic authentication; None
            for an open, read-only page.
        timeout: seconds each lock node gets to answer one round.
        refresh: seconds between the page's reads.
        scan_count: the COUNT of each SCAN call (keys examined per node and page).

    Raises:
        ConfigurationError: ``actions`` without ``auth``, or an ``auth`` of
            another shape.
    """
    return DashboardApp(celery_app, actions, auth, timeout, refresh, scan_count)


class _Reply(Exception):
    """Answer the request at once with ``status`` and a JSON body ``{"error": message}``."""

    def __init__(self, status: str, message: str, headers: list | None = None):
        super().__init__(message)
        self.status, self.message, self.headers = status, message, headers or []


class DashboardApp:
    """A WSGI application (see :func:`make_app`)."""

    def __init__(
        self,
        celery_app: Any,
        actions: bool,
        auth: Auth,
        timeout: float,
        refresh: float,
        scan_count: int,
    ):
        if auth is not None and not isinstance(auth, str):
            if not (isinstance(auth, tuple) and len(auth) == 2 and all(auth)):
                raise ConfigurationError("auth must be a token or a (user, password) pair")
        if isinstance(auth, str) and len(auth) < 8:
            raise ConfigurationError("an auth token must have at least 8 characters")
        if actions and not auth:
            raise ConfigurationError("actions need authentication: give a token or basic auth")
        self.actions = bool(actions)
        self.auth = auth
        self.refresh = refresh
        self.board = Board(celery_app, timeout=timeout, scan_count=scan_count)
        self._sessions: dict[str, tuple[str, float]] = {}  # session id -> (csrf, expiry)
        self._lock = threading.Lock()

    def close(self) -> None:
        self.board.close()

    # -- WSGI -----------------------------------------------------------------

    def __call__(self, environ: dict, start_response: StartResponse) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "") or ""
        method = environ.get("REQUEST_METHOD", "GET")
        try:
            if path == "":  # mounted at /board: relative URLs need /board/
                where = environ.get("SCRIPT_NAME", "") + "/"
                raise _Reply("301 Moved Permanently", "moved", [("Location", where)])
            if method == "POST":
                status, body, headers = self._post(path, environ)
            elif method in ("GET", "HEAD"):
                status, body, headers = self._get(path, environ)
            else:
                raise _Reply("405 Method Not Allowed", "GET or POST only", [("Allow", "GET, POST")])
        except _Reply as reply:
            status, headers = reply.status, reply.headers
            body = json.dumps({"error": reply.message}).encode()
            headers = [("Content-Type", "application/json"), *headers]
        headers += [
            ("Cache-Control", "no-store"),
            ("X-Content-Type-Options", "nosniff"),
            ("X-Frame-Options", "DENY"),
            ("Referrer-Policy", "same-origin"),
            ("Content-Security-Policy", "default-src 'self'; frame-ancestors 'none'"),
            ("Content-Length", str(len(body))),
        ]
        start_response(status, headers)
        return [b"" if method == "HEAD" else body]

    def _get(self, path: str, environ: dict) -> tuple[str, bytes, list]:
        if path in ("/", "/index.html") or path.startswith("/static/"):
            name = "index.html" if not path.startswith("/static/") else path[len("/static/") :]
            if name not in STATIC:
                raise _Reply("404 Not Found", "no such file")
            if name == "index.html" and isinstance(self.auth, tuple) and not self._basic(environ):
                raise _Reply("401 Unauthorized", "log in", [_challenge()])
            body = (resources.files(__package__) / "static" / name).read_bytes()
            kind = mimetypes.guess_type(name)[0] or "application/octet-stream"
            return "200 OK", body, [("Content-Type", f"{kind}; charset=utf-8")]
        if path == "/api/session":
            return self._json(self._session_info(environ))
        if path == "/api/state":
            self._require_auth(environ)
            query = parse_qs(environ.get("QUERY_STRING", ""))
            task = (query.get("task") or [""])[0].strip() or None
            cursors = {
                key[len("cursor.") :]: values[0]
                for key, values in query.items()
                if key.startswith("cursor.") and key.rpartition(".")[2] in FAMILIES
            }
            try:
                state = self.board.state(cursors, task)
            except RedlockError as exc:  # a node's failure (NodeError), or the app's settings
                raise _Reply("503 Service Unavailable", f"{type(exc).__name__}: {exc}") from exc
            state.update(actions=self.actions, refresh=self.refresh)
            return self._json(state)
        raise _Reply("404 Not Found", "no such page")

    def _post(self, path: str, environ: dict) -> tuple[str, bytes, list]:
        if path == "/api/login":
            return self._login(environ)
        if path == "/api/logout":
            self._check_origin(environ)
            sid = self._cookie(environ)
            with self._lock:
                self._sessions.pop(sid or "", None)
            return self._json({"ok": True}, [("Set-Cookie", self._set_cookie(environ, "", 0))])
        if path not in ("/api/release", "/api/withdraw"):
            raise _Reply("404 Not Found", "no such action")
        if not self.actions:
            raise _Reply("403 Forbidden", "actions are off: the dashboard is read-only")
        self._require_action(environ)
        body = self._body(environ)
        try:
            group = self.board.groups[int(body.get("group", 0))]
            name = str(body["name"])
            if path == "/api/release":
                done = release(group.client, group.settings, name, body.get("permit"), body)
            else:
                done = withdraw(group.client, name, str(body["claimant"]))
        except (KeyError, ValueError, IndexError, TypeError) as exc:
            raise _Reply("400 Bad Request", f"bad request: {exc}") from exc
        except ActionRefused as exc:
            raise _Reply(exc.status, str(exc)) from exc
        except QuorumUnavailable as exc:
            raise _Reply("503 Service Unavailable", f"lock quorum unavailable: {exc}") from exc
        except NodeError as exc:
            raise _Reply("503 Service Unavailable", f"lock node error: {exc}") from exc
        return self._json(done)

    # -- authentication -------------------------------------------------------

    def _session_info(self, environ: dict) -> dict[str, Any]:
        authed = self._authenticated(environ)
        info: dict[str, Any] = {
            "actions": self.actions,
            "auth": None
            if self.auth is None
            else ("token" if isinstance(self.auth, str) else "basic"),
            "authenticated": authed,
            "csrf": None,
            "refresh": self.refresh,
        }
        if authed and self.actions:
            sid = self._cookie(environ)
            session = self._sessions.get(sid or "")
            info["csrf"] = session[0] if session else None
        return info

    def _authenticated(self, environ: dict) -> bool:
        if self.auth is None:
            return True
        if isinstance(self.auth, tuple):
            return self._basic(environ)
        return self._bearer(environ) or self._session(environ)

    def _require_auth(self, environ: dict) -> None:
        if self.auth is None:
            return
        if isinstance(self.auth, tuple):
            if not self._basic(environ):
                raise _Reply("401 Unauthorized", "log in", [_challenge()])
        elif not (self._bearer(environ) or self._session(environ)):
            raise _Reply("401 Unauthorized", "log in with the dashboard's token")

    def _require_action(self, environ: dict) -> None:
        """Authenticated, and either a bearer token or a same-origin request with the CSRF token."""
        if isinstance(self.auth, str) and self._bearer(environ):
            return
        self._require_auth(environ)
        self._check_origin(environ)
        sid = self._cookie(environ)
        session = self._sessions.get(sid or "")
        sent = environ.get("HTTP_X_CSRF_TOKEN", "")
        if session is None or session[1] < time.time():
            raise _Reply("403 Forbidden", "no session: reload the page")
        if not sent or not hmac.compare_digest(sent, session[0]):
            raise _Reply("403 Forbidden", "missing or wrong CSRF token")

    def _login(self, environ: dict) -> tuple[str, bytes, list]:
        self._check_origin(environ)
        if self.auth is None:
            raise _Reply("400 Bad Request", "this dashboard needs no login")
        if isinstance(self.auth, str):
            token = str(self._body(environ).get("token", ""))
            if not hmac.compare_digest(token.encode(), self.auth.encode()):
                time.sleep(0.2)  # slows guessing a little
                raise _Reply("401 Unauthorized", "wrong token")
        elif not self._basic(environ):
            raise _Reply("401 Unauthorized", "log in", [_challenge()])
        sid, csrf = secrets.token_urlsafe(24), secrets.token_urlsafe(24)
        now = time.time()
        with self._lock:
            for old in [s for s, (_, expiry) in self._sessions.items() if expiry < now]:
                del self._sessions[old]
            self._sessions[sid] = (csrf, now + SESSION_TTL)
        cookie = self._set_cookie(environ, sid, int(SESSION_TTL))
        return self._json({"ok": True, "csrf": csrf}, [("Set-Cookie", cookie)])

    def _session(self, environ: dict) -> bool:
        session = self._sessions.get(self._cookie(environ) or "")
        return session is not None and session[1] >= time.time()

    def _bearer(self, environ: dict) -> bool:
        header = environ.get("HTTP_AUTHORIZATION", "")
        if not isinstance(self.auth, str) or not header.startswith("Bearer "):
            return False
        return hmac.compare_digest(header[len("Bearer ") :].encode(), self.auth.encode())

    def _basic(self, environ: dict) -> bool:
        header = environ.get("HTTP_AUTHORIZATION", "")
        if not isinstance(self.auth, tuple) or not header.startswith("Basic "):
            return False
        try:
            given = base64.b64decode(header[len("Basic ") :], validate=True).decode()
        except (binascii.Error, UnicodeDecodeError):
            return False
        expected = f"{self.auth[0]}:{self.auth[1]}"
        return hmac.compare_digest(given.encode(), expected.encode())

    def _check_origin(self, environ: dict) -> None:
        """The request comes from a page of this app's origin (scheme and host)."""
        host = environ.get("HTTP_HOST") or environ.get("SERVER_NAME", "")
        scheme = environ.get("wsgi.url_scheme", "http")
        origin = environ.get("HTTP_ORIGIN") or environ.get("HTTP_REFERER") or ""
        parts = urlsplit(origin)
        if not origin or (parts.scheme, parts.netloc) != (scheme, host):
            raise _Reply("403 Forbidden", "cross-site request refused")

    @staticmethod
    def _cookie(environ: dict) -> str | None:
        jar: SimpleCookie = SimpleCookie()
        try:
            jar.load(environ.get("HTTP_COOKIE", ""))
        except Exception:  # a malformed Cookie header is no session
            return None
        morsel = jar.get(COOKIE)
        return morsel.value if morsel else None

    @staticmethod
    def _set_cookie(environ: dict, value: str, max_age: int) -> str:
        path = environ.get("SCRIPT_NAME", "") or "/"
        secure = "; Secure" if environ.get("wsgi.url_scheme") == "https" else ""
        return (
            f"{COOKIE}={value}; Path={path}; Max-Age={max_age}; HttpOnly; SameSite=Strict{secure}"
        )

    @staticmethod
    def _body(environ: dict) -> dict[str, Any]:
        if not environ.get("CONTENT_TYPE", "").startswith("application/json"):
            raise _Reply("415 Unsupported Media Type", "send application/json")
        try:
            length = int(environ.get("CONTENT_LENGTH") or 0)
        except ValueError:
            length = 0
        if length > MAX_BODY:
            raise _Reply("413 Payload Too Large", "request too large")
        try:
            body = json.loads(environ["wsgi.input"].read(length) or b"{}")
        except ValueError as exc:
            raise _Reply("400 Bad Request", "the body is not JSON") from exc
        if not isinstance(body, dict):
            raise _Reply("400 Bad Request", "the body must be a JSON object")
        return body

    @staticmethod
    def _json(data: Any, headers: list | None = None) -> tuple[str, bytes, list]:
        body = json.dumps(data, default=str).encode()
        return "200 OK", body, [("Content-Type", "application/json"), *(headers or [])]


def _challenge() -> tuple[str, str]:
    return ("WWW-Authenticate", 'Basic realm="celery redlock", charset="UTF-8"')
