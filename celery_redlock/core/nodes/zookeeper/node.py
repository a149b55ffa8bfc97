"""One ZooKeeper ensemble as a lock node: its URL, and this process's one session
on it (:class:`~.store.ZookeeperStore`), shared by its nodes of that URL."""

from __future__ import annotations

from functools import partial
from typing import Any
from urllib.parse import unquote, urlsplit

from ...exceptions import ConfigurationError
from ..guard import PerProcess
from ..util import OneNode, host_ports, mask_url, refuse_min_replicas, url_options
from .store import NodeError, ZookeeperStore

__all__ = ["NodeError", "ZookeeperNode"]

#: The session timeout asked for (s; the server clamps it to 2-20 x tickTime). No
#: lock hangs on a session: it bounds how soon kazoo leaves a hung member.
SESSION = 4.0
_OPTIONS = ("ca", "cert", "key", "prefix", "tls", "verify")

_stores: PerProcess[ZookeeperStore] = PerProcess()


class ZookeeperNode(OneNode):
    """One ZooKeeper ensemble as one lock node: ``url`` as the ZooKeeper page of
    the docs gives it; ``min_replicas`` is refused above 0."""

    kind = "zookeeper"

    def __init__(
        self, url: str, timeout: float, min_replicas: int = 0, connect_timeout: float | None = None
    ):
        self.name = mask_url(url)
        where = f"zookeeper node {self.name}"
        try:
            from kazoo.client import KazooClient
        except ImportError:
            raise ConfigurationError(
                f"{where} needs kazoo: pip install 'celery_redlock[zookeeper]'"
            ) from None
        refuse_min_replicas(where, min_replicas, "a write answers once a majority of the "
                            "ensemble logged it")  # fmt: skip
        parts = urlsplit(url)
        self.hosts = host_ports(where, parts.netloc, "a member's client port, 2181")
        options = url_options(where, parts.query, _OPTIONS)
        prefix = options.get("prefix", "redlock").strip("/")
        #: The znode whose children are the keys (its mtime: the ensemble's clock).
        self.root = f"{parts.path.rstrip('/')}/{prefix}"
        if not prefix or "//" in self.root:
            raise ConfigurationError(f"{where}: the chroot and prefix must be znode paths "
                                     "(no empty part)")  # fmt: skip
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
        self._key = (self.identity, repr(sorted(self._args.items())))
        self.new_client = partial(KazooClient, **self._args)  # not started

    @property
    def store(self) -> ZookeeperStore:
        """This process's session on the ensemble, with the store verbs."""
        return _stores.get(self._key, lambda: ZookeeperStore(self))

    def close(self) -> None:
        store = _stores.pop(self._key)
        if store is not None and store.session is not None:
            store.session.stop()
            store.session.close()

    def connecting(self) -> bool:
        session = self.store.session
        return session is None or not session.connected
