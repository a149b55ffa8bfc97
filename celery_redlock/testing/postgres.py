"""Throwaway PostgreSQL servers for tests, owned by this process: the PostgreSQL
twin of :class:`~celery_redlock.testing.RedisNode`.

Each server is a data directory of its own (copied from one ``initdb`` per
process, so a further server costs a copy and a start) and a ``postgres``
process on a free port of 127.0.0.1, stopped by its pid. The binaries come from
``$CRL_PG_BIN`` if set, else the newest ``/usr/lib/postgresql/*/bin`` (Debian's
layout), else ``PATH``. ``initdb`` and the server refuse to run as root: as
root they run as the ``postgres`` user. ``fsync`` is off: the tests crash the
server, never the machine, and a crashed server still recovers every
committed write from the WAL the kernel holds.
"""

from __future__ import annotations

import glob
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from typing import Any

from .fleet import ServerFleet
from .nodes import HOST, free_port
from .process import Live, Process

__all__ = ["PostgresServer", "PostgresServers", "postgres_bin", "postgres_missing"]

START_TIMEOUT = 30.0
_template_lock = threading.Lock()
_template: str | None = None
_template_owner = 0  # the process that made it (a forked child leaves it alone)


def postgres_bin() -> str | None:
    """The directory of ``initdb`` and ``postgres``, or None when there is none."""
    given = os.environ.get("CRL_PG_BIN")
    if given:
        return given if os.path.exists(os.path.join(given, "initdb")) else None
    found = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/initdb"),
        key=lambda p: [int(x) for x in p.split("/")[-3].split(".") if x.isdigit()],
    )
    if found:
        return os.path.dirname(found[-1])
    on_path = shutil.which("initdb")
    return os.path.dirname(on_path) if on_path else None


def postgres_missing() -> str | None:
    """Why no PostgreSQL server can be started here, or None."""
    if postgres_bin() is None:
        return (
            "PostgreSQL's server binaries (initdb, postgres) are not installed "
            "(Debian: apt-get install postgresql; or set CRL_PG_BIN)"
        )
    if os.geteuid() == 0 and _user("postgres") is None:
        return "running as root and there is no 'postgres' user to run the server as"
    try:
        import psycopg  # noqa: F401
    except ImportError:
        return "psycopg is not installed (pip install 'celery_redlock[postgres]')"
    return None


def _user(name: str) -> Any:
    import pwd

    try:
        return pwd.getpwnam(name)
    except KeyError:
        return None


def as_server_user() -> dict[str, Any]:
    """Popen arguments that run a command as the server's user (postgres when root)."""
    if os.geteuid() != 0:
        return {}
    return {"user": "postgres", "group": "postgres", "extra_groups": []}


def own_by_server_user(path: str) -> None:
    if os.geteuid() == 0:
        user = _user("postgres")
        shutil.chown(path, user.pw_uid, user.pw_gid)


def _template_dir() -> str:
    """The data directory every server copies: one initdb per process."""
    global _template, _template_owner
    with _template_lock:
        if _template is None or not os.path.exists(_template):
            root = tempfile.mkdtemp(prefix="celery-redlock-pg-template-")
            own_by_server_user(root)
            data = os.path.join(root, "data")
            subprocess.run(
                [os.path.join(postgres_bin() or "", "initdb"), "-D", data, "-A", "trust",
                 "-U", "postgres", "--no-sync", "-E", "UTF8", "--locale", "C"],
                check=True, capture_output=True, **as_server_user(),
            )  # fmt: skip
            _template, _template_owner = data, os.getpid()
        return _template


