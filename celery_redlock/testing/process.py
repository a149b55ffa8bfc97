"""What the test servers of every kind share: a child process of this one, which
a test pauses (SIGSTOP), resumes and kills."""

from __future__ import annotations

import atexit
import os
import signal
import subprocess
from typing import Any, TypeVar

T = TypeVar("T")


def tmp_root() -> str | None:
    """Data directories in memory where there is a /dev/shm: the tests kill members,
    never the machine, and a WAL's fsync there costs nothing."""
    return "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None


class Live(set[T]):
    """The servers of one kind this process started. At the first one it
    registers :meth:`close_mine` to run at exit, and that a forked child forgets
    its parent's (nothing is registered at import)."""

    def __init__(self) -> None:
        super().__init__()
        self._armed = False

    def add(self, server: T) -> None:
        if not self._armed:
            self._armed = True
            atexit.register(self.close_mine)
            os.register_at_fork(after_in_child=self.clear)
        super().add(server)

    def close_mine(self) -> None:
        """Close each one this process started (a forked child's are its parent's)."""
        servers: list[Any] = list(self)
        for server in servers:
            if server.started_here():
                server.close()


class Process:
    """A server's process (``_proc``), whether a test paused it (``_paused``),
    the process that started it (``_owner``) and its output (``logfile``)."""

    _proc: subprocess.Popen[bytes] | None = None
    _paused: Any = False
    _owner: int
    logfile: str

    def started_here(self) -> bool:
        return self._owner == os.getpid()

    def log_tail(self, lines: int = 20) -> str:
        try:
            with open(self.logfile, "rb") as log:
                return "\n".join(log.read().decode(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def is_running(self) -> bool:
        """True while the process exists, paused or not."""
        return self._proc is not None and self._proc.poll() is None

    @property
    def is_paused(self) -> bool:
        return bool(self._paused) and self.is_running


class Member(Process):
    """One member process of an ensemble, serving on ``host:port``, signalled
    only by the process that started it; ``name`` names its log in ``root``."""

    def __init__(self, root: str, name: str, host: str, port: int) -> None:
        self.host = host
        self.port = port
        self.logfile = os.path.join(root, f"{name}.log")
        self._proc: subprocess.Popen[bytes] | None = None
        self._owner = os.getpid()
        self._paused = False

    @property
    def endpoint(self) -> str:
        return f"{self.host}:{self.port}"

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
        """SIGKILL the member; its data stays (its ensemble's ``start()`` brings it back)."""
        if self.is_running:
            self.resume()
            self._signal(signal.SIGKILL)
            assert self._proc is not None
            self._proc.wait()
