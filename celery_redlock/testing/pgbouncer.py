"""Debian's pgbouncer in front of a test's PostgreSQL server (transaction pooling)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time

from .nodes import HOST, free_port
from .postgres import START_TIMEOUT, PostgresServer, as_server_user, own_by_server_user

__all__ = ["PgBouncer"]


class PgBouncer:
    """Debian's ``pgbouncer`` on a free port of 127.0.0.1 in front of ``server``,
    in transaction pooling with ``pool_size`` server connections: each
    transaction may run on another server connection than the last."""

    def __init__(self, server: PostgresServer, pool_size: int = 2) -> None:
        binary = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"
        if not os.path.exists(binary):
            raise RuntimeError("pgbouncer is not installed (Debian: apt-get install pgbouncer)")
        self.server = server
        self.port = free_port()
        self.dir = tempfile.mkdtemp(prefix="celery-redlock-pgbouncer-")
        own_by_server_user(self.dir)
        config = os.path.join(self.dir, "pgbouncer.ini")
        with open(os.path.join(self.dir, "users.txt"), "w") as f:
            f.write('"postgres" ""\n')
        with open(config, "w") as f:
            f.write(
                f"[databases]\n* = host={server.host} port={server.port}\n[pgbouncer]\n"
                f"listen_addr = {HOST}\nlisten_port = {self.port}\nunix_socket_dir = {self.dir}\n"
                f"auth_type = trust\nauth_file = {self.dir}/users.txt\n"
                f"pool_mode = transaction\ndefault_pool_size = {pool_size}\n"
                "max_client_conn = 200\nlogfile = " + os.path.join(self.dir, "pgbouncer.log") + "\n"
            )
        for name in os.listdir(self.dir):
            own_by_server_user(os.path.join(self.dir, name))
        self._proc = subprocess.Popen(
            [binary, config], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.STDOUT, **as_server_user(),
        )  # fmt: skip
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            try:
                import psycopg

                with psycopg.connect(self.url, connect_timeout=1, autocommit=True) as conn:
                    conn.execute("SELECT 1")
                break
            except Exception:  # noqa: BLE001 - not up yet
                if self._proc.poll() is not None or time.monotonic() > deadline:
                    self.close()
                    raise RuntimeError("pgbouncer did not start") from None
                time.sleep(0.02)

    @property
    def url(self) -> str:
        return f"postgresql://postgres@{HOST}:{self.port}/postgres"

    def close(self) -> None:
        if self._proc.poll() is None:
            self._proc.send_signal(signal.SIGINT)
            try:
                self._proc.wait(10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> PgBouncer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