class PostgresServer(Process):
    """One ``postgres`` server on 127.0.0.1, owned by this process.

    Args:
        start: start it now.
        settings: more ``-c`` settings for its command line; they win over the
            defaults (``{"fsync": "on"}``: a server that flushes as production does).
        standby_of: a running server to stream from: this one starts as its
            standby (``pg_basebackup -R``), read-only and replaying.
    """

    def __init__(
        self,
        *,
        start: bool = True,
        settings: dict[str, str] | None = None,
        standby_of: PostgresServer | None = None,
    ) -> None:
        self.host = HOST
        self.port = free_port()
        self.dir = tempfile.mkdtemp(prefix="celery-redlock-pg-")
        own_by_server_user(self.dir)
        self.data = os.path.join(self.dir, "data")
        #: ``-c`` settings of the server's command line, e.g. ``synchronous_standby_names``.
        self.settings = dict(settings or {})
        if standby_of is None:
            subprocess.run(["cp", "-a", _template_dir(), self.data], check=True)
        else:  # a streaming standby of a running server: its base backup, then replay
            subprocess.run(
                [os.path.join(postgres_bin() or "", "pg_basebackup"), "-h", standby_of.host,
                 "-p", str(standby_of.port), "-U", "postgres", "-D", self.data,
                 "-R", "-X", "stream", "--no-sync"],
                check=True, capture_output=True, **as_server_user(),
            )  # fmt: skip
        self.logfile = os.path.join(self.dir, "server.log")
        self._proc: subprocess.Popen[bytes] | None = None
        self._owner = os.getpid()
        self._paused: list[int] = []
        if start:
            self.start()

    def __repr__(self) -> str:
        return f"<PostgresServer {self.url} pid={self.pid}>"

    @property
    def url(self) -> str:
        return f"postgresql://postgres@{self.host}:{self.port}/postgres"

    def connect(self, **kwargs: Any) -> Any:
        """A psycopg connection (autocommit) to the server, for a test's own SQL."""
        import psycopg

        options: dict[str, Any] = {"autocommit": True, "connect_timeout": 5}
        options.update(kwargs)
        return psycopg.connect(self.url, **options)

    def client(self) -> Keys:
        """The lock node's keys, read and written as a test reads a Redis node's
        (``get``, ``set``, ``pttl``, ``exists``, ``delete``, ``scan_iter``): a
        test of the lock's state runs on either kind."""
        return Keys(self)

    def sql(self, statement: str, *params: Any) -> list[tuple]:
        """Run one statement; its rows (or [] for a statement with none)."""
        with self.connect() as conn:
            cur = conn.execute(statement, params or None)
            return cur.fetchall() if cur.description else []

    def start(self) -> PostgresServer:
        """Start the server (recovering from a crash if it crashed) and wait until it answers."""
        if self.is_running:
            return self
        log = open(self.logfile, "ab")  # noqa: SIM115 - the server writes it while it runs
        self._proc = subprocess.Popen(
            [os.path.join(postgres_bin() or "", "postgres"), "-D", self.data,
             "-p", str(self.port), "-c", f"listen_addresses={self.host}",
             "-c", f"unix_socket_directories={self.dir}", "-c", "fsync=off",
             "-c", "max_connections=200", "-c", "shared_buffers=16MB",
             *(arg for k, v in self.settings.items() for arg in ("-c", f"{k}={v}"))],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            **as_server_user(),
        )  # fmt: skip
        log.close()
        self._owner = os.getpid()
        _live.add(self)
        deadline = time.monotonic() + START_TIMEOUT
        while not self._answers():
            if self._proc.poll() is not None or time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(f"postgres did not start:\n{self.log_tail()}")
            time.sleep(0.02)
        return self

    def _answers(self) -> bool:
        try:
            with self.connect(connect_timeout=1) as conn:
                row = conn.execute("SELECT pg_postmaster_start_time() IS NOT NULL").fetchone()
                return bool(row and row[0])
        except Exception:  # noqa: BLE001 - not up yet
            return False

    def _processes(self) -> list[int]:
        """The postmaster and its children (from /proc)."""
        if self.pid is None:
            return []
        pids = [self.pid]
        for stat in glob.glob("/proc/[0-9]*/stat"):
            try:
                with open(stat) as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == self.pid:
                pids.append(int(stat.split("/")[2]))
        return pids

    def _signal(self, signum: int, pids: list[int] | None = None) -> None:
        if os.getpid() != self._owner:
            raise RuntimeError(f"{self!r} belongs to process {self._owner}")
        for pid in pids if pids is not None else [self._pid()]:
            try:
                os.kill(pid, signum)
            except ProcessLookupError:
                pass

    def _pid(self) -> int:
        assert self._proc is not None
        return self._proc.pid

    def pause(self) -> None:
        """SIGSTOP the postmaster and every backend: connects and calls hang."""
        if not self.is_running:
            raise RuntimeError(f"{self!r} is not running")
        if self._paused:
            return
        self._paused = self._processes()
        self._signal(signal.SIGSTOP, self._paused)

    def resume(self) -> None:
        """SIGCONT what :meth:`pause` stopped."""
        if self._paused:
            self._signal(signal.SIGCONT, self._paused + self._processes())
        self._paused = []

    def crash(self) -> None:
        """Stop at once, as a crash (``pg_ctl stop -m immediate``): the next
        :meth:`start` recovers every committed write."""
        if self.is_running:
            self.resume()
            self._signal(signal.SIGQUIT)
            self._reap()

    def kill(self) -> None:
        """SIGKILL the server and its backends: its port refuses connections."""
        if self.is_running:
            pids = self._processes()
            self.resume()
            self._signal(signal.SIGKILL, pids)
            self._reap()

    def restart(self) -> PostgresServer:
        """Stop and start again on the same port, **without its lock data**: the
        node comes back empty, as a Redis node without persistence does (or a
        failover to a standby that had none). :meth:`crash` keeps the data."""
        self.crash()
        self.start()
        self.flush()
        return self

    def flush(self) -> None:
        """Delete every key of the lock node (schema ``redlock``), if it has any."""
        if self.sql("SELECT to_regclass('redlock.kv') IS NOT NULL")[0][0]:
            self.sql("TRUNCATE redlock.kv")

    flushall = flush  # the name a fleet calls on every kind's node

    def keys(self, pattern: str = "%") -> list[str]:
        """The live keys of the lock node (schema ``redlock``), sorted."""
        if not self.sql("SELECT to_regclass('redlock.kv') IS NOT NULL")[0][0]:
            return []
        rows = self.sql(
            "SELECT key FROM redlock.kv WHERE key LIKE %s AND "
            "(expires_at IS NULL OR expires_at > clock_timestamp()) ORDER BY key",
            pattern,
        )
        return [row[0] for row in rows]

    def kill_backends(self) -> int:
        """pg_terminate_backend every client backend but the caller's; how many."""
        rows = self.sql(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()"
        )
        return int(rows[0][0])

    def stop(self) -> None:
        """Fast shutdown (SIGINT), SIGKILL after 10 s. Idempotent."""
        if self.is_running:
            self.resume()
            self._signal(signal.SIGINT)
            try:
                self._reap(10)
            except subprocess.TimeoutExpired:
                self.kill()

    def close(self) -> None:
        """Stop the server and delete its directory."""
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)
        _live.discard(self)

    def _reap(self, timeout: float | None = None) -> None:
        if self._proc is not None:
            self._proc.wait(timeout)
        self._paused = []


