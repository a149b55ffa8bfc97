"""One ZooKeeper ensemble as a lock node: its URL, its session, its calls.

A process keeps one kazoo session per ensemble (a forked child opens its own),
shared by its nodes of that URL with one store (cache and clock), opened at
the first call within the connect budget. A call that finds no session within
that budget (none yet, or SUSPENDED while kazoo reconnects) fails as "not
answering", and a node whose call timed out is skipped for a second. Each
request is kazoo's async form, waited on for what is left of the call's
deadline: nothing retries here. A member without its ensemble's quorum serves
no session: a call fails or times out, never answers "free".
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

from ...exceptions import ConfigurationError
from .. import mask_url
from .store import NodeError, ZookeeperStore

__all__ = ["NodeError", "ZookeeperNode"]

#: The session timeout asked for (s; the server clamps it to 2-20 x tickTime). No
#: lock hangs on a session: it bounds how soon kazoo leaves a hung member.
SESSION = 4.0
#: Seconds a node whose call timed out is skipped (its calls fail at once).
SKIP_AFTER_TIMEOUT = 1.0
_OPTIONS = ("ca", "cert", "key", "prefix", "tls", "verify")


class Session:
    """A process's client on one ensemble, its store, and its turn: a process's
    calls to one ensemble go one at a time, so its threads never conflict on a
    commit (a conflict costs two round trips more than the wait)."""

    def __init__(self) -> None:
        self.client: Any = None
        self.store: Any = None
        self.ready, self.skip_until = False, 0.0
        self.lock, self.turn = threading.Lock(), threading.Lock()


_sessions: dict[tuple, Session] = {}
_sessions_lock = threading.Lock()


def _forked() -> None:
    global _sessions_lock
    _sessions.clear()
    _sessions_lock = threading.Lock()


os.register_at_fork(after_in_child=_forked)


class ZookeeperNode:
    """One ZooKeeper ensemble as one lock node.

    Args:
        url: ``zookeeper://[user:password@]host:port[,host:port...][/chroot]``,
            options ``prefix`` (the znode under the chroot holding the keys,
            ``redlock``), ``tls=1``, ``ca``/``cert``/``key`` (PEM files),
            ``verify=0``; ``user:password@`` is digest auth, the keys under an
            ACL of that user alone.
        timeout: seconds a call gets for its reply.
        min_replicas: refused above 0 (a write answers once a majority logged it).
        connect_timeout: seconds a new session gets to open; None: ``timeout``.
    """

    kind = "zookeeper"
    cluster = False

    def __init__(
        self, url: str, timeout: float, min_replicas: int = 0, connect_timeout: float | None = None
    ):
        self.name = mask_url(url)
        try:
            from kazoo.client import KazooClient
        except ImportError:
            raise ConfigurationError(
                f"zookeeper node {self.name} needs kazoo: pip install 'celery_redlock[zookeeper]'"
            ) from None

        def refuse(why: str) -> ConfigurationError:
            return ConfigurationError(f"zookeeper node {self.name}: {why}")

        if min_replicas:
            raise refuse("redlock_min_replicas does not apply (a write answers once a "
                         "majority of the ensemble logged it)")  # fmt: skip
        parts = urlsplit(url)
        self.hosts = [h for h in parts.netloc.rsplit("@", 1)[-1].split(",") if h]
        for hostport in self.hosts:
            host, _, port = hostport.rpartition(":")
            if not host or not port.isdigit():
                raise refuse(f"{hostport!r} must be host:port (a member's client port, 2181)")
        if not self.hosts:
            raise refuse("no host:port in the URL")
        options = dict(parse_qsl(parts.query))
        if set(options) - set(_OPTIONS):
            unknown = ", ".join(sorted(set(options) - set(_OPTIONS)))
            raise refuse(f"unknown option(s) {unknown} (known: {', '.join(_OPTIONS)})")
        prefix = options.get("prefix", "redlock").strip("/")
        #: The znode whose children are the keys (its mtime: the ensemble's clock).
        self.root = f"{parts.path.rstrip('/')}/{prefix}"
        if not prefix or "//" in self.root:
            raise refuse("the chroot and prefix must be znode paths (no empty part)")
        self.identity: tuple = ("zookeeper", tuple(sorted(self.hosts)), self.root)
        self.timeout, self.connect_timeout = timeout, connect_timeout
        yes = ("1", "true", "yes")
        self._args: dict[str, Any] = dict(
            hosts=",".join(self.hosts), timeout=SESSION, ca=options.get("ca"),
            use_ssl=options.get("tls", "").lower() in yes or "ca" in options,
            certfile=options.get("cert"), keyfile=options.get("key"),
            verify_certs=options.get("verify", "1").lower() in yes,
            connection_retry={"max_tries": -1, "delay": 0.05, "backoff": 2, "max_delay": 1.0},
        )  # fmt: skip
        if parts.username:
            from kazoo.security import make_digest_acl

            user, password = unquote(parts.username), unquote(parts.password or "")
            self._args["auth_data"] = [("digest", f"{user}:{password}")]
            self._args["default_acl"] = [make_digest_acl(user, password, all=True)]
        self._new = KazooClient
        self._key = (self.identity, repr(sorted(self._args.items())))

    def __repr__(self) -> str:
        return f"<ZookeeperNode {self.name}>"

    def members(self) -> list[ZookeeperNode]:
        return [self]

    @property
    def session(self) -> Session:
        with _sessions_lock:
            return _sessions.setdefault(self._key, Session())

    @property
    def store(self) -> Any:
        """The keys as the store verbs see them (one store per session)."""
        session = self.session
        if session.store is None:
            session.store = ZookeeperStore(self)
        return session.store

    def close(self) -> None:
        with _sessions_lock:
            session = _sessions.pop(self._key, None)
        if session is not None and session.client is not None:
            session.client.stop()
            session.client.close()

    def has_session(self) -> bool:
        client = self.session.client
        return client is not None and client.connected

    def client(self, deadline: float) -> Any:
        """This process's connected client (opened within the connect budget).

        Raises:
            TimeoutError: no session in time, or the node is skipped for a while.
        """
        session = self.session
        if time.monotonic() < session.skip_until:
            raise TimeoutError(f"{self.name}: skipped for a while after a call timed out")
        with session.lock:
            if session.client is None:
                session.client = self._new(**self._args)
                session.client.start_async()
            client = session.client
        until = time.monotonic() + min(deadline - time.monotonic(), self.connect_timeout or 1e9)
        while not client.connected:
            if time.monotonic() >= until:
                session.skip_until = time.monotonic() + SKIP_AFTER_TIMEOUT
                raise TimeoutError(f"{self.name}: no session in time ({client.state})")
            time.sleep(0.005)
        if not session.ready:
            self.wait(client.ensure_path_async(self.root), deadline)
            session.ready = True
        return client

    def wait(self, result: Any, deadline: float) -> Any:
        """kazoo's async ``result`` by ``deadline``.

        Raises:
            TimeoutError: no reply in time; NodeError: the ensemble refused;
            kazoo's NoNodeError: the znode is absent.
        """
        from kazoo import exceptions as ke
        from kazoo.handlers.threading import KazooTimeoutError

        try:
            return result.get(timeout=max(deadline - time.monotonic(), 0.001))
        except KazooTimeoutError:
            self.session.skip_until = time.monotonic() + SKIP_AFTER_TIMEOUT
            raise TimeoutError(f"{self.name}: no reply in time") from None
        except ke.NoNodeError:
            raise
        except ke.NoAuthError:
            why = "not allowed (the keys' ACL is another user's: user:password@ in the URL)"
            raise NodeError(f"{self.name}: {why}", self.name, heals=False) from None
        except ke.AuthFailedError:
            raise NodeError(f"{self.name}: authentication failed", self.name, heals=False) from None
        except ke.KazooException as exc:  # a session lost, or an error reply
            raise NodeError(f"{self.name}: {type(exc).__name__} {exc}".rstrip()) from None
