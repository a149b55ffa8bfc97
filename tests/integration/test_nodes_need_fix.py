"""Errors a lock node cannot heal by itself, on real servers: what the client
reports (``NodeError.heals`` False, and ``QuorumUnavailable.heals`` False when
they leave fewer than a quorum) and ``celery redlock nodes``'s exit code 4.

An outage (a server stopped) heals: exit code 2, ``heals`` True.
"""

from __future__ import annotations

from collections.abc import Iterator

import cli_app
import pytest
from celery.bin.base import CLIContext
from click.testing import CliRunner, Result

from celery_redlock import NodeError, QuorumUnavailable, Redlock
from celery_redlock.cli import redlock
from celery_redlock.cli.base import EX_NEEDS_FIX, EX_UNAVAILABLE
from celery_redlock.testing import RedisNode
from tests.support.postgres import require

pytestmark = pytest.mark.integration


def invoke(nodes: list[str], *args: str) -> Result:
    app = cli_app.make_app(nodes)
    result = CliRunner().invoke(
        redlock, list(args), obj=CLIContext(app=app, no_color=True, workdir=None)
    )
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result


def refusal(nodes: list[str]) -> QuorumUnavailable:
    client = Redlock(nodes, node_timeout=0.5)
    try:
        with pytest.raises(QuorumUnavailable) as info:
            client.try_acquire("need-fix", ttl=5)
        return info.value
    finally:
        client.close()


def _guarded(password: str) -> RedisNode:
    node = RedisNode()  # started first: its start-up check sends no password
    with node.client() as client:
        client.config_set("requirepass", password)
    return node


@pytest.fixture(scope="module")
def guarded() -> Iterator[RedisNode]:
    """A Redis server that asks for a password."""
    node = _guarded("s3cret")
    try:
        yield node
    finally:
        node.close()


@pytest.mark.parametrize("userinfo", [":wrong@", ""], ids=["wrong-password", "no-password"])
def test_a_refused_redis_password_cannot_heal(guarded, userinfo):
    url = f"redis://{userinfo}{guarded.host}:{guarded.port}/0"
    exc = refusal([url])
    assert not exc.heals
    (error,) = exc.errors.values()
    assert isinstance(error, NodeError) and not error.heals, repr(error)
    assert isinstance(error, ConnectionError)  # what callers caught before
    result = invoke([url], "nodes")
    assert result.exit_code == EX_NEEDS_FIX, result.output
    assert "cannot answer until fixed" in result.output
    assert "fix: set the right user and password" in result.output
    assert "wrong" not in result.output  # the password stays masked


def test_the_right_redis_password_works(guarded):
    client = Redlock([f"redis://:s3cret@{guarded.host}:{guarded.port}/0"], node_timeout=0.5)
    try:
        assert client.try_acquire("need-fix-ok", ttl=5) is not None
    finally:
        client.close()


def test_refused_nodes_that_leave_a_quorum_possible_are_an_outage(guarded):
    other_guarded, up, down = _guarded("x"), RedisNode(), RedisNode()
    down.stop()
    try:
        wrong = f"redis://:wrong@{guarded.host}:{guarded.port}/0"
        # 1 of 3 cannot heal: the stopped one may come back, and 2 make a quorum
        exc = refusal([wrong, up.url, down.url])
        assert list(exc.unhealed) == [wrong.replace(":wrong@", ":***@")]
        assert exc.heals
        # 2 of 3 cannot heal: no quorum until they are fixed
        exc = refusal(
            [wrong, f"redis://:wrong@{other_guarded.host}:{other_guarded.port}/0", up.url]
        )
        assert len(exc.unhealed) == 2 and not exc.heals
    finally:
        for node in (other_guarded, up, down):
            node.close()


@pytest.fixture(scope="module")
def server():
    from celery_redlock.testing.postgres import PostgresServer, postgres_missing

    require(postgres_missing())
    server = PostgresServer()
    try:
        yield server
    finally:
        server.close()


def test_a_missing_postgres_database_cannot_heal(server):
    url = f"postgresql://postgres@{server.host}:{server.port}/crl_missing"
    exc = refusal([url])
    assert not exc.heals
    assert 'database "crl_missing" does not exist' in str(exc)
    result = invoke([url], "nodes")
    assert result.exit_code == EX_NEEDS_FIX, result.output
    assert "fix: create that database" in result.output


def test_a_postgres_schema_of_another_version_cannot_heal(server):
    server.sql("CREATE DATABASE crl_old")
    url = f"postgresql://postgres@{server.host}:{server.port}/crl_old"
    try:
        client = Redlock([url], node_timeout=0.5)
        try:
            assert client.try_acquire("need-fix-schema", ttl=5) is not None  # made on first use
        finally:
            client.close()
        with server.connect(dbname="crl_old") as conn:
            conn.execute("UPDATE redlock.meta SET version = version + 1")
        exc = refusal([url])
        assert not exc.heals and "run `celery redlock schema --apply`" in str(exc)
        assert invoke([url], "nodes").exit_code == EX_NEEDS_FIX
    finally:
        server.kill_backends()
        server.sql("DROP DATABASE IF EXISTS crl_old")


def test_a_stopped_postgres_server_is_an_outage(server):
    url = f"postgresql://postgres@{server.host}:{server.port}/postgres"
    server.stop()
    try:
        exc = refusal([url])
        assert exc.heals
        assert invoke([url], "nodes").exit_code == EX_UNAVAILABLE
    finally:
        server.start()
