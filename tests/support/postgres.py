"""A throwaway PostgreSQL database on this machine's server (127.0.0.1:5432, user
postgres, trust authentication; ``CRL_PG_HOST``/``CRL_PG_PORT`` override it).

A user's machine may lack the server: the tests that need it skip with the reason;
under ``CI=true`` a missing server fails them instead, as for RabbitMQ
(:mod:`tests.support.brokers`).
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

__all__ = ["HOST", "PORT", "require", "throwaway_database", "unreachable"]

HOST = os.environ.get("CRL_PG_HOST", "127.0.0.1")
PORT = int(os.environ.get("CRL_PG_PORT", "5432"))


def _admin() -> Any:
    import psycopg

    return psycopg.connect(
        host=HOST, port=PORT, user="postgres", dbname="postgres", connect_timeout=2, autocommit=True
    )


def unreachable() -> str | None:
    """Why the server cannot be used, or None when it answers."""
    try:
        _admin().close()
    except Exception as exc:  # noqa: BLE001 - any failure to connect means "not here"
        return f"PostgreSQL is not reachable at {HOST}:{PORT} ({type(exc).__name__}: {exc})"
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
