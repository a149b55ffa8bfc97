"""Throwaway etcd clusters for tests, owned by this process: the etcd twin of
:class:`~celery_redlock.testing.RedisNode`.

A cluster is one lock node: one member (:class:`EtcdCluster` of size 1, the
deployment most users want) or three (the fault tests kill, pause and restart
members). Each member is an ``etcd`` process from Debian's ``etcd-server``
package (``$CRL_ETCD`` if set, else ``etcd`` on ``PATH``) on free ports of
127.0.0.1, its data directory in a temporary directory, stopped by its pid.

Imports neither pytest nor Celery.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import uuid
from typing import Any

from .etcd_keys import Keys, api
from .fleet import Ensemble, EnsembleFleet
from .nodes import HOST, free_port
from .process import Live, Member, tmp_root

__all__ = [
    "EtcdCluster",
    "EtcdClusters",
    "EtcdMember",
    "Keys",
    "api",
    "etcd_binary",
    "etcd_missing",
]

START_TIMEOUT = 20.0


def etcd_binary() -> str | None:
    """The ``etcd`` server executable, or None when there is none."""
    given = os.environ.get("CRL_ETCD")
    if given:
        return shutil.which(given)
    return shutil.which("etcd") or (
        "/usr/bin/etcd" if os.access("/usr/bin/etcd", os.X_OK) else None
    )


def etcd_missing() -> str | None:
    """Why no etcd cluster can be started here, or None."""
    if etcd_binary() is None:
        return (
            "etcd's server binary is not installed "
            "(Debian: apt-get install etcd-server; or set CRL_ETCD)"
        )
    try:
        import lupa  # noqa: F401
    except ImportError:
        return "lupa is not installed (pip install 'celery_redlock[etcd]')"
    return None


class EtcdMember(Member):
    """One ``etcd`` process of a cluster, on 127.0.0.1."""

    def __init__(self, name: str, root: str) -> None:
        super().__init__(root, name, HOST, free_port())
        self.name = name
        self.peer_port = free_port()
        self.data = os.path.join(root, name)

    def __repr__(self) -> str:
        return f"<EtcdMember {self.name} {self.endpoint} pid={self.pid}>"

    @property
    def peer_url(self) -> str:
        return f"http://{self.host}:{self.peer_port}"

    def launch(self, initial_cluster: str, token: str, extra: list[str]) -> None:
        if self.is_running:
            return
        log = open(self.logfile, "ab")  # noqa: SIM115 - the server writes it while it runs
        client = f"http://{self.endpoint}"
        self._proc = subprocess.Popen(
            [etcd_binary() or "etcd", "--name", self.name, "--data-dir", self.data,
             "--listen-client-urls", client, "--advertise-client-urls", client,
             "--listen-peer-urls", self.peer_url,
             "--initial-advertise-peer-urls", self.peer_url,
             "--initial-cluster", initial_cluster, "--initial-cluster-token", token,
             "--initial-cluster-state", "new", *extra],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        log.close()
        self._owner = os.getpid()
        self._paused = False

    def answers(self, timeout: float = 0.5) -> bool:
        """Whether the member reports itself healthy (its cluster has a leader)."""
        try:
            return api(f"http://{self.endpoint}/health", None, timeout).get("health") == "true"
        except Exception:  # noqa: BLE001 - not up yet
            return False

    def status(self) -> dict[str, Any]:
        return api(f"http://{self.endpoint}/v3/maintenance/status", {})

    def stop(self) -> None:
        """SIGTERM, SIGKILL after 5 s."""
        if self.is_running:
            self.resume()
            self._signal(signal.SIGTERM)
            assert self._proc is not None
            try:
                self._proc.wait(5)
            except subprocess.TimeoutExpired:
                self.kill()


class EtcdCluster(Ensemble[EtcdMember]):
    """One etcd cluster of ``size`` members on 127.0.0.1: one lock node (``.url``).

    Args:
        size: the number of members (1, or 3 for the fault tests).
        extra_args: more ``etcd`` flags for every member.
        start: start the members now and wait until the cluster answers.
    """

    scheme = "etcd"

    def __init__(self, size: int = 1, *, extra_args: list[str] | None = None, start: bool = True):
        self.dir = tempfile.mkdtemp(prefix="celery-redlock-etcd-", dir=tmp_root())
        self.token = f"crl-{uuid.uuid4().hex[:12]}"
        self.members = [EtcdMember(f"m{i}", self.dir) for i in range(size)]
        self.extra = list(extra_args or [])
        _live.add(self)
        self._begin(start)

    def start(self, timeout: float = START_TIMEOUT) -> EtcdCluster:
        """Start every member that is not running (data kept) and wait for a leader."""
        initial = ",".join(f"{m.name}={m.peer_url}" for m in self.members)
        for member in self.members:
            member.resume()
            member.launch(initial, self.token, self.extra)
        self.wait_ready(timeout)
        return self

    def wait_ready(self, timeout: float = START_TIMEOUT) -> None:
        def ready(up: list[EtcdMember]) -> bool:
            return any(m.answers() for m in up)

        self._wait_ready(ready, "etcd cluster", timeout, 0.02)

    def leader(self) -> int:
        """The index of the member that leads now."""
        for i, member in enumerate(self.members):
            if member.is_running and not member.is_paused:
                try:
                    status = member.status()
                except Exception:  # noqa: BLE001 - a member going down
                    continue
                if status.get("leader") == status.get("header", {}).get("member_id"):
                    return i
        raise RuntimeError(f"{self!r} has no leader now")

    def client(self) -> Keys:
        """The lock node's keys, read and written as a test reads a Redis node's."""
        return Keys(self)

    def keys(self, pattern: str = "*") -> list[str]:
        with self.client() as keys:
            return keys.keys(pattern)

    def flushall(self) -> None:
        """Delete every key and revoke every lease."""
        base = f"http://{self.members[0].endpoint}/v3"
        for m in self.members:
            if m.is_running and not m.is_paused:
                base = f"http://{m.endpoint}/v3"
                break
        api(f"{base}/kv/deleterange", {"key": "AA==", "range_end": "AA=="}, 5.0)
        for lease in api(f"{base}/lease/leases", {}, 5.0).get("leases", []):
            api(f"{base}/lease/revoke", {"ID": lease["ID"]}, 5.0)

    def stop(self) -> None:
        for member in self.members:
            member.stop()

    def close(self) -> None:
        """Stop every member and delete the data directories."""
        super().close()
        _live.discard(self)


class EtcdClusters(EnsembleFleet[EtcdCluster]):
    """N independent etcd clusters, each one lock node (``.urls``), with the verbs
    of :class:`~celery_redlock.testing.RedisNodes` on the whole cluster."""

    def __init__(
        self, n: int = 1, size: int = 1, *, etcd_clusters: list[EtcdCluster] | None = None
    ):
        if etcd_clusters is not None:
            self.members = etcd_clusters
            return
        self._fill(n, lambda: EtcdCluster(size))

    @property
    def etcd_clusters(self) -> list[EtcdCluster]:
        return self.members


_live: Live[EtcdCluster] = Live()
#: Stop every etcd cluster this process started.
close_all = _live.close_mine
