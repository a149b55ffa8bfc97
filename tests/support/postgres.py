"""A throwaway PostgreSQL database on a server of this test process: started on
first use from the distribution's binaries on a free loopback port
(:class:`celery_redlock.testing.postgres.PostgresServer`) and stopped at exit;
``CRL_PG_HOST``/``CRL_PG_PORT`` name a running server (user postgres, trust
authentication) to use instead.

A user's machine may lack the binaries: the tests that need them skip with the
reason; under ``CI=true`` they fail instead, as for RabbitMQ
(:mod:`tests.support.brokers`).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

__all__ = ["address", "require", "throwaway_database", "unreachable"]

_server: Any = None
_starting = threading.Lock()


def address() -> tuple[str, int]:
    """The server's (host, port): the one ``CRL_PG_HOST`` names, else this process's own."""
    global _server
    if os.environ.get("CRL_PG_HOST"):
        return os.environ["CRL_PG_HOST"], int(os.environ.get("CRL_PG_PORT", "5432"))
    with _starting:
        if _server is None:
            from celery_redlock.testing.postgres import PostgresServer

            _server = PostgresServer()
            atexit.register(_server.close)
    return _server.host, _server.port


def _admin() -> Any:
    import psycopg

    host, port = address()
    return psycopg.connect(
        host=host, port=port, user="postgres", dbname="postgres", connect_timeout=5, autocommit=True
    )


def unreachable() -> str | None:
    """Why no server can be used, or None when one answers."""
    if not os.environ.get("CRL_PG_HOST"):
        from celery_redlock.testing.postgres import postgres_missing

        missing = postgres_missing()
        if missing is not None:
            return missing
    try:
        _admin().close()
    except Exception as exc:  # noqa: BLE001 - any failure to connect means "not here"
        host, port = address()
        return f"PostgreSQL is not reachable at {host}:{port} ({type(exc).__name__}: {exc})"
    return None


def require(why: str | None) -> None:
    """Skip (locally) or fail (under ``CI=true``) when ``why`` says the server is missing."""
    if why is None:
        return
    if os.environ.get("CI") == "true":
        pytest.fail(why + "; CI=true requires it")
    pytest.skip(why + "; set CI=true to make this a failure")


@contextlib.contextmanager
def throwaway_database() -> Iterator[str]:
    """Create a database of a fresh name, yield the name, drop it (closing its sessions)."""
    name = f"crl_{uuid.uuid4().hex[:12]}"
    with _admin() as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
        try:
            yield name
        finally:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
