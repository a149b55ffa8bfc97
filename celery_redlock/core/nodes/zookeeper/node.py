"""One ZooKeeper ensemble as a lock node: its URL, its kazoo client, its calls.

One kazoo client per ensemble and process (a forked child opens its own),
shared by the process's nodes of that URL with one cache and one view of the
ensemble's clock, started at the first call within the node's connect budget; a call that finds no
session within that budget (none yet, or SUSPENDED while kazoo reconnects in
the background) fails as "not answering", and the node is skipped for a
second after a call timed out. Every request is kazoo's async form,
waited on for what is left of the call's deadline: nothing retries in here.
A member that has lost its ensemble's quorum serves no session, so a call
there fails or times out, never answers "free".
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

from ...exceptions import ConfigurationError
from ...exceptions import NodeError as _NodeError
from .. import mask_url

__all__ = ["NodeError", "ZookeeperNode", "kazoo_client"]

#: The session timeout asked for (ms): the server clamps it to [2, 20] x tickTime.
#: Locks hang on no session (see the store): this only bounds how long kazoo
#: takes to notice a hung member and move to another.
SESSION_MS = 4000
#: Seconds a node whose call timed out is skipped (its calls fail at once).
SKIP_AFTER_TIMEOUT = 1.0
_OPTIONS = {"prefix", "ca", "cert", "key", "tls", "verify"}


class NodeError(_NodeError):
    """A ZooKeeper node's error (refused, misconfigured, an error reply), naming the node."""


def kazoo_client() -> Any:
    """kazoo's ``KazooClient`` class, or a ConfigurationError naming the extra."""
    try:
        from kazoo.client import KazooClient
    except ImportError:
        raise ConfigurationError(
            "a zookeeper:// lock node needs kazoo: pip install 'celery_redlock[zookeeper]'"
        ) from None
    return KazooClient


