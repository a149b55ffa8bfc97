"""Throwaway ZooKeeper ensembles for tests, owned by this process: the ZooKeeper
twin of :mod:`celery_redlock.testing.etcd`.

An ensemble is one lock node: one member (standalone) or three (the fault
tests kill, pause and restart members). Each member is a ``QuorumPeerMain``
JVM from Debian's ``zookeeper`` package (``$CRL_ZOOKEEPER_JAR`` if set, else
``/usr/share/java/zookeeper.jar``, with ``java`` on ``PATH``) on free ports
of 127.0.0.1, ``tickTime=500`` so that an election takes about a second, its
data directory in a temporary directory, stopped by its pid.

Imports neither pytest nor Celery.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
from typing import Any

from .fleet import Ensemble, EnsembleFleet, closed_on_error
from .nodes import HOST, free_port
from .process import Live, Member, tmp_root
from .zookeeper_keys import Keys

__all__ = [
    "Keys",
    "ZookeeperEnsemble",
    "ZookeeperEnsembles",
    "ZookeeperMember",
    "zookeeper_missing",
]

START_TIMEOUT = 30.0
_JAR = "/usr/share/java/zookeeper.jar"
_MAIN = "org.apache.zookeeper.server.quorum.QuorumPeerMain"
#: A small, quickly started JVM: the tests' ensembles hold a few keys.
_JVM = ["-Xmx128m", "-XX:+UseSerialGC", "-Xshare:auto"]


def zookeeper_jar() -> str | None:
    jar = os.environ.get("CRL_ZOOKEEPER_JAR") or _JAR
    return jar if os.path.isfile(jar) else None


def zookeeper_missing() -> str | None:
    """Why no ZooKeeper ensemble can be started here, or None."""
    if zookeeper_jar() is None or shutil.which("java") is None:
        return (
            "ZooKeeper's server is not installed (Debian: apt-get install zookeeper, "
            "which brings a JRE; or set CRL_ZOOKEEPER_JAR)"
        )
    for module, extra in (("kazoo", "zookeeper"), ("lupa", "zookeeper")):
        try:
            __import__(module)
        except ImportError:
            return f"{module} is not installed (pip install 'celery_redlock[{extra}]')"
    return None


def four_letters(endpoint: str, word: bytes = b"srvr", timeout: float = 0.5) -> str:
    host, _, port = endpoint.rpartition(":")
    with socket.create_connection((host, int(port)), timeout=timeout) as sock:
        sock.sendall(word)
        chunks = []
        while chunk := sock.recv(4096):
            chunks.append(chunk)
    return b"".join(chunks).decode(errors="replace")


class ZookeeperMember(Member):
    """One ``QuorumPeerMain`` of an ensemble, on 127.0.0.1."""

    def __init__(self, myid: int, root: str) -> None:
        super().__init__(root, f"m{myid}", HOST, free_port())
        self.myid = myid
        self.peer_port, self.election_port = free_port(), free_port()
        self.dir = os.path.join(root, f"m{myid}")

    def __repr__(self) -> str:
        return f"<ZookeeperMember {self.myid} {self.endpoint} pid={self.pid}>"

    def launch(self, servers: list[str]) -> None:
        if self.is_running:
            return
        os.makedirs(self.dir, exist_ok=True)
        with open(os.path.join(self.dir, "myid"), "w") as f:
            f.write(f"{self.myid}\n")
        cfg = os.path.join(self.dir, "zoo.cfg")
        with open(cfg, "w") as f:
            f.write(
                f"tickTime=500\ninitLimit=20\nsyncLimit=4\ndataDir={self.dir}\n"
                f"clientPort={self.port}\nclientPortAddress={self.host}\n"
                "admin.enableServer=false\n4lw.commands.whitelist=srvr,mntr,ruok\n"
                "maxClientCnxns=0\n" + "".join(f"{s}\n" for s in servers)
            )
        log = open(self.logfile, "ab")  # noqa: SIM115 - the server writes it while it runs
        self._proc = subprocess.Popen(
            ["java", *_JVM, "-Dzookeeper.log.dir=" + self.dir,
             "-cp", zookeeper_jar() or _JAR, _MAIN, cfg],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        log.close()
        self._owner = os.getpid()
        self._paused = False

    def mode(self, timeout: float = 0.5) -> str | None:
        """``leader``, ``follower`` or ``standalone`` while it serves; else None."""
        try:
            text = four_letters(self.endpoint, b"srvr", timeout)
        except OSError:
            return None
        for line in text.splitlines():
            if line.startswith("Mode: "):
                return line[6:].strip()
        return None


class ZookeeperEnsemble(Ensemble[ZookeeperMember]):
    """One ZooKeeper ensemble of ``size`` members on 127.0.0.1: one lock node (``.url``)."""

    scheme = "zookeeper"

    def __init__(self, size: int = 1, *, start: bool = True):
        self.dir = tempfile.mkdtemp(prefix="celery-redlock-zk-", dir=tmp_root())
        self.members = [ZookeeperMember(i + 1, self.dir) for i in range(size)]
        _live.add(self)
        self._begin(start)

    @property
    def urls(self) -> list[str]:
        return [self.url]

    def start(self, timeout: float = START_TIMEOUT) -> ZookeeperEnsemble:
        """Start every member that is not running (data kept) and wait for a leader."""
        for member in self.members:
            member.resume()
            member.launch(self.servers())
        self.wait_ready(timeout)
        return self

    def servers(self) -> list[str]:
        """The ``server.N`` lines of the members' config (none when standalone)."""
        if len(self.members) == 1:
            return []
        return [f"server.{m.myid}={m.host}:{m.peer_port}:{m.election_port}" for m in self.members]

    def wait_ready(self, timeout: float = START_TIMEOUT) -> None:
        def ready(up: list[ZookeeperMember]) -> bool:
            modes = [m.mode() for m in up]
            return any(mode in ("leader", "standalone") for mode in modes) and (
                sum(mode is not None for mode in modes) > len(self.members) // 2
            )

        self._wait_ready(ready, "ZooKeeper ensemble", timeout, 0.05)

    def leader(self) -> int:
        """The index of the member that leads now."""
        for i, member in enumerate(self.members):
            if member.is_running and not member.is_paused and member.mode() in (
                "leader", "standalone",
            ):  # fmt: skip
                return i
        raise RuntimeError(f"{self!r} has no leader now")

    def _client(self) -> Any:
        from kazoo.client import KazooClient

        hosts = [m.endpoint for m in self.members if m.is_running and not m.is_paused]
        client = KazooClient(hosts=",".join(hosts or [self.members[0].endpoint]), timeout=4.0)
        client.start(timeout=10)
        return client

    def client(self) -> Keys:
        """The lock node's keys, read and written as a test reads a Redis node's."""
        hosts = [m.endpoint for m in self.members if m.is_running and not m.is_paused]
        return Keys(",".join(hosts or [self.members[0].endpoint]))

    def keys(self, pattern: str = "*") -> list[str]:
        """The lock node's live keys matching ``pattern``, sorted."""
        with self.client() as keys:
            return keys.keys(pattern)

    def stop(self) -> None:
        """Kill every member (the lock node is down; :meth:`start` brings it back)."""
        for member in self.members:
            member.kill()

    def flushall(self) -> None:
        """Delete every key (the root znode and all below it)."""
        client = self._client()
        try:
            client.delete("/redlock", recursive=True)
        except Exception as exc:  # noqa: BLE001 - none yet
            if type(exc).__name__ != "NoNodeError":
                raise
        finally:
            client.stop()
            client.close()

    def close(self) -> None:
        """Stop every member and delete the data directories."""
        super().close()
        _live.discard(self)


class ZookeeperEnsembles(EnsembleFleet[ZookeeperEnsemble]):
    """N independent ensembles of ``size`` members, each one lock node (``.urls``),
    with the verbs of :class:`~celery_redlock.testing.RedisNodes` on a whole ensemble."""

    def __init__(self, n: int = 1, size: int = 1):
        self.members = []
        with closed_on_error(self):
            for _ in range(n):
                self.members.append(ZookeeperEnsemble(size, start=False))
            for ensemble in self.members:  # their JVMs start side by side
                for member in ensemble:
                    member.launch(ensemble.servers())
            for ensemble in self.members:
                ensemble.wait_ready()

    @property
    def ensembles(self) -> list[ZookeeperEnsemble]:
        return self.members


_live: Live[ZookeeperEnsemble] = Live()
#: Stop every ZooKeeper ensemble this process started.
close_all = _live.close_mine
