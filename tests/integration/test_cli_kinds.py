"""``celery redlock nodes`` and ``schema`` on PostgreSQL and etcd nodes: each kind
described in its own words, with the checks its durability rests on."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from typing import Any

import cli_app
import pytest
from celery.bin.base import CLIContext
from click.testing import CliRunner, Result

from celery_redlock.cli import redlock
from celery_redlock.core.nodes.postgres.schema import VERSION
from celery_redlock.testing.postgres import PostgresServer

pytestmark = pytest.mark.integration

#: What only Redis has: none of it may describe another kind.
REDIS_WORDS = ("Redis", "redis", "maxmemory", "aof", "eviction", "independent masters")


def invoke(app: Any, *args: str) -> Result:
    result = CliRunner().invoke(
        redlock, list(args), obj=CLIContext(app=app, no_color=True, workdir=None)
    )
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    return result


def _server(settings: dict[str, str]) -> Iterator[PostgresServer]:
    server = PostgresServer(settings=settings)
    try:
        yield server
    finally:
        server.close()


@pytest.fixture(scope="module")
def careless_pg(postgres_servers_session: Any) -> Iterator[PostgresServer]:
    """A PostgreSQL server whose commits a crash may lose: fsync, full_page_writes
    and synchronous_commit off. (``postgres_servers_session`` skips, or fails
    under ``CI=true``, where no server can be started.)"""
    yield from _server({"fsync": "off", "full_page_writes": "off", "synchronous_commit": "off"})


@pytest.fixture(scope="module")
def durable_pg(postgres_servers_session: Any) -> Iterator[PostgresServer]:
    """A PostgreSQL server as a lock node should run: every commit flushed."""
    yield from _server({"fsync": "on"})


def test_one_postgres_node_is_described_as_one_database(durable_pg):
    result = invoke(cli_app.make_app([durable_pg.url]), "nodes")
    assert result.exit_code == 0, result.output
    out = result.output
    assert f"lock node: {durable_pg.url} (the only node of redlock_nodes): ONE node, a " in out
    assert "PostgreSQL database" in out and "a failover to an asynchronous standby" in out
    assert "fsync on, synchronous_commit on, full_page_writes on" in out
    assert "UNSAFE" not in out and "WARNING" not in out, out
    assert not [w for w in REDIS_WORDS if w in out], out


def test_nodes_flags_a_postgres_server_that_may_lose_commits(careless_pg):
    result = invoke(cli_app.make_app([careless_pg.url]), "nodes")
    assert result.exit_code == 0, result.output  # it answers: a warning, not an outage
    out = result.output
    assert (
        "fsync off (UNSAFE), synchronous_commit off (UNSAFE), full_page_writes off (UNSAFE)" in out
    )
    assert f"WARNING {careless_pg.url}: fsync off: a crash of the server" in out
    assert f"WARNING {careless_pg.url}: full_page_writes off:" in out
    assert f"WARNING {careless_pg.url}: synchronous_commit off: a grant is acknowledged" in out
    assert not [w for w in REDIS_WORDS if w in out], out


def test_a_role_or_database_setting_of_synchronous_commit_is_the_one_checked(durable_pg):
    """The check reads the setting as the node's own session sees it."""
    durable_pg.sql("ALTER ROLE postgres SET synchronous_commit = off")
    try:
        result = invoke(cli_app.make_app([durable_pg.url]), "nodes")
    finally:
        durable_pg.sql("ALTER ROLE postgres RESET synchronous_commit")
    assert "synchronous_commit off (UNSAFE)" in result.output, result.output
    assert "fsync on" in result.output


def test_an_etcd_cluster_shows_its_members_quorum_and_leader(etcd_cluster3):
    result = invoke(cli_app.make_app([etcd_cluster3.url]), "nodes")
    assert result.exit_code == 0, result.output
    out = result.output
    assert "ONE node, an etcd cluster: the locks are as safe as its members' quorum" in out
    assert "members 3 (quorum 2), leader " in out and "leader none" not in out
    assert "UNSAFE" not in out and "WARNING" not in out, out
    assert not [w for w in REDIS_WORDS if w in out], out


def test_a_zookeeper_ensemble_shows_its_members_quorum_and_leader(zookeeper_node1):
    result = invoke(cli_app.make_app(zookeeper_node1.urls), "nodes")
    assert result.exit_code == 0, result.output
    out = result.output
    assert "ONE node, a ZooKeeper ensemble: the locks are as safe as its members' quorum" in out
    assert "zookeeper 3." in out and "ensemble" in out
    assert "members 3 (quorum 2), leader 127.0.0.1:" in out
    assert "UNSAFE" not in out and "WARNING" not in out, out
    assert not [w for w in REDIS_WORDS if w in out], out


def test_two_urls_of_one_postgres_server_are_one_server(durable_pg):
    other = durable_pg.url + "?schema=redlock_other"  # another node, on the same server
    result = invoke(cli_app.make_app([durable_pg.url, other]), "nodes")
    assert f"WARNING {other}: same server as {durable_pg.url} (system identifier " in (
        result.output
    )


def test_schema_apply_url_installs_with_another_role(postgres_node1):
    """The app's role may not create the schema; --url applies it as one that may."""
    server = postgres_node1[0]
    db, role = f"shop_{secrets.token_hex(3)}", f"app_{secrets.token_hex(3)}"
    server.sql(f"CREATE DATABASE {db}")
    server.sql(f"CREATE ROLE {role} LOGIN")
    try:
        app = cli_app.make_app([f"postgresql://{role}@{server.host}:{server.port}/{db}"])
        refused = invoke(app, "schema", "--apply")
        assert refused.exit_code == 1, refused.output
        assert "permission denied" in refused.output and "give --url" in refused.output
        admin = f"postgresql://postgres@{server.host}:{server.port}/{db}"
        applied = invoke(app, "schema", "--apply", "--url", admin)
        assert applied.exit_code == 0, applied.output
        assert f"{admin}: schema 'redlock' is installed" in applied.output
        with server.connect(dbname=db) as conn:
            assert conn.execute("SELECT version FROM redlock.meta").fetchall() == [(VERSION,)]
        printed = invoke(app, "schema", "--url", admin)  # printing takes it too
        assert printed.exit_code == 0 and f"-- lock node {admin}" in printed.output
    finally:
        server.sql(f"DROP DATABASE IF EXISTS {db} WITH (FORCE)")
        server.sql(f"DROP ROLE IF EXISTS {role}")


def test_schema_url_must_be_a_postgres_node(redis_nodes3):
    app = cli_app.make_app(redis_nodes3.urls)
    result = invoke(app, "schema", "--apply", "--url", redis_nodes3.urls[0])
    assert result.exit_code == 2, result.output
    assert f"{redis_nodes3.urls[0]} is not a PostgreSQL node" in result.output
    both = invoke(app, "schema", cli_app.SETTLE, "--url", redis_nodes3.urls[0])
    assert both.exit_code == 2 and "give TASK or --url, not both" in both.output