class Keys:
    """A PostgreSQL lock node's keys with the calls of a decoded redis-py client
    that tests use (see :meth:`PostgresServer.client`); schema ``redlock``."""

    def __init__(self, server: PostgresServer):
        self.server = server

    def __enter__(self) -> Keys:
        return self

    def __exit__(self, *exc_info: object) -> None:
        pass

    def _one(self, sql: str, *params: Any) -> Any:
        return self.server.sql(f"SELECT {sql}", *params)[0][0]

    def get(self, key: str) -> str | None:
        return self._one("redlock.r_get(%s)", key)

    def pttl(self, key: str) -> int:
        return int(self._one("redlock.r_pttl(%s)", key))

    def exists(self, *keys: str) -> int:
        return sum(int(self._one("redlock.r_exists(%s)", k)) for k in keys)

    def set(self, key: str, value: Any, px: int | None = None, nx: bool = False) -> bool | None:
        return self._one("redlock.r_set(%s, %s, %s, %s)", key, str(value), px, nx) or None

    def delete(self, *keys: str) -> int:
        return int(self._one("redlock.r_del(VARIADIC %s::text[])", list(keys)))

    def scan_iter(self, match: str = "*", count: int = 0) -> Iterator[str]:
        return iter(self.server.keys(_like(match)))

    def keys(self, pattern: str = "*") -> list[str]:
        return self.server.keys(_like(pattern))

    def zrange(self, key: str, start: int, end: int) -> list[str]:
        members = [m for (m,) in self.server.sql("SELECT member FROM redlock.zmembers(%s)", key)]
        return members[start : None if end == -1 else end + 1]

    def zcard(self, key: str) -> int:
        return len(self.zrange(key, 0, -1))

    def time(self) -> tuple[int, int]:
        sec, usec = self._one("redlock.r_time()")
        return int(sec), int(usec)


def _like(glob_pattern: str) -> str:
    return glob_pattern.replace("%", "\\%").replace("_", "\\_").replace("*", "%").replace("?", "_")


class PostgresServers(ServerFleet[PostgresServer]):
    """N independent PostgreSQL servers, each one lock node (``.urls``), with the
    verbs of :class:`~celery_redlock.testing.RedisNodes` (``kill(i)``,
    ``pause(i)``, ``restart(i)``, ``heal()``, ``keys()``). ``[i].client()`` is
    Redis's: use ``[i].sql()`` here."""

    def __init__(self, n: int = 3, *, servers: list[PostgresServer] | None = None) -> None:
        if servers is not None:
            self.members = servers
            return
        self._fill(n, PostgresServer)

    @property
    def servers(self) -> list[PostgresServer]:
        return self.members

    def keys(self, pattern: str = "*") -> dict[int, list[str]]:
        """Each answering server's index -> its sorted live keys matching the glob ``pattern``."""
        return super().keys(_like(pattern))


_live: Live[PostgresServer] = Live()


def close_all() -> None:
    """Stop every PostgreSQL server this process started, and drop the template."""
    global _template
    _live.close_mine()
    with _template_lock:
        if _template is not None and _template_owner == os.getpid():
            shutil.rmtree(os.path.dirname(_template), ignore_errors=True)
            _template = None