class ZookeeperNode:
    """One ZooKeeper ensemble (its members' client ports) as one lock node.

    Args:
        url: ``zookeeper://[user:password@]host:port[,host:port...][/chroot]``
            with options ``prefix`` (the znode under the chroot that holds the
            keys, ``redlock``), ``tls=1`` and ``ca``, ``cert``, ``key`` (PEM
            files), ``verify=0`` (no certificate check); ``user:password@``
            authenticates with ZooKeeper's digest scheme and puts the keys
            under an ACL of that user alone.
        timeout: seconds a call gets for its reply.
        min_replicas: refused above 0: a write answers once a majority of the
            ensemble logged it.
        connect_timeout: seconds a new session gets to open; None: ``timeout``.
    """

    kind = "zookeeper"
    cluster = False

    def __init__(
        self, url: str, timeout: float, min_replicas: int = 0, connect_timeout: float | None = None
    ):
        KazooClient = kazoo_client()
        self.name = mask_url(url)
        parts = urlsplit(url)
        if min_replicas:
            raise ConfigurationError(
                f"zookeeper node {self.name}: redlock_min_replicas does not apply (every "
                "write answers once a majority of the ensemble logged it)"
            )
        self.hosts: list[str] = []
        for hostport in filter(None, parts.netloc.rsplit("@", 1)[-1].split(",")):
            host, _, port = hostport.rpartition(":")
            if not host or not port.isdigit():
                raise ConfigurationError(
                    f"zookeeper node {self.name}: {hostport!r} must be host:port "
                    "(a member's client port, usually 2181)"
                )
            self.hosts.append(hostport)
        if not self.hosts:
            raise ConfigurationError(f"zookeeper node {self.name}: no host:port in the URL")
        options = dict(parse_qsl(parts.query))
        unknown = set(options) - _OPTIONS
        if unknown:
            raise ConfigurationError(
                f"zookeeper node {self.name}: unknown option(s) {', '.join(sorted(unknown))} "
                f"(known: {', '.join(sorted(_OPTIONS))})"
            )
        chroot = parts.path.rstrip("/")
        prefix = options.get("prefix", "redlock").strip("/")
        if not prefix or "//" in chroot + "/" + prefix:
            raise ConfigurationError(
                f"zookeeper node {self.name}: the chroot and prefix must be znode paths "
                "(no empty part)"
            )
        #: The znode whose children are the keys, and whose data each commit sets
        #: (its mtime: the ensemble's clock).
        self.root = f"{chroot}/{prefix}"
        self.identity: tuple = ("zookeeper", tuple(sorted(self.hosts)), self.root)
        self.timeout = timeout
        self.connect_timeout = connect_timeout
        self.user = unquote(parts.username) if parts.username else None
        password = unquote(parts.password) if parts.password else ""
        tls = options.get("tls", "0").lower() in ("1", "true", "yes") or "ca" in options
        self._args: dict[str, Any] = dict(
            hosts=",".join(self.hosts), timeout=SESSION_MS / 1000, use_ssl=tls,
            ca=options.get("ca"), certfile=options.get("cert"), keyfile=options.get("key"),
            verify_certs=options.get("verify", "1").lower() not in ("0", "false", "no"),
            connection_retry={"max_tries": -1, "delay": 0.05, "backoff": 2, "max_delay": 1.0},
        )  # fmt: skip
        if self.user is not None:
            from kazoo.security import make_digest_acl

            self._args["auth_data"] = [("digest", f"{self.user}:{password}")]
            self._args["default_acl"] = [make_digest_acl(self.user, password, all=True)]
        self._KazooClient = KazooClient
        self._key = (self.identity, repr(sorted(self._args.items())))

    def __repr__(self) -> str:
        return f"<ZookeeperNode {self.name}>"

    def members(self) -> list[ZookeeperNode]:
        """The servers a scan visits: this ensemble."""
        return [self]

    @property
    def session(self) -> Session:
        """This process's session on the ensemble, shared by its nodes of one URL."""
        with _sessions_lock:
            got = _sessions.get(self._key)
            if got is None:
                got = _sessions[self._key] = Session()
            return got

    @property
    def store(self) -> Any:
        """The keys as the store verbs see them: one cache and clock per session."""
        session = self.session
        if session.store is None:
            from .store import ZookeeperStore

            session.store = ZookeeperStore(self)
        return session.store

    def close(self) -> None:
        with _sessions_lock:
            session = _sessions.pop(self._key, None)
        if session is not None and session.client is not None:
            session.client.stop()
            session.client.close()

    def has_session(self) -> bool:
        """Whether this process's client is connected now."""
        client = self.session.client
        return client is not None and client.connected

    def client(self, deadline: float) -> Any:
        """This process's connected client, started within the connect budget.

        Raises:
            TimeoutError: no session in time, or the session is away (SUSPENDED).
        """
        session = self.session
        if time.monotonic() < session.skip_until:
            raise TimeoutError(f"{self.name}: skipped for a while after a call timed out")
        with session.lock:
            if session.client is None:
                session.client = self._KazooClient(**self._args)
                session.client.start_async()
            client = session.client
        if not client.connected:
            budget = min(deadline - time.monotonic(), self.connect_timeout or self.timeout)
            if not _connected(client, budget):
                session.skip_until = time.monotonic() + SKIP_AFTER_TIMEOUT
                raise TimeoutError(f"{self.name}: no session in time ({client.state})")
        if not session.ready:
            self.wait(client.ensure_path_async(self.root), deadline)
            session.ready = True
        return client

    def wait(self, result: Any, deadline: float) -> Any:
        """The reply of kazoo's async ``result`` by ``deadline``.

        Raises:
            TimeoutError: none in time; NodeError: the ensemble refused;
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
            raise NodeError(
                f"{self.name}: not allowed (the keys' ACL is another user's: give "
                "user:password@ in the URL)",
                self.name,
                heals=False,
            ) from None
        except ke.AuthFailedError:
            raise NodeError(f"{self.name}: authentication failed", self.name, heals=False) from None
        except (ke.ConnectionLoss, ke.SessionExpiredError, ke.ConnectionClosedError) as exc:
            raise NodeError(f"{self.name}: session lost ({type(exc).__name__})") from None
        except ke.KazooException as exc:
            raise NodeError(f"{self.name}: {type(exc).__name__} {exc}") from None


class Session:
    """A process's kazoo client on one ensemble, its store (cache and clock), and
    its turn: the calls of a process on one ensemble go one at a time, so its
    threads never conflict with one another on a commit (a conflict costs two
    round trips more than the wait)."""

    def __init__(self) -> None:
        self.client: Any = None
        self.ready = False
        self.skip_until = 0.0
        self.store: Any = None
        self.lock = threading.Lock()
        self.turn = threading.Lock()


_sessions: dict[tuple, Session] = {}
_sessions_lock = threading.Lock()


def _forked() -> None:
    """A forked child has its parent's clients without their threads: its own."""
    global _sessions_lock
    _sessions.clear()
    _sessions_lock = threading.Lock()


os.register_at_fork(after_in_child=_forked)


def _connected(client: Any, budget: float) -> bool:
    until = time.monotonic() + max(budget, 0)
    while not client.connected:
        if time.monotonic() >= until:
            return False
        time.sleep(0.005)
    return True
