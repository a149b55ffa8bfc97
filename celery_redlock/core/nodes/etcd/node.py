"""One etcd cluster as a lock node: its URL, its members, and its requests.

Requests go to etcd's HTTP/JSON gateway (``/v3/...``) on one keep-alive
connection per member and thread (:mod:`.exchange`),
each one bounded by the call's own deadline, connect included; nothing
retries but a reused connection the member had closed (once, at once: every
operation is safe to send twice).
The members of the URL are tried in turn: the one that answered last goes
first, and a member that refuses or times out is passed over for the next one
while the call's deadline leaves time (a member gets half of what is left
while another is still to try, so a hung member does not take the whole call;
a member that timed out goes last for a few seconds). A member that has lost
its cluster's quorum does not answer a linearizable request: the call times
out, "not answering".
"""

from __future__ import annotations

import base64
import json
import os
import ssl
import threading
import time
from urllib.parse import unquote, urlsplit

from ...exceptions import ConfigurationError
from ...exceptions import NodeError as _NodeError
from .. import mask_url
from ..guard import Breaker
from ..util import OneNode, host_ports, refuse_min_replicas, url_options
from ..virtual.store import Store
from .exchange import Connection

__all__ = ["EtcdNode", "NodeError", "b64", "unb64"]

#: etcd's minimum lease TTL with its default heartbeat and election timeout:
#: ceil(1.5 * election timeout) = 2 s; a node's own is read at its first call.
DEFAULT_MIN_TTL = 2
#: Seconds a member that timed out is passed over while another is tried first.
_SKIP = 5.0


class NodeError(_NodeError):
    """An etcd node's error (refused, misconfigured, or an error reply), naming the node."""


def b64(data: bytes | str) -> str:
    return base64.b64encode(data.encode() if isinstance(data, str) else data).decode()


def unb64(text: str | None) -> bytes:
    return base64.b64decode(text) if text else b""


