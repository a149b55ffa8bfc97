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

import atexit
import os
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from typing import Any

from .etcd_keys import Keys, api
from .fleet import EnsembleFleet
from .nodes import HOST, free_port

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


class EtcdMember:
    """One ``etcd`` process of a cluster, on 127.0.0.1."""

    def __init__(self, name: str, root: str) -> None:
        self.name = name
        self.host = HOST
        self.port = free_port()
        self.peer_port = free_port()
        self.data = os.path.join(root, name)
        self.logfile = os.path.join(root, f"{name}.log")
        self._proc: subprocess.Popen[bytes] | None = None
        self._owner = os.getpid()
        self._paused = False

    def __repr__(self) -> str:
        return f"<EtcdMember {self.name} {self.endpoint} pid={self.pid}>"

    @property
    def endpoint(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def peer_url(self) -> str:
        return f"http://{self.host}:{self.peer_port}"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def is_running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def is_paused(self) -> bool:
        return self._paused and self.is_running

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

    def _signal(self, signum: int) -> None:
        if os.getpid() != self._owner:
            raise RuntimeError(f"{self!r} belongs to process {self._owner}")
        if self._proc is not None:
            try:
                os.kill(self._proc.pid, signum)
            except ProcessLookupError:
                pass

    def pause(self) -> None:
        """SIGSTOP the member: its connections hang."""
        if self.is_running and not self._paused:
            self._signal(signal.SIGSTOP)
            self._paused = True

    def resume(self) -> None:
        if self._paused:
            self._signal(signal.SIGCONT)
        self._paused = False

    def kill(self) -> None:
        """SIGKILL the member; its data stays (:meth:`EtcdCluster.start` brings it back)."""
        if self.is_running:
            self.resume()
            self._signal(signal.SIGKILL)
            assert self._proc is not None
            self._proc.wait()

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

    def log_tail(self, lines: int = 20) -> str:
        try:
            with open(self.logfile, "rb") as log:
                return "\n".join(log.read().decode(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


class EtcdCluster:
    """One etcd cluster of ``size`` members on 127.0.0.1: one lock node (``.url``).

    Args:
        size: the number of members (1, or 3 for the fault tests).
        extra_args: more ``etcd`` flags for every member.
        start: start the members now and wait until the cluster answers.
    """

    def __init__(self, size: int = 1, *, extra_args: list[str] | None = None, start: bool = True):
        self.dir = tempfile.mkdtemp(prefix="celery-redlock-etcd-", dir=_tmp_root())
        self.token = f"crl-{uuid.uuid4().hex[:12]}"
        self.members = [EtcdMember(f"m{i}", self.dir) for i in range(size)]
        self.extra = list(extra_args or [])
        _live.add(self)
        _arm()
        if start:
            try:
                self.start()
            except BaseException:
                self.close()
                raise

    def __repr__(self) -> str:
        return f"<EtcdCluster {self.url}>"

    def __enter__(self) -> EtcdCluster:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __len__(self) -> int:
        return len(self.members)

    def __getitem__(self, index: int) -> EtcdMember:
        return self.members[index]

    def __iter__(self) -> Iterator[EtcdMember]:
        return iter(self.members)

    @property
    def url(self) -> str:
        return "etcd://" + ",".join(m.endpoint for m in self.members)

    def start(self, timeout: float = START_TIMEOUT) -> EtcdCluster:
        """Start every member that is not running (data kept) and wait for a leader."""
        initial = ",".join(f"{m.name}={m.peer_url}" for m in self.members)
        for member in self.members:
            member.resume()
            member.launch(initial, self.token, self.extra)
        self.wait_ready(timeout)
        return self

    def wait_ready(self, timeout: float = START_TIMEOUT) -> None:
        deadline = time.monotonic() + timeout
        while not any(m.answers() for m in self.members if m.is_running and not m.is_paused):
            dead = [m for m in self.members if m._proc is not None and not m.is_running]
            if time.monotonic() > deadline or len(dead) == len(self.members):
                tails = "\n".join(f"{m!r}:\n{m.log_tail()}" for m in self.members)
                raise RuntimeError(f"etcd cluster did not become ready:\n{tails}")
            time.sleep(0.02)

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

    def kill(self, index: int) -> None:
        self.members[index].kill()

    def pause(self, index: int) -> None:
        self.members[index].pause()

    def resume(self, index: int) -> None:
        self.members[index].resume()

    def heal(self) -> None:
        """Resume paused members and start stopped ones (their data kept)."""
        if any(not m.is_running or m.is_paused for m in self.members):
            self.start()

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
        for member in self.members:
            member.kill()
        shutil.rmtree(self.dir, ignore_errors=True)
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


def _tmp_root() -> str | None:
    """Data directories in memory where there is a /dev/shm: the tests kill members,
    never the machine, and a WAL's fsync there costs nothing."""
    return "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None


_live: set[EtcdCluster] = set()
_armed = False


def _arm() -> None:
    global _armed
    if not _armed:
        _armed = True
        atexit.register(close_all)
        os.register_at_fork(after_in_child=_live.clear)


def close_all() -> None:
    """Stop every etcd cluster this process started."""
    for cluster in list(_live):
        if all(m._owner == os.getpid() for m in cluster.members):
            cluster.close()