class EtcdNode(OneNode):
    """One etcd cluster (its members' client endpoints) as one lock node.

    Args:
        url: ``etcd://host:port[,host:port...][?prefix=...]``, or ``etcds://``
            for TLS (``ca``, ``cert``, ``key`` query options name PEM files);
            ``user:password@`` authenticates (etcd's ``/v3/auth/authenticate``).
        timeout: seconds a call gets for its reply.
        min_replicas: refused above 0: an etcd write is committed by a
            majority of its members before it answers.
        connect_timeout: seconds a new connection gets to open; None: ``timeout``.
    """

    kind = "etcd"
    #: Its keys as the store verbs see them (set by the kind's ``make``).
    store: Store

    def __init__(
        self, url: str, timeout: float, min_replicas: int = 0, connect_timeout: float | None = None
    ):
        self.name = mask_url(url)
        where = f"etcd node {self.name}"
        parts = urlsplit(url)
        refuse_min_replicas(where, min_replicas, "every etcd write is committed by a majority "
                            "of the cluster's members before it answers")  # fmt: skip
        self.endpoints = host_ports(where, parts.netloc, "etcd's client port, usually 2379")
        options = url_options(where, parts.query, ("prefix", "ca", "cert", "key"))
        self.tls = parts.scheme == "etcds"
        self.prefix = options.get("prefix", "redlock/").encode()
        self.ca, self.cert, self.key = options.get("ca"), options.get("cert"), options.get("key")
        self.user = unquote(parts.username) if parts.username else None
        self.password = unquote(parts.password) if parts.password else None
        self.identity: tuple = ("etcd", tuple(sorted(self.endpoints)), self.prefix)
        self.timeout, self.connect_timeout = timeout, connect_timeout
        self.min_ttl = DEFAULT_MIN_TTL
        self.cluster_id: str | None = None
        self._local = threading.local()
        self._order = list(self.endpoints)
        self._skip: dict[str, float] = {}  # member -> passed over until
        self._checked = False
        self._ssl: ssl.SSLContext | None = None
        self.breaker = Breaker()  # on its calls: see post
        self._token: str | None = None
        self._lock = threading.Lock()

    def connecting(self) -> bool:  # its first call checks the cluster, on a new connection
        return not self._checked or not any(c.sock for c in self._conns().values())

    def close(self) -> None:
        conns = getattr(self._local, "conns", None)
        if conns is not None and self._local.pid == os.getpid():
            for conn in conns.values():
                conn.close()
        self._local.conns = None

    # -- requests ---------------------------------------------------------------------------

    def _conns(self) -> dict[str, Connection]:
        conns = getattr(self._local, "conns", None)
        if conns is None or self._local.pid != os.getpid():
            # a forked child inherits its parent thread's connections: their sockets are
            # the parent's, so the child opens its own (and never closes the parent's)
            conns = self._local.conns = {}
            self._local.pid = os.getpid()
        return conns

    def _context(self) -> ssl.SSLContext:
        if self._ssl is None:
            context = ssl.create_default_context(cafile=self.ca)
            if self.cert:
                context.load_cert_chain(self.cert, self.key)
            self._ssl = context
        return self._ssl

    def _request(
        self, endpoint: str, path: str, body: dict, connect: float, left: float, auth: bool
    ) -> tuple[int, bytes]:
        """One POST on ``endpoint``'s connection: (status, body).

        Raises:
            TimeoutError: no reply within ``left`` (or no connection within ``connect``).
            OSError: the connection failed.
        """
        conns = self._conns()
        data = json.dumps(body, separators=(",", ":")).encode()
        token = self._token if auth else None
        for fresh in (False, True):
            conn = conns.get(endpoint)
            reused = conn is not None and conn.sock is not None and not fresh
            if conn is None or fresh:
                if conn is not None:
                    conn.close()
                host, _, port = endpoint.rpartition(":")
                conn = Connection(host, int(port), self._context() if self.tls else None)
                conns[endpoint] = conn
            try:
                if conn.sock is None:
                    conn.connect(connect)
                return conn.post(f"/v3/{path}", data, token, left)
            except OSError as exc:
                conn.close()
                if isinstance(exc, TimeoutError) or not reused:
                    raise
                # the member closed an idle connection (a restart): once more, anew
        raise AssertionError("unreachable")

    def post(self, path: str, body: dict, deadline: float) -> dict:
        """POST ``body`` to ``/v3/<path>`` on a member, before ``deadline``.

        Raises:
            TimeoutError: no member answered in time.
            NodeError: every member refused, or the cluster answered an error.
        """
        self.breaker.check(self.name)
        try:
            if not self._checked:
                self._check(deadline)
            reply = self._post(path, body, deadline)
        except TimeoutError:
            self.breaker.timed_out(self.timeout)
            raise
        except NodeError as exc:
            if self.user is None or "invalid auth token" not in str(exc):
                raise
        else:
            self.breaker.answered()
            return reply
        with self._lock:  # the token expired (--auth-token-ttl): authenticate again, once
            self._checked, self._token = False, None
        self._check(deadline)
        return self._post(path, body, deadline)

    def _post(
        self, path: str, body: dict, deadline: float, auth: bool = True, member: str = ""
    ) -> dict:
        now = time.monotonic()
        order = (
            [member] if member else sorted(self._order, key=lambda e: self._skip.get(e, 0) > now)
        )
        errors: list[str] = []
        unverified = 0  # members whose TLS certificate was not verified: no outage
        pending, again = list(order), set()
        while pending:
            endpoint = pending.pop(0)
            left = deadline - time.monotonic()
            if left <= 0:
                break
            if pending:
                left /= 2  # a hung member leaves the other half to the next one
            connect = min(left, self.connect_timeout or left)
            try:
                status, data = self._request(endpoint, path, body, connect, left, auth)
            except TimeoutError:
                self._skip[endpoint] = time.monotonic() + _SKIP
                errors.append(f"{endpoint} timed out")
                if endpoint not in again:  # once more, with what is left, after the others
                    again.add(endpoint)
                    pending.append(endpoint)
                continue
            except OSError as exc:
                errors.append(f"{endpoint}: {_reason(exc)}")
                unverified += isinstance(exc, ssl.SSLCertVerificationError)
                continue
            self._skip.pop(endpoint, None)
            if endpoint != self._order[0] and not member:
                self._order.remove(endpoint)
                self._order.insert(0, endpoint)
            return self._reply(status, data, path)
        if not errors or any("timed out" in e for e in errors):
            raise TimeoutError(f"{self.name}: no reply in time ({'; '.join(errors) or 'none'})")
        raise NodeError(
            f"{self.name}: no member answers ({'; '.join(errors)})",
            self.name,
            heals=unverified < len(errors),
        )

    def _reply(self, status: int, body: bytes, path: str) -> dict:
        if status == 404:
            raise NodeError(
                f"{self.name}: /v3/{path} not found: not an etcd >= 3.4 with its v3 API "
                "(its gRPC gateway) on this port",
                self.name,
                heals=False,
            )
        try:
            data = json.loads(body)
        except ValueError:
            raise NodeError(f"{self.name}: not an etcd reply (HTTP {status})") from None
        if status != 200:
            message = data.get("error") or data.get("message") or str(data)
            why = (
                "the cluster requires authentication: give user:password@ in the URL"
                if "user name is empty" in message or "invalid auth token" in message
                else "authentication failed"
                if "authentication failed" in message
                else ""
            )
            if why:  # no outage: a fix
                raise NodeError(f"{self.name}: {why} ({message})", self.name, heals=False)
            raise NodeError(f"{self.name}: {message}")
        return data

    def _check(self, deadline: float) -> None:
        """At the first call: authenticate, compare the members' cluster ids, and
        read the minimum lease TTL."""
        with self._lock:
            if self._checked:
                return
            if self.user is not None:
                got = self._post(
                    "auth/authenticate",
                    {"name": self.user, "password": self.password or ""},
                    deadline,
                    auth=False,
                )
                self._token = got.get("token")
            clusters: dict[str, str] = {}
            if len(self.endpoints) > 1:
                for endpoint in self.endpoints:
                    try:
                        got = self._post("maintenance/status", {}, deadline, member=endpoint)
                    except (TimeoutError, NodeError):
                        continue  # a member down now: the others still tell
                    clusters[endpoint] = got["header"]["cluster_id"]
                if len(set(clusters.values())) > 1:
                    shown = ", ".join(f"{e} is cluster {c}" for e, c in clusters.items())
                    raise ConfigurationError(
                        f"etcd node {self.name}: its endpoints are members of different "
                        f"clusters ({shown}); one etcd node is one cluster: give each "
                        "cluster as a node of its own"
                    )
            self._checked = True


def _reason(exc: BaseException) -> str:
    """A connection's failure in a few words (an SSL error's reason, a refusal)."""
    if isinstance(exc, ssl.SSLError):
        return f"TLS: {exc.reason or exc}"
    return type(exc).__name__
